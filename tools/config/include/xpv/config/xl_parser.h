// The xl configuration file syntax (xl.cfg(5)): `KEY = VALUE` settings, one per line or separated
// by ';', VALUE a "string" / 'string', an integer, or a [ list, of, strings ] that may span
// lines; '#' starts a comment. Pure: text in, entries out, ConfigError("SOURCE:LINE: why") for
// anything else.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace xpv::config {

struct XlValue {
  std::variant<std::string, std::int64_t, std::vector<std::string>> v;
  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_int() const { return std::holds_alternative<std::int64_t>(v); }
  bool is_list() const { return std::holds_alternative<std::vector<std::string>>(v); }
};

struct XlEntry {
  std::string key;
  XlValue value;
  int line = 0;  // 1-based line of the key
};

// Throws ConfigError on a syntax error or a key given twice.
std::vector<XlEntry> parse_xl(std::string_view text, const std::string& source);

}  // namespace xpv::config
