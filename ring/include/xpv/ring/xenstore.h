// The xenstore ring page (io/xs_wire.h: struct xenstore_domain_interface).
//
// Two byte rings of 1024 bytes each on one shared page: req (domain → xenstored) and rsp
// (xenstored → domain). Indexes are free-running uint32 counters; an index is masked with
// (kXenstoreRingSize - 1) to address the ring. The domain is the producer of req and consumer of
// rsp; xenstored the other way round. Both sides read the peer's index once, then a barrier, then
// check `prod - cons <= kXenstoreRingSize` before touching data (xenstored's domain.c does so).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "xpv/expected.h"
#include "xpv/ring/byte_ring.h"
#include "xpv/ring/ring_error.h"

namespace xpv::ring {

inline constexpr std::uint32_t kXenstoreRingSize = 1024;
// Wire limits (xs_wire.h): the largest message payload and path lengths.
inline constexpr std::uint32_t kXenstorePayloadMax = 4096;
inline constexpr std::uint32_t kXenstoreAbsPathMax = 3072;
inline constexpr std::uint32_t kXenstoreRelPathMax = 2048;

constexpr std::uint32_t xenstore_mask(std::uint32_t idx) noexcept {
  return idx & (kXenstoreRingSize - 1);
}

// server_features bits and connection states (xs_wire.h).
inline constexpr std::uint32_t kXenstoreServerFeatureReconnection = 1;
inline constexpr std::uint32_t kXenstoreServerFeatureError = 2;
inline constexpr std::uint32_t kXenstoreConnected = 0;
inline constexpr std::uint32_t kXenstoreReconnect = 1;
// error field values.
inline constexpr std::uint32_t kXenstoreErrorNone = 0;
inline constexpr std::uint32_t kXenstoreErrorComm = 1;
inline constexpr std::uint32_t kXenstoreErrorRingIdx = 2;
inline constexpr std::uint32_t kXenstoreErrorProto = 3;

struct XenstoreDomainInterface {
  char req[kXenstoreRingSize];  // 0x000: requests to xenstored
  char rsp[kXenstoreRingSize];  // 0x400: replies and watch events to the domain
  std::uint32_t req_cons;       // 0x800: written by xenstored
  std::uint32_t req_prod;       // 0x804: written by the domain
  std::uint32_t rsp_cons;       // 0x808: written by the domain
  std::uint32_t rsp_prod;       // 0x80c: written by xenstored
  std::uint32_t server_features;  // 0x810: written by xenstored
  std::uint32_t connection;       // 0x814
  std::uint32_t error;            // 0x818
};
static_assert(std::is_standard_layout_v<XenstoreDomainInterface> &&
              sizeof(XenstoreDomainInterface) == 0x81c);
static_assert(offsetof(XenstoreDomainInterface, rsp) == 0x400);
static_assert(offsetof(XenstoreDomainInterface, req_cons) == 0x800);
static_assert(offsetof(XenstoreDomainInterface, rsp_prod) == 0x80c);
static_assert(offsetof(XenstoreDomainInterface, error) == 0x818);

static_assert(offsetof(XenstoreDomainInterface, req_prod) == 0x804);
static_assert(offsetof(XenstoreDomainInterface, rsp_cons) == 0x808);
static_assert(offsetof(XenstoreDomainInterface, server_features) == 0x810);
static_assert(offsetof(XenstoreDomainInterface, connection) == 0x814);
static_assert(xenstore_mask(1024) == 0 && xenstore_mask(0xffffffffu) == 1023);

// Helpers (added for the ring library; the names above are used by xpv-xenstored and stay put).

// The interface at the start of a shared page: refuses a span shorter than the struct or not
// 4-byte aligned. The pointer is valid for sizeof(XenstoreDomainInterface) bytes.
inline Expected<XenstoreDomainInterface*, RingError> xenstore_interface(
    std::span<std::uint8_t> page) noexcept {
  if (page.size() < sizeof(XenstoreDomainInterface)) return fail(RingError::too_small);
  if (reinterpret_cast<std::uintptr_t>(page.data()) % alignof(XenstoreDomainInterface) != 0) {
    return fail(RingError::misaligned);
  }
  return reinterpret_cast<XenstoreDomainInterface*>(page.data());
}

// req: the domain writes, xenstored reads. rsp: xenstored writes, the domain reads. Every read and
// write validates `prod - cons <= kXenstoreRingSize` first (ByteRing).
inline Expected<ByteRing, RingError> xenstore_req_ring(XenstoreDomainInterface& intf) noexcept {
  return ByteRing::make(intf.req, intf.req_cons, intf.req_prod);
}
inline Expected<ByteRing, RingError> xenstore_rsp_ring(XenstoreDomainInterface& intf) noexcept {
  return ByteRing::make(intf.rsp, intf.rsp_cons, intf.rsp_prod);
}

}  // namespace xpv::ring
