// ldd output parser: see ldd.h. Pure.
#include "xpv/image/ldd.h"

#include <sstream>

namespace xpv::image {

LddResult parse_ldd(const std::string& text) {
  LddResult r;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    line.erase(0, first);
    std::string path;
    if (auto arrow = line.find(" => "); arrow != std::string::npos) {
      std::string rhs = line.substr(arrow + 4);
      if (rhs.rfind("not found", 0) == 0) {
        r.missing.push_back(line.substr(0, arrow));
        continue;
      }
      path = rhs.substr(0, rhs.find(" ("));
    } else if (line.front() == '/') {
      path = line.substr(0, line.find(" ("));
    }
    if (path.empty() || path.front() != '/') continue;  // linux-vdso.so.1, "statically linked"
    bool seen = false;
    for (const auto& p : r.paths) seen = seen || p == path;
    if (!seen) r.paths.push_back(path);
  }
  return r;
}

}  // namespace xpv::image
