// dom0's daemons as `xpv up` runs them (pure parts, unit-tested):
//
//   xpv up ─┬─ xpv-xenstored --socket S --foreground --pid-file RUN/xpv-xenstored.pid
//           │     --run-dir RUN --journal RUN/xpv-xenstored.journal
//           │     restartable after a crash: a new one recovers the store from the journal and
//           │     attaches the domains again (xenbus/include/xpv/xenbus/daemon/journal.h); the
//           │     supervisor starts it, then restarts the backends, whose connection went with it
//           └─ xpv supervise ─┬─ xpv-blkback --xenstore S --run-dir RUN --foreground --pid-file …
//                             └─ xpv-netback  (same flags; only when the binary is built)
//                  restarts a backend that died, after backoff_delay(n); a restarted backend
//                  reconnects its devices through xenbus
//
// Each daemon runs in its own session with stdout+stderr appended to LOG/<program>.log and
// XPV_RUN_DIR / XENSTORED_PATH set in its environment.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "xpv/toolstack/paths.h"

namespace xpv::toolstack {

inline constexpr const char* kXenstored = "xpv-xenstored";
inline constexpr const char* kSupervisor = "xpv-supervise";  // pid/log file name of `xpv supervise`
inline const std::vector<std::string>& backend_programs();      // xpv-blkback, xpv-netback

// `xenstored_run_dir`: pass --run-dir to xpv-xenstored too (a build that attaches domains'
// rings reads their control sockets there; older builds reject the flag — see cmd_up);
// `xenstored_journal`: and --journal RUN/xpv-xenstored.journal (crash restart).
std::vector<std::string> daemon_argv(const Paths& paths, const std::string& program, bool xenstored_run_dir = false,
                                     bool xenstored_journal = false);
std::vector<std::string> daemon_env(const Paths& paths);
std::vector<std::string> supervisor_argv(const Paths& paths, const std::string& self_exe);

// Restart backoff: 200 ms doubling per consecutive quick death, at most 10 s.
std::chrono::milliseconds backoff_delay(unsigned consecutive_failures);
// A backend that ran at least this long before it died starts the backoff over.
inline constexpr std::chrono::seconds kStableRun{30};

inline const std::vector<std::string>& backend_programs() {
  static const std::vector<std::string> p = {"xpv-blkback", "xpv-netback"};
  return p;
}

}  // namespace xpv::toolstack
