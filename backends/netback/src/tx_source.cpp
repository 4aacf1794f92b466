#include "xpv/netback/tx_source.h"

namespace xpv::netback {
namespace {

constexpr std::size_t kEth = 14;

std::uint16_t be16(std::span<const std::uint8_t> f, std::size_t at) noexcept {
  return static_cast<std::uint16_t>(f[at] << 8 | f[at + 1]);
}

std::uint32_t be32(std::span<const std::uint8_t> f, std::size_t at) noexcept {
  return std::uint32_t{f[at]} << 24 | std::uint32_t{f[at + 1]} << 16 | std::uint32_t{f[at + 2]} << 8 | f[at + 3];
}

// A DHCP client's request before it has an address: UDP from port 68 to port 67 (RFC 2131).
bool dhcp_request(std::span<const std::uint8_t> f) noexcept {
  const std::size_t ihl = std::size_t{f[kEth] & 0x0fu} * 4;
  if (f[kEth + 9] != 17 || ihl < 20) return false;
  const std::size_t udp = kEth + ihl;
  if (f.size() < udp + 4) return false;
  return be16(f, udp) == 68 && be16(f, udp + 2) == 67;
}

}  // namespace

TxSource check_tx_source(std::span<const std::uint8_t> f, std::uint32_t domain) noexcept {
  if (domain == 0 || f.size() < kEth) return TxSource::pass;
  switch (be16(f, 12)) {
    case 0x0800: {  // IPv4: version 4, source at 12 in the IP header
      if (f.size() < kEth + 20) return TxSource::truncated;
      const std::uint32_t src = be32(f, kEth + 12);
      if (src == domain) return TxSource::pass;
      if (src == 0 && dhcp_request(f)) return TxSource::pass;
      return TxSource::ipv4_spoofed;
    }
    case 0x0806: {  // ARP: Ethernet (1) / IPv4 (0x0800), 6 / 4 byte addresses, sender IP at 14
      if (f.size() < kEth + 28) return TxSource::truncated;
      if (be16(f, kEth) != 1 || be16(f, kEth + 2) != 0x0800 || f[kEth + 4] != 6 || f[kEth + 5] != 4) {
        return TxSource::arp_spoofed;
      }
      const std::uint32_t spa = be32(f, kEth + 14);
      return spa == domain || spa == 0 ? TxSource::pass : TxSource::arp_spoofed;
    }
    case 0x8100:  // 802.1Q
    case 0x88a8:  // 802.1ad
    case 0x9100:  // QinQ, pre-standard
    case 0x8847:  // MPLS unicast
    case 0x8848:  // MPLS multicast
    case 0x8864:  // PPPoE session
      return TxSource::encapsulated;
    default:
      // Below 0x0600 the field is an 802.3 length: LLC, and SNAP inside it, can carry IPv4.
      return be16(f, 12) < 0x0600 ? TxSource::encapsulated : TxSource::pass;
  }
}

const char* to_string(TxSource s) noexcept {
  switch (s) {
    case TxSource::pass: return "pass";
    case TxSource::ipv4_spoofed: return "an IPv4 source other than the vif's address";
    case TxSource::arp_spoofed: return "an ARP sender other than the vif's address";
    case TxSource::encapsulated: return "a tagged or encapsulated frame (VLAN, LLC/SNAP, MPLS, PPPoE) on a vif with an address";
    case TxSource::truncated: return "an IPv4 or ARP header cut short";
  }
  return "?";
}

}  // namespace xpv::netback
