#include "xpv/toolstack/host_info.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <linux/kvm.h>
#include <sys/ioctl.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "domain_ops.h"
#include "xpv/kvm/cpu_list.h"
#include "xpv/toolstack/commands.h"
#include "xpv/toolstack/cpu_sched.h"
#include "xpv/toolstack/daemons.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/fs.h"
#include "xpv/toolstack/text.h"
#include "xpv/toolstack/inventory.h"
#include "xpv/toolstack/process.h"
#include "xpv/toolstack/xenstore.h"
#include "xpv/xen/config.h"

namespace xpv::toolstack {
namespace {

// Each "key : value" line of a /proc text, in order.
std::vector<std::pair<std::string_view, std::string_view>> fields(std::string_view text) {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    const std::size_t colon = line.find(':');
    out.emplace_back(trim_text(line.substr(0, colon)), colon == std::string_view::npos ? std::string_view() : trim_text(line.substr(colon + 1)));
  }
  return out;
}

}  // namespace

std::optional<CpuInfo> parse_cpuinfo(std::string_view text) {
  CpuInfo c;
  std::set<std::string> sockets;
  std::optional<unsigned> cores, siblings;
  for (auto [k, v] : fields(text)) {
    if (k == "physical id") sockets.insert(std::string(v));
    else if (k == "cpu cores" && !cores) cores = parse_number<unsigned>(v);
    else if (k == "siblings" && !siblings) siblings = parse_number<unsigned>(v);
    else if (k == "cpu MHz" && c.mhz == 0) {
      double d = 0;
      const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
      if (ec == std::errc() && p == v.data() + v.size()) c.mhz = d;
    }
  }
  if (!cores || !siblings || *cores == 0 || *siblings < *cores) return std::nullopt;
  c.sockets = std::max<unsigned>(1, static_cast<unsigned>(sockets.size()));
  c.cores_per_socket = *cores;
  c.threads_per_core = *siblings / *cores;
  return c;
}

std::optional<MemInfo> parse_meminfo(std::string_view text) {
  std::optional<std::uint64_t> total, avail;
  for (auto [k, v] : fields(text)) {
    if (!v.ends_with(" kB")) continue;
    const auto kib = parse_number<std::uint64_t>(trim_text(v.substr(0, v.size() - 3)));
    if (k == "MemTotal") total = kib;
    else if (k == "MemAvailable") avail = kib;
  }
  if (!total || !avail) return std::nullopt;
  return MemInfo{*total >> 10, *avail >> 10};
}

std::optional<std::uint64_t> process_start_ticks(std::string_view line) {
  // The name (field 2) is in parentheses and may hold anything: count from its last ')'.
  const std::size_t close = line.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(close + 1);
  for (int field = 3; field <= 22; ++field) {
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    const std::size_t sp = rest.find(' ');
    const std::string_view f = rest.substr(0, sp);
    if (f.empty()) return std::nullopt;
    if (field == 22) return parse_number<std::uint64_t>(trim_text(f));
    if (sp == std::string_view::npos) return std::nullopt;
    rest = rest.substr(sp);
  }
  return std::nullopt;
}

std::string format_info(const std::vector<std::pair<std::string, std::string>>& rows) {
  std::string out;
  for (const auto& [k, v] : rows) out += fmt::format("{:<23}: {}\n", k, v);
  return out;
}

std::string format_uptime(std::uint64_t seconds) {
  const std::uint64_t days = seconds / 86400, h = seconds % 86400 / 3600, m = seconds % 3600 / 60, s = seconds % 60;
  const std::string clock = fmt::format("{:>2}:{:02}:{:02}", h, m, s);  // xl: "%2d:%02d:%02d"
  if (days == 0) return clock;
  return fmt::format("{} day{}, {}", days, days == 1 ? "" : "s", clock);
}

std::string format_uptime_table(const std::vector<UptimeRow>& rows) {
  std::string out = fmt::format("{:<32} {:>5} {}\n", "Name", "ID", "Uptime");
  for (const auto& r : rows) out += fmt::format("{:<32} {:>5} {}\n", r.name, r.domid, format_uptime(r.seconds));
  return out;
}

namespace {

std::string kvm_line(bool* usable) {
  *usable = false;
  const int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return "absent (no /dev/kvm): HVM domains cannot run here";
  if (fd < 0) return fmt::format("/dev/kvm is there but cannot be opened by this user ({})", std::strerror(errno));
  const int api = ::ioctl(fd, KVM_GET_API_VERSION, 0);
  ::close(fd);
  if (api != KVM_API_VERSION) return fmt::format("/dev/kvm answers API version {}, not {}", api, KVM_API_VERSION);
  *usable = true;
  return fmt::format("/dev/kvm, API version {}", api);
}

// A sysfs CPU list file ("0-3,5"), or nullopt.
std::optional<kvm::CpuList> cpus_in(const std::string& path) {
  const auto t = read_file(path);
  if (!t) return std::nullopt;
  auto l = kvm::parse_cpu_list(std::string(trim_text(*t)));
  if (!l) return std::nullopt;
  return *l;
}

// Seconds since boot, from /proc/uptime.
std::optional<double> host_uptime() {
  const auto t = read_file("/proc/uptime");
  if (!t) return std::nullopt;
  double d = 0;
  std::istringstream in(*t);
  if (!(in >> d)) return std::nullopt;
  return d;
}

}  // namespace

void cmd_info(Context& ctx) {
  std::vector<std::pair<std::string, std::string>> rows;
  utsname u{};
  if (::uname(&u) == 0) {
    rows.emplace_back("host", u.nodename);
    rows.emplace_back("release", u.release);
    rows.emplace_back("version", u.version);
    rows.emplace_back("machine", u.machine);
  }
  const auto online = cpus_in("/sys/devices/system/cpu/online");
  rows.emplace_back("nr_cpus", online && online->cpus.any() ? std::to_string(online->cpus.count())
                                                             : std::to_string(::sysconf(_SC_NPROCESSORS_ONLN)));
  // As xl: the highest CPU id the host could ever bring online.
  if (const auto possible = cpus_in("/sys/devices/system/cpu/possible"); possible && possible->cpus.any()) {
    std::size_t max_id = 0;
    for (std::size_t c = 0; c < kvm::kMaxCpus; ++c) {
      if (possible->cpus.test(c)) max_id = c;
    }
    rows.emplace_back("max_cpu_id", std::to_string(max_id));
  }
  unsigned nodes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 4 && n.starts_with("node") && parse_number<unsigned>(std::string_view(n).substr(4))) ++nodes;
  }
  rows.emplace_back("nr_nodes", std::to_string(std::max(1u, nodes)));
  if (const auto t = read_file("/proc/cpuinfo")) {
    if (const auto c = parse_cpuinfo(*t)) {
      rows.emplace_back("cores_per_socket", std::to_string(c->cores_per_socket));
      // CPU 0's hyperthread siblings where the kernel says (cpuinfo's siblings / cores is not
      // whole on CPUs with cores of two kinds).
      const auto sib = cpus_in("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list");
      rows.emplace_back("threads_per_core", sib && sib->cpus.any() ? std::to_string(sib->cpus.count())
                                                                 : std::to_string(c->threads_per_core));
      if (c->mhz > 0) rows.emplace_back("cpu_mhz", fmt::format("{:.3f}", c->mhz));
    }
  }
  bool kvm_ok = false;
  const std::string kvm = kvm_line(&kvm_ok);
  rows.emplace_back("virt_caps", kvm_ok ? "hvm" : "none");
  rows.emplace_back("kvm", kvm);
  if (const auto t = read_file("/proc/meminfo")) {
    if (const auto m = parse_meminfo(*t)) {
      rows.emplace_back("total_memory", std::to_string(m->total_mib));
      // The host's MemAvailable: running guests may not have touched all of theirs yet.
      rows.emplace_back("free_memory", std::to_string(m->available_mib));
    }
  }
  const xen::PlatformConfig xen_defaults;
  rows.emplace_back("xen_major", std::to_string(xen_defaults.version_major));
  rows.emplace_back("xen_minor", std::to_string(xen_defaults.version_minor));
  rows.emplace_back("xen_extra", xen::kExtraVersion);
  rows.emplace_back("xen_version",
                    fmt::format("{}.{}{}", xen_defaults.version_major, xen_defaults.version_minor, xen::kExtraVersion));
  rows.emplace_back("xen_caps", xen::kCapabilities);
  const auto h = host_cpu_hierarchy();
  rows.emplace_back("xen_scheduler",
                    h ? fmt::format("Linux; cpu_weight and cap through the cgroup {} cpu controller at {}",
                                    h->version == CgroupVersion::v1 ? "v1" : "v2", h->mount)
                      : std::string("Linux; no cpu cgroup controller mounted (cpu_weight and cap are refused)"));
  rows.emplace_back("xen_pagesize", std::to_string(::sysconf(_SC_PAGESIZE)));
  if (const auto t = read_file("/proc/cmdline")) rows.emplace_back("xen_commandline", std::string(trim_text(*t)));
#if defined(__clang__)
  rows.emplace_back("cc_compiler", std::string("clang ") + __clang_version__);
#elif defined(__GNUC__)
  rows.emplace_back("cc_compiler", std::string("gcc ") + __VERSION__);
#endif
  rows.emplace_back("hypervisor", "xpv: the Xen HVM ABI on Linux/KVM (not Xen); hypercalls through rewritten stubs");
  const auto xs_pid = running_pid(ctx.paths.pid_file(kXenstored), kXenstored);
  rows.emplace_back("xenstored", xs_pid ? fmt::format("running (pid {}, {})", *xs_pid, ctx.paths.xenstore_socket)
                                        : std::string("not running (`xpv up` starts it)"));
  std::string backends;
  for (const auto& b : backend_programs()) {
    const auto pid = running_pid(ctx.paths.pid_file(b), b);
    backends += fmt::format("{}{} {}", backends.empty() ? "" : ", ", b,
                            pid ? fmt::format("running (pid {})", *pid) : std::string("not running"));
  }
  rows.emplace_back("backends", backends);
  auto xs = Xenstore::try_connect(ctx.paths.xenstore_socket);
  const auto doms = gather_domains(ctx.paths, xs.get());
  const auto running = std::count_if(doms.begin(), doms.end(), [](const DomainSummary& d) { return d.pid != 0 && !d.paused; });
  const auto paused = std::count_if(doms.begin(), doms.end(), [](const DomainSummary& d) { return d.pid != 0 && d.paused; });
  rows.emplace_back("domains", fmt::format("{} running, {} paused, {} in all", running, paused, doms.size()));
  ctx.out << format_info(rows);
}

void cmd_uptime(Context& ctx, const std::vector<std::string>& which) {
  const auto now = host_uptime();
  if (!now) throw ToolstackError("cannot read /proc/uptime");
  const long hz = ::sysconf(_SC_CLK_TCK);
  auto xs = Xenstore::try_connect(ctx.paths.xenstore_socket);
  const auto doms = gather_domains(ctx.paths, xs.get());
  std::vector<UptimeRow> rows;
  const UptimeRow host{"Domain-0", 0, static_cast<std::uint64_t>(*now)};
  // A domain's uptime is its domain process's: a domain created again (a reboot) starts over, as
  // a rebooted Xen guest is a new domain. nullopt: its process is gone (or going) by now.
  auto row_of = [&](const DomainSummary& d) -> std::optional<UptimeRow> {
    if (d.pid == 0 || hz <= 0) return std::nullopt;
    const auto stat = read_file(fmt::format("/proc/{}/stat", d.pid));
    const auto start = stat ? process_start_ticks(*stat) : std::nullopt;
    if (!start) return std::nullopt;
    const double began = static_cast<double>(*start) / static_cast<double>(hz);
    return UptimeRow{d.name, d.domid, static_cast<std::uint64_t>(std::max(0.0, *now - began))};
  };
  if (which.empty()) {
    rows.push_back(host);
    for (const auto& d : doms) {
      if (d.pid == 0) continue;
      if (auto r = row_of(d)) rows.push_back(std::move(*r));  // one that ended meanwhile is left out, as xl does
    }
  } else {
    for (const auto& w : which) {
      if (w == "0" || w == "Domain-0") {  // the host, as xl shows dom0
        rows.push_back(host);
        continue;
      }
      const DomainSummary& d = resolve_domain(doms, w);
      auto r = row_of(d);
      if (!r) throw ToolstackError(fmt::format("domain {} is not running (state {})", domain_label(d), d.state));
      rows.push_back(std::move(*r));
    }
  }
  ctx.out << format_uptime_table(rows);
}

}  // namespace xpv::toolstack
