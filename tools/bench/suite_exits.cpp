// `xpv bench exits` — the cost of one exit, in the spirit of kvm-unit-tests' vmexit.c: a tiny
// 64-bit guest runs N CPUID (handled inside KVM), N `in` from an ACPI PM-timer port (handled in
// this process: the `inl_pmtimer` case) and N loads from an unbacked guest-physical address (an
// MMIO exit to this process), writing a marker to port 0xf0 between phases. The host's
// steady_clock stamps each marker (guest clocks are not trusted); ns per exit = phase time / N,
// loop instructions included.
//
// Where it runs matters: natively here, CPL-0 guest code is emulated (~1 µs per instruction,
// ENVIRONMENT.md), so figures are dominated by that; inside `xpv testbed` they are a real KVM's
// (nested). The fourth phase is N Xen hypercall round trips (xen_version XENVER_version) through
// xpv's hypercall path: `out %al,$0xe8` (what xpv-vmm rewrites Linux's vmcall/vmmcall stubs to),
// the port-I/O trap reading the vCPU's registers, the Xen dispatcher, the result written back to
// rax (hypervisor-core/kvm/vmm/xen_domain.cpp).
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "bench/bench.h"
#include "xpv/kvm/linux_boot.h"
#include "xpv/kvm/pc_devices.h"
#include "xpv/kvm/pci_host.h"
#include "xpv/kvm/vm.h"
#include "xpv/vmm/xen_domain.h"

namespace {

using xpv::bench::Clock;

constexpr std::uint16_t kMarkerPort = 0xf0;
constexpr std::uint16_t kPmTimerPort = 0x608;
constexpr std::uint32_t kMmioAddr = 0xd000'0000;  // in the PCI hole: no memory slot

// Stamps each write with the host clock.
class Marker final : public xpv::kvm::BusDevice {
 public:
  void read(std::uint64_t, std::uint64_t, std::span<std::uint8_t> d) noexcept override { std::memset(d.data(), 0, d.size()); }
  void write(std::uint64_t, std::uint64_t, std::span<const std::uint8_t>) noexcept override {
    std::lock_guard lk(mu_);
    if (stamps_.size() < 16) stamps_.push_back(Clock::now());
  }
  std::vector<Clock::time_point> stamps() {
    std::lock_guard lk(mu_);
    return stamps_;
  }

 private:
  std::mutex mu_;
  std::vector<Clock::time_point> stamps_;
};

// Reads of the MMIO window: counted by the bus, answer 0.
class Sink final : public xpv::kvm::BusDevice {
 public:
  void read(std::uint64_t, std::uint64_t, std::span<std::uint8_t> d) noexcept override { std::memset(d.data(), 0, d.size()); }
  void write(std::uint64_t, std::uint64_t, std::span<const std::uint8_t>) noexcept override {}
};

std::vector<std::uint8_t> guest_code(std::uint32_t n) {
  std::vector<std::uint8_t> c;
  auto imm32 = [&](std::uint32_t v) {
    for (int i = 0; i < 4; ++i) c.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  };
  auto marker = [&] { c.insert(c.end(), {0xe6, kMarkerPort}); };  // out 0xf0, al
  auto loop_tail = [&](std::size_t top) {                          // dec esi; jnz top
    c.insert(c.end(), {0xff, 0xce, 0x75});
    c.push_back(static_cast<std::uint8_t>(static_cast<int>(top) - static_cast<int>(c.size() + 1)));
  };
  marker();
  c.push_back(0xbe), imm32(n);  // mov esi, n
  std::size_t top = c.size();
  c.insert(c.end(), {0x31, 0xc0, 0x0f, 0xa2});  // xor eax,eax; cpuid
  loop_tail(top);
  marker();
  c.push_back(0xbe), imm32(n);
  c.insert(c.end(), {0x66, 0xba, 0x08, 0x06});  // mov dx, 0x608
  top = c.size();
  c.push_back(0xed);  // in eax, dx
  loop_tail(top);
  marker();
  c.push_back(0xbe), imm32(n);
  c.push_back(0xbf), imm32(kMmioAddr);  // mov edi, kMmioAddr
  top = c.size();
  c.insert(c.end(), {0x8b, 0x07});  // mov eax, [rdi]
  loop_tail(top);
  marker();
  c.push_back(0xbe), imm32(n);
  top = c.size();
  c.push_back(0xb8), imm32(17);          // mov eax, 17 (__HYPERVISOR_xen_version)
  c.insert(c.end(), {0x31, 0xff});       // xor edi, edi (XENVER_version)
  c.insert(c.end(), {0xe6, xpv::xen::kHypercallPort});  // out al, 0xe8: the hypercall trap
  loop_tail(top);
  marker();
  c.insert(c.end(), {0xb0, 0xfe, 0xe6, 0x64, 0xf4});  // mov al,0xfe; out 0x64,al (reset: stop); hlt
  return c;
}

std::vector<xpv::bench::Result> run_exits(const xpv::bench::Options& opts) {
  const auto n = static_cast<std::uint32_t>(std::max(100.0, 20000 * opts.scale));
  xpv::kvm::VmConfig cfg;
  cfg.vcpus = 1;
  cfg.memory_bytes = 64ull << 20;
  // The Xen platform (hypercall trap, dispatcher) needs a run directory for its control socket.
  std::string run_dir = (std::filesystem::temp_directory_path() / "xpv-bench-exits.XXXXXX").string();
  if (::mkdtemp(run_dir.data()) == nullptr) throw std::runtime_error("mkdtemp " + run_dir + ": " + std::strerror(errno));
  struct RemoveDir {
    std::string d;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } remove_dir{run_dir};
  xpv::vmm::XenDomainConfig xcfg;
  xcfg.domid = 1;
  xcfg.name = "bench-exits";
  xcfg.run_dir = run_dir;
  xcfg.max_grant_frames = 1;
  xpv::vmm::add_xen_device_memory(cfg, xcfg);
  xpv::kvm::Vm vm(cfg);
  xpv::kvm::PciHost pci;
  xpv::vmm::XenDomain xen(vm, pci, xcfg);
  Marker marker;
  xpv::kvm::PmTimer pm;
  Sink sink;
  xpv::kvm::ResetPorts reset([&] { vm.request_stop(xpv::kvm::StopReason::reboot, "bench done"); });
  auto check = [](auto r) { if (!r) throw std::runtime_error(r.error().message); };
  check(vm.pio().add(kMarkerPort, 1, &marker, "marker"));
  check(vm.pio().add(kPmTimerPort, 4, &pm, "pm timer"));
  check(vm.pio().add(0x64, 1, &reset, "i8042"));
  check(vm.mmio().add(kMmioAddr, 0x1000, &sink, "mmio sink"));
  check(xpv::kvm::write_long_mode_tables(vm.memory()));
  const auto code = guest_code(n);
  auto m = vm.memory().translate(0x100000, code.size());
  if (!m) throw std::runtime_error("bench guest does not fit");
  std::memcpy(m->data(), code.data(), code.size());
  xpv::kvm::LinuxBootEntry e;
  e.rip = 0x100000;
  vm.boot_cpu_long_mode(e);
  const auto reason = vm.run();
  const auto st = marker.stamps();
  if (reason != xpv::kvm::StopReason::reboot || st.size() != 5) {
    throw std::runtime_error("exit bench guest stopped early: " + std::string(xpv::kvm::to_string(reason)) + " " +
                             vm.stop_message());
  }
  auto per = [&](int i) {
    return std::chrono::duration<double, std::nano>(st[static_cast<std::size_t>(i + 1)] - st[static_cast<std::size_t>(i)]).count() / n;
  };
  const std::string where = std::getenv("XPV_TESTBED") != nullptr ? "inside the testbed (nested KVM)" : "on this host's KVM";
  const std::string no_ref = "measured " + where + ", " + std::to_string(n) +
                             " iterations incl. loop instructions; QEMU reference not built (needs the stub as a "
                             "multiboot image)";
  if (xen.platform().calls(17) != n) {
    throw std::runtime_error("exit bench: " + std::to_string(xen.platform().calls(17)) + " of " + std::to_string(n) +
                             " hypercalls reached the dispatcher");
  }
  return {
      {"cpuid", "ns/exit", per(0), std::nullopt, no_ref, true},
      {"inl_pmtimer (userspace PIO)", "ns/exit", per(1), std::nullopt, no_ref, true},
      {"mmio read (userspace)", "ns/exit", per(2), std::nullopt, no_ref, true},
      {"hypercall round trip (xen_version via the port-I/O trap)", "ns/call", per(3), std::nullopt, no_ref, true},
  };
}

}  // namespace

XPV_BENCH_SUITE("exits", "ns per exit: CPUID, PM-timer port read, MMIO read, Xen hypercall (tiny guest, host clock)",
                run_exits);
