// Offload metadata between the two worlds a packet crosses (pure code, no I/O):
//
//   Linux TAP with IFF_VNET_HDR:  struct virtio_net_hdr (10 bytes) in front of every frame:
//                                 flags NEEDS_CSUM (csum_start/csum_offset), DATA_VALID,
//                                 gso_type TCPV4/TCPV6 (+ECN) with gso_size and hdr_len
//   netif (io/netif.h):           NETTXF_/NETRXF_ csum_blank + data_validated flags on the first
//                                 slot, and a XEN_NETIF_EXTRA_TYPE_GSO extra-info slot
//                                 {size = MSS, type = TCPV4/TCPV6}
//
// netif carries no checksum start/offset: the receiver of a csum_blank packet finds the transport
// header itself (as Linux netback's skb_checksum_setup does), so vnet_from_netif parses the frame's
// Ethernet (+802.1Q) / IPv4 / IPv6 / TCP / UDP headers. The transport checksum field is expected to
// hold the pseudo-header sum already (CHECKSUM_PARTIAL semantics on both sides); nothing here
// rewrites packet bytes.
//
// Used by netback (guest TX → TAP: vnet_from_netif; TAP → guest RX: netif_from_vnet) and by
// xpv's netfront (the mirror image). Every input may come from an untrusted peer: all parsers are
// bounded by the span they get and return an error instead of guessing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <span>

#include "xpv/expected.h"

namespace xpv::netback {

// struct virtio_net_hdr (include/uapi/linux/virtio_net.h), the 10-byte header TUNSETVNETHDRSZ 10
// puts in front of each frame. Fields are little-endian on x86 (and TUNSETVNETLE is not needed).
struct VnetHdr {
  std::uint8_t flags;         // 0x0: kVnetF*
  std::uint8_t gso_type;      // 0x1: kVnetGso*
  std::uint16_t hdr_len;      // 0x2: Ethernet + IP + TCP header bytes (a hint for GSO)
  std::uint16_t gso_size;     // 0x4: MSS
  std::uint16_t csum_start;   // 0x6: where checksumming starts (the transport header)
  std::uint16_t csum_offset;  // 0x8: where the result goes, from csum_start
};
static_assert(std::is_standard_layout_v<VnetHdr> && sizeof(VnetHdr) == 10);
static_assert(offsetof(VnetHdr, gso_type) == 1 && offsetof(VnetHdr, hdr_len) == 2 &&
              offsetof(VnetHdr, gso_size) == 4 && offsetof(VnetHdr, csum_start) == 6 &&
              offsetof(VnetHdr, csum_offset) == 8);

inline constexpr std::uint8_t kVnetFNeedsCsum = 1;  // VIRTIO_NET_HDR_F_NEEDS_CSUM
inline constexpr std::uint8_t kVnetFDataValid = 2;  // VIRTIO_NET_HDR_F_DATA_VALID
inline constexpr std::uint8_t kVnetGsoNone = 0;     // VIRTIO_NET_HDR_GSO_NONE
inline constexpr std::uint8_t kVnetGsoTcpv4 = 1;    // VIRTIO_NET_HDR_GSO_TCPV4
inline constexpr std::uint8_t kVnetGsoUdp = 3;      // VIRTIO_NET_HDR_GSO_UDP
inline constexpr std::uint8_t kVnetGsoTcpv6 = 4;    // VIRTIO_NET_HDR_GSO_TCPV6
inline constexpr std::uint8_t kVnetGsoEcn = 0x80;   // VIRTIO_NET_HDR_GSO_ECN

inline constexpr std::size_t kEthHeader = 14;

enum class PacketError : std::uint8_t {
  truncated,        // the frame ends inside a header it claims
  not_ip,           // csum_blank / GSO on something that is neither IPv4 nor IPv6
  bad_ip,           // IPv4 ihl < 5, IPv6 extension chain too long, ...
  not_tcp_udp,      // checksum offload for a transport other than TCP or UDP
  bad_gso,          // GSO type unknown, MSS 0, or GSO type not matching the IP version / TCP
  unsupported,      // an offload the peer did not negotiate (e.g. UDP GSO)
};
const char* to_string(PacketError e) noexcept;

// Where a frame's network header is and the flow it names, as far as the frame holds it.
struct IpHeaders {
  std::size_t l4_offset = 0;          // past the IPv4 options / the skipped IPv6 extension headers
  std::uint8_t proto = 0;             // IPv4 protocol / the IPv6 header after those extensions
  bool ipv6 = false;
  bool fragment = false;              // an IPv4 fragment (MF or an offset): no transport header
  std::span<const std::uint8_t> src;  // the addresses, 4 or 16 bytes, inside the frame
  std::span<const std::uint8_t> dst;
  // TCP or UDP, not a fragment, and the frame holds the ports: their 4 bytes (source, then
  // destination); else empty.
  std::span<const std::uint8_t> ports;
};
// Parses Ethernet (one optional 802.1Q or 802.1ad tag), then IPv4 or IPv6 (hop-by-hop, routing,
// destination options extension headers skipped, at most 4). The transport header is not read:
// l4_offset may lie at or past the frame's end. The one header parser under the offloads
// (parse_l4), netback's flow steering and its rx flow queue.
Expected<IpHeaders, PacketError> parse_ip(std::span<const std::uint8_t> frame) noexcept;

// Where the transport header is.
struct L4Info {
  std::uint16_t l4_offset = 0;   // from the start of the frame
  std::uint16_t l4_hdr_len = 0;  // TCP: doff*4; UDP: 8
  std::uint8_t proto = 0;        // 6 TCP, 17 UDP
  bool ipv6 = false;
};
// parse_ip, then TCP or UDP. An IPv4 fragment is refused (bad_ip), as Linux's
// skb_checksum_setup refuses it: its transport header may not be there.
Expected<L4Info, PacketError> parse_l4(std::span<const std::uint8_t> frame) noexcept;

// The netif view of a packet's offloads.
struct NetifOffload {
  bool csum_blank = false;      // NETTXF_csum_blank / NETRXF_csum_blank
  bool data_validated = false;  // NETTXF_data_validated / NETRXF_data_validated
  std::uint8_t gso_type = 0;    // kXenNetifGsoType*; 0 = none
  std::uint16_t gso_size = 0;   // MSS when gso_type != 0
};

// What the peer negotiated (feature-gso-tcpv4/6 from the receiver of the packet).
struct GsoCaps {
  bool tcpv4 = false;
  bool tcpv6 = false;
};

// netif → vnet: `frame` is the whole packet (or at least its headers). A packet without
// csum_blank and without GSO needs no parsing.
Expected<VnetHdr, PacketError> vnet_from_netif(const NetifOffload& o,
                                               std::span<const std::uint8_t> frame) noexcept;
// vnet → netif. GSO types other than TCPv4/TCPv6, or ones `caps` does not allow, are refused
// (the TAP's TUNSETOFFLOAD should make them impossible; a packet that has one anyway is dropped).
Expected<NetifOffload, PacketError> netif_from_vnet(const VnetHdr& h, GsoCaps caps) noexcept;

}  // namespace xpv::netback
