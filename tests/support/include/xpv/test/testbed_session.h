// Helpers shared by the testbed tests (tests/testbed/*): they run a script inside `xpv testbed`
// once per test suite and assert on the text it printed.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <system_error>

namespace xpv::test {

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Exit status of `sh -c cmd` (-1 when it did not exit normally).
inline int shell(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Single-quoted for sh (the paths the tests make have no quotes in them).
inline std::string quote(const std::string& s) { return "'" + s + "'"; }

// The text from the first `begin` to the following `end` (exclusive), or empty.
inline std::string between(const std::string& text, const std::string& begin, const std::string& end) {
  const auto b = text.find(begin);
  if (b == std::string::npos) return {};
  const auto e = text.find(end, b);
  return text.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

// The part of a session's output from the line "XPV-TEST: begin NAME" through the line that
// starts "XPV-TEST: end NAME" (included: it may carry a status, e.g. "rc=0"), or empty.
inline std::string section(const std::string& out, const std::string& name) {
  const auto b = out.find("XPV-TEST: begin " + name + "\n");
  if (b == std::string::npos) return {};
  const auto e = out.find("XPV-TEST: end " + name, b);
  if (e == std::string::npos) return out.substr(b);
  const auto eol = out.find('\n', e);
  return out.substr(b, eol == std::string::npos ? std::string::npos : eol + 1 - b);
}

// A fresh directory under /tmp (visible inside the testbed), removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = "/tmp/" + prefix + ".XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  bool ok() const noexcept { return !path_.empty(); }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

// Runs `xpv testbed` sessions through `run(n)` (n = 1, 2, …: it runs session n and returns the
// testbed's exit status and what it printed) until one is not lost by the testbed itself — exit
// 124 (timeout, or L1's kernel stuck) or 125 (L1 stopped without a result, e.g. it reset) —,
// `sessions` at most: nested SVM under TCG loses whole L1 sessions now and then, whichever VMM
// runs in them (tools/testbed/README.md, known issue). Every lost session's end is printed under
// `what`. The last session's status and output are returned.
struct SessionResult {
  int rc = -1;
  std::string output;
};
inline SessionResult run_sessions(const std::string& what, const std::function<SessionResult(int)>& run,
                                  int sessions = 3) {
  SessionResult r;
  for (int n = 1; n <= sessions; ++n) {
    r = run(n);
    if (r.rc != 124 && r.rc != 125) break;
    std::cout << "[ INFO     ] " << what << ": testbed session " << n << " lost (exit " << r.rc << "); its end:\n"
              << r.output.substr(r.output.size() > 3000 ? r.output.size() - 3000 : 0) << "\n";
  }
  return r;
}

}  // namespace xpv::test
