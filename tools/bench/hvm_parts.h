// `xpv bench hvm` in parts. The bench measures two parts, each with both VMMs back to back in one
// L1 session: `net` (xpv's iperf3 boot, then QEMU's) and `disk` (the two bonnie++ boots). Every
// ratio compares two boots of one L1. An L1 that is lost (tools/testbed/README.md, "Known issue")
// takes only the part it was in: the next session measures the parts still missing. A part whose
// boots failed twice, so that it lacks figures, is also measured again. Of a part's runs, the one
// with the fewest missing figures is reported. Pure logic and the part files' JSON, no processes.
#pragma once

#include <string>
#include <vector>

#include "bench/bench.h"

namespace xpv::bench::hvm {

enum class Part { net, disk };

const char* part_name(Part p);
// "net,disk", "disk", ...: each part at most once, in the bench's order (net first). Throws
// std::invalid_argument naming what is wrong (empty, unknown, twice).
std::vector<Part> parse_parts(const std::string& text);
std::string join_parts(const std::vector<Part>& parts);

// The metrics of a part, in the order reported: name, unit and lower_is_better set, xpv NaN, no
// reference, no note. The rows a part's run reports must match them (check_rows).
std::vector<Result> part_metrics(Part p);
// Throws std::logic_error when rows are not part_metrics(p) (name, unit, direction, order).
void check_rows(Part p, const std::vector<Result>& rows);

// The file a part's run writes in the share, as the run inside L1 names it and the host side
// reads it: "<part>-session-<N>.json".
std::string part_file(Part p, int session);

// Rows without an xpv figure or without a reference (none, or not a number).
int missing_figures(const std::vector<Result>& rows);

// One part as one L1 session measured it.
struct PartRun {
  int session = 0;
  std::vector<Result> rows;
};
// The run to report: the fewest missing figures, the earliest session among equals; nullptr for
// none.
const PartRun* best_run(const std::vector<PartRun>& runs);
// Whether a part needs another session: no run yet, or its best run misses a figure (whatever
// took it: a lost L1, boots that failed twice, a figure a program did not give).
bool part_wanted(const std::vector<PartRun>& runs);

// Whether the host side starts another L1 session after `sessions` of them, the last ending with
// the testbed's exit status rc, elapsed_s after the first began: only while a part is wanted,
// the last session ended normally (0) or lost its L1 (124: timeout, silence or lockup; 125: L1
// reset or its run gave up), fewer than max_sessions ran and elapsed_s is below window_s. Any
// other status is the run's own error and ends the bench.
bool another_session(const std::vector<std::vector<PartRun>>& runs, int rc, int sessions, double elapsed_s,
                     int max_sessions, double window_s);

}  // namespace xpv::bench::hvm
