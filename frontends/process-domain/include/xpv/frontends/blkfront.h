// Blkfront — xpv's own blkif frontend, the data path (its xenbus negotiation is separate): turns
// blocking read/write/flush/discard calls from any thread (FUSE's worker threads) into blkif
// requests on one or more shared rings in the domain's memory (one BlkfrontQueue each: ring,
// event channel, slots with pre-granted data pages), completed from the domain's event handler.
//
// Which queue a call uses: the calling thread's. Each thread that calls in is given an ordinal
// once (a process-wide counter, on its first call); it uses queue ordinal % queues. That is
// xpv's counterpart of Linux's blk-mq mapping a CPU to a hardware queue: the callers (FUSE
// workers, bench threads) stand for the guest's CPUs here; consecutive threads land on
// different queues, so N busy threads spread over N queues and each queue's lock is taken
// mostly by its own threads, and one thread's requests stay on one ring. (Round-robin per
// request would spread even one thread's requests, but every caller would contend for every
// queue's lock and cache lines.) A blocking call whose queue is full waits for a slot on it
// even if another queue has room; an asynchronous start takes the next queue with room.
//
// Large I/O is split into requests of at most the queue's segments (11 direct, or the
// negotiated indirect segments); partial sectors are read-modify-written (one at a time).
//
// Flush guarantee: flush() returns only after every write that was acknowledged (its write()
// returned) before flush() was called is durable. It sends one BLKIF_OP_FLUSH_DISKCACHE on the
// calling thread's queue, not one per queue: blkif orders nothing across rings (as with Linux,
// a flush answered on queue A does not wait for writes still in flight on queue B), but writes
// that were already acknowledged were completed by the backend, and xpv-blkback (O_DIRECT, and
// fdatasync on the one image file for a flush, whichever queue it came on) makes them durable
// with a flush on any one queue. Writes still in flight when flush() is called are not covered
// (a block device's flush never covers those).
//
// A queue that the backend breaks (a response naming no outstanding request, a bad ring index)
// breaks the whole device: every later call on any queue returns -EIO (DESIGN.md §5).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "xpv/domain/domain.h"
#include "xpv/frontends/blkfront_queue.h"
#include "xpv/frontends/fuse_disk.h"
#include "xpv/frontends/guest_events.h"

namespace xpv::frontends {

// The most queues a Blkfront has (xpv-front's --blk-queues range).
inline constexpr std::uint32_t kBlkfrontMaxQueues = 16;

struct BlkfrontGeometry {
  std::uint64_t sectors = 0;  // 512-byte sectors, from the backend's `sectors` node
  bool readonly = false;
  bool flush = false;         // backend offers feature-flush-cache
  bool discard = false;       // backend offers feature-discard
};

struct BlkfrontConfig {
  std::uint32_t ring_page_order = 0;     // 2^order ring pages per queue (≤ backend's max-ring-page-order)
  std::uint32_t indirect_segments = 0;   // 0: direct requests only (11 segments)
  std::uint32_t queues = 1;              // 1..kBlkfrontMaxQueues (≤ backend's multi-queue-max-queues)
  domain::DomId backend = 0;
  std::chrono::nanoseconds poll_max{100000};  // per queue: BlkfrontQueueConfig::poll_max
  // One thread per queue completes asynchronous requests (their callbacks run there): what
  // BlockTarget::start_read/start_write (FuseDisk) need. Without, those refuse (FuseDisk then
  // blocks a worker per request) and start() callers run complete() themselves.
  bool completion_threads = false;
};

class Blkfront final : public BlockTarget {
 public:
  // Creates config.queues BlkfrontQueues (rings, data pages, grants, event channels) in `dom`.
  // Throws if the domain has no room or the config is out of range (nothing is left allocated).
  Blkfront(domain::Domain& dom, GuestEvents& events, BlkfrontConfig config);
  ~Blkfront() override;
  Blkfront(const Blkfront&) = delete;
  Blkfront& operator=(const Blkfront&) = delete;

  // What the xenbus negotiation publishes per queue (ring-ref / ring-refN, event-channel).
  std::uint32_t queues() const noexcept { return static_cast<std::uint32_t>(queues_.size()); }
  const std::vector<gnttab::GrantRef>& ring_refs(std::uint32_t queue = 0) const { return queues_.at(queue)->ring_refs(); }
  domain::Port event_channel(std::uint32_t queue = 0) const { return queues_.at(queue)->event_channel(); }
  const BlkfrontConfig& config() const noexcept { return config_; }

  // Called once the backend is Connected and its geometry is known (before any I/O).
  void connect(const BlkfrontGeometry& g);
  bool broken() const noexcept { return broken_.load(std::memory_order_acquire); }

  // BlockTarget (any thread).
  std::uint64_t size_bytes() const override { return geometry_.sectors * 512; }
  bool readonly() const override { return geometry_.readonly; }
  long read(std::uint64_t offset, std::span<std::uint8_t> out) override;
  long write(std::uint64_t offset, std::span<const std::uint8_t> in) override;
  int flush() override;
  int discard(std::uint64_t offset, std::uint64_t length) override;

  // Asynchronous I/O on one queue (BlkfrontQueue::start/complete, for a caller that keeps many
  // requests in flight from one thread per queue): `offset` and `buf.size()` in whole sectors,
  // at most max_io_bytes(); `buf` stays valid until `done` ran. start() returns 0, -EINVAL (out
  // of range, unaligned, too large, no such queue), -EROFS (a write to a read-only disk), -EIO
  // (broken) or -EBUSY (the queue's slots are all in flight: complete() first).
  std::uint64_t max_io_bytes() const noexcept { return queues_.front()->max_sectors() * 512; }
  int start(std::uint32_t queue, bool write, std::uint64_t offset, std::span<std::uint8_t> buf,
            BlkfrontQueue::Done done);
  // Not with completion_threads (std::logic_error): those threads complete every request.
  unsigned complete(std::uint32_t queue, unsigned min);
  // BlockTarget's asynchronous path (with completion_threads): whole sectors of at most
  // max_io_bytes() in range, on the calling thread's queue or, if all its slots are in flight,
  // the next queue with a free one; otherwise false.
  bool start_read(std::uint64_t offset, std::span<std::uint8_t> out, Done& done) override;
  bool start_write(std::uint64_t offset, std::span<const std::uint8_t> in, Done& done) override;
  // BlockTarget's polling (with completion_threads): every queue's answers, on the caller's thread.
  void polling(bool on) override;
  void poll() override;

  using Stats = BlkfrontQueue::Stats;
  Stats stats() const;                           // all queues summed
  Stats queue_stats(std::uint32_t queue) const;  // one queue

 private:
  BlkfrontQueue& my_queue() noexcept;  // the calling thread's
  std::size_t my_queue_index() const noexcept;
  // Sector-aligned I/O of whole sectors, split into requests on the caller's queue; 0 or -errno.
  int io_sectors(bool write, std::uint64_t sector, std::uint8_t* buf, std::uint64_t nsect);
  bool start_io(bool write, std::uint64_t offset, std::uint8_t* buf, std::uint64_t len, Done& done);
  // An asynchronous request's byte range: whole sectors, in the disk, at most one request's worth.
  bool one_request(std::uint64_t offset, std::uint64_t len) const noexcept;

  BlkfrontConfig config_;
  BlkfrontGeometry geometry_;
  std::atomic<bool> broken_{false};  // raised by any queue (before queues_: they refer to it)
  std::vector<std::unique_ptr<BlkfrontQueue>> queues_;
  std::mutex rmw_;  // serialises read-modify-write of partial sectors
  std::vector<std::thread> completers_;  // completion_threads: one per queue
};

}  // namespace xpv::frontends
