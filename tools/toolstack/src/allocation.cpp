#include "xpv/toolstack/allocation.h"

#include <fmt/core.h>
#include <sys/random.h>

#include <charconv>

#include "xpv/toolstack/error.h"

namespace xpv::toolstack {
namespace {

template <class T>
std::optional<T> plain_decimal(std::string_view s, T max) {
  if (s.empty() || s.size() > 10 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 10);
  if (ec != std::errc() || p != s.data() + s.size() || v > max) return std::nullopt;
  return static_cast<T>(v);
}

}  // namespace

std::optional<std::uint16_t> pick_domid(const std::set<std::uint16_t>& used) {
  for (std::uint32_t d = kFirstDomid; d <= kLastDomid; ++d) {
    if (!used.count(static_cast<std::uint16_t>(d))) return static_cast<std::uint16_t>(d);
  }
  return std::nullopt;
}

std::optional<std::uint16_t> parse_domid(std::string_view s) {
  return plain_decimal<std::uint16_t>(s, kLastDomid);
}

std::optional<std::uint32_t> parse_devid(std::string_view s) {
  return plain_decimal<std::uint32_t>(s, 0x7fffffffu);
}

std::uint32_t pick_vif_devid(const std::set<std::uint32_t>& used) {
  std::uint32_t d = 0;
  while (used.count(d)) ++d;  // bounded by used.size()
  return d;
}

config::Mac generate_mac(const std::set<std::string>& used, const std::function<std::uint8_t()>& random_byte) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    config::Mac m;
    m.bytes = {0x00, 0x16, 0x3e, random_byte(), random_byte(), random_byte()};
    if (!used.count(m.str())) return m;
  }
  throw ToolstackError("cannot find an unused MAC address in 00:16:3e:xx:xx:xx");
}

std::string generate_uuid(const std::function<std::uint8_t()>& random_byte) {
  std::uint8_t b[16];
  for (auto& x : b) x = random_byte();
  b[6] = static_cast<std::uint8_t>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<std::uint8_t>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += fmt::format("{:02x}", b[i]);
  }
  return s;
}

std::uint8_t system_random_byte() {
  std::uint8_t b = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {  // only EINTR makes a 1-byte read fail
    if (::getrandom(&b, 1, 0) == 1) return b;
  }
  throw ToolstackError("getrandom failed");
}

}  // namespace xpv::toolstack
