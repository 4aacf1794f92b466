#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

namespace xpv::config {

// Bad user input: the message names what and where ("vm.cfg:7: disk 1: unknown access 'rx'").
// It is always one printable line: the parts it quotes come from the input, and a quoted string
// may hold a newline ("\n"), a NUL, an escape sequence. Those are shown escaped (\n, \t, \r, \0,
// \xNN), so that a message cannot break into lines that read as messages of their own (without
// a position), end early at a NUL, or drive the terminal. Bytes ≥ 0x80 (UTF-8 paths) stay.
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::string& what) : std::runtime_error(printable(what)) {}
  explicit ConfigError(const char* what) : ConfigError(std::string(what)) {}

 private:
  static std::string printable(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (const char c : s) {
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x20 && u != 0x7f) {
        out += c;
        continue;
      }
      switch (c) {
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        case '\r': out += "\\r"; break;
        case '\0': out += "\\0"; break;
        default: {
          char hex[5];
          std::snprintf(hex, sizeof hex, "\\x%02x", u);
          out += hex;
        }
      }
    }
    return out;
  }
};

}  // namespace xpv::config
