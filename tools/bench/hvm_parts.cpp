#include "bench/hvm_parts.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace xpv::bench::hvm {

namespace {

Result row(const char* metric, const char* unit, bool lower = false) {
  Result r;
  r.metric = metric;
  r.unit = unit;
  r.xpv = std::numeric_limits<double>::quiet_NaN();
  r.lower_is_better = lower;
  return r;
}

}  // namespace

const char* part_name(Part p) { return p == Part::net ? "net" : "disk"; }

std::vector<Part> parse_parts(const std::string& text) {
  bool net = false, disk = false;
  std::size_t at = 0;
  if (text.empty()) throw std::invalid_argument("no part named (net, disk)");
  for (;;) {
    const std::size_t comma = text.find(',', at);
    const std::string word = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    bool* named = word == "net" ? &net : word == "disk" ? &disk : nullptr;
    if (named == nullptr) throw std::invalid_argument("'" + word + "' is not a part (net, disk)");
    bool& seen = *named;
    if (seen) throw std::invalid_argument("part '" + word + "' named twice");
    seen = true;
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  std::vector<Part> parts;
  if (net) parts.push_back(Part::net);
  if (disk) parts.push_back(Part::disk);
  return parts;
}

std::string join_parts(const std::vector<Part>& parts) {
  std::string s;
  for (Part p : parts) s += (s.empty() ? "" : ",") + std::string(part_name(p));
  return s;
}

std::vector<Result> part_metrics(Part p) {
  if (p == Part::net) {
    return {row("iperf3 host->guest", "Gbit/s"),
            row("iperf3 guest->host", "Gbit/s"),
            row("iperf3 bidir total", "Gbit/s"),
            row("iperf3 bidir min/max", "ratio"),
            row("iperf3 2-process bidir total", "Gbit/s"),
            row("iperf3 2-process bidir min/max", "ratio"),
            row("ping rtt idle", "ms", true),
            row("ping rtt 10 ms apart", "ms", true),
            row("ping rtt under host->guest load", "ms", true),
            row("ping rtt under guest->host load", "ms", true)};
  }
  return {row("bonnie++ run (host clock)", "s", true), row("bonnie++ block write", "KiB/s"),
          row("bonnie++ block read", "KiB/s"), row("bonnie++ rewrite", "KiB/s")};
}

void check_rows(Part p, const std::vector<Result>& rows) {
  const auto want = part_metrics(p);
  bool same = want.size() == rows.size();
  for (std::size_t i = 0; same && i < rows.size(); ++i) {
    same = rows[i].metric == want[i].metric && rows[i].unit == want[i].unit &&
           rows[i].lower_is_better == want[i].lower_is_better;
  }
  if (!same) throw std::logic_error(std::string("the rows of part ") + part_name(p) + " are not its part_metrics()");
}

std::string part_file(Part p, int session) {
  return std::string(part_name(p)) + "-session-" + std::to_string(session) + ".json";
}

int missing_figures(const std::vector<Result>& rows) {
  int n = 0;
  for (const Result& r : rows) n += (!std::isfinite(r.xpv) || !r.reference || !std::isfinite(*r.reference)) ? 1 : 0;
  return n;
}

const PartRun* best_run(const std::vector<PartRun>& runs) {
  const PartRun* best = nullptr;
  for (const PartRun& r : runs) {
    if (best == nullptr || missing_figures(r.rows) < missing_figures(best->rows) ||
        (missing_figures(r.rows) == missing_figures(best->rows) && r.session < best->session)) {
      best = &r;
    }
  }
  return best;
}

bool part_wanted(const std::vector<PartRun>& runs) {
  const PartRun* best = best_run(runs);
  return best == nullptr || missing_figures(best->rows) > 0;
}

bool another_session(const std::vector<std::vector<PartRun>>& runs, int rc, int sessions, double elapsed_s,
                     int max_sessions, double window_s) {
  bool wanted = false;
  for (const auto& r : runs) wanted = wanted || part_wanted(r);
  const bool went_on = rc == 0 || rc == 124 || rc == 125;
  return wanted && went_on && sessions < max_sessions && elapsed_s < window_s;
}

}  // namespace xpv::bench::hvm
