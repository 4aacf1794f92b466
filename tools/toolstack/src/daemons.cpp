// xpv up / down / supervise (see daemons.h for the process tree).
#include "xpv/toolstack/daemons.h"

#include <fmt/chrono.h>
#include <fmt/core.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <thread>

#include "domain_ops.h"
#include "xpv/toolstack/commands.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/fs.h"
#include "xpv/toolstack/inventory.h"
#include "xpv/toolstack/process.h"
#include "xpv/toolstack/run_lock.h"
#include "xpv/toolstack/xenstore.h"

namespace xpv::toolstack {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::vector<std::string> daemon_argv(const Paths& paths, const std::string& program, bool xenstored_run_dir,
                                     bool xenstored_journal) {
  if (program == kXenstored) {
    std::vector<std::string> a = {paths.binary(program), "--socket", paths.xenstore_socket, "--foreground",
                                  "--pid-file", paths.pid_file(program)};
    if (xenstored_run_dir) a.insert(a.end(), {"--run-dir", paths.run_dir});
    if (xenstored_journal) a.insert(a.end(), {"--journal", paths.xenstored_journal()});
    return a;
  }
  return {paths.binary(program), "--xenstore", paths.xenstore_socket, "--run-dir", paths.run_dir, "--foreground",
          "--pid-file", paths.pid_file(program)};
}

std::vector<std::string> daemon_env(const Paths& paths) {
  return {"XPV_RUN_DIR=" + paths.run_dir, "XENSTORED_PATH=" + paths.xenstore_socket};
}

std::vector<std::string> supervisor_argv(const Paths& paths, const std::string& self_exe) {
  return {self_exe,   "supervise",     "--run-dir", paths.run_dir, "--log-dir", paths.log_dir,
          "--xenstore", paths.xenstore_socket, "--bin-dir", paths.bin_dir};
}

std::chrono::milliseconds backoff_delay(unsigned consecutive_failures) {
  const unsigned shift = std::min(consecutive_failures, 6u);
  return std::min<std::chrono::milliseconds>(200ms * (1u << shift), 10s);
}

namespace {

bool built(const Paths& paths, const std::string& program) {
  return ::access(paths.binary(program).c_str(), X_OK) == 0;
}

std::optional<pid_t> supervisor_pid(const Paths& paths) {
  return running_pid(paths.pid_file(kSupervisor), fs::path(self_executable()).filename().string(), "supervise");
}

// Polls `ready` every 20 ms until it holds, the process `pid` (our child) is gone, or `timeout`.
// Throws ToolstackError with the log's last line when the daemon died or never got ready.
void wait_started(const std::string& program, pid_t pid, const std::string& log,
                  std::chrono::milliseconds timeout, const std::function<bool()>& ready) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (ready()) return;
    int status = 0;
    if (child_exited(pid, &status) || !process_alive(pid)) {
      throw ToolstackError(fmt::format("{} failed to start ({}): {} (log: {})", program, describe_status(status),
                                       last_line(log), log));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      stop_process(pid, 2s);
      throw ToolstackError(fmt::format("{} did not get ready within {} s: {} (log: {})", program,
                                       std::chrono::duration_cast<std::chrono::seconds>(timeout).count(),
                                       last_line(log), log));
    }
    std::this_thread::sleep_for(20ms);
  }
}

// Whether `binary --help` mentions `flag` (bounded: 5 s). The help goes through a file in
// `scratch_dir`, removed afterwards.
bool help_mentions(const std::string& binary, const std::string& flag, const std::string& scratch_dir) {
  const std::string out = scratch_dir + "/.help-" + std::to_string(::getpid());
  bool found = false;
  try {
    const pid_t pid = spawn({{binary, "--help"}, {}, out, true});
    if (wait_gone(pid, 5s)) {
      const std::string text = read_from(out, 0, 1 << 16);
      found = text.find(flag + " ") != std::string::npos || text.find(flag + "\n") != std::string::npos ||
              text.find(flag + ",") != std::string::npos;
    } else {
      stop_process(pid, 1s);
    }
  } catch (const ToolstackError&) {
  }
  std::error_code ec;
  fs::remove(out, ec);
  return found;
}

void remove_file(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
}

bool journal_exists(const Paths& p) {
  std::error_code ec;
  return fs::exists(p.xenstored_journal(), ec);
}

// Starts xpv-xenstored as `xpv up` runs it and waits until it serves (10 s). With its journal
// present (the last one did not stop cleanly) it recovers the store from it. Returns its pid.
pid_t start_xenstored(const Paths& p) {
  const std::string log = p.log_file(kXenstored);
  const bool run_dir_flag = help_mentions(p.binary(kXenstored), "--run-dir", p.run_dir);
  const bool journal_flag = help_mentions(p.binary(kXenstored), "--journal", p.run_dir);
  const pid_t pid = spawn({daemon_argv(p, kXenstored, run_dir_flag, journal_flag), daemon_env(p), log, true});
  wait_started(kXenstored, pid, log, 10s, [&] {
    return read_pid_file(p.pid_file(kXenstored)) == pid && Xenstore::try_connect(p.xenstore_socket) != nullptr;
  });
  return pid;
}

}  // namespace

void cmd_up(Context& ctx) {
  const Paths& p = ctx.paths;
  make_dirs(p.run_dir, 0700);
  make_dirs(p.log_dir, 0755);
  RunLock lock(p.lock_file());

  // 1. xpv-xenstored.
  if (auto running = running_pid(p.pid_file(kXenstored), kXenstored)) {
    ctx.out << fmt::format("{}: already running (pid {})\n", kXenstored, *running);
  } else {
    bool recovering = false;
    if (auto stale = read_pid_file(p.pid_file(kXenstored))) {
      auto doms = gather_domains(p, nullptr);
      recovering = journal_exists(p);
      if (!doms.empty() && !recovering) {
        throw ToolstackError(fmt::format(
            "{} (pid {}) has died and cannot be restarted: it left no journal, so the xenstore of {} domain(s) is "
            "lost; run `xpv down --force`, then `xpv up`",
            kXenstored, *stale, doms.size()));
      }
      remove_file(p.pid_file(kXenstored));
    }
    if (Xenstore::try_connect(p.xenstore_socket)) {
      throw ToolstackError(fmt::format("another xenstored (not started by `xpv up`) listens on {}",
                                       p.xenstore_socket));
    }
    if (!built(p, kXenstored)) throw ToolstackError(fmt::format("{} is not built (no {})", kXenstored, p.binary(kXenstored)));
    make_dirs(fs::path(p.xenstore_socket).parent_path().string(), 0755);
    const pid_t pid = start_xenstored(p);
    ctx.out << fmt::format("{}: started (pid {}, socket {}){}\n", kXenstored, pid, p.xenstore_socket,
                           recovering ? ", recovered from its journal" : "");
  }
  {
    Xenstore xs(p.xenstore_socket);
    if (!xs.exists("/local/domain/0/name")) xs.transaction([&](TxId tx) { xs.write_nodes(dom0_nodes(), tx); });
  }

  // 2. The supervisor, which starts the backends.
  std::optional<pid_t> sup = supervisor_pid(p);
  if (sup) {
    ctx.out << fmt::format("{}: already running (pid {})\n", kSupervisor, *sup);
  } else {
    const std::string log = p.log_file(kSupervisor);
    const pid_t pid = spawn({supervisor_argv(p, self_executable()), daemon_env(p), log, true});
    wait_started(kSupervisor, pid, log, 10s, [&] { return supervisor_pid(p) == pid; });
    ctx.out << fmt::format("{}: started (pid {})\n", kSupervisor, pid);
    sup = pid;
  }

  // 3. The backends, as the supervisor reports them through their pid files.
  for (const std::string& b : backend_programs()) {
    if (!built(p, b)) {
      ctx.out << fmt::format("{}: not built (no {}); skipped\n", b, p.binary(b));
      continue;
    }
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    std::optional<pid_t> pid;
    while (!(pid = running_pid(p.pid_file(b), b)) && std::chrono::steady_clock::now() < deadline &&
           process_alive(*sup)) {
      std::this_thread::sleep_for(20ms);
    }
    if (!pid && !process_alive(*sup)) {
      throw ToolstackError(fmt::format("{} is not running, and the supervisor (pid {}) exited: {} (log: {})", b, *sup,
                                       last_line(p.log_file(kSupervisor)), p.log_file(kSupervisor)));
    }
    if (!pid) {
      throw ToolstackError(fmt::format("{} is not running: {} (log: {}); the supervisor keeps trying", b,
                                       last_line(p.log_file(b)), p.log_file(b)));
    }
    ctx.out << fmt::format("{}: running (pid {}), supervised\n", b, *pid);
  }
}

void cmd_live_update(Context& ctx, const std::string& binary, std::chrono::seconds timeout, bool force) {
  const Paths& p = ctx.paths;
  const auto pid = running_pid(p.pid_file(kXenstored), kXenstored);
  if (!pid) throw ToolstackError(fmt::format("{} is not running (no live pid in {}); run `xpv up`", kXenstored, p.pid_file(kXenstored)));
  const std::string bin = binary.empty() ? p.binary(kXenstored) : fs::absolute(binary).string();
  RunLock lock(p.lock_file());
  Xenstore xs(p.xenstore_socket);
  std::string r = xs.control({"live-update", "-f", bin}, "live-update");
  if (r != "OK") throw ToolstackError(r);
  std::vector<std::string> start{"live-update", "-s", "-t", std::to_string(timeout.count())};
  if (force) start.push_back("-F");
  // Xen's tool asks until its own timeout, plus a second for the daemon to report its own.
  const auto deadline = std::chrono::steady_clock::now() + timeout + 2s;
  while (true) {
    r = xs.control(start, "live-update");
    if (r != "BUSY" || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(1s);
  }
  if (r != "OK") {
    try {
      (void)xs.control({"live-update", "-a"}, "live-update");
    } catch (const ToolstackError&) {
    }
    throw ToolstackError(r == "BUSY" ? fmt::format("transactions stayed open for {} s; --force ends them", timeout.count()) : r);
  }
  ctx.out << fmt::format("{}: live update done (pid {}, now {})\n", kXenstored, *pid, bin);
}

void cmd_down(Context& ctx, bool force) {
  const Paths& p = ctx.paths;
  if (!fs::exists(p.run_dir)) {
    ctx.out << "nothing is running\n";
    return;
  }
  RunLock lock(p.lock_file());
  bool stopped_any = false;

  auto xs = Xenstore::try_connect(p.xenstore_socket);
  auto doms = gather_domains(p, xs.get());
  if (!doms.empty()) {
    std::string names;
    for (const auto& d : doms) names += (names.empty() ? "" : ", ") + domain_label(d);
    if (!force) {
      throw ToolstackError(fmt::format("{} domain(s) still exist ({}): destroy them first, or use `xpv down --force`",
                                       doms.size(), names));
    }
    for (const auto& d : doms) {
      try {
        destroy_domain(ctx, xs.get(), d);
      } catch (const std::exception& e) {
        ctx.err << fmt::format("warning: destroying {}: {}\n", domain_label(d), e.what());
      }
    }
  }

  // Backends first (the supervisor stops them; anything it left is stopped here), then xenstored.
  std::map<std::string, pid_t> backends;
  for (const std::string& b : backend_programs()) {
    if (auto pid = running_pid(p.pid_file(b), b)) backends[b] = *pid;
  }
  if (auto sup = supervisor_pid(p)) {
    stop_process(*sup, 15s);
    ctx.out << fmt::format("{}: stopped (pid {})\n", kSupervisor, *sup);
    stopped_any = true;
  }
  remove_file(p.pid_file(kSupervisor));
  for (const auto& [b, pid] : backends) {
    if (process_is(pid, b)) stop_process(pid, 5s);
    ctx.out << fmt::format("{}: stopped (pid {})\n", b, pid);
    stopped_any = true;
  }
  for (const std::string& b : backend_programs()) remove_file(p.pid_file(b));

  xs.reset();
  if (auto pid = running_pid(p.pid_file(kXenstored), kXenstored)) {
    stop_process(*pid, 10s);
    ctx.out << fmt::format("{}: stopped (pid {})\n", kXenstored, *pid);
    stopped_any = true;
  }
  remove_file(p.pid_file(kXenstored));
  remove_file(p.xenstored_journal());  // no domain is left to recover (one killed, not stopped, leaves it)
  if (!stopped_any) ctx.out << "nothing was running\n";
}

// ── the supervisor ─────────────────────────────────────────────────────────────────────────────
//
//   start every built backend
//   loop (wakes on SIGCHLD, SIGTERM/SIGINT/SIGHUP, or every 500 ms):
//     SIGTERM/SIGINT/SIGHUP  → stop the backends, remove their pid files and ours, exit 0
//     a backend died         → log it; restart it after backoff_delay(quick deaths in a row)
//     xpv-xenstored is gone  → it left its journal (it did not stop cleanly): start it again (it
//                              recovers the store and attaches the domains again), then restart
//                              every backend (their xenstore connection went with it);
//                              no journal, or the new one fails to start: log that it is fatal,
//                              stop the backends, exit 1 (`xpv up` then refuses until
//                              `xpv down --force`)
namespace {

struct Supervised {
  std::string program;
  pid_t pid = 0;
  std::chrono::steady_clock::time_point started;
  std::chrono::steady_clock::time_point restart_at;
  unsigned quick_deaths = 0;
  unsigned restarts = 0;
};

void log_line(const std::string& msg) {
  fmt::print("{:%Y-%m-%d %H:%M:%S} xpv-supervise: {}\n", fmt::localtime(std::time(nullptr)), msg);
  std::fflush(stdout);
}

}  // namespace

int cmd_supervise(Context& ctx) {
  const Paths& p = ctx.paths;
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);

  auto xenstored = running_pid(p.pid_file(kXenstored), kXenstored);
  if (!xenstored) {
    log_line("xpv-xenstored is not running; nothing to supervise");
    return 1;
  }
  write_pid_file(p.pid_file(kSupervisor), ::getpid());
  log_line(fmt::format("started (pid {}); xpv-xenstored is pid {}", ::getpid(), *xenstored));

  std::vector<Supervised> children;
  for (const std::string& b : backend_programs()) {
    if (built(p, b)) children.push_back({b, 0, {}, std::chrono::steady_clock::now(), 0, 0});
  }
  auto start = [&](Supervised& c) {
    try {
      c.pid = spawn({daemon_argv(p, c.program), daemon_env(p), p.log_file(c.program), true});
      c.started = std::chrono::steady_clock::now();
      write_pid_file(p.pid_file(c.program), c.pid);
      log_line(fmt::format("{} started (pid {})", c.program, c.pid));
    } catch (const std::exception& e) {
      c.pid = 0;
      c.restart_at = std::chrono::steady_clock::now() + backoff_delay(c.quick_deaths++);
      log_line(fmt::format("{}: {}", c.program, e.what()));
    }
  };
  auto stop_all = [&] {
    for (auto& c : children) {
      if (c.pid > 0) {
        stop_process(c.pid, 5s);
        log_line(fmt::format("{} stopped (pid {})", c.program, c.pid));
        c.pid = 0;
      }
      std::error_code ec;
      fs::remove(p.pid_file(c.program), ec);
    }
    std::error_code ec;
    fs::remove(p.pid_file(kSupervisor), ec);
  };

  // A backend still running from a supervisor that died (killed, OOM): not ours to wait for, and
  // a second one beside it would fail on its instance lock while the pid file named it. It is
  // stopped (SIGTERM leaves its devices connected) and ours, started next, takes them over as
  // after any backend restart.
  for (auto& c : children) {
    if (auto orphan = running_pid(p.pid_file(c.program), c.program)) {
      // Its pid file first: `xpv up`, waiting for the backends, must not report the orphan.
      std::error_code ec;
      fs::remove(p.pid_file(c.program), ec);
      const bool gone = stop_process(*orphan, 5s);
      log_line(fmt::format("{} (pid {}) was running without a supervisor: {}", c.program, *orphan,
                           gone ? "stopped; starting one of ours, which reconnects its devices"
                                : "it did not stop; starting one of ours regardless"));
    }
  }
  for (auto& c : children) start(c);
  for (;;) {
    timespec wait{0, 500'000'000};
    siginfo_t info{};
    const int sig = ::sigtimedwait(&set, &info, &wait);
    if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) {
      log_line(fmt::format("signal {}: stopping", sig));
      stop_all();
      return 0;
    }
    // Reap every child that exited (SIGCHLD coalesces).
    for (auto& c : children) {
      int status = 0;
      if (c.pid > 0 && child_exited(c.pid, &status)) {
        const auto ran = std::chrono::steady_clock::now() - c.started;
        if (ran >= kStableRun) c.quick_deaths = 0;
        const auto delay = backoff_delay(c.quick_deaths++);
        ++c.restarts;
        log_line(fmt::format("{} (pid {}) died ({}) after {} ms; restart #{} in {} ms", c.program, c.pid,
                             describe_status(status),
                             std::chrono::duration_cast<std::chrono::milliseconds>(ran).count(), c.restarts,
                             delay.count()));
        c.pid = 0;
        c.restart_at = std::chrono::steady_clock::now() + delay;
      }
    }
    if (!process_is(*xenstored, kXenstored)) {
      (void)child_exited(*xenstored, nullptr);  // one this supervisor started: reaped
      std::string why = "it left no journal, so the xenstore of every domain is lost";
      if (journal_exists(p)) {
        log_line(fmt::format("xpv-xenstored (pid {}) is gone; starting it again from its journal {}", *xenstored,
                             p.xenstored_journal()));
        std::optional<RunLock> lock;
        try {
          lock.emplace(p.lock_file());
        } catch (const ToolstackError& e) {
          // Another command holds it longer than the lock's wait: try again, never give up on a
          // journal that can bring the domains' xenstore back.
          log_line(fmt::format("{}; trying again", e.what()));
          continue;
        }
        try {
          if (auto other = running_pid(p.pid_file(kXenstored), kXenstored)) {
            xenstored = *other;  // `xpv up` got there first
          } else {
            remove_file(p.pid_file(kXenstored));
            xenstored = start_xenstored(p);
          }
          log_line(fmt::format("xpv-xenstored started again (pid {}); restarting the backends, whose connection "
                               "to it is gone",
                               *xenstored));
          for (auto& c : children) {
            if (c.pid > 0) {
              stop_process(c.pid, 5s);
              c.pid = 0;
            }
            c.quick_deaths = 0;
            start(c);
          }
          continue;
        } catch (const std::exception& e) {
          why = fmt::format("starting it again failed: {}", e.what());
        }
      }
      log_line(fmt::format("FATAL: xpv-xenstored (pid {}) is gone and cannot be restarted: {}. Stopping the "
                           "backends; run `xpv down --force`, then `xpv up`",
                           *xenstored, why));
      stop_all();
      return 1;
    }
    for (auto& c : children) {
      if (c.pid == 0 && std::chrono::steady_clock::now() >= c.restart_at) start(c);
    }
  }
}

}  // namespace xpv::toolstack
