// FlowSteering: the flow key (both directions one flow) and the rule that spreads busy flows
// over a vif's queues (flow_steering.h). Times are the caller's: synthetic microseconds here.
#include "xpv/netback/flow_steering.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

namespace xpv::netback {
namespace {

// An Ethernet frame: IPv4 (or IPv6 with `v6`) carrying protocol `proto` from src:sport to
// dst:dport; addresses are the last byte of 10.0.0.x (fd00::x).
std::vector<std::uint8_t> frame(std::uint8_t src, std::uint16_t sport, std::uint8_t dst, std::uint16_t dport,
                                std::uint8_t proto = 6, bool v6 = false, std::size_t len = 80) {
  std::vector<std::uint8_t> f(len, 0);
  std::size_t l4 = 0;
  if (v6) {
    f[12] = 0x86;
    f[13] = 0xdd;
    f[14] = 0x60;
    f[14 + 6] = proto;
    f[14 + 8] = 0xfd;
    f[14 + 8 + 15] = src;
    f[14 + 24] = 0xfd;
    f[14 + 24 + 15] = dst;
    l4 = 14 + 40;
  } else {
    f[12] = 0x08;
    f[13] = 0x00;
    f[14] = 0x45;
    f[14 + 9] = proto;
    const std::array<std::uint8_t, 4> s{10, 0, 0, src}, d{10, 0, 0, dst};
    std::memcpy(&f[14 + 12], s.data(), 4);
    std::memcpy(&f[14 + 16], d.data(), 4);
    l4 = 14 + 20;
  }
  f[l4] = static_cast<std::uint8_t>(sport >> 8);
  f[l4 + 1] = static_cast<std::uint8_t>(sport);
  f[l4 + 2] = static_cast<std::uint8_t>(dport >> 8);
  f[l4 + 3] = static_cast<std::uint8_t>(dport);
  return f;
}

std::uint64_t key(const std::vector<std::uint8_t>& f) {
  auto k = FlowSteering::flow_key(f);
  EXPECT_TRUE(k);
  return k.value_or(0);
}

TEST(FlowSteering, BothDirectionsOfAFlowHaveOneKeyAndOtherFlowsAnother) {
  const auto out = frame(2, 40000, 1, 5201), back = frame(1, 5201, 2, 40000);
  EXPECT_EQ(key(out), key(back));
  EXPECT_NE(key(out), key(frame(2, 40001, 1, 5201)));       // another source port
  EXPECT_NE(key(out), key(frame(2, 40000, 1, 5201, 17)));   // UDP, same ports
  EXPECT_NE(key(out), key(frame(3, 40000, 1, 5201)));       // another address
  EXPECT_EQ(key(frame(2, 40000, 1, 5201, 6, true)), key(frame(1, 5201, 2, 40000, 6, true)));
  EXPECT_NE(key(frame(2, 40000, 1, 5201, 6, true)), key(out));
  // An 802.1Q tag in front of the same flow: its key.
  auto tagged = out;
  tagged.insert(tagged.begin() + 12, {0x81, 0x00, 0x00, 0x05});
  EXPECT_EQ(key(tagged), key(out));
}

TEST(FlowSteering, AnIpv6FlowBehindAnExtensionHeaderHasItsPorts) {
  // A hop-by-hop header (8 bytes) between the IPv6 header and TCP.
  auto with_hbh = [](std::uint8_t src, std::uint16_t sport, std::uint8_t dst, std::uint16_t dport) {
    auto f = frame(src, sport, dst, dport, 6, true, 88);
    f.insert(f.begin() + 14 + 40, {6, 0, 0, 0, 0, 0, 0, 0});  // next: TCP, length 8
    f[14 + 6] = 0;                                          // IPv6 next: hop-by-hop
    f.resize(88);
    return f;
  };
  EXPECT_EQ(key(with_hbh(2, 40000, 1, 5201)), key(with_hbh(1, 5201, 2, 40000)));
  EXPECT_NE(key(with_hbh(2, 40000, 1, 5201)), key(with_hbh(2, 40001, 1, 5201)));
  EXPECT_EQ(key(with_hbh(2, 40000, 1, 5201)), key(frame(2, 40000, 1, 5201, 6, true)))
      << "the same flow, with or without the extension header";
}

TEST(FlowSteering, WhatIsNotATcpOrUdpFlowHasNoKey) {
  EXPECT_FALSE(FlowSteering::flow_key(frame(2, 1, 1, 2, 1)));  // ICMP
  auto arp = frame(2, 1, 1, 2);
  arp[12] = 0x08;
  arp[13] = 0x06;
  EXPECT_FALSE(FlowSteering::flow_key(arp));
  auto fragment = frame(2, 40000, 1, 5201);
  fragment[14 + 7] = 0x10;  // offset 16 x 8 bytes
  EXPECT_FALSE(FlowSteering::flow_key(fragment));
  const auto whole = frame(2, 40000, 1, 5201);
  EXPECT_FALSE(FlowSteering::flow_key(std::span(whole).first(14 + 20 + 2)));  // ports cut off
  EXPECT_FALSE(FlowSteering::flow_key(std::span(whole).first(10)));
  auto bad_version = whole;
  bad_version[14] = 0x65;
  EXPECT_FALSE(FlowSteering::flow_key(bad_version));
}

FlowSteeringConfig two_queues() {
  FlowSteeringConfig c;
  c.queues = 2;
  c.period_us = 100;
  c.heavy_bytes = 1000;
  c.hold_us = 1000;
  c.idle_us = 5000;
  return c;
}

// The shared-queue pair: the guest sends flow A's data and flow B's ACKs on queue 0, and B's
// data (and A's ACKs) come back on queue 0.
TEST(FlowSteering, TwoBusyFlowsOnOneQueueAreSpreadOverAnIdleOne) {
  FlowSteering s(two_queues());
  const std::uint64_t a = 1, b = 2;
  EXPECT_EQ(s.on_tx(a, 0, 3000, 0), 0u);  // new flows: where they came from
  EXPECT_EQ(s.on_tx(b, 0, 60, 10), 0u);
  s.on_rx(b, 0, 9000, 20);
  s.on_rx(a, 0, 60, 30);
  EXPECT_EQ(s.moves(), 0u);
  // The period is over: both busy on queue 0, queue 1 idle -> the busiest (B) is moved.
  EXPECT_EQ(s.on_tx(b, 0, 60, 100), 1u);
  EXPECT_EQ(s.moves(), 1u);
  EXPECT_EQ(s.on_tx(a, 0, 3000, 110), 0u) << "the other stays";
  EXPECT_EQ(s.on_tx(b, 0, 60, 120), 1u) << "and the moved one stays moved";
}

// What a move moves is a flow's host->guest side: of two busy flows sharing a queue, the one
// receiving goes, however much more the sending one wrote — moving that one would move only its
// ACKs. Two flows that both mostly send are left alone.
TEST(FlowSteering, TheFlowMovedIsTheOneWithTheMostHostToGuestBytes) {
  FlowSteering s(two_queues());
  const std::uint64_t up = 1, down = 2;
  EXPECT_EQ(s.on_tx(up, 0, 20000, 0), 0u);  // the guest's upload: data out, ACKs in
  s.on_rx(up, 0, 300, 5);
  EXPECT_EQ(s.on_tx(down, 0, 300, 10), 0u);  // its download: ACKs out, data in
  s.on_rx(down, 0, 9000, 15);
  auto u = s.flow(up);
  ASSERT_TRUE(u);
  EXPECT_EQ(u->bytes, 20300u);
  EXPECT_EQ(u->rx_bytes, 300u);
  EXPECT_EQ(s.on_tx(down, 0, 300, 100), 1u) << "the download moved";
  EXPECT_EQ(s.on_tx(up, 0, 20000, 110), 0u) << "the upload stays";
  EXPECT_EQ(s.moves(), 1u);

  // Two uploads whose ACKs alone are busy (2000 bytes a period, heavy_bytes 1000): still left
  // alone, each sends more than it receives.
  FlowSteering two_uploads(two_queues());
  for (std::uint64_t t = 0; t < 3000; t += 10) {
    EXPECT_EQ(two_uploads.on_tx(1, 0, 20000, t), 0u);
    EXPECT_EQ(two_uploads.on_tx(2, 0, 20000, t + 1), 0u);
    two_uploads.on_rx(1, 0, 200, t + 2);
    two_uploads.on_rx(2, 0, 200, t + 3);
  }
  EXPECT_EQ(two_uploads.moves(), 0u);
  // A request/response flow that receives as much as it sends may move.
  FlowSteering even(two_queues());
  for (std::uint64_t t = 0; t <= 100; t += 10) {
    EXPECT_EQ(even.on_tx(1, 0, 20000, t), 0u);
    even.on_rx(1, 0, 200, t + 2);
    even.on_tx(2, 0, 3000, t + 3);
    even.on_rx(2, 0, 3000, t + 4);
  }
  EXPECT_EQ(even.moves(), 1u);
  EXPECT_EQ(even.on_tx(2, 0, 3000, 110), 1u);
}

// Until netback moves a flow, each packet goes where the guest sent it (Linux netfront may pick
// another queue for a flow, e.g. a server's SYN-ACK and its later data), as without steering.
TEST(FlowSteering, UntilMovedAFlowFollowsTheGuestsQueue) {
  FlowSteering s(two_queues());
  EXPECT_EQ(s.on_tx(5, 0, 60, 0), 0u);
  EXPECT_EQ(s.on_tx(5, 1, 60, 10), 1u);
  EXPECT_EQ(s.on_tx(5, 0, 60, 20), 0u);
  // Moved, it stays where netback put it whatever queue its packets come on.
  s.on_rx(6, 0, 9000, 30);
  EXPECT_EQ(s.on_tx(6, 0, 60, 40), 0u);
  EXPECT_EQ(s.on_tx(5, 0, 3000, 50), 0u);
  EXPECT_EQ(s.on_tx(6, 0, 60, 100), 1u);
  EXPECT_EQ(s.moves(), 1u);
  EXPECT_EQ(s.on_tx(6, 0, 60, 110), 1u);
  EXPECT_EQ(s.on_tx(6, 1, 60, 120), 1u);
}

TEST(FlowSteering, ALoneBusyFlowIsNeverMoved) {
  FlowSteering s(two_queues());
  for (std::uint64_t t = 0; t < 3000; t += 10) {
    EXPECT_EQ(s.on_tx(7, 1, 60, t), 1u);
    s.on_rx(7, 1, 9000, t + 5);
    s.on_rx(8, 1, 30, t + 6);  // a light flow on the same queue (600 bytes a period)
    EXPECT_EQ(s.on_tx(8, 1, 30, t + 7), 1u);
  }
  EXPECT_EQ(s.moves(), 0u);
}

TEST(FlowSteering, NothingMovesWhileEveryQueueHasABusyFlow) {
  FlowSteering s(two_queues());
  for (std::uint64_t t = 0; t < 3000; t += 10) {
    s.on_rx(1, 0, 5000, t);
    s.on_rx(2, 0, 5000, t);
    s.on_rx(3, 1, 5000, t);
    EXPECT_EQ(s.on_tx(1, 0, 60, t + 1), 0u);
    EXPECT_EQ(s.on_tx(2, 0, 60, t + 1), 0u);
  }
  EXPECT_EQ(s.moves(), 0u);
}

TEST(FlowSteering, AFlowNetbackNeverWroteIsNotMoved) {
  FlowSteering s(two_queues());  // two busy host->guest UDP streams on queue 0, nothing back
  for (std::uint64_t t = 0; t < 3000; t += 10) {
    s.on_rx(1, 0, 5000, t);
    s.on_rx(2, 0, 5000, t);
  }
  EXPECT_EQ(s.moves(), 0u);
}

// Three busy flows on queue 0 of three: one move per hold time, each to an idle queue.
TEST(FlowSteering, MovesWaitForTheHoldTime) {
  FlowSteeringConfig c = two_queues();
  c.queues = 3;
  FlowSteering s(c);
  unsigned q[4] = {0, 0, 0, 0};  // where each flow is written, as the kernel then returns it
  auto round = [&](std::uint64_t t) {
    for (std::uint64_t f = 1; f <= 3; ++f) {
      s.on_rx(f, q[f], 4000 + 1000 * f, t);
      q[f] = s.on_tx(f, 0, 60, t + 1);
    }
  };
  for (std::uint64_t t = 0; t <= 100; t += 10) round(t);
  EXPECT_EQ(s.moves(), 1u);
  EXPECT_EQ(q[3], 1u) << "the busiest went to the first idle queue";
  for (std::uint64_t t = 110; t < 1100; t += 10) round(t);
  EXPECT_EQ(s.moves(), 1u) << "no second move within the hold time";
  for (std::uint64_t t = 1100; t <= 1300; t += 10) round(t);
  EXPECT_EQ(s.moves(), 2u);
  EXPECT_EQ(q[2], 2u);
  EXPECT_EQ(q[1], 0u);
  for (std::uint64_t t = 1310; t <= 4000; t += 10) round(t);
  EXPECT_EQ(s.moves(), 2u) << "one busy flow per queue: settled";
}

TEST(FlowSteering, IdleFlowsAreForgottenAndTheTableIsBounded) {
  FlowSteeringConfig c = two_queues();
  c.max_flows = 2;
  FlowSteering s(c);
  EXPECT_EQ(s.on_tx(1, 1, 60, 0), 1u);
  EXPECT_EQ(s.on_tx(2, 0, 60, 0), 0u);
  EXPECT_EQ(s.on_tx(3, 1, 60, 0), 1u) << "no room: written where it came from";
  EXPECT_EQ(s.flows(), 2u);
  s.on_rx(1, 1, 60, 4000);
  s.on_rx(1, 1, 60, 6000);  // a look: flow 2 unseen for 6000 us
  EXPECT_EQ(s.flows(), 1u);
}

TEST(FlowSteering, ACallerWhoseClockReadCameEarlierStartsNoPeriodAndForgetsNothing) {
  FlowSteering s(two_queues());
  s.on_rx(1, 0, 60, 10'000);
  s.on_rx(2, 0, 60, 9'999);  // a caller whose clock read came a little earlier
  EXPECT_EQ(s.flows(), 2u) << "neither flow looks idle for ages";
}

TEST(FlowSteering, ABadConfigIsRefused) {
  FlowSteeringConfig c;
  c.queues = 0;
  EXPECT_THROW(FlowSteering{c}, std::invalid_argument);
  c = two_queues();
  c.idle_us = c.period_us;  // a flow could be forgotten in the call that just saw it
  EXPECT_THROW(FlowSteering{c}, std::invalid_argument);
  c = two_queues();
  c.max_flows = 0;
  EXPECT_THROW(FlowSteering{c}, std::invalid_argument);
}

// The busiest movable flow goes, wherever it is in the table: first in, in the middle, last.
TEST(FlowSteering, TheBusiestFlowIsTheOneMoved) {
  for (std::uint64_t busiest = 1; busiest <= 3; ++busiest) {
    FlowSteering s(two_queues());
    for (std::uint64_t f = 1; f <= 3; ++f) {
      s.on_rx(f, 0, f == busiest ? 9000 : 5000, 0);
      EXPECT_EQ(s.on_tx(f, 0, 60, 1), 0u);
    }
    EXPECT_EQ(s.on_tx(busiest, 0, 60, 100), 1u) << "busiest " << busiest;
    for (std::uint64_t f = 1; f <= 3; ++f) {
      if (f != busiest) {
        EXPECT_EQ(s.on_tx(f, 0, 60, 101), 0u) << "busiest " << busiest << ", flow " << f;
      }
    }
  }
}

// A flow that netback does not write now cannot be moved (the kernel would never learn it), so
// the busy flow that is written goes instead: here a host->guest UDP stream whose guest sent one
// datagram once, and a TCP flow beside it on queue 0.
TEST(FlowSteering, OnlyAFlowWrittenInThePeriodIsMoved) {
  FlowSteering s(two_queues());
  const std::uint64_t udp = 1, tcp = 2;
  EXPECT_EQ(s.on_tx(udp, 0, 60, 0), 0u);
  for (std::uint64_t t = 100; t <= 190; t += 10) {  // the next period: UDP only received
    s.on_rx(udp, 0, 9000, t);
    s.on_rx(tcp, 0, 3000, t);
    EXPECT_EQ(s.on_tx(tcp, 0, 60, t + 1), 0u);
  }
  EXPECT_EQ(s.on_tx(tcp, 0, 60, 200), 1u);
  EXPECT_EQ(s.moves(), 1u);
  auto u = s.flow(udp);
  ASSERT_TRUE(u);
  EXPECT_FALSE(u->moved);
}

// A full table makes room at the next look: flows that moved nothing in the period go.
TEST(FlowSteering, AFullTableDropsTheFlowsThatMovedNothing) {
  FlowSteeringConfig c = two_queues();
  c.max_flows = 2;
  FlowSteering s(c);
  s.on_rx(1, 0, 60, 0);
  s.on_rx(2, 0, 60, 0);
  s.on_rx(1, 0, 60, 100);  // a look: both moved bytes in that period
  EXPECT_EQ(s.flows(), 2u);
  s.on_rx(3, 0, 60, 150);
  EXPECT_FALSE(s.flow(3)) << "no room yet";
  s.on_rx(1, 0, 60, 200);  // a look: full, flow 2 moved nothing since the last
  EXPECT_EQ(s.flows(), 1u);
  EXPECT_FALSE(s.flow(2));
  s.on_rx(3, 0, 60, 210);
  EXPECT_TRUE(s.flow(3));
}

}  // namespace
}  // namespace xpv::netback
