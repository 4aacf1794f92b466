// AdaptivePoll: the window rule (grow on short waits, shrink on long ones, never past max) and
// spin()'s two outcomes.
#include "xpv/adaptive_poll.h"

#include <gtest/gtest.h>

#include <chrono>

namespace {

using namespace std::chrono_literals;
using xpv::AdaptivePoll;

TEST(AdaptivePoll, StartsWithoutSpinningAndGrowsOnShortWaitsUpToMax) {
  AdaptivePoll p(32us);
  EXPECT_EQ(p.window(), 0ns);
  p.adjust(10us);  // came 10 µs after we started waiting: spinning would have paid off
  EXPECT_EQ(p.window(), AdaptivePoll::kStart);
  p.adjust(10us);
  EXPECT_EQ(p.window(), 8us);
  p.adjust(20us);
  EXPECT_EQ(p.window(), 16us);
  p.adjust(30us);
  EXPECT_EQ(p.window(), 32us);
  p.adjust(31us);
  EXPECT_EQ(p.window(), 32us) << "never above max";
}

TEST(AdaptivePoll, ShrinksOnLongWaitsToNothing) {
  AdaptivePoll p(32us);
  for (int i = 0; i < 4; ++i) p.adjust(20us);
  ASSERT_EQ(p.window(), 32us);
  p.adjust(1ms);  // idle: spinning was wasted
  EXPECT_EQ(p.window(), 16us);
  p.adjust(1ms);
  EXPECT_EQ(p.window(), 8us);
  p.adjust(1ms);
  EXPECT_EQ(p.window(), 4us);
  p.adjust(1ms);
  EXPECT_EQ(p.window(), 0ns) << "below the start value the thread stops spinning";
}

TEST(AdaptivePoll, AWaitTheSpinWouldHaveCoveredChangesNothing) {
  AdaptivePoll p(32us);
  for (int i = 0; i < 3; ++i) p.adjust(10us);
  ASSERT_EQ(p.window(), 16us);
  p.adjust(16us);
  EXPECT_EQ(p.window(), 16us);
}

TEST(AdaptivePoll, MaxZeroNeverSpins) {
  AdaptivePoll p(0ns);
  p.adjust(1us);
  EXPECT_EQ(p.window(), 0ns);
  int calls = 0;
  EXPECT_FALSE(p.spin([&] { return ++calls > 100; }));
  EXPECT_EQ(calls, 1) << "with no window, readiness is looked at once";
}

TEST(AdaptivePoll, SpinReturnsAsSoonAsReadyAndGivesUpAfterTheWindow) {
  AdaptivePoll p(1ms);
  for (int i = 0; i < 12; ++i) p.adjust(999us);
  ASSERT_EQ(p.window(), 1ms);
  int calls = 0;
  EXPECT_TRUE(p.spin([&] { return ++calls == 5; }));
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(p.hits(), 1u);
  const auto t0 = AdaptivePoll::Clock::now();
  EXPECT_FALSE(p.spin([] { return false; }));
  EXPECT_GE(AdaptivePoll::Clock::now() - t0, 1ms) << "a miss spins for the whole window";
  EXPECT_EQ(p.misses(), 1u);
}

}  // namespace
