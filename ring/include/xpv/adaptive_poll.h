// AdaptivePoll — how long a data-plane thread busy-waits for more work before it goes to sleep.
//
// Sleeping on an eventfd costs a notification by the other side (for an HVM guest: a hypercall,
// i.e. a VM exit) and a wake-up here (a context switch). When the next request or completion is
// only microseconds away, looking at the shared ring in a loop for that long is cheaper than
// both. The window adapts, as QEMU's aio polling does (poll-max-ns):
//   - a sleep that ended sooner than `max` after the spin began: the work came shortly after the
//     spin gave up, so spinning longer would have caught it → double the window (from 4 µs);
//   - a sleep longer than `max`: the queue is idle, spinning only burns CPU → halve the window
//     (below 4 µs: 0, no spinning at all);
//   - `max` = 0: never spin.
// While the thread spins it leaves the other side's notification off (for a ring: it does not
// re-arm req_event), so the other side does not pay for a kick either; that is the caller's job.
//
// Threading: no lock of its own. A data-plane thread owns one (xpv-blkback's queues); threads
// that share one guard it with their own lock and spin with spin_until() outside it (the
// process-domain BlkfrontQueue).
#pragma once

#include <sched.h>

#include <chrono>
#include <cstdint>

namespace xpv {

class AdaptivePoll {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::nanoseconds kStart{4000};

  explicit AdaptivePoll(std::chrono::nanoseconds max = std::chrono::nanoseconds{0}) noexcept : max_(max) {}

  std::chrono::nanoseconds window() const noexcept { return window_; }

  // Spins until ready() returns true (→ true) or the window has passed (→ false). Records when the
  // spin began so that after_sleep() can tell how long the whole wait was.
  template <class Ready>
  bool spin(Ready&& ready) {
    began_ = Clock::now();
    if (window_.count() == 0) return ready();
    const bool hit = spin_until(began_ + window_, ready);
    ++(hit ? hits_ : misses_);
    return hit;
  }

  // Calls ready() until it returns true (→ true) or `until` has passed (→ ready()'s last word).
  // Every 16 looks the thread also offers its CPU (sched_yield): a spinner must not keep the
  // thread it waits for — or the one that will send the next request — off a core (these
  // machines have two).
  template <class Ready>
  static bool spin_until(Clock::time_point until, Ready&& ready) {
    for (std::uint32_t i = 0;; ++i) {
      if (ready()) return true;
      __builtin_ia32_pause();
      if ((i & 15) == 15) {
        if (Clock::now() >= until) return ready();
        ::sched_yield();
      }
    }
  }

  // After the blocking wait that followed a failed spin(): adjusts the window (see above).
  void after_sleep() noexcept { adjust(Clock::now() - began_); }

  // The rule itself, on the length of one whole wait (spin + sleep); exposed for unit tests.
  void adjust(std::chrono::nanoseconds waited) noexcept {
    if (max_.count() == 0) {
      window_ = {};
      return;
    }
    if (waited <= window_) return;  // the spin would have seen it: nothing to learn
    if (waited > max_) {
      window_ /= 2;
      if (window_ < kStart) window_ = {};
    } else if (window_ < max_) {
      window_ = window_.count() == 0 ? kStart : window_ * 2;
      if (window_ > max_) window_ = max_;
    }
  }

  std::uint64_t hits() const noexcept { return hits_; }
  std::uint64_t misses() const noexcept { return misses_; }

 private:
  std::chrono::nanoseconds max_;
  std::chrono::nanoseconds window_{0};
  Clock::time_point began_{};
  std::uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace xpv
