#include "xpv/vmm/xen_domain.h"

#include <boost/asio/post.hpp>
#include <fcntl.h>
#include <fmt/core.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "xpv/replace_file.h"
#include "xpv/thread_name.h"
#include "xpv/xen/stubs.h"

namespace xpv::vmm {

namespace asio = boost::asio;

namespace {

std::uint64_t grant_bytes(const XenDomainConfig& c) { return std::uint64_t{c.max_grant_frames} << kPageShift; }

// EVTCHNOP_send's argument as the fast-send routine's OUT carried it (eax: the port its lods
// read from struct evtchn_send at gva), not read again from guest memory: one address
// translation less per send, and the port sent is the one the OUT said even if another vCPU
// rewrites the struct in between. Any other access is refused (-EFAULT).
class SendArg final : public xen::GuestVirt {
 public:
  SendArg(std::uint64_t gva, std::uint32_t port) : gva_(gva), port_(port) {}
  bool read(std::uint64_t gva, std::span<std::uint8_t> out) noexcept override {
    if (gva != gva_ || out.size() != sizeof port_) return false;
    std::memcpy(out.data(), &port_, sizeof port_);
    return true;
  }
  bool write(std::uint64_t, std::span<const std::uint8_t>) noexcept override { return false; }

 private:
  std::uint64_t gva_;
  std::uint32_t port_;
};

// The privilege level a trapped hypercall came from (xen::Regs::cpl). One KVM cannot tell counts
// as a guest process's: the call is refused, not run with the kernel's rights.
unsigned trap_cpl(kvm::VcpuContext& ctx, unsigned domid) noexcept {
  if (auto cpl = ctx.cpl()) return *cpl;
  spdlog::error("dom{}: vCPU {}: KVM_GET_SREGS failed in a hypercall; refused as if from a guest process", domid,
                ctx.id());
  return 3;
}

// One hypercall's view of guest-virtual memory: page by page through the vCPU's page tables.
class TrapMemory final : public xen::GuestVirt {
 public:
  TrapMemory(kvm::VcpuContext& ctx, const GuestMemory& mem) : ctx_(ctx), mem_(mem) {}
  bool read(std::uint64_t gva, std::span<std::uint8_t> out) noexcept override {
    return walk(gva, out.size(), [&](std::span<std::uint8_t> page, std::size_t done) {
      std::memcpy(out.data() + done, page.data(), page.size());
    });
  }
  bool write(std::uint64_t gva, std::span<const std::uint8_t> in) noexcept override {
    return walk(gva, in.size(), [&](std::span<std::uint8_t> page, std::size_t done) {
      std::memcpy(page.data(), in.data() + done, page.size());
    });
  }

 private:
  template <class F>
  bool walk(std::uint64_t gva, std::size_t len, F f) noexcept {
    std::size_t done = 0;
    while (done < len) {
      const std::uint64_t va = gva + done;
      if (va < gva) return false;  // wrapped
      const std::size_t chunk = std::min<std::uint64_t>(len - done, kPageSize - (va & (kPageSize - 1)));
      auto gpa = ctx_.translate(va);
      if (!gpa) return false;
      auto span = mem_.translate(*gpa, chunk);
      if (!span) return false;
      f(*span, done);
      done += chunk;
    }
    return true;
  }
  kvm::VcpuContext& ctx_;
  const GuestMemory& mem_;
};

// replace_file (a reader sees the old content or the new) for the small files the toolstack
// reads; 0 or the errno, never an exception: the guest is not held up for such a file.
int replace_quietly(const std::string& path, std::string_view line) noexcept {
  try {
    return replace_file(path, std::string(line) + "\n");
  } catch (...) {
    return ENOMEM;
  }
}

}  // namespace

// The guest's sends on ports connected to backends, signalled by KVM itself: one ioeventfd per
// port on the fast-send port (xen/stubs.h), matching the port number. Called by EventChannels
// with its lock held; a KVM that refuses leaves the port to the trap, which works the same.
class XenDomain::SendRoutes final : public domain::SendRouteSink {
 public:
  SendRoutes(kvm::Vm& vm, unsigned domid) : vm_(vm), domid_(domid) {}
  // Each route keeps its own duplicate of the eventfd, so that taking it back never depends on
  // the endpoint's descriptor still being open (KVM finds the ioeventfd by its eventfd).
  bool route(domain::Port guest_port, int to_dom0_fd) noexcept override {
    // A route whose removal failed earlier: try once more before KVM refuses the new one (EEXIST).
    if (auto stale = fds_.find(guest_port); stale != fds_.end()) {
      if (auto r = vm_.remove_pio_eventfd(xen::kEvtchnSendPort, 4, guest_port, stale->second.get()); !r) {
        spdlog::error("dom{}: event channel {}: {}", domid_, guest_port, r.error().message);
        return false;
      }
      fds_.erase(stale);
    }
    const int fd = ::fcntl(to_dom0_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
      spdlog::warn("dom{}: event channel {}: sends keep exiting to xpv-vmm: dup: {}", domid_, guest_port,
                   std::strerror(errno));
      return false;
    }
    UniqueFd own(fd);
    if (auto r = vm_.add_pio_eventfd(xen::kEvtchnSendPort, 4, guest_port, own.get()); !r) {
      spdlog::warn("dom{}: event channel {}: sends keep exiting to xpv-vmm: {}", domid_, guest_port, r.error().message);
      return false;
    }
    try {
      fds_.insert_or_assign(guest_port, std::move(own));
    } catch (...) {
      (void)vm_.remove_pio_eventfd(xen::kEvtchnSendPort, 4, guest_port, fd);
      return false;
    }
    routed.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  void unroute(domain::Port guest_port, int) noexcept override {
    auto it = fds_.find(guest_port);
    if (it == fds_.end()) return;
    if (auto r = vm_.remove_pio_eventfd(xen::kEvtchnSendPort, 4, guest_port, it->second.get()); !r) {
      // KVM keeps signalling the old backend for this port: a host bug, said loudly. The entry
      // stays, so that routing the port again first tries the removal once more.
      spdlog::error("dom{}: event channel {}: {}", domid_, guest_port, r.error().message);
      return;
    }
    fds_.erase(it);
  }
  std::atomic<bool> installed{false};      // the routine is in the kernel: the 0xe4 trap answers
  std::atomic<std::uint64_t> routed{0};   // routes made over the domain's life
  std::atomic<std::uint64_t> trapped{0};  // sends on ports KVM does not signal (IPIs, loopback, unbound)

 private:
  kvm::Vm& vm_;
  unsigned domid_;
  std::map<domain::Port, UniqueFd> fds_;  // EventChannels calls route/unroute under its exclusive lock
};

// What the platform needs from the VMM: interrupts into the VM, RAM pages, shutdown, console.
class XenDomain::Host final : public xen::PlatformHost {
 public:
  Host(kvm::Vm& vm, std::string memory_file) : vm_(vm), memory_file_(std::move(memory_file)) {}
  void inject_vector(unsigned vcpu, std::uint8_t vector) noexcept override { vm_.signal_msi(vcpu, vector); }
  bool set_callback_vector(std::uint8_t vector) noexcept override {
    // KVM_SIGNAL_MSI goes through the LAPIC; an auto-EOI vector leaves no in-service bit behind,
    // which is what Xen's injection outside the LAPIC amounts to for the guest.
    auto r = vm_.set_auto_eoi_vector(vector);
    if (r) return true;
    try {
      // The guest may ask again and again (each refusal leaves the old callback in place).
      if (auto note = rate_limited(); note) spdlog::error("callback vector {:#x}: {}{}", vector, r.error().message, *note);
    } catch (...) {
    }
    return false;
  }
  void upcall_route(unsigned vcpu, std::uint8_t vector) noexcept override {
    if (domain_ == nullptr) return;
    auto r = vm_.route_upcall(vcpu, vector);
    if (!r) {
      try {
        spdlog::warn("vCPU {}: no direct upcalls: {}", vcpu, r.error().message);
      } catch (...) {
      }
    }
    // Routed or not, the event channels say so to the backends (unrouted: the classic path).
    domain_->evtchn().set_direct_route(vcpu, r && vector != 0);
  }
  // The domain whose direct upcall lines this host routes (null: it has none).
  domain::Domain* domain_ = nullptr;

  void set_intx(bool asserted) noexcept override {
    // The line is an irqfd with a resample fd: KVM lowers it at the guest's EOI by itself.
    if (asserted) vm_.assert_line();
  }
  void shutdown(xen::ShutdownReason why) noexcept override {
    switch (why) {
      case xen::ShutdownReason::poweroff: vm_.request_stop(kvm::StopReason::poweroff, "SCHEDOP_shutdown poweroff"); break;
      case xen::ShutdownReason::reboot: vm_.request_stop(kvm::StopReason::reboot, "SCHEDOP_shutdown reboot"); break;
      case xen::ShutdownReason::crash: vm_.request_stop(kvm::StopReason::error, "the guest crashed (SCHEDOP_shutdown crash)"); break;
      case xen::ShutdownReason::watchdog: vm_.request_stop(kvm::StopReason::error, "the guest's watchdog fired"); break;
      case xen::ShutdownReason::suspend: vm_.request_stop(kvm::StopReason::error, "the guest asked to suspend (not supported)"); break;
    }
  }
  std::span<std::uint8_t> guest_page(std::uint64_t gfn) noexcept override {
    // RAM only: shared_info and vcpu_info must not land on device memory or the hole.
    const auto& ram = vm_.ram();
    const std::uint64_t gpa = gfn << kPageShift;
    const bool low = gpa < ram.low_end();
    const bool high = gpa >= kvm::kHighRamBase && gpa - kvm::kHighRamBase < ram.size() - ram.low_end();
    if (gfn > (UINT64_MAX >> kPageShift) || (!low && !high)) return {};
    auto p = vm_.memory().page(gfn);
    return p ? *p : std::span<std::uint8_t>{};
  }
  bool release_ram(std::uint64_t gfn, std::uint64_t pages) noexcept override { return balloon(gfn, pages, true); }
  bool populate_ram(std::uint64_t gfn, std::uint64_t pages) noexcept override { return balloon(gfn, pages, false); }
  // Pages the guest has given back and not taken again; pages given back whose host memory the
  // file could not free (fallocate failed: they stay allocated, the guest still may not use them).
  std::uint64_t ballooned() const noexcept { return ballooned_.load(std::memory_order_relaxed); }
  std::uint64_t not_freed() const noexcept { return not_freed_.load(std::memory_order_relaxed); }

  void console_write(std::string_view text) noexcept override {
    // One log line per line of text, each with its prefix (a guest cannot start a line of ours),
    // and no more than the host's log takes: the platform bounds the calls a second, this the
    // lines (a 4096-byte write of "x\n" is 2048 of them).
    try {
      while (!text.empty()) {
        const auto nl = text.find('\n');
        const std::string_view line = text.substr(0, nl);
        if (!line.empty()) {
          if (auto note = rate_limited(); note) spdlog::info("guest console_io: {}{}", line, *note);
        }
        text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
      }
    } catch (...) {
    }
  }

 private:
  // The host-log lines the guest causes, at most 50 a second: nullopt for one to leave out, else
  // the note to end it with (how many were left out before it).
  std::optional<std::string> rate_limited() {
    std::lock_guard lk(log_mu_);
    if (!log_limit_.allow()) return std::nullopt;
    const std::uint64_t n = log_limit_.take_suppressed();
    return n == 0 ? std::string() : fmt::format(" ({} guest lines left out before this one)", n);
  }
  std::mutex log_mu_;
  xpv::LogRateLimit log_limit_{50};
  // One bit per page of RAM (by file offset): given back. Under balloon_mu_ (balloon calls are
  // rare: Linux's driver sends 512 pages per hypercall).
  bool balloon(std::uint64_t gfn, std::uint64_t pages, bool release) noexcept {
    const auto& ram = vm_.ram();
    if (gfn > (UINT64_MAX >> kPageShift) || pages > (ram.size() >> kPageShift)) return false;
    const std::uint64_t gpa = gfn << kPageShift, bytes = pages << kPageShift;
    const auto off = ram.ram_offset(gpa, bytes);
    if (!off) return false;
    std::lock_guard lk(balloon_mu_);
    try {
      if (out_.empty()) out_.resize(ram.size() >> kPageShift);
    } catch (...) {
      return false;
    }
    const std::uint64_t first = *off >> kPageShift;
    std::uint64_t changed = 0;
    for (std::uint64_t i = first; i < first + pages; ++i) {
      if (out_[i] != release) ++changed;
      out_[i] = release;
    }
    if (release) {
      // Punched again even where already out: a page the guest touched since is freed as well.
      if (const int e = ram.discard(gpa, bytes); e != 0) {
        not_freed_.fetch_add(pages, std::memory_order_relaxed);
        if (!discard_failed_) {
          discard_failed_ = true;
          try {
            spdlog::warn("balloon: the host cannot free memory the guest gives back ({}): it stays allocated", std::strerror(e));
          } catch (...) {
          }
        }
      }
      ballooned_.fetch_add(changed, std::memory_order_relaxed);
    } else {
      ballooned_.fetch_sub(changed, std::memory_order_relaxed);
    }
    if (changed != 0) publish_memory();
    // What the guest holds now, at most once a second while it changes (the last change of a
    // run is also in the stats line at exit).
    const auto now = std::chrono::steady_clock::now();
    if (changed != 0 && now - last_log_ >= std::chrono::seconds(1)) {
      last_log_ = now;
      try {
        const std::uint64_t out = ballooned_.load(std::memory_order_relaxed);
        spdlog::info("balloon: the guest has given back {} MiB of its {} MiB ({} pages out)",
                     (out << kPageShift) >> 20, ram.size() >> 20, out);
      } catch (...) {
      }
    }
    return true;
  }

  // memory_file_ = the guest's RAM less what it gave back, in KiB (a new file renamed over the
  // old: a reader never sees half of it). Under balloon_mu_. A file that cannot be written is
  // said once; the guest is not held up for it.
  void publish_memory() noexcept {
    if (memory_file_.empty()) return;
    const std::uint64_t kib = (vm_.ram().size() >> 10) - (ballooned_.load(std::memory_order_relaxed) << (kPageShift - 10));
    const int e = replace_quietly(memory_file_, std::to_string(kib));
    if (e != 0 && !memory_file_failed_) {
      memory_file_failed_ = true;
      try {
        spdlog::warn("balloon: cannot write the guest's memory to {}: {}", memory_file_, std::strerror(e));
      } catch (...) {
      }
    }
  }

  kvm::Vm& vm_;
  std::string memory_file_;
  bool memory_file_failed_ = false;
  std::mutex balloon_mu_;
  std::vector<bool> out_;
  bool discard_failed_ = false;
  std::chrono::steady_clock::time_point last_log_{};
  std::atomic<std::uint64_t> ballooned_{0}, not_freed_{0};
};

// Domain is built before Platform (the platform needs the xenstore port the domain allocates),
// but the event channels need their sink at construction: this forwards once the platform exists.
struct XenDomain::Forward final : domain::UpcallSink {
  void upcall(unsigned vcpu) noexcept override {
    if (auto* p = target.load(std::memory_order_acquire)) p->upcall(vcpu);
  }
  std::atomic<xen::Platform*> target{nullptr};
};

void add_xen_device_memory(kvm::VmConfig& cfg, const XenDomainConfig& xcfg) {
  // BAR1 (16 MiB) holds the grant frames and, after them, at least a page of plain MMIO.
  if (xcfg.max_grant_frames == 0 || grant_bytes(xcfg) >= (16u << 20)) {
    throw std::runtime_error(fmt::format("max grant frames {}: must be 1..4095 (platform-pci BAR1 is 16 MiB)",
                                         xcfg.max_grant_frames));
  }
  cfg.device_memory.push_back({kPlatformMmio, grant_bytes(xcfg)});
  cfg.device_memory.push_back({kSpecialPages, 2 * kPageSize});  // xenstore ring, PV console ring
}

XenDomain::XenDomain(kvm::Vm& vm, kvm::PciHost& pci, const XenDomainConfig& cfg)
    : vm_(vm), cfg_(cfg), work_(asio::make_work_guard(io_)) {
  if (cfg.upcall == xen::UpcallMode::callback_vector && !vm.can_auto_eoi()) {
    throw std::runtime_error(
        "upcall callback: this KVM has no Hyper-V SynIC (KVM_CAP_HYPERV_SYNIC), which xpv-vmm needs to deliver "
        "Xen's global callback vector without an EOI; use upcall vector or intx");
  }
  host_ = std::make_unique<Host>(vm, cfg.memory_file);
  forward_ = std::make_unique<Forward>();

  // The VM's memfd, attached a second time so the control socket exports exactly what KVM maps.
  std::vector<domain::MemoryRegion> regions;
  for (const auto& r : vm.ram().regions()) regions.push_back({r.gpa, r.size, r.fd_offset});
  domain::DomainConfig dcfg;
  dcfg.domid = cfg.domid;
  dcfg.name = cfg.name;
  dcfg.kind = domain::control::DomainKind::hvm;
  dcfg.vcpus = vm.vcpus();
  dcfg.memory_bytes = vm.ram().size();
  dcfg.max_grant_frames = cfg.max_grant_frames;
  dcfg.run_dir = cfg.run_dir;
  domain_ = std::make_unique<domain::Domain>(
      io_, dcfg, *forward_, domain::DomainMemory::attach(UniqueFd(::dup(vm.ram().fd())), std::move(regions)),
      domain::HvmLayout{kPlatformMmio >> kPageShift, kSpecialPages >> kPageShift});

  xen::PlatformConfig pcfg;
  pcfg.domid = cfg.domid;
  pcfg.vcpus = vm.vcpus();
  pcfg.upcall = cfg.upcall;
  pcfg.max_grant_frames = cfg.max_grant_frames;
  pcfg.grant_frames_gfn = kPlatformMmio >> kPageShift;
  pcfg.store_gfn = domain_->xenstore_gfn();
  pcfg.store_port = domain_->xenstore_port();
  if (cfg.pv_console) {
    // The console's channel is unbound for dom0 and bound at once by this process (the backend);
    // the guest's notifications then make the binding's to_dom0 readable.
    const std::uint64_t gfn = (kSpecialPages >> kPageShift) + 1;
    auto port = domain_->evtchn().alloc_unbound(0);
    if (!port) throw std::runtime_error("PV console: no event channel");
    auto b = domain_->bind_interdomain(*port);
    if (!b) throw std::runtime_error(fmt::format("PV console: binding its event channel: errno {}", b.error()));
    auto page = domain_->mem().view().page(gfn);
    if (!page) throw std::runtime_error("PV console: its ring page is not in the domain's memory");
    std::fill(page->begin(), page->end(), std::uint8_t{0});
    pv_console_ = std::make_unique<PvConsole>(io_, *page, std::move(b->to_dom0), std::move(b->from_dom0), cfg.pv_console);
    pcfg.console_gfn = gfn;
    pcfg.console_port = *port;
  }
  // Direct upcalls (direct_upcall.h): one KVM irqfd per vCPU that backends write themselves,
  // routed to the vCPU's upcall vector once the guest has chosen one (Host::upcall_route).
  try {
    std::vector<UniqueFd> lines;
    for (auto& fd : vm.upcall_lines()) lines.emplace_back(fd.release());
    domain_->enable_direct_upcalls(std::move(lines), vm.memory());
    host_->domain_ = domain_.get();
  } catch (const std::exception& e) {
    spdlog::warn("dom{}: no direct upcalls (every backend notification through the event loop): {}", cfg.domid,
                 e.what());
  }
  platform_ = std::make_unique<xen::Platform>(pcfg, *host_);
  platform_->attach(domain_->evtchn());
  forward_->target.store(platform_.get(), std::memory_order_release);

  vm.set_cpuid_hook([this](unsigned vcpu, std::vector<kvm_cpuid_entry2>& entries) { platform_->cpuid(vcpu, entries); });
  vm.set_pio_trap(xen::kHypercallPort, [this](kvm::VcpuContext& ctx) {
    const kvm_regs* r = ctx.regs();
    if (r == nullptr) {
      // The guest would read its own hypercall number back as the result (32: "success").
      vm_.request_stop(kvm::StopReason::error,
                       fmt::format("dom{}: vCPU {}: KVM_GET_REGS failed in a hypercall", cfg_.domid, ctx.id()));
      return;
    }
    xen::Regs regs{r->rax, r->rdi, r->rsi, r->rdx, r->r10, r->r8, trap_cpl(ctx, cfg_.domid)};
    TrapMemory mem(ctx, vm_.memory());
    const std::int64_t rc = platform_->hypercall(ctx.id(), regs, mem);
    ctx.set_rax(static_cast<std::uint64_t>(rc));
    reassert(ctx.id());
    if (cfg_.trace_hypercalls != 0 && traced_.fetch_add(1, std::memory_order_relaxed) < cfg_.trace_hypercalls) {
      spdlog::info("hypercall vcpu{} nr={} ({:#x}, {:#x}, {:#x}, {:#x}, {:#x}) = {}", ctx.id(), regs.rax, regs.rdi,
                   regs.rsi, regs.rdx, regs.r10, regs.r8, rc);
    }
  });
  // Kernels older than XSA-466 ask for a hypercall page through this MSR instead of having stubs.
  try {
    vm.set_msr_write_trap(xen::kHypercallPageMsr,
                          [this](unsigned vcpu, std::uint64_t value) { return fill_hypercall_page(vcpu, value); });
    msr_trap_ = true;
  } catch (const std::runtime_error& e) {
    msr_trap_error_ = e.what();
    spdlog::debug("xen: no hypercall page for older kernels: {}", msr_trap_error_);
  }
  // The fast sends' trap, before any vCPU runs; the stubs' routine or the hypercall page puts
  // the routine into the guest later (install_fast_send, fill_hypercall_page).
  prepare_fast_send();
  // The VM's resample thread outlives this object: it reaches the platform through live_.
  live_ = std::make_shared<std::atomic<xen::Platform*>>(platform_.get());
  vm.add_resample_line(kPlatformGsi, [live = live_] {
    if (auto* p = live->load(std::memory_order_acquire)) p->intx_eoi();
  });

  platform_pci::PlatformDeviceConfig dev;
  dev.io_base = kPlatformIo;
  dev.mmio_base = static_cast<std::uint32_t>(kPlatformMmio);
  dev.gsi = kPlatformGsi;
  dev.on_bar_moved = [warned = std::make_shared<std::atomic<bool>>(false)](unsigned bar, std::uint32_t base) {
    // The grant frames stay where KVM maps them: a guest that moves BAR1 loses its grant table.
    // Said once: the device logs each move itself, rate-limited (a guest rewriting the BARs in a
    // loop would otherwise fill the host's log).
    if (warned->exchange(true)) return;
    spdlog::warn("xen-platform: the guest moved BAR{} to {:#x}; xpv keeps BAR0 at {:#x} and the grant frames at {:#x}",
                 bar, base, kPlatformIo, kPlatformMmio);
  };
  device_ = std::make_unique<platform_pci::XenPlatformDevice>(dev);
  unplug_ = std::make_unique<platform_pci::UnplugPorts>();
  bar0_ = std::make_unique<platform_pci::PlatformIoBar>(*unplug_);
  bar1_ = std::make_unique<platform_pci::PlatformMmioBar>();
  auto check = [](kvm::Result<void> r) {
    if (!r) throw std::runtime_error(r.error().message);
  };
  check(pci.plug(kPlatformSlot, device_.get()));
  check(vm.pio().add(kPlatformIo, platform_pci::PlatformIoBar::kLength, bar0_.get(), "xen-platform BAR0"));
  check(vm.pio().add(platform_pci::UnplugPorts::kBase, platform_pci::UnplugPorts::kLength, unplug_.get(),
                     "xen unplug ports"));
  // BAR1 beyond the grant frames (which are RAM-backed, no exits) is plain MMIO.
  check(vm.mmio().add(kPlatformMmio + grant_bytes(cfg), platform_pci::PlatformMmioBar::kLength - grant_bytes(cfg),
                      bar1_.get(), "xen-platform BAR1"));
  // Unpause: a domain created paused starts (wait_unpaused returns); one paused since (`xpv
  // pause`) resumes. Pause, as `xl pause`: every vCPU stops outside the guest; the event
  // channels, backends and timers go on, and what they signal waits in the vCPUs' LAPICs.
  // Both on the io thread, one at a time.
  domain_->set_unpause_handler([this] {
    std::lock_guard lk(unpause_mu_);
    if (!unpaused_) {
      unpaused_ = true;
      unpause_cv_.notify_all();
    } else if (!vm_.paused() || !vm_.resume()) {
      return false;
    } else {
      spdlog::info("dom{}: unpaused", cfg_.domid);
    }
    publish_state("running");
    return true;
  });
  domain_->set_pause_handler([this]() -> Expected<void, int> {
    std::lock_guard lk(unpause_mu_);
    if (!unpaused_ || vm_.paused()) return fail(EALREADY);
    if (auto r = vm_.pause(); !r) {
      spdlog::error("dom{}: cannot pause: {}", cfg_.domid, r.error().message);
      return fail(EBUSY);
    }
    spdlog::info("dom{}: paused", cfg_.domid);
    publish_state("paused");
    return {};
  });
  domain_->set_vcpu_threads_handler([this] {
    std::vector<std::uint32_t> tids;
    for (const pid_t t : vm_.vcpu_threads()) tids.push_back(static_cast<std::uint32_t>(t));
    return tids;
  });
  domain_->set_vcpu_affinity_handler([this](std::uint32_t vcpu, const domain::ControlHandler::CpuMask& mask)
                                         -> Expected<void, int> {
    kvm::CpuList cpus;
    for (std::size_t c = 0; c < kvm::kMaxCpus; ++c) {
      if ((mask[c / 64] >> (c % 64)) & 1) cpus.cpus.set(c);
    }
    std::vector<unsigned> targets;
    if (vcpu == domain::control::kAllVcpus) {
      for (unsigned v = 0; v < vm_.vcpus(); ++v) targets.push_back(v);
    } else if (vcpu < vm_.vcpus()) {
      targets.push_back(vcpu);
    } else {
      return fail(ENOENT);
    }
    if (cpus.empty()) return fail(EINVAL);
    if (auto r = vm_.set_vcpu_affinity(targets, cpus); !r) {
      spdlog::warn("dom{}: vcpu-pin: {}", cfg_.domid, r.error().message);
      return fail(EINVAL);
    }
    spdlog::info("dom{}: vCPU {} placed on CPUs {}", cfg_.domid,
                 vcpu == domain::control::kAllVcpus ? std::string("all") : std::to_string(vcpu), kvm::format_cpu_list(cpus));
    return {};
  });
  publish_state("paused");  // until unpaused: xpv-vmm --paused waits for it, else main does at once
  io_thread_ = std::thread([this] {
    set_thread_name("xen-events");  // dom0 kicks → upcalls; the control socket
    io_.run();
  });
  reassert_thread_ = std::thread([this] { reassert_loop(); });
}

// Xen (and KVM's in-kernel Xen support) treat a vCPU's evtchn_upcall_pending as a level: while it
// is 1 the callback is injected again at every VM entry. xpv injects an edge (an MSI) on its 0→1
// transition, which is lost when the guest cannot take it — the LAPIC is still software-disabled
// when Linux registers its vcpu_info (which sets upcall_pending, as Xen does) and chooses its
// vector. Without a re-assertion that vCPU would never get another upcall. So the pending flag is
// re-checked after every hypercall of that vCPU and every kReassertPeriod for all of them; a
// spurious callback costs the guest one scan of an empty selector.
void XenDomain::reassert(unsigned vcpu) noexcept {
  if (platform_->shared_info_mapped() && domain_->evtchn().upcall_pending(vcpu)) platform_->upcall(vcpu);
}

// The same tick also signals again the ports whose edge the guest's own unmask lost
// (EventChannels::redeliver_lost_edges): found after two ticks, so such a port waits 20–40 ms
// instead of for ever. A vCPU kept from finishing its own scan that long (descheduled) looks the
// same and gets one spurious upcall. Each one is logged (the first ten, then every thousandth).
void XenDomain::reassert_loop() {
  constexpr auto kReassertPeriod = std::chrono::milliseconds(20);
  std::uint64_t lost = 0;
  std::unique_lock lk(tick_mu_);
  while (!tick_cv_.wait_for(lk, kReassertPeriod, [this] { return stopping_; })) {
    if (platform_->shared_info_mapped()) {
      domain::Port first = 0;
      if (const std::size_t n = domain_->evtchn().redeliver_lost_edges(&first); n > 0) {
        const std::uint64_t before = lost;
        lost += n;
        if (before < 10 || before / 1000 != lost / 1000)
          spdlog::info("dom{}: event channel {}{} pending and unmasked with no selector bit on two ticks: signalled "
                       "again (an edge the guest's unmask lost, or a vCPU held up in its scan that long; {} so far)",
                       cfg_.domid, first, n > 1 ? fmt::format(" and {} more", n - 1) : std::string(), lost);
      }
    }
    for (unsigned v = 0; v < vm_.vcpus(); ++v) reassert(v);
  }
  if (lost > 0) spdlog::info("dom{}: {} event-channel ports signalled again (lost edges)", cfg_.domid, lost);
}

void XenDomain::publish_state(const char* state) noexcept {
  if (cfg_.state_file.empty()) return;
  if (const int e = replace_quietly(cfg_.state_file, state); e != 0) {
    try {
      spdlog::warn("dom{}: cannot write its state ({}) to {}: {}", cfg_.domid, state, cfg_.state_file, std::strerror(e));
    } catch (...) {
    }
  }
}

void XenDomain::unpause_now() {
  std::lock_guard lk(unpause_mu_);
  unpaused_ = true;
  publish_state("running");
}

void XenDomain::wait_unpaused() {
  std::unique_lock lk(unpause_mu_);
  unpause_cv_.wait(lk, [this] { return unpaused_; });
}

XenDomain::~XenDomain() {
  if (send_routes_ && send_routes_->installed.load()) {
    domain_->evtchn().set_send_route_sink(nullptr);
    spdlog::info("dom{}: event-channel sends: {} ports connected to backends signalled by KVM over the run; {} sends "
                 "on other ports (IPIs, loopback) through the trap",
                 cfg_.domid, send_routes_->routed.load(), send_routes_->trapped.load());
  }
  {
    std::lock_guard lk(tick_mu_);
    stopping_ = true;
  }
  tick_cv_.notify_all();
  if (reassert_thread_.joinable()) reassert_thread_.join();
  forward_->target.store(nullptr, std::memory_order_release);
  if (live_) live_->store(nullptr, std::memory_order_release);
  asio::post(io_, [this] {
    {
      std::lock_guard lk(pv_mu_);
      pv_console_.reset();
    }
    domain_.reset();
    io_.stop();
  });
  work_.reset();
  if (io_thread_.joinable()) io_thread_.join();
}

std::size_t XenDomain::pv_console_input(std::span<const std::uint8_t> bytes) noexcept {
  std::lock_guard lk(pv_mu_);
  return pv_console_ ? pv_console_->receive(bytes) : 0;
}

void XenDomain::prepare_fast_send() {
  // XPV_EVTCHN_FAST_SEND=0: every send through the hypercall trap (measurements).
  if (const char* env = std::getenv("XPV_EVTCHN_FAST_SEND"); env != nullptr && std::string_view(env) == "0") {
    spdlog::info("xen: XPV_EVTCHN_FAST_SEND=0: event-channel sends go through the hypercall trap");
    return;
  }
  send_routes_ = std::make_unique<SendRoutes>(vm_, cfg_.domid);
  // The routine's OUT for a port KVM does not signal itself (stubs.h): the hypercall it stands
  // for, EVTCHNOP_send of the port the OUT carried (SendArg; the struct is at rsi - 4, past the
  // lods); a call from outside the guest's kernel is refused. The result goes into rdx, which the
  // routine moves into rax. It answers only once a routine is in the guest (installed).
  vm_.set_pio_trap(
      xen::kEvtchnSendPort,
      [this](kvm::VcpuContext& ctx) {
        if (!send_routes_->installed.load(std::memory_order_acquire)) return;  // no routine: a stray OUT
        const kvm_regs* r = ctx.regs();
        if (r == nullptr) {
          vm_.request_stop(kvm::StopReason::error, fmt::format("dom{}: vCPU {}: KVM_GET_REGS failed in an "
                                                               "event-channel send", cfg_.domid, ctx.id()));
          return;
        }
        send_routes_->trapped.fetch_add(1, std::memory_order_relaxed);
        xen::Regs regs{xen::abi::kHcEventChannelOp,
                       static_cast<std::uint64_t>(domain::EvtchnOp::send),
                       r->rsi - 4,
                       r->rdx,
                       r->r10,
                       r->r8,
                       trap_cpl(ctx, cfg_.domid)};
        SendArg mem(regs.rsi, static_cast<std::uint32_t>(r->rax));
        const std::int64_t rc = platform_->hypercall(ctx.id(), regs, mem);
        ctx.set_rdx(static_cast<std::uint64_t>(rc));
        reassert(ctx.id());
      },
      4);
}

void XenDomain::fast_send_installed() {
  if (send_routes_->installed.exchange(true, std::memory_order_acq_rel)) return;
  domain_->evtchn().set_send_route_sink(send_routes_.get());
}

bool XenDomain::install_fast_send(std::span<std::uint8_t> image, const xen::StubSites& sites,
                                  const xen::KernelTables& tables) {
  if (!send_routes_) return false;  // XPV_EVTCHN_FAST_SEND=0 (logged)
  if (auto fast = xen::patch_hypercall_stubs_fast_send(image, sites, xen::kHypercallPort, xen::kEvtchnSendPort, tables);
      !fast) {
    spdlog::warn("xen: event-channel sends go through the hypercall trap: {}", fast.error());
    return false;
  }
  fast_send_installed();
  return true;
}

void XenDomain::patch_kernel(std::uint64_t begin, std::uint64_t end, const kvm::KernelTables& tables) {
  auto image = vm_.memory().translate(begin, end - begin);
  if (!image) throw std::runtime_error(fmt::format("kernel image [{:#x}, {:#x}) is not in guest RAM", begin, end));
  auto sites = xen::find_hypercall_stubs(*image);
  if (sites) {
    // The tables as offsets into the image (one outside it counts as absent).
    auto in_image = [&](const kvm::KernelSection& k) -> std::optional<xen::ImageRange> {
      if (k.size == 0 || k.gpa < begin || k.gpa - begin > image->size() || k.size > image->size() - (k.gpa - begin)) {
        return std::nullopt;
      }
      return xen::ImageRange{static_cast<std::size_t>(k.gpa - begin), static_cast<std::size_t>(k.size)};
    };
    const xen::KernelTables t{in_image(tables.return_sites), in_image(tables.orc_unwind_ip), in_image(tables.orc_unwind)};
    if (install_fast_send(*image, *sites, t)) {
      spdlog::info("xen: hypercall stubs at {:#x} and {:#x} now trap to port {:#x}; sends to backends are KVM "
                   "ioeventfds on port {:#x}",
                   begin + sites->amd, begin + sites->intel, xen::kHypercallPort, xen::kEvtchnSendPort);
      return;
    }
    xen::patch_hypercall_stubs(*image, *sites, xen::kHypercallPort);
    spdlog::info("xen: hypercall stubs at {:#x} and {:#x} now trap to port {:#x}", begin + sites->amd,
                 begin + sites->intel, xen::kHypercallPort);
    return;
  }
  const auto page = xen::find_hypercall_page_placeholder(*image);
  if (!page) {
    throw std::runtime_error(fmt::format(
        "this kernel cannot run on xpv's Xen platform without KVM_CAP_XEN_HVM: {}, and no hypercall-page "
        "placeholder either (neither a Linux with XSA-466's stubs nor an older one)",
        sites.error()));
  }
  if (!msr_trap_) {
    throw std::runtime_error(fmt::format(
        "this kernel calls Xen through the hypercall page (placeholder at {:#x}), which it asks for with MSR {:#x}: {}",
        begin + *page, xen::kHypercallPageMsr, msr_trap_error_));
  }
  spdlog::info("xen: no XSA-466 hypercall stubs; the kernel's hypercall page placeholder is at {:#x} and is filled "
               "with port-I/O stubs when it writes MSR {:#x}",
               begin + *page, xen::kHypercallPageMsr);
}

// vCPU thread (a WRMSR exit). False: the write faults (#GP), as Xen refuses a bad page index.
bool XenDomain::fill_hypercall_page(unsigned vcpu, std::uint64_t value) noexcept {
  try {
    // A guest may write the MSR in a loop: 10 lines a second, with a count of the rest.
    auto note = [this]() -> std::optional<std::string> {
      std::lock_guard lk(msr_log_mu_);
      if (!msr_log_limit_.allow()) return std::nullopt;
      const std::uint64_t n = msr_log_limit_.take_suppressed();
      return n == 0 ? std::string() : fmt::format(" ({} similar lines left out)", n);
    };
    auto gpa = xen::hypercall_page_address(value);
    if (!gpa) {
      if (auto n = note()) {
        spdlog::warn("xen: vCPU {}: WRMSR {:#x} = {:#x}: {} → #GP{}", vcpu, xen::kHypercallPageMsr, value, gpa.error(), *n);
      }
      return false;
    }
    auto page = vm_.memory().translate(*gpa, 4096);
    if (!page) {
      if (auto n = note()) {
        spdlog::warn("xen: vCPU {}: WRMSR {:#x} = {:#x}: the page is not guest RAM → #GP{}", vcpu,
                     xen::kHypercallPageMsr, value, *n);
      }
      return false;
    }
    // With the fast sends' trap in place, entry 32 holds the fast-send routine (stubs.h); the
    // routes are made once it is in the guest's memory.
    const bool fast = send_routes_ != nullptr;
    const auto bytes = fast ? xen::build_hypercall_page(xen::kHypercallPort, xen::kEvtchnSendPort)
                            : xen::build_hypercall_page(xen::kHypercallPort);
    std::memcpy(page->data(), bytes.data(), bytes.size());
    if (fast) fast_send_installed();
    if (auto n = note()) {
      spdlog::info("xen: vCPU {}: hypercall page at {:#x} filled with port-I/O stubs{}{}", vcpu, *gpa,
                   fast ? fmt::format("; sends to backends are KVM ioeventfds on port {:#x}", xen::kEvtchnSendPort) : "",
                   *n);
    }
    return true;
  } catch (...) {
    return false;
  }
}

std::uint64_t XenDomain::hypercalls() const noexcept {
  std::uint64_t n = 0;
  for (unsigned i = 0; i < 64; ++i) n += platform_->calls(i);
  return n;
}

stats::Counters XenDomain::counters() const {
  // Names for what a Linux HVM guest calls; anything else by number.
  auto name = [](unsigned nr) -> std::string {
    switch (nr) {
      case xen::abi::kHcMemoryOp: return "memory_op";
      case xen::abi::kHcXenVersion: return "xen_version";
      case xen::abi::kHcConsoleIo: return "console_io";
      case xen::abi::kHcGrantTableOp: return "grant_table_op";
      case xen::abi::kHcVcpuOp: return "vcpu_op";
      case xen::abi::kHcSchedOp: return "sched_op";
      case xen::abi::kHcEventChannelOp: return "event_channel_op";
      case xen::abi::kHcHvmOp: return "hvm_op";
      default: return fmt::format("hypercall{}", nr);
    }
  };
  // EVTCHNOP_* and SCHEDOP_* numbers (xen/event_channel.h, xen/sched.h).
  static constexpr const char* kEvtchn[] = {"bind_interdomain", "bind_virq", "bind_pirq", "close", "send",
                                            "status", "alloc_unbound", "bind_ipi", "bind_vcpu", "unmask",
                                            "reset", "init_control", "expand_array", "set_priority"};
  static constexpr const char* kSched[] = {"yield", "block", "shutdown", "poll", "remote_shutdown", "shutdown_code",
                                           "watchdog", "pin_override"};
  stats::Counters out{{"hypercalls", hypercalls()}};
  for (unsigned i = 0; i < 64; ++i) {
    if (const auto n = platform_->calls(i); n != 0) out.emplace_back(name(i), n);
  }
  for (unsigned c = 0; c < xen::Platform::kSubOps; ++c) {
    if (const auto n = platform_->evtchn_calls(c); n != 0) {
      out.emplace_back(fmt::format("evtchn.{}", c < std::size(kEvtchn) ? kEvtchn[c] : std::to_string(c)), n);
    }
  }
  for (unsigned c = 0; c < xen::Platform::kSubOps; ++c) {
    if (const auto n = platform_->sched_calls(c); n != 0) {
      out.emplace_back(fmt::format("sched.{}", c < std::size(kSched) ? kSched[c] : std::to_string(c)), n);
    }
  }
  out.emplace_back("upcalls", platform_->upcalls());
  out.emplace_back("intx_eois", platform_->intx_eois());
  if (const auto n = host_->ballooned(); n != 0 || platform_->calls(xen::abi::kHcMemoryOp) > 0) {
    out.emplace_back("ballooned_pages", n);
    if (const auto k = host_->not_freed(); k != 0) out.emplace_back("ballooned_not_freed", k);
  }
  return out;
}

std::string XenDomain::describe_counters() const {
  std::string out;
  for (const auto& [key, n] : counters()) {
    if (key == "ballooned_not_freed") {
      out += fmt::format(" (not freed on the host: {})", n);
    } else {
      out += fmt::format("{}{}={}", out.empty() ? "" : " ", key, n);
    }
  }
  return out;
}

}  // namespace xpv::vmm
