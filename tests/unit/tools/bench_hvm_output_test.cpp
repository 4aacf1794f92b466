// The parsers `xpv bench hvm` reads its figures with (tools/bench/hvm_output.h): real outputs of
// iputils ping, iperf3 -J and bonnie++ 1.98 in, figures or one clear error out.
#include "bench/hvm_output.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace {

using xpv::bench::hvm::bonnie_csv_fields;
using xpv::bench::hvm::bonnie_field;
using xpv::bench::hvm::HvmOutputError;
using xpv::bench::hvm::parse_iperf;
using xpv::bench::hvm::parse_ping;
using xpv::bench::hvm::summarize_rounds;
using xpv::bench::hvm::summarize_one_way;
using xpv::bench::hvm::merge_pings;
using xpv::bench::hvm::Ping;

// iputils-ping 20221126 (Debian 12), -q.
constexpr const char* kPingOk =
    "PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data.\n"
    "\n"
    "--- 10.0.0.2 ping statistics ---\n"
    "35 packets transmitted, 33 received, 5.71429% packet loss, time 3406ms\n"
    "rtt min/avg/max/mdev = 0.412/2.875/11.093/2.330 ms\n";

constexpr const char* kPingNone =
    "PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data.\n"
    "\n"
    "--- 10.0.0.2 ping statistics ---\n"
    "2 packets transmitted, 0 received, +2 errors, 100% packet loss, time 1025ms\n"
    "\n";

TEST(BenchHvmOutput, PingGivesCountsAndRoundTrips) {
  const auto p = parse_ping(kPingOk);
  EXPECT_EQ(p.sent, 35);
  EXPECT_EQ(p.received, 33);
  EXPECT_DOUBLE_EQ(p.min_ms, 0.412);
  EXPECT_DOUBLE_EQ(p.avg_ms, 2.875);
  EXPECT_DOUBLE_EQ(p.max_ms, 11.093);
}

TEST(BenchHvmOutput, PingWithNoReplyIsAnErrorNotAZero) {
  try {
    (void)parse_ping(kPingNone);
    FAIL() << "no error";
  } catch (const HvmOutputError& e) {
    EXPECT_NE(std::string(e.what()).find("no reply (2 sent, 0 received)"), std::string::npos) << e.what();
  }
}

TEST(BenchHvmOutput, PingThatPrintedSomethingElseIsNamed) {
  try {
    (void)parse_ping("ping: connect: Network is unreachable\n");
    FAIL() << "no error";
  } catch (const HvmOutputError& e) {
    EXPECT_NE(std::string(e.what()).find("no packet counts: ping: connect: Network is unreachable"), std::string::npos)
        << e.what();
  }
  // Counts but no rtt line (cut off): no figure.
  EXPECT_THROW(parse_ping("3 packets transmitted, 3 received, 0% packet loss, time 405ms\n"), HvmOutputError);
}

TEST(BenchHvmOutput, IperfReceivedRateAndBidirReverse) {
  const std::string one = R"({"start":{},"end":{"sum_sent":{"bits_per_second":2.1e9},
                              "sum_received":{"bits_per_second":2.05e9}}})";
  EXPECT_DOUBLE_EQ(parse_iperf(one, "").fwd, 2.05);
  EXPECT_DOUBLE_EQ(parse_iperf(one, "").rev, 0);
  const std::string bidir = R"({"end":{"sum_received":{"bits_per_second":4.0e8},
                                "sum_received_bidir_reverse":{"bits_per_second":6.29e7}}})";
  const auto b = parse_iperf(bidir, "--bidir");
  EXPECT_DOUBLE_EQ(b.fwd, 0.4);
  EXPECT_DOUBLE_EQ(b.rev, 0.0629);
  // --bidir without the reverse sum: not a zero, an error.
  EXPECT_THROW(parse_iperf(one, "--bidir"), HvmOutputError);
}

TEST(BenchHvmOutput, IperfErrorsAreIperfsOwnWords) {
  try {
    (void)parse_iperf(R"({"start":{},"error":"unable to connect to server: Connection refused"})", "-R");
    FAIL() << "no error";
  } catch (const HvmOutputError& e) {
    EXPECT_STREQ(e.what(), "iperf3 -R: unable to connect to server: Connection refused");
  }
  try {
    (void)parse_iperf("iperf3: error - unable to connect\nsecond line\n", "");
    FAIL() << "no error";
  } catch (const HvmOutputError& e) {
    EXPECT_STREQ(e.what(), "iperf3  printed no JSON: iperf3: error - unable to connect | second line");
  }
}

TEST(BenchHvmOutput, BothWaysRoundsGiveTheMedianRoundNotTheMean) {
  // Session 24's bench round next to two fairer ones: the figure is the middle round's, so one
  // lopsided round moves it neither way.
  const auto b = summarize_rounds({{0.537, 0.172}, {0.30, 0.28}, {0.35, 0.25}});
  EXPECT_NEAR(*b.fairness, 0.25 / 0.35, 1e-12);  // ratios 0.320, 0.933, 0.714 → 0.714
  EXPECT_NEAR(b.total, 0.60, 1e-12);             // totals 0.709, 0.58, 0.60 → 0.60
  EXPECT_EQ(b.rounds, "0.537+0.172, 0.300+0.280, 0.350+0.250");
  // The split is the smaller over the larger, whichever direction leads.
  EXPECT_NEAR(*summarize_rounds({{0.1, 0.4}}).fairness, 0.25, 1e-12);
  // An even count: the mean of the two middle ones.
  const auto two = summarize_rounds({{0.2, 0.2}, {0.4, 0.1}});
  EXPECT_NEAR(*two.fairness, (1.0 + 0.25) / 2, 1e-12);
  EXPECT_NEAR(two.total, 0.45, 1e-12);
  // One direction starved to nothing is a split of 0, not a missing figure.
  EXPECT_EQ(*summarize_rounds({{0.5, 0.0}}).fairness, 0.0);
  // Nothing moved at all: no split to give; such a round is left out of the median.
  EXPECT_FALSE(summarize_rounds({{0.0, 0.0}}).fairness.has_value());
  EXPECT_NEAR(*summarize_rounds({{0.0, 0.0}, {0.3, 0.1}}).fairness, 1.0 / 3, 1e-12);
  EXPECT_THROW(summarize_rounds({}), HvmOutputError);
}

TEST(BenchHvmOutput, OneWayRoundsGiveTheMedianRound) {
  // Session 48's guest->host next to two runs of other sessions: the middle one is the figure.
  const auto o = summarize_one_way({0.305, 0.514, 0.362});
  EXPECT_NEAR(o.median, 0.362, 1e-12);
  EXPECT_EQ(o.rounds, "0.305, 0.514, 0.362");
  EXPECT_NEAR(summarize_one_way({0.2, 0.4}).median, 0.3, 1e-12);
  EXPECT_NEAR(summarize_one_way({0.7}).median, 0.7, 1e-12);
  EXPECT_THROW(summarize_one_way({}), HvmOutputError);
}

TEST(BenchHvmOutput, MergedPingsAreTheMeanOfEveryAnsweredRequest) {
  Ping a;
  a.sent = 10, a.received = 10, a.min_ms = 1.0, a.avg_ms = 2.0, a.max_ms = 5.0;
  Ping b;
  b.sent = 40, b.received = 30, b.min_ms = 0.5, b.avg_ms = 6.0, b.max_ms = 40.0;
  const Ping m = merge_pings({a, b});
  EXPECT_EQ(m.sent, 50);
  EXPECT_EQ(m.received, 40);
  EXPECT_EQ(m.min_ms, 0.5);
  EXPECT_EQ(m.max_ms, 40.0);
  EXPECT_NEAR(m.avg_ms, (10 * 2.0 + 30 * 6.0) / 40, 1e-12);  // 5.0: not the runs' plain mean, 4.0
  const Ping one = merge_pings({a});
  EXPECT_EQ(one.avg_ms, 2.0);
  EXPECT_EQ(one.sent, 10);
  EXPECT_THROW(merge_pings({}), HvmOutputError);
}

TEST(BenchHvmOutput, BonnieCsvFieldsAndWhatHasNoFigure) {
  // A guest's console in `xpv bench hvm` (bonnie++ 2.00a, CSV format 1.98), CRs from the serial console.
  const std::string text =
      "XPV-BONNIE-BEGIN\r\n"
      "Using uid:0, gid:0.\r\n"
      "1.98,2.00a,xpv-guest,1,1796147809,64M,,8192,5,91,99,13198,49,80007,82,304,99,+++++,+++,13939,556,,,,,,,,,,,,,,,,,,"
      "141ms,807ms,19902us,49901us,1577us,72619us,,,,,,\r\n"
      "XPV-BONNIE-END\r\n";
  const auto f = bonnie_csv_fields(text);
  ASSERT_GT(f.size(), 17u);
  std::string note;
  EXPECT_EQ(bonnie_field(f, 11, "block write", note), 13198.0);
  EXPECT_EQ(bonnie_field(f, 13, "rewrite", note), 80007.0);
  EXPECT_EQ(note, "");
  EXPECT_FALSE(bonnie_field(f, 17, "block read", note));
  EXPECT_EQ(note, "block read: +++++ (too fast for bonnie++ to time)");
  EXPECT_FALSE(bonnie_field(f, 21, "create", note));
  EXPECT_EQ(note, "block read: +++++ (too fast for bonnie++ to time); create: no field");
  EXPECT_FALSE(bonnie_field(f, 500, "past the end", note));
  EXPECT_TRUE(bonnie_csv_fields("no csv here\n1.98,too,few,commas\n").empty());
}

// What Debian 12's own ping and iperf3 print, parsed: both run in a network namespace of the
// test's own (unshare -n, loopback only), which goes away with them.
std::string run(const std::string& cmd) {
  std::string out;
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    ::pclose(f);
  }
  return out;
}

TEST(BenchHvmOutput, TheInstalledPingAndIperf3PrintWhatIsParsed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (unshare -n)";
  if (run("command -v ping && command -v iperf3 && command -v unshare").empty()) {
    GTEST_SKIP() << "needs ping, iperf3 and unshare (scripts/setup installs them)";
  }
  const std::string ping = run(
      "timeout 30 unshare -n sh -c 'ip link set lo up && ping -n -q -c 3 -i 0.2 -W 2 127.0.0.1' 2>&1");
  const auto p = parse_ping(ping);
  EXPECT_EQ(p.sent, 3) << ping;
  EXPECT_EQ(p.received, 3) << ping;
  EXPECT_GT(p.avg_ms, 0) << ping;
  EXPECT_LE(p.min_ms, p.avg_ms);
  EXPECT_LE(p.avg_ms, p.max_ms);

  const std::string iperf = run(
      "timeout 60 unshare -n sh -c 'ip link set lo up && (timeout 30 iperf3 -s -1 -p 5201 >/dev/null 2>&1 &) && "
      "for i in $(seq 100); do ss -ltn | grep -q :5201 && break; sleep 0.1; done; "
      "iperf3 -J -c 127.0.0.1 -p 5201 -t 1 -R' 2>&1");
  const auto i = parse_iperf(iperf, "-R");
  EXPECT_GT(i.fwd, 0) << iperf;
}

}  // namespace
