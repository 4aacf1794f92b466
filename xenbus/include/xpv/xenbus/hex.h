// Hex encoding of byte strings, for the live-update state (JSON text must be UTF-8; xenstore
// values and tokens may hold any byte).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace xpv::xenbus {

inline std::string hex(std::string_view s) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char ch : s) {
    out.push_back(kDigits[ch >> 4]);
    out.push_back(kDigits[ch & 15]);
  }
  return out;
}

// Throws std::runtime_error for an odd length or a character that is not a lower-case hex digit.
inline std::string unhex(std::string_view s) {
  auto nibble = [](char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    throw std::runtime_error("not a hex digit in a hex string");
  };
  if (s.size() % 2) throw std::runtime_error("odd number of digits in a hex string");
  std::string out(s.size() / 2, '\0');
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(nibble(s[2 * i]) << 4 | nibble(s[2 * i + 1]));
  }
  return out;
}

}  // namespace xpv::xenbus
