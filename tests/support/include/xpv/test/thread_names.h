// thread_names(pid) — the names of a process's threads (/proc/<pid>/task/*/comm), for tests
// that check what `top -H` and `ps -L` will show. Empty if the process is gone.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <system_error>

namespace xpv::test {

inline std::multiset<std::string> thread_names(pid_t pid) {
  std::multiset<std::string> names;
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream f(t.path() / "comm");
    std::string name;
    if (std::getline(f, name)) names.insert(name);
  }
  return names;
}

}  // namespace xpv::test
