// xpv-xenstored — the xenstore daemon.
//   xpv-xenstored [--socket PATH] [--run-dir D] [--foreground] [--pid-file F] [--quota KEY=N]...
//                 [--log-level L]
// Serves libxenstore clients on a unix socket (default /run/xenstored/socket, what Debian's
// libxenstore opens; XENSTORED_PATH points clients elsewhere). Without --foreground it
// daemonizes (double fork, setsid, stdio on /dev/null, logs to syslog) once the socket is
// listening, so a caller may connect as soon as the parent exits. SIGTERM/SIGINT: clean
// shutdown removing the socket and the pid file. INTRODUCE attaches the domain's ring through its
// control socket <run-dir>/dom<N>.sock (daemon/domains.h; default /run/xpv or $XPV_RUN_DIR).
// CONTROL live-update (xenstore-control, `xpv live-update`) replaces the binary in place: the next
// one starts with --live-update-state FILE (daemon/live_update.h). --journal FILE keeps a journal
// from which a daemon started after a crash recovers the store under running domains
// (daemon/journal.h).
#include <CLI/CLI.hpp>
#include <spdlog/sinks/syslog_sink.h>
#include <spdlog/spdlog.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <signal.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <unistd.h>
#include <string>
#include <vector>

#include "xpv/xenbus/daemon/process.h"
#include "xpv/xenbus/daemon/domains.h"
#include "xpv/xenbus/daemon/journal.h"
#include "xpv/xenbus/daemon/live_update.h"
#include "xpv/xenbus/daemon/socket_server.h"
#include "xpv/xenbus/store.h"

int main(int argc, char** argv) {
  CLI::App app{"xpv-xenstored — xenstore daemon (libxenstore / xenstore-utils compatible)"};
  std::string socket_path = "/run/xenstored/socket";
  bool foreground = false;
  std::string pid_file;
  std::vector<std::string> quota_args;
  std::string log_level = "info";
  std::string run_dir = "/run/xpv";
  if (const char* e = std::getenv("XPV_RUN_DIR"); e && *e) run_dir = e;
  app.add_option("--socket", socket_path, "unix socket to listen on")->capture_default_str();
  app.add_option("--run-dir", run_dir, "where domains' control sockets dom<N>.sock live")
      ->capture_default_str();
  app.add_flag("--foreground", foreground, "do not daemonize; log to stderr");
  app.add_option("--pid-file", pid_file, "write the daemon's pid here");
  app.add_option("--quota", quota_args,
                 "KEY=N; keys: nodes node-size watches transactions outstanding path-max perms "
                 "pending-events transaction-nodes");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")
      ->capture_default_str();
  std::string journal_path;
  app.add_option("--journal", journal_path,
                 "keep a journal here; a daemon started while it exists (the last one did not stop "
                 "cleanly) recovers the store from it");
  bool lu_check = false;
  app.add_flag("--live-update-check", lu_check,
               "print the live-update state version this binary reads, and exit")
      ->group("");
  std::string lu_state;
  app.add_option("--live-update-state", lu_state,
                 "(set by a live update) continue the daemon whose state FILE holds")
      ->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (lu_check) {
    std::printf("%s\n", xpv::xenbus::daemon::live_update_banner().c_str());
    return 0;
  }

  xpv::xenbus::Quotas quotas;
  for (const auto& q : quota_args) {
    auto eq = q.find('=');
    std::uint64_t v = 0;
    bool ok = eq != std::string::npos && eq + 1 < q.size() &&
              q.find_first_not_of("0123456789", eq + 1) == std::string::npos &&
              q.size() - eq - 1 <= 10;
    if (ok) v = std::stoull(q.substr(eq + 1));
    if (!ok || !xpv::xenbus::set_quota(quotas, q.substr(0, eq), v)) {
      std::fprintf(stderr,
                   "xpv-xenstored: --quota '%s': expected KEY=N with N > 0 and KEY one of nodes, "
                   "node-size, watches, transactions, outstanding, path-max, perms, "
                   "pending-events, transaction-nodes\n",
                   q.c_str());
      return 2;
    }
  }
  auto level = xpv::daemon::parse_log_level(log_level);
  if (!level) {
    std::fprintf(stderr,
                 "xpv-xenstored: --log-level '%s': expected trace, debug, info, warn, error or "
                 "off\n",
                 log_level.c_str());
    return 2;
  }
  spdlog::set_level(*level);

  // The journal's path is made absolute first: a daemon works from / (daemonize), and so does
  // the next binary of a live update it execs.
  if (!journal_path.empty()) {
    std::error_code ec;
    auto abs = std::filesystem::absolute(journal_path, ec);
    if (ec) {
      std::fprintf(stderr, "xpv-xenstored: --journal '%s': cannot make it an absolute path: %s\n",
                   journal_path.c_str(), ec.message().c_str());
      return 2;
    }
    journal_path = abs.lexically_normal().string();
  }
  // What the next binary of a live update gets unless the update says otherwise: these very
  // arguments, without a previous update's state file.
  std::vector<std::string> own_args;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--live-update-state") {
      ++i;
      continue;
    }
    if (a.starts_with("--live-update-state=")) continue;
    if (a == "--journal" && i + 1 < argc) {
      own_args.emplace_back(a);
      own_args.push_back(journal_path);
      ++i;
      continue;
    }
    if (a.starts_with("--journal=")) {
      own_args.push_back("--journal=" + journal_path);
      continue;
    }
    own_args.emplace_back(a);
  }

  xpv::daemon::Launcher launcher;
  try {
    std::optional<nlohmann::json> restored;
    if (!lu_state.empty()) restored = xpv::xenbus::daemon::read_live_update_state(lu_state);
    if (restored && xpv::xenbus::daemon::live_update_syslog(*restored)) {
      // The same process as before the exec, already a daemon: it logs where it did.
      auto sink = std::make_shared<spdlog::sinks::syslog_sink_mt>("xpv-xenstored", LOG_PID, LOG_DAEMON, false);
      spdlog::set_default_logger(std::make_shared<spdlog::logger>("xenstored", sink));
      spdlog::set_level(*level);
    }
    boost::asio::io_context io(1);
    xpv::xenbus::Hooks hooks;
    hooks.print = [](std::string_view s) { spdlog::info("xenstored: control print: {}", s); };
    hooks.set_log_level = [](std::string_view s) {
      auto l = xpv::daemon::parse_log_level(s);
      if (l) spdlog::set_level(*l);
      return l.has_value();
    };
    // The hooks reach the domain glue, which needs the Store: created right after it (and so
    // destroyed before it).
    xpv::xenbus::daemon::Domains* domains_ptr = nullptr;
    xpv::xenbus::daemon::LiveUpdate* live_update_ptr = nullptr;
    hooks.live_update = [&live_update_ptr](xpv::xenbus::ConnId c, const xpv::xenbus::wire::Header& h,
                                           const std::vector<std::string>& a)
        -> std::optional<xpv::Expected<std::string, xpv::xenbus::wire::Error>> {
      if (!live_update_ptr) return xpv::fail(xpv::xenbus::wire::Error::einval);
      return live_update_ptr->command(c, h, a);
    };
    hooks.attach = [&domains_ptr](xpv::xenbus::DomId d, std::uint64_t mfn, std::uint32_t port)
        -> xpv::Expected<void, xpv::xenbus::wire::Error> {
      if (!domains_ptr) return xpv::fail(xpv::xenbus::wire::Error::eio);
      return domains_ptr->attach(d, mfn, port);
    };
    hooks.introduced = [](xpv::xenbus::DomId d, std::uint64_t mfn, std::uint32_t port) {
      spdlog::info("xenstored: dom{} introduced (mfn {:#x}, port {})", d, mfn, port);
    };
    hooks.released = [&domains_ptr](xpv::xenbus::DomId d) {
      spdlog::info("xenstored: dom{} released", d);
      if (domains_ptr) domains_ptr->released(d);
    };
    xpv::xenbus::Store store(quotas, hooks);
    std::vector<xpv::xenbus::Store::RecoveredDomain> recovered;
    std::map<xpv::xenbus::DomId, xpv::xenbus::daemon::RingJournalState> recovered_rings;
    bool recovering = false;
    if (restored) {
      store.restore(restored->at("store"));
    } else if (!journal_path.empty() && ::access(journal_path.c_str(), F_OK) == 0) {
      // The last daemon with this journal did not stop cleanly: carry on from what it acknowledged.
      auto contents = xpv::xenbus::daemon::Journal::read(journal_path);
      try {
        recovered = store.recover(contents.snapshot, contents.changes);
        recovered_rings = contents.ring_states();
      } catch (const std::exception& e) {
        throw std::runtime_error(journal_path + ": " + e.what());
      }
      recovering = true;
      spdlog::warn("xenstored: recovering from the journal {} ({} changes after its snapshot{}): {} nodes, {} "
                   "domain(s) to attach again",
                   journal_path, contents.changes.size(), contents.torn_tail ? ", a last one cut short left out" : "",
                   store.node_count(), recovered.size());
    }
    xpv::xenbus::daemon::Domains domains(io, store, run_dir);
    domains_ptr = &domains;
    const bool to_syslog = restored ? xpv::xenbus::daemon::live_update_syslog(*restored) : !foreground;
    xpv::xenbus::daemon::LiveUpdate live_update(io, store, socket_path + ".live-update.json", argv[0],
                                                own_args, to_syslog);
    live_update_ptr = &live_update;
    // From the moment the socket listens a client may connect and then send SIGTERM (`xpv down`,
    // a test's quick stop); until the handler below exists that signal would kill us the
    // default way, socket left behind. Hold SIGTERM/SIGINT until then (the mask survives fork).
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigaddset(&term, SIGINT);
    ::pthread_sigmask(SIG_BLOCK, &term, nullptr);
    std::optional<xpv::xenbus::daemon::SocketServer> server_slot;
    if (restored) {
      server_slot.emplace(io, store, socket_path, restored->at("sockets"));
      domains.restore(restored->at("rings"));
      xpv::xenbus::daemon::finish_live_update(io, store, *restored);
    } else {
      server_slot.emplace(io, store, socket_path);
      if (recovering) domains.recover(recovered, recovered_rings);
    }
    // From here on every change is journaled (a fresh snapshot: of the restored or recovered
    // store, or of an empty one).
    std::optional<xpv::xenbus::daemon::Journal> journal;
    // A journal past RLIMIT_FSIZE is a write that fails (EFBIG: the journal is given up and
    // written again later), not a daemon killed with a core dump; from before its first snapshot.
    ::signal(SIGXFSZ, SIG_IGN);
    if (!journal_path.empty()) {
      journal.emplace(io, store, journal_path, [&domains] { return domains.journal_state(); },
                      restored.has_value() || recovering);
    }
    xpv::xenbus::daemon::SocketServer& server = *server_slot;
    live_update.attach(server, domains);

    if (!restored && !foreground) {  // restored: already a daemon (or in the foreground)
      // The socket is already registered with io: the daemon's io_context must learn of the fork.
      xpv::daemon::daemonize(
          "xpv-xenstored", launcher,
          {.prepare = [&io] { io.notify_fork(boost::asio::io_context::fork_prepare); },
           .child = [&io] { io.notify_fork(boost::asio::io_context::fork_child); }});
      auto sink = std::make_shared<spdlog::sinks::syslog_sink_mt>("xpv-xenstored", LOG_PID,
                                                                 LOG_DAEMON, false);
      spdlog::set_default_logger(std::make_shared<spdlog::logger>("xenstored", sink));
      spdlog::set_level(*level);
    }
    boost::asio::signal_set signals(io, SIGTERM, SIGINT);
    signals.async_wait([&](boost::system::error_code ec, int sig) {
      if (!ec) spdlog::info("xenstored: signal {}, shutting down", sig);
      io.stop();
    });
    ::pthread_sigmask(SIG_UNBLOCK, &term, nullptr);  // one that came meanwhile is handled now
    xpv::daemon::PidFile pid;
    if (!pid_file.empty()) pid = xpv::daemon::PidFile(pid_file);
    launcher.ready();
    ::signal(SIGPIPE, SIG_IGN);
    spdlog::info("xenstored: listening on {}", socket_path);
    io.run();
    if (journal) journal->remove();  // stopped on purpose: the next daemon starts empty
    spdlog::info("xenstored: {} messages served, {} protocol errors", server.messages(),
                 server.protocol_errors());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xpv-xenstored: %s\n", e.what());
    launcher.failed(e.what());
    spdlog::error("xenstored: {}", e.what());
    return 1;
  }
  return 0;
}
