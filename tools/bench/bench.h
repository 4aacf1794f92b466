// `xpv bench` — the common shape of every benchmark suite.
//
// A suite measures, from the host's clock, xpv next to a reference measured in the same run on
// the same machine, and reports each metric as {metric, unit, xpv, reference, ratio}. Benchmarks
// never assert: tests do that. The JSON shape is shared by every suite:
//   {"suite": S, "results": [{"metric": M, "unit": U, "xpv": X, "reference": R, "ratio": X/R,
//                             "note": "..."}]}
// reference and ratio are null where no reference exists; the note then says why.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xpv::bench {

struct Options {
  double scale = 1.0;     // multiplies iteration counts / durations (--quick sets 0.1)
  std::string json_path;  // --json FILE, or empty; plots go next to it (plot_path)
};

struct Result {
  std::string metric;
  std::string unit;
  double xpv = 0;
  std::optional<double> reference;
  std::string note;  // why reference is null, or what the reference is
  // Higher is better for throughput units; for latency units (ns, us) lower is better. The ratio is
  // always xpv/reference as issued; `lower_is_better` lets a report print it the right way round.
  bool lower_is_better = false;
};

struct Suite {
  std::string name;
  std::string description;
  std::function<std::vector<Result>(const Options&)> run;
};

// Registration from a static initialiser (see XPV_BENCH_SUITE).
bool register_suite(Suite suite);
const std::vector<Suite>& suites();

// Host clock helpers. steady_clock is CLOCK_MONOTONIC: the host's clock, never a guest's.
using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs argv (stdin /dev/null, stdout and stderr on one pipe) and hands every chunk it prints to
// on_output with the host-clock time the chunk was read. Killed (SIGKILL) after timeout_s.
// Returns the wait status (as waitpid); 127 << 8 when argv[0] cannot be executed.
int run_streaming(const std::vector<std::string>& argv, double timeout_s,
                  const std::function<void(std::string_view chunk, Clock::time_point at)>& on_output);

// Runs a shell line (sh -c) and collects its stdout (add 2>&1 for stderr too); rc is its exit
// status, 128+N after signal N, -1 if it could not be started.
struct Captured {
  int rc = -1;
  std::string out;
};
Captured shell_capture(const std::string& cmd);

// Writes the shared JSON shape; returns false (and prints why) if the file cannot be written.
// (results_json.cpp, in the library xpv::bench_hvm_output with its reader.)
bool write_json(const std::string& path, const std::string& suite, const std::vector<Result>& rs);
// Reads that shape back: a null xpv is NaN, a null reference none; ratio is not read (it is
// xpv / reference). Throws std::runtime_error naming the file and what is wrong.
std::vector<Result> read_json(const std::string& path);
void print_table(const std::string& suite, const std::vector<Result>& rs);

// Where a suite's plot named `what` goes: next to the JSON (FILE.json → FILE-what.png), else
// ./bench-SUITE-what.png.
std::string plot_path(const Options& opts, const std::string& suite, const std::string& what);

// A PNG bar chart of xpv/reference per metric (gnuplot; metrics without a reference are left
// out). Returns false, saying why on stderr, if it cannot be drawn.
bool write_ratio_chart(const std::string& png, const std::string& suite, const std::vector<Result>& rs);

}  // namespace xpv::bench

#define XPV_BENCH_CONCAT2(a, b) a##b
#define XPV_BENCH_CONCAT(a, b) XPV_BENCH_CONCAT2(a, b)
// XPV_BENCH_SUITE("ring", "ring push+pop between two threads", fn) at namespace scope.
#define XPV_BENCH_SUITE(name, description, fn)                                        \
  static const bool XPV_BENCH_CONCAT(xpv_bench_registered_, __LINE__) [[maybe_unused]] = \
      ::xpv::bench::register_suite({name, description, fn})
