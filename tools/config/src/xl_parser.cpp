#include "xpv/config/xl_parser.h"

#include <fmt/core.h>

#include <cctype>
#include <charconv>
#include <set>

#include "xpv/config/error.h"

namespace xpv::config {
namespace {

class Lexer {
 public:
  Lexer(std::string_view text, const std::string& source) : s_(text), source_(source) {}

  [[noreturn]] void error(const std::string& why) const {
    throw ConfigError(fmt::format("{}:{}: {}", source_, line_, why));
  }
  bool at_end() const { return i_ >= s_.size(); }
  int line() const { return line_; }

  // Skips blanks and comments; newlines too when `newlines` is set.
  void skip(bool newlines) {
    while (!at_end()) {
      const char c = s_[i_];
      if (c == '#') {
        while (!at_end() && s_[i_] != '\n') ++i_;
      } else if (c == '\n' && newlines) {
        ++line_;
        ++i_;
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++i_;
      } else {
        return;
      }
    }
  }
  char peek() const { return at_end() ? '\0' : s_[i_]; }
  void expect(char c, const std::string& what) {
    skip(false);
    if (peek() != c) error(fmt::format("expected {}", what));
    ++i_;
  }

  std::string key() {
    std::size_t start = i_;
    while (!at_end() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_')) ++i_;
    if (start == i_) error(fmt::format("expected a setting name, found '{}'", peek()));
    if (std::isdigit(static_cast<unsigned char>(s_[start]))) error("a setting name cannot start with a digit");
    return std::string(s_.substr(start, i_ - start));
  }

  std::string quoted() {
    const char q = s_[i_++];
    std::string out;
    while (true) {
      if (at_end() || s_[i_] == '\n') error("unterminated string");
      char c = s_[i_++];
      if (c == q) break;
      if (c == '\\') {
        if (at_end()) error("unterminated string");
        char e = s_[i_++];
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case '\\': case '\'': case '"': out += e; break;
          default: error(fmt::format("unknown escape '\\{}' in a string", e));
        }
        continue;
      }
      // A raw control byte (a NUL would cut a path short where it is used as a C string): the
      // file is not text or the value is not what its writer meant. \t and the escapes are fine.
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
        error(fmt::format("control character 0x{:02x} in a string", static_cast<unsigned char>(c)));
      }
      out += c;
    }
    return out;
  }

  std::int64_t integer() {
    std::size_t start = i_;
    if (peek() == '-') ++i_;
    while (!at_end() && std::isalnum(static_cast<unsigned char>(s_[i_]))) ++i_;
    std::string_view tok = s_.substr(start, i_ - start);
    std::int64_t v = 0;
    int base = 10;
    std::string_view digits = tok;
    bool neg = false;
    if (!digits.empty() && digits[0] == '-') {
      neg = true;
      digits.remove_prefix(1);
    }
    if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
      base = 16;
      digits.remove_prefix(2);
    }
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
    if (ec != std::errc() || p != digits.data() + digits.size() || digits.empty()) {
      error(fmt::format("'{}' is not a number (strings need quotes)", tok));
    }
    if (base == 10 && digits.size() > 1 && digits[0] == '0') {
      // xl reads such a number as octal (strtol base 0): 0512 is 330 there. Neither reading is
      // safe to guess.
      error(fmt::format("'{}' has a leading zero (xl would read it as octal): write it without", tok));
    }
    return neg ? -v : v;
  }

  XlValue value() {
    skip(false);
    const char c = peek();
    if (c == '"' || c == '\'') return {quoted()};
    if (c == '[') {
      ++i_;
      std::vector<std::string> items;
      while (true) {
        skip(true);
        if (peek() == ']') {
          ++i_;
          break;
        }
        if (peek() != '"' && peek() != '\'') error("list items must be quoted strings");
        items.push_back(quoted());
        skip(true);
        if (peek() == ',') {
          ++i_;
          continue;
        }
        if (peek() == ']') {
          ++i_;
          break;
        }
        error("expected ',' or ']' in a list");
      }
      return {std::move(items)};
    }
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) return {integer()};
    if (at_end() || c == '\n') error("missing value");
    error(fmt::format("unexpected '{}' (strings need quotes)", c));
  }

  // After a value: end of line, ';', or end of input.
  void end_of_setting() {
    skip(false);
    if (at_end()) return;
    if (peek() == ';' || peek() == '\n') {
      if (peek() == '\n') ++line_;
      ++i_;
      return;
    }
    error(fmt::format("unexpected '{}' after the value", peek()));
  }

 private:
  std::string_view s_;
  const std::string& source_;
  std::size_t i_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<XlEntry> parse_xl(std::string_view text, const std::string& source) {
  Lexer lx(text, source);
  std::vector<XlEntry> out;
  std::set<std::string> seen;
  while (true) {
    lx.skip(true);
    while (lx.peek() == ';') {
      lx.expect(';', "';'");
      lx.skip(true);
    }
    if (lx.at_end()) break;
    XlEntry e;
    e.line = lx.line();
    e.key = lx.key();
    if (!seen.insert(e.key).second) lx.error(fmt::format("'{}' is set twice", e.key));
    lx.expect('=', "'=' after '" + e.key + "'");
    e.value = lx.value();
    lx.end_of_setting();
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace xpv::config
