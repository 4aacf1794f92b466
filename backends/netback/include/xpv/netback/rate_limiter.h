// CreditLimiter — the vif `rate` node (`bytes,usec`: at most `bytes` per `usec` window) applied to
// guest TX, with the semantics of Linux netback's credit scheduler:
//  - credit is replenished when a window has passed since the window started (the window then
//    restarts at that moment); a replenish adds `bytes`, and the credit held is capped at
//    max(bytes, 128 KiB) so that a 64 KiB GSO packet can always pass eventually, however small
//    the configured rate;
//  - a packet larger than the credit waits for the next window (the queue sets a timer at
//    next_window_us() and leaves the request on the ring).
// Pure logic with the clock passed in (microseconds, any monotonic origin), so tests are exact.
// One data-plane thread; not thread-safe. bytes == 0 or usec == 0: unlimited.
#pragma once

#include <algorithm>
#include <cstdint>

namespace xpv::netback {

class CreditLimiter {
 public:
  static constexpr std::uint64_t kMinBurst = 128 * 1024;

  CreditLimiter() = default;
  CreditLimiter(std::uint64_t bytes, std::uint64_t usec) noexcept
      : bytes_(bytes), usec_(usec), credit_(bytes) {}

  bool unlimited() const noexcept { return bytes_ == 0 || usec_ == 0; }

  // Charges `size` bytes if the credit allows it now; false: wait until next_window_us().
  bool consume(std::uint64_t size, std::uint64_t now_us) noexcept {
    if (unlimited()) return true;
    if (!started_) {
      started_ = true;
      window_start_ = now_us;
    }
    if (now_us - window_start_ >= usec_) {
      window_start_ = now_us;
      const std::uint64_t cap = std::max(kMinBurst, bytes_);
      credit_ = std::min(cap, credit_ + std::min(bytes_, cap));
    }
    if (size > credit_) return false;
    credit_ -= size;
    return true;
  }
  std::uint64_t next_window_us() const noexcept { return window_start_ + usec_; }
  std::uint64_t credit() const noexcept { return credit_; }

 private:
  std::uint64_t bytes_ = 0, usec_ = 0;
  std::uint64_t credit_ = 0;
  std::uint64_t window_start_ = 0;
  bool started_ = false;
};

}  // namespace xpv::netback
