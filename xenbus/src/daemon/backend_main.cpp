#include "xpv/xenbus/daemon/backend_main.h"

#include <fcntl.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/syslog_sink.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "xpv/unique_fd.h"
#include "xpv/xenbus/daemon/process.h"

namespace xpv::daemon {

namespace {

// Two backends serving the same rings would corrupt them: one per run dir.
UniqueFd lock_instance(const std::string& name, const std::string& run_dir) {
  const std::string path = run_dir + "/" + name + ".lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    throw std::runtime_error("another " + name + " is running for " + run_dir + " (" + path + " is locked)");
  }
  return fd;
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

}  // namespace

int run_backend_daemon(int argc, char** argv, const BackendDaemon& d) {
  const std::string logger = d.name.rfind("xpv-", 0) == 0 ? d.name.substr(4) : d.name;  // "blkback"
  CLI::App app{d.name + " — " + d.description};
  *d.xenstore_path = env_or("XENSTORED_PATH", "/run/xenstored/socket");
  *d.run_dir = env_or("XPV_RUN_DIR", "/run/xpv");
  bool foreground = false;
  std::string pid_file, log_file, log_level = "info";
  app.add_option("--xenstore", *d.xenstore_path, "xpv-xenstored's socket")->capture_default_str();
  app.add_option("--run-dir", *d.run_dir, "where the domains' control sockets are")->capture_default_str();
  app.add_flag("--foreground", foreground, "do not daemonize; log to stderr");
  app.add_option("--pid-file", pid_file, "write the daemon's pid here");
  app.add_option("--log-file", log_file, "log here (default: stderr in the foreground, syslog otherwise)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  if (d.add_options) d.add_options(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s\n", d.name.c_str(), e.what());
    return 2;
  }
  const auto level = parse_log_level(log_level);
  if (!level) {
    std::fprintf(stderr, "%s: --log-level '%s': expected trace, debug, info, warn, error or off\n", d.name.c_str(),
                 log_level.c_str());
    return 2;
  }

  // The daemon runs in "/": relative paths are taken from where it was started.
  for (std::string* p : {d.xenstore_path, d.run_dir, &pid_file, &log_file}) {
    if (!p->empty()) *p = std::filesystem::absolute(*p).lexically_normal().string();
  }

  Launcher launcher;
  int status = 0;
  try {
    if (!foreground) daemonize(d.name.c_str(), launcher);
    if (!log_file.empty()) {
      auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_file);
      spdlog::set_default_logger(std::make_shared<spdlog::logger>(logger, sink));
      spdlog::flush_on(spdlog::level::info);
    } else if (!foreground) {
      auto sink = std::make_shared<spdlog::sinks::syslog_sink_mt>(d.name, LOG_PID, LOG_DAEMON, false);
      spdlog::set_default_logger(std::make_shared<spdlog::logger>(logger, sink));
    }
    spdlog::set_level(*level);
    std::filesystem::create_directories(*d.run_dir);
    UniqueFd lock = lock_instance(d.name, *d.run_dir);
    ::signal(SIGPIPE, SIG_IGN);

    boost::asio::io_context io(1);
    // Signals first, before the backend's xenstore client starts its thread.
    boost::asio::signal_set signals(io, SIGTERM, SIGINT);
    const std::function<void()> stop = d.start(io, [&io, &status](int s) {
      status = s;  // on io's thread: the loop below ends, then stop() as after a signal
      io.stop();
    });
    PidFile pid;
    if (!pid_file.empty()) pid = PidFile(pid_file);
    signals.async_wait([&](boost::system::error_code ec, int sig) {
      if (ec) return;
      spdlog::info("{}: signal {}: stopping the queues; devices stay as they are", logger, sig);
      stop();
      io.stop();
    });
    launcher.ready();
    auto work = boost::asio::make_work_guard(io);
    io.run();
    stop();
    spdlog::info("{}: stopped{}", logger, status == 0 ? "" : fmt::format(" (exit {})", status));
  } catch (const std::exception& e) {
    if (foreground && log_file.empty()) {
      std::fprintf(stderr, "%s: %s\n", d.name.c_str(), e.what());  // one line, no log decoration
    } else {
      spdlog::error("{}: {}", logger, e.what());
    }
    launcher.failed(e.what());
    return 1;
  }
  return status;
}

std::string_view restart_file_owner(std::string_view file, std::string_view prefix, std::string_view suffix) noexcept {
  const auto q = file.rfind("-q");
  if (!file.starts_with(prefix) || !file.ends_with(suffix) || q == std::string_view::npos) return {};
  return file.substr(0, q);
}

void sweep_orphan_files(const std::string& dir, std::string_view prefix, std::string_view suffix,
                        const std::set<std::string, std::less<>>& live, std::string_view who) noexcept {
  try {  // a directory whose reading fails on the way (the iterator's step throws) is left as it is
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string f = e.path().filename().string();
      const std::string_view owner = restart_file_owner(f, prefix, suffix);
      if (owner.empty() || live.contains(owner)) continue;
      std::error_code rm;
      if (std::filesystem::remove(e.path(), rm)) spdlog::info("{}: removed {}: its device is not in xenstore", who, f);
    }
    if (ec && ec != std::errc::no_such_file_or_directory) spdlog::warn("{}: cannot read {}: {}", who, dir, ec.message());
  } catch (const std::exception& e) {
    spdlog::warn("{}: sweeping {}: {}", who, dir, e.what());
  }
}

}  // namespace xpv::daemon
