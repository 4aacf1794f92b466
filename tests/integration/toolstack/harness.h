// Test harness: run `xpv` with captured output (bounded in time), and a temporary host — run
// dir, log dir, xenstore socket, bin dir — that is torn down also when a test fails: `xpv down
// --force`, then SIGKILL for any process still named in a pid file or whose command line
// mentions the temporary directory, unmount anything below it, remove it.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "xpv/toolstack/host_cleanup.h"

extern char** environ;

namespace xpv::test {

struct RunResult {
  int rc = -1;
  std::string out, err;
};

// Runs argv with extra environment; kills it after `timeout`. `started`, if given, gets its pid.
inline RunResult run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env_add = {},
                             std::chrono::seconds timeout = std::chrono::seconds(120),
                             std::atomic<pid_t>* started = nullptr) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) env_store.emplace_back(*e);
  for (const auto& e : env_add) env_store.push_back(e);
  std::vector<char*> env, args;
  for (auto& e : env_store) env.push_back(e.data());
  env.push_back(nullptr);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, args[0], &fa, nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  ::close(err[1]);
  RunResult r;
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
  }
  if (started) started->store(pid);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd p[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0 && std::chrono::steady_clock::now() < deadline) {
    if (::poll(p, 2, 100) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      const ssize_t n = ::read(p[i].fd, buf, sizeof buf);
      if (n > 0) {
        (i == 0 ? r.out : r.err).append(buf, static_cast<std::size_t>(n));
      } else {
        ::close(p[i].fd);
        p[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& x : p) {
    if (x.fd >= 0) ::close(x.fd);
  }
  int status = 0;
  if (started) started->store(0);  // about to be reaped: no longer a pid to signal
  for (;;) {
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.err += "\n(killed: timeout)";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

using toolstack::processes_mentioning;  // xpv/toolstack/host_cleanup.h

class TestHost {
 public:
  // `fake_bin`: a bin dir of symlinks — the real xpv-xenstored, and `fake` as xpv-front /
  // xpv-blkback / xpv-netback as listed in `fakes`. Otherwise the build's own bin dir.
  TestHost(const std::string& real_bin, const std::string& fake, const std::vector<std::string>& fakes,
           bool use_real_bin = false)
      : real_bin_(real_bin) {
    std::string t = (std::filesystem::temp_directory_path() / "xpv-ts-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp");
    dir = t;
    run_dir = dir + "/run";
    log_dir = dir + "/log";
    xs_socket = dir + "/xs.sock";
    if (use_real_bin) {
      bin_dir = real_bin;
    } else {
      bin_dir = dir + "/bin";
      std::filesystem::create_directory(bin_dir);
      std::filesystem::create_symlink(real_bin + "/xpv-xenstored", bin_dir + "/xpv-xenstored");
      for (const auto& f : fakes) std::filesystem::create_symlink(fake, bin_dir + "/" + f);
    }
  }
  ~TestHost() {
    // A destructor must not throw (that aborts the whole test binary): a failing step is
    // reported and the rest of the clean-up still runs.
    auto step = [](const char* what, auto&& f) {
      try {
        f();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "TestHost clean-up, " << what << ": " << e.what();
      }
    };
    step("xpv down --force", [&] { run({"down", "--force"}); });
    // Anything left (a test failed half-way): kill it.
    step("killing what is left", [&] {
      for (int round = 0; round < 3; ++round) {
        auto left = processes_mentioning(dir);
        if (left.empty()) break;
        for (pid_t p : left) ::kill(p, SIGKILL);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
    step("unmounting", [&] { xpv::toolstack::unmount_under(dir); });
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TestHost(const TestHost&) = delete;
  TestHost& operator=(const TestHost&) = delete;

  RunResult run(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) const {
    return run_command(xpv_argv(args), env);
  }
  // run(), sending `sig` to the command once `when()` holds (looked at every 10 ms, for at most
  // 60 s; never if the command ended first).
  RunResult run_signalled(const std::vector<std::string>& args, int sig, const std::function<bool()>& when) const {
    const std::vector<std::string> argv = xpv_argv(args);
    std::atomic<pid_t> pid{0};
    std::atomic<bool> done{false};
    RunResult r;
    std::thread t([&] {
      try {
        r = run_command(argv, {}, std::chrono::seconds(120), &pid);
      } catch (const std::exception& e) {
        r.err = e.what();
      }
      done = true;
    });
    for (int i = 0; i < 6000 && !done; ++i) {
      if (const pid_t child = pid.load(); child > 0 && when()) {
        ::kill(child, sig);  // our child, not yet reaped (run_command sets 0 before it reaps)
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    t.join();
    return r;
  }

  std::string write(const std::string& name, const std::string& content) const {
    const std::string p = dir + "/" + name;
    std::ofstream(p) << content;
    return p;
  }

  std::string dir, run_dir, log_dir, xs_socket, bin_dir;

 private:
  // `xpv` on this host's directories, then `args`.
  std::vector<std::string> xpv_argv(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {real_bin_ + "/xpv", "--run-dir", run_dir, "--log-dir", log_dir,
                                     "--xenstore", xs_socket, "--bin-dir", bin_dir, "--netns-dir", dir + "/netns"};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  std::string real_bin_;
};

}  // namespace xpv::test
