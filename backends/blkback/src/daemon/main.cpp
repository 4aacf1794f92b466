// xpv-blkback — the blkif backend daemon (one per host, serving every domain's vbds).
//   xpv-blkback [--xenstore PATH] [--run-dir D] [--foreground] [--pid-file F] [--log-level L]
//               [--log-file F] [--max-queues N] [--max-ring-page-order N]
// Connects to xpv-xenstored as dom0 and runs Backend (backend.h) until SIGTERM/SIGINT. Without
// --foreground it daemonizes first (double fork, setsid, stdio on /dev/null) and the launching
// process waits until the daemon is serving — or prints the daemon's startup error and exits 1 —
// as xpv-xenstored does. On SIGTERM/SIGINT the devices are left as they are in xenstore (a new
// xpv-blkback reconnects to them), every queue is stopped after its in-flight I/O, exit 0.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/syslog_sink.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "xpv/xenbus/daemon/process.h"
#include "xpv/blkback/backend.h"
#include "xpv/unique_fd.h"

namespace {

// One xpv-blkback per run dir: two backends serving the same rings would corrupt them. The lock
// goes away with the process however it dies (a kill -9 included), so a restart is never refused.
xpv::UniqueFd lock_instance(const std::string& run_dir) {
  const std::string path = run_dir + "/xpv-blkback.lock";
  xpv::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    throw std::runtime_error("another xpv-blkback is running for " + run_dir + " (" + path + " is locked)");
  }
  return fd;
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"xpv-blkback — blkif backend (io_uring) for every domain's virtual block devices"};
  xpv::blkback::BackendOptions opts;
  opts.xenstore_path = env_or("XENSTORED_PATH", "/run/xenstored/socket");
  opts.run_dir = env_or("XPV_RUN_DIR", "/run/xpv");
  opts.max_queues = std::max(1u, std::min(std::thread::hardware_concurrency(), 64u));
  bool foreground = false;
  std::string pid_file, log_file, log_level = "info";
  app.add_option("--xenstore", opts.xenstore_path, "xpv-xenstored's socket")->capture_default_str();
  app.add_option("--run-dir", opts.run_dir, "where the domains' control sockets are")->capture_default_str();
  app.add_flag("--foreground", foreground, "do not daemonize; log to stderr");
  app.add_option("--pid-file", pid_file, "write the daemon's pid here");
  app.add_option("--log-file", log_file, "log here (default: stderr in the foreground, syslog otherwise)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  app.add_option("--max-queues", opts.max_queues, "multi-queue-max-queues offered to frontends")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  app.add_option("--max-ring-page-order", opts.max_ring_page_order, "max-ring-page-order offered")
      ->check(CLI::Range(0u, 4u))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "xpv-blkback: %s\n", e.what());
    return 2;
  }
  auto level = xpv::daemon::parse_log_level(log_level);
  if (!level) {
    std::fprintf(stderr, "xpv-blkback: --log-level '%s': expected trace, debug, info, warn, error or off\n",
                 log_level.c_str());
    return 2;
  }

  // The daemon runs in "/": relative paths are taken from where it was started.
  for (std::string* p : {&opts.xenstore_path, &opts.run_dir, &pid_file, &log_file}) {
    if (!p->empty()) *p = std::filesystem::absolute(*p).lexically_normal().string();
  }

  xpv::daemon::Launcher launcher;
  try {
    if (!foreground) xpv::daemon::daemonize("xpv-blkback", launcher);
    if (!log_file.empty()) {
      auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_file);
      spdlog::set_default_logger(std::make_shared<spdlog::logger>("blkback", sink));
      spdlog::flush_on(spdlog::level::info);
    } else if (!foreground) {
      auto sink = std::make_shared<spdlog::sinks::syslog_sink_mt>("xpv-blkback", LOG_PID, LOG_DAEMON, false);
      spdlog::set_default_logger(std::make_shared<spdlog::logger>("blkback", sink));
    }
    spdlog::set_level(*level);
    std::filesystem::create_directories(opts.run_dir);
    xpv::UniqueFd lock = lock_instance(opts.run_dir);
    ::signal(SIGPIPE, SIG_IGN);

    boost::asio::io_context io(1);
    // Signals first, before the xenstore client starts its thread.
    boost::asio::signal_set signals(io, SIGTERM, SIGINT);
    xpv::blkback::Backend backend(io, opts);
    xpv::daemon::PidFile pid;
    if (!pid_file.empty()) pid = xpv::daemon::PidFile(pid_file);
    signals.async_wait([&](boost::system::error_code ec, int sig) {
      if (ec) return;
      spdlog::info("blkback: signal {}: stopping the queues; devices stay as they are", sig);
      backend.shutdown();
      io.stop();
    });
    launcher.ready();
    auto work = boost::asio::make_work_guard(io);
    io.run();
    backend.shutdown();
    spdlog::info("blkback: stopped");
  } catch (const std::exception& e) {
    if (foreground && log_file.empty()) {
      std::fprintf(stderr, "xpv-blkback: %s\n", e.what());  // one line, no log decoration
    } else {
      spdlog::error("blkback: {}", e.what());
    }
    launcher.failed(e.what());
    return 1;
  }
  return 0;
}
