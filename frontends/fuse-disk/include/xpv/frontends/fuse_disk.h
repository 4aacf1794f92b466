// FuseDisk — a PV disk (blkfront) exposed as one file in a FUSE mount, so that `losetup` can give
// dom0 a block device over it and mkfs/mount/fio/bonnie++ run through the whole PV path
// (DESIGN.md §1: the process domain; Xen's `xl block-attach 0`).
//
//   <mountpoint>/            read-only directory
//   <mountpoint>/<name>      the disk: size = the PV disk's size, rw or ro as the PV disk
//
// read/write become PV reads and writes, fsync/fdatasync a flush (blkif FLUSH_DISKCACHE),
// fallocate(PUNCH_HOLE|KEEP_SIZE) a discard. The file is opened with direct_io: no page cache
// in FUSE, so every write reaches the backend and a flush means what it says.
//
// Threading: libfuse's multi-threaded loop runs on threads of its own; BlockTarget must be
// thread-safe. The destructor unmounts (lazily, so a busy mount cannot hang it) and joins.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>

namespace xpv::frontends {

// What the FUSE file is backed by (xpv's blkfront; a fake in tests). Each call blocks until
// the I/O completed and returns bytes done (read/write) or 0 (flush/discard), or -errno.
class BlockTarget {
 public:
  virtual ~BlockTarget() = default;
  virtual std::uint64_t size_bytes() const = 0;
  virtual bool readonly() const = 0;
  virtual long read(std::uint64_t offset, std::span<std::uint8_t> out) = 0;
  virtual long write(std::uint64_t offset, std::span<const std::uint8_t> in) = 0;
  virtual int flush() = 0;
  virtual int discard(std::uint64_t offset, std::uint64_t length) = 0;
};

class FuseDisk {
 public:
  // Mounts at `mountpoint` (an existing empty directory). Throws std::runtime_error naming the
  // mountpoint if FUSE cannot be set up; nothing stays mounted then.
  FuseDisk(std::string mountpoint, std::string name, BlockTarget& target);
  ~FuseDisk();
  FuseDisk(const FuseDisk&) = delete;
  FuseDisk& operator=(const FuseDisk&) = delete;

  std::string file_path() const { return mountpoint_ + "/" + name_; }
  const std::string& mountpoint() const { return mountpoint_; }

  struct Impl;  // the libfuse callbacks reach it through fuse_get_context()->private_data

 private:
  std::string mountpoint_;
  std::string name_;
  std::unique_ptr<Impl> impl_;
  std::thread loop_;
};

}  // namespace xpv::frontends
