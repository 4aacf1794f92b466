// KickThrottle (xpv/kick_throttle.h): when a frontend's kicks that find nothing new mute its port,
// for how long, and what ends it.
#include "xpv/kick_throttle.h"

#include <gtest/gtest.h>

namespace xpv {
namespace {

TEST(KickThrottle, AStreakOfSpuriousKicksMutesThePortForLongerEachTimeUpToTheCap) {
  KickThrottle k;
  std::uint64_t now = 1'000'000;
  for (std::uint32_t i = 0; i < KickThrottle::kStreak; ++i) k.kicked(false, now);
  EXPECT_FALSE(k.muted(now)) << "a streak of kStreak is not yet a storm";
  EXPECT_EQ(k.mute_left_ms(now), -1);
  EXPECT_EQ(k.mutes(), 0u);
  k.kicked(false, now);
  EXPECT_TRUE(k.muted(now));
  EXPECT_EQ(k.mute_left_ms(now), 1);
  EXPECT_EQ(k.mutes(), 1u);
  EXPECT_TRUE(k.muted(now + KickThrottle::kFirstMuteUs - 1));
  EXPECT_FALSE(k.muted(now + KickThrottle::kFirstMuteUs));
  // Each further spurious kick doubles it: 2, 4, 8, ... ms, then kMaxMuteUs.
  std::uint64_t want = KickThrottle::kFirstMuteUs;
  for (int i = 0; i < 12; ++i) {
    now += 1'000'000;
    k.kicked(false, now);
    want = std::min(want * 2, KickThrottle::kMaxMuteUs);
    EXPECT_TRUE(k.muted(now + want - 1)) << i;
    EXPECT_FALSE(k.muted(now + want)) << i;
    EXPECT_EQ(k.mute_left_ms(now + 1), static_cast<int>((want - 1 + 999) / 1000)) << "rounded up, " << i;
  }
  EXPECT_EQ(want, KickThrottle::kMaxMuteUs);
  for (int i = 0; i < 100; ++i) k.kicked(false, now);  // a long storm: the streak stays bounded
  EXPECT_TRUE(k.muted(now + KickThrottle::kMaxMuteUs - 1));
  EXPECT_FALSE(k.muted(now + KickThrottle::kMaxMuteUs));
}

TEST(KickThrottle, AKickWithNewsEndsTheStreakButNotAMuteAlreadyRunning) {
  KickThrottle k;
  const std::uint64_t now = 5'000;
  for (std::uint32_t i = 0; i <= KickThrottle::kStreak; ++i) k.kicked(false, now);
  ASSERT_TRUE(k.muted(now));
  k.kicked(true, now);  // looked at when the mute ended (or woken by something else)
  EXPECT_EQ(k.streak(), 0u);
  EXPECT_TRUE(k.muted(now)) << "the mute runs out by itself";
  // A new streak starts from the beginning: kStreak more before the next mute.
  const std::uint64_t later = now + KickThrottle::kMaxMuteUs;
  for (std::uint32_t i = 0; i < KickThrottle::kStreak; ++i) k.kicked(false, later);
  EXPECT_FALSE(k.muted(later));
  EXPECT_EQ(k.mutes(), 1u);
  // News in the middle of a streak resets it: a correct frontend's odd race never adds up.
  KickThrottle r;
  for (int round = 0; round < 100; ++round) {
    for (int i = 0; i < 3; ++i) r.kicked(false, now);
    r.kicked(true, now);
  }
  EXPECT_EQ(r.mutes(), 0u);
  EXPECT_FALSE(r.muted(now));
}

}  // namespace
}  // namespace xpv
