// Device statistics files — what a backend daemon publishes about each device it serves, for
// `xpv top` (as Linux's blkback and netback publish theirs in sysfs for xentop). One file per
// device, <run_dir>/stats/<device name> (vbd<domid>.<devid>, vif<domid>.<devid>), of "key value"
// lines with unsigned counters since the device connected to this daemon:
//
//   # vbd1.51712 xpv-blkback pid 4711
//   rd_req 1204
//   wr_req 88
//
// xpv-vmm keeps one of the same form for its guest's exits and hypercalls (vmm<domid>, its
// --stats-file). The daemon rewrites it about once a second (replace_file.h: a reader sees either
// the old or the new text, never half of one) and removes it when the device disconnects or the
// daemon stops. A daemon killed with -9 leaves its files behind until its successor
// removes them at its start (Publisher::remove_leftovers); the file's mtime says how fresh it is.
#pragma once

#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xpv/replace_file.h"

namespace xpv::stats {

using Counters = std::vector<std::pair<std::string, std::uint64_t>>;

inline std::string stats_dir(const std::string& run_dir) { return run_dir + "/stats"; }

// The text of one file: a comment line naming the device and the writer, then the counters.
inline std::string format(std::string_view device, std::string_view writer, const Counters& counters) {
  std::string s = "# " + std::string(device) + " " + std::string(writer) + " pid " + std::to_string(::getpid()) + "\n";
  for (const auto& [k, v] : counters) s += k + " " + std::to_string(v) + "\n";
  return s;
}

// Writes `text` as dir/name (replace_file: through dir/name.tmp and a rename). Returns 0, or the
// errno of the step that failed.
inline int publish(const std::string& dir, const std::string& name, const std::string& text) {
  return replace_file(dir + "/" + name, text);
}

inline void withdraw(const std::string& dir, const std::string& name) noexcept {
  (void)::unlink((dir + "/" + name).c_str());
}

// The files one daemon keeps in `dir`: put() publishes a device's counters; sweep() withdraws the
// files of devices not put since the previous sweep (they disconnected); clear() withdraws all.
// Single-threaded (the daemon's control thread).
class Publisher {
 public:
  Publisher(std::string dir, std::string writer) : dir_(std::move(dir)), writer_(std::move(writer)) {}
  ~Publisher() { clear(); }
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // 0, or the errno of this put's failure the first time one fails (later failures give 0 too,
  // so that the caller logs one line, not one a second).
  int put(const std::string& name, const Counters& counters) {
    now_.insert(name);
    const int e = publish(dir_, name, format(name, writer_, counters));
    if (e == 0 || failed_) return 0;
    failed_ = true;
    return e;
  }
  void sweep() {
    for (const auto& name : before_) {
      if (!now_.count(name)) withdraw(dir_, name);
    }
    before_ = std::move(now_);
    now_.clear();
  }
  void clear() noexcept {
    for (const auto& name : before_) withdraw(dir_, name);
    for (const auto& name : now_) withdraw(dir_, name);
    before_.clear();
    now_.clear();
  }
  const std::string& dir() const noexcept { return dir_; }
  // At a daemon's start: removes every file in `dir` whose name begins with `prefix` ("vbd",
  // "vif": one daemon writes each kind), which a predecessor killed with -9 left behind; the
  // devices still connected are published again within a second.
  void remove_leftovers(std::string_view prefix) const {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with(prefix)) std::filesystem::remove(e.path(), ec);  // NAME.tmp too
    }
  }

 private:
  std::string dir_, writer_;
  std::set<std::string> before_, now_;
  bool failed_ = false;
};

// The counters of a file's text; comment lines, blank lines and lines that are not "key
// unsigned-number" are skipped (a reader never fails on a file it does not understand).
inline std::map<std::string, std::uint64_t> parse(std::string_view text) {
  std::map<std::string, std::uint64_t> out;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (line.empty() || line.front() == '#') continue;
    const auto sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0) continue;
    const std::string_view num = line.substr(sp + 1);
    std::uint64_t v = 0;
    const auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
    if (ec != std::errc() || p != num.data() + num.size()) continue;
    out[std::string(line.substr(0, sp))] = v;
  }
  return out;
}

}  // namespace xpv::stats
