// BlkfrontQueue — one blkif ring of a Blkfront (blkif.h "Multiple hardware queues/rings"): its
// shared ring pages in the domain's memory, its event channel, its slots with their pre-granted
// data pages, and the one-request-at-a-time-per-slot protocol on it:
//
//   caller thread: take a free slot → copy data into its granted pages → request → push
//                  (notify the backend if the ring says so) → spin for a while, popping
//                  responses itself (AdaptivePoll; rsp_event stays unarmed, so a fast backend
//                  sends no notification) → else arm rsp_event and sleep on the slot's own
//                  condition variable → copy read data out → free the slot
//   event handler: pop responses → validate id → complete the slot (waking only its caller) →
//                  final check → repeat
//
// Asynchronous use (start()/complete()), for a caller that keeps many requests in flight on one
// ring from one thread, as a guest's blk-mq hardware queue does: start() takes a slot without
// waiting (-EBUSY when every slot is in flight), copies the data in and pushes the request;
// complete() runs the callbacks of answered requests on the calling thread — it pops responses
// itself while it spins and sleeps (rsp_event armed) only when the adaptive window ran out. Sync
// and async requests share the slots and the ring.
//
// The data pages of each slot are granted to the backend once, at construction (the backend
// maps and unmaps them per request; what Linux calls persistent grants is only the frontend
// half). A response that names no outstanding request, or a bad ring index, breaks the queue and
// raises the device's `broken` flag (shared by every queue of one Blkfront): every later request
// on any queue returns -EIO (DESIGN.md §5 — the guest side distrusts the backend too).
//
// Threading: transfer()/simple() from any thread (the Blkfront's callers); on_event() on the
// GuestEvents dispatcher thread. One mutex (lock_) guards the ring, the slots and the stats; it
// is a leaf lock (nothing else is taken while it is held).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <functional>
#include <optional>
#include <vector>

#include "xpv/adaptive_poll.h"
#include "xpv/domain/domain.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/ring/blkif.h"

namespace xpv::frontends {

struct BlkfrontQueueConfig {
  std::uint32_t ring_page_order = 0;     // 2^order ring pages (0..4)
  std::uint32_t indirect_segments = 0;   // 0: direct requests only (11 segments)
  domain::DomId backend = 0;
  // Longest busy-wait of a caller for its response before it sleeps (adaptive, shared by the
  // queue's callers; xpv/adaptive_poll.h). While callers spin, rsp_event is left unarmed, so the
  // backend sends no notification and the event thread is not woken. 0: always sleep.
  std::chrono::nanoseconds poll_max{100000};
};

class BlkfrontQueue {
 public:
  // Allocates and grants the ring and data pages in `dom`, allocates the event channel (unbound
  // for the backend) and registers its handler with `events`. `broken` is the device's flag.
  // Throws if the domain has no room (whatever was allocated is given back first).
  BlkfrontQueue(domain::Domain& dom, GuestEvents& events, BlkfrontQueueConfig config,
                std::atomic<bool>& broken);
  ~BlkfrontQueue();
  BlkfrontQueue(const BlkfrontQueue&) = delete;
  BlkfrontQueue& operator=(const BlkfrontQueue&) = delete;

  const std::vector<gnttab::GrantRef>& ring_refs() const noexcept { return ring_refs_; }
  domain::Port event_channel() const noexcept { return port_; }

  // Most 512-byte sectors one transfer() carries (its segments × 8).
  std::uint64_t max_sectors() const noexcept;
  // One read or write request of 1..max_sectors() whole sectors from/into `buf` (any thread;
  // blocks until answered). Returns 0, -EIO (error response or broken) or -EOPNOTSUPP.
  int transfer(bool write, std::uint64_t sector, std::uint8_t* buf, std::uint64_t nsect);
  // One request without data (flush, discard): `req`'s id is set here (id sits at offset 8 in
  // every blkif request layout). Same results.
  int simple(ring::BlkifRequest req);

  // What an asynchronous request's callback gets: 0, -EIO (error response or broken) or -EOPNOTSUPP.
  using Done = std::function<void(int result)>;
  // Starts one read or write of 1..max_sectors() whole sectors from/into `buf`, which must stay
  // valid until `done` ran (on a thread calling complete()). Returns 0 (started), -EINVAL (size),
  // -EIO (broken; `done` will not run) or -EBUSY (every slot is in flight: complete() first).
  int start(bool write, std::uint64_t sector, std::uint8_t* buf, std::uint64_t nsect, Done done);
  // Runs the callbacks of finished asynchronous requests on the calling thread, waiting until at
  // least `min` ran or none is left in flight. A broken ring finishes each with -EIO. Returns how
  // many ran. One thread at a time per queue.
  unsigned complete(unsigned min);
  unsigned in_flight() const;  // asynchronous requests started and not yet completed
  // A completion thread's body (Blkfront's completion_threads): complete() while requests are in
  // flight, asleep while none is, until stop_completions(). Then no other thread calls complete().
  void run_completions();
  // Another thread polls (poll()) for a while: run_completions() does not wake up for new
  // requests meanwhile. polling(false) hands what is in flight back to it. Counted.
  void polling(bool on);
  // Runs the callbacks of asynchronous requests answered by now on the calling thread (popping
  // responses first), without waiting; returns how many ran. Any thread.
  unsigned poll();
  void stop_completions();  // run_completions() and a complete() waiting in it return

  struct Stats {
    std::uint64_t requests = 0, notifications = 0, responses = 0;
    std::uint64_t polled = 0;  // answers a caller found while spinning (no notification, no sleep)
    std::uint64_t async_requests = 0;  // of `requests`, those start()ed
  };
  Stats stats() const;

 private:
  struct Slot {
    std::vector<std::uint64_t> gfns;               // data pages
    std::vector<gnttab::GrantRef> refs;            // their grants (rw to the backend)
    std::vector<std::uint64_t> indirect_gfns;      // pages of indirect descriptors
    std::vector<gnttab::GrantRef> indirect_refs;
    bool busy = false, done = false;
    bool sleeping = false;  // its caller waits on wake_[id]
    std::int16_t status = 0;
    // Asynchronous requests (start()): the callback and where read data goes.
    bool async = false;
    Done on_done;
    std::uint8_t* buf = nullptr;
    std::uint64_t bytes = 0;
    bool write = false;
  };

  std::uint32_t max_segments() const noexcept;
  void release() noexcept;  // gives back whatever the constructor got (also a partial set)
  std::uint32_t take_slot();
  void free_slot(std::uint32_t id);
  int submit_and_wait(const ring::BlkifRequest& req, std::uint32_t slot);
  // The request for slot `id` (its pages filled for a write): direct or indirect.
  ring::BlkifRequest prepare(std::uint32_t id, bool write, std::uint64_t sector, const std::uint8_t* buf,
                             std::uint64_t nsect);
  void copy_out(std::uint32_t id, std::uint8_t* buf, std::uint64_t bytes);  // read data → buf
  // lock_ held: puts `req` on the ring and notifies if the ring says so (false: broke).
  bool produce_locked(const ring::BlkifRequest& req);
  static int result_of(std::int16_t status);
  void break_queue();  // lock_ held: this ring is unusable, and so is the device
  void on_event();
  // lock_ held: pops every response there is and completes its slot (false: nothing popped).
  // Does not re-arm rsp_event: see arm_locked().
  bool reap_locked();
  // lock_ held: makes sure the backend will notify the next response (a sleeper needs it).
  void arm_locked();
  // lock_ held: claims every answered asynchronous slot (every one, if the ring broke).
  void claim_locked(std::vector<std::uint32_t>& finished);
  // Copies read data out, frees the slots and runs the callbacks of claimed slots (no lock).
  void finish(const std::vector<std::uint32_t>& finished);

  domain::Domain& dom_;
  GuestEvents& events_;
  BlkfrontQueueConfig config_;
  std::atomic<bool>& broken_;
  std::uint64_t ring_gfn_ = 0;  // 0: not allocated
  std::vector<gnttab::GrantRef> ring_refs_;
  std::optional<domain::Port> port_alloc_;
  domain::Port port_ = 0;

  mutable std::mutex lock_;             // ring, slots, stats
  std::condition_variable slot_free_;   // a slot was returned
  std::vector<std::condition_variable> wake_;  // per slot: it completed (or the ring broke)
  std::optional<ring::BlkifFrontRing> ring_;
  std::vector<Slot> slots_;
  AdaptivePoll poll_;     // under lock_; the window callers spin for
  unsigned sleepers_ = 0;  // callers asleep on wake_ or async_wake_ (each armed rsp_event first)
  std::condition_variable async_wake_;  // an asynchronous request was answered (or the ring broke)
  unsigned async_in_flight_ = 0, async_answered_ = 0;
  bool async_waiting_ = false;  // complete() sleeps on async_wake_
  bool idle_waiting_ = false;   // run_completions() waits on async_wake_ for work
  unsigned pollers_ = 0;        // polling(true) not yet undone
  bool stopping_ = false;       // stop_completions() was called
  bool dead_ = false;  // this ring broke (waiters on it give up; other rings finish what is in flight)
  Stats stats_;
};

}  // namespace xpv::frontends
