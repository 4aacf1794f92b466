// Test helpers: child processes with captured output, a temporary directory, and a running
// xpv-xenstored — all RAII, so a failing test still kills its daemon and removes its files.
// Every wait is bounded in time.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace xpv::test {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "xpv-xs-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child process with stdout and stderr on pipes. The destructor kills and reaps it.
class Proc {
 public:
  Proc(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
      throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> env_store;
    for (char** e = environ; *e; ++e) env_store.emplace_back(*e);
    for (const auto& e : extra_env) env_store.push_back(e);
    std::vector<char*> env;
    for (auto& e : env_store) env.push_back(e.data());
    env.push_back(nullptr);
    int rc = ::posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), env.data());
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
    }
  }
  ~Proc() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  pid_t pid() const { return pid_; }

  // Reads stdout until a newline or the timeout; returns the line without '\n'.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      auto nl = out_.find('\n');
      if (nl != std::string::npos) {
        std::string line = out_.substr(0, nl);
        out_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{out_fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      char buf[4096];
      ssize_t n = ::read(out_fd_, buf, sizeof buf);
      if (n <= 0) return std::nullopt;
      out_.append(buf, static_cast<std::size_t>(n));
    }
  }

  // Collects all output and waits for exit (SIGKILL after the timeout). Returns the exit code,
  // or 128+signal.
  int wait(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return -1;  // waited for already: never waitpid(-1) or kill(-1)
    auto deadline = std::chrono::steady_clock::now() + timeout;
    bool out_open = true, err_open = true;
    while (out_open || err_open) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        ::kill(pid_, SIGKILL);
        break;
      }
      pollfd p[2] = {{out_open ? out_fd_ : -1, POLLIN, 0}, {err_open ? err_fd_ : -1, POLLIN, 0}};
      if (::poll(p, 2, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      if (out_open && (p[0].revents & (POLLIN | POLLHUP))) {
        ssize_t n = ::read(out_fd_, buf, sizeof buf);
        if (n <= 0) out_open = false; else out_.append(buf, static_cast<std::size_t>(n));
      }
      if (err_open && (p[1].revents & (POLLIN | POLLHUP))) {
        ssize_t n = ::read(err_fd_, buf, sizeof buf);
        if (n <= 0) err_open = false; else err_.append(buf, static_cast<std::size_t>(n));
      }
    }
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_;
  std::string err_;
};

struct RunResult {
  int rc;
  std::string out;
  std::string err;
};

inline RunResult run(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                     std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  Proc p(argv, env);
  int rc = p.wait(timeout);
  return {rc, p.out(), p.err()};
}

inline bool can_connect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);
  return ok;
}

// A connected unix stream socket (closed on destruction); invalid() if the connect failed.
class UnixClient {
 public:
  explicit UnixClient(const std::string& path) : fd_(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~UnixClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  UnixClient(const UnixClient&) = delete;
  UnixClient& operator=(const UnixClient&) = delete;
  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // Reads until `n` bytes came, the peer closed, or `timeout` passed; returns what came.
  std::string read_exactly(std::size_t n, std::chrono::milliseconds timeout) const {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out.size() < n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t got = ::read(fd_, buf, std::min(sizeof buf, n - out.size()));
      if (got <= 0) break;
      out.append(buf, static_cast<std::size_t>(got));
    }
    return out;
  }

 private:
  int fd_;
};

// xpv-xenstored --foreground on <tmpdir>/socket; SIGTERM (then SIGKILL) on destruction.
class Daemon {
 public:
  explicit Daemon(const std::string& binary, std::vector<std::string> extra = {})
      : socket_(dir_.path() + "/socket"), binary_(binary), extra_(std::move(extra)) {
    start();
  }
  ~Daemon() { stop(); }
  // (Again) on the same socket with the same arguments; throws if it does not serve within 10 s.
  void start() {
    std::vector<std::string> argv{binary_, "--foreground", "--socket", socket_, "--log-level", "error"};
    for (auto& e : extra_) argv.push_back(e);
    proc_.emplace(argv, std::vector<std::string>{});
    for (int i = 0; i < 1000 && !can_connect(socket_); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!can_connect(socket_)) throw std::runtime_error("xpv-xenstored did not start: " + proc_->err());
  }
  // SIGKILL: no clean shutdown (the socket file stays behind).
  void crash() {
    if (!proc_) return;
    ::kill(proc_->pid(), SIGKILL);
    (void)proc_->wait(std::chrono::seconds(20));
    proc_.reset();
  }
  // SIGTERM and wait; returns the exit code (0 for a clean shutdown).
  int stop() {
    if (!proc_) return -1;
    ::kill(proc_->pid(), SIGTERM);
    int rc = proc_->wait(std::chrono::seconds(20));
    proc_.reset();
    return rc;
  }
  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_.path(); }
  std::vector<std::string> env() const { return {"XENSTORED_PATH=" + socket_}; }
  pid_t pid() const { return proc_ ? proc_->pid() : -1; }

 private:
  TempDir dir_;
  std::string socket_;
  std::string binary_;
  std::vector<std::string> extra_;
  std::optional<Proc> proc_;
};

}  // namespace xpv::test
