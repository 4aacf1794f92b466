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
// this one) gets the blocking read/write on the worker. The destructor ends the connection
// (files still open on it get errors from then on), unmounts, joins the loop's threads and waits
// for the replies of requests still in flight.
//
// Transport: where the kernel offers FUSE over io_uring (Linux ≥ 6.14 with the fuse module's
// enable_uring on) and FuseDiskOptions::uring allows, requests travel through io_uring rings
// (src/fuse_uring.h) instead of reads and writes of /dev/fuse: libfuse still decodes them and
// builds the replies, xpv's code carries them. Work that would block a ring's worker (a flush,
// a discard, a read or write the target cannot start asynchronously) runs on a thread pool.
// Where the kernel does not offer it, or the rings cannot be set up, /dev/fuse serves as before.
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
  // once: later, on a thread of the target's (or one calling poll()), or — a target that
  // finishes at once — inside this call; `out` stays valid until then, `in` only until this call
  // returns (a target copies what it needs). false: not started (any reason: no asynchronous
  // path, no free slot, unaligned); the caller uses read/write.
  using Done = std::function<void(long result)>;
  virtual bool start_read(std::uint64_t /*offset*/, std::span<std::uint8_t> /*out*/, Done& /*done*/) { return false; }
  virtual bool start_write(std::uint64_t /*offset*/, std::span<const std::uint8_t> /*in*/, Done& /*done*/) {
    return false;
  }
  // Optional completion by polling (FUSE's ring workers while they are awake). Between
  // polling(true) and polling(false) the caller calls poll(), which runs, on its thread, the
  // `done` of asynchronous requests answered by then, without blocking; meanwhile the target's
  // own thread need not wake up for them. polling(false): that thread completes everything in
  // flight from then on. Calls nest (a count).
  virtual void polling(bool /*on*/) {}
  virtual void poll() {}
};

struct FuseDiskOptions {
  // Take FUSE over io_uring when the kernel offers it (see above); false: /dev/fuse always.
  bool uring = true;
  // Ring entries per kernel queue (one queue per possible CPU), each with a payload area of
  // max_write (1 MiB, reserved lazily); 0: 32 up to 4 queues, fewer beyond, at least 4.
  unsigned uring_entries = 0;
  // Worker threads for the rings (each serves every n-th queue); 0: one per queue, at most 4.
  unsigned uring_threads = 0;
  // Ring workers collect the target's answers themselves while they are awake and have requests
  // outstanding (BlockTarget::polling/poll), instead of a thread of the target's handing each
  // answer over; false: never (the target's own thread always answers).
  bool uring_poll = true;
};

class FuseDisk {
 public:
  // Mounts at `mountpoint` (an existing empty directory). Throws std::runtime_error naming the
  // mountpoint if FUSE cannot be set up; nothing stays mounted then.
  FuseDisk(std::string mountpoint, std::string name, BlockTarget& target, FuseDiskOptions options = {});
  ~FuseDisk();
  FuseDisk(const FuseDisk&) = delete;
  FuseDisk& operator=(const FuseDisk&) = delete;

  std::string file_path() const { return mountpoint_ + "/" + name_; }
  const std::string& mountpoint() const { return mountpoint_; }

  // Whether the rings were accepted (known once the kernel's FUSE_INIT was answered, i.e. after
  // the first request), and how many requests came through them.
  bool uring_active() const noexcept;
  std::uint64_t uring_requests() const noexcept;
  // The fuse module's enable_uring parameter reads Y: new mounts are offered FUSE over io_uring.
  static bool uring_offered();

  struct Impl;  // the libfuse callbacks reach it through fuse_get_context()->private_data

 private:
  std::string mountpoint_;
  std::string name_;
  std::unique_ptr<Impl> impl_;
  std::thread loop_;
};

// Turns the fuse module's enable_uring parameter on for this object's lifetime (root; for
// tests and `xpv bench blk`), and back off when the last such object in any process goes, if it
// was off before the first. Holders count through a shared flock on
// /run/lock/xpv-fuse-uring.lock; a marker file next to it says the parameter was off. Throws
// std::runtime_error if the kernel has no such parameter (before Linux 6.14) or it cannot be
// written.
class FuseUringEnable {
 public:
  FuseUringEnable();
  ~FuseUringEnable();
  FuseUringEnable(const FuseUringEnable&) = delete;
  FuseUringEnable& operator=(const FuseUringEnable&) = delete;
  // The parameter exists (the kernel can do FUSE over io_uring at all).
  static bool available();

 private:
  int lock_fd_ = -1;
};

}  // namespace xpv::frontends
