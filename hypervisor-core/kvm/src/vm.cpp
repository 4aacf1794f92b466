#include "xpv/kvm/vm.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "xpv/kvm/mptable.h"
#include "xpv/thread_name.h"

namespace xpv::kvm {
namespace {

// KVM runs on AMD SVM here (kvm_amd is loaded): what decides how a shutdown intercept is handled,
// whatever vendor string the CPU reports (an emulated CPU may report either).
bool kvm_is_svm() {
  struct stat st {};
  return ::stat("/sys/module/kvm_amd", &st) == 0 && S_ISDIR(st.st_mode);
}

constexpr std::uint64_t kTssAddr = 0xfffb'd000;       // 3 pages KVM needs on Intel (VMX real mode)
constexpr std::uint64_t kIdentityMapAddr = 0xfffb'c000;  // 1 page, just below the TSS
constexpr int kKickSignal = SIGUSR1;

// The vCPU thread's kvm_run, for the kick signal handler (async-signal-safe: one store).
thread_local kvm_run* t_run = nullptr;
// The vCPU (Vm::Vcpu) this thread runs, if any.
thread_local const void* t_vcpu = nullptr;

void on_kick(int) { if (t_run != nullptr) t_run->immediate_exit = 1; }

void install_kick_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = on_kick;
    sigemptyset(&sa.sa_mask);
    sigaction(kKickSignal, &sa, nullptr);  // no SA_RESTART: KVM_RUN must return EINTR
  });
}

// struct kvm_cpuid2 ends in a zero-length array, which g++ sizes differently in C++ (12 bytes, not
// 8), so KVM_GET_SUPPORTED_CPUID/KVM_SET_CPUID2 from <linux/kvm.h> encode the wrong size and KVM
// answers EINVAL. The ABI is an 8-byte header {u32 nent @0, u32 padding @4} then the entries @8.
struct Cpuid2Header {
  std::uint32_t nent;     // @0
  std::uint32_t padding;  // @4
};
static_assert(sizeof(Cpuid2Header) == 8);
constexpr unsigned long kGetSupportedCpuid = _IOWR(KVMIO, 0x05, Cpuid2Header);
constexpr unsigned long kSetCpuid2 = _IOW(KVMIO, 0x90, Cpuid2Header);
// struct kvm_msrs has the same problem (16 bytes in C++, 8 in C): one entry after an 8-byte header.
struct Msrs1 {
  std::uint32_t nmsrs;  // @0
  std::uint32_t pad;    // @4
  kvm_msr_entry entry;  // @8
};
static_assert(sizeof(Msrs1) == 8 + sizeof(kvm_msr_entry));
constexpr unsigned long kSetMsrs = _IOW(KVMIO, 0x89, Cpuid2Header);

// Hyper-V SynIC (TLFS): SINT0's MSR and its flag bits.
constexpr std::uint32_t kHvMsrSint0 = 0x4000'0090;
constexpr std::uint64_t kHvSintMasked = 1ull << 16;
constexpr std::uint64_t kHvSintAutoEoi = 1ull << 17;
constexpr std::uint64_t kHvStatusInvalidHypercallCode = 2;  // HV_STATUS_INVALID_HYPERCALL_CODE (TLFS)
constexpr auto kAutoEoiWait = std::chrono::seconds(1);

std::vector<std::uint8_t> cpuid_buffer(std::uint32_t n) {
  std::vector<std::uint8_t> buf(sizeof(Cpuid2Header) + n * sizeof(kvm_cpuid_entry2));
  Cpuid2Header h{n, 0};
  std::memcpy(buf.data(), &h, sizeof h);
  return buf;
}

[[noreturn]] void fail_setup(const std::string& what) {
  throw std::runtime_error(fmt::format("{}: {}", what, std::strerror(errno)));
}

}  // namespace

// One vCPU: its fd, its kvm_run mapping, its thread, its counters.
struct Vm::Vcpu {
  unsigned id = 0;
  UniqueFd fd;
  kvm_run* run = nullptr;
  std::size_t run_size = 0;
  std::thread thread;
  std::atomic<bool> started{false};
  // The thread as kick_all may signal it: set by the thread as it begins and cleared as it ends,
  // under kick_mu_, so a thread being (or already) joined is never signalled.
  pthread_t handle{};
  bool alive = false;
  std::atomic<pid_t> tid{0};  // the thread's id while it runs (vcpu_threads), else 0
  std::array<std::atomic<std::uint64_t>, kExitReasons> exits{};
  // Monitor samples (see vm.h): generation answered and whether it was halted with IF=0.
  std::atomic<std::uint64_t> sample_gen{0};
  std::atomic<bool> halted_off{false};
  // Auto-EOI vector (set_auto_eoi_vector): the generation this vCPU has applied; SynIC activated.
  std::atomic<std::uint64_t> auto_eoi_gen{0};
  bool synic_active = false;  // vCPU thread only
  std::uint64_t auto_eoi_refused = 0;  // vCPU thread only: the generation it could not apply
  // Pause (Vm::pause): waiting outside the guest; the thread has left its loop. Under pause_mu_.
  bool parked = false;
  bool ended = false;
  ~Vcpu() {
    if (run != nullptr) munmap(run, run_size);
  }
};

const char* to_string(StopReason r) noexcept {
  switch (r) {
    case StopReason::none: return "running";
    case StopReason::poweroff: return "poweroff";
    case StopReason::reboot: return "reboot";
    case StopReason::triple_fault: return "triple fault";
    case StopReason::error: return "error";
  }
  return "?";
}

const char* exit_reason_name(std::size_t r) noexcept {
  switch (r) {
    case KVM_EXIT_UNKNOWN: return "unknown";
    case KVM_EXIT_EXCEPTION: return "exception";
    case KVM_EXIT_IO: return "io";
    case KVM_EXIT_HYPERCALL: return "hypercall";
    case KVM_EXIT_DEBUG: return "debug";
    case KVM_EXIT_HLT: return "hlt";
    case KVM_EXIT_MMIO: return "mmio";
    case KVM_EXIT_IRQ_WINDOW_OPEN: return "irq_window_open";
    case KVM_EXIT_SHUTDOWN: return "shutdown";
    case KVM_EXIT_FAIL_ENTRY: return "fail_entry";
    case KVM_EXIT_INTR: return "intr";
    case KVM_EXIT_SET_TPR: return "set_tpr";
    case KVM_EXIT_TPR_ACCESS: return "tpr_access";
    case KVM_EXIT_NMI: return "nmi";
    case KVM_EXIT_INTERNAL_ERROR: return "internal_error";
    case KVM_EXIT_SYSTEM_EVENT: return "system_event";
    case KVM_EXIT_IOAPIC_EOI: return "ioapic_eoi";
    case KVM_EXIT_HYPERV: return "hyperv";
    case KVM_EXIT_X86_RDMSR: return "rdmsr";
    case KVM_EXIT_X86_WRMSR: return "wrmsr";
    case KVM_EXIT_XEN: return "xen";
    default: return "other";
  }
}

Vm::Vm(const VmConfig& cfg) : cfg_(cfg) {
  if (cfg.vcpus == 0 || cfg.vcpus > kMaxVcpus) {
    throw std::runtime_error(fmt::format("vcpus = {}: must be 1..{}", cfg.vcpus, kMaxVcpus));
  }
  if (cfg.affinity.size() > cfg.vcpus) {
    throw std::runtime_error(fmt::format("CPU lists for {} vCPUs, but the VM has {}", cfg.affinity.size(), cfg.vcpus));
  }
  affinity_ = cfg.affinity;
  affinity_.resize(cfg.vcpus);
  if (cfg.memory_bytes < (32ull << 20)) {
    throw std::runtime_error(fmt::format("memory = {} MiB: at least 32 MiB", cfg.memory_bytes >> 20));
  }
  kvm_fd_ = UniqueFd(open("/dev/kvm", O_RDWR | O_CLOEXEC));
  if (!kvm_fd_.valid()) fail_setup("cannot open /dev/kvm");
  const int api = ioctl(kvm_fd_.get(), KVM_GET_API_VERSION, 0);
  if (api != KVM_API_VERSION) throw std::runtime_error(fmt::format("/dev/kvm: API version {} (need {})", api, KVM_API_VERSION));
  const int max_vcpus = ioctl(kvm_fd_.get(), KVM_CHECK_EXTENSION, KVM_CAP_MAX_VCPUS);
  if (max_vcpus > 0 && cfg.vcpus > static_cast<unsigned>(max_vcpus)) {
    throw std::runtime_error(fmt::format("vcpus = {}: this KVM allows at most {}", cfg.vcpus, max_vcpus));
  }
  vm_fd_ = UniqueFd(ioctl(kvm_fd_.get(), KVM_CREATE_VM, 0));
  if (!vm_fd_.valid()) fail_setup("KVM_CREATE_VM");
  if (ioctl(vm_fd_.get(), KVM_SET_TSS_ADDR, kTssAddr) < 0) fail_setup("KVM_SET_TSS_ADDR");
  std::uint64_t ident = kIdentityMapAddr;
  if (ioctl(vm_fd_.get(), KVM_SET_IDENTITY_MAP_ADDR, &ident) < 0) fail_setup("KVM_SET_IDENTITY_MAP_ADDR");
  if (ioctl(vm_fd_.get(), KVM_CREATE_IRQCHIP, 0) < 0) fail_setup("KVM_CREATE_IRQCHIP");
  kvm_pit_config pit{};
  pit.flags = KVM_PIT_SPEAKER_DUMMY;
  if (ioctl(vm_fd_.get(), KVM_CREATE_PIT2, &pit) < 0) fail_setup("KVM_CREATE_PIT2");

  ram_ = std::make_unique<GuestRam>(cfg.memory_bytes, cfg.device_memory);
  spdlog::info("vm: {} MiB of guest RAM on {}", cfg.memory_bytes >> 20, ram_->backing());
  std::uint32_t slot = 0;
  for (const auto& r : ram_->regions()) {
    kvm_userspace_memory_region region{};
    region.slot = slot++;
    region.guest_phys_addr = r.gpa;
    region.memory_size = r.size;
    region.userspace_addr = reinterpret_cast<std::uint64_t>(r.host);
    if (ioctl(vm_fd_.get(), KVM_SET_USER_MEMORY_REGION, &region) < 0) fail_setup("KVM_SET_USER_MEMORY_REGION");
  }

  const int run_size = ioctl(kvm_fd_.get(), KVM_GET_VCPU_MMAP_SIZE, 0);
  if (run_size <= 0) fail_setup("KVM_GET_VCPU_MMAP_SIZE");
  run_size_ = static_cast<std::size_t>(run_size);
  for (unsigned i = 0; i < cfg.vcpus; ++i) {
    auto v = std::make_unique<Vcpu>();
    v->id = i;
    v->fd = UniqueFd(ioctl(vm_fd_.get(), KVM_CREATE_VCPU, i));
    if (!v->fd.valid()) fail_setup(fmt::format("KVM_CREATE_VCPU {}", i));
    void* p = mmap(nullptr, run_size_, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd.get(), 0);
    if (p == MAP_FAILED) fail_setup(fmt::format("mmap kvm_run of vCPU {}", i));
    v->run = static_cast<kvm_run*>(p);
    v->run_size = run_size_;
    setup_lapic(*v);
    vcpus_.push_back(std::move(v));
  }

  // Registers back to the vCPU through kvm_run after a port-I/O trap (see TrapContext).
  sync_regs_ = (ioctl(kvm_fd_.get(), KVM_CHECK_EXTENSION, KVM_CAP_SYNC_REGS) & KVM_SYNC_X86_REGS) != 0;
  synic_cap_ = ioctl(vm_fd_.get(), KVM_CHECK_EXTENSION, KVM_CAP_HYPERV_SYNIC) > 0;

  // Supported CPUID (grows until KVM stops saying E2BIG).
  for (std::uint32_t n = 64; n <= 4096; n *= 2) {
    auto buf = cpuid_buffer(n);
    if (ioctl(kvm_fd_.get(), kGetSupportedCpuid, buf.data()) == 0) {
      Cpuid2Header h;
      std::memcpy(&h, buf.data(), sizeof h);
      supported_cpuid_.resize(std::min(h.nent, n));
      std::memcpy(supported_cpuid_.data(), buf.data() + sizeof h, supported_cpuid_.size() * sizeof(kvm_cpuid_entry2));
      break;
    }
    if (errno != E2BIG) fail_setup("KVM_GET_SUPPORTED_CPUID");
  }
  for (const auto& e : supported_cpuid_) {
    if (e.function == 1) {
      cpu_signature_ = e.eax;
      cpu_features_ = e.edx;
    }
  }
}

Vm::~Vm() {
  request_stop(StopReason::error, "VM destroyed");
  for (auto& v : vcpus_) {
    if (v->thread.joinable()) v->thread.join();
  }
  if (resample_thread_.joinable()) {
    const std::uint64_t one = 1;
    (void)!::write(resample_stop_.get(), &one, sizeof one);
    resample_thread_.join();
  }
}

void Vm::set_pio_trap(std::uint16_t port, std::function<void(VcpuContext&)> fn, std::uint8_t size) {
  if (size != 1 && size != 2 && size != 4) throw std::invalid_argument("set_pio_trap: size 1, 2 or 4");
  for (PioTrap& t : traps_) {
    if (t.size == 0 || t.port == port) {
      t = PioTrap{port, size, std::move(fn)};
      return;
    }
  }
  throw std::invalid_argument("set_pio_trap: no room for another trap port");
}

namespace {
Result<void> pio_eventfd(int vm_fd, std::uint16_t port, std::uint8_t size, std::uint32_t value, int fd,
                         bool assign) noexcept {
  kvm_ioeventfd e{};
  e.datamatch = value;
  e.addr = port;
  e.len = size;
  e.fd = fd;
  e.flags = KVM_IOEVENTFD_FLAG_PIO | KVM_IOEVENTFD_FLAG_DATAMATCH | (assign ? 0 : KVM_IOEVENTFD_FLAG_DEASSIGN);
  if (ioctl(vm_fd, KVM_IOEVENTFD, &e) < 0) {
    return err(fmt::format("KVM_IOEVENTFD {} port {:#x} size {} value {}: {}", assign ? "assign" : "deassign", port,
                           size, value, std::strerror(errno)));
  }
  return {};
}
}  // namespace

Result<void> Vm::add_pio_eventfd(std::uint16_t port, std::uint8_t size, std::uint32_t value, int fd) noexcept {
  return pio_eventfd(vm_fd_.get(), port, size, value, fd, true);
}

Result<void> Vm::remove_pio_eventfd(std::uint16_t port, std::uint8_t size, std::uint32_t value, int fd) noexcept {
  return pio_eventfd(vm_fd_.get(), port, size, value, fd, false);
}

void Vm::set_msr_write_trap(std::uint32_t msr, std::function<bool(unsigned, std::uint64_t)> fn) {
  const int user_msr = ioctl(kvm_fd_.get(), KVM_CHECK_EXTENSION, KVM_CAP_X86_USER_SPACE_MSR);
  if (user_msr <= 0 || ioctl(kvm_fd_.get(), KVM_CHECK_EXTENSION, KVM_CAP_X86_MSR_FILTER) <= 0) {
    throw std::runtime_error(fmt::format(
        "this KVM cannot hand MSR {:#x} writes to the VMM (no KVM_CAP_X86_USER_SPACE_MSR / KVM_CAP_X86_MSR_FILTER; Linux >= 5.10 has them)",
        msr));
  }
  kvm_enable_cap cap{};
  cap.cap = KVM_CAP_X86_USER_SPACE_MSR;
  cap.args[0] = KVM_MSR_EXIT_REASON_FILTER;
  if (ioctl(vm_fd_.get(), KVM_ENABLE_CAP, &cap) < 0) fail_setup("KVM_ENABLE_CAP KVM_CAP_X86_USER_SPACE_MSR");
  // Default allow; one range of one MSR whose write bit is 0 (denied → exit with reason FILTER).
  std::uint8_t deny_write = 0;
  kvm_msr_filter filter{};
  filter.flags = KVM_MSR_FILTER_DEFAULT_ALLOW;
  filter.ranges[0].flags = KVM_MSR_FILTER_WRITE;
  filter.ranges[0].nmsrs = 1;
  filter.ranges[0].base = msr;
  filter.ranges[0].bitmap = &deny_write;
  if (ioctl(vm_fd_.get(), KVM_X86_SET_MSR_FILTER, &filter) < 0) fail_setup("KVM_X86_SET_MSR_FILTER");
  msr_trap_index_ = msr;
  msr_trap_ = std::move(fn);
}

void Vm::signal_msi(unsigned vcpu, std::uint8_t vector) noexcept {
  // MSI address: 0xfee00000 | destination APIC id << 12 (physical mode); data: fixed, edge, vector.
  kvm_msi msi{};
  msi.address_lo = 0xfee0'0000u | (vcpu << 12);
  msi.data = vector;
  if (ioctl(vm_fd_.get(), KVM_SIGNAL_MSI, &msi) < 0) {
    static std::atomic<int> logged{0};
    if (logged.fetch_add(1) < 5) spdlog::warn("vm: KVM_SIGNAL_MSI vector {:#x} to vCPU {}: {}", vector, vcpu, std::strerror(errno));
  }
}

std::vector<UniqueFd> Vm::upcall_lines() {
  std::lock_guard lk(route_mu_);
  if (upcall_fds_.empty()) {
    // Made in full or not at all: on a failure the lines made so far are closed, which detaches
    // them from KVM, and a later call starts again.
    std::vector<UniqueFd> fds;
    for (unsigned v = 0; v < vcpus_.size(); ++v) {
      UniqueFd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
      if (!fd.valid()) fail_setup(fmt::format("eventfd for vCPU {}'s upcall line", v));
      kvm_irqfd f{};
      f.fd = static_cast<std::uint32_t>(fd.get());
      f.gsi = kFirstUpcallGsi + v;
      if (ioctl(vm_fd_.get(), KVM_IRQFD, &f) < 0) fail_setup(fmt::format("KVM_IRQFD on GSI {} (vCPU {}'s upcall line)", f.gsi, v));
      fds.push_back(std::move(fd));
    }
    upcall_vectors_.assign(vcpus_.size(), 0);
    upcall_fds_ = std::move(fds);
  }
  std::vector<UniqueFd> out;
  for (const auto& fd : upcall_fds_) {
    UniqueFd d(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!d.valid()) fail_setup("dup of an upcall line");
    out.push_back(std::move(d));
  }
  return out;
}

Result<void> Vm::route_upcall(unsigned vcpu, std::uint8_t vector) noexcept {
  std::lock_guard lk(route_mu_);
  if (vcpu >= upcall_vectors_.size()) return err("route_upcall: vCPU " + std::to_string(vcpu) + " has no upcall line");
  if (upcall_vectors_[vcpu] == vector) return {};
  // KVM_SET_GSI_ROUTING replaces the whole table: KVM's defaults for the in-kernel PIC and IOAPIC
  // (GSI 0-15 on both, 16-23 on the IOAPIC: kvm_setup_default_irq_routing) plus the routed lines.
  // The C header's kvm_irq_routing is {u32 nr; u32 flags; entries[]}: the entries start at byte 8
  // and _IOW encodes size 8. g++ sizes that struct 16 (its zero-length array of 8-aligned
  // entries), which would give KVM_SET_GSI_ROUTING another number (ENOTTY, found in the testbed)
  // and put the entries where KVM does not look: both are spelled out here.
  constexpr std::size_t kHeader = 8;
  constexpr unsigned long kSetGsiRouting = _IOC(_IOC_WRITE, KVMIO, 0x6a, kHeader);
  static_assert(sizeof(kvm_irq_routing_entry) == 48);
  constexpr unsigned kMaxEntries = 16 * 2 + 8 + kMaxVcpus;
  alignas(kvm_irq_routing_entry) std::uint8_t buf[kHeader + kMaxEntries * sizeof(kvm_irq_routing_entry)];
  std::memset(buf, 0, sizeof buf);
  auto* entries = reinterpret_cast<kvm_irq_routing_entry*>(buf + kHeader);
  unsigned n = 0;
  for (std::uint32_t gsi = 0; gsi < 24; ++gsi) {
    kvm_irq_routing_entry& io = entries[n++];
    io.gsi = gsi;
    io.type = KVM_IRQ_ROUTING_IRQCHIP;
    io.u.irqchip.irqchip = KVM_IRQCHIP_IOAPIC;
    io.u.irqchip.pin = gsi;
    if (gsi < 16) {
      kvm_irq_routing_entry& pic = entries[n++];
      pic.gsi = gsi;
      pic.type = KVM_IRQ_ROUTING_IRQCHIP;
      pic.u.irqchip.irqchip = gsi < 8 ? KVM_IRQCHIP_PIC_MASTER : KVM_IRQCHIP_PIC_SLAVE;
      pic.u.irqchip.pin = gsi % 8;
    }
  }
  const std::uint8_t old = upcall_vectors_[vcpu];
  upcall_vectors_[vcpu] = vector;
  for (unsigned v = 0; v < upcall_vectors_.size() && n < kMaxEntries; ++v) {
    if (upcall_vectors_[v] == 0) continue;
    kvm_irq_routing_entry& m = entries[n++];
    m.gsi = kFirstUpcallGsi + v;
    m.type = KVM_IRQ_ROUTING_MSI;
    m.u.msi.address_lo = 0xfee0'0000u | (v << 12);  // physical destination: APIC id = vCPU index
    m.u.msi.data = upcall_vectors_[v];               // fixed, edge
  }
  const std::uint32_t nr_flags[2] = {n, 0};
  std::memcpy(buf, nr_flags, sizeof nr_flags);
  if (ioctl(vm_fd_.get(), kSetGsiRouting, buf) < 0) {
    const int e = errno;
    upcall_vectors_[vcpu] = old;
    return err(fmt::format("KVM_SET_GSI_ROUTING (vCPU {}'s upcall line to vector {:#x}): {}", vcpu, vector,
                                   std::strerror(e)));
  }
  return {};
}

void Vm::add_resample_line(std::uint32_t gsi, std::function<void()> on_eoi) {
  if (irqfd_.valid()) throw std::runtime_error("vm: only one resample line is supported");
  // Kept only once attached and served: a failure leaves no line half-made (assert_line then
  // writes nowhere, and a retry is not refused as a second line).
  UniqueFd irqfd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  UniqueFd resamplefd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  UniqueFd stop(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!irqfd.valid() || !resamplefd.valid() || !stop.valid()) fail_setup("eventfd for the resample line");
  kvm_irqfd f{};
  f.fd = static_cast<std::uint32_t>(irqfd.get());
  f.gsi = gsi;
  f.flags = KVM_IRQFD_FLAG_RESAMPLE;
  f.resamplefd = static_cast<std::uint32_t>(resamplefd.get());
  if (ioctl(vm_fd_.get(), KVM_IRQFD, &f) < 0) fail_setup(fmt::format("KVM_IRQFD (resample) on GSI {}", gsi));
  resamplefd_ = std::move(resamplefd);
  resample_stop_ = std::move(stop);
  resample_gsi_ = gsi;
  on_eoi_ = std::move(on_eoi);
  try {
    resample_thread_ = std::thread([this] { resample_loop(); });
  } catch (...) {
    resamplefd_ = UniqueFd();  // and `irqfd`, closed on the way out, detaches the line from KVM
    resample_stop_ = UniqueFd();
    on_eoi_ = nullptr;
    throw;
  }
  irqfd_ = std::move(irqfd);
}

void Vm::assert_line() noexcept {
  const std::uint64_t one = 1;
  if (irqfd_.valid()) (void)!::write(irqfd_.get(), &one, sizeof one);
}

void Vm::resample_loop() noexcept {
  pollfd fds[2] = {{resamplefd_.get(), POLLIN, 0}, {resample_stop_.get(), POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("vm: resample line: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    std::uint64_t n;
    if (::read(resamplefd_.get(), &n, sizeof n) == sizeof n && on_eoi_) on_eoi_();
  }
}

namespace {
// The VcpuContext of one trap: registers fetched lazily, rax written back on destruction.
// The registers are read with KVM_GET_REGS when a trap needs them. They go back through
// kvm_run (KVM_CAP_SYNC_REGS, `run` not null: kvm_dirty_regs), which the next KVM_RUN applies
// before it completes the trapping `out`, saving the KVM_SET_REGS round trip; without the
// capability, KVM_SET_REGS. (kvm_valid_regs would have KVM store them with every exit, for the
// few that are traps.)
class TrapContext final : public VcpuContext {
 public:
  TrapContext(unsigned id, int fd, kvm_run* run) : id_(id), fd_(fd), run_(run) {}
  ~TrapContext() override {
    if (!dirty_) return;
    if (run_ != nullptr) {
      run_->s.regs.regs = regs_;
      run_->kvm_dirty_regs |= KVM_SYNC_X86_REGS;
    } else if (ioctl(fd_, KVM_SET_REGS, &regs_) < 0) {
      spdlog::error("vm: vCPU {}: KVM_SET_REGS after a trap: {}", id_, std::strerror(errno));
    }
  }
  unsigned id() const noexcept override { return id_; }
  const kvm_regs* regs() noexcept override {
    if (!have_) have_ = ioctl(fd_, KVM_GET_REGS, &regs_) == 0;
    return have_ ? &regs_ : nullptr;
  }
  void set_rax(std::uint64_t value) noexcept override {
    if (regs() == nullptr) return;
    regs_.rax = value;
    dirty_ = true;
  }
  void set_rdx(std::uint64_t value) noexcept override {
    if (regs() == nullptr) return;
    regs_.rdx = value;
    dirty_ = true;
  }
  std::optional<std::uint64_t> translate(std::uint64_t gva) noexcept override {
    kvm_translation t{};
    t.linear_address = gva;
    if (ioctl(fd_, KVM_TRANSLATE, &t) < 0 || !t.valid) return std::nullopt;
    return t.physical_address;
  }
  std::optional<unsigned> cpl() noexcept override {
    kvm_sregs s{};
    if (ioctl(fd_, KVM_GET_SREGS, &s) < 0) return std::nullopt;
    if ((s.cr0 & 1) == 0) return 0u;  // real mode
    const kvm_regs* r = regs();
    if (r == nullptr) return std::nullopt;
    if ((r->rflags & (1u << 17)) != 0) return 3u;  // EFLAGS.VM: virtual-8086 mode
    return static_cast<unsigned>(s.ss.dpl);
  }

 private:
  unsigned id_;
  int fd_;
  kvm_run* run_;
  kvm_regs regs_{};
  bool have_ = false;
  bool dirty_ = false;
};
}  // namespace

std::string Vm::describe_state(Vcpu& v) noexcept {
  // What QEMU prints for -d cpu_reset, in one line: enough to find the faulting code in System.map.
  kvm_regs r{};
  kvm_sregs s{};
  kvm_vcpu_events ev{};
  if (ioctl(v.fd.get(), KVM_GET_REGS, &r) < 0 || ioctl(v.fd.get(), KVM_GET_SREGS, &s) < 0) {
    return fmt::format("registers unavailable: {}", std::strerror(errno));
  }
  std::string out = fmt::format(
      "rip={:#x} rsp={:#x} rflags={:#x} rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} rsi={:#x} rdi={:#x} "
      "rbp={:#x} cs={:#x} ss={:#x} cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x} "
      "idt={:#x}/{:#x} gdt={:#x}/{:#x} tr={:#x}@{:#x}",
      r.rip, r.rsp, r.rflags, r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, s.cs.selector,
      s.ss.selector, s.cr0, s.cr2, s.cr3, s.cr4, s.efer, s.idt.base, s.idt.limit, s.gdt.base,
      s.gdt.limit, s.tr.selector, s.tr.base);
  if (ioctl(v.fd.get(), KVM_GET_VCPU_EVENTS, &ev) == 0) {
    out += fmt::format(" exception={}:{}/{:#x} interrupt={}:{:#x} nmi={}", ev.exception.injected,
                       ev.exception.nr, ev.exception.error_code, ev.interrupt.injected, ev.interrupt.nr,
                       ev.nmi.injected);
  }
  return out;
}

void Vm::pio_trap(Vcpu& v, const PioTrap& t) noexcept {
  TrapContext ctx(v.id, v.fd.get(), sync_regs_ ? v.run : nullptr);
  t.fn(ctx);
}

void Vm::setup_lapic(Vcpu& v) {
  // LINT0 = ExtINT (the 8259 behind it, for the BSP), LINT1 = NMI: what a BIOS leaves behind and
  // what the MP table's local-interrupt entries say.
  kvm_lapic_state la{};
  if (ioctl(v.fd.get(), KVM_GET_LAPIC, &la) < 0) fail_setup("KVM_GET_LAPIC");
  auto set_lvt = [&](std::size_t off, std::uint32_t mode) {
    std::uint32_t val;
    std::memcpy(&val, la.regs + off, 4);
    val = (val & ~0x700u) | (mode << 8);
    std::memcpy(la.regs + off, &val, 4);
  };
  set_lvt(0x350, 7);  // LVT LINT0: ExtINT
  set_lvt(0x360, 4);  // LVT LINT1: NMI
  if (ioctl(v.fd.get(), KVM_SET_LAPIC, &la) < 0) fail_setup("KVM_SET_LAPIC");
}

Result<void> Vm::setup_cpuid() {
  // KVM emulates the TSC-deadline timer but KVM_GET_SUPPORTED_CPUID does not report it: the VMM
  // decides (as QEMU does). Without it Linux calibrates the LAPIC timer against the PIT, which
  // fails under nested virtualisation and leaves only the PIT.
  const bool tsc_deadline = ioctl(kvm_fd_.get(), KVM_CHECK_EXTENSION, KVM_CAP_TSC_DEADLINE_TIMER) > 0;
  for (auto& v : vcpus_) {
    std::vector<kvm_cpuid_entry2> entries;
    for (auto e : supported_cpuid_) {
      if (e.function >= 0x4000'0000 && e.function < 0x4000'0100) {
        // KVM's leaves move up one 0x100 block (Linux scans 0x40000000..0x4000ff00 for "KVMKVMKVM").
        if (e.function == 0x4000'0000 && e.eax >= 0x4000'0000 && e.eax < 0x4000'0100) e.eax += 0x100;
        e.function += 0x100;
      }
      switch (e.function) {
        case 1:
          e.ecx |= 1u << 31;  // hypervisor present
          if (tsc_deadline) e.ecx |= 1u << 24;  // TSC-deadline LAPIC timer (KVM emulates it)
          e.ebx = (e.ebx & 0x0000'ffffu) | (static_cast<std::uint32_t>(vcpus_.size()) << 16) | (v->id << 24);
          e.edx |= 1u << 28;  // HTT: ebx[23:16] is meaningful
          break;
        case 0xb:
        case 0x1f:
          e.edx = v->id;  // x2APIC id
          break;
        default: break;
      }
      entries.push_back(e);
    }
    if (cpuid_hook_) cpuid_hook_(v->id, entries);
    auto buf = cpuid_buffer(static_cast<std::uint32_t>(entries.size()));
    std::memcpy(buf.data() + sizeof(Cpuid2Header), entries.data(), entries.size() * sizeof(kvm_cpuid_entry2));
    if (ioctl(v->fd.get(), kSetCpuid2, buf.data()) < 0) {
      return err(fmt::format("KVM_SET_CPUID2 on vCPU {}: {}", v->id, std::strerror(errno)));
    }
  }
  return {};
}

void Vm::boot_cpu_long_mode(const LinuxBootEntry& e) {
  Vcpu& v = *vcpus_.front();
  kvm_sregs s{};
  if (ioctl(v.fd.get(), KVM_GET_SREGS, &s) < 0) fail_setup("KVM_GET_SREGS");
  kvm_segment code{};
  code.base = 0;
  code.limit = 0xffffffff;
  code.selector = kBootCs;
  code.type = 0xb;  // execute/read, accessed
  code.present = 1;
  code.s = 1;
  code.l = 1;
  code.g = 1;
  kvm_segment data = code;
  data.selector = kBootDs;
  data.type = 0x3;  // read/write, accessed
  data.l = 0;
  data.db = 1;
  s.cs = code;
  s.ds = s.es = s.fs = s.gs = s.ss = data;
  s.gdt.base = e.gdt_base;
  s.gdt.limit = e.gdt_limit;
  s.idt.base = 0;
  s.idt.limit = 0;
  s.cr0 = 0x8000'0033;  // PG | NE | ET | MP | PE
  s.cr3 = e.cr3;
  s.cr4 = 0x20;         // PAE
  s.efer = 0x500;       // LME | LMA
  if (ioctl(v.fd.get(), KVM_SET_SREGS, &s) < 0) fail_setup("KVM_SET_SREGS");
  kvm_regs r{};
  r.rip = e.rip;
  r.rsi = e.rsi;
  r.rsp = e.rsp;
  r.rbp = e.rsp;
  r.rflags = 0x2;
  if (ioctl(v.fd.get(), KVM_SET_REGS, &r) < 0) fail_setup("KVM_SET_REGS");
  kvm_fpu fpu{};
  fpu.fcw = 0x37f;
  fpu.mxcsr = 0x1f80;
  if (ioctl(v.fd.get(), KVM_SET_FPU, &fpu) < 0) fail_setup("KVM_SET_FPU");
}

void Vm::boot_cpu_protected_mode(std::uint32_t eip) {
  // The state a multiboot loader hands over: flat 4 GiB code and data segments, CR0.PE, paging
  // off, interrupts off (the segment selectors are the boot GDT's, which the caller need not load).
  Vcpu& v = *vcpus_.front();
  kvm_sregs s{};
  if (ioctl(v.fd.get(), KVM_GET_SREGS, &s) < 0) fail_setup("KVM_GET_SREGS");
  kvm_segment code{};
  code.limit = 0xffffffff;
  code.selector = kBootCs;
  code.type = 0xb;  // execute/read, accessed
  code.present = 1;
  code.s = 1;
  code.db = 1;  // 32-bit
  code.g = 1;
  kvm_segment data = code;
  data.selector = kBootDs;
  data.type = 0x3;  // read/write, accessed
  s.cs = code;
  s.ds = s.es = s.fs = s.gs = s.ss = data;
  s.cr0 = 0x11;  // ET | PE
  s.cr3 = 0;
  s.cr4 = 0;
  s.efer = 0;
  if (ioctl(v.fd.get(), KVM_SET_SREGS, &s) < 0) fail_setup("KVM_SET_SREGS");
  kvm_regs r{};
  r.rip = eip;
  r.rflags = 0x2;
  if (ioctl(v.fd.get(), KVM_SET_REGS, &r) < 0) fail_setup("KVM_SET_REGS");
}

void Vm::boot_cpu_real_mode(std::uint16_t cs, std::uint16_t ip) {
  Vcpu& v = *vcpus_.front();
  kvm_sregs s{};
  if (ioctl(v.fd.get(), KVM_GET_SREGS, &s) < 0) fail_setup("KVM_GET_SREGS");
  s.cs.selector = cs;
  s.cs.base = std::uint64_t{cs} << 4;
  if (ioctl(v.fd.get(), KVM_SET_SREGS, &s) < 0) fail_setup("KVM_SET_SREGS");
  kvm_regs r{};
  r.rip = ip;
  r.rflags = 0x2;
  if (ioctl(v.fd.get(), KVM_SET_REGS, &r) < 0) fail_setup("KVM_SET_REGS");
}

void Vm::set_irq(std::uint32_t gsi, bool level) noexcept {
  kvm_irq_level l{};
  l.irq = gsi;
  l.level = level ? 1 : 0;
  if (ioctl(vm_fd_.get(), KVM_IRQ_LINE, &l) < 0) {
    static std::atomic<int> logged{0};
    if (logged.fetch_add(1) < 5) spdlog::warn("vm: KVM_IRQ_LINE gsi {}: {}", gsi, std::strerror(errno));
  }
}

void Vm::request_stop(StopReason reason, std::string message) noexcept {
  StopReason expected = StopReason::none;
  if (stop_reason_.compare_exchange_strong(expected, reason)) {
    {
      std::lock_guard lk(stop_mu_);
      stop_message_ = std::move(message);
    }
    stop_cv_.notify_all();
    {
      std::lock_guard lk(pause_mu_);  // a parked vCPU waits on this cv: it ends now
    }
    pause_cv_.notify_all();
  }
  kick_all();
}

Result<void> Vm::pause(std::chrono::milliseconds wait) noexcept {
  if (t_vcpu != nullptr) return err("a vCPU cannot pause its own VM (it would wait for itself)");
  std::unique_lock lk(pause_mu_);
  if (pause_wanted_.load()) return err("the VM is paused already");
  pause_wanted_.store(true);
  lk.unlock();
  kick_all();  // out of KVM_RUN (or not into it): each parks at the top of its loop
  lk.lock();
  const auto deadline = std::chrono::steady_clock::now() + wait;
  const Vcpu* late = nullptr;
  const auto all_parked = [&] {
    late = nullptr;
    for (auto& v : vcpus_) {
      if (v->started.load() && !v->parked && !v->ended) late = v.get();
    }
    return late == nullptr || stop_reason_.load() != StopReason::none;
  };
  while (!all_parked()) {
    if (pause_cv_.wait_until(lk, deadline) == std::cv_status::timeout && !all_parked()) {
      pause_wanted_.store(false);
      lk.unlock();
      pause_cv_.notify_all();
      return err(fmt::format("vCPU {} did not stop within {} ms; the VM runs on", late->id, wait.count()));
    }
  }
  return {};
}

Result<void> Vm::resume() noexcept {
  {
    std::lock_guard lk(pause_mu_);
    if (!pause_wanted_.load()) return err("the VM is not paused");
    pause_wanted_.store(false);
  }
  pause_cv_.notify_all();
  return {};
}

bool Vm::paused() const noexcept { return pause_wanted_.load(); }

Result<void> Vm::set_vcpu_affinity(const std::vector<unsigned>& vcpus, const CpuList& cpus) noexcept {
  if (cpus.empty()) return err("an empty CPU set");
  for (const unsigned v : vcpus) {
    if (v >= vcpus_.size()) return err(fmt::format("there is no vCPU {} (the VM has {})", v, vcpus_.size()));
  }
  std::lock_guard lk(kick_mu_);
  // Each running thread placed now; one that has not begun takes it as it begins. A refusal puts
  // back the ones already moved: all of them or none.
  std::vector<std::pair<unsigned, CpuList>> moved;
  for (const unsigned v : vcpus) {
    Vcpu& vc = *vcpus_[v];
    if (!vc.alive) continue;
    auto before = cpus_of_thread(vc.tid.load());
    if (auto r = place_thread(vc.tid.load(), cpus); !r) {
      for (const auto& [m, was] : moved) (void)place_thread(vcpus_[m]->tid.load(), was);
      return err(fmt::format("vCPU {}: cannot be placed on CPUs {}: {}", v, format_cpu_list(cpus), r.error().message));
    }
    if (before) moved.emplace_back(v, *before);
  }
  for (const unsigned v : vcpus) affinity_[v] = cpus;
  return {};
}

std::vector<pid_t> Vm::vcpu_threads() const noexcept {
  std::vector<pid_t> r;
  r.reserve(vcpus_.size());
  for (const auto& v : vcpus_) r.push_back(v->tid.load());
  return r;
}

void Vm::park(Vcpu& v) noexcept {
  std::unique_lock lk(pause_mu_);
  v.parked = true;
  pause_cv_.notify_all();
  while (pause_wanted_.load() && stop_reason_.load() == StopReason::none) {
    // A vector change made by a vCPU that was in its hypercall when the pause came waits for
    // every vCPU to take it (set_auto_eoi_vector): taken here too, so it need not time out.
    lk.unlock();
    apply_pending_auto_eoi(v);
    lk.lock();
    pause_cv_.wait_for(lk, std::chrono::milliseconds(10));
  }
  v.parked = false;
}

std::string Vm::stop_message() const {
  std::lock_guard lk(stop_mu_);
  return stop_message_;
}

void Vm::kick_all() noexcept {
  std::lock_guard lk(kick_mu_);
  for (auto& v : vcpus_) {
    if (v->alive) pthread_kill(v->handle, kKickSignal);
  }
}

void Vm::sample(Vcpu& v) noexcept {
  const std::uint64_t gen = kick_gen_.load();
  if (v.sample_gen.load() == gen) return;
  bool off = false;
  kvm_mp_state mp{};
  if (ioctl(v.fd.get(), KVM_GET_MP_STATE, &mp) == 0) {
    if (mp.mp_state == KVM_MP_STATE_UNINITIALIZED || mp.mp_state == KVM_MP_STATE_INIT_RECEIVED) {
      off = v.id != 0;  // an AP never started (the BSP never is in these states)
    } else if (mp.mp_state == KVM_MP_STATE_HALTED) {
      kvm_regs r{};
      off = ioctl(v.fd.get(), KVM_GET_REGS, &r) == 0 && !(r.rflags & 0x200);
    }
  }
  v.halted_off.store(off);
  v.sample_gen.store(gen);
}

Result<void> Vm::handle_io(Vcpu& v) noexcept {
  const auto& io = v.run->io;
  if (io.direction == KVM_EXIT_IO_OUT && io.count == 1) {
    for (const PioTrap& t : traps_) {
      if (t.size != 0 && io.port == t.port && io.size == t.size) {
        pio_trap(v, t);
        return {};
      }
    }
  }
  const std::uint64_t bytes = std::uint64_t{io.size} * io.count;
  if (io.size == 0 || io.size > 8 || io.data_offset > v.run_size || bytes > v.run_size - io.data_offset) {
    return err(fmt::format("vCPU {}: malformed KVM_EXIT_IO (port {:#x} size {} count {})", v.id, io.port, io.size, io.count));
  }
  auto* p = reinterpret_cast<std::uint8_t*>(v.run) + io.data_offset;
  for (std::uint32_t i = 0; i < io.count; ++i) {
    std::span<std::uint8_t> d(p + std::size_t{i} * io.size, io.size);
    if (io.direction == KVM_EXIT_IO_OUT) pio_.write(io.port, d);
    else pio_.read(io.port, d);
  }
  return {};
}

Result<void> Vm::set_auto_eoi_vector(std::uint8_t vector) noexcept {
  if (vector != 0 && vector < 16) return err(fmt::format("auto-EOI vector {:#x}: vectors 0x10..0xff only", vector));
  std::lock_guard lk(auto_eoi_mu_);
  if (auto_eoi_vector_.load() == vector) return {};
  if (!synic_cap_) {
    return err("this KVM has no Hyper-V SynIC (KVM_CAP_HYPERV_SYNIC), which xpv-vmm needs to deliver an "
               "interrupt that takes no EOI (Xen's global callback vector)");
  }
  const std::uint8_t before = auto_eoi_vector_.load();
  // The vector for every vCPU: this thread's own now, the others at the top of their loop,
  // before they enter the guest again (a kick makes each leave KVM_RUN or not enter it; the
  // generation is bumped before the kick).
  auto publish = [&](std::uint8_t vec) -> Result<std::uint64_t> {
    auto_eoi_vector_.store(vec, std::memory_order_release);
    const std::uint64_t gen = auto_eoi_gen_.fetch_add(1, std::memory_order_acq_rel) + 1;
    for (auto& v : vcpus_) {
      if (t_vcpu == v.get()) {
        if (auto r = apply_auto_eoi(*v); !r) return Unexpected<Error>(r.error());
      }
    }
    kick_all();
    return gen;
  };
  auto gen = publish(vector);
  if (!gen) {
    (void)publish(before);
    return Unexpected<Error>(gen.error());
  }
  const auto deadline = std::chrono::steady_clock::now() + kAutoEoiWait;
  for (auto& v : vcpus_) {
    while (v->started.load() && v->auto_eoi_gen.load(std::memory_order_acquire) < *gen &&
           stop_reason_.load() == StopReason::none) {
      if (std::chrono::steady_clock::now() >= deadline) {
        // The caller keeps the old callback (it is told the change failed): so must the vCPUs,
        // or the old vector would be injected as one that wants an EOI the guest never sends.
        (void)publish(before);
        return err(fmt::format("auto-EOI vector {:#x}: vCPU {} did not take it within {} s", vector, v->id,
                               kAutoEoiWait.count()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  return {};
}

Result<void> Vm::apply_auto_eoi(Vcpu& v) noexcept {
  const std::uint64_t gen = auto_eoi_gen_.load(std::memory_order_acquire);
  const std::uint8_t vector = auto_eoi_vector_.load(std::memory_order_acquire);
  if (!v.synic_active && vector != 0) {
    kvm_enable_cap cap{};
    cap.cap = KVM_CAP_HYPERV_SYNIC;
    if (ioctl(v.fd.get(), KVM_ENABLE_CAP, &cap) < 0) {
      return err(fmt::format("vCPU {}: KVM_ENABLE_CAP KVM_CAP_HYPERV_SYNIC: {}", v.id, std::strerror(errno)));
    }
    v.synic_active = true;
  }
  if (v.synic_active) {
    Msrs1 m{};
    m.nmsrs = 1;
    m.entry.index = kHvMsrSint0;
    m.entry.data = vector != 0 ? (vector | kHvSintAutoEoi) : kHvSintMasked;
    if (ioctl(v.fd.get(), kSetMsrs, &m) != 1) {
      return err(fmt::format("vCPU {}: KVM_SET_MSRS SynIC SINT0 = {:#x}: refused", v.id, m.entry.data));
    }
  }
  v.auto_eoi_gen.store(gen, std::memory_order_release);
  return {};
}

void Vm::apply_pending_auto_eoi(Vcpu& v) noexcept {
  if (const std::uint64_t want = auto_eoi_gen_.load(std::memory_order_acquire);
      v.auto_eoi_gen.load(std::memory_order_relaxed) != want && v.auto_eoi_refused != want) {
    // A change this vCPU cannot take is not applied (nor tried again): its setter waits for
    // every vCPU, times out and rolls the change back (set_auto_eoi_vector). The guest is told
    // the vector failed, as on the vCPU that asked; the VM runs on.
    if (auto r = apply_auto_eoi(v); !r) {
      v.auto_eoi_refused = want;
      spdlog::error("vm: {}; the vector change is rolled back", r.error().message);
    }
  }
}

Result<void> Vm::vcpu_loop(Vcpu& v) noexcept {
  kvm_run* run = v.run;
  while (stop_reason_.load() == StopReason::none) {
    apply_pending_auto_eoi(v);
    if (pause_wanted_.load()) {
      park(v);
      continue;
    }
    const int rc = ioctl(v.fd.get(), KVM_RUN, 0);
    if (rc < 0) {
      if (errno == EINTR || errno == EAGAIN) {
        run->immediate_exit = 0;
        sample(v);
        continue;
      }
      return err(fmt::format("vCPU {}: KVM_RUN: {}", v.id, std::strerror(errno)));
    }
    const std::uint32_t reason = run->exit_reason;
    v.exits[reason < kExitReasons ? reason : 0].fetch_add(1, std::memory_order_relaxed);
    switch (reason) {
      case KVM_EXIT_IO:
        if (auto r = handle_io(v); !r) return r;
        break;
      case KVM_EXIT_MMIO: {
        auto& m = run->mmio;
        const std::size_t len = m.len <= 8 ? m.len : 8;
        std::span<std::uint8_t> d(m.data, len);
        if (m.is_write) mmio_.write(m.phys_addr, d);
        else mmio_.read(m.phys_addr, d);
        break;
      }
      case KVM_EXIT_X86_WRMSR:
      case KVM_EXIT_X86_RDMSR: {
        // Only the trapped MSR's writes are filtered to us; anything else faults as on hardware.
        bool ok = false;
        if (reason == KVM_EXIT_X86_WRMSR && msr_trap_ && run->msr.index == msr_trap_index_) {
          ok = msr_trap_(v.id, run->msr.data);
        }
        run->msr.error = ok ? 0 : 1;
        break;
      }
      case KVM_EXIT_HLT:
        request_stop(StopReason::poweroff, "hlt exit");
        break;
      case KVM_EXIT_SHUTDOWN:
        // On AMD SVM, KVM re-initialises the VMCB at a shutdown intercept (svm.c): what it reports
        // then is the vCPU after INIT (rip 0xfff0), not where it faulted. Said, not hidden.
        request_stop(StopReason::triple_fault,
                     fmt::format("vCPU {}: triple fault (KVM_EXIT_SHUTDOWN); {}{}", v.id,
                                 kvm_is_svm() ? "state after KVM's INIT of the vCPU (AMD SVM: the faulting state is lost): "
                                               : "",
                                 describe_state(v)));
        break;
      case KVM_EXIT_SYSTEM_EVENT:
        switch (run->system_event.type) {
          case KVM_SYSTEM_EVENT_SHUTDOWN: request_stop(StopReason::poweroff, "system event: shutdown"); break;
          case KVM_SYSTEM_EVENT_RESET: request_stop(StopReason::reboot, "system event: reset"); break;
          default:
            request_stop(StopReason::error, fmt::format("vCPU {}: system event {} (crash)", v.id, run->system_event.type));
        }
        break;
      case KVM_EXIT_FAIL_ENTRY:
        return err(fmt::format("vCPU {}: VM entry failed (hardware reason {:#x})", v.id,
                               static_cast<std::uint64_t>(run->fail_entry.hardware_entry_failure_reason)));
      case KVM_EXIT_INTERNAL_ERROR:
        return err(fmt::format("vCPU {}: KVM internal error, suberror {}", v.id, run->internal.suberror));
      case KVM_EXIT_INTR:
        sample(v);
        break;
      case KVM_EXIT_IRQ_WINDOW_OPEN:
      case KVM_EXIT_IOAPIC_EOI:
        break;
      case KVM_EXIT_HYPERV:
        // SynIC is on for the auto-EOI vector. A SynIC MSR write (SCONTROL, SIEFP, SIMP): KVM has
        // done it and only tells us; nothing here uses those pages. A Hyper-V hypercall (which
        // this KVM may let a guest enable once SynIC is on): refused as an unknown call code.
        if (run->hyperv.type == KVM_EXIT_HYPERV_HCALL) run->hyperv.u.hcall.result = kHvStatusInvalidHypercallCode;
        break;
      default:
        return err(fmt::format("vCPU {}: unexpected exit {} ({})", v.id, reason, exit_reason_name(reason)));
    }
  }
  return {};
}

void Vm::vcpu_thread(Vcpu& v) noexcept {
  try {
    t_run = v.run;
    t_vcpu = &v;
    // Unblock the kick signal in this thread (the monitor may have blocked it elsewhere).
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, kKickSignal);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    // Placed before it first enters the guest (xl's `cpus`), under kick_mu_ as set_vcpu_affinity
    // is: a placement asked for before the thread began is the one it takes, one asked for from
    // now on finds it alive and its id published. Named after: a thread named vcpuN is placed.
    std::string unplaced;  // why it could not be placed (request_stop takes kick_mu_: after it)
    {
      std::lock_guard lk(kick_mu_);
      if (!affinity_[v.id].empty()) {
        if (auto r = place_thread(0, affinity_[v.id]); !r) {
          unplaced = fmt::format("vCPU {}: cannot be placed on CPUs {}: {}", v.id, format_cpu_list(affinity_[v.id]),
                                 r.error().message);
        }
      }
      v.handle = pthread_self();
      v.alive = true;
      v.tid.store(::gettid());
    }
    set_thread_name(fmt::format("vcpu{}", v.id));
    if (!unplaced.empty()) {
      request_stop(StopReason::error, std::move(unplaced));
    } else {
      auto r = vcpu_loop(v);
      if (!r) request_stop(StopReason::error, r.error().message);
    }
  } catch (const std::exception& e) {
    request_stop(StopReason::error, fmt::format("vCPU {}: {}", v.id, e.what()));
  } catch (...) {
    request_stop(StopReason::error, fmt::format("vCPU {}: unknown exception", v.id));
  }
  {
    std::lock_guard lk(pause_mu_);  // a pause waiting for this vCPU need not
    v.ended = true;
  }
  pause_cv_.notify_all();
  std::lock_guard lk(kick_mu_);
  v.alive = false;
  v.tid.store(0);
  t_run = nullptr;
  t_vcpu = nullptr;
}

StopReason Vm::run() noexcept {
  try {
    install_kick_handler();
    if (auto r = setup_cpuid(); !r) {
      request_stop(StopReason::error, r.error().message);
      return StopReason::error;
    }
    for (auto& v : vcpus_) {
      Vcpu* vp = v.get();
      // Started before the thread runs: a pause() from now on waits for it to park (the thread
      // looks at the pause before it first enters the guest).
      v->started.store(true);
      v->thread = std::thread([this, vp] { vcpu_thread(*vp); });
    }
    // Monitor: wait for a stop; every halt_poll, sample all vCPUs (see vm.h).
    int all_halted = 0;
    std::unique_lock lk(stop_mu_);
    while (stop_reason_.load() == StopReason::none) {
      stop_cv_.wait_for(lk, cfg_.halt_poll, [&] { return stop_reason_.load() != StopReason::none; });
      if (stop_reason_.load() != StopReason::none) break;
      lk.unlock();
      const std::uint64_t gen = kick_gen_.fetch_add(1) + 1;
      kick_all();
      bool answered = false;
      for (int i = 0; i < 50 && !answered; ++i) {  // at most ~100 ms for every vCPU to answer
        answered = true;
        for (auto& v : vcpus_) answered = answered && v->sample_gen.load() == gen;
        if (!answered) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      bool halted = answered;
      for (auto& v : vcpus_) halted = halted && v->halted_off.load();
      all_halted = halted ? all_halted + 1 : 0;
      if (all_halted >= 2) request_stop(StopReason::poweroff, "all vCPUs halted with interrupts disabled");
      lk.lock();
    }
    lk.unlock();
  } catch (const std::exception& e) {
    request_stop(StopReason::error, fmt::format("vm: {}", e.what()));
  } catch (...) {
    request_stop(StopReason::error, "vm: unknown exception");
  }
  for (int i = 0; i < 100; ++i) {
    bool all_done = true;
    for (auto& v : vcpus_) all_done = all_done && (!v->thread.joinable());
    if (all_done) break;
    kick_all();
    for (auto& v : vcpus_) {
      if (v->thread.joinable()) {
        v->thread.join();
      }
    }
  }
  return stop_reason_.load();
}

std::uint32_t Vm::tsc_khz() const noexcept {
  const int khz = ioctl(vcpus_.front()->fd.get(), KVM_GET_TSC_KHZ, 0);
  return khz > 0 ? static_cast<std::uint32_t>(khz) : 0;
}

stats::Counters exit_counters(const ExitStats& s) {
  stats::Counters out{{"exits", 0}};
  for (std::size_t i = 0; i < s.by_reason.size(); ++i) {
    if (s.by_reason[i] == 0) continue;
    out.front().second += s.by_reason[i];
    const std::string key = std::string("exit_") + exit_reason_name(i);
    const auto it = std::find_if(out.begin(), out.end(), [&](const auto& kv) { return kv.first == key; });
    if (it != out.end()) {
      it->second += s.by_reason[i];  // "other": several reasons under one name
    } else {
      out.emplace_back(key, s.by_reason[i]);
    }
  }
  out.emplace_back("pio_unclaimed", s.pio_unclaimed);
  out.emplace_back("mmio_unclaimed", s.mmio_unclaimed);
  return out;
}

ExitStats Vm::stats() const noexcept {
  ExitStats s;
  for (const auto& v : vcpus_) {
    for (std::size_t i = 0; i < kExitReasons; ++i) s.by_reason[i] += v->exits[i].load(std::memory_order_relaxed);
  }
  s.pio_unclaimed = pio_.unclaimed();
  s.mmio_unclaimed = mmio_.unclaimed();
  return s;
}

}  // namespace xpv::kvm
