// The addresses of a vif (pure; shared by xpv-netback, xpv-front and the toolstack).
//
// The vif's `ip` node (backend directory, written by the toolstack from `vif = [ 'ip=…' ]`) is
// the DOMAIN's address, as in xl: "a.b.c.d/prefix" (prefix 1..30; "a.b.c.d" alone means /24).
// A routed vif (no `bridge`): both ends of the point-to-point link take their address from it:
//   domain side (xpv-front, the TAP in netns xpv-dom<N>)  a.b.c.d/prefix
//   host side   (xpv-netback, the TAP vif<N>.<devid>)      the lowest host address of that
//                                                          subnet that is not the domain's
// e.g. ip = 10.1.2.7/24 → host 10.1.2.1/24; ip = 10.1.2.1/24 → host 10.1.2.2/24. The subnet is
// the vif's alone: two vifs on the host must not share one (the toolstack refuses it), since the
// host routes it to that vif's TAP. A bridged vif's host side has no address (the bridge has the
// host's); `ip` is only the domain's, on the bridge's LAN.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace xpv::netback {

struct VifAddresses {
  std::uint32_t domain = 0;  // host byte order
  std::uint32_t host = 0;
  unsigned prefix = 24;
  std::uint32_t network() const noexcept { return domain & netmask(); }
  std::uint32_t netmask() const noexcept { return prefix == 0 ? 0 : ~0u << (32 - prefix); }
};

// nullopt for anything but a host address of its subnet (not the network or broadcast address)
// with a prefix of 1..30.
std::optional<VifAddresses> vif_addresses(std::string_view ip_node) noexcept;

std::string ipv4_string(std::uint32_t addr);  // host byte order → "a.b.c.d"

}  // namespace xpv::netback
