#include "xpv/netback/vif_address.h"

#include <charconv>

namespace xpv::netback {

namespace {
std::optional<unsigned> number(std::string_view s, unsigned max) noexcept {
  unsigned v = 0;
  if (s.empty() || s.size() > 3 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v > max) return std::nullopt;
  return v;
}
}  // namespace

std::optional<VifAddresses> vif_addresses(std::string_view node) noexcept {
  VifAddresses a;
  if (const auto slash = node.find('/'); slash != std::string_view::npos) {
    auto p = number(node.substr(slash + 1), 30);
    if (!p || *p == 0) return std::nullopt;
    a.prefix = *p;
    node = node.substr(0, slash);
  }
  std::uint32_t addr = 0;
  for (int i = 0; i < 4; ++i) {
    const auto dot = node.find('.');
    if ((i < 3) == (dot == std::string_view::npos)) return std::nullopt;
    auto b = number(node.substr(0, dot), 255);
    if (!b) return std::nullopt;
    addr = addr << 8 | *b;
    node = i < 3 ? node.substr(dot + 1) : std::string_view{};
  }
  a.domain = addr;
  const std::uint32_t host_bits = ~a.netmask();
  if ((addr & host_bits) == 0 || (addr & host_bits) == host_bits) return std::nullopt;
  a.host = a.network() + 1;
  if (a.host == a.domain) a.host = a.network() + 2;
  return a;
}

std::string ipv4_string(std::uint32_t a) {
  return std::to_string(a >> 24) + "." + std::to_string((a >> 16) & 0xff) + "." + std::to_string((a >> 8) & 0xff) +
         "." + std::to_string(a & 0xff);
}

}  // namespace xpv::netback
