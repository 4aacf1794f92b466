// What `xpv bench hvm` reads from the programs it runs in L1 and in the guests: iperf3's JSON,
// iputils ping's summary and bonnie++'s CSV line. Pure text in, figures out; a text that does not
// hold the figure throws HvmOutputError naming the program and what was missing (the suite turns
// it into the metric's note, never into a number).
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace xpv::bench::hvm {

struct HvmOutputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The last n non-empty lines of text (CRs dropped), joined with " | ": for error messages.
std::string last_lines(const std::string& text, std::size_t n);

// iperf3 -J: Gbit/s as received. fwd is the test's own direction (sum_received); rev is filled for
// --bidir only (sum_received_bidir_reverse). `mode` is how the run was started, for messages.
struct Iperf {
  double fwd = 0, rev = 0;
};
Iperf parse_iperf(const std::string& out, const std::string& mode);

// iputils ping -q: "N packets transmitted, M received" and "rtt min/avg/max/mdev = a/b/c/d ms".
// Throws when either line is missing or nothing came back (no rtt line then).
struct Ping {
  int sent = 0, received = 0;
  double min_ms = 0, avg_ms = 0, max_ms = 0;
};
Ping parse_ping(const std::string& out);

// Both directions at once, measured in several rounds (`xpv bench hvm` runs each both-ways test
// kBothWaysRounds times in one boot): one round's split moves a lot from run to run in the
// testbed (min/max 0.32 and 0.93 for the same build in two sessions), so the figure is the
// median round. total: the median of the rounds' fwd + rev; fairness: the median of their
// min/max (0 when a round moved nothing one way; no figure when a round moved nothing at all);
// rounds: "fwd+rev" per round in Gbit/s, as the notes print them. Throws on no rounds.
struct BothWays {
  double total = 0;
  std::optional<double> fairness;
  std::string rounds;
};
BothWays summarize_rounds(const std::vector<Iperf>& rounds);

// One direction measured in several rounds (the single-stream host->guest and guest->host runs,
// interleaved in one boot): one 10 s run moves by a third from run to run in the testbed, so the
// figure is the median round. rounds: each round's Gbit/s, as the notes print them. Throws on no
// rounds.
struct OneWay {
  double median = 0;
  std::string rounds;
};
OneWay summarize_one_way(const std::vector<double>& gbit);

// Several ping runs as one: counts summed, min of the mins, max of the maxes, and the mean round
// trip of every answered request (each run's mean weighted by its answers). Throws on no runs.
Ping merge_pings(const std::vector<Ping>& runs);

// bonnie++ 1.98's CSV line (starts with "1.9", 20+ commas) in `text`; empty when there is none.
std::vector<std::string> bonnie_csv_fields(const std::string& text);

// Field i of that line as a number (KiB/s). No figure when the field is missing, empty, "+++++"
// (too fast for bonnie++ to time) or not a number; `note` then gets "name: why" appended.
std::optional<double> bonnie_field(const std::vector<std::string>& fields, std::size_t i, const char* name,
                                   std::string& note);

}  // namespace xpv::bench::hvm
