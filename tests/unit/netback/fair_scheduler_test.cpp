// FairScheduler alone: exact turn sequences for given backlogs.
#include <gtest/gtest.h>

#include <deque>
#include <string>

#include "xpv/netback/fair_scheduler.h"

namespace xpv::netback {
namespace {

// Drives the scheduler over two queues of packet sizes; returns the turns as "T3 R1 ..." (the
// direction and how many packets it moved), at most `max_turns` turns.
std::string simulate(FairScheduler& s, std::deque<std::size_t> tx, std::deque<std::size_t> rx,
                     int max_turns = 100) {
  std::string out;
  for (int t = 0; t < max_turns; ++t) {
    auto d = s.begin_turn(!tx.empty(), !rx.empty());
    if (!d) break;
    auto& q = *d == Dir::tx ? tx : rx;
    unsigned moved = 0;
    while (!q.empty() && s.may_send()) {
      s.charge(q.front());
      q.pop_front();
      ++moved;
    }
    s.end_turn(!q.empty());
    if (!out.empty()) out += ' ';
    out += (*d == Dir::tx ? "T" : "R") + std::to_string(moved);
  }
  return out;
}

TEST(FairScheduler, IdleWhenNothingIsBacklogged) {
  FairScheduler s;
  EXPECT_FALSE(s.begin_turn(false, false));
  EXPECT_EQ(s.turns(), 0u);
}

TEST(FairScheduler, AlternatesWithBoundedBatches) {
  FairScheduler s({/*quantum_bytes=*/10000, /*max_packets=*/4});
  // 10 small packets each way: 4 per turn (packet cap), strictly alternating, TX first.
  EXPECT_EQ(simulate(s, std::deque<std::size_t>(10, 100), std::deque<std::size_t>(10, 100)),
            "T4 R4 T4 R4 T2 R2");
}

TEST(FairScheduler, BigPacketsCannotStarveSmallOnes) {
  // TX: 64 KiB GSO packets; RX: 1500-byte packets. Equal bytes per turn, not equal packets.
  FairScheduler s({/*quantum_bytes=*/65536, /*max_packets=*/64});
  std::deque<std::size_t> tx(4, 65536), rx(200, 1500);
  EXPECT_EQ(simulate(s, tx, rx, 6), "T1 R44 T1 R44 T1 R44");
}

TEST(FairScheduler, OverdraftIsPaidOnTheNextTurn) {
  FairScheduler s({/*quantum_bytes=*/1000, /*max_packets=*/64});
  // A 2500-byte packet overdraws by 1500: TX's credit is then -1500 + 1000 = -500 on its next
  // turn, so that turn moves nothing; the one after gets 500 and moves one packet again.
  EXPECT_EQ(simulate(s, std::deque<std::size_t>(3, 2500), std::deque<std::size_t>(10, 500), 6),
            "T1 R2 T0 R2 T1 R2");
  EXPECT_EQ(s.credit(Dir::tx), 500 - 2500);
}

TEST(FairScheduler, ALoneDirectionKeepsGoing) {
  FairScheduler s({1000, 2});
  EXPECT_EQ(simulate(s, {}, std::deque<std::size_t>(5, 100)), "R2 R2 R1");
  EXPECT_EQ(simulate(s, std::deque<std::size_t>(3, 100), {}), "T2 T1");
}

TEST(FairScheduler, AnEmptiedDirectionForfeitsItsCredit) {
  FairScheduler s({1000, 64});
  ASSERT_EQ(s.begin_turn(true, false), Dir::tx);
  s.charge(100);
  s.end_turn(/*still_backlogged=*/false);
  EXPECT_EQ(s.credit(Dir::tx), 0);
  ASSERT_EQ(s.begin_turn(true, false), Dir::tx);
  s.charge(100);
  s.end_turn(/*still_backlogged=*/true);
  EXPECT_EQ(s.credit(Dir::tx), 900);
  // Credit never accumulates beyond one quantum.
  ASSERT_EQ(s.begin_turn(true, false), Dir::tx);
  EXPECT_EQ(s.credit(Dir::tx), 1000);
}

TEST(FairScheduler, ATurnCostsItsBytesButAtLeastAPacketsShareOfTheTurnLimits) {
  const FairConfig cfg{/*quantum_bytes=*/256 * 1024, /*max_packets=*/64};
  EXPECT_EQ(turn_cost(64 * 64, 64, cfg), 256u * 1024);  // a turn of 64 small frames: a full turn
  EXPECT_EQ(turn_cost(4 * 65536, 4, cfg), 4u * 65536);  // large frames: their bytes
  EXPECT_EQ(turn_cost(3 * 65536 + 30 * 66, 33, cfg), 3u * 65536 + 30 * 66);  // bulk and ACKs: the bytes
  EXPECT_EQ(turn_cost(30 * 66, 30, cfg), 30u * 4096);  // ACKs alone: 4 KiB each
  EXPECT_EQ(turn_cost(0, 5, cfg), 5u * 4096);          // dropped packets cost their work too
  EXPECT_EQ(turn_cost(0, 0, cfg), 0u);
  EXPECT_EQ(turn_cost(1000, 3, FairConfig{3000, 0}), 1000u);  // no packet limit: bytes only
}

}  // namespace
}  // namespace xpv::netback
