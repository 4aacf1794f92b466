// The whole main() of a backend daemon (xpv-blkback, xpv-netback) but for its Backend class and
// its own options: the shared command line (--xenstore, --run-dir, --foreground, --pid-file,
// --log-file, --log-level), daemonizing with the startup report (process.h), logging (a file,
// syslog when daemonized, stderr in the foreground), one instance per run dir (a flock that goes
// with the process however it dies, so a restart is never refused), and the SIGTERM/SIGINT stop
// that leaves the devices as they are in xenstore for the next instance to reconnect.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace xpv::daemon {

struct BackendDaemon {
  std::string name;         // "xpv-blkback": messages, syslog ident, the run dir's lock file
  std::string description;  // --help's first line
  std::string* xenstore_path = nullptr;  // filled from --xenstore (default $XENSTORED_PATH or
                                         // /run/xenstored/socket), made absolute
  std::string* run_dir = nullptr;        // filled from --run-dir (default $XPV_RUN_DIR or /run/xpv)
  std::function<void(CLI::App&)> add_options;  // the daemon's own options
  // Builds the backend on `io` once the process is set up; returns what stops it (called from
  // the signal handler and again after the loop ends; it must be idempotent). The backend lives
  // as long as the returned function. `exit(status)`, called on `io`'s thread, ends the daemon as
  // a signal does, with that exit status.
  std::function<std::function<void()>(boost::asio::io_context& io, std::function<void(int)> exit)> start;
};

// The backend lost xpv-xenstored (no answer within its client's bound, or the connection gone)
// and has found it answering again: it stops as on SIGTERM, leaving the devices as they are, so
// that its next start — `xpv supervise` restarts a backend that exits — resumes every device over
// a new connection, as after any restart. (Its own connection is not mended in place: a request
// that timed out may yet have been done, and its watches may have missed events.)
inline constexpr int kExitXenstoreBack = 3;

// Exit status: 0 after a signal, 1 when setup failed (the reason on stderr or in the log, and to
// the launching process), 2 for a bad command line, kExitXenstoreBack (3).
int run_backend_daemon(int argc, char** argv, const BackendDaemon& d);

// The restart records a backend keeps per device queue in its run dir are named
// "<device>-q<k><suffix>" (blkback's request shadows "vbd1.51712-q0.shadow", netback's rx shadows
// "vif1.0-q0.rxids"). The device such a file belongs to ("vbd1.51712"), when its name starts with
// `prefix`; empty for any other file.
std::string_view restart_file_owner(std::string_view file, std::string_view prefix, std::string_view suffix) noexcept;

// Removes the restart records in `dir` (named as above) of devices not in `live`: a device
// destroyed while no daemon ran leaves them behind, and only the next daemon, seeing the device
// gone from a complete listing (backend_devices.h), can tell. Each removal is logged under
// `who`; a directory that cannot be read is left as it is, with a warning.
void sweep_orphan_files(const std::string& dir, std::string_view prefix, std::string_view suffix,
                        const std::set<std::string, std::less<>>& live, std::string_view who) noexcept;

// run_backend_daemon for a Backend constructed as Backend(io, opts) with a shutdown(), whose
// Options have xenstore_path, run_dir, max_queues (offered as --max-queues, default: the host's
// CPUs, at most 64) and xenstore_back (called when lost xenstored answers again: exits with
// kExitXenstoreBack). `more_options` adds the daemon's own.
template <class Backend, class Options>
int run_backend(int argc, char** argv, std::string name, std::string description, Options& opts,
                std::function<void(CLI::App&)> more_options = {}) {
  opts.max_queues = std::max(1u, std::min(std::thread::hardware_concurrency(), 64u));
  BackendDaemon d;
  d.name = std::move(name);
  d.description = std::move(description);
  d.xenstore_path = &opts.xenstore_path;
  d.run_dir = &opts.run_dir;
  d.add_options = [&opts, more = std::move(more_options)](CLI::App& app) {
    app.add_option("--max-queues", opts.max_queues, "multi-queue-max-queues offered to frontends")
        ->check(CLI::Range(1u, 64u))
        ->capture_default_str();
    if (more) more(app);
  };
  d.start = [&opts](boost::asio::io_context& io, std::function<void(int)> exit) -> std::function<void()> {
    opts.xenstore_back = [exit = std::move(exit)] { exit(kExitXenstoreBack); };
    auto backend = std::make_shared<Backend>(io, opts);
    return [backend] { backend->shutdown(); };
  };
  return run_backend_daemon(argc, argv, d);
}

}  // namespace xpv::daemon
