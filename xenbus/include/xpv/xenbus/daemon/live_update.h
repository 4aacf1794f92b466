// Live update of xpv-xenstored: the daemon replaces its own binary without a guest or a client
// noticing more than a pause — what Xen's C xenstored offers since 4.15, driven by the same
// command, Debian's `xenstore-control live-update [-c CMDLINE] [-t SECONDS] [-F] BINARY`:
//
//   CONTROL live-update -f BINARY   the next binary: an executable file that, run as
//                                   `BINARY --live-update-check`, prints live_update_banner()
//                                   within 5 s (an xpv-xenstored that reads this state)  → "OK"
//   CONTROL live-update -c CMDLINE  its arguments (default: this daemon's own)    → "OK"
//   CONTROL live-update -s [-t N] [-F]
//        transactions open and no -F, less than N s (default 60) after the first -s → "BUSY"
//        (the tool asks again each second); N s passed → an error message
//        otherwise: the state is saved and the binary exec'd in this process (same pid); the
//        new binary answers "OK" to this very request once it serves again
//        the exec fails → an error message, and this binary goes on serving
//   CONTROL live-update -a          forget -f and -c                               → "OK"
//
//   ┌ old binary, between two requests ──────────────────────────────────────────┐
//   │ -F: every open transaction ended (its next request answers EAGAIN)          │
//   │ state file (<run-dir>/xenstored-live-update.json, 0600): Store::save(),     │
//   │   SocketServer::save() (the listening socket, each client's fd, unhandled   │
//   │   input, unsent output), Domains::save() (each ring's id and buffers), the  │
//   │   request to answer                                                          │
//   │ FD_CLOEXEC cleared on the sockets; execv(BINARY, args + --live-update-state)│
//   └────────────────────────────────────────────────────────────────────────────┘
//   ┌ new binary (main: --live-update-state FILE) ───────────────────────────────┐
//   │ read and remove the file; Store::restore; SocketServer adopts the sockets;  │
//   │ Domains::restore attaches each domain again through its control socket     │
//   │ (the old binding went with the exec) and resumes its ring; "OK" answered   │
//   └────────────────────────────────────────────────────────────────────────────┘
//
// Socket clients keep their connection, watches and transaction numbering; a domain's ring is
// the same page, and its event channel is bound anew. What cannot be carried over: an open
// transaction (hence BUSY, or -F); a domain that died during the update is released as its
// death would have released it. A new binary that cannot read the state exits with an error:
// everything is lost then, as with a crash — `xenstore-control` reports the lost connection.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "xpv/expected.h"
#include "xpv/xenbus/daemon/domains.h"
#include "xpv/xenbus/daemon/socket_server.h"
#include "xpv/xenbus/store.h"
#include "xpv/xenbus/wire.h"

namespace xpv::xenbus::daemon {

inline constexpr int kLiveUpdateStateVersion = 1;
// What `xpv-xenstored --live-update-check` prints: the state version it reads.
std::string live_update_banner();

class LiveUpdate {
 public:
  // `argv0`: this daemon's argv[0], which the next binary gets too (whatever its file is called,
  // the process still names itself xpv-xenstored: `xpv`'s supervisor checks that name). `args`:
  // this daemon's own arguments (without argv[0] and without --live-update-state), what the next
  // binary gets unless -c says otherwise. `syslog`: whether this daemon logs to syslog (it
  // daemonized), which the next binary carries on.
  LiveUpdate(boost::asio::io_context& io, Store& store, std::string state_file, std::string argv0,
             std::vector<std::string> args, bool syslog);
  // The transports, once they exist (they need the Store, which needs the hook).
  void attach(SocketServer& server, Domains& domains) noexcept;

  // Hooks::live_update.
  std::optional<Expected<std::string, wire::Error>> command(ConnId conn, const wire::Header& h,
                                                            const std::vector<std::string>& args);

  const std::string& state_file() const noexcept { return state_file_; }

 private:
  void exec(ConnId conn, wire::Header h, bool force);

  boost::asio::io_context& io_;
  Store& store_;
  SocketServer* server_ = nullptr;
  Domains* domains_ = nullptr;
  std::string state_file_;
  std::string argv0_;
  std::vector<std::string> args_;
  bool syslog_;
  std::string binary_;
  std::optional<std::vector<std::string>> cmdline_;
  std::optional<std::chrono::steady_clock::time_point> busy_since_;
  bool in_progress_ = false;
};

// In the next binary: the saved state (the file is removed once read). Throws
// std::runtime_error naming the file and what is wrong with it.
nlohmann::json read_live_update_state(const std::string& file);
// Whether the state says the previous binary logged to syslog.
bool live_update_syslog(const nlohmann::json& state);
// After Store::restore, the SocketServer and Domains::restore: answers "OK" to the request
// that started the update (posted, after the transports' own posted work).
void finish_live_update(boost::asio::io_context& io, Store& store, const nlohmann::json& state);

}  // namespace xpv::xenbus::daemon
