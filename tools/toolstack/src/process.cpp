#include "xpv/toolstack/process.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <thread>

#include "xpv/toolstack/error.h"
#include "xpv/toolstack/fs.h"

extern char** environ;

namespace xpv::toolstack {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(10);

// RAII for the posix_spawn attribute objects.
struct SpawnAttrs {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  SpawnAttrs() {
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
  }
  ~SpawnAttrs() {
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
  }
  SpawnAttrs(const SpawnAttrs&) = delete;
  SpawnAttrs& operator=(const SpawnAttrs&) = delete;
};

}  // namespace

pid_t spawn(const SpawnOptions& opts, const std::string& path) {
  if (opts.argv.empty()) throw ToolstackError("spawn: empty command");
  SpawnAttrs a;
  const std::string out = opts.output.empty() ? "/dev/null" : opts.output;
  posix_spawn_file_actions_addopen(&a.fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&a.fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0640);
  posix_spawn_file_actions_adddup2(&a.fa, 1, 2);
  // Nothing else of ours: a descriptor opened without O_CLOEXEC (Boost.Asio's xenstore socket is
  // one) would give every domain process and monitor a privileged xenstore connection for life,
  // one more with each restart.
  posix_spawn_file_actions_addclosefrom_np(&a.fa, 3);

  sigset_t none, all_default;
  sigemptyset(&none);
  sigemptyset(&all_default);
  for (int s : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD, SIGQUIT, SIGUSR1, SIGUSR2}) sigaddset(&all_default, s);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (opts.new_session) flags |= POSIX_SPAWN_SETSID;
  posix_spawnattr_setflags(&a.attr, flags);
  posix_spawnattr_setsigmask(&a.attr, &none);
  posix_spawnattr_setsigdefault(&a.attr, &all_default);

  std::vector<std::string> env_store;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    bool replaced = false;
    for (const auto& add : opts.env) {
      auto eq = add.find('=');
      if (kv.substr(0, kv.find('=')) == std::string_view(add).substr(0, eq)) replaced = true;
    }
    if (!replaced) env_store.emplace_back(kv);
  }
  for (const auto& add : opts.env) env_store.push_back(add);
  std::vector<char*> env;
  for (auto& e : env_store) env.push_back(e.data());
  env.push_back(nullptr);
  std::vector<char*> args;
  for (const auto& s : opts.argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);

  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, path.empty() ? args[0] : path.c_str(), &a.fa, &a.attr, args.data(),
                               env.data());
  if (rc != 0) throw ToolstackError(fmt::format("cannot start {}: {}", opts.argv[0], std::strerror(rc)));
  return pid;
}

std::vector<std::string_view> proc_stat_fields(std::string_view stat) {
  std::vector<std::string_view> f;
  const auto close = stat.rfind(')');
  if (close == std::string_view::npos) return f;
  std::string_view rest = stat.substr(close + 1);
  while (true) {
    const auto b = rest.find_first_not_of(" \n");
    if (b == std::string_view::npos) break;
    rest.remove_prefix(b);
    const auto e = rest.find_first_of(" \n");
    f.push_back(rest.substr(0, e));
    if (e == std::string_view::npos) break;
    rest.remove_prefix(e);
  }
  return f;
}

bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  auto stat = read_file(fmt::format("/proc/{}/stat", pid));
  if (!stat) return false;
  const auto f = proc_stat_fields(*stat);  // "pid (comm) S ...": f[0] is the state
  if (f.empty()) return false;
  const char state = f[0].front();
  return state != 'Z' && state != 'X';
}

namespace {

// The argv of a live `pid` whose argv[0]'s basename is `program` (empty otherwise): read once,
// for process_is and process_runs.
std::vector<std::string> argv_if(pid_t pid, std::string_view program) {
  if (!process_alive(pid)) return {};
  auto cmdline = read_file(fmt::format("/proc/{}/cmdline", pid));
  if (!cmdline) return {};
  std::vector<std::string> argv;
  for (std::string_view s = *cmdline; !s.empty();) {
    const auto z = s.find('\0');
    argv.emplace_back(s.substr(0, z));
    s.remove_prefix(z == std::string_view::npos ? s.size() : z + 1);
  }
  if (argv.empty() || std::filesystem::path(argv[0]).filename().string() != program) return {};
  return argv;
}

}  // namespace

bool process_is(pid_t pid, std::string_view program, std::string_view arg1) {
  const auto argv = argv_if(pid, program);
  if (argv.empty()) return false;
  return arg1.empty() || (argv.size() > 1 && argv[1] == arg1);
}

bool process_runs(pid_t pid, std::string_view program, std::initializer_list<std::string_view> args) {
  const auto argv = argv_if(pid, program);
  if (argv.size() < 1 + args.size()) return false;
  for (std::size_t i = 1; i + args.size() <= argv.size(); ++i) {
    if (std::equal(args.begin(), args.end(), argv.begin() + static_cast<std::ptrdiff_t>(i))) return true;
  }
  return false;
}

std::optional<pid_t> read_pid_file(const std::string& path) {
  auto text = read_file(path);
  if (!text) return std::nullopt;
  std::string_view s = *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  const long v = std::stol(std::string(s));
  if (v <= 1) return std::nullopt;
  return static_cast<pid_t>(v);
}

void write_pid_file(const std::string& path, pid_t pid) { write_file_atomic(path, fmt::format("{}\n", pid)); }

std::optional<pid_t> running_pid(const std::string& pid_file, std::string_view program, std::string_view arg1) {
  auto pid = read_pid_file(pid_file);
  if (pid && process_is(*pid, program, arg1)) return pid;
  return std::nullopt;
}

bool child_exited(pid_t pid, int* status) {
  int st = 0;
  pid_t r = ::waitpid(pid, &st, WNOHANG);
  if (r == pid) {
    if (status != nullptr) *status = st;
    return true;
  }
  return false;
}

bool wait_gone(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    // Our child: reap it (a zombie child would otherwise stay until we exit).
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return true;
    // Not our child (ECHILD): gone once /proc says so. Our child is reaped above.
    if (r < 0 && errno == ECHILD && !process_alive(pid)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kPoll);
  }
}

bool stop_process(pid_t pid, std::chrono::milliseconds grace) {
  if (pid <= 0) return true;
  if (::kill(pid, SIGTERM) != 0 && errno == ESRCH) {
    wait_gone(pid, std::chrono::milliseconds(0));
    return true;
  }
  if (wait_gone(pid, grace)) return true;
  ::kill(pid, SIGKILL);
  return wait_gone(pid, std::chrono::seconds(5));
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {} ({})", WTERMSIG(status), ::strsignal(WTERMSIG(status)));
  return fmt::format("status {:#x}", status);
}

namespace {

// The handler may run on any thread (the xenstore client's I/O thread too): a lock-free atomic.
std::atomic<int> g_interrupt{0};
static_assert(std::atomic<int>::is_always_lock_free);
constexpr int kInterruptSignals[] = {SIGINT, SIGTERM, SIGHUP};
struct sigaction g_saved[std::size(kInterruptSignals)];
bool g_taken[std::size(kInterruptSignals)] = {};
int g_guards = 0;  // one command at a time, on the main thread; nested guards share the handlers

extern "C" void on_interrupt(int sig) { g_interrupt.store(sig, std::memory_order_relaxed); }

}  // namespace

InterruptGuard::InterruptGuard() {
  if (g_guards++ > 0) return;
  g_interrupt.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (std::size_t i = 0; i < std::size(kInterruptSignals); ++i) {
    // One the caller ignores (nohup's SIGHUP, a script's background job's SIGINT) stays ignored:
    // it never ended the command, so it must not undo it either.
    g_taken[i] = ::sigaction(kInterruptSignals[i], nullptr, &g_saved[i]) == 0 && g_saved[i].sa_handler != SIG_IGN &&
                 ::sigaction(kInterruptSignals[i], &sa, nullptr) == 0;
  }
}

InterruptGuard::~InterruptGuard() {
  if (--g_guards > 0) return;
  for (std::size_t i = 0; i < std::size(kInterruptSignals); ++i) {
    if (g_taken[i]) ::sigaction(kInterruptSignals[i], &g_saved[i], nullptr);
  }
}

int interrupt_signal() noexcept { return g_interrupt.load(std::memory_order_relaxed); }

void throw_if_interrupted() {
  const int sig = interrupt_signal();
  if (sig == 0) return;
  const char* name = ::sigabbrev_np(sig);  // "INT"
  throw ToolstackError(name ? fmt::format("interrupted by SIG{}", name) : fmt::format("interrupted by signal {}", sig));
}

}  // namespace xpv::toolstack
