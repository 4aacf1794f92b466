// Small parsers for the kernel's text files (/proc, /sys, cgroupfs) the toolstack reads.
#pragma once

#include <charconv>
#include <optional>
#include <string_view>

namespace xpv::toolstack {

// `s` without leading and trailing spaces, tabs and newlines.
inline std::string_view trim_text(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

// The whole of `s` as a number of type T (decimal; no sign for unsigned T), or nullopt.
template <typename T>
std::optional<T> parse_number(std::string_view s) {
  T v{};
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

}  // namespace xpv::toolstack
