// CreditLimiter (the vif `rate` node) with an explicit clock.
#include <gtest/gtest.h>

#include "xpv/netback/rate_limiter.h"

namespace xpv::netback {
namespace {

TEST(CreditLimiter, UnlimitedByDefault) {
  CreditLimiter l;
  EXPECT_TRUE(l.unlimited());
  EXPECT_TRUE(l.consume(1 << 30, 0));
  EXPECT_TRUE(CreditLimiter(1000, 0).unlimited());
}

TEST(CreditLimiter, CreditPerWindow) {
  CreditLimiter l(10000, 1000);  // 10 kB per ms
  EXPECT_TRUE(l.consume(6000, 0));
  EXPECT_TRUE(l.consume(4000, 10));
  EXPECT_FALSE(l.consume(1, 999));       // window not over
  EXPECT_EQ(l.next_window_us(), 1000u);
  EXPECT_TRUE(l.consume(10000, 1000));   // replenished at the window's end
  EXPECT_EQ(l.credit(), 0u);
  EXPECT_FALSE(l.consume(1500, 1500));
  EXPECT_EQ(l.next_window_us(), 2000u);  // the window restarted at 1000
}

TEST(CreditLimiter, CreditAccumulatesUpToTheBurstCap) {
  CreditLimiter l(100000, 1000);
  // Idle windows add credit, capped at max(bytes, 128 KiB) = 131072.
  EXPECT_TRUE(l.consume(0, 0));
  EXPECT_TRUE(l.consume(1, 1000));
  EXPECT_EQ(l.credit(), 131071u);
  EXPECT_TRUE(l.consume(100, 5000));
  EXPECT_EQ(l.credit(), 130972u);  // 131071 + 100000, capped at 131072, minus 100
}

TEST(CreditLimiter, ASmallRateStillPassesA64KiBPacket) {
  CreditLimiter l(1000, 1000);  // 1 kB per ms: a 64 KiB packet needs the burst allowance
  EXPECT_FALSE(l.consume(65536, 0));
  int windows = 0;
  std::uint64_t now = 0;
  while (!l.consume(65536, now) && windows < 200) {
    now = l.next_window_us();
    ++windows;
  }
  EXPECT_EQ(windows, 65);  // 1000 initial + 65 windows of 1000 = 66000 >= 65536
}

}  // namespace
}  // namespace xpv::netback
