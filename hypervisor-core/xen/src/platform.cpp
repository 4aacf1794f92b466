// Platform: construction, the hypercall entry point and dispatch table, upcall routing and the
// INTx level. The handlers live in hypercalls_*.cpp; see platform.h for threads and locking.
#include "xpv/xen/platform.h"

#include <chrono>
#include <stdexcept>
#include <string>

#include <spdlog/spdlog.h>

#include "callback_irq.h"
#include "guest_copy.h"
#include "xpv/xen/cpuid.h"

namespace xpv::xen {

using namespace detail;

namespace {

constexpr std::uint32_t kLogBurst = 10;  // guest-triggered log lines per second

}  // namespace

Platform::Platform(PlatformConfig cfg, PlatformHost& host) : cfg_(cfg), host_(host) {
  if (cfg_.vcpus == 0 || cfg_.vcpus > 4096)
    throw std::invalid_argument("xen platform: bad vCPU count " + std::to_string(cfg_.vcpus));
  if (cfg_.domid == 0 || cfg_.domid >= domain::kDomidFirstReserved)
    throw std::invalid_argument("xen platform: bad domain id " + std::to_string(cfg_.domid));
  vcpu_vector_ = std::make_unique<std::atomic<std::uint8_t>[]>(cfg_.vcpus);
  runstate_gva_ = std::make_unique<std::atomic<std::uint64_t>[]>(cfg_.vcpus);
  for (unsigned v = 0; v < cfg_.vcpus; ++v) {
    vcpu_vector_[v].store(0, std::memory_order_relaxed);
    runstate_gva_[v].store(0, std::memory_order_relaxed);
  }
}

Platform::~Platform() = default;

void Platform::attach(domain::EventChannels& evtchn) {
  if (evtchn.nr_vcpus() != cfg_.vcpus)
    throw std::invalid_argument("xen platform: event channels have " +
                                std::to_string(evtchn.nr_vcpus()) + " vCPUs, platform " +
                                std::to_string(cfg_.vcpus));
  evtchn_ = &evtchn;
}

void Platform::cpuid(unsigned vcpu, std::vector<kvm_cpuid_entry2>& entries) const {
  install_xen_cpuid(cfg_, vcpu, entries);
}

std::int64_t Platform::hypercall(unsigned vcpu, const Regs& regs, GuestVirt& mem) noexcept {
  if (regs.rax < abi::kNrHypercalls) calls_[regs.rax].fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t sub = static_cast<std::uint32_t>(regs.rdi);
  if (regs.rax == abi::kHcEventChannelOp && sub < kSubOps) evtchn_calls_[sub].fetch_add(1, std::memory_order_relaxed);
  if (regs.rax == abi::kHcSchedOp && sub < kSubOps) sched_calls_[sub].fetch_add(1, std::memory_order_relaxed);
  try {
    if (vcpu >= cfg_.vcpus) return err(XenErrno::einval);  // a VMM bug, not the guest's
    if (regs.cpl != 0) return err(XenErrno::eperm);        // not from the guest's kernel
    return dispatch(vcpu, regs, mem);
  } catch (...) {
    // Nothing in the handlers is meant to throw; an allocation failure in logging is the only
    // candidate. The guest gets an error, the vCPU loop keeps running.
    return err(XenErrno::enomem);
  }
}

std::int64_t Platform::dispatch(unsigned vcpu, const Regs& r, GuestVirt& mem) {
  // Arguments that Xen declares as int / unsigned int are truncated to 32 bits, as Xen's own
  // prototypes do (memory_op and hvm_op take unsigned long).
  auto u32 = [](std::uint64_t v) -> std::uint64_t { return static_cast<std::uint32_t>(v); };
  switch (r.rax) {
    case abi::kHcXenVersion: return xen_version(u32(r.rdi), r.rsi, mem);
    case abi::kHcMemoryOp: return memory_op(r.rdi, r.rsi, mem);
    case abi::kHcHvmOp: return hvm_op(r.rdi, r.rsi, mem);
    case abi::kHcVcpuOp: return vcpu_op(vcpu, u32(r.rdi), u32(r.rsi), r.rdx, mem);
    case abi::kHcEventChannelOp: return event_channel_op(u32(r.rdi), r.rsi, mem);
    case abi::kHcGrantTableOp: return grant_table_op(u32(r.rdi), r.rsi, u32(r.rdx), mem);
    case abi::kHcSchedOp: return sched_op(u32(r.rdi), r.rsi, mem);
    case abi::kHcConsoleIo: return console_io(u32(r.rdi), u32(r.rsi), r.rdx, mem);
    default:
      log_unsupported("hypercall", r.rax);
      return err(XenErrno::enosys);
  }
}

bool Platform::is_self(std::uint16_t domid) const noexcept {
  return domid == domain::kDomidSelf || domid == cfg_.domid;
}

bool Platform::log_allowed() noexcept {
  const std::int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
  std::int64_t w = log_window_.load(std::memory_order_relaxed);
  if (w != now && log_window_.compare_exchange_strong(w, now)) log_used_.store(0);
  return log_used_.fetch_add(1, std::memory_order_relaxed) < kLogBurst;
}

void Platform::log_unsupported(const char* what, std::uint64_t code) noexcept {
  try {
    if (log_allowed()) spdlog::debug("dom{}: unsupported {} {} → -ENOSYS", cfg_.domid, what, code);
  } catch (...) {
  }
}

void Platform::log_upcall_mode(std::string_view what) noexcept {
  try {
    if (log_allowed()) spdlog::info("dom{}: event upcalls: {}", cfg_.domid, what);
  } catch (...) {
  }
}

// ---- upcalls -----------------------------------------------------------------------------------

void Platform::upcall(unsigned vcpu) noexcept {
  if (vcpu >= cfg_.vcpus) return;
  upcalls_.fetch_add(1, std::memory_order_relaxed);
  if (const std::uint8_t v = vcpu_vector_[vcpu].load(std::memory_order_acquire); v != 0) {
    host_.inject_vector(vcpu, v);
    return;
  }
  const std::uint64_t cb = callback_irq_.load(std::memory_order_acquire);
  switch (callback_kind(cb)) {
    case CallbackKind::vector:
      if (const std::uint8_t vec = global_callback_vector(cb); vec != 0) {
        host_.inject_vector(vcpu, vec);
        return;
      }
      break;
    case CallbackKind::intx:
      if (vcpu == 0) {
        host_.set_intx(true);
        return;
      }
      break;
    case CallbackKind::none:
      break;
  }
  upcalls_dropped_.fetch_add(1, std::memory_order_relaxed);
}

void Platform::publish_upcall_routes() noexcept {
  // Two vCPUs changing their vectors at once: each host_.upcall_route is two steps in the host,
  // and interleaved they could leave a route half of one and half of the other. One at a time,
  // the last publish reads the values both stored.
  std::lock_guard lk(routes_mu_);
  const std::uint64_t cb = callback_irq_.load(std::memory_order_acquire);
  const std::uint8_t global = callback_kind(cb) == CallbackKind::vector ? global_callback_vector(cb) : 0;
  for (unsigned v = 0; v < cfg_.vcpus; ++v) {
    const std::uint8_t own = vcpu_vector_[v].load(std::memory_order_acquire);
    host_.upcall_route(v, own != 0 ? own : global);
  }
}

void Platform::deliver_if_pending(unsigned vcpu) noexcept {
  if (evtchn_ && evtchn_->upcall_pending(vcpu)) upcall(vcpu);
}

void Platform::intx_eoi() noexcept {
  intx_eois_.fetch_add(1, std::memory_order_relaxed);
  const bool intx = callback_kind(callback_irq_.load(std::memory_order_acquire)) ==
                    CallbackKind::intx;
  auto pending = [&] { return intx && evtchn_ && evtchn_->upcall_pending(0); };
  if (pending()) {
    host_.set_intx(true);
    return;
  }
  host_.set_intx(false);
  // An upcall between the check and the de-assert asserted the line before we lowered it:
  // look again so that event is not lost.
  if (pending()) host_.set_intx(true);
}

std::uint64_t Platform::calls(unsigned nr) const noexcept {
  return nr < abi::kNrHypercalls ? calls_[nr].load(std::memory_order_relaxed) : 0;
}

std::uint64_t Platform::evtchn_calls(unsigned cmd) const noexcept {
  return cmd < kSubOps ? evtchn_calls_[cmd].load(std::memory_order_relaxed) : 0;
}

std::uint64_t Platform::sched_calls(unsigned cmd) const noexcept {
  return cmd < kSubOps ? sched_calls_[cmd].load(std::memory_order_relaxed) : 0;
}

bool Platform::shared_info_mapped() const noexcept {
  return shared_info_mapped_.load(std::memory_order_acquire);
}

std::uint32_t Platform::grant_frames_mapped() const noexcept {
  return grant_frames_.load(std::memory_order_acquire);
}

std::uint64_t Platform::upcalls_dropped() const noexcept {
  return upcalls_dropped_.load(std::memory_order_relaxed);
}

}  // namespace xpv::xen
