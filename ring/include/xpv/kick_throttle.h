// KickThrottle — how a backend's data-plane thread stops a frontend that kicks its event channel
// with nothing new in the ring from keeping that thread (a host CPU) busy.
//
// A kick costs the guest one trapped (or, with fast sends, in-kernel) port write and costs the
// backend a wake-up and a look at the ring. A guest that sends on the port in a loop without
// posting anything would have the backend thread wake as fast as it can, for ever: the denial of
// service Xen closed with late EOIs (XSA-332; Linux's events_base.c delays the EOI of an event
// channel whose events keep finding nothing, up to a second). Here, the same idea on the wake-up:
//   - a wake-up by the kick after a real sleep (the thread had looked, found nothing and asked
//     for a kick) that finds the ring unchanged is spurious; any kick that finds news ends the
//     streak;
//   - after kStreak spurious ones in a row the port is muted — left out of the thread's poll set
//     — for kFirstMute, doubled at each further spurious one up to kMaxMute; the kicks that come
//     meanwhile are not lost (the eventfd counts them) and are looked at when the mute ends.
// A well-behaved frontend kicks only when the backend asked for it (req_event) and it posted
// something: at most the odd race is spurious, never kStreak in a row. So the mute costs only a
// misbehaving guest, and only the latency of its own queue. kStreak is far above Linux's two so
// that no race pattern of a correct frontend ever reaches it.
//
// Threading: none; one data-plane thread owns one per event channel.
#pragma once

#include <algorithm>
#include <cstdint>

namespace xpv {

class KickThrottle {
 public:
  static constexpr std::uint32_t kStreak = 64;
  static constexpr std::uint64_t kFirstMuteUs = 1000;
  static constexpr std::uint64_t kMaxMuteUs = 100'000;

  // After a wake-up by this port's kick following a real sleep: `news` = the ring holds what it
  // did not before the sleep. Mutes the port from `now_us` when the streak has grown long enough.
  void kicked(bool news, std::uint64_t now_us) noexcept {
    if (news) {
      streak_ = 0;
      return;
    }
    if (streak_ < kStreak + 32) ++streak_;  // bounded: the shift below stays small
    if (streak_ <= kStreak) return;
    const std::uint64_t mute = std::min(kMaxMuteUs, kFirstMuteUs << std::min<std::uint32_t>(streak_ - kStreak - 1, 16));
    until_us_ = now_us + mute;
    ++mutes_;
  }

  // Whether the port stays out of the poll set at `now_us`.
  bool muted(std::uint64_t now_us) const noexcept { return now_us < until_us_; }
  // Milliseconds (rounded up) until the mute ends, for poll's timeout; -1 when not muted.
  int mute_left_ms(std::uint64_t now_us) const noexcept {
    if (!muted(now_us)) return -1;
    return static_cast<int>((until_us_ - now_us + 999) / 1000);
  }
  std::uint32_t streak() const noexcept { return streak_; }
  // How many times the port was muted (a counter for the backend's statistics).
  std::uint64_t mutes() const noexcept { return mutes_; }

 private:
  std::uint32_t streak_ = 0;
  std::uint64_t until_us_ = 0;
  std::uint64_t mutes_ = 0;
};

}  // namespace xpv
