// netif — the Xen network-device ring ABI (io/netif.h), x86_64 layout.
//
// Two rings per queue (plus an optional control ring):
//   tx: guest → host packets. Request = NetifTxRequest (12 bytes) or, after a request with
//       kNettxfExtraInfo, a NetifExtraInfo in the next slot; response = NetifTxResponse (4 bytes).
//       Entry 12 bytes → 256 entries per page.
//   rx: host → guest packets. Request = NetifRxRequest (an empty buffer, 8 bytes); response =
//       NetifRxResponse (8 bytes) or, after one with kNetrxfExtraInfo, a NetifExtraInfo.
//       Entry 8 bytes → 256 entries per page (504 fit; rounded down to a power of two).
// netif_extra_from_tx / netif_extra_to_tx / ..._rx re-read or build a slot as an extra-info slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "xpv/ring/shared_ring.h"

namespace xpv::ring {

using GrantRef = std::uint32_t;  // grant_ref_t

inline constexpr std::uint32_t kXenNetifNrSlotsMin = 18;    // XEN_NETIF_NR_SLOTS_MIN
inline constexpr std::uint32_t kXenNetifMaxTxSize = 0xFFFF;  // XEN_NETIF_MAX_TX_SIZE

// NetifTxRequest::flags (NETTXF_*).
inline constexpr std::uint16_t kNettxfCsumBlank = 1u << 0;      // checksum to be filled in (offload)
inline constexpr std::uint16_t kNettxfDataValidated = 1u << 1;  // checksum already validated
inline constexpr std::uint16_t kNettxfMoreData = 1u << 2;       // packet continues in the next slot
inline constexpr std::uint16_t kNettxfExtraInfo = 1u << 3;      // next slot is a NetifExtraInfo

// NetifRxResponse::flags (NETRXF_*).
inline constexpr std::uint16_t kNetrxfDataValidated = 1u << 0;
inline constexpr std::uint16_t kNetrxfCsumBlank = 1u << 1;
inline constexpr std::uint16_t kNetrxfMoreData = 1u << 2;
inline constexpr std::uint16_t kNetrxfExtraInfo = 1u << 3;
inline constexpr std::uint16_t kNetrxfGsoPrefix = 1u << 4;  // deprecated

// NetifExtraInfo::type (XEN_NETIF_EXTRA_TYPE_*).
inline constexpr std::uint8_t kXenNetifExtraTypeNone = 0;  // never used: invalid
inline constexpr std::uint8_t kXenNetifExtraTypeGso = 1;
inline constexpr std::uint8_t kXenNetifExtraTypeMcastAdd = 2;
inline constexpr std::uint8_t kXenNetifExtraTypeMcastDel = 3;
inline constexpr std::uint8_t kXenNetifExtraTypeHash = 4;
inline constexpr std::uint8_t kXenNetifExtraTypeMax = 5;
// NetifExtraInfo::flags (XEN_NETIF_EXTRA_FLAG_*).
inline constexpr std::uint8_t kXenNetifExtraFlagMore = 1u << 0;  // another extra slot follows

// NetifExtraInfo::u.gso.type (XEN_NETIF_GSO_TYPE_*).
inline constexpr std::uint8_t kXenNetifGsoTypeNone = 0;
inline constexpr std::uint8_t kXenNetifGsoTypeTcpv4 = 1;
inline constexpr std::uint8_t kXenNetifGsoTypeTcpv6 = 2;

// NetifExtraInfo::u.hash.type bits and algorithm (XEN_NETIF_CTRL_HASH_*).
inline constexpr std::uint8_t kXenNetifCtrlHashTypeIpv4 = 1u << 0;
inline constexpr std::uint8_t kXenNetifCtrlHashTypeIpv4Tcp = 1u << 1;
inline constexpr std::uint8_t kXenNetifCtrlHashTypeIpv6 = 1u << 2;
inline constexpr std::uint8_t kXenNetifCtrlHashTypeIpv6Tcp = 1u << 3;
inline constexpr std::uint8_t kXenNetifCtrlHashAlgorithmNone = 0;
inline constexpr std::uint8_t kXenNetifCtrlHashAlgorithmToeplitz = 1;

// Response status (NETIF_RSP_*).
inline constexpr std::int16_t kNetifRspDropped = -2;
inline constexpr std::int16_t kNetifRspError = -1;
inline constexpr std::int16_t kNetifRspOkay = 0;
inline constexpr std::int16_t kNetifRspNull = 1;  // the response to an extra-info slot

// struct netif_tx_request: one fragment of a guest → host packet.
struct NetifTxRequest {
  GrantRef gref;         // 0x0: grant of the page holding the fragment
  std::uint16_t offset;  // 0x4: offset of the fragment in that page
  std::uint16_t flags;   // 0x6: kNettxf*
  std::uint16_t id;      // 0x8: echoed in the response
  std::uint16_t size;    // 0xa: first slot: whole packet size; others: this fragment's size
};
static_assert(std::is_standard_layout_v<NetifTxRequest> && sizeof(NetifTxRequest) == 12);
static_assert(offsetof(NetifTxRequest, offset) == 4 && offsetof(NetifTxRequest, flags) == 6 &&
              offsetof(NetifTxRequest, id) == 8 && offsetof(NetifTxRequest, size) == 10);

// struct netif_extra_info: occupies a tx request slot or an rx response slot.
struct NetifExtraInfo {
  struct Gso {
    std::uint16_t size;      // +0x0: maximum payload per segment (MSS)
    std::uint8_t type;       // +0x2: kXenNetifGsoType*
    std::uint8_t pad;        // +0x3
    std::uint16_t features;  // +0x4: none defined
  };
  struct Mcast {
    std::uint8_t addr[6];  // +0x0: multicast MAC address
  };
  struct Hash {
    std::uint8_t type;       // +0x0: kXenNetifCtrlHashType* bit
    std::uint8_t algorithm;  // +0x1: kXenNetifCtrlHashAlgorithm*
    std::uint8_t value[4];   // +0x2: the hash, little-endian
  };
  union U {
    Gso gso;
    Mcast mcast;
    Hash hash;
    std::uint16_t pad[3];
  };

  std::uint8_t type;   // 0x0: kXenNetifExtraType*
  std::uint8_t flags;  // 0x1: kXenNetifExtraFlag*
  U u;                 // 0x2: gso (size 0x2, type 0x4, pad 0x5, features 0x6), mcast.addr 0x2,
                       //      hash (type 0x2, algorithm 0x3, value 0x4)
};
static_assert(std::is_standard_layout_v<NetifExtraInfo> && sizeof(NetifExtraInfo) == 8);
static_assert(offsetof(NetifExtraInfo, flags) == 1 && offsetof(NetifExtraInfo, u) == 2);
static_assert(offsetof(NetifExtraInfo::Gso, type) == 2 && offsetof(NetifExtraInfo::Gso, features) == 4);
static_assert(offsetof(NetifExtraInfo::Hash, value) == 2);

// struct netif_tx_response.
struct NetifTxResponse {
  std::uint16_t id;     // 0x0: from the request
  std::int16_t status;  // 0x2: kNetifRsp*
};
static_assert(std::is_standard_layout_v<NetifTxResponse> && sizeof(NetifTxResponse) == 4);
static_assert(offsetof(NetifTxResponse, status) == 2);

// struct netif_rx_request: an empty guest buffer for the host to fill.
struct NetifRxRequest {
  std::uint16_t id;   // 0x0: echoed in the response
  std::uint16_t pad;  // 0x2
  GrantRef gref;      // 0x4: grant of the buffer page
};
static_assert(std::is_standard_layout_v<NetifRxRequest> && sizeof(NetifRxRequest) == 8);
static_assert(offsetof(NetifRxRequest, pad) == 2 && offsetof(NetifRxRequest, gref) == 4);

// struct netif_rx_response.
struct NetifRxResponse {
  std::uint16_t id;      // 0x0: from the request
  std::uint16_t offset;  // 0x2: offset of the data in the buffer page
  std::uint16_t flags;   // 0x4: kNetrxf*
  std::int16_t status;   // 0x6: < 0: kNetifRsp* error; >= 0: bytes received
};
static_assert(std::is_standard_layout_v<NetifRxResponse> && sizeof(NetifRxResponse) == 8);
static_assert(offsetof(NetifRxResponse, offset) == 2 && offsetof(NetifRxResponse, flags) == 4 &&
              offsetof(NetifRxResponse, status) == 6);

// The control ring (feature-ctrl-ring): struct xen_netif_ctrl_request / _response.
struct NetifCtrlRequest {
  std::uint16_t id;       // 0x0
  std::uint16_t type;     // 0x2: XEN_NETIF_CTRL_TYPE_*
  std::uint32_t data[3];  // 0x4
};
static_assert(std::is_standard_layout_v<NetifCtrlRequest> && sizeof(NetifCtrlRequest) == 16);
static_assert(offsetof(NetifCtrlRequest, type) == 2 && offsetof(NetifCtrlRequest, data) == 4);

struct NetifCtrlResponse {
  std::uint16_t id;      // 0x0
  std::uint16_t type;    // 0x2
  std::uint32_t status;  // 0x4: XEN_NETIF_CTRL_STATUS_*
  std::uint32_t data;    // 0x8
};
static_assert(std::is_standard_layout_v<NetifCtrlResponse> && sizeof(NetifCtrlResponse) == 12);
static_assert(offsetof(NetifCtrlResponse, status) == 4 && offsetof(NetifCtrlResponse, data) == 8);

// An extra-info slot on the tx ring is read from / written as a tx request slot (its first 8 of
// 12 bytes); on the rx ring it has exactly the size of a response.
inline NetifExtraInfo netif_extra_from_tx(const NetifTxRequest& slot) noexcept {
  NetifExtraInfo e;
  std::memcpy(&e, &slot, sizeof(e));
  return e;
}
inline NetifTxRequest netif_extra_to_tx(const NetifExtraInfo& e) noexcept {
  NetifTxRequest slot{};
  std::memcpy(&slot, &e, sizeof(e));
  return slot;
}
inline NetifExtraInfo netif_extra_from_rx(const NetifRxResponse& slot) noexcept {
  static_assert(sizeof(NetifExtraInfo) == sizeof(NetifRxResponse));
  NetifExtraInfo e;
  std::memcpy(&e, &slot, sizeof(e));
  return e;
}
inline NetifRxResponse netif_extra_to_rx(const NetifExtraInfo& e) noexcept {
  NetifRxResponse slot;
  std::memcpy(&slot, &e, sizeof(e));
  return slot;
}

// Ring types (DEFINE_RING_TYPES(netif_tx, ...), (netif_rx, ...), (xen_netif_ctrl, ...)).
using NetifTxEntry = SringEntry<NetifTxRequest, NetifTxResponse>;
using NetifRxEntry = SringEntry<NetifRxRequest, NetifRxResponse>;
using NetifCtrlEntry = SringEntry<NetifCtrlRequest, NetifCtrlResponse>;
using NetifTxFrontRing = FrontRing<NetifTxRequest, NetifTxResponse>;
using NetifTxBackRing = BackRing<NetifTxRequest, NetifTxResponse>;
using NetifRxFrontRing = FrontRing<NetifRxRequest, NetifRxResponse>;
using NetifRxBackRing = BackRing<NetifRxRequest, NetifRxResponse>;
using NetifCtrlFrontRing = FrontRing<NetifCtrlRequest, NetifCtrlResponse>;
using NetifCtrlBackRing = BackRing<NetifCtrlRequest, NetifCtrlResponse>;
static_assert(sizeof(NetifTxEntry) == 12 && sizeof(NetifRxEntry) == 8 && sizeof(NetifCtrlEntry) == 16);

constexpr RingIdx netif_tx_ring_size(unsigned order) noexcept {
  return ring_entries<NetifTxRequest, NetifTxResponse>(ring_bytes_for_order(order));
}
constexpr RingIdx netif_rx_ring_size(unsigned order) noexcept {
  return ring_entries<NetifRxRequest, NetifRxResponse>(ring_bytes_for_order(order));
}
static_assert(netif_tx_ring_size(0) == 256 && netif_rx_ring_size(0) == 256);
static_assert(netif_tx_ring_size(1) == 512 && netif_rx_ring_size(1) == 512);
// 2 pages of rx: (8192 - 64) / 8 = 1016 → 512; 4 pages of tx: 16320 / 12 = 1360 → 1024.
static_assert(netif_tx_ring_size(2) == 1024 && netif_rx_ring_size(3) == 2048);

}  // namespace xpv::ring
