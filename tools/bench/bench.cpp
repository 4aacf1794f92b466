#include "bench/bench.h"

#include <fmt/core.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

namespace xpv::bench {

namespace {
std::vector<Suite>& registry() {
  static std::vector<Suite> all;
  return all;
}

nlohmann::json number_or_null(std::optional<double> v) {
  if (!v || !std::isfinite(*v)) return nullptr;
  return *v;
}
}  // namespace

bool register_suite(Suite suite) {
  registry().push_back(std::move(suite));
  return true;
}

const std::vector<Suite>& suites() { return registry(); }

bool write_json(const std::string& path, const std::string& suite, const std::vector<Result>& rs) {
  nlohmann::json out;
  out["suite"] = suite;
  out["results"] = nlohmann::json::array();
  for (const Result& r : rs) {
    std::optional<double> ratio;
    if (r.reference && *r.reference != 0) ratio = r.xpv / *r.reference;
    nlohmann::json j = {{"metric", r.metric},
                        {"unit", r.unit},
                        {"xpv", number_or_null(r.xpv)},
                        {"reference", number_or_null(r.reference)},
                        {"ratio", number_or_null(ratio)}};
    if (!r.note.empty()) j["note"] = r.note;
    if (r.lower_is_better) j["lower_is_better"] = true;
    out["results"].push_back(std::move(j));
  }
  std::ofstream f(path);
  if (!f) {
    fmt::print(stderr, "xpv bench: cannot write {}\n", path);
    return false;
  }
  f << out.dump(2) << '\n';
  return static_cast<bool>(f);
}

void print_table(const std::string& suite, const std::vector<Result>& rs) {
  fmt::print("{}\n", suite);
  fmt::print("  {:<40} {:>14} {:>14} {:>8}  {}\n", "metric", "xpv", "reference", "ratio", "unit");
  for (const Result& r : rs) {
    std::string ref = r.reference ? fmt::format("{:.4g}", *r.reference) : "-";
    std::string ratio =
        (r.reference && *r.reference != 0) ? fmt::format("{:.3f}", r.xpv / *r.reference) : "-";
    fmt::print("  {:<40} {:>14.4g} {:>14} {:>8}  {}{}\n", r.metric, r.xpv, ref, ratio, r.unit,
               r.note.empty() ? "" : "  (" + r.note + ")");
  }
}

}  // namespace xpv::bench
