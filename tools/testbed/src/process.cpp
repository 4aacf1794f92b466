// Running host tools from setup code: see process.h.
#include "xpv/testbed/process.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace xpv::testbed {

Captured capture(const std::vector<std::string>& argv, const std::string& cwd) {
  if (argv.empty()) throw std::runtime_error("capture: empty command");
  Captured c;
  char out_tmpl[] = "/tmp/xpv-capture-out.XXXXXX";
  char err_tmpl[] = "/tmp/xpv-capture-err.XXXXXX";
  const int out_fd = mkostemp(out_tmpl, O_CLOEXEC);
  const int err_fd = mkostemp(err_tmpl, O_CLOEXEC);
  if (out_fd < 0 || err_fd < 0) {
    if (out_fd >= 0) close(out_fd), unlink(out_tmpl);
    if (err_fd >= 0) close(err_fd), unlink(err_tmpl);
    throw std::runtime_error(fmt::format("cannot create a temp file: {}", strerror(errno)));
  }
  unlink(out_tmpl);
  unlink(err_tmpl);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(out_fd);
    close(err_fd);
    throw std::runtime_error(fmt::format("fork: {}", strerror(errno)));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd < 0) _exit(126);
    dup2(null_fd, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(126);
    execvp(args[0], args.data());
    _exit(127);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  c.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  auto slurp = [](int fd) {
    std::string s;
    lseek(fd, 0, SEEK_SET);
    char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) s.append(buf, static_cast<size_t>(n));
    close(fd);
    return s;
  };
  c.out = slurp(out_fd);
  c.err = slurp(err_fd);
  return c;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

std::string last_lines(const std::string& text, size_t n) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::string out;
  for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) {
    out += "  | " + lines[i] + "\n";
  }
  return out;
}

}  // namespace xpv::testbed
