// Small pieces every xpv daemon's main() needs (xpv-xenstored, xpv-blkback, xpv-netback,
// xpv-front): the --log-level names, a pid file that goes away with the process, and the double
// fork with its startup report to the launching process. Setup code (may throw).
// parse_log_level and PidFile are header-only; Launcher and daemonize are in
// src/daemon/process.cpp (library xpv::daemon_process).
#pragma once

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace xpv::daemon {

// trace, debug, info, warn|warning, error, off; nullopt for anything else.
inline std::optional<spdlog::level::level_enum> parse_log_level(std::string_view s) {
  using spdlog::level::level_enum;
  if (s == "trace") return level_enum::trace;
  if (s == "debug") return level_enum::debug;
  if (s == "info") return level_enum::info;
  if (s == "warn" || s == "warning") return level_enum::warn;
  if (s == "error") return level_enum::err;
  if (s == "off") return level_enum::off;
  return std::nullopt;
}

// Writes this process's pid to `path`; removes the file when the daemon exits normally.
class PidFile {
 public:
  PidFile() = default;
  explicit PidFile(std::string path) : path_(std::move(path)) {
    std::ofstream f(path_);
    if (!f) throw std::runtime_error("cannot write pid file " + path_);
    f << ::getpid() << '\n';
  }
  PidFile(PidFile&& o) noexcept : path_(std::exchange(o.path_, {})) {}
  PidFile& operator=(PidFile&& o) noexcept {
    std::swap(path_, o.path_);
    return *this;
  }
  PidFile(const PidFile&) = delete;
  PidFile& operator=(const PidFile&) = delete;
  ~PidFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }

 private:
  std::string path_;
};

// Tells the launching process how startup went, over the pipe daemonize() leaves open in the
// daemon: '1' = serving, '0' + message = failed. Only the first report is sent (the pipe is then
// closed); without daemonize() (--foreground) every report is a no-op.
class Launcher {
 public:
  Launcher() = default;
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;
  ~Launcher();

  void set(int fd) noexcept;  // takes ownership of the pipe's write end
  void ready() noexcept;
  void failed(const std::string& why) noexcept;

 private:
  void send(const std::string& m) noexcept;
  int fd_ = -1;
};

// Called around the forks, e.g. for boost::asio::io_context::notify_fork when the io_context
// already has descriptors registered (xpv-xenstored). Either may be empty.
struct ForkHooks {
  std::function<void()> prepare;  // in the original process, before the first fork
  std::function<void()> child;    // in the daemon, after the second fork
};

// Double fork (call it before any thread exists). The original process waits for the daemon's
// report and exits 0 (serving) or 1 after printing "<program>: <message>" to stderr (or
// "<program>: the daemon died during startup" when the daemon closed the pipe without a report);
// the intermediate child exits 0 after setsid(). Returns in the daemon — session leader's child,
// umask 022, cwd "/", stdio on /dev/null — with `launcher` holding the pipe. Throws if the pipe
// or the first fork fails.
void daemonize(std::string_view program, Launcher& launcher, const ForkHooks& hooks = {});

}  // namespace xpv::daemon
