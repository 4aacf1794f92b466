// Small pieces every xpv daemon's main() needs (xpv-xenstored, xpv-blkback, xpv-front): the
// --log-level names and a pid file that goes away with the process. Header-only; setup code.
#pragma once

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace xpv::daemon {

// trace, debug, info, warn|warning, error, off; nullopt for anything else.
inline std::optional<spdlog::level::level_enum> parse_log_level(std::string_view s) {
  using spdlog::level::level_enum;
  if (s == "trace") return level_enum::trace;
  if (s == "debug") return level_enum::debug;
  if (s == "info") return level_enum::info;
  if (s == "warn" || s == "warning") return level_enum::warn;
  if (s == "error") return level_enum::err;
  if (s == "off") return level_enum::off;
  return std::nullopt;
}

// Writes this process's pid to `path`; removes the file when the daemon exits normally.
class PidFile {
 public:
  PidFile() = default;
  explicit PidFile(std::string path) : path_(std::move(path)) {
    std::ofstream f(path_);
    if (!f) throw std::runtime_error("cannot write pid file " + path_);
    f << ::getpid() << '\n';
  }
  PidFile(PidFile&& o) noexcept : path_(std::exchange(o.path_, {})) {}
  PidFile& operator=(PidFile&& o) noexcept {
    std::swap(path_, o.path_);
    return *this;
  }
  PidFile(const PidFile&) = delete;
  PidFile& operator=(const PidFile&) = delete;
  ~PidFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }

 private:
  std::string path_;
};

}  // namespace xpv::daemon
