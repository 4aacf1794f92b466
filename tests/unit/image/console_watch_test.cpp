// xpv testbed's watch on L1's console (tools/testbed/include/xpv/testbed/console_watch.h).
#include "xpv/testbed/console_watch.h"

#include <gtest/gtest.h>

#include <string>

namespace xpv::testbed {
namespace {

// As L1's console printed it in session 16 (serial lines end in \r\n).
constexpr const char* kReal = "[  308.863341] watchdog: BUG: soft lockup - CPU#1 stuck for 261s! [vcpu1:170]\r";

TEST(SoftLockup, ParsesLinuxsReport) {
  const auto l = parse_soft_lockup(kReal);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->cpu, 1);
  EXPECT_EQ(l->seconds, 261);
  EXPECT_EQ(l->task, "vcpu1:170");
  const auto bare = parse_soft_lockup("watchdog: BUG: soft lockup - CPU#12 stuck for 23s!");
  ASSERT_TRUE(bare.has_value());
  EXPECT_EQ(bare->cpu, 12);
  EXPECT_EQ(bare->seconds, 23);
  EXPECT_EQ(bare->task, "");
}

TEST(SoftLockup, OtherLinesAreNotReports) {
  for (const char* line : {
           "",
           "[    3.484380] rcu: Preemptible hierarchical RCU implementation.",
           "rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
           "watchdog: BUG: soft lockup - CPU# stuck for 261s! [x:1]",   // no CPU number
           "watchdog: BUG: soft lockup - CPU#1 stuck for s! [x:1]",     // no duration
           "watchdog: BUG: soft lockup - CPU#1 stuck for 261 s! [x:1]", // not the kernel's format
           "watchdog: BUG: soft lockup - CPU#1 stuck for 99999999999999999999s!",  // overflows
       }) {
    EXPECT_FALSE(parse_soft_lockup(line).has_value()) << line;
  }
}

TEST(ConsoleWatch, FiresOnceWhenACpuHasBeenStuckForTheLimit) {
  ConsoleWatch w(120);
  EXPECT_FALSE(w.feed("[   30.1] watchdog: BUG: soft lockup - CPU#0 stuck for 23s! [vcpu0:169]\r\n"));
  EXPECT_FALSE(w.feed("[  110.2] watchdog: BUG: soft lockup - CPU#0 stuck for 119s! [vcpu0:169]\r\n"));
  // A report split across reads, after other output.
  EXPECT_FALSE(w.feed("some other line\r\n[  120.7] watchdog: BUG: soft lock"));
  const auto fired = w.feed("up - CPU#1 stuck for 125s! [vcpu1:170]\r\nmore\r\n");
  ASSERT_TRUE(fired.has_value());
  EXPECT_NE(fired->find("CPU#1 stuck for 125 s"), std::string::npos) << *fired;
  EXPECT_NE(fired->find("vcpu1:170"), std::string::npos) << *fired;
  EXPECT_FALSE(w.feed(std::string(kReal) + "\n"));  // once only
}

TEST(ConsoleWatch, AnUnfinishedLineIsNotJudgedYetAndLimitZeroNeverFires) {
  ConsoleWatch w(60);
  EXPECT_FALSE(w.feed("watchdog: BUG: soft lockup - CPU#0 stuck for 61s!"));  // no newline yet
  EXPECT_TRUE(w.feed("\n").has_value());
  ConsoleWatch off(0);
  EXPECT_FALSE(off.feed(std::string(kReal) + "\n"));
  // Endless output without a newline stays bounded and is never a report.
  ConsoleWatch w2(60);
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(w2.feed(std::string(1000, 'x')));
  EXPECT_FALSE(w2.feed("\n"));
}

}  // namespace
}  // namespace xpv::testbed
