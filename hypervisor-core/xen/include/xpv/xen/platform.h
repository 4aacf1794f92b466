// Platform — the Xen HVM platform of one domain, independent of KVM ioctls: the hypercall
// dispatcher (the VMM calls hypercall() on a port-I/O exit at kHypercallPort, see stubs.h) and
// the event-channel upcall delivery (Platform is the domain's domain::UpcallSink).
//
// ── Threads and locks ─────────────────────────────────────────────────────────────────────────
//  hypercall()      the vCPU thread that took the exit; several vCPUs call it concurrently.
//  upcall()         EventChannels' delivery path: any thread, with EventChannels' lock held
//                   (shared or exclusive). It reads only Platform's atomics and calls the host's
//                   inject_vector / set_intx; it never calls back into EventChannels.
//  intx_eoi()       the thread that saw the guest EOI the platform-pci INTx (the VMM's EOI
//                   notification). Takes EventChannels' lock (shared): never call it from an
//                   UpcallSink or from PlatformHost callbacks.
//  Platform has no lock of its own: its mutable state is a set of atomics (upcall routing,
//  grant-frame count, runstate addresses, counters). Lock order: EventChannels → (PlatformHost's
//  own locks). The hypercall paths call EventChannels without holding anything.
//
// ── Upcall routing (XEN-GUEST-ABI.md "Upcalls") ───────────────────────────────────────────────
//
//   upcall(v):  per-vCPU vector set for v ──yes──► inject_vector(v, that vector)
//                 │ no
//               CALLBACK_IRQ = vector ≥ 0x10 ──yes──► inject_vector(v, it)   (no EOI: the host
//                 │ no                                  was told by set_callback_vector first)
//               CALLBACK_IRQ = GSI (≠ 0) or PCI INTx ──► v == 0 ? set_intx(true) : drop
//                 │ none
//               drop (the event stays pending in shared_info)
//
//   The guest's choice is honoured whatever was offered (PlatformConfig::upcall only decides the
//   CPUID flag and XENFEAT_hvm_callback_vector). When the guest selects a mode (either hvm_op),
//   an event that is already waiting (the vCPU's evtchn_upcall_pending = 1) is delivered once.
//   CALLBACK_IRQ type 2 with a vector < 0x10 is stored and read back but never injected. Linux
//   with per-vCPU vectors writes GSI 1 as a marker ("to trick the toolstack"): the per-vCPU
//   vectors win over it, as in Xen.
//
//   INTx is level-triggered: asserted on vCPU 0's upcall, and on the guest's EOI
//   (intx_eoi) re-asserted while vCPU 0's evtchn_upcall_pending is still 1, else de-asserted
//   (then re-checked, so an upcall racing with the EOI is not lost). Leaving INTx mode
//   de-asserts the line.
//
// ── Hypercalls: what each answers (64-bit ABI: nr in rax, args rdi rsi rdx r10 r8) ────────────
//  See hypervisor-core/README.md for the full table. Every argument struct is copied in through
//  GuestVirt before it is looked at and copied out after; an unreadable/unwritable pointer is
//  -EFAULT. Unknown hypercall numbers and sub-commands are -ENOSYS. hypercall() never throws.
//  A domid argument must be DOMID_SELF or this domain's id; another domain is -EPERM (an
//  unprivileged guest may not act on other domains; Xen's XSM answer).
#pragma once

#include <linux/kvm.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "xpv/domain/event_channels.h"
#include "xpv/log_rate_limit.h"
#include "xpv/xen/abi.h"
#include "xpv/xen/config.h"

namespace xpv::xen {

// The calling vCPU's guest-virtual memory for the duration of one hypercall (the VMM translates
// through the vCPU's page tables). false → the hypercall fails with -EFAULT.
class GuestVirt {
 public:
  virtual ~GuestVirt() = default;
  virtual bool read(std::uint64_t gva, std::span<std::uint8_t> out) noexcept = 0;
  virtual bool write(std::uint64_t gva, std::span<const std::uint8_t> in) noexcept = 0;
};

// What the platform needs from the VMM. Called on vCPU threads, or (inject_vector/set_intx) from
// EventChannels' delivery path on any thread under its lock: implementations must not call back
// into the platform.
class PlatformHost {
 public:
  virtual ~PlatformHost() = default;
  virtual void inject_vector(unsigned vcpu, std::uint8_t vector) noexcept = 0;  // edge, LAPIC
  // The guest chose `vector` (≥ 0x10) as its global callback vector, or gave it up (0). Xen
  // injects that vector outside the LAPIC and Linux's handler sends no EOI for it, so from now
  // on every inject_vector of it must set no in-service bit. false: this host cannot (the
  // hvm_op then fails and the guest's previous choice stays). vCPU thread of the caller.
  virtual bool set_callback_vector(std::uint8_t vector) noexcept = 0;
  virtual void set_intx(bool asserted) noexcept = 0;  // platform-pci INTA level
  // The vector an upcall to `vcpu` is injected with is now `vector` (0: none — INTx, or no
  // callback chosen): a host that raises upcalls by other ways too (xpv-vmm's direct upcall
  // lines) re-routes them. Called after every change of the guest's upcall mode, for each vCPU,
  // on the vCPU thread of the hypercall; may repeat an unchanged value.
  virtual void upcall_route(unsigned vcpu, std::uint8_t vector) noexcept {
    (void)vcpu;
    (void)vector;
  }
  virtual void shutdown(ShutdownReason why) noexcept = 0;
  // A RAM page of the guest; empty span if gfn is not RAM.
  virtual std::span<std::uint8_t> guest_page(std::uint64_t gfn) noexcept = 0;
  // Ballooning (XENMEM_decrease_reservation / XENMEM_populate_physmap), vCPU thread of the call:
  // the guest gives [gfn, gfn + pages) back, or takes it back. false, with nothing done, if any
  // page of the range is not guest RAM (or this host cannot balloon: the default). A released
  // page's host memory is freed where the host can; touched again, it reads as zeros.
  virtual bool release_ram(std::uint64_t gfn, std::uint64_t pages) noexcept {
    (void)gfn;
    (void)pages;
    return false;
  }
  virtual bool populate_ram(std::uint64_t gfn, std::uint64_t pages) noexcept {
    (void)gfn;
    (void)pages;
    return false;
  }
  // CONSOLEIO_write, as the host may log it: printable ASCII and '\n' only (any other byte is
  // '.'), at most kConsoleWritesPerSecond calls a second (a note says how many were dropped).
  virtual void console_write(std::string_view text) noexcept = 0;
};

struct Regs {
  std::uint64_t rax, rdi, rsi, rdx, r10, r8;  // 64-bit hypercall ABI: nr, args 1..5
  // The privilege level the call came from. Xen answers a call from outside the guest kernel
  // (CPL 1-3: a guest process given I/O-port access, or vm86 code) with -EPERM and does nothing;
  // so does hypercall(). The VMM reads it from the vCPU (SS.DPL; 0 in real mode).
  unsigned cpl = 0;
};

// Longest CONSOLEIO_write accepted in one call (longer → -EINVAL; Linux writes ≤ 1 KiB lines).
inline constexpr std::uint64_t kConsoleWriteMax = 4096;
// CONSOLEIO_write calls passed on a second; the rest are dropped (a guest looping on it would
// otherwise fill the host's log).
inline constexpr std::uint32_t kConsoleWritesPerSecond = 50;

class Platform final : public domain::UpcallSink {
 public:
  // Throws std::invalid_argument for vcpus == 0 or a reserved/zero domid (setup code).
  Platform(PlatformConfig cfg, PlatformHost& host);
  ~Platform() override;
  Platform(const Platform&) = delete;
  Platform& operator=(const Platform&) = delete;

  // The domain's event channels, constructed by the VMM with *this as their UpcallSink; call
  // once before the first hypercall (main thread). Until then event-channel hypercalls and
  // shared_info mapping fail with -ENOSYS.
  void attach(domain::EventChannels& evtchn);

  void cpuid(unsigned vcpu, std::vector<kvm_cpuid_entry2>& entries) const;  // install_xen_cpuid
  // → rax. A call with regs.cpl != 0 gets -EPERM (counted in calls(), like any other).
  std::int64_t hypercall(unsigned vcpu, const Regs& regs, GuestVirt& mem) noexcept;
  void upcall(unsigned vcpu) noexcept override;  // EventChannels → inject per the guest's mode
  // The guest EOI'd INTx: re-assert while vCPU 0's evtchn_upcall_pending is 1, else de-assert.
  void intx_eoi() noexcept;
  std::uint64_t calls(unsigned nr) const noexcept;  // per hypercall number (0 for nr ≥ 64)
  // Sub-operations of event_channel_op and sched_op (0 for cmd ≥ kSubOps), upcalls asked for by
  // event delivery, and INTx EOIs: what `xpv-vmm --stats` prints, to see where exits go.
  static constexpr unsigned kSubOps = 16;
  std::uint64_t evtchn_calls(unsigned cmd) const noexcept;
  std::uint64_t sched_calls(unsigned cmd) const noexcept;
  std::uint64_t upcalls() const noexcept { return upcalls_.load(std::memory_order_relaxed); }
  std::uint64_t intx_eois() const noexcept { return intx_eois_.load(std::memory_order_relaxed); }
  bool shared_info_mapped() const noexcept;

  // ---- inspection (stats, tests) ----
  std::uint32_t grant_frames_mapped() const noexcept;  // highest grant frame index mapped + 1
  std::uint64_t upcalls_dropped() const noexcept;      // upcalls before/without a usable mode
  const PlatformConfig& config() const noexcept { return cfg_; }

 private:
  std::int64_t dispatch(unsigned vcpu, const Regs& r, GuestVirt& mem);
  std::int64_t xen_version(std::uint64_t cmd, std::uint64_t arg, GuestVirt& mem);
  std::int64_t memory_op(std::uint64_t cmd, std::uint64_t arg, GuestVirt& mem);
  std::int64_t add_to_physmap_one(std::uint32_t space, std::uint64_t idx, std::uint64_t gpfn);
  std::int64_t reservation_op(std::uint64_t cmd, std::uint64_t arg, GuestVirt& mem);
  std::int64_t hvm_op(std::uint64_t op, std::uint64_t arg, GuestVirt& mem);
  std::int64_t set_param(std::uint32_t index, std::uint64_t value);
  std::int64_t get_param(std::uint32_t index, std::uint64_t& value) const;
  std::int64_t vcpu_op(unsigned caller, std::uint64_t cmd, std::uint64_t vcpu, std::uint64_t arg,
                       GuestVirt& mem);
  std::int64_t event_channel_op(std::uint64_t cmd, std::uint64_t arg, GuestVirt& mem);
  std::int64_t grant_table_op(std::uint64_t cmd, std::uint64_t arg, std::uint64_t count,
                              GuestVirt& mem);
  std::int64_t sched_op(std::uint64_t cmd, std::uint64_t arg, GuestVirt& mem);
  std::int64_t sched_poll(std::uint64_t arg, GuestVirt& mem);
  std::int64_t console_io(std::uint64_t cmd, std::uint64_t count, std::uint64_t buf,
                          GuestVirt& mem);

  bool is_self(std::uint16_t domid) const noexcept;
  // After the guest picked a mode for vCPU v: one upcall if an event already waits.
  void deliver_if_pending(unsigned vcpu) noexcept;
  void log_unsupported(const char* what, std::uint64_t code) noexcept;
  // The guest's choice of upcall mode, at info level (rate-limited with log_unsupported).
  void log_upcall_mode(std::string_view what) noexcept;
  void publish_upcall_routes() noexcept;  // host_.upcall_route for every vCPU
  bool log_allowed() noexcept;

  const PlatformConfig cfg_;
  PlatformHost& host_;
  domain::EventChannels* evtchn_ = nullptr;

  std::unique_ptr<std::atomic<std::uint8_t>[]> vcpu_vector_;  // per vCPU; 0 = none set
  std::atomic<std::uint64_t> callback_irq_{0};                // HVM_PARAM_CALLBACK_IRQ as set
  std::atomic<std::uint32_t> grant_frames_{0};
  std::atomic<bool> shared_info_mapped_{false};
  std::unique_ptr<std::atomic<std::uint64_t>[]> runstate_gva_;  // per vCPU; 0 = none
  std::array<std::atomic<std::uint64_t>, abi::kNrHypercalls> calls_{};
  std::atomic<std::uint64_t> upcalls_dropped_{0};
  std::array<std::atomic<std::uint64_t>, kSubOps> evtchn_calls_{}, sched_calls_{};
  std::atomic<std::uint64_t> upcalls_{0}, intx_eois_{0};
  std::atomic<std::int64_t> log_window_{0};  // rate limit for guest-triggered log lines
  std::atomic<std::uint32_t> log_used_{0};
  std::mutex console_mu_;  // the console_io rate limit:
  xpv::LogRateLimit console_limit_{kConsoleWritesPerSecond};
  std::mutex routes_mu_;  // one publish_upcall_routes at a time: the last one sees the last change
};

}  // namespace xpv::xen
