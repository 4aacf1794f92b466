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
// thread-safe. A target that can start reads and writes asynchronously (start_read/start_write)
// gets them so: the worker that took the request from the kernel starts it and goes back for the
// next one, and the reply is sent from the thread that completes it — a few workers keep a deep
// queue in flight instead of one blocked worker per request. A target without (or one refusing
// this one) gets the blocking read/write on the worker. The destructor unmounts, joins the loop's
// threads and waits for the replies of requests still in flight.
#pragma once

#include <cstdint>
#include <functional>
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

  // Optional asynchronous read/write. true: started, and `done(bytes done or -errno)` runs exactly
  // once, later, on a thread of the target's (never inside this call); `out` stays valid until
  // then, `in` only until this call returns (a target copies what it needs). false: not started
  // (any reason: no asynchronous path, no free slot, unaligned); the caller uses read/write.
  using Done = std::function<void(long result)>;
  virtual bool start_read(std::uint64_t /*offset*/, std::span<std::uint8_t> /*out*/, Done& /*done*/) { return false; }
  virtual bool start_write(std::uint64_t /*offset*/, std::span<const std::uint8_t> /*in*/, Done& /*done*/) {
    return false;
  }
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
