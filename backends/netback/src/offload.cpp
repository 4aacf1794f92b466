#include "xpv/netback/offload.h"

#include "xpv/ring/netif.h"

namespace xpv::netback {

namespace {
std::uint16_t be16(std::span<const std::uint8_t> f, std::size_t off) noexcept {
  return static_cast<std::uint16_t>((f[off] << 8) | f[off + 1]);
}
constexpr std::uint16_t kEtherIpv4 = 0x0800, kEtherIpv6 = 0x86dd, kEtherVlan = 0x8100, kEtherQinQ = 0x88a8;
constexpr std::uint8_t kProtoTcp = 6, kProtoUdp = 17;
}  // namespace

const char* to_string(PacketError e) noexcept {
  switch (e) {
    case PacketError::truncated: return "truncated headers";
    case PacketError::not_ip: return "offload on a non-IP frame";
    case PacketError::bad_ip: return "malformed IP header";
    case PacketError::not_tcp_udp: return "offload on a transport other than TCP/UDP";
    case PacketError::bad_gso: return "bad GSO metadata";
    case PacketError::unsupported: return "offload not negotiated";
  }
  return "?";
}

Expected<IpHeaders, PacketError> parse_ip(std::span<const std::uint8_t> f) noexcept {
  if (f.size() < kEthHeader) return fail(PacketError::truncated);
  std::size_t off = 12;
  std::uint16_t type = be16(f, off);
  off += 2;
  if (type == kEtherVlan || type == kEtherQinQ) {
    if (f.size() < off + 4) return fail(PacketError::truncated);
    type = be16(f, off + 2);
    off += 4;
  }
  IpHeaders h;
  if (type == kEtherIpv4) {
    if (f.size() < off + 20) return fail(PacketError::truncated);
    if ((f[off] >> 4) != 4) return fail(PacketError::bad_ip);
    const std::size_t ihl = std::size_t{f[off] & 0x0fu} * 4;
    if (ihl < 20) return fail(PacketError::bad_ip);
    h.proto = f[off + 9];
    h.fragment = (be16(f, off + 6) & 0x3fff) != 0;
    h.src = f.subspan(off + 12, 4);
    h.dst = f.subspan(off + 16, 4);
    off += ihl;
  } else if (type == kEtherIpv6) {
    if (f.size() < off + 40) return fail(PacketError::truncated);
    if ((f[off] >> 4) != 6) return fail(PacketError::bad_ip);
    std::uint8_t next = f[off + 6];
    h.src = f.subspan(off + 8, 16);
    h.dst = f.subspan(off + 24, 16);
    off += 40;
    // Hop-by-hop (0), routing (43), destination options (60): length in 8-byte units, +8.
    for (int i = 0; next == 0 || next == 43 || next == 60; ++i) {
      if (i == 4) return fail(PacketError::bad_ip);
      if (f.size() < off + 8) return fail(PacketError::truncated);
      next = f[off];
      off += (std::size_t{f[off + 1]} + 1) * 8;
    }
    h.proto = next;
    h.ipv6 = true;
  } else {
    return fail(PacketError::not_ip);
  }
  h.l4_offset = off;
  if (!h.fragment && (h.proto == kProtoTcp || h.proto == kProtoUdp) && f.size() >= off + 4) h.ports = f.subspan(off, 4);
  return h;
}

Expected<L4Info, PacketError> parse_l4(std::span<const std::uint8_t> f) noexcept {
  const auto ip = parse_ip(f);
  if (!ip) return fail(ip.error());
  if (ip->fragment) return fail(PacketError::bad_ip);
  const std::size_t off = ip->l4_offset;
  L4Info info;
  info.proto = ip->proto;
  info.ipv6 = ip->ipv6;
  if (info.proto == kProtoTcp) {
    if (f.size() < off + 20) return fail(PacketError::truncated);
    info.l4_hdr_len = static_cast<std::uint16_t>((f[off + 12] >> 4) * 4);
    if (info.l4_hdr_len < 20 || f.size() < off + info.l4_hdr_len) return fail(PacketError::truncated);
  } else if (info.proto == kProtoUdp) {
    if (f.size() < off + 8) return fail(PacketError::truncated);
    info.l4_hdr_len = 8;
  } else {
    return fail(PacketError::not_tcp_udp);
  }
  if (off > 0xffff - 64) return fail(PacketError::bad_ip);
  info.l4_offset = static_cast<std::uint16_t>(off);
  return info;
}

Expected<VnetHdr, PacketError> vnet_from_netif(const NetifOffload& o,
                                               std::span<const std::uint8_t> frame) noexcept {
  VnetHdr h{};
  if (!o.csum_blank && o.gso_type == ring::kXenNetifGsoTypeNone) {
    if (o.data_validated) h.flags = kVnetFDataValid;
    return h;
  }
  auto l4 = parse_l4(frame);
  if (!l4) return fail(l4.error());
  if (o.csum_blank) {
    h.flags = kVnetFNeedsCsum;
    h.csum_start = l4->l4_offset;
    h.csum_offset = l4->proto == kProtoTcp ? 16 : 6;
  } else if (o.data_validated) {
    h.flags = kVnetFDataValid;
  }
  if (o.gso_type != ring::kXenNetifGsoTypeNone) {
    const bool v6 = o.gso_type == ring::kXenNetifGsoTypeTcpv6;
    if ((o.gso_type != ring::kXenNetifGsoTypeTcpv4 && !v6) || o.gso_size == 0 ||
        l4->proto != kProtoTcp || l4->ipv6 != v6) {
      return fail(PacketError::bad_gso);
    }
    // A GSO packet is always checksum-partial: the segments' checksums are computed by the stack.
    if (!o.csum_blank) return fail(PacketError::bad_gso);
    h.gso_type = v6 ? kVnetGsoTcpv6 : kVnetGsoTcpv4;
    h.gso_size = o.gso_size;
    h.hdr_len = static_cast<std::uint16_t>(l4->l4_offset + l4->l4_hdr_len);
  }
  return h;
}

Expected<NetifOffload, PacketError> netif_from_vnet(const VnetHdr& h, GsoCaps caps) noexcept {
  NetifOffload o;
  if (h.flags & kVnetFNeedsCsum) {
    // Linux netback marks a checksum-partial packet both blank and validated; so do we.
    o.csum_blank = true;
    o.data_validated = true;
  } else if (h.flags & kVnetFDataValid) {
    o.data_validated = true;
  }
  switch (h.gso_type & ~kVnetGsoEcn) {
    case kVnetGsoNone: return o;
    case kVnetGsoTcpv4:
      if (!caps.tcpv4) return fail(PacketError::unsupported);
      o.gso_type = ring::kXenNetifGsoTypeTcpv4;
      break;
    case kVnetGsoTcpv6:
      if (!caps.tcpv6) return fail(PacketError::unsupported);
      o.gso_type = ring::kXenNetifGsoTypeTcpv6;
      break;
    default: return fail(PacketError::unsupported);
  }
  if (h.gso_size == 0 || !o.csum_blank) return fail(PacketError::bad_gso);
  o.gso_size = h.gso_size;
  return o;
}

}  // namespace xpv::netback
