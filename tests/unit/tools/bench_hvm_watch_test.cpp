// The progress watch of `xpv bench hvm`'s run inside L1 (tools/bench/hvm_watch.h), with made-up
// times: heartbeats while the main thread moves and says nothing, a stuck verdict when it stops
// outside a command, a command's own bound (plus a margin) inside one, and silence after the
// verdict.
#include "bench/hvm_watch.h"

#include <gtest/gtest.h>

namespace {

using xpv::bench::hvm::ProgressWatch;
using Kind = ProgressWatch::Verdict::Kind;
using std::chrono::seconds;

const ProgressWatch::Limits kLimits{.heartbeat_s = 60, .stuck_s = 240, .child_margin_s = 60};
const ProgressWatch::Clock::time_point t0{};

TEST(ProgressWatch, AMovingMainThreadThatSaysNothingGetsAHeartbeatAMinute) {
  ProgressWatch w(kLimits, t0);
  w.step("waiting for 'XPV-PHASE bonnie-1 end'", t0);
  EXPECT_EQ(w.check(t0 + seconds(30)).kind, Kind::none);
  w.progress(t0 + seconds(59));
  const auto v = w.check(t0 + seconds(60));
  EXPECT_EQ(v.kind, Kind::heartbeat);
  EXPECT_EQ(v.text, "still at: waiting for 'XPV-PHASE bonnie-1 end' (60 s)");
  // The heartbeat counts as said: the next one a minute later, not at the next check.
  w.progress(t0 + seconds(61));
  EXPECT_EQ(w.check(t0 + seconds(61)).kind, Kind::none);
  w.progress(t0 + seconds(119));
  EXPECT_EQ(w.check(t0 + seconds(120)).kind, Kind::heartbeat);
}

TEST(ProgressWatch, WhatTheMainThreadSaysPutsTheHeartbeatOff) {
  ProgressWatch w(kLimits, t0);
  w.step("a step", t0);
  w.said(t0 + seconds(50));
  w.progress(t0 + seconds(100));
  EXPECT_EQ(w.check(t0 + seconds(100)).kind, Kind::none);
  EXPECT_EQ(w.check(t0 + seconds(110)).kind, Kind::heartbeat);
}

TEST(ProgressWatch, AMainThreadThatStopsOutsideACommandIsStuckOnceAndThenSilent) {
  ProgressWatch w(kLimits, t0);
  w.step("waiting for 'XPV-PHASE bonnie-1 begin'", t0);
  w.progress(t0 + seconds(10));
  // Heartbeats go on while the stop is younger than the limit (the watch cannot tell a slow turn
  // from a stop yet).
  EXPECT_EQ(w.check(t0 + seconds(70)).kind, Kind::heartbeat);
  EXPECT_EQ(w.check(t0 + seconds(249)).kind, Kind::heartbeat);
  const auto v = w.check(t0 + seconds(250));
  EXPECT_EQ(v.kind, Kind::stuck);
  EXPECT_EQ(v.text, "no progress for 240 s at: waiting for 'XPV-PHASE bonnie-1 begin'");
  // Nothing more, not even heartbeats: a process that cannot end must fall silent.
  EXPECT_EQ(w.check(t0 + seconds(400)).kind, Kind::none);
  w.progress(t0 + seconds(500));
  EXPECT_EQ(w.check(t0 + seconds(600)).kind, Kind::none);
}

TEST(ProgressWatch, ACommandGetsItsOwnBoundPlusTheMargin) {
  ProgressWatch w(kLimits, t0);
  w.child_begin("timeout -k 10 330 ping -n -q -c 300 ...", 340, t0);
  EXPECT_EQ(w.check(t0 + seconds(300)).kind, Kind::heartbeat);
  EXPECT_EQ(w.check(t0 + seconds(399)).kind, Kind::heartbeat);
  const auto v = w.check(t0 + seconds(400));
  EXPECT_EQ(v.kind, Kind::stuck);
  EXPECT_EQ(v.text, "no progress for 400 s in the command timeout -k 10 330 ping -n -q -c 300 ...");
}

TEST(ProgressWatch, AQuickCommandOrAShortBoundKeepsTheMainLimit) {
  // cp over the 9p share has no timeout of its own; a 10 s iperf3 (timeout 50, SIGKILL 10 s
  // later: 60 s) is shorter than the limit.
  for (const double bound : {0.0, 60.0}) {
    ProgressWatch w(kLimits, t0);
    w.child_begin("cp --sparse=always ...", bound, t0);
    EXPECT_EQ(w.check(t0 + seconds(239)).kind, Kind::heartbeat) << bound;
    EXPECT_EQ(w.check(t0 + seconds(240)).kind, Kind::stuck) << bound;
  }
}

TEST(ProgressWatch, AfterACommandTheMainLimitAppliesAndTheTextSaysAfter) {
  ProgressWatch w(kLimits, t0);
  w.child_begin("timeout -k 10 180 xpv create ...", 190, t0);
  w.child_end(t0 + seconds(20));
  EXPECT_EQ(w.check(t0 + seconds(259)).kind, Kind::heartbeat);
  const auto v = w.check(t0 + seconds(260));
  EXPECT_EQ(v.kind, Kind::stuck);
  EXPECT_EQ(v.text, "no progress for 240 s at: after the command timeout -k 10 180 xpv create ...");
}

TEST(ProgressWatch, AStepAfterACommandStartsTheMainLimitAgain) {
  ProgressWatch w(kLimits, t0);
  w.child_begin("timeout -k 10 330 ping ...", 340, t0);
  w.step("waiting for 'XPV-DONE iperf3 rc=0'", t0 + seconds(10));
  EXPECT_EQ(w.check(t0 + seconds(250)).kind, Kind::stuck);
}

TEST(ProgressWatch, WhatIsSaidDuringACommandCountsAndAStuckVerdictWinsOverADueHeartbeat) {
  ProgressWatch w(kLimits, t0);
  w.child_begin("timeout -k 10 190 xpv destroy ...", 200, t0);
  w.said(t0 + seconds(200));
  EXPECT_EQ(w.check(t0 + seconds(259)).kind, Kind::none);
  // At 260 s both are due: nothing said for 60 s, and the command's 200 + 60 s are up.
  const auto v = w.check(t0 + seconds(260));
  EXPECT_EQ(v.kind, Kind::stuck);
}

}  // namespace
