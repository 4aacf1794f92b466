// A loop device over a file for the tests that put a file system on a FUSE disk file: attached
// with `losetup --find --show`, detached exactly once.
//
// Once. Tests run in parallel (ctest -j2) and the kernel hands a freed /dev/loopN to the next
// `losetup --find` at once, so a second `losetup -d` of a name this test already detached can
// tear down another test's device between its mkfs and its mount ("can't read superblock").
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace xpv::test {

class LoopDevice {
 public:
  // Attaches `file`, with `sector_size`-byte logical sectors when non-zero; empty() when no loop
  // device could be had (the caller skips).
  explicit LoopDevice(const std::string& file, unsigned sector_size = 0) {
    const std::string opt = sector_size ? " --sector-size " + std::to_string(sector_size) : "";
    if (FILE* p = ::popen(("losetup --find --show" + opt + " '" + file + "' 2>/dev/null").c_str(), "r")) {
      char line[64] = {};
      if (std::fgets(line, sizeof line, p)) path_ = line;
      ::pclose(p);
    }
    while (!path_.empty() && path_.back() == '\n') path_.pop_back();
  }
  ~LoopDevice() { (void)detach(); }
  LoopDevice(const LoopDevice&) = delete;
  LoopDevice& operator=(const LoopDevice&) = delete;

  bool empty() const { return path_.empty(); }
  const std::string& path() const { return path_; }

  // `losetup -d`'s exit status; 0 when already detached. The name is forgotten either way.
  int detach() {
    if (path_.empty()) return 0;
    const std::string dev = std::exchange(path_, {});
    return std::system(("losetup -d " + dev + " 2>/dev/null").c_str());
  }

 private:
  std::string path_;
};

// `umount DIR` when it goes out of scope (declare it after the LoopDevice it mounts: unmounted first).
struct UnmountAtExit {
  std::string dir;
  ~UnmountAtExit() { (void)!std::system(("umount " + dir + " 2>/dev/null").c_str()); }
};

}  // namespace xpv::test
