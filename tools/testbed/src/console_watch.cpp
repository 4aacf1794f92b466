// See console_watch.h.
#include "xpv/testbed/console_watch.h"

#include <charconv>

#include <fmt/format.h>

namespace xpv::testbed {

namespace {

// Reads a decimal number at the front of s (advancing it); false if there is none or it overflows.
bool take_int(std::string_view& s, int& out) {
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || p == s.data()) return false;
  s.remove_prefix(static_cast<std::size_t>(p - s.data()));
  return true;
}

bool take(std::string_view& s, std::string_view word) {
  if (s.substr(0, word.size()) != word) return false;
  s.remove_prefix(word.size());
  return true;
}

}  // namespace

std::optional<SoftLockup> parse_soft_lockup(std::string_view line) {
  constexpr std::string_view kMark = "soft lockup - CPU#";
  const auto at = line.find(kMark);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view s = line.substr(at + kMark.size());
  SoftLockup r;
  if (!take_int(s, r.cpu) || !take(s, " stuck for ") || !take_int(s, r.seconds) || !take(s, "s!")) {
    return std::nullopt;
  }
  if (r.cpu < 0 || r.seconds < 0) return std::nullopt;
  if (take(s, " [")) {
    if (const auto end = s.find(']'); end != std::string_view::npos) r.task = std::string(s.substr(0, end));
  }
  return r;
}

std::optional<std::string> ConsoleWatch::feed(std::string_view bytes) {
  if (fired_ || limit_s_ <= 0) return std::nullopt;
  partial_.append(bytes);
  std::optional<std::string> found;
  std::size_t start = 0;
  for (std::size_t nl; !found && (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    const auto l = parse_soft_lockup(std::string_view(partial_).substr(start, nl - start));
    if (l && l->seconds >= limit_s_) {
      found = fmt::format("L1's kernel reports CPU#{} stuck for {} s (soft lockup{}{})", l->cpu, l->seconds,
                          l->task.empty() ? "" : " in ", l->task);
    }
  }
  partial_.erase(0, start);
  // A console line has no business being this long; keep the tail only (bounded memory).
  if (partial_.size() > 4096) partial_.erase(0, partial_.size() - 4096);
  if (found) fired_ = true;
  return found;
}

}  // namespace xpv::testbed
