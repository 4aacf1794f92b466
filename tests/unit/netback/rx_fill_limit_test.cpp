// RxFillLimit: how far ahead of the guest netback fills its rx ring (rx_fill_limit.h). Pure
// logic: the clock is the `now` each observation passes.
#include <gtest/gtest.h>

#include "xpv/netback/rx_fill_limit.h"

namespace xpv::netback {
namespace {

constexpr std::size_t kRing = 256, kFloor = 36;
constexpr std::uint64_t kMs = 1000;

// Packets of two flows lately: the limit holds back.
void mixed(RxFillLimit& f) {
  f.saw_flow(1);
  f.saw_flow(2);
}

TEST(RxFillLimit, StartsAtTheWholeRing) {
  RxFillLimit f(kRing, kFloor, true);
  EXPECT_EQ(f.limit(), kRing);
  EXPECT_EQ(f.usable(0), 0u);
  EXPECT_EQ(f.usable(200), 200u);
  EXPECT_EQ(f.posted_needed(18), 18u);
}

TEST(RxFillLimit, NotAdaptiveIsTheWholeRingWhateverTheGuestDoes) {
  RxFillLimit f(kRing, kFloor, false);
  mixed(f);
  EXPECT_FALSE(f.engaged());
  for (std::uint64_t t = 0; t < 20; ++t) {
    f.held_back();
    f.observe(200, false, t * 30 * kMs);
  }
  EXPECT_EQ(f.limit(), kRing);
  EXPECT_EQ(f.usable(56), 56u);
  EXPECT_EQ(f.shrinks() + f.grows(), 0u);
}

TEST(RxFillLimit, ShrinksByTheBacklogTheGuestNeverWorkedOffInAPeriod) {
  RxFillLimit f(kRing, kFloor, true);
  // Looks over 20 ms, the guest never under 120 slots behind: 120 could go.
  f.observe(150, false, 0);
  f.observe(120, false, 10 * kMs);
  EXPECT_EQ(f.limit(), kRing) << "not before the period is over";
  f.observe(130, false, 20 * kMs);
  EXPECT_EQ(f.limit(), kRing - 120);
  EXPECT_EQ(f.shrinks(), 1u);
  mixed(f);
  // 136 slots: of 200 posted buffers, 200 - (256 - 136) = 80 may be filled now.
  EXPECT_EQ(f.usable(200), 80u);
  EXPECT_EQ(f.usable(120), 0u);
  EXPECT_EQ(f.posted_needed(18), 18u + 120u);
}

TEST(RxFillLimit, AGuestThatCatchesUpOnceInAPeriodKeepsTheWholeRing) {
  RxFillLimit f(kRing, kFloor, true);
  for (std::uint64_t t = 0; t < 100; ++t) f.observe(t % 10 == 0 ? 0 : 200, false, t * 2 * kMs);
  EXPECT_EQ(f.limit(), kRing);
  EXPECT_EQ(f.shrinks(), 0u);
}

TEST(RxFillLimit, NeverBelowTheFloor) {
  RxFillLimit f(kRing, kFloor, true);
  for (std::uint64_t t = 0; t < 50; ++t) f.observe(kRing, false, t * 25 * kMs);
  EXPECT_EQ(f.limit(), kFloor);
  mixed(f);
  EXPECT_EQ(f.usable(kRing), kFloor);
  // A floor above the ring is the ring.
  RxFillLimit small(16, kFloor, true);
  for (std::uint64_t t = 0; t < 5; ++t) small.observe(16, false, t * 25 * kMs);
  EXPECT_EQ(small.limit(), 16u);
}

TEST(RxFillLimit, OneFlowAloneIsNeverHeldBack) {
  RxFillLimit f(kRing, kFloor, true);
  for (std::uint64_t t = 0; t < 10; ++t) f.observe(kRing, false, t * 25 * kMs);
  ASSERT_EQ(f.limit(), kFloor);
  EXPECT_FALSE(f.engaged()) << "no packet seen yet";
  f.saw_flow(7);
  EXPECT_FALSE(f.engaged()) << "the first packet changes no flow";
  for (int i = 0; i < 500; ++i) f.saw_flow(7);
  EXPECT_FALSE(f.engaged()) << "one flow: nothing to put ahead of it";
  EXPECT_EQ(f.usable(200), 200u);
  EXPECT_EQ(f.posted_needed(18), 18u);
  // A packet of another flow: held back again for the next kMixedPackets packets.
  f.saw_flow(9);
  EXPECT_TRUE(f.engaged());
  EXPECT_EQ(f.usable(200), 0u) << "220 of the ring's 256 kept back";
  for (std::uint32_t i = 0; i + 1 < RxFillLimit::kMixedPackets; ++i) f.saw_flow(9);
  EXPECT_TRUE(f.engaged());
  f.saw_flow(9);
  EXPECT_FALSE(f.engaged()) << "64 packets of one flow in a row";
  // Flows alternating keep it engaged.
  for (int i = 0; i < 500; ++i) f.saw_flow(i % 3 == 0 ? 1u : 2u);
  EXPECT_TRUE(f.engaged());
  EXPECT_EQ(f.usable(kRing), kFloor);
}

TEST(RxFillLimit, AGuestIdleWhileNetbackHeldPacketsBackDoublesItAtOnce) {
  RxFillLimit f(kRing, kFloor, true);
  for (std::uint64_t t = 0; t < 10; ++t) f.observe(kRing, false, t * 25 * kMs);
  ASSERT_EQ(f.limit(), kFloor);
  std::uint64_t now = 300 * kMs;
  f.held_back();
  f.observe(0, true, now);
  EXPECT_EQ(f.limit(), 2 * kFloor);
  f.held_back();
  f.observe(0, true, now + 1);
  EXPECT_EQ(f.limit(), 4 * kFloor);
  f.held_back();
  f.observe(0, true, now + 2);
  f.held_back();
  f.observe(0, true, now + 3);
  EXPECT_EQ(f.limit(), kRing) << "capped at the ring";
  EXPECT_EQ(f.grows(), 4u);
  EXPECT_EQ(f.holds(), 4u);
}

TEST(RxFillLimit, IdleWithoutAHoldOrAHoldWithoutIdleIsNotStarvation) {
  RxFillLimit f(kRing, kFloor, true);
  for (std::uint64_t t = 0; t < 10; ++t) f.observe(kRing, false, t * 25 * kMs);
  ASSERT_EQ(f.limit(), kFloor);
  std::uint64_t now = 300 * kMs;
  f.observe(0, true, now);  // idle, but nothing was held back: the guest is simply faster
  EXPECT_EQ(f.limit(), kFloor);
  f.held_back();
  f.observe(30, false, now + 1);  // held back while the guest still had work: the limit did its job
  EXPECT_EQ(f.limit(), kFloor);
  f.observe(0, true, now + 2);  // the hold was seen by the look before: not this one's
  EXPECT_EQ(f.limit(), kFloor);
  EXPECT_EQ(f.grows(), 0u);
}

TEST(RxFillLimit, AGrowthStartsANewPeriod) {
  RxFillLimit f(kRing, kFloor, true, 20 * kMs);
  for (std::uint64_t t = 0; t < 10; ++t) f.observe(kRing, false, t * 25 * kMs);
  ASSERT_EQ(f.limit(), kFloor);
  std::uint64_t now = 1000 * kMs;
  f.observe(30, false, now);
  f.held_back();
  f.observe(0, true, now + 19 * kMs);
  ASSERT_EQ(f.limit(), 2 * kFloor);
  // The backlog seen before the growth does not count against the new limit.
  f.observe(60, false, now + 21 * kMs);
  EXPECT_EQ(f.limit(), 2 * kFloor);
  f.observe(50, false, now + 41 * kMs);
  EXPECT_EQ(f.limit(), 2 * kFloor - (2 * kFloor - kFloor)) << "shrinks by min(50, limit - floor)";
}

TEST(RxFillLimit, ABacklogAboveTheRingCountsAsTheRing) {
  RxFillLimit f(kRing, kFloor, true, 0);
  f.observe(1u << 30, false, 0);
  EXPECT_EQ(f.limit(), kFloor);
}

}  // namespace
}  // namespace xpv::netback
