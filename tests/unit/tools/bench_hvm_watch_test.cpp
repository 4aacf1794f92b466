// The progress watch of `xpv bench hvm`'s run inside L1 (tools/bench/hvm_watch.h), with made-up
// times: heartbeats while the main thread moves and says nothing, a stuck verdict when it stops
// outside a command, the longer limit inside one, and silence after the verdict.
#include "bench/hvm_watch.h"

#include <gtest/gtest.h>

namespace {

using xpv::bench::hvm::ProgressWatch;
using Kind = ProgressWatch::Verdict::Kind;
using std::chrono::seconds;

const ProgressWatch::Limits kLimits{.heartbeat_s = 60, .stuck_s = 240, .child_stuck_s = 900};
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

TEST(ProgressWatch, ABoundedCommandGetsTheLongerLimit) {
  ProgressWatch w(kLimits, t0);
  w.child_begin("timeout 330 ping -n -q -c 300 ...", t0);
  EXPECT_EQ(w.check(t0 + seconds(300)).kind, Kind::heartbeat);
  EXPECT_EQ(w.check(t0 + seconds(899)).kind, Kind::heartbeat);
  const auto v = w.check(t0 + seconds(900));
  EXPECT_EQ(v.kind, Kind::stuck);
  EXPECT_EQ(v.text, "no progress for 900 s in the command timeout 330 ping -n -q -c 300 ...");
}

TEST(ProgressWatch, TheShortLimitAppliesAgainOnceTheCommandReturned) {
  ProgressWatch w(kLimits, t0);
  w.child_begin("timeout 50 iperf3 ...", t0);
  w.child_end(t0 + seconds(20));
  EXPECT_EQ(w.check(t0 + seconds(259)).kind, Kind::heartbeat);
  const auto v = w.check(t0 + seconds(260));
  EXPECT_EQ(v.kind, Kind::stuck);
  EXPECT_EQ(v.text, "no progress for 240 s at: timeout 50 iperf3 ...");
}

}  // namespace
