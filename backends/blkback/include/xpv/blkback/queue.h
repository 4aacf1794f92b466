// BlkifQueue — one blkif ring of one virtual disk, served by one data-plane thread
// (DESIGN.md §3): drain the ring, validate each request (a copy), map its grants, queue one
// io_uring operation per request, submit the whole batch with one syscall, reap completions,
// unmap, push responses and notify the frontend once per batch, and only when the ring's event
// index asks for it.
//
//   guest ring ──pop_request──► validate ──map grants──► IoRing.readv/writev/fsync/punch
//        ▲                                                           │
//        └───push_responses (notify?)◄──unmap◄──response◄──reap──────┘
//
// Guest faults, in DESIGN.md §5's tiers:
//   malformed request (bad segment, range past the disk, write to a read-only disk, bad grant,
//   unknown op)            → an error response (BLKIF_RSP_ERROR / EOPNOTSUPP) + rate-limited log
//   protocol violation (ring producer index out of range)
//                          → the queue is disabled (sticky); in-flight I/O still completes into
//                            our own bookkeeping, nothing more is read from the ring
// An acknowledged write has completed: a response is produced only from its completion.
//
// Responses go out strictly in request order (what makes a backend restart safe): a request
// that completes before an earlier one of the same ring is held until every earlier request is
// answered. So at any time, every ring index in [rsp_prod, req_prod) is a request that has not
// been answered, and a backend that dies leaves the ring in a state a new one can resume from:
// BackRing::attach() starts at the shared rsp_prod and the new queue redoes those requests
// (read, write, flush and discard are idempotent; nothing acknowledged is lost because nothing
// is acknowledged before it completed). With a ShadowRing the requests are also copied to a
// file as they are consumed, which closes the one window where a slot holds a response that is
// not yet published (shadow_ring.h). What holding early completions costs depends on how much
// the disk reorders them (counters().held); backends/README.md has the measurements.
//
// Threading: everything runs on the queue's thread (run()); stop() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "xpv/adaptive_poll.h"
#include "xpv/kick_throttle.h"
#include "xpv/blkback/disk.h"
#include "xpv/blkback/io_ring.h"
#include "xpv/blkback/shadow_ring.h"
#include "xpv/domain/dom0_port.h"
#include "xpv/domain/event_fd.h"
#include "xpv/gnttab/mapper.h"
#include "xpv/ring/blkif.h"

namespace xpv::blkback {

struct QueueConfig {
  // What this backend advertises as feature-max-indirect-segments (0: no indirect requests; at
  // most IOV_MAX, 1024: one request is one readv/writev — the constructor refuses more).
  std::uint32_t max_indirect_segments = 256;
  bool flush = true;    // feature-flush-cache
  bool discard = true;  // feature-discard (also needs a disk that can punch holes)
  // Longest busy-wait for the next request or completion before the thread sleeps (adaptive,
  // see xpv/adaptive_poll.h); while it spins, the frontend is asked for no notifications.
  // 0: never spin (every request is kicked, every completion wakes the thread). 100 µs, not
  // QEMU's 32: it must outlast a disk round trip to pay (backends/README.md).
  std::chrono::nanoseconds poll_max{100000};
};

// Per-queue counters (xpv top shows them). Written only by the queue thread; read racily.
// Longer than this, a gap before a request is the guest's own business (QueueCounters).
inline constexpr std::uint64_t kLongIdleGapUs = 10'000;

struct QueueCounters {
  std::atomic<std::uint64_t> requests{0}, reads{0}, writes{0}, flushes{0}, discards{0};
  std::atomic<std::uint64_t> sectors_read{0}, sectors_written{0};
  std::atomic<std::uint64_t> errors{0}, unsupported{0};
  std::atomic<std::uint64_t> batches{0}, notifications{0}, wakeups{0};
  // Kicks that found the ring as it was (after a sleep), and how often the port was muted for a
  // streak of them (kick_throttle.h: a frontend kicking with nothing new).
  std::atomic<std::uint64_t> spurious_kicks{0}, kick_mutes{0};
  // Completions that had to wait for an earlier request before their response could go out.
  std::atomic<std::uint64_t> held{0};
  // Requests taken from the shadow file rather than the ring (a restart's redo).
  std::atomic<std::uint64_t> redone_from_shadow{0};
  // Shadow copies not used because the slot beyond its response's bytes held another request:
  // the shadow was of a ring that is gone.
  std::atomic<std::uint64_t> shadow_mismatches{0};
  // Waits that ended while spinning (no notification, no sleep) / that had to sleep after all.
  std::atomic<std::uint64_t> poll_hits{0}, poll_misses{0};
  // Where a request's time goes, as this thread sees it (steady clock, microseconds):
  // answered / answered_us: responses produced, and their summed time since the request was taken
  // from the ring (mapping, the I/O, waiting for an earlier request's answer);
  // idle_gaps / idle_gap_us: requests taken while nothing was outstanding and nothing else was
  // on the ring, and the summed time since the pass that had answered everything began pushing —
  // the push and notification, the guest's turn, its notification and this thread's wake-up.
  // A gap of kLongIdleGapUs or more (the guest doing something else: a journal commit, a phase
  // without disk I/O, idling) is only counted, in long_idle_gaps, so that the average is the
  // round trip of a guest that waits for its disk. At queue depth 1 the two averages add up to it.
  std::atomic<std::uint64_t> answered{0}, answered_us{0}, idle_gaps{0}, idle_gap_us{0}, long_idle_gaps{0};
  // When stop() woke the thread from its sleep: its I/Os in flight, and how many of them had
  // completed into the CQ without waking it (more than a completion or two that came with the
  // stop: a completion slept through, and a guest left waiting for its answer).
  std::atomic<std::uint64_t> stop_woke{0}, stop_in_flight{0}, stop_completed_unreaped{0};
};

class BlkifQueue {
 public:
  // `mapper` maps the frontend's grants (it belongs to this queue's thread from now on);
  // `ring` is attached to the mapped shared ring page(s); `evtchn` is the interdomain channel.
  // `shadow` (optional): the restart journal of consumed requests (shadow_ring.h); its entries
  // must equal the ring's size.
  BlkifQueue(std::string name, const Disk& disk, gnttab::GrantMapper& mapper,
             ring::BlkifBackRing ring, std::unique_ptr<domain::EventChannel> evtchn,
             QueueConfig config, ShadowRing* shadow = nullptr);
  ~BlkifQueue();
  BlkifQueue(const BlkifQueue&) = delete;
  BlkifQueue& operator=(const BlkifQueue&) = delete;

  // The data-plane loop: returns after stop() or when the queue was disabled, once every I/O in
  // flight has completed and been answered (or, if disabled, dropped). After stop() nothing more
  // is taken from the ring: what the frontend queued meanwhile stays there, unanswered, for the
  // next backend (a restart) or is never looked at (a disconnect).
  void run() noexcept;
  void stop() noexcept;

  bool disabled() const noexcept { return disabled_.load(std::memory_order_acquire); }
  const QueueCounters& counters() const noexcept { return counters_; }
  const std::string& name() const noexcept { return name_; }

  // One pass without blocking (tests drive the queue with it): reap, drain, submit, respond.
  // Returns false once the queue is disabled.
  bool poll_once() noexcept;
  unsigned in_flight() const noexcept { return io_.in_flight(); }
  // Requests taken from the ring and not yet answered (in the kernel, or completed and held).
  std::uint32_t unanswered() const noexcept { return ring_.unanswered(); }
  // How the frontend left the ring (BackRing::end_state): for the log line when the queue stops;
  // read it only when run() has returned.
  ring::BlkifBackRing::EndState ring_end_state() const noexcept { return ring_.end_state(); }

 private:
  struct Pending;
  enum class Admit { queued, answered, ring_busy };

  // `arm`: end by re-arming req_event (RING_FINAL_CHECK_FOR_REQUESTS); run() leaves it off
  // while it polls the ring itself and arms only before it sleeps.
  void drain_ring(bool arm) noexcept;
  bool step(bool arm) noexcept;
  bool work_ready() noexcept;
  Admit admit(const ring::BlkifRequest& req, std::uint32_t slot) noexcept;
  Admit admit_rw(const ring::BlkifRequest& req, Pending& p) noexcept;
  Admit admit_indirect(const ring::BlkifRequest& req, Pending& p) noexcept;
  Admit admit_discard(const ring::BlkifRequest& req, Pending& p) noexcept;
  bool map_segments(Pending& p, const ring::BlkifRequestSegment* segs, unsigned n, bool write) noexcept;
  void complete(std::uint32_t slot, int res) noexcept;
  void finish(Pending& p, std::int16_t status) noexcept;
  void retire() noexcept;
  // False when the ring refused it (the queue is disabled then).
  bool respond(std::uint64_t id, std::uint8_t op, std::int16_t status) noexcept;
  void release(Pending& p) noexcept;
  void push_and_notify() noexcept;
  void disable(const char* why) noexcept;
  template <class... Args>
  void guest_error(const char* fmt, Args&&... args) noexcept;
  // A failed or short I/O: logged as an error, rate-limited as guest_error is — the guest picks
  // the requests (on a disk with 4 KiB logical sectors every 512-byte-aligned one fails).
  template <class... Args>
  void io_error(const char* fmt, Args&&... args) noexcept;

  std::string name_;
  const Disk& disk_;
  gnttab::GrantMapper& mapper_;
  ring::BlkifBackRing ring_;
  std::unique_ptr<domain::EventChannel> evtchn_;
  QueueConfig config_;
  IoRing io_;
  domain::EventFd stop_;
  ShadowRing* shadow_ = nullptr;
  // One per ring slot, indexed by ring index mod size: the ring itself bounds what is
  // outstanding (req_prod - rsp_prod <= size), and responses retire them in index order.
  std::vector<Pending> pending_;
  bool respond_pending_ = false;
  // The frontend waits for responses already published (a backend killed between its push and
  // its notification; BackRing::response_event_passed): notified once, at the first step.
  bool notify_owed_ = false;
  bool draining_ = true;  // false once stopping: take nothing more from the ring
  std::atomic<bool> disabled_{false};
  std::atomic<bool> stop_requested_{false};
  QueueCounters counters_;
  AdaptivePoll poll_;
  KickThrottle kicks_;
  std::uint64_t guest_errors_logged_ = 0, io_errors_logged_ = 0;
  std::uint64_t idle_since_us_ = 0;  // when a push left nothing outstanding; 0: something is
};

}  // namespace xpv::blkback
