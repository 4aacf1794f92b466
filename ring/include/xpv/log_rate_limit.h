// A small token bucket for log lines a guest or another peer can trigger: at most `burst` lines
// per second per instance; the suppressed ones are counted so the caller can report their number
// with its next line. Used by platform-pci (guest-triggered device logs) and xpv-xenstored (its
// socket clients). Not thread-safe: the owner calls it under its own lock or from its one thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace xpv {

class LogRateLimit {
 public:
  explicit LogRateLimit(std::uint32_t burst = 10) : burst_(burst) {}

  // True if this line may be logged now.
  bool allow() noexcept {
    const auto now = std::chrono::steady_clock::now();
    if (now - window_ >= std::chrono::seconds(1)) {
      window_ = now;
      used_ = 0;
    }
    if (used_ < burst_) {
      ++used_;
      return true;
    }
    ++suppressed_;
    return false;
  }
  // Lines dropped since the last call (the caller mentions them in its next line).
  std::uint64_t take_suppressed() noexcept {
    const std::uint64_t n = suppressed_;
    suppressed_ = 0;
    return n;
  }

 private:
  std::uint32_t burst_;
  std::uint32_t used_ = 0;
  std::uint64_t suppressed_ = 0;
  std::chrono::steady_clock::time_point window_{};
};

}  // namespace xpv
