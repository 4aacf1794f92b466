// vnet header ↔ netif offload translation and the header parser behind it.
#include <gtest/gtest.h>
// The uapi header names a struct field `class` (virtio_net_ctrl_hdr), not valid C++: rename it
// for this one include.
#define class class_
#include <linux/virtio_net.h>
#undef class

#include <cstddef>
#include <vector>

#include "xpv/netback/offload.h"
#include "xpv/ring/netif.h"

namespace xpv::netback {
namespace {

using namespace xpv::ring;

// Ethernet + IPv4 (ihl words) + TCP (doff words) or UDP, zero payload.
std::vector<std::uint8_t> ipv4(std::uint8_t proto, unsigned ihl = 5, unsigned doff = 5, bool vlan = false) {
  std::vector<std::uint8_t> f(12, 0);
  if (vlan) f.insert(f.end(), {0x81, 0x00, 0x00, 0x05});
  f.insert(f.end(), {0x08, 0x00});
  std::vector<std::uint8_t> ip(ihl * 4, 0);
  ip[0] = static_cast<std::uint8_t>(0x40 | ihl);
  ip[9] = proto;
  f.insert(f.end(), ip.begin(), ip.end());
  std::vector<std::uint8_t> l4(proto == 6 ? doff * 4 : 8, 0);
  if (proto == 6) l4[12] = static_cast<std::uint8_t>(doff << 4);
  f.insert(f.end(), l4.begin(), l4.end());
  return f;
}

std::vector<std::uint8_t> ipv6_tcp(bool hop_by_hop) {
  std::vector<std::uint8_t> f(12, 0);
  f.insert(f.end(), {0x86, 0xdd});
  std::vector<std::uint8_t> ip(40, 0);
  ip[0] = 0x60;
  ip[6] = hop_by_hop ? 0 : 6;
  f.insert(f.end(), ip.begin(), ip.end());
  if (hop_by_hop) {
    std::vector<std::uint8_t> ext(8, 0);
    ext[0] = 6;  // next: TCP, length 0 → 8 bytes
    f.insert(f.end(), ext.begin(), ext.end());
  }
  std::vector<std::uint8_t> tcp(20, 0);
  tcp[12] = 5 << 4;
  f.insert(f.end(), tcp.begin(), tcp.end());
  return f;
}

// VnetHdr is struct virtio_net_hdr: the same size, offsets and constants as the kernel's header.
TEST(VnetHdr, MatchesTheKernelHeader) {
  EXPECT_EQ(sizeof(VnetHdr), sizeof(virtio_net_hdr));
  EXPECT_EQ(offsetof(VnetHdr, flags), offsetof(virtio_net_hdr, flags));
  EXPECT_EQ(offsetof(VnetHdr, gso_type), offsetof(virtio_net_hdr, gso_type));
  EXPECT_EQ(offsetof(VnetHdr, hdr_len), offsetof(virtio_net_hdr, hdr_len));
  EXPECT_EQ(offsetof(VnetHdr, gso_size), offsetof(virtio_net_hdr, gso_size));
  EXPECT_EQ(offsetof(VnetHdr, csum_start), offsetof(virtio_net_hdr, csum_start));
  EXPECT_EQ(offsetof(VnetHdr, csum_offset), offsetof(virtio_net_hdr, csum_offset));
  EXPECT_EQ(kVnetFNeedsCsum, VIRTIO_NET_HDR_F_NEEDS_CSUM);
  EXPECT_EQ(kVnetFDataValid, VIRTIO_NET_HDR_F_DATA_VALID);
  EXPECT_EQ(kVnetGsoNone, VIRTIO_NET_HDR_GSO_NONE);
  EXPECT_EQ(kVnetGsoTcpv4, VIRTIO_NET_HDR_GSO_TCPV4);
  EXPECT_EQ(kVnetGsoUdp, VIRTIO_NET_HDR_GSO_UDP);
  EXPECT_EQ(kVnetGsoTcpv6, VIRTIO_NET_HDR_GSO_TCPV6);
  EXPECT_EQ(kVnetGsoEcn, VIRTIO_NET_HDR_GSO_ECN);
}

TEST(ParseL4, Ipv4TcpWithOptions) {
  auto l4 = parse_l4(ipv4(6, 6, 8));
  ASSERT_TRUE(l4);
  EXPECT_EQ(l4->l4_offset, 14 + 24);
  EXPECT_EQ(l4->l4_hdr_len, 32);
  EXPECT_EQ(l4->proto, 6);
  EXPECT_FALSE(l4->ipv6);
}

TEST(ParseL4, VlanTaggedUdp) {
  auto l4 = parse_l4(ipv4(17, 5, 5, true));
  ASSERT_TRUE(l4);
  EXPECT_EQ(l4->l4_offset, 18 + 20);
  EXPECT_EQ(l4->l4_hdr_len, 8);
}

TEST(ParseL4, Ipv6WithHopByHop) {
  auto l4 = parse_l4(ipv6_tcp(true));
  ASSERT_TRUE(l4);
  EXPECT_EQ(l4->l4_offset, 14 + 40 + 8);
  EXPECT_TRUE(l4->ipv6);
  auto plain = parse_l4(ipv6_tcp(false));
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->l4_offset, 54);
}

TEST(ParseL4, BadInputIsRefused) {
  auto f = ipv4(6);
  EXPECT_EQ(parse_l4(std::span(f).first(13)).error(), PacketError::truncated);
  EXPECT_EQ(parse_l4(std::span(f).first(14 + 20 + 10)).error(), PacketError::truncated);
  auto arp = f;
  arp[12] = 0x08;
  arp[13] = 0x06;
  EXPECT_EQ(parse_l4(arp).error(), PacketError::not_ip);
  auto icmp = ipv4(1);
  EXPECT_EQ(parse_l4(icmp).error(), PacketError::not_tcp_udp);
  auto small_ihl = ipv4(6);
  small_ihl[14] = 0x44;
  EXPECT_EQ(parse_l4(small_ihl).error(), PacketError::bad_ip);
  auto short_doff = ipv4(6);
  short_doff[14 + 20 + 12] = 4 << 4;
  EXPECT_EQ(parse_l4(short_doff).error(), PacketError::truncated);
}

TEST(ParseIp, AddressesTagsAndFragments) {
  auto f = ipv4(6);
  f[14 + 12] = 10, f[14 + 15] = 2;  // 10.0.0.2 → 10.0.0.1
  f[14 + 16] = 10, f[14 + 19] = 1;
  auto ip = parse_ip(f);
  ASSERT_TRUE(ip);
  EXPECT_EQ(ip->l4_offset, 14u + 20);
  EXPECT_EQ(ip->proto, 6);
  EXPECT_FALSE(ip->fragment);
  ASSERT_EQ(ip->src.size(), 4u);
  EXPECT_EQ(ip->src.data(), f.data() + 14 + 12) << "the addresses are the frame's own bytes";
  EXPECT_EQ(ip->dst[0], 10);
  EXPECT_EQ(ip->dst[3], 1);
  EXPECT_EQ(ip->ports.data(), f.data() + 14 + 20);
  EXPECT_EQ(ip->ports.size(), 4u);
  // An 802.1ad (QinQ service) tag is skipped as an 802.1Q one is.
  auto qinq = f;
  qinq.insert(qinq.begin() + 12, {0x88, 0xa8, 0x00, 0x07});
  ASSERT_TRUE(parse_ip(qinq));
  EXPECT_EQ(parse_ip(qinq)->l4_offset, 18u + 20);
  // A fragment (more fragments, or an offset) is told; the transport header may not be there,
  // so the offloads refuse it (as Linux's skb_checksum_setup does).
  auto first = f, later = f;
  first[14 + 6] = 0x20;
  later[14 + 7] = 0x10;
  ASSERT_TRUE(parse_ip(first) && parse_ip(later));
  EXPECT_TRUE(parse_ip(first)->fragment);
  EXPECT_TRUE(parse_ip(later)->fragment);
  EXPECT_TRUE(parse_ip(later)->ports.empty()) << "a fragment has no ports";
  EXPECT_EQ(parse_l4(first).error(), PacketError::bad_ip);
  EXPECT_EQ(parse_l4(later).error(), PacketError::bad_ip);
  // The don't-fragment bit alone is not a fragment.
  auto df = f;
  df[14 + 6] = 0x40;
  ASSERT_TRUE(parse_ip(df));
  EXPECT_FALSE(parse_ip(df)->fragment);
  EXPECT_TRUE(parse_l4(df));
  // IPv6: 16-byte addresses; the transport header past a hop-by-hop header need not be in the
  // frame for parse_ip (parse_l4 then says truncated).
  const auto v6 = ipv6_tcp(true);
  auto ip6 = parse_ip(std::span(v6).first(14 + 40 + 8));
  ASSERT_TRUE(ip6);
  EXPECT_TRUE(ip6->ipv6);
  EXPECT_EQ(ip6->src.size(), 16u);
  EXPECT_EQ(ip6->src.data(), v6.data() + 14 + 8);
  EXPECT_EQ(ip6->dst.data(), v6.data() + 14 + 24);
  EXPECT_EQ(ip6->l4_offset, 14u + 48);
  EXPECT_EQ(ip6->proto, 6);
  EXPECT_EQ(parse_l4(std::span(v6).first(14 + 48)).error(), PacketError::truncated);
  EXPECT_TRUE(ip6->ports.empty()) << "the frame ends before the ports";
  ASSERT_TRUE(parse_ip(v6));
  EXPECT_EQ(parse_ip(v6)->ports.data(), v6.data() + 14 + 48);
  EXPECT_TRUE(parse_ip(ipv4(1))->ports.empty()) << "ICMP has none";
  auto v4_in_v6 = v6;
  v4_in_v6[14] = 0x40;
  EXPECT_EQ(parse_ip(v4_in_v6).error(), PacketError::bad_ip);
  // Cut short: inside the tag, inside the IPv4 header, inside an IPv6 extension header.
  EXPECT_EQ(parse_ip(std::span(qinq).first(16)).error(), PacketError::truncated);
  EXPECT_EQ(parse_ip(std::span(f).first(14 + 19)).error(), PacketError::truncated);
  EXPECT_EQ(parse_ip(std::span(v6).first(14 + 40 + 7)).error(), PacketError::truncated);
  // An IPv4 header whose options run past the frame: parse_ip says where the transport header
  // would be; parse_l4 finds it missing.
  auto long_ihl = ipv4(6);
  long_ihl[14] = 0x4f;  // 60 bytes of header in a frame with 40 after the Ethernet header
  ASSERT_TRUE(parse_ip(long_ihl));
  EXPECT_EQ(parse_ip(long_ihl)->l4_offset, 14u + 60);
  EXPECT_EQ(parse_l4(long_ihl).error(), PacketError::truncated);
}

TEST(VnetFromNetif, PlainAndValidated) {
  auto h = vnet_from_netif({}, {});
  ASSERT_TRUE(h);
  EXPECT_EQ(h->flags, 0);
  NetifOffload v;
  v.data_validated = true;
  EXPECT_EQ(vnet_from_netif(v, {})->flags, kVnetFDataValid);
}

TEST(VnetFromNetif, CsumBlankTcpAndUdp) {
  NetifOffload o;
  o.csum_blank = true;
  o.data_validated = true;
  auto t = vnet_from_netif(o, ipv4(6));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->flags, kVnetFNeedsCsum);
  EXPECT_EQ(t->csum_start, 34);
  EXPECT_EQ(t->csum_offset, 16);
  EXPECT_EQ(t->gso_type, kVnetGsoNone);
  auto u = vnet_from_netif(o, ipv4(17));
  ASSERT_TRUE(u);
  EXPECT_EQ(u->csum_offset, 6);
  EXPECT_EQ(vnet_from_netif(o, ipv4(1)).error(), PacketError::not_tcp_udp);
}

TEST(VnetFromNetif, GsoTcpv4AndV6) {
  NetifOffload o;
  o.csum_blank = true;
  o.gso_type = kXenNetifGsoTypeTcpv4;
  o.gso_size = 1448;
  auto h = vnet_from_netif(o, ipv4(6, 5, 8));
  ASSERT_TRUE(h);
  EXPECT_EQ(h->gso_type, kVnetGsoTcpv4);
  EXPECT_EQ(h->gso_size, 1448);
  EXPECT_EQ(h->hdr_len, 14 + 20 + 32);
  o.gso_type = kXenNetifGsoTypeTcpv6;
  auto h6 = vnet_from_netif(o, ipv6_tcp(false));
  ASSERT_TRUE(h6);
  EXPECT_EQ(h6->gso_type, kVnetGsoTcpv6);
  EXPECT_EQ(h6->hdr_len, 14 + 40 + 20);
}

TEST(VnetFromNetif, BadGsoIsRefused) {
  NetifOffload o;
  o.csum_blank = true;
  o.gso_type = kXenNetifGsoTypeTcpv6;  // on an IPv4 frame
  o.gso_size = 1448;
  EXPECT_EQ(vnet_from_netif(o, ipv4(6)).error(), PacketError::bad_gso);
  o.gso_type = 7;
  EXPECT_EQ(vnet_from_netif(o, ipv4(6)).error(), PacketError::bad_gso);
  o.gso_type = kXenNetifGsoTypeTcpv4;
  o.gso_size = 0;
  EXPECT_EQ(vnet_from_netif(o, ipv4(6)).error(), PacketError::bad_gso);
  o.gso_size = 1448;
  o.csum_blank = false;  // GSO without a partial checksum
  EXPECT_EQ(vnet_from_netif(o, ipv4(6)).error(), PacketError::bad_gso);
  o.csum_blank = true;
  EXPECT_EQ(vnet_from_netif(o, ipv4(17)).error(), PacketError::bad_gso);  // UDP
}

TEST(NetifFromVnet, FlagsAndGso) {
  VnetHdr h{};
  h.flags = kVnetFNeedsCsum;
  auto o = netif_from_vnet(h, {});
  ASSERT_TRUE(o);
  EXPECT_TRUE(o->csum_blank);
  EXPECT_TRUE(o->data_validated);
  EXPECT_EQ(o->gso_type, 0);
  h.flags = kVnetFDataValid;
  o = netif_from_vnet(h, {});
  EXPECT_FALSE(o->csum_blank);
  EXPECT_TRUE(o->data_validated);
  h.flags = kVnetFNeedsCsum;
  h.gso_type = kVnetGsoTcpv6 | kVnetGsoEcn;
  h.gso_size = 8948;
  o = netif_from_vnet(h, {false, true});
  ASSERT_TRUE(o);
  EXPECT_EQ(o->gso_type, kXenNetifGsoTypeTcpv6);
  EXPECT_EQ(o->gso_size, 8948);
}

TEST(NetifFromVnet, UnnegotiatedOrBadGsoIsRefused) {
  VnetHdr h{};
  h.flags = kVnetFNeedsCsum;
  h.gso_type = kVnetGsoTcpv4;
  h.gso_size = 1448;
  EXPECT_EQ(netif_from_vnet(h, {false, true}).error(), PacketError::unsupported);
  h.gso_type = kVnetGsoUdp;
  EXPECT_EQ(netif_from_vnet(h, {true, true}).error(), PacketError::unsupported);
  h.gso_type = kVnetGsoTcpv4;
  h.gso_size = 0;
  EXPECT_EQ(netif_from_vnet(h, {true, true}).error(), PacketError::bad_gso);
  h.gso_size = 1448;
  h.flags = 0;
  EXPECT_EQ(netif_from_vnet(h, {true, true}).error(), PacketError::bad_gso);
}

TEST(Offload, RoundTripThroughNetif) {
  // TAP → netif (netback RX) → vnet (netfront) gives back the same header.
  VnetHdr in{};
  in.flags = kVnetFNeedsCsum;
  in.gso_type = kVnetGsoTcpv4;
  in.gso_size = 1448;
  in.csum_start = 34;
  in.csum_offset = 16;
  in.hdr_len = 54;
  auto o = netif_from_vnet(in, {true, true});
  ASSERT_TRUE(o);
  auto out = vnet_from_netif(*o, ipv4(6));
  ASSERT_TRUE(out);
  EXPECT_EQ(out->flags, in.flags);
  EXPECT_EQ(out->gso_type, in.gso_type);
  EXPECT_EQ(out->gso_size, in.gso_size);
  EXPECT_EQ(out->csum_start, in.csum_start);
  EXPECT_EQ(out->csum_offset, in.csum_offset);
  EXPECT_EQ(out->hdr_len, in.hdr_len);
}

}  // namespace
}  // namespace xpv::netback
