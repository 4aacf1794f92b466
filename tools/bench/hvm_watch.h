// Whether `xpv bench hvm`'s run inside L1 still makes progress (the suite's watchdog thread asks).
//
// Session 35 saw that run stop inside L1 with L1 still ticking: no guest console line, no poll of
// it, no file system request from L1 to QEMU for minutes, until the session's 1800 s timeout —
// most likely a request on the 9p share (where the logs and consoles go) that never came back,
// which blocks whoever made it. The main thread tells the watch what it does (`step`); commands it
// runs are bounded by timeout(1) and marked as such (`child_begin` / `child_end`); what it prints
// is `said`. The watchdog thread calls `check` every few seconds:
//   - heartbeat: nothing said for heartbeat_s while the main thread moves — one line says what it
//     waits for, so `xpv testbed --quiet-limit` sees a live session;
//   - stuck: no step for stuck_s outside a child (child_stuck_s inside one, whose own timeout has
//     long passed then) — the caller says so and ends the session, which then runs again;
//   - none: otherwise.
// After a stuck verdict no more heartbeats: if the process cannot end (a thread in an
// uninterruptible wait), its silence lets --quiet-limit end L1.
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
    double child_stuck_s = 900;
  };
  struct Verdict {
    enum Kind { none, heartbeat, stuck } kind = none;
    std::string text;  // for heartbeat and stuck: what the main thread was doing, and for how long
  };

  ProgressWatch(Limits limits, Clock::time_point now);

  void step(const std::string& what, Clock::time_point now);
  // Progress within the current step (a wait loop's turn): keeps its name.
  void progress(Clock::time_point now);
  void child_begin(const std::string& what, Clock::time_point now);
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
  bool in_child_ = false;
  bool stuck_ = false;
};

}  // namespace xpv::bench::hvm
