// check_tx_source (tx_source.h): what a vif with an address lets its domain send.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "xpv/netback/tx_source.h"

namespace xpv::netback {
namespace {

constexpr std::uint32_t kDomain = 0x0a000102;  // 10.0.1.2

void put16(std::vector<std::uint8_t>& f, std::size_t at, std::uint16_t v) {
  f[at] = static_cast<std::uint8_t>(v >> 8);
  f[at + 1] = static_cast<std::uint8_t>(v);
}
void put32(std::vector<std::uint8_t>& f, std::size_t at, std::uint32_t v) {
  put16(f, at, static_cast<std::uint16_t>(v >> 16));
  put16(f, at + 2, static_cast<std::uint16_t>(v));
}

// An Ethernet frame with an IPv4 header (IHL 5) from `src`, protocol `proto`, and 8 bytes of
// UDP-like ports after it.
std::vector<std::uint8_t> ipv4(std::uint32_t src, std::uint8_t proto = 6, std::uint16_t sport = 40000,
                               std::uint16_t dport = 5201) {
  std::vector<std::uint8_t> f(14 + 20 + 8, 0);
  put16(f, 12, 0x0800);
  f[14] = 0x45;
  f[14 + 9] = proto;
  put32(f, 14 + 12, src);
  put32(f, 14 + 16, 0x0a000101);
  put16(f, 34, sport);
  put16(f, 36, dport);
  return f;
}

std::vector<std::uint8_t> arp(std::uint32_t sender, std::uint16_t ptype = 0x0800) {
  std::vector<std::uint8_t> f(14 + 28, 0);
  put16(f, 12, 0x0806);
  put16(f, 14, 1);
  put16(f, 16, ptype);
  f[18] = 6;
  f[19] = 4;
  put16(f, 20, 1);  // request
  put32(f, 14 + 14, sender);
  put32(f, 14 + 24, 0x0a000101);
  return f;
}

TEST(TxSource, IPv4MustComeFromTheDomainsAddress) {
  EXPECT_EQ(check_tx_source(ipv4(kDomain), kDomain), TxSource::pass);
  EXPECT_EQ(check_tx_source(ipv4(kDomain + 1), kDomain), TxSource::ipv4_spoofed);
  EXPECT_EQ(check_tx_source(ipv4(0x0a000101), kDomain), TxSource::ipv4_spoofed) << "the host's own address";
  EXPECT_EQ(check_tx_source(ipv4(0), kDomain), TxSource::ipv4_spoofed) << "0.0.0.0, but not DHCP";
}

TEST(TxSource, ADhcpRequestFromNoAddressPasses) {
  EXPECT_EQ(check_tx_source(ipv4(0, 17, 68, 67), kDomain), TxSource::pass);
  EXPECT_EQ(check_tx_source(ipv4(0, 6, 68, 67), kDomain), TxSource::ipv4_spoofed) << "TCP, not UDP";
  EXPECT_EQ(check_tx_source(ipv4(0, 17, 67, 68), kDomain), TxSource::ipv4_spoofed) << "a server's ports";
  EXPECT_EQ(check_tx_source(ipv4(0x0a000109, 17, 68, 67), kDomain), TxSource::ipv4_spoofed)
      << "DHCP's exception is for 0.0.0.0 only";
  auto cut = ipv4(0, 17, 68, 67);
  cut.resize(14 + 20 + 2);  // the ports not all there
  EXPECT_EQ(check_tx_source(cut, kDomain), TxSource::ipv4_spoofed);
}

TEST(TxSource, ArpMustAnnounceTheDomainsAddressOrNone) {
  EXPECT_EQ(check_tx_source(arp(kDomain), kDomain), TxSource::pass);
  EXPECT_EQ(check_tx_source(arp(0), kDomain), TxSource::pass) << "an RFC 5227 probe";
  EXPECT_EQ(check_tx_source(arp(0x0a000101), kDomain), TxSource::arp_spoofed) << "claims the host's address";
  EXPECT_EQ(check_tx_source(arp(kDomain, 0x86dd), kDomain), TxSource::arp_spoofed) << "not IPv4 ARP";
}

// What can carry IPv4 past the check: VLAN tags, an 802.3 length (LLC/SNAP), MPLS, PPPoE.
TEST(TxSource, TaggedAndEncapsulatedFramesAreRefusedAndOtherTypesPass) {
  for (std::uint16_t type : {0x8100, 0x88a8, 0x9100, 0x8847, 0x8848, 0x8864, 0x0000, 0x05dc, 0x05ff}) {
    auto f = ipv4(kDomain);
    put16(f, 12, type);
    EXPECT_EQ(check_tx_source(f, kDomain), TxSource::encapsulated) << type;
  }
  for (std::uint16_t type : {0x0600, 0x88cc, 0x888e}) {  // the first EtherType, LLDP, EAPOL
    auto f = ipv4(kDomain + 1);
    put16(f, 12, type);
    EXPECT_EQ(check_tx_source(f, kDomain), TxSource::pass) << type;
  }
  auto v6 = ipv4(kDomain + 7);
  put16(v6, 12, 0x86dd);
  EXPECT_EQ(check_tx_source(v6, kDomain), TxSource::pass) << "IPv6 is not checked, as with Xen's scripts";
}

TEST(TxSource, HeadersCutShortAreRefused) {
  auto f = ipv4(kDomain);
  f.resize(14 + 19);
  EXPECT_EQ(check_tx_source(f, kDomain), TxSource::truncated);
  auto a = arp(kDomain);
  a.resize(14 + 27);
  EXPECT_EQ(check_tx_source(a, kDomain), TxSource::truncated);
}

TEST(TxSource, AVifWithoutAnAddressChecksNothing) {
  EXPECT_EQ(check_tx_source(ipv4(0x01020304), 0), TxSource::pass);
  EXPECT_EQ(check_tx_source(arp(0x01020304), 0), TxSource::pass);
  auto f = ipv4(kDomain);
  put16(f, 12, 0x8100);
  EXPECT_EQ(check_tx_source(f, 0), TxSource::pass);
}

// The DHCP exception finds the UDP ports after IPv4 options (IHL > 5).
TEST(TxSource, TheDhcpPortsAreFoundAfterIpOptions) {
  auto f = ipv4(0, 17, 1, 2);
  f[14] = 0x46;  // IHL 6: four bytes of options, the ports after them
  f.resize(14 + 24 + 8);
  put16(f, 38, 68);
  put16(f, 40, 67);
  EXPECT_EQ(check_tx_source(f, kDomain), TxSource::pass);
  put16(f, 34, 68);  // the ports where IHL 5 would put them, not where IHL 6 does
  put16(f, 36, 67);
  put16(f, 38, 1);
  EXPECT_EQ(check_tx_source(f, kDomain), TxSource::ipv4_spoofed);
}

}  // namespace
}  // namespace xpv::netback
