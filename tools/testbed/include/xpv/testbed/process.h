// Small helpers for setup code that runs host tools (apt-get, dpkg-deb, depmod, mke2fs, ldd):
// run a command to completion and capture what it printed. Used by the kernel cache
// (kernel.h), `xpv testbed` and `xpv image`. Everything here runs on the caller's thread and
// throws std::runtime_error (one line) only when the process cannot be started at all.
#pragma once

#include <string>
#include <vector>

namespace xpv::testbed {

struct Captured {
  int status = -1;  // exit status, or -1 when it could not run / was signalled
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs argv (PATH lookup for argv[0]) with stdin from /dev/null, in `cwd` if given, and waits.
// Output goes through unlinked temp files, so large outputs are fine.
Captured capture(const std::vector<std::string>& argv, const std::string& cwd = {});

// 'single-quoted' for /bin/sh.
std::string shell_quote(const std::string& s);

// The last n lines of text, each indented with "  | " (for error messages).
std::string last_lines(const std::string& text, size_t n);

}  // namespace xpv::testbed
