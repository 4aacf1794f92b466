// `xpv testbed`: see testbed.h for the picture. Everything here runs on the host, in the `xpv`
// process's main thread.
#include "testbed/testbed.h"

#include "xpv/testbed/console_watch.h"
#include "xpv/testbed/process.h"

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <fmt/core.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace fs = std::filesystem;

namespace xpv::testbed {
namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal.store(sig); }

[[noreturn]] void die(const std::string& msg) { throw std::runtime_error(msg); }

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& p, const std::string& content, bool exec = false) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) die(fmt::format("cannot write {}", p.string()));
  if (exec) fs::permissions(p, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
}

// The L1 initramfs: busybox, /init, the modules. Cached next to the kernel, keyed by the init
// script's and the module list's hash so an edit of either rebuilds it.
fs::path ensure_initramfs(const Kernel& k) {
  const std::string busybox = "/bin/busybox";
  if (!fs::exists(busybox)) die("/bin/busybox is missing: install busybox-static (scripts/setup)");
  std::string key = kL1Init;
  for (const auto& m : k.modules) key += "\n" + m;
  const size_t h = std::hash<std::string>{}(key);
  const fs::path out = fs::path(k.dir) / fmt::format("l1-initramfs-{:016x}.cpio", h);
  if (fs::exists(out)) return out;
  const fs::path stage = fs::path(k.dir) / "l1-stage";
  fs::remove_all(stage);
  fs::create_directories(stage / "bin");
  fs::create_directories(stage / "modules");
  fs::copy_file(busybox, stage / "bin" / "busybox");
  write_file(stage / "init", kL1Init, true);
  std::string order;
  for (const auto& m : k.modules) {
    const std::string base = fs::path(m).filename().string();
    fs::copy_file(m, stage / "modules" / base);
    order += base + "\n";
  }
  write_file(stage / "modules.order", order);
  const fs::path tmp = out.string() + ".tmp";
  auto c = capture({"sh", "-c",
                    fmt::format("find . | cpio --quiet -o -H newc > {}", shell_quote(tmp.string()))},
                   stage.string());
  fs::remove_all(stage);
  if (c.status != 0) {
    fs::remove(tmp);
    die(fmt::format("cannot build the L1 initramfs with cpio (is cpio installed?):\n{}",
                    last_lines(c.err, 8)));
  }
  fs::rename(tmp, out);
  return out;
}

// A temp dir removed on scope exit (unless XPV_TESTBED_KEEP is set, for debugging).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = "/tmp/" + prefix + ".XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) die(fmt::format("mkdtemp: {}", strerror(errno)));
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (std::getenv("XPV_TESTBED_KEEP") == nullptr) fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// QEMU as a child process; killed (TERM, then KILL) and reaped when this goes out of scope, and
// killed by the kernel if `xpv` itself dies (PR_SET_PDEATHSIG).
class QemuProcess {
 public:
  QemuProcess(const std::vector<std::string>& argv, const fs::path& log) {
    pid_ = fork();
    if (pid_ < 0) die(fmt::format("fork: {}", strerror(errno)));
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int null_fd = open("/dev/null", O_RDONLY);
      int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (null_fd < 0 || log_fd < 0) _exit(126);
      dup2(null_fd, 0);
      dup2(log_fd, 1);
      dup2(log_fd, 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
  }
  ~QemuProcess() { kill_and_reap(); }
  QemuProcess(const QemuProcess&) = delete;
  QemuProcess& operator=(const QemuProcess&) = delete;

  // True once the child has exited (status() is then valid).
  bool poll() {
    if (pid_ <= 0) return true;
    int st = 0;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = st;
      pid_ = -1;
      return true;
    }
    return false;
  }
  int status() const { return status_; }

  void kill_and_reap() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 30 && !poll(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st = 0;
      while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      status_ = st;
      pid_ = -1;
    }
  }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
};

// How long a CPU of L1 may be reported stuck before the session is given up (ConsoleWatch):
// XPV_TESTBED_LOCKUP_S, default 120 s (the kernel reports a soft lockup after ~20 s and again
// every ~30 s while it lasts; none seen in these L1s ended: session 14's ran to the timeout,
// session 16's was stopped by hand after 313 s); 0: never.
int lockup_limit_s() {
  const char* v = std::getenv("XPV_TESTBED_LOCKUP_S");
  if (v == nullptr || *v == '\0') return 120;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || n > 86400) die(fmt::format("XPV_TESTBED_LOCKUP_S={}: not a number of seconds", v));
  return static_cast<int>(n);
}

// Follows a file QEMU appends to (ttyS1) and copies complete lines to our stdout.
class Tail {
 public:
  explicit Tail(fs::path p) : path_(std::move(p)) {}
  ~Tail() {
    if (fd_ >= 0) close(fd_);
  }
  Tail(const Tail&) = delete;
  Tail& operator=(const Tail&) = delete;
  // Copies what is new; true when anything was (a partial line counts: the command is alive).
  bool pump(bool final) {
    if (fd_ < 0) fd_ = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return false;
    char buf[8192];
    ssize_t n;
    bool got = false;
    while ((n = read(fd_, buf, sizeof buf)) > 0) {
      pending_.append(buf, static_cast<size_t>(n));
      got = true;
    }
    // Serial output may carry CRs; drop them so the host sees plain lines.
    std::string out;
    size_t nl = pending_.rfind('\n');
    if (nl != std::string::npos) {
      out = pending_.substr(0, nl + 1);
      pending_.erase(0, nl + 1);
    }
    if (final && !pending_.empty()) {
      out += pending_ + "\n";
      pending_.clear();
    }
    if (out.empty()) return got;
    std::string clean;
    clean.reserve(out.size());
    for (char c : out) if (c != '\r') clean += c;
    fwrite(clean.data(), 1, clean.size(), stdout);
    fflush(stdout);
    return got;
  }

 private:
  fs::path path_;
  int fd_ = -1;
  std::string pending_;
};

}  // namespace

int run(const Options& opts) {
  if (opts.cmd.empty() && !opts.print_kernel) die("nothing to run: give the command after `--`");
  const Kernel k = ensure_kernel();
  if (opts.print_kernel) {
    fmt::print("{}\n", k.vmlinuz);
    return 0;
  }
  const fs::path initramfs = ensure_initramfs(k);

  TempDir run_dir("xpv-testbed");
  std::unique_ptr<TempDir> own_share;
  std::string share = opts.share;
  if (share.empty()) {
    own_share = std::make_unique<TempDir>("xpv-share");
    share = own_share->path().string();
  }
  share = fs::absolute(share).lexically_normal().string();
  if (share.size() > 1 && share.back() == '/') share.pop_back();
  if (!fs::is_directory(share)) die(fmt::format("--share {}: not a directory", share));
  // QEMU option values would need ',' doubled; refuse such paths instead.
  if (share.find(',') != std::string::npos) die(fmt::format("--share {}: ',' in the path", share));

  // The command, run by /bin/sh inside the chroot of the host root, in the caller's directory.
  std::string cmd_sh = "cd " + shell_quote(fs::current_path().string()) +
                       " || { echo 'xpv testbed: cannot enter the working directory in L1' >&2; "
                       "exit 125; }\n";
  for (const char* var : {"PATH", "HOME", "LANG", "TERM"}) {
    if (const char* v = std::getenv(var)) cmd_sh += fmt::format("export {}={}\n", var, shell_quote(v));
  }
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    if (kv.rfind("XPV_", 0) == 0 || kv.rfind("GTEST_", 0) == 0) {
      auto eq = kv.find('=');
      if (eq == std::string::npos) continue;
      cmd_sh += fmt::format("export {}={}\n", kv.substr(0, eq), shell_quote(kv.substr(eq + 1)));
    }
  }
  cmd_sh += "export XPV_TESTBED=1\nexec";
  for (const auto& a : opts.cmd) cmd_sh += " " + shell_quote(a);
  cmd_sh += "\n";
  write_file(run_dir.path() / "cmd.sh", cmd_sh);
  write_file(run_dir.path() / "env", "XPV_SHARE=" + shell_quote(share) + "\n");

  const fs::path console = run_dir.path() / "console.log";
  const fs::path out = run_dir.path() / "out.log";
  write_file(out, "");
  // XPV_TESTBED_APPEND adds L1 kernel parameters (debugging: e.g. loglevel=7).
  std::string append = "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init";
  if (const char* extra = std::getenv("XPV_TESTBED_APPEND"); extra != nullptr && *extra != '\0') {
    append += std::string(" ") + extra;
  }
  // XPV_TESTBED_ACCEL / XPV_TESTBED_SMP override QEMU's TCG mode and L1's CPU count (debugging).
  auto env_or = [](const char* name, std::string dflt) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? std::string(v) : dflt;
  };
  std::vector<std::string> argv = {
      "nice", "-n", "5", "qemu-system-x86_64",
      "-accel", env_or("XPV_TESTBED_ACCEL", "tcg,thread=multi"), "-cpu", "max",
      "-smp", env_or("XPV_TESTBED_SMP", "2"),
      "-m", std::to_string(opts.mem_mib),
      "-nodefaults", "-nographic", "-no-reboot",
      "-kernel", k.vmlinuz, "-initrd", initramfs.string(),
      "-append", append,
      "-serial", "file:" + console.string(),
      "-serial", "file:" + out.string(),
      "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
      "-virtfs", "local,path=" + run_dir.path().string() + ",mount_tag=xpvctl,security_model=none",
      "-virtfs", "local,path=" + share + ",mount_tag=share,security_model=none,multidevs=remap",
  };
  const int lockup_s = lockup_limit_s();  // a bad value fails here, before QEMU starts
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);

  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  int result = 0;
  std::string failure;
  {
    QemuProcess qemu(argv, run_dir.path() / "qemu.log");
    Tail tail(out);
    // L1's kernel console, watched for a CPU stuck for good (console_watch.h).
    ConsoleWatch watch(lockup_s);
    struct Fd {
      int fd = -1;
      ~Fd() {
        if (fd >= 0) close(fd);
      }
    } console_fd;
    auto watch_console = [&]() -> std::optional<std::string> {
      if (console_fd.fd < 0) console_fd.fd = open(console.c_str(), O_RDONLY | O_CLOEXEC);
      if (console_fd.fd < 0) return std::nullopt;
      char buf[8192];
      ssize_t n;
      std::optional<std::string> stuck;
      while ((n = read(console_fd.fd, buf, sizeof buf)) > 0) {
        if (auto s = watch.feed(std::string_view(buf, static_cast<std::size_t>(n)))) stuck = s;
      }
      return stuck;
    };
    bool ready = false;
    double last_output = 0;  // elapsed() when CMD last wrote anything (L1's boot counts from 0)
    for (;;) {
      const bool exited = qemu.poll();
      if (tail.pump(exited)) last_output = elapsed();
      if (!exited) {
        if (auto stuck = watch_console()) {
          failure = fmt::format("{}: L1 cannot finish; killed", *stuck);
          result = 124;
          break;
        }
      }
      if (!ready && fs::exists(run_dir.path() / "ready")) {
        ready = true;
        fmt::print(stderr, "xpv testbed: L1 ready in {:.1f} s (kernel {})\n", elapsed(), k.version);
      }
      if (exited) break;
      if (g_signal.load() != 0) {
        failure = fmt::format("interrupted by signal {}; L1 stopped", g_signal.load());
        result = 128 + g_signal.load();
        break;
      }
      if (elapsed() > opts.timeout_s) {
        failure = fmt::format("timeout after {} s; L1 killed", opts.timeout_s);
        result = 124;
        break;
      }
      // An L1 that never gets ready (seen: stuck after SeaBIOS's "Booting from ROM", no kernel
      // line) ends here, long before the quiet limit; the callers run a lost session again.
      if (!ready && opts.boot_s > 0 && elapsed() > opts.boot_s) {
        failure = fmt::format("L1 not ready after {} s (--boot-limit); L1 killed", opts.boot_s);
        result = 124;
        break;
      }
      // A session whose command has gone silent (L1 hung, or CMD stuck) ends here rather than at
      // the timeout; the callers run a lost session again.
      if (opts.quiet_s > 0 && elapsed() - last_output > opts.quiet_s) {
        failure = fmt::format("no output from the command for {} s (--quiet-limit); L1 killed", opts.quiet_s);
        result = 124;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    qemu.kill_and_reap();
    tail.pump(true);
    if (failure.empty()) {
      const fs::path rc = run_dir.path() / "rc";
      const fs::path err = run_dir.path() / "error";
      if (fs::exists(err)) {
        failure = read_file(err);
        while (!failure.empty() && failure.back() == '\n') failure.pop_back();
        result = 125;
      } else if (fs::exists(rc)) {
        result = std::atoi(read_file(rc).c_str());
      } else {
        failure = fmt::format("L1 stopped without reporting a result (QEMU status {:#x})", qemu.status());
        result = 125;
      }
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (!failure.empty()) {
    fmt::print(stderr, "xpv testbed: {}\n", failure);
    fmt::print(stderr, "xpv testbed: last L1 console lines:\n{}", last_lines(read_file(console), 25));
    const std::string qlog = read_file(run_dir.path() / "qemu.log");
    if (!qlog.empty()) fmt::print(stderr, "xpv testbed: QEMU said:\n{}", last_lines(qlog, 10));
  }
  fmt::print(stderr, "xpv testbed: done in {:.1f} s, exit {}\n", elapsed(), result);
  return result;
}

Command::Command(CLI::App& app) {
  sub_ = app.add_subcommand(
      "testbed", "run CMD inside a throwaway TCG VM (L1) with a real KVM (ENVIRONMENT.md)");
  sub_->add_option("--mem", opts_.mem_mib, "L1 memory in MiB")->capture_default_str();
  sub_->add_option("--share", opts_.share,
                   "writable directory shared into L1 at the same path (default: a temp dir)");
  sub_->add_option("--timeout", opts_.timeout_s, "seconds before L1 is killed")->capture_default_str();
  sub_->add_option("--quiet-limit", opts_.quiet_s,
                   "seconds CMD may print nothing before L1 is killed (exit 124); 0: no limit")
      ->capture_default_str();
  sub_->add_option("--boot-limit", opts_.boot_s,
                   "seconds L1 may take to get ready before it is killed (exit 124); 0: no limit")
      ->capture_default_str();
  sub_->add_flag("--print-kernel", opts_.print_kernel,
                 "fetch and cache Debian's kernel, print its vmlinuz path, exit");
  sub_->add_option("cmd", opts_.cmd, "command to run inside L1 (after --)");
}

bool Command::selected() const { return sub_->parsed(); }
int Command::run() const { return testbed::run(opts_); }

std::unique_ptr<Command> add_command(CLI::App& app) { return std::make_unique<Command>(app); }

}  // namespace xpv::testbed
