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

// Rows without an xpv figure or without a reference.
int missing_figures(const std::vector<Result>& rows);

// One part as one L1 session measured it.
struct PartRun {
  int session = 0;
  std::vector<Result> rows;
};
// The run to report: the fewest missing figures, the earliest session among equals; nullptr for
// none.
const PartRun* best_run(const std::vector<PartRun>& runs);
// Whether a part needs another session: no run yet, or its best run misses a figure.
bool part_wanted(const std::vector<PartRun>& runs);

}  // namespace xpv::bench::hvm
