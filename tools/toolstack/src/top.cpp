// `xpv top` (top.h): samples and the table.
#include "xpv/toolstack/top.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <thread>

#include "xpv/stats_file.h"
#include "xpv/toolstack/commands.h"
#include "xpv/toolstack/daemons.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/fs.h"
#include "xpv/toolstack/inventory.h"
#include "xpv/toolstack/process.h"
#include "xpv/toolstack/xenstore.h"
#include "xpv/xenbus/path.h"

namespace xpv::toolstack {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The statistics file RUN/stats/<name>, if one is published.
DeviceSample published(const Paths& paths, std::string name) {
  DeviceSample d;
  d.name = std::move(name);
  const std::string file = stats::stats_dir(paths.run_dir) + "/" + d.name;
  struct stat st {};
  if (auto text = read_file(file); text && ::stat(file.c_str(), &st) == 0) {
    d.published = true;
    d.published_at = static_cast<double>(st.st_mtim.tv_sec) + static_cast<double>(st.st_mtim.tv_nsec) / 1e9;
    d.counters = stats::parse(*text);
  }
  return d;
}

// The devices under the backend directory of one kind for one domain, with their counters.
std::vector<DeviceSample> devices(const Paths& paths, Xenstore* xs, const char* kind, std::uint16_t domid) {
  std::vector<DeviceSample> out;
  if (xs == nullptr) return out;
  for (const std::string& devid : xs->list(fmt::format("/local/domain/0/backend/{}/{}", kind, domid))) {
    if (!xenbus::parse_uint(devid)) continue;
    out.push_back(published(paths, fmt::format("{}{}.{}", kind, domid, devid)));
  }
  return out;
}

// Per second between the writer's two publications the samples read (its file's mtimes: the
// counters are up to a second older than the sample), for the counters both had; none when it
// has not published again since the previous sample.
std::map<std::string, double> rates(const DeviceSample& now, const DeviceSample* before) {
  std::map<std::string, double> out;
  if (before == nullptr || !before->published || !now.published || now.published_at <= before->published_at) {
    return out;
  }
  const double span = now.published_at - before->published_at;
  for (const auto& [k, v] : now.counters) {
    if (k == "queues" || k == "ballooned_pages") continue;  // levels, not counts
    if (auto it = before->counters.find(k); it != before->counters.end() && v >= it->second) {
      out[k] = static_cast<double>(v - it->second) / span;
    }
  }
  return out;
}

std::uint64_t sum(const std::vector<DeviceSample>& devs, const char* key) {
  std::uint64_t s = 0;
  for (const auto& d : devs) {
    if (auto it = d.counters.find(key); it != d.counters.end()) s += it->second;
  }
  return s;
}

// CPU share over the interval, percent of one CPU; nullopt when it cannot be said.
std::optional<double> cpu_pct(pid_t p0, std::optional<double> c0, double t0, pid_t p1, std::optional<double> c1,
                              double t1) {
  if (p0 == 0 || p0 != p1 || !c0 || !c1 || t1 <= t0 || *c1 < *c0) return std::nullopt;
  return (*c1 - *c0) / (t1 - t0) * 100.0;
}

// The element of `v` whose `key` member equals `value`, or nullptr.
template <class T, class K, class V>
const T* find_by(const std::vector<T>& v, K T::*key, const V& value) {
  const auto it = std::ranges::find(v, value, key);
  return it == v.end() ? nullptr : &*it;
}

// The previous sample's xpv-vmm counters of the same process as `d`'s (a domid can be reused, a
// guest restarted between two samples), or nullptr.
const DeviceSample* same_vmm(const TopSample& prev, const DomainSample& d) {
  const DomainSample* p = find_by(prev.domains, &DomainSample::domid, d.domid);
  return p != nullptr && p->pid != 0 && p->pid == d.pid ? &p->vmm : nullptr;
}

std::optional<double> domain_cpu_pct(const TopSample& prev, const TopSample& cur, const DomainSample& d) {
  const DomainSample* p = find_by(prev.domains, &DomainSample::domid, d.domid);
  if (p == nullptr) return std::nullopt;
  return cpu_pct(p->pid, p->cpu_s, prev.time_s, d.pid, d.cpu_s, cur.time_s);
}

std::optional<double> daemon_cpu_pct(const TopSample& prev, const TopSample& cur, const DaemonSample& d) {
  const DaemonSample* p = find_by(prev.daemons, &DaemonSample::program, d.program);
  if (p == nullptr) return std::nullopt;
  return cpu_pct(p->pid, p->cpu_s, prev.time_s, d.pid, d.cpu_s, cur.time_s);
}

}  // namespace

std::optional<double> parse_proc_stat_cpu(const std::string& text, long ticks_per_second) {
  const auto f = proc_stat_fields(text);
  if (f.size() < 13 || ticks_per_second <= 0) return std::nullopt;
  std::uint64_t ticks[2] = {};
  for (int i = 0; i < 2; ++i) {
    const std::string_view v = f[11 + i];
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), ticks[i]);
    if (ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
  }
  return static_cast<double>(ticks[0] + ticks[1]) / static_cast<double>(ticks_per_second);
}

std::optional<double> process_cpu_seconds(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  const auto text = read_file(fmt::format("/proc/{}/stat", pid));
  if (!text) return std::nullopt;
  return parse_proc_stat_cpu(*text, ::sysconf(_SC_CLK_TCK));
}

TopSample sample_top(const Paths& paths, Xenstore* xs) {
  TopSample s;
  s.time_s = now_s();
  for (const DomainSummary& d : gather_domains(paths, xs)) {
    DomainSample x;
    x.domid = d.domid;
    x.name = d.name.empty() ? "-" : d.name;
    x.type = d.type;
    x.state = d.state;
    x.mem_kib = d.memory_mib * 1024;
    x.vcpus = d.vcpus;
    x.pid = d.pid;
    x.cpu_s = process_cpu_seconds(d.pid);
    x.vbds = devices(paths, xs, "vbd", d.domid);
    x.vifs = devices(paths, xs, "vif", d.domid);
    if (x.type == "hvm") {  // only HVM has an xpv-vmm; its file is where `xpv create` told it to write
      x.vmm = published(paths, std::filesystem::path(paths.vmm_stats_file(d.domid)).filename().string());
    }
    s.domains.push_back(std::move(x));
  }
  std::vector<std::string> programs = backend_programs();
  programs.push_back(kXenstored);
  for (const std::string& program : programs) {
    DaemonSample d;
    d.program = program;
    if (auto pid = running_pid(paths.pid_file(program), program)) {
      d.pid = *pid;
      d.cpu_s = process_cpu_seconds(*pid);
    }
    s.daemons.push_back(std::move(d));
  }
  s.time_s = (s.time_s + now_s()) / 2;  // the middle of the reads
  return s;
}

std::string format_top(const TopSample& prev, const TopSample& cur) {
  auto pct = [](std::optional<double> v) { return v ? fmt::format("{:.1f}", *v) : std::string("-"); };
  std::string out = fmt::format("{:>16} {:>4} {:<8} {:>9} {:>6} {:>10} {:>5} {:>4} {:>10} {:>10} {:>4} {:>9} {:>9} {:>10} {:>10} {:>9}\n",
                                "NAME", "ID", "STATE", "CPU(sec)", "CPU(%)", "MEM(k)", "VCPUS", "NETS", "NETTX(k)",
                                "NETRX(k)", "VBDS", "VBD_RD", "VBD_WR", "VBD_RSECT", "VBD_WSECT", "EXITS/s");
  for (const DomainSample& d : cur.domains) {
    const auto r = rates(d.vmm, same_vmm(prev, d));
    const auto exits = r.find("exits");
    out += fmt::format("{:>16} {:>4} {:<8} {:>9} {:>6} {:>10} {:>5} {:>4} {:>10} {:>10} {:>4} {:>9} {:>9} {:>10} {:>10} {:>9}\n",
                       d.name, d.domid, d.state, d.cpu_s ? fmt::format("{:.0f}", *d.cpu_s) : "-",
                       pct(domain_cpu_pct(prev, cur, d)), d.mem_kib, d.vcpus, d.vifs.size(),
                       sum(d.vifs, "tx_bytes") / 1024, sum(d.vifs, "rx_bytes") / 1024, d.vbds.size(),
                       sum(d.vbds, "rd_req"), sum(d.vbds, "wr_req"), sum(d.vbds, "rd_sect"), sum(d.vbds, "wr_sect"),
                       exits == r.end() ? std::string("-") : fmt::format("{:.0f}", exits->second));
  }
  std::string line;
  for (const DaemonSample& d : cur.daemons) {
    line += fmt::format("{}{} {}", line.empty() ? "" : ", ", d.program,
                        d.pid == 0 ? std::string("not running") : pct(daemon_cpu_pct(prev, cur, d)) + "% CPU");
  }
  out += "dom0 services: " + line + "\n";
  return out;
}

nlohmann::json top_json(const TopSample& prev, const TopSample& cur) {
  const double dt = cur.time_s - prev.time_s;
  auto opt = [](std::optional<double> v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  auto dev = [](const DeviceSample& d, const DeviceSample* before) {
    nlohmann::json per_second = nlohmann::json::object();
    for (const auto& [k, v] : rates(d, before)) per_second[k] = v;
    return nlohmann::json{{"name", d.name}, {"published", d.published}, {"counters", d.counters}, {"per_second", per_second}};
  };
  auto devs = [&](const std::vector<DeviceSample>& now, const std::vector<DeviceSample>* before) {
    nlohmann::json a = nlohmann::json::array();
    for (const DeviceSample& d : now) a.push_back(dev(d, before ? find_by(*before, &DeviceSample::name, d.name) : nullptr));
    return a;
  };
  nlohmann::json doms = nlohmann::json::array();
  for (const DomainSample& d : cur.domains) {
    const DomainSample* p = find_by(prev.domains, &DomainSample::domid, d.domid);
    doms.push_back({{"id", d.domid},
                    {"name", d.name},
                    {"type", d.type},
                    {"state", d.state},
                    {"pid", d.pid},
                    {"cpu_s", opt(d.cpu_s)},
                    {"cpu_pct", opt(domain_cpu_pct(prev, cur, d))},
                    {"mem_kib", d.mem_kib},
                    {"vcpus", d.vcpus},
                    {"vbds", devs(d.vbds, p ? &p->vbds : nullptr)},
                    {"vifs", devs(d.vifs, p ? &p->vifs : nullptr)},
                    {"vmm", d.type == "hvm" ? dev(d.vmm, same_vmm(prev, d)) : nlohmann::json(nullptr)}});
  }
  nlohmann::json daemons = nlohmann::json::array();
  for (const DaemonSample& d : cur.daemons) {
    daemons.push_back({{"program", d.program}, {"pid", d.pid}, {"cpu_s", opt(d.cpu_s)},
                       {"cpu_pct", opt(daemon_cpu_pct(prev, cur, d))}});
  }
  return {{"interval_s", dt}, {"domains", doms}, {"dom0_services", daemons}};
}

void cmd_top(Context& ctx, const TopOptions& o) {
  if (!(o.delay_s >= 0.1 && o.delay_s <= 3600)) throw ToolstackError(fmt::format("--delay {}: not between 0.1 and 3600 seconds", o.delay_s));
  auto xs = Xenstore::try_connect(ctx.paths.xenstore_socket);
  if (!xs) ctx.err << fmt::format("warning: xpv-xenstored is not running (no {}); no devices shown\n", ctx.paths.xenstore_socket);
  const bool clear = !o.batch && !o.json && ::isatty(STDOUT_FILENO) == 1;
  TopSample prev = sample_top(ctx.paths, xs.get());
  for (unsigned i = 0; o.iterations == 0 || i < o.iterations; ++i) {
    std::this_thread::sleep_for(std::chrono::duration<double>(o.delay_s));
    TopSample cur = sample_top(ctx.paths, xs.get());
    if (o.json) {
      ctx.out << top_json(prev, cur).dump() << "\n";
    } else {
      if (clear) ctx.out << "\x1b[H\x1b[2J";
      ctx.out << format_top(prev, cur);
      if (o.batch) ctx.out << "\n";
    }
    ctx.out.flush();
    prev = std::move(cur);
  }
}

}  // namespace xpv::toolstack
