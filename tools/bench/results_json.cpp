// The bench's JSON shape (bench.h), written and read back (`xpv bench hvm` reads what its run
// inside L1 wrote).
#include <fmt/core.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "bench/bench.h"

namespace xpv::bench {

namespace {
nlohmann::json number_or_null(std::optional<double> v) {
  if (!v || !std::isfinite(*v)) return nullptr;
  return *v;
}
}  // namespace

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
  f.close();  // a failed flush (a full or lost share) is an error too
  if (f.fail()) {
    fmt::print(stderr, "xpv bench: cannot write {}\n", path);
    return false;
  }
  return true;
}

std::vector<Result> read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + ": cannot be read");
  std::vector<Result> out;
  try {
    const auto j = nlohmann::json::parse(f);
    for (const auto& r : j.at("results")) {
      Result res;
      res.metric = r.at("metric").get<std::string>();
      res.unit = r.at("unit").get<std::string>();
      res.xpv = r.at("xpv").is_null() ? std::numeric_limits<double>::quiet_NaN() : r.at("xpv").get<double>();
      if (!r.at("reference").is_null()) res.reference = r.at("reference").get<double>();
      res.note = r.value("note", "");
      res.lower_is_better = r.value("lower_is_better", false);
      out.push_back(std::move(res));
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not a bench results file (" + e.what() + ")");
  }
  return out;
}

}  // namespace xpv::bench
