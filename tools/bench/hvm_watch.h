// Whether `xpv bench hvm`'s run inside L1 still makes progress (the suite's watchdog thread asks).
//
// Session 35 saw that run stop inside L1 with L1 still ticking: no guest console line, no poll of
// it, no file system request from L1 to QEMU for minutes, until the session's 1800 s timeout —
// most likely a request on the 9p share (where the logs and consoles go) that never came back,
// which blocks whoever made it. The main thread tells the watch what it does (`step`, and
// `progress` for each turn of a wait loop); a command it runs is marked with `child_begin` and the
// longest its own timeout(1) lets it run (0: a quick command without one) and `child_end`; what
// it prints is `said`. The watchdog thread calls `check` every few seconds:
//   - heartbeat: nothing said for heartbeat_s while the main thread moves — one line says what it
//     waits for, so `xpv testbed --quiet-limit` sees a live session;
//   - stuck: no progress for stuck_s, or inside a command for its bound plus child_margin_s when
//     that is longer — the caller says so and ends the session, which then runs again;
//   - none: otherwise.
// A stuck verdict wins over a heartbeat that is due too. After it, no more heartbeats: if the
// process cannot end (a thread in an uninterruptible wait), its silence lets --quiet-limit end L1.
// Pure: every time is passed in, so it is unit-tested with made-up times.
#pragma once

#include <chrono>
#include <mutex>
#include <string>

namespace xpv::bench::hvm {

class ProgressWatch {
 public:
  using Clock = std::chrono::steady_clock;
  struct Limits {
    double heartbeat_s = 60;
    double stuck_s = 240;
    double child_margin_s = 60;
  };
  struct Verdict {
    enum Kind { none, heartbeat, stuck } kind = none;
    std::string text;  // for heartbeat and stuck: what the main thread was doing, and for how long
  };

  ProgressWatch(Limits limits, Clock::time_point now);

  void step(const std::string& what, Clock::time_point now);
  // Progress within the current step (a wait loop's turn): keeps its name.
  void progress(Clock::time_point now);
  // bound_s: the longest the command's own timeout lets it run (0: a quick command without one).
  void child_begin(const std::string& what, double bound_s, Clock::time_point now);
  void child_end(Clock::time_point now);
  void said(Clock::time_point now);

  Verdict check(Clock::time_point now);

 private:
  Limits limits_;
  std::mutex mu_;
  std::string what_;
  Clock::time_point since_;     // when the current step began (for the texts)
  Clock::time_point progress_;  // the last sign of life of the main thread
  Clock::time_point said_;
  double child_bound_s_ = -1;  // < 0: not in a command
  bool stuck_ = false;
};

}  // namespace xpv::bench::hvm
