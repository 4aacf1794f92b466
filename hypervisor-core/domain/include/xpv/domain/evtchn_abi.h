// Event-channel ABI constants and hypercall argument structs (public/event_channel.h,
// public/xen.h, public/errno.h), plus the Xen errno values event-channel operations return.
// Checked against the official headers in tests/unit/evtchn/abi_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace xpv::domain {

using Port = std::uint32_t;  // evtchn_port_t
using DomId = std::uint16_t;  // domid_t

inline constexpr DomId kDomidSelf = 0x7FF0;           // DOMID_SELF
inline constexpr DomId kDomidFirstReserved = 0x7FF0;  // DOMID_FIRST_RESERVED

// EVTCHNOP_* (HYPERVISOR_event_channel_op command numbers).
enum class EvtchnOp : std::uint32_t {
  bind_interdomain = 0,
  bind_virq = 1,
  bind_pirq = 2,
  close = 3,
  send = 4,
  status = 5,
  alloc_unbound = 6,
  bind_ipi = 7,
  bind_vcpu = 8,
  unmask = 9,
  reset = 10,
  init_control = 11,  // FIFO ABI: not offered; the guest falls back to 2-level
  expand_array = 12,
  set_priority = 13,
};

// EVTCHNSTAT_* (evtchn_status.status).
enum class EvtchnStat : std::uint32_t {
  closed = 0,
  unbound = 1,
  interdomain = 2,
  pirq = 3,
  virq = 4,
  ipi = 5,
};

// VIRQ_* (public/xen.h). "V" = per-vCPU, "G" = global (bound on vCPU 0, movable by bind_vcpu).
inline constexpr std::uint32_t kVirqTimer = 0;      // V
inline constexpr std::uint32_t kVirqDebug = 1;      // V
inline constexpr std::uint32_t kVirqConsole = 2;    // G
inline constexpr std::uint32_t kVirqDomExc = 3;     // G
inline constexpr std::uint32_t kVirqTbuf = 4;       // G
inline constexpr std::uint32_t kVirqDebugger = 6;   // G
inline constexpr std::uint32_t kVirqXenoprof = 7;   // V
inline constexpr std::uint32_t kVirqConRing = 8;    // G
inline constexpr std::uint32_t kVirqPcpuState = 9;  // G
inline constexpr std::uint32_t kVirqMemEvent = 10;  // G
inline constexpr std::uint32_t kVirqArgo = 11;      // G
inline constexpr std::uint32_t kVirqEnomem = 12;    // G
inline constexpr std::uint32_t kVirqXenpmu = 13;    // V
inline constexpr std::uint32_t kVirqArch0 = 16;     // x86: VIRQ_MCA, global
inline constexpr std::uint32_t kNrVirqs = 24;       // NR_VIRQS

// Xen's classification (xen/common/event_channel.c virq_is_global; x86's arch virqs are global).
constexpr bool virq_is_global(std::uint32_t virq) noexcept {
  return !(virq == kVirqTimer || virq == kVirqDebug || virq == kVirqXenoprof ||
           virq == kVirqXenpmu);
}

// Xen errno values (public/errno.h; they are the x86 Linux numbers). A hypercall returns the
// negation: to_hypercall_result().
enum class XenErrno : std::int32_t {
  eperm = 1,
  enoent = 2,
  esrch = 3,
  enxio = 6,
  eagain = 11,
  enomem = 12,
  efault = 14,
  eexist = 17,
  einval = 22,
  enospc = 28,
  enosys = 38,
};
constexpr std::int64_t to_hypercall_result(XenErrno e) noexcept {
  return -static_cast<std::int64_t>(e);
}
const char* to_string(XenErrno e) noexcept;

// ---- Hypercall argument structs (guest memory; the dispatcher copies them out first) ----

struct EvtchnAllocUnboundOp {  // struct evtchn_alloc_unbound
  std::uint16_t dom;           // 0x0  IN  must be DOMID_SELF (or own id) for an unprivileged guest
  std::uint16_t remote_dom;    // 0x2  IN
  std::uint32_t port;          // 0x4  OUT
};
static_assert(std::is_standard_layout_v<EvtchnAllocUnboundOp> && sizeof(EvtchnAllocUnboundOp) == 8);
static_assert(offsetof(EvtchnAllocUnboundOp, remote_dom) == 2 &&
              offsetof(EvtchnAllocUnboundOp, port) == 4);

struct EvtchnBindInterdomainOp {  // struct evtchn_bind_interdomain
  std::uint16_t remote_dom;       // 0x0  IN
  std::uint8_t pad0[2];           // 0x2
  std::uint32_t remote_port;      // 0x4  IN
  std::uint32_t local_port;       // 0x8  OUT
};
static_assert(std::is_standard_layout_v<EvtchnBindInterdomainOp> &&
              sizeof(EvtchnBindInterdomainOp) == 12);
static_assert(offsetof(EvtchnBindInterdomainOp, remote_port) == 4 &&
              offsetof(EvtchnBindInterdomainOp, local_port) == 8);

struct EvtchnBindVirqOp {  // struct evtchn_bind_virq
  std::uint32_t virq;      // 0x0  IN
  std::uint32_t vcpu;      // 0x4  IN
  std::uint32_t port;      // 0x8  OUT
};
static_assert(std::is_standard_layout_v<EvtchnBindVirqOp> && sizeof(EvtchnBindVirqOp) == 12);
static_assert(offsetof(EvtchnBindVirqOp, vcpu) == 4 && offsetof(EvtchnBindVirqOp, port) == 8);

struct EvtchnBindIpiOp {  // struct evtchn_bind_ipi
  std::uint32_t vcpu;     // 0x0  IN
  std::uint32_t port;     // 0x4  OUT
};
static_assert(std::is_standard_layout_v<EvtchnBindIpiOp> && sizeof(EvtchnBindIpiOp) == 8);
static_assert(offsetof(EvtchnBindIpiOp, port) == 4);

struct EvtchnPortOp {  // struct evtchn_close, evtchn_send, evtchn_unmask (one IN port each)
  std::uint32_t port;  // 0x0  IN
};
static_assert(std::is_standard_layout_v<EvtchnPortOp> && sizeof(EvtchnPortOp) == 4);

struct EvtchnBindVcpuOp {  // struct evtchn_bind_vcpu
  std::uint32_t port;      // 0x0  IN
  std::uint32_t vcpu;      // 0x4  IN
};
static_assert(std::is_standard_layout_v<EvtchnBindVcpuOp> && sizeof(EvtchnBindVcpuOp) == 8);
static_assert(offsetof(EvtchnBindVcpuOp, vcpu) == 4);

struct EvtchnResetOp {  // struct evtchn_reset
  std::uint16_t dom;    // 0x0  IN
};
static_assert(std::is_standard_layout_v<EvtchnResetOp> && sizeof(EvtchnResetOp) == 2);

struct EvtchnStatusOp {    // struct evtchn_status
  std::uint16_t dom;       // 0x00  IN
  std::uint8_t pad0[2];    // 0x02
  std::uint32_t port;      // 0x04  IN
  std::uint32_t status;    // 0x08  OUT EvtchnStat
  std::uint32_t vcpu;      // 0x0c  OUT
  union {                  // 0x10  OUT (8 bytes)
    struct {
      std::uint16_t dom;   // 0x10
    } unbound;
    struct {
      std::uint16_t dom;   // 0x10
      std::uint8_t pad[2]; // 0x12
      std::uint32_t port;  // 0x14
    } interdomain;
    std::uint32_t pirq;    // 0x10
    std::uint32_t virq;    // 0x10
  } u;
};
static_assert(std::is_standard_layout_v<EvtchnStatusOp> && sizeof(EvtchnStatusOp) == 24);
static_assert(offsetof(EvtchnStatusOp, port) == 0x04 && offsetof(EvtchnStatusOp, status) == 0x08 &&
              offsetof(EvtchnStatusOp, vcpu) == 0x0c && offsetof(EvtchnStatusOp, u) == 0x10);

}  // namespace xpv::domain
