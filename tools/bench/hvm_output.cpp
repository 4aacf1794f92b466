// Parsers of `xpv bench hvm`: see hvm_output.h.
#include "bench/hvm_output.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

namespace xpv::bench::hvm {

std::string last_lines(const std::string& text, std::size_t n) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    l.erase(std::remove(l.begin(), l.end(), '\r'), l.end());
    if (!l.empty()) lines.push_back(l);
  }
  std::string out;
  for (std::size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) {
    out += (out.empty() ? "" : " | ") + lines[i];
  }
  return out;
}

Iperf parse_iperf(const std::string& out, const std::string& mode) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(out);
  } catch (const std::exception&) {
    throw HvmOutputError("iperf3 " + mode + " printed no JSON: " + last_lines(out, 2));
  }
  if (j.contains("error")) {
    const auto& e = j.at("error");
    throw HvmOutputError("iperf3 " + mode + ": " + (e.is_string() ? e.get<std::string>() : e.dump()));
  }
  try {
    const auto& end = j.at("end");
    Iperf r;
    r.fwd = end.at("sum_received").at("bits_per_second").get<double>() / 1e9;
    if (mode == "--bidir") r.rev = end.at("sum_received_bidir_reverse").at("bits_per_second").get<double>() / 1e9;
    return r;
  } catch (const std::exception& e) {
    throw HvmOutputError("iperf3 " + mode + ": unexpected JSON (" + std::string(e.what()) + ")");
  }
}

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}
}  // namespace

BothWays summarize_rounds(const std::vector<Iperf>& rounds) {
  if (rounds.empty()) throw HvmOutputError("both ways: no rounds to summarize");
  BothWays b;
  std::vector<double> totals, ratios;
  for (const Iperf& r : rounds) {
    totals.push_back(r.fwd + r.rev);
    if (const double hi = std::max(r.fwd, r.rev); hi > 0) ratios.push_back(std::min(r.fwd, r.rev) / hi);
    char one[64];
    std::snprintf(one, sizeof one, "%s%.3f+%.3f", b.rounds.empty() ? "" : ", ", r.fwd, r.rev);
    b.rounds += one;
  }
  b.total = median(totals);
  if (!ratios.empty()) b.fairness = median(ratios);
  return b;
}

OneWay summarize_one_way(const std::vector<double>& gbit) {
  if (gbit.empty()) throw HvmOutputError("one way: no rounds to summarize");
  OneWay o;
  for (const double g : gbit) {
    char one[32];
    std::snprintf(one, sizeof one, "%s%.3f", o.rounds.empty() ? "" : ", ", g);
    o.rounds += one;
  }
  o.median = median(gbit);
  return o;
}

Ping merge_pings(const std::vector<Ping>& runs) {
  if (runs.empty()) throw HvmOutputError("ping: no runs to merge");
  Ping m = runs.front();
  double weighted = runs.front().avg_ms * runs.front().received;
  for (std::size_t i = 1; i < runs.size(); ++i) {
    const Ping& p = runs[i];
    m.sent += p.sent;
    m.received += p.received;
    m.min_ms = std::min(m.min_ms, p.min_ms);
    m.max_ms = std::max(m.max_ms, p.max_ms);
    weighted += p.avg_ms * p.received;
  }
  m.avg_ms = weighted / m.received;  // parse_ping gives no run without an answer
  return m;
}

Ping parse_ping(const std::string& out) {
  Ping p;
  std::istringstream in(out);
  bool counts = false, rtt = false;
  for (std::string l; std::getline(in, l);) {
    if (!counts && l.find(" packets transmitted, ") != std::string::npos) {
      counts = std::sscanf(l.c_str(), "%d packets transmitted, %d received", &p.sent, &p.received) == 2;
    }
    if (const auto at = l.find("rtt min/avg/max/mdev = "); !rtt && at != std::string::npos) {
      double mdev = 0;
      rtt = std::sscanf(l.c_str() + at, "rtt min/avg/max/mdev = %lf/%lf/%lf/%lf ms", &p.min_ms, &p.avg_ms, &p.max_ms,
                        &mdev) == 4;
    }
  }
  if (!counts) throw HvmOutputError("ping printed no packet counts: " + last_lines(out, 2));
  if (p.received <= 0 || p.sent <= 0) {
    throw HvmOutputError("ping: no reply (" + std::to_string(p.sent) + " sent, " + std::to_string(p.received) +
                         " received)");
  }
  if (!rtt) throw HvmOutputError("ping printed no round-trip times: " + last_lines(out, 2));
  return p;
}

std::vector<std::string> bonnie_csv_fields(const std::string& text) {
  std::istringstream lines(text);
  std::vector<std::string> fields;
  for (std::string l; std::getline(lines, l);) {
    l.erase(std::remove(l.begin(), l.end(), '\r'), l.end());
    if (l.rfind("1.9", 0) != 0 || std::count(l.begin(), l.end(), ',') < 20) continue;
    std::stringstream ss(l);
    for (std::string x; std::getline(ss, x, ',');) fields.push_back(x);
    break;
  }
  return fields;
}

std::optional<double> bonnie_field(const std::vector<std::string>& v, std::size_t i, const char* name,
                                   std::string& note) {
  const auto why = [&](const std::string& s) {
    note += std::string(note.empty() ? "" : "; ") + name + ": " + s;
    return std::nullopt;
  };
  if (i >= v.size() || v[i].empty()) return why("no field");
  if (v[i].find('+') != std::string::npos) return why("+++++ (too fast for bonnie++ to time)");
  char* end = nullptr;
  const double x = std::strtod(v[i].c_str(), &end);
  if (end == v[i].c_str()) return why("'" + v[i] + "' is not a number");
  return x;
}

}  // namespace xpv::bench::hvm
