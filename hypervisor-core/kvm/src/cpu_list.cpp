#include "xpv/kvm/cpu_list.h"

#include <fmt/format.h>
#include <sched.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <vector>

namespace xpv::kvm {
namespace {

bool blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

// Decimal digits only (no sign, no spaces); nullopt for anything else or a value that overflows.
std::optional<std::size_t> number(std::string_view s) {
  if (s.empty()) return std::nullopt;
  std::size_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

Result<CpuList> parse_cpu_list(std::string_view text) {
  if (trim(text).empty()) return err("an empty CPU list");
  // As xl reads it: one set, each item adding its CPUs or (with ^) taking them away, in order.
  CpuList r;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string_view raw = text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    start = comma == std::string_view::npos ? text.size() + 1 : comma + 1;
    const std::string_view item = trim(raw);
    if (item.empty()) return err(fmt::format("'{}': an empty item (two commas in a row, or one at an end)", text));
    const bool exclude = item.front() == '^';
    const std::string_view body = exclude ? item.substr(1) : item;
    if (body.rfind("node:", 0) == 0 || body.rfind("nodes:", 0) == 0) {
      return err(fmt::format("'{}': NUMA node lists are not supported by xpv; name the CPUs", item));
    }
    if (body == "all") {
      if (exclude) return err(fmt::format("'{}': ^ and all do not combine (as in xl)", item));
      r.cpus.set();
      continue;
    }
    const std::size_t dash = body.find('-');
    const auto lo = number(dash == std::string_view::npos ? body : body.substr(0, dash));
    const auto hi = dash == std::string_view::npos ? lo : number(body.substr(dash + 1));
    if (!lo || !hi) {
      return err(fmt::format("'{}': expected a CPU number, a range N-M, ^ to leave CPUs out, or all", item));
    }
    if (*lo >= kMaxCpus || *hi >= kMaxCpus) {
      return err(fmt::format("'{}': CPU numbers go up to {}", item, kMaxCpus - 1));
    }
    if (*hi < *lo) return err(fmt::format("'{}': a range must not run downward", item));
    for (std::size_t c = *lo; c <= *hi; ++c) r.cpus.set(c, !exclude);
  }
  if (r.empty()) return err(fmt::format("'{}' leaves no CPU", text));
  return r;
}

std::string format_cpu_list(const CpuList& l) {
  std::string s;
  std::size_t c = 0;
  while (c < kMaxCpus) {
    if (!l.cpus.test(c)) {
      ++c;
      continue;
    }
    std::size_t e = c;
    while (e + 1 < kMaxCpus && l.cpus.test(e + 1)) ++e;
    if (!s.empty()) s += ',';
    if (e == c) s += fmt::format("{}", c);
    else if (e == c + 1) s += fmt::format("{},{}", c, e);
    else s += fmt::format("{}-{}", c, e);
    c = e + 1;
  }
  return s.empty() ? "none" : s;
}

Result<std::vector<CpuList>> parse_vcpu_affinity(const std::vector<std::string>& specs, unsigned vcpus,
                                                 const CpuList& allowed) {
  if (vcpus == 0 || vcpus > kMaxPlacedVcpus) return err(fmt::format("{} vCPUs: expected 1..{}", vcpus, kMaxPlacedVcpus));
  std::vector<CpuList> r(vcpus);
  std::vector<bool> seen(vcpus, false);
  for (const std::string& spec : specs) {
    const std::size_t colon = spec.find(':');
    const auto v = colon == std::string::npos ? std::nullopt : number(std::string_view(spec).substr(0, colon));
    if (!v) return err(fmt::format("'{}': expected VCPU:CPU-LIST", spec));
    if (*v >= vcpus) return err(fmt::format("'{}': vCPU {} is not one of the {} vCPUs", spec, *v, vcpus));
    if (seen[*v]) return err(fmt::format("'{}': vCPU {} is placed twice", spec, *v));
    seen[*v] = true;
    auto l = parse_cpu_list(std::string_view(spec).substr(colon + 1));
    if (!l) return err(fmt::format("'{}': {}", spec, l.error().message));
    if ((l->cpus & allowed.cpus).none()) {
      return err(fmt::format("'{}': none of CPUs {} may be used by this process (it may use {})", spec,
                             format_cpu_list(*l), format_cpu_list(allowed)));
    }
    r[*v] = *l;
  }
  return r;
}

Result<CpuList> cpus_of_thread(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(tid, sizeof set, &set) != 0) return err(std::strerror(errno));
  CpuList l;
  for (std::size_t c = 0; c < kMaxCpus; ++c) {
    if (CPU_ISSET(c, &set)) l.cpus.set(c);
  }
  return l;
}

Result<void> place_thread(pid_t tid, const CpuList& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (std::size_t c = 0; c < kMaxCpus; ++c) {
    if (cpus.cpus.test(c)) CPU_SET(c, &set);
  }
  if (::sched_setaffinity(tid, sizeof set, &set) != 0) return err(std::strerror(errno));
  return {};
}

}  // namespace xpv::kvm
