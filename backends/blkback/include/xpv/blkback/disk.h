// Disk — the host side of one virtual block device: a raw image file or a block device, opened
// for O_DIRECT I/O where the file system allows it (tmpfs does not: then buffered I/O, said in the
// log and in DiskInfo::direct, with flushes still honoured so acknowledged writes survive).
#pragma once

#include <cstdint>
#include <string>

#include "xpv/unique_fd.h"

namespace xpv::blkback {

struct DiskInfo {
  std::uint64_t sectors = 0;               // in 512-byte units, as blkif counts them
  std::uint32_t logical_block_size = 512;  // blkif "sector-size"
  std::uint32_t physical_block_size = 512; // blkif "physical-sector-size"
  bool readonly = false;
  bool direct = false;       // opened with O_DIRECT
  bool discard = false;      // punch-hole (file) or BLKDISCARD-capable (device)
  bool block_device = false;
};

class Disk {
 public:
  // Throws std::runtime_error naming the path and the reason (missing, not a regular file or
  // block device, size not a multiple of 512, permission). `direct` false opens without
  // O_DIRECT (through the page cache), as happens by itself where the file system has none.
  static Disk open(const std::string& path, bool readonly, bool direct = true);

  int fd() const noexcept { return fd_.get(); }
  const DiskInfo& info() const noexcept { return info_; }
  const std::string& path() const noexcept { return path_; }

 private:
  Disk(std::string path, UniqueFd fd, DiskInfo info)
      : path_(std::move(path)), fd_(std::move(fd)), info_(info) {}
  std::string path_;
  UniqueFd fd_;
  DiskInfo info_;
};

}  // namespace xpv::blkback
