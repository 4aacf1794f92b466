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
#include <type_traits>

namespace xpv::ring {

inline constexpr std::uint32_t kXenstoreRingSize = 1024;

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

}  // namespace xpv::ring
