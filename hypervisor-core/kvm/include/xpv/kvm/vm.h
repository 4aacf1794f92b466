// Vm — one KVM virtual machine: guest RAM (memfd), in-kernel irqchip (PIC + IOAPIC + LAPICs) and
// PIT, the PIO/MMIO buses, and one thread per vCPU.
//
// Threads and lifecycle:
//   main thread:  Vm(cfg) → devices add themselves to pio()/mmio() → set_cpuid_hook() →
//                 boot_cpu_long_mode() → run() … run() returns when the VM stops.
//   vCPU threads: started by run(); vcpu_loop() (noexcept) handles exits until stop is requested;
//                 the thread entry has a catch-all that stops the VM with an error.
//   run() itself is the VM's monitor: it waits for a stop request and, every halt_poll, kicks
//   every vCPU (SIGUSR1 + kvm_run.immediate_exit) to sample its state (see below).
//
//          ┌────────── request_stop(reason) from any thread (first reason wins) ──────────┐
//   running ─┬─ i8042 0xfe / port 0x92 ──────────────────────────────► reboot            │
//            ├─ KVM_EXIT_SHUTDOWN (triple fault) ─────────────────────► triple_fault       ├─► stopped
//            ├─ KVM_SYSTEM_EVENT shutdown / all vCPUs halted, IF=0 ──► poweroff           │
//            └─ unexpected exit / KVM error / device fault ──────────► error              │
//
// Poweroff without ACPI: Linux turns `poweroff` into a halt when it has no pm_power_off (no ACPI
// here), and its halt path stops every CPU with interrupts disabled in a hlt loop. With the
// in-kernel LAPIC, hlt never reaches userspace, so the monitor samples each vCPU (KVM_GET_MP_STATE
// = HALTED and RFLAGS.IF = 0, or an AP never started) and calls two consecutive all-halted
// samples a poweroff. (No interrupt can wake a CPU halted with IF=0 except NMI/INIT, which only
// another CPU — itself halted — could send.)
#pragma once

#include <linux/kvm.h>
#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "xpv/kvm/cpu_list.h"
#include "xpv/kvm/error.h"
#include "xpv/kvm/fd.h"
#include "xpv/kvm/guest_ram.h"
#include "xpv/kvm/io_bus.h"
#include "xpv/kvm/linux_boot.h"
#include "xpv/stats_file.h"

namespace xpv::kvm {

enum class StopReason { none, poweroff, reboot, triple_fault, error };
const char* to_string(StopReason r) noexcept;

struct VmConfig {
  unsigned vcpus = 1;
  std::uint64_t memory_bytes = 256ull << 20;  // RAM (below and above the 3 GiB hole)
  // Device memory outside RAM, backed by the same memfd after RAM (a platform's grant frames,
  // special pages): each {gpa, size} page-aligned, inside the hole, not overlapping.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> device_memory;
  std::chrono::milliseconds halt_poll{200};  // how often the monitor samples halted vCPUs
  // Where each vCPU's thread may run (xl's `cpus`): entry i for vCPU i, set by the thread before
  // it first enters the guest; an empty list, or no entry, leaves that thread where the process
  // may run. A set the kernel refuses (no CPU of it allowed to this process) stops the VM with an
  // error naming the vCPU. At most `vcpus` entries.
  std::vector<CpuList> affinity;
};

// Exit counters, per KVM exit reason (KVM_EXIT_*), summed over vCPUs; `xpv top` shows them
// (xpv-vmm --stats-file, exit_counters()).
inline constexpr std::size_t kExitReasons = 64;
struct ExitStats {
  std::array<std::uint64_t, kExitReasons> by_reason{};
  std::uint64_t pio_unclaimed = 0;
  std::uint64_t mmio_unclaimed = 0;
};
const char* exit_reason_name(std::size_t reason) noexcept;
// The counters as the "key value" pairs of a statistics file (xpv/stats_file.h): `exits` (all),
// then `exit_<name>` for each reason that occurred, by reason number (the reasons without a name
// summed as `exit_other`), then `pio_unclaimed` and `mmio_unclaimed`.
stats::Counters exit_counters(const ExitStats& s);

// A vCPU stopped in a port-I/O trap (see Vm::set_pio_trap): its registers and its view of guest-
// virtual memory. Lives on the vCPU thread for the duration of one trap.
class VcpuContext {
 public:
  virtual ~VcpuContext() = default;
  virtual unsigned id() const noexcept = 0;
  // General registers at the trapping instruction (fetched once, on first use); nullopt when KVM
  // refuses (the trap then fails).
  virtual const kvm_regs* regs() noexcept = 0;
  // Written back before the vCPU resumes (the instruction is then skipped as usual).
  virtual void set_rax(std::uint64_t value) noexcept = 0;
  virtual void set_rdx(std::uint64_t value) noexcept = 0;
  // Guest-virtual → guest-physical through the vCPU's current page tables (KVM_TRANSLATE).
  virtual std::optional<std::uint64_t> translate(std::uint64_t gva) noexcept = 0;
  // The privilege level of the trapping instruction, as KVM's own get_cpl reads it: 0 in real
  // mode, 3 in virtual-8086 mode, else SS.DPL. nullopt when KVM refuses (KVM_GET_SREGS).
  virtual std::optional<unsigned> cpl() noexcept = 0;
};

class Vm {
 public:
  // Opens /dev/kvm, creates the VM, memory, irqchip, PIT and vCPUs. Throws std::runtime_error
  // with a clear line (no /dev/kvm, too many vCPUs, memory, ...); nothing is left behind.
  explicit Vm(const VmConfig& cfg);
  ~Vm();
  Vm(const Vm&) = delete;
  Vm& operator=(const Vm&) = delete;

  GuestRam& ram() noexcept { return *ram_; }
  const GuestMemory& memory() const noexcept { return ram_->memory(); }
  IoBus& pio() noexcept { return pio_; }
  IoBus& mmio() noexcept { return mmio_; }
  unsigned vcpus() const noexcept { return static_cast<unsigned>(vcpus_.size()); }
  // Each vCPU's thread id (its /proc/<pid>/task/<tid>: what `xpv vcpu-list` reads), published
  // once the thread is placed; 0 for a vCPU whose thread has not begun or has ended. Any thread.
  std::vector<pid_t> vcpu_threads() const noexcept;
  // `xpv vcpu-pin`: the named vCPUs' threads restricted to `cpus` — those running at once, one
  // not begun yet as it begins (a domain created paused). All or none: a set the kernel refuses
  // for one leaves every one as it was. Errors: no such vCPU, an empty set, the kernel's refusal
  // (no CPU of the set allowed to this process). Any thread but a vCPU's own.
  Result<void> set_vcpu_affinity(const std::vector<unsigned>& vcpus, const CpuList& cpus) noexcept;
  int vm_fd() const noexcept { return vm_fd_.get(); }

  // CPUID: KVM_GET_SUPPORTED_CPUID, filtered per vCPU (hypervisor bit, APIC ids); KVM's own
  // leaves are moved from 0x40000000 to 0x40000100 so the 0x40000000 range is free for a platform
  // (the Xen platform installs its leaves there through this hook). Called once per vCPU.
  using CpuidHook = std::function<void(unsigned vcpu, std::vector<kvm_cpuid_entry2>&)>;
  void set_cpuid_hook(CpuidHook hook) { cpuid_hook_ = std::move(hook); }
  // CPUID.1 eax/edx as KVM reports them (for the MP table's processor entries).
  std::uint32_t cpu_signature() const noexcept { return cpu_signature_; }
  std::uint32_t cpu_features() const noexcept { return cpu_features_; }

  // Boot vCPU state for the 64-bit boot protocol (paging, long mode, flat GDT, rsi = zero page).
  void boot_cpu_long_mode(const LinuxBootEntry& e);
  // vCPU 0 at `eip` in 32-bit protected mode, flat segments, paging off (a multiboot entry).
  void boot_cpu_protected_mode(std::uint32_t eip);
  // Boot vCPU state for a real-mode stub at cs:ip (tests).
  void boot_cpu_real_mode(std::uint16_t cs, std::uint16_t ip);

  // Level of an interrupt line (GSI) of the in-kernel PIC/IOAPIC. Any thread.
  void set_irq(std::uint32_t gsi, bool level) noexcept;

  // A port whose OUT of `size` bytes is handed, with the vCPU's registers, to fn on the vCPU thread
  // instead of the bus (a hypercall convention: the Xen platform rewrites vmmcall into
  // `out %al, $port`). Setup only (before run()); at most kMaxPioTraps trap ports.
  static constexpr std::size_t kMaxPioTraps = 2;
  void set_pio_trap(std::uint16_t port, std::function<void(VcpuContext&)> fn, std::uint8_t size = 1);

  // A KVM ioeventfd: a guest OUT of `size` bytes to `port` whose value is `value` signals `fd`
  // inside the kernel, without an exit to this process (any other value still exits). Any
  // thread; the kernel keeps its own reference to the eventfd. remove_pio_eventfd takes the same
  // arguments. Errors name the port, value and errno (EEXIST: that value is registered already).
  Result<void> add_pio_eventfd(std::uint16_t port, std::uint8_t size, std::uint32_t value, int fd) noexcept;
  Result<void> remove_pio_eventfd(std::uint16_t port, std::uint8_t size, std::uint32_t value, int fd) noexcept;

  // Guest WRMSRs of `msr` exit to userspace (KVM_CAP_X86_USER_SPACE_MSR with an MSR filter that
  // denies only that write) and are handed to fn(vcpu, value) on the vCPU thread; fn returns
  // false to make the write fault (#GP). Every other MSR stays KVM's. Setup only (before run());
  // one MSR. Throws std::runtime_error naming what this KVM lacks (Linux < 5.10).
  void set_msr_write_trap(std::uint32_t msr, std::function<bool(unsigned vcpu, std::uint64_t value)> fn);

  // An edge-triggered fixed interrupt to vCPU `vcpu`'s local APIC (KVM_SIGNAL_MSI; APIC id =
  // vCPU index). Any thread.
  void signal_msi(unsigned vcpu, std::uint8_t vector) noexcept;

  // Upcall lines: one eventfd per vCPU, each a KVM irqfd on its own GSI (kFirstUpcallGsi + vCPU,
  // above the IOAPIC's pins) that route_upcall() routes as an MSI to that vCPU's APIC with a
  // vector — so whoever holds the eventfd (a backend, through the domain's direct upcalls)
  // interrupts the vCPU without a thread of this process in between. Made on first use; returns
  // dups the caller owns (the Vm keeps its own). Setup only (before run()). Throws on failure.
  static constexpr std::uint32_t kFirstUpcallGsi = 24;
  std::vector<UniqueFd> upcall_lines();
  // Routes vCPU `vcpu`'s upcall line to `vector` (0: no route — a write is dropped). Rewrites
  // KVM's GSI routing (the PIC/IOAPIC defaults plus every routed line). Any thread.
  Result<void> route_upcall(unsigned vcpu, std::uint8_t vector) noexcept;

  // Makes every delivery of `vector` to any vCPU (MSI or IOAPIC) set no in-service bit, so the
  // guest needs no EOI for it: how Xen injects its global callback vector, outside the LAPIC.
  // KVM's userspace API has no such injection with an in-kernel LAPIC; its Hyper-V SynIC has
  // auto-EOI vectors, so each vCPU's SynIC is activated (KVM_CAP_HYPERV_SYNIC) and its SINT0 set
  // to `vector` with auto-EOI by a host-initiated KVM_SET_MSRS. The guest sees no Hyper-V CPUID
  // leaves and its own SynIC MSR accesses fault as before. 0 turns it off (SINT0 masked).
  // Called on a vCPU thread (a hypercall), that vCPU changes at once; the others are kicked and
  // change before they next enter the guest, and the call waits (≤ 1 s) until each has. Errors:
  // this KVM has no SynIC (can_auto_eoi() false), vector 1..15, a vCPU that did not answer.
  bool can_auto_eoi() const noexcept { return synic_cap_; }
  Result<void> set_auto_eoi_vector(std::uint8_t vector) noexcept;

  // A level-triggered line with EOI notification (irqfd with a resample fd): assert_line(gsi)
  // raises it; KVM lowers it when the guest EOIs and then on_eoi runs (on a VM helper thread),
  // which may assert it again. Setup only; one such line.
  void add_resample_line(std::uint32_t gsi, std::function<void()> on_eoi);
  void assert_line() noexcept;

  // Runs until the VM stops; returns why (error → message in stop_message()).
  StopReason run() noexcept;
  // Any thread, any time: the first reason wins; wakes the monitor and kicks every vCPU.
  void request_stop(StopReason reason, std::string message = {}) noexcept;
  StopReason stop_reason() const noexcept { return stop_reason_.load(); }
  std::string stop_message() const;

  // Pause, as `xl pause`: every vCPU leaves the guest and waits outside KVM_RUN until resume().
  // The rest of the VM goes on: devices, timers and interrupt lines still set what they set
  // (KVM's LAPICs hold it), delivered once the vCPUs run again; the guest's clock runs on, as
  // under Xen. Any thread but a vCPU's. Returns once every started vCPU has stopped; a vCPU
  // that does not within `wait` (a hypercall that has not returned) makes it fail, naming it,
  // with the VM running as before. Errors: already paused, a vCPU that did not stop.
  Result<void> pause(std::chrono::milliseconds wait = std::chrono::seconds(2)) noexcept;
  // Lets paused vCPUs enter the guest again. Error: not paused.
  Result<void> resume() noexcept;
  bool paused() const noexcept;

  ExitStats stats() const noexcept;
  // The guest's TSC frequency (KVM_GET_TSC_KHZ); 0 when KVM does not say.
  std::uint32_t tsc_khz() const noexcept;

 private:
  struct Vcpu;
  struct PioTrap;
  void vcpu_thread(Vcpu& v) noexcept;
  Result<void> vcpu_loop(Vcpu& v) noexcept;
  Result<void> handle_io(Vcpu& v) noexcept;
  void pio_trap(Vcpu& v, const PioTrap& t) noexcept;
  std::string describe_state(Vcpu& v) noexcept;
  void resample_loop() noexcept;
  void sample(Vcpu& v) noexcept;
  void kick_all() noexcept;
  Result<void> setup_cpuid();
  void setup_lapic(Vcpu& v);
  Result<void> apply_auto_eoi(Vcpu& v) noexcept;
  void apply_pending_auto_eoi(Vcpu& v) noexcept;
  void park(Vcpu& v) noexcept;

  UniqueFd kvm_fd_;
  UniqueFd vm_fd_;
  std::unique_ptr<GuestRam> ram_;
  IoBus pio_{"pio"};
  IoBus mmio_{"mmio"};
  std::vector<std::unique_ptr<Vcpu>> vcpus_;
  std::size_t run_size_ = 0;
  VmConfig cfg_;
  CpuidHook cpuid_hook_;
  std::vector<kvm_cpuid_entry2> supported_cpuid_;
  std::uint32_t cpu_signature_ = 0x600, cpu_features_ = 0x201;

  std::atomic<StopReason> stop_reason_{StopReason::none};
  mutable std::mutex stop_mu_;  // guards stop_message_; cv waits on it
  std::condition_variable stop_cv_;
  std::string stop_message_;
  std::atomic<std::uint64_t> kick_gen_{0};
  std::mutex kick_mu_;  // guards each Vcpu's handle and alive (kick_all against threads ending), affinity_
  std::vector<CpuList> affinity_;  // per vCPU: where its thread runs (empty: not placed)
  mutable std::mutex pause_mu_;  // guards pause_wanted_ and each Vcpu's parked and ended
  std::condition_variable pause_cv_;
  std::atomic<bool> pause_wanted_{false};  // read lock-free at the top of each vCPU's loop

  struct PioTrap {
    std::uint16_t port = 0;
    std::uint8_t size = 0;  // 0: unused
    std::function<void(VcpuContext&)> fn;
  };
  std::array<PioTrap, kMaxPioTraps> traps_{};
  bool sync_regs_ = false;  // KVM_CAP_SYNC_REGS covers the general registers (trap write-back)
  std::uint32_t msr_trap_index_ = 0;
  std::function<bool(unsigned, std::uint64_t)> msr_trap_;
  bool synic_cap_ = false;              // KVM_CAP_HYPERV_SYNIC (auto-EOI vectors)
  std::mutex auto_eoi_mu_;              // one set_auto_eoi_vector at a time
  std::atomic<std::uint8_t> auto_eoi_vector_{0};
  std::atomic<std::uint64_t> auto_eoi_gen_{0};  // bumped by every change; vCPUs apply to match
  std::mutex route_mu_;                      // route_upcall: one routing table at a time
  std::vector<UniqueFd> upcall_fds_;          // per vCPU (upcall_lines)
  std::vector<std::uint8_t> upcall_vectors_;  // per vCPU, 0 = not routed (route_mu_)
  std::uint32_t resample_gsi_ = 0;
  std::function<void()> on_eoi_;
  UniqueFd irqfd_, resamplefd_, resample_stop_;
  std::thread resample_thread_;
};

}  // namespace xpv::kvm
