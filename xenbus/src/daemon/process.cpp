// The double fork every xpv daemon uses (see process.h). Runs on the main thread before any
// other thread exists.
#include "xpv/xenbus/daemon/process.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace xpv::daemon {

Launcher::~Launcher() {
  if (fd_ >= 0) ::close(fd_);
}

void Launcher::set(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void Launcher::ready() noexcept { send("1"); }

void Launcher::failed(const std::string& why) noexcept { send("0" + why); }

void Launcher::send(const std::string& m) noexcept {
  if (fd_ < 0) return;
  [[maybe_unused]] auto n = ::write(fd_, m.data(), m.size());
  ::close(fd_);
  fd_ = -1;
}

void daemonize(std::string_view program, Launcher& launcher, const ForkHooks& hooks) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  if (hooks.prepare) hooks.prepare();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(p[0]);
    ::close(p[1]);
    throw std::runtime_error("fork failed");
  }
  if (pid > 0) {
    // The launching process: read the report until the daemon closes the pipe (it does after
    // its report, or by dying).
    ::close(p[1]);
    std::string msg;
    char buf[512];
    ssize_t n;
    while ((n = ::read(p[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<std::size_t>(n));
    int st = 0;
    ::waitpid(pid, &st, 0);
    if (!msg.empty() && msg[0] == '1') std::_Exit(0);
    const std::string name(program);
    std::fprintf(stderr, "%s: %s\n", name.c_str(),
                 msg.size() > 1 ? msg.c_str() + 1 : "the daemon died during startup");
    std::_Exit(1);
  }
  ::close(p[0]);
  ::setsid();
  pid = ::fork();
  if (pid < 0) std::_Exit(1);
  if (pid > 0) std::_Exit(0);
  if (hooks.child) hooks.child();
  ::umask(022);
  if (::chdir("/") != 0) { /* "/" always exists */ }
  int null = ::open("/dev/null", O_RDWR);
  if (null >= 0) {
    ::dup2(null, 0);
    ::dup2(null, 1);
    ::dup2(null, 2);
    if (null > 2) ::close(null);
  }
  launcher.set(p[1]);
}

}  // namespace xpv::daemon
