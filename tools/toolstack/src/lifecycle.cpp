// What happens when a domain stops (xl's on_poweroff / on_reboot / on_crash), `xpv reboot` and
// `xpv sysrq` (docs/PROCESS-DOMAINS.md "Domain lifecycle").
//
// xl leaves one process per domain behind `xl create` that waits for the domain to shut down and
// then acts as its configuration says; `xpv monitor` is that process:
//
//   xpv create ──spawns──> domain process (xpv-vmm / xpv-front, --shutdown-file RUN/dom<N>/shutdown)
//              ──spawns──> xpv monitor N UUID   (pid in domain.json: monitor_pid)
//
//   monitor: wait for the domain process to end (pidfd; every 500 ms: is the record still ours?)
//            → take the run lock; the record is gone or another domain's: someone destroyed it, exit
//            → reason = RUN/dom<N>/shutdown (poweroff | reboot | crash; missing: crash — killed
//              or died without a word)
//            → the configured action for that reason:
//                destroy  : tear the domain down (as `xpv destroy`)
//                restart  : tear it down and, still holding the lock, `xpv create` its configuration
//                           again (a new domain id, as xl's restart; the new domain gets its own
//                           monitor)
//                preserve : leave it as it is (`xpv list` shows it dead) until `xpv destroy`
//
// `xpv destroy` (and `xpv shutdown`, which destroys) stops the monitor first, so a domain that the
// toolstack ends is not also acted on.
#include <fmt/chrono.h>
#include <fmt/core.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <ostream>
#include <thread>

#include "domain_ops.h"
#include "xpv/config/domain_config.h"
#include "xpv/domain/control.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/fs.h"
#include "xpv/toolstack/process.h"
#include "xpv/toolstack/record.h"
#include "xpv/toolstack/run_lock.h"
#include "xpv/toolstack/xenstore.h"
#include "xpv/unique_fd.h"
#include "xpv/xenbus/path.h"

namespace xpv::toolstack {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string shutdown_file(const Paths& p, DomId n) { return p.domain_dir(n) + "/shutdown"; }

pid_t spawn_monitor(const Paths& p, const DomainRecord& rec) {
  const std::string self = self_executable();
  std::error_code ec;
  return spawn({{self, "monitor", std::to_string(rec.domid), rec.uuid, "--run-dir", p.run_dir, "--log-dir", p.log_dir,
                 "--xenstore", p.xenstore_socket, "--netns-dir", p.netns_dir, "--bin-dir", p.bin_dir},
                {},
                p.log_file("monitor-" + rec.name),
                true},
               // `xpv` removed since we started (a monitor restarting its domain after an
               // uninstall): our own image still runs
               fs::exists(self, ec) ? std::string() : std::string("/proc/self/exe"));
}

namespace {

void log_line(Context& ctx, const std::string& msg) {
  ctx.out << fmt::format("{:%Y-%m-%d %H:%M:%S} xpv-monitor: {}\n", fmt::localtime(std::time(nullptr)), msg);
  ctx.out.flush();
}

bool ours(const std::optional<DomainRecord>& r, const std::string& uuid) { return r && r->uuid == uuid; }

// "poweroff" | "reboot" | "crash" from the domain's own word; anything else is a crash.
std::string shutdown_reason(const Paths& p, DomId n) {
  auto text = read_file(shutdown_file(p, n));
  std::string w = text ? *text : "";
  while (!w.empty() && std::isspace(static_cast<unsigned char>(w.back()))) w.pop_back();
  return w == "poweroff" || w == "reboot" ? w : "crash";
}

}  // namespace

int cmd_monitor(Context& ctx, DomId n, const std::string& uuid) {
  const Paths& p = ctx.paths;
  const std::string dir = p.domain_dir(n);
  auto rec = read_record(dir);
  if (!ours(rec, uuid)) {
    log_line(ctx, fmt::format("dom{}: no record of domain {} here; nothing to monitor", n, uuid));
    return 1;
  }
  log_line(ctx, fmt::format("{} (id {}, pid {}): on_poweroff = {}, on_reboot = {}, on_crash = {}", rec->name, n,
                            rec->pid, rec->on_poweroff, rec->on_reboot, rec->on_crash));
  const auto began = std::chrono::steady_clock::now();
  // (glibc 2.36's <sys/pidfd.h> declares pidfd_open without C linkage: the system call itself)
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, rec->pid, 0)));  // fails only if it is gone already
  while (pidfd && domain_process_runs(*rec)) {
    pollfd pfd{pidfd.get(), POLLIN, 0};
    if (::poll(&pfd, 1, 500) > 0) break;
    if (!ours(read_record(dir), uuid)) return 0;  // destroyed meanwhile (and we were not stopped)
  }

  // However long another command holds the lock (`xpv shutdown --timeout 120` of another
  // domain, a slow create): a monitor that gave up would leave its domain dead for good.
  std::optional<RunLock> lock;
  while (!lock) {
    try {
      lock.emplace(p.lock_file());
    } catch (const ToolstackError& e) {
      if (!ours(read_record(dir), uuid)) return 0;  // destroyed meanwhile
      log_line(ctx, fmt::format("{}; still waiting for it", e.what()));
    }
  }
  rec = read_record(dir);
  if (!ours(rec, uuid)) return 0;  // `xpv destroy` / `xpv shutdown` got there first
  const std::string reason = shutdown_reason(p, n);
  const std::string& action = reason == "poweroff" ? rec->on_poweroff : reason == "reboot" ? rec->on_reboot : rec->on_crash;
  const double ran = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  log_line(ctx, fmt::format("{} (id {}) stopped after {:.1f} s: {}; on_{} = {}", rec->name, n, ran, reason, reason,
                            action));
  if (action == "preserve") return 0;

  auto xs = Xenstore::try_connect(p.xenstore_socket);
  if (!xs) log_line(ctx, "xpv-xenstored is not running: cleaning up the host side only");
  const auto doms = gather_domains(p, xs.get());
  for (const auto& d : doms) {
    if (d.domid == n && ours(d.record, uuid)) {
      destroy_domain(ctx, xs.get(), d);
      break;
    }
  }
  log_line(ctx, fmt::format("{} (id {}) destroyed", rec->name, n));
  if (action != "restart") return 0;
  // The lock is kept through the re-create: a `xpv destroy` of this name waiting for it would
  // otherwise get in between, find no domain, and the domain would come back regardless.
  try {
    cmd_create(ctx, rec->config, true, /*lock_held=*/true);
  } catch (const std::exception& e) {
    log_line(ctx, fmt::format("cannot restart {} from {}: {}", rec->name, rec->config, e.what()));
    return 1;
  }
  log_line(ctx, fmt::format("{} restarted from {}", rec->name, rec->config));
  return 0;
}

void cmd_reboot(Context& ctx, const std::string& which, std::chrono::milliseconds timeout) {
  Xenstore xs(ctx.paths.xenstore_socket);
  DomainSummary d;
  {
    RunLock lock(ctx.paths.lock_file());
    d = live_domain(ctx, xs, which);
    // As `xl reboot`: only through the guest's PV drivers; a domain without them cannot be asked.
    const std::string control = domain_path(d.domid) + "/control";
    if (xs.read(control + "/feature-reboot").value_or("") != "1") {
      throw ToolstackError(fmt::format("{} does not offer reboot through its PV drivers (no control/feature-reboot); "
                                       "shut it down and create it again",
                                       domain_label(d)));
    }
    xs.write(control + "/shutdown", "reboot");
  }
  if (!wait_gone(d.pid, timeout)) {
    throw ToolstackError(fmt::format("{} was asked to reboot (control/shutdown) but is still running after {} s",
                                     domain_label(d), std::chrono::duration_cast<std::chrono::seconds>(timeout).count()));
  }
  const std::string action = d.record ? d.record->on_reboot : "restart";
  if (action != "restart") {
    ctx.out << fmt::format("Domain {} rebooted; on_reboot = {}: not restarted\n", domain_label(d), action);
    return;
  }
  // Its monitor destroys it and creates it again; wait for the new domain of that name to run, or
  // for the monitor to have finished without one (the guest stopped for another reason).
  const pid_t monitor = d.record ? d.record->monitor_pid : 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    const bool monitor_done = monitor <= 0 || !process_alive(monitor);
    for (const auto& nd : gather_domains(ctx.paths, &xs)) {
      if (nd.name == d.name && nd.pid > 0 && nd.pid != d.pid && nd.record && nd.record->monitor_pid > 0) {
        ctx.out << fmt::format("Rebooted domain {} (now id {}, pid {})\n", domain_label(d), nd.domid, nd.pid);
        return;
      }
    }
    if (monitor_done) break;
    std::this_thread::sleep_for(100ms);
  }
  throw ToolstackError(fmt::format("{} stopped but was not created again (see {})", domain_label(d),
                                   ctx.paths.log_file("monitor-" + d.name)));
}

void cmd_sysrq(Context& ctx, const std::string& which, const std::string& key) {
  if (key.size() != 1 || !std::isalnum(static_cast<unsigned char>(key[0]))) {
    throw ToolstackError(fmt::format("sysrq key '{}': expected one letter or digit", key));
  }
  Xenstore xs(ctx.paths.xenstore_socket);
  RunLock lock(ctx.paths.lock_file());
  const DomainSummary d = live_domain(ctx, xs, which);
  xs.write(domain_path(d.domid) + "/control/sysrq", key);
  ctx.out << fmt::format("Sent sysrq '{}' to {}\n", key, domain_label(d));
}

namespace {

// Pause or unpause through the domain's control socket (xpv-vmm stops or restarts its vCPUs and
// keeps RUN/dom<N>/state, which `xpv list` reads).
void pause_or_unpause(Context& ctx, const std::string& which, bool pause) {
  Xenstore xs(ctx.paths.xenstore_socket);
  RunLock lock(ctx.paths.lock_file());
  const DomainSummary d = live_domain(ctx, xs, which);
  const char* verb = pause ? "pause" : "unpause";
  if (d.type != "hvm") {
    throw ToolstackError(fmt::format("{} is a {} domain: it has no vCPUs to {}", domain_label(d), d.type, verb));
  }
  const std::string sock = ctx.paths.control_socket(d.domid);
  try {
    auto c = domain::ControlClient::connect(sock, "xpv");
    pause ? c.pause() : c.unpause();
  } catch (const domain::ControlError& e) {
    if (e.error() == EALREADY) {
      throw ToolstackError(fmt::format("{} is {} already", domain_label(d), pause ? "paused" : "running"));
    }
    if (e.error() == EBUSY) {
      throw ToolstackError(fmt::format("cannot pause {}: a vCPU did not stop in time (it runs on; see {})",
                                       domain_label(d), ctx.paths.log_file("xpv-vmm-" + d.name)));
    }
    throw ToolstackError(fmt::format("cannot {} {} ({}): {}", verb, domain_label(d), sock, e.what()));
  } catch (const std::exception& e) {
    throw ToolstackError(fmt::format("cannot {} {} ({}): {}", verb, domain_label(d), sock, e.what()));
  }
  ctx.out << fmt::format("{} {}\n", pause ? "Paused" : "Unpaused", domain_label(d));
}

}  // namespace

void cmd_pause(Context& ctx, const std::string& which) { pause_or_unpause(ctx, which, true); }
void cmd_unpause(Context& ctx, const std::string& which) { pause_or_unpause(ctx, which, false); }

// Below this a guest cannot keep even its kernel: refused as a mistake, not passed on.
constexpr std::uint64_t kMemSetFloorMib = 16;

void cmd_mem_set(Context& ctx, const std::string& which, const std::string& size) {
  const auto kib = config::parse_memory_kib(size);
  if (!kib) {
    throw ToolstackError(fmt::format("memory size '{}': expected a number with an optional unit (t, g, m, k, b; "
                                     "MiB without one), e.g. 256 or 1g",
                                     size));
  }
  Xenstore xs(ctx.paths.xenstore_socket);
  RunLock lock(ctx.paths.lock_file());
  const DomainSummary d = live_domain(ctx, xs, which);
  if (d.type != "hvm") {
    throw ToolstackError(fmt::format("{} is a {} domain: it has no balloon driver to give memory back",
                                     domain_label(d), d.type));
  }
  const std::string dom = domain_path(d.domid);
  std::uint64_t max = 0;  // KiB
  if (const auto node = xs.read(dom + "/memory/static-max")) {
    if (const auto v = xenbus::parse_uint(*node)) max = *v;
  }
  if (max == 0) throw ToolstackError(fmt::format("{} has no valid memory/static-max in xenstore", domain_label(d)));
  if (*kib > max) {
    throw ToolstackError(fmt::format("{} MiB is above {}'s maximum of {} MiB (its maxmem, memory/static-max)",
                                     *kib >> 10, domain_label(d), max >> 10));
  }
  if (*kib < (kMemSetFloorMib << 10)) {
    throw ToolstackError(fmt::format("{} KiB is below {} MiB, too little for any guest", *kib, kMemSetFloorMib));
  }
  xs.write(dom + "/memory/target", std::to_string(*kib));
  ctx.out << fmt::format("Set {}'s memory target to {} MiB of {} (its balloon driver moves to it)\n", domain_label(d),
                         *kib >> 10, max >> 10);
}

}  // namespace xpv::toolstack
