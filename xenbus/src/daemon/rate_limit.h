// A tiny token bucket for logs a peer can trigger: at most `burst` lines per second.
#pragma once

#include <chrono>
#include <cstdint>

namespace xpv::xenbus::daemon {

class RateLimit {
 public:
  explicit RateLimit(std::uint32_t burst = 10) : burst_(burst) {}
  // True if this line may be logged; counts the suppressed ones.
  bool allow() noexcept {
    auto now = std::chrono::steady_clock::now();
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
  std::uint64_t suppressed() const noexcept { return suppressed_; }

 private:
  std::uint32_t burst_;
  std::uint32_t used_ = 0;
  std::uint64_t suppressed_ = 0;
  std::chrono::steady_clock::time_point window_{};
};

}  // namespace xpv::xenbus::daemon
