#include "xpv/toolstack/inventory.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "xpv/toolstack/allocation.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/fs.h"
#include "xpv/toolstack/nodes.h"
#include "xpv/toolstack/process.h"
#include "xpv/toolstack/xenstore.h"
#include "xpv/xenbus/path.h"

namespace xpv::toolstack {

bool domain_process_runs(const DomainRecord& r) {
  return process_runs(r.pid, r.program, {"--domid", std::to_string(r.domid)});
}

bool monitor_runs(const DomainRecord& r) {
  return r.monitor_pid > 0 && process_runs(r.monitor_pid, std::filesystem::path(self_executable()).filename().string(),
                                           {"monitor", std::to_string(r.domid), r.uuid});
}

std::vector<DomainSummary> gather_domains(const Paths& paths, Xenstore* xs) {
  std::map<std::uint16_t, DomainSummary> by_id;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(paths.run_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || !name.starts_with("dom")) continue;
    auto domid = parse_domid(std::string_view(name).substr(3));
    if (!domid || *domid == 0) continue;
    DomainSummary& d = by_id[*domid];
    d.domid = *domid;
    d.record = read_record(e.path().string());
    if (d.record) {
      d.name = d.record->name;
      d.type = d.record->type;
      d.memory_mib = d.record->memory_mib;
      // An HVM guest that ballooned: what it holds now, as xl list shows (xpv-vmm keeps the file).
      if (auto held = read_file(paths.memory_file(*domid)); held && d.type == "hvm") {
        std::string_view text = *held;
        if (text.ends_with('\n')) text.remove_suffix(1);
        if (auto kib = xenbus::parse_uint(text); kib && *kib > 0 && (*kib >> 10) <= d.memory_mib) d.memory_mib = *kib >> 10;
      }
      d.vcpus = d.record->vcpus;
      if (domain_process_runs(*d.record)) d.pid = d.record->pid;
      // An HVM guest's vCPUs stopped (created paused, `xpv pause`): xpv-vmm keeps the file.
      if (auto st = read_file(paths.state_file(*domid)); st && d.pid != 0 && d.type == "hvm") d.paused = *st == "paused\n";
    }
  }
  if (xs != nullptr) {
    for (const std::string& s : xs->list("/local/domain")) {
      auto domid = parse_domid(s);
      if (!domid || *domid == 0) continue;
      DomainSummary& d = by_id[*domid];
      d.domid = *domid;
      d.in_xenstore = true;
      if (auto n = xs->read(domain_path(*domid) + "/name"); n && !n->empty()) d.name = *n;
      if (d.memory_mib == 0) {
        if (const auto node = xs->read(domain_path(*domid) + "/memory/target")) {
          if (const auto kib = xenbus::parse_uint(*node)) d.memory_mib = *kib / 1024;
        }
      }
    }
  }
  std::vector<DomainSummary> out;
  for (auto& [id, d] : by_id) {
    d.state = d.pid != 0 ? (d.paused ? "paused" : "running") : d.record ? "dead" : "unknown";
    out.push_back(std::move(d));
  }
  return out;
}

const DomainSummary& resolve_domain(const std::vector<DomainSummary>& domains, std::string_view which) {
  if (which == "Domain-0" || which == "0") {
    throw ToolstackError("Domain-0 is dom0 (the host): not a domain xpv manages");
  }
  if (auto id = parse_domid(which)) {
    for (const auto& d : domains) {
      if (d.domid == *id) return d;
    }
    throw ToolstackError(fmt::format("no domain with id {}", *id));
  }
  for (const auto& d : domains) {
    if (d.name == which) return d;
  }
  throw ToolstackError(fmt::format("no domain named '{}'", which));
}

std::string domain_label(const DomainSummary& d) {
  return fmt::format("{} (id {})", d.name.empty() ? std::string("(unnamed)") : d.name, d.domid);
}

std::string format_list(const std::vector<DomainSummary>& domains, const Dom0Facts& dom0) {
  std::size_t w = 24;
  for (const auto& d : domains) w = std::max(w, d.name.size() + 1);
  auto row = [&](const std::string& name, const std::string& id, const std::string& type,
                 const std::string& mem, const std::string& vcpus, const std::string& state) {
    return fmt::format("{:<{}}{:>5}  {:<8}{:>7}{:>6}  {}\n", name, w, id, type, mem, vcpus, state);
  };
  std::string s = row("Name", "ID", "Type", "Mem", "VCPUs", "State");
  s += row("Domain-0", "0", "dom0", std::to_string(dom0.memory_mib), std::to_string(dom0.vcpus), "running");
  for (const auto& d : domains) {
    s += row(d.name.empty() ? "-" : d.name, std::to_string(d.domid), d.type,
             d.memory_mib ? std::to_string(d.memory_mib) : "-", d.vcpus ? std::to_string(d.vcpus) : "-", d.state);
  }
  return s;
}

std::string format_list_json(const std::vector<DomainSummary>& domains, const Dom0Facts& dom0) {
  nlohmann::json a = nlohmann::json::array();
  a.push_back({{"domid", 0}, {"name", "Domain-0"}, {"type", "dom0"}, {"memory_mib", dom0.memory_mib},
               {"vcpus", dom0.vcpus}, {"state", "running"}, {"pid", 0}});
  for (const auto& d : domains) {
    a.push_back({{"domid", d.domid}, {"name", d.name}, {"type", d.type}, {"memory_mib", d.memory_mib},
                 {"vcpus", d.vcpus}, {"state", d.state}, {"pid", d.pid}});
  }
  return a.dump(2) + "\n";
}

Dom0Facts host_facts() {
  Dom0Facts f;
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) f.memory_mib = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) >> 20;
  f.vcpus = std::max(1u, std::thread::hardware_concurrency());
  return f;
}

}  // namespace xpv::toolstack
