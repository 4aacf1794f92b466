// Processes the toolstack starts and stops: daemons, the supervisor, domain processes.
//
// Every wait here is bounded. A process that is not our child (a daemon started by an earlier
// `xpv up`, reparented to init) is watched through /proc: it is gone when /proc/<pid> is gone or
// shows a zombie. A pid from a pid file is trusted only if /proc/<pid>/cmdline still names the
// expected program (pids are reused).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xpv::toolstack {

struct SpawnOptions {
  std::vector<std::string> argv;      // argv[0] is the executable's path
  std::vector<std::string> env;       // "KEY=VALUE" added to (or replacing in) our environment
  std::string output;                 // stdout and stderr appended here ("" → /dev/null)
  bool new_session = true;            // setsid: no controlling terminal, own process group
};

// posix_spawn (safe in a multithreaded process) with stdin from /dev/null, stdout/stderr to
// `output`, no other descriptor of ours, default signal dispositions and an empty signal mask.
// `path`, when set, is what runs (argv[0] is then only its name). Throws ToolstackError.
pid_t spawn(const SpawnOptions& opts, const std::string& path = {});

// The fields of a /proc/<pid>/stat text after the command, which may itself hold spaces and
// parentheses (so counted from its last ')'): [0] is field 3 (the state), [11] and [12] utime and
// stime. Empty when the text has no command.
std::vector<std::string_view> proc_stat_fields(std::string_view stat);

// Exists and is not a zombie.
bool process_alive(pid_t pid);
// Alive, argv[0]'s basename is `program`, and (if given) argv[1] is `arg1`.
bool process_is(pid_t pid, std::string_view program, std::string_view arg1 = {});

// process_is, and `args` stand one after another somewhere in argv[1..] — a domain's process
// named by its domain id ("--domid", "3"): a pid reused by another domain's process is not it.
bool process_runs(pid_t pid, std::string_view program, std::initializer_list<std::string_view> args);

std::optional<pid_t> read_pid_file(const std::string& path);
void write_pid_file(const std::string& path, pid_t pid);

// The live pid recorded in `pid_file` for `program` (see process_is), or nullopt.
std::optional<pid_t> running_pid(const std::string& pid_file, std::string_view program,
                                 std::string_view arg1 = {});

// Waits until `pid` is gone (reaping it if it is our child). True if it went within `timeout`.
bool wait_gone(pid_t pid, std::chrono::milliseconds timeout);

// SIGTERM, wait up to `grace`, then SIGKILL and wait up to 5 s more. True if the process is
// gone. Also used for our own children (they are reaped).
bool stop_process(pid_t pid, std::chrono::milliseconds grace);

// Our child exited? Reaps it and stores its status. Not our child or still running → false.
bool child_exited(pid_t pid, int* status);

// "exit status 3" / "signal 9 (Killed)".
std::string describe_status(int status);

// Ctrl-C (SIGINT), SIGTERM or SIGHUP while a command builds something up (`xpv create`,
// block-attach, network-attach): instead of dying half-way, leaving a domain process, its
// namespace and its nodes behind, the command notices at its next step, or within one poll of a
// wait, and undoes what it made. While a guard lives those signals only set a flag (SA_RESTART:
// a blocking call in progress, such as a xenstore request, completes); the old dispositions come
// back when it goes. Processes spawned meanwhile get default dispositions (spawn above) and, in
// their own sessions, no terminal's Ctrl-C.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};

// The signal caught while a guard lived (0: none).
int interrupt_signal() noexcept;
// Throws ToolstackError "interrupted by SIGINT" when one was caught.
void throw_if_interrupted();

}  // namespace xpv::toolstack
