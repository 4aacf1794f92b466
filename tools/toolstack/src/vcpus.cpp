#include "xpv/toolstack/vcpus.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

#include "domain_ops.h"
#include "xpv/domain/control.h"
#include "xpv/kvm/cpu_list.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/fs.h"
#include "xpv/toolstack/run_lock.h"
#include "xpv/toolstack/xenstore.h"

namespace xpv::toolstack {

std::optional<TaskStat> read_task_stat(std::string_view line) {
  const std::size_t close = line.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::vector<std::string_view> f;  // f[0] is field 3 of proc(5) (state)
  std::size_t i = close + 1;
  while (i < line.size() && f.size() < 40) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\n')) ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\n') ++i;
    if (i > start) f.push_back(line.substr(start, i - start));
  }
  if (f.size() < 37 || f[0].size() != 1) return std::nullopt;
  auto num = [](std::string_view s, auto& out) {
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && p == s.data() + s.size();
  };
  TaskStat t;
  t.state = f[0][0];
  std::uint64_t utime = 0, stime = 0;
  if (!num(f[11], utime) || !num(f[12], stime) || !num(f[36], t.cpu)) return std::nullopt;  // fields 14, 15, 39
  t.ticks = utime + stime;
  return t;
}

std::string format_vcpu_list(const std::vector<VcpuRow>& rows) {
  std::string out = fmt::format("{:<32} {:>5} {:>5} {:>5} {:>5} {:>9}  {}\n", "Name", "ID", "VCPU", "CPU", "State",
                                "Time(s)", "Affinity (Hard / Soft)");
  for (const VcpuRow& r : rows) {
    std::string state = "---";
    if (r.paused) state = "--p";
    else if (r.tid != 0 && r.stat.state == 'R') state = "r--";
    else if (r.tid != 0) state = "-b-";
    const std::string cpu = r.tid != 0 && r.stat.cpu >= 0 ? std::to_string(r.stat.cpu) : "-";
    const std::string secs = r.tid != 0 ? fmt::format("{:.1f}", r.seconds) : "-";
    out += fmt::format("{:<32} {:>5} {:>5} {:>5} {:>5} {:>9}  {} / all\n", r.name, r.domid, r.vcpu, cpu, state, secs,
                       r.affinity.empty() ? "-" : r.affinity);
  }
  return out;
}

namespace {

std::string task_dir(pid_t pid, pid_t tid) { return fmt::format("/proc/{}/task/{}", pid, tid); }

// The domain's vCPU thread ids, from its xpv-vmm. Throws ToolstackError naming the domain.
std::vector<std::uint32_t> vcpu_threads(Context& ctx, const DomainSummary& d) {
  if (d.type != "hvm") {
    throw ToolstackError(fmt::format("{} is a {} domain: it has no vCPUs to place", domain_label(d), d.type));
  }
  const std::string sock = ctx.paths.control_socket(d.domid);
  try {
    auto c = domain::ControlClient::connect(sock, "xpv");
    return c.vcpu_threads();
  } catch (const std::exception& e) {
    throw ToolstackError(fmt::format("cannot ask {} for its vCPUs ({}): {}", domain_label(d), sock, e.what()));
  }
}

std::vector<VcpuRow> rows_of(Context& ctx, const DomainSummary& d) {
  const auto tids = vcpu_threads(ctx, d);
  const long hz = ::sysconf(_SC_CLK_TCK);
  const auto online_text = read_file("/sys/devices/system/cpu/online");
  std::optional<kvm::CpuList> online;
  if (online_text) {
    if (auto l = kvm::parse_cpu_list(*online_text)) online = *l;
  }
  std::vector<VcpuRow> rows;
  for (std::size_t i = 0; i < tids.size(); ++i) {
    VcpuRow r;
    r.name = d.name;
    r.domid = d.domid;
    r.vcpu = static_cast<unsigned>(i);
    r.paused = d.paused;
    // Only a thread of this domain's xpv-vmm: a tid it no longer has reads as no thread.
    const pid_t tid = static_cast<pid_t>(tids[i]);
    const auto line = tid > 0 ? read_file(task_dir(d.pid, tid) + "/stat") : std::nullopt;
    const auto st = line ? read_task_stat(*line) : std::nullopt;
    if (st) {
      r.tid = tid;
      r.stat = *st;
      r.seconds = hz > 0 ? static_cast<double>(st->ticks) / static_cast<double>(hz) : 0;
      if (auto a = kvm::cpus_of_thread(tid)) {
        // As xl: "all" for a thread that may run on every CPU the host has online.
        r.affinity = online && (online->cpus & ~a->cpus).none() ? "all" : kvm::format_cpu_list(*a);
      }
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace

void cmd_vcpu_list(Context& ctx, const std::vector<std::string>& which) {
  Xenstore xs(ctx.paths.xenstore_socket);
  const auto doms = gather_domains(ctx.paths, &xs);
  std::vector<VcpuRow> rows;
  if (which.empty()) {
    // Every running HVM domain (process domains have no vCPU threads), as xl lists every domain.
    for (const DomainSummary& d : doms) {
      if (d.type != "hvm" || d.pid == 0) continue;
      try {
        auto r = rows_of(ctx, d);
        rows.insert(rows.end(), r.begin(), r.end());
      } catch (const ToolstackError& e) {
        ctx.err << "warning: " << e.what() << "\n";  // one domain going away does not hide the others
      }
    }
  } else {
    for (const std::string& w : which) {
      const DomainSummary& d = resolve_domain(doms, w);
      if (d.pid == 0) throw ToolstackError(fmt::format("domain {} is not running (state {})", domain_label(d), d.state));
      auto r = rows_of(ctx, d);
      rows.insert(rows.end(), r.begin(), r.end());
    }
  }
  ctx.out << format_vcpu_list(rows);
}

void cmd_vcpu_pin(Context& ctx, const std::string& which, const std::string& vcpu, const std::string& cpus) {
  const auto list = kvm::parse_cpu_list(cpus);
  if (!list) throw ToolstackError("CPU list " + list.error().message);
  Xenstore xs(ctx.paths.xenstore_socket);
  RunLock lock(ctx.paths.lock_file());
  const DomainSummary d = live_domain(ctx, xs, which);
  const auto tids = vcpu_threads(ctx, d);
  std::uint32_t target = domain::control::kAllVcpus;
  if (vcpu != "all") {
    unsigned v = 0;
    const auto [p, ec] = std::from_chars(vcpu.data(), vcpu.data() + vcpu.size(), v);
    if (ec != std::errc() || p != vcpu.data() + vcpu.size() || vcpu.empty()) {
      throw ToolstackError(fmt::format("vCPU '{}': expected a vCPU number or all", vcpu));
    }
    if (v >= tids.size()) {
      throw ToolstackError(fmt::format("{} has {} vCPU(s): there is no vCPU {}", domain_label(d), tids.size(), v));
    }
    target = v;
  }
  // xpv-vmm places its own threads (under the lock their start and end take, so never a thread
  // id that has gone to another process), all of them or none; one not started yet takes the set
  // as it starts.
  domain::ControlHandler::CpuMask mask{};
  for (std::size_t c = 0; c < kvm::kMaxCpus; ++c) {
    if (list->cpus.test(c)) mask[c / 64] |= std::uint64_t{1} << (c % 64);
  }
  const std::string sock = ctx.paths.control_socket(d.domid);
  try {
    auto c = domain::ControlClient::connect(sock, "xpv");
    c.set_vcpu_affinity(target, mask);
  } catch (const domain::ControlError& e) {
    if (e.error() == EINVAL) {
      throw ToolstackError(fmt::format("cannot place {} vCPU {} on CPUs {}: its xpv-vmm may use none of them (see {})",
                                       domain_label(d), vcpu, kvm::format_cpu_list(*list),
                                       ctx.paths.log_file("xpv-vmm-" + d.name)));
    }
    throw ToolstackError(fmt::format("cannot place {} vCPU {} ({}): {}", domain_label(d), vcpu, sock, e.what()));
  } catch (const std::exception& e) {
    throw ToolstackError(fmt::format("cannot place {} vCPU {} ({}): {}", domain_label(d), vcpu, sock, e.what()));
  }
  // What the kernel made of it (it keeps only the CPUs the thread's cpuset allows), read back
  // from the first thread placed.
  std::string applied = kvm::format_cpu_list(*list);
  const std::size_t first = target == domain::control::kAllVcpus ? 0 : target;
  if (first < tids.size() && tids[first] != 0) {
    const pid_t tid = static_cast<pid_t>(tids[first]);
    if (read_file(task_dir(d.pid, tid) + "/stat")) {
      if (auto a = kvm::cpus_of_thread(tid)) applied = kvm::format_cpu_list(*a);
    }
  }
  ctx.out << fmt::format("{}: vCPU {} on CPUs {}\n", domain_label(d), vcpu, applied);
}

}  // namespace xpv::toolstack
