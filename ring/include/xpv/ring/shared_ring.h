// Xen shared rings (the protocol of xen/include/public/io/ring.h), re-implemented in C++.
//
// Layout of a shared ring (one page, or 2^order contiguous pages for multi-page rings):
//
//   0x00  req_prod   written by the front end (requests produced)
//   0x04  req_event  written by the back end ("notify me when req_prod passes this")
//   0x08  rsp_prod   written by the back end (responses produced)
//   0x0c  rsp_event  written by the front end
//   0x10  pvt[4]     netif smartpoll / tapif byte; unused here, zeroed by init
//   0x14  pad[44]    zeroed by init
//   0x40  ring[N]    entries; each is union { Req req; Rsp rsp; }
//
// N is the largest power of two of entries that fits in the bytes given (ring.h's __RING_SIZE).
// Indexes are free-running 32-bit counters; an index addresses slot (idx & (N - 1)). A request
// slot is reused for its response: the back end writes the response of the request it consumed
// into the same slot position, so at most N requests are ever outstanding.
//
// The two sides (each object is used by ONE thread; the peer is another thread, process or guest):
//
//   FrontRing: produce_request → push_requests (→ notify?) ... pop_response / final_check
//   BackRing:  pop_request (a COPY) ... produce_response → push_responses (→ notify?)
//
// Memory ordering (what ring.h's xen_wmb/xen_rmb/xen_mb become here; every access to the four
// shared indexes goes through std::atomic_ref<uint32_t>):
//  - push: the new producer index is stored with RELEASE, so the entries written before it are
//    visible to a consumer that ACQUIRE-loads the index (ring.h's wmb before the store).
//  - consume: the peer's producer index is loaded ONCE with ACQUIRE, validated, remembered, and only
//    then are entries up to it read (ring.h's rmb after the load). An entry is copied out with
//    memcpy followed by a compiler barrier, so a value that was checked cannot be re-read from
//    shared memory later (RING_COPY_REQUEST's volatile copy; netback's reason for it).
//  - notify decision and final check are the Dekker pattern: "store my index; seq_cst fence; load
//    the peer's index" on both sides (ring.h's mb). With both fences seq_cst at least one side sees
//    the other's store, so either the producer notifies or the consumer sees the new work: no lost
//    wake-up.
//
// Bad input: every index the peer writes is validated before it is used (ring.h's
// RING_REQUEST_PROD_OVERFLOW / RING_RESPONSE_PROD_OVERFLOW, plus "never moves backwards"). A bad
// index is RingError::bad_producer_index and is sticky: the object refuses all later work, since
// DESIGN.md §5 disables a device after a protocol violation. No entry is read for a bad index.
//
// Everything here is noexcept and allocation-free: it runs on data-plane threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include "xpv/expected.h"
#include "xpv/ring/ring_error.h"

namespace xpv::ring {

using RingIdx = std::uint32_t;  // ring.h: typedef unsigned int RING_IDX

inline constexpr std::size_t kXenPageShift = 12;  // ring protocols always use 4 KiB pages
inline constexpr std::size_t kXenPageSize = std::size_t{1} << kXenPageShift;
// Largest ring this code makes: prod - cons must stay unambiguous in 32-bit arithmetic.
inline constexpr RingIdx kMaxRingEntries = RingIdx{1} << 31;

// The 64-byte header at the start of every shared ring (ring.h: the first fields of
// struct __name##_sring).
struct SharedRingHeader {
  RingIdx req_prod;       // 0x00: front end's producer index
  RingIdx req_event;      // 0x04: back end asks to be notified when req_prod passes it
  RingIdx rsp_prod;       // 0x08: back end's producer index
  RingIdx rsp_event;      // 0x0c: front end asks to be notified when rsp_prod passes it
  std::uint8_t pvt[4];    // 0x10: union pvt (netif.smartpoll_active, tapif_user.msg, pvt_pad)
  std::uint8_t pad[44];   // 0x14: __pad
};
static_assert(std::is_standard_layout_v<SharedRingHeader> && sizeof(SharedRingHeader) == 64);
static_assert(offsetof(SharedRingHeader, req_prod) == 0x00);
static_assert(offsetof(SharedRingHeader, req_event) == 0x04);
static_assert(offsetof(SharedRingHeader, rsp_prod) == 0x08);
static_assert(offsetof(SharedRingHeader, rsp_event) == 0x0c);
static_assert(offsetof(SharedRingHeader, pvt) == 0x10);
static_assert(offsetof(SharedRingHeader, pad) == 0x14);
static_assert(std::atomic_ref<RingIdx>::is_always_lock_free);

inline constexpr std::size_t kRingEntriesOffset = sizeof(SharedRingHeader);

// One ring slot (ring.h: union __name##_sring_entry).
template <class Req, class Rsp>
union SringEntry {
  Req req;
  Rsp rsp;
};

// ---- constexpr index and size math --------------------------------------------------------------

// Largest power of two <= x, capped at kMaxRingEntries; 0 for 0 (ring.h's __RD32).
constexpr RingIdx round_down_pow2(std::uint64_t x) noexcept {
  if (x == 0) return 0;
  return static_cast<RingIdx>(std::min<std::uint64_t>(std::bit_floor(x), kMaxRingEntries));
}

// Entries of size entry_size that a ring of `bytes` bytes holds; 0 when not even one fits.
constexpr RingIdx ring_entries(std::size_t bytes, std::size_t entry_size) noexcept {
  if (entry_size == 0 || bytes < kRingEntriesOffset + entry_size) return 0;
  return round_down_pow2((bytes - kRingEntriesOffset) / entry_size);
}

template <class Req, class Rsp>
constexpr RingIdx ring_entries(std::size_t bytes) noexcept {
  return ring_entries(bytes, sizeof(SringEntry<Req, Rsp>));
}

// Bytes of a ring of 2^order pages (XEN_FLEX_RING_SIZE-style multi-page rings: blkif
// ring-page-order, netif multi-page rings).
constexpr std::size_t ring_bytes_for_order(unsigned order) noexcept { return kXenPageSize << order; }

// Bytes actually used by a ring of n entries (header + entries); <= the span it was made from.
constexpr std::size_t ring_used_bytes(RingIdx n, std::size_t entry_size) noexcept {
  return kRingEntriesOffset + std::size_t{n} * entry_size;
}

constexpr RingIdx ring_slot(RingIdx idx, RingIdx size) noexcept { return idx & (size - 1); }

// The event-index rule (ring.h, RING_PUSH_*_AND_CHECK_NOTIFY): the peer asked to be notified once
// the producer index passes `event`; notify iff event lies in (old_prod, new_prod], in modular
// arithmetic. A push of nothing (old == new) never notifies.
constexpr bool notify_required(RingIdx old_prod, RingIdx new_prod, RingIdx event) noexcept {
  return static_cast<RingIdx>(new_prod - event) < static_cast<RingIdx>(new_prod - old_prod);
}

static_assert(round_down_pow2(0) == 0 && round_down_pow2(1) == 1 && round_down_pow2(63) == 32);
static_assert(round_down_pow2(std::uint64_t{1} << 40) == kMaxRingEntries);
static_assert(ring_slot(0xffffffffu, 32) == 31 && ring_slot(0x100000000ull & 0xffffffffu, 32) == 0);
static_assert(ring_entries(64, 8) == 0 && ring_entries(72, 8) == 1 && ring_entries(4096, 0) == 0);
static_assert(ring_bytes_for_order(0) == 4096 && ring_bytes_for_order(8) == 1024 * 1024);
// Event rule: consumer waiting at event 1 sees the push 0 -> 1; one at 5 does not see 0 -> 4.
static_assert(notify_required(0, 1, 1) && notify_required(0, 4, 1) && !notify_required(0, 4, 5));
static_assert(notify_required(0, 5, 5) && !notify_required(3, 3, 3));
// Across the 2^32 wrap: event 0 lies in (0xfffffffe, 2].
static_assert(notify_required(0xfffffffeu, 2, 0) && !notify_required(0xfffffffeu, 2, 3));
// An event index already passed (stale) does not notify again.
static_assert(!notify_required(10, 12, 9));

namespace detail {

// Alignment a ring span must have: the header's atomically accessed indexes and the entries.
template <class Entry>
inline constexpr std::size_t kRingAlignment =
    std::max({alignof(SharedRingHeader), alignof(Entry), std::atomic_ref<RingIdx>::required_alignment});

inline std::atomic_ref<RingIdx> index_at(std::uint8_t* base, std::size_t offset) noexcept {
  return std::atomic_ref<RingIdx>(*reinterpret_cast<RingIdx*>(base + offset));
}

// Copy a T out of shared memory. The compiler barrier after the memcpy pins the copy: without it
// the optimiser may drop the local and re-load fields from shared memory at each later use (a
// double fetch: the peer could change a value between its check and its use). g++ implements
// atomic_signal_fence(seq_cst) as a full compiler memory barrier (no instruction is emitted).
template <class T>
inline T copy_out(const std::uint8_t* src) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  T out;
  std::memcpy(&out, src, sizeof(T));
  std::atomic_signal_fence(std::memory_order_seq_cst);
  return out;
}

template <class T>
inline void copy_in(std::uint8_t* dst, const T& v) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  std::memcpy(dst, &v, sizeof(T));
}

// The consumer half of RING_FINAL_CHECK_FOR_*: "notify me once the producer passes `want`", then
// a seq_cst fence so the caller's re-read of the producer index is ordered after the store (mb).
//
// If the event index already holds `want`, it was stored by an earlier arm_event (followed by its
// fence and a re-read that found nothing) or by init on the producer's side; either way a producer
// push after that point sees it: by the fence rule, either the producer's fence comes after ours
// and its load of the event index sees `want`, or it comes before and our earlier re-read would
// have seen its index. So re-checking needs no new store and no new fence. This matters when a
// consumer polls: rewriting the event index on every idle poll would bounce the header's cache
// line (which the producer writes on every push) for nothing. A peer that overwrites our event
// index only changes whether IT notifies US.
inline void arm_event(std::atomic_ref<RingIdx> event, RingIdx want) noexcept {
  if (event.load(std::memory_order_relaxed) == want) return;
  event.store(want, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // event store before the re-read (mb)
}

// What FrontRing and BackRing share: the bounded view of the shared memory and its geometry.
template <class Req, class Rsp>
class RingMemory {
 public:
  using Entry = SringEntry<Req, Rsp>;
  static_assert(std::is_trivially_copyable_v<Req> && std::is_standard_layout_v<Req>);
  static_assert(std::is_trivially_copyable_v<Rsp> && std::is_standard_layout_v<Rsp>);
  static_assert(alignof(Entry) <= kRingEntriesOffset, "entries must start right after the header");
  static constexpr std::size_t kAlignment = kRingAlignment<Entry>;

  static Expected<RingMemory, RingError> make(std::span<std::uint8_t> shared) noexcept {
    const RingIdx n = ring_entries(shared.size(), sizeof(Entry));
    if (n == 0) return fail(RingError::too_small);
    if (reinterpret_cast<std::uintptr_t>(shared.data()) % kAlignment != 0) {
      return fail(RingError::misaligned);
    }
    return RingMemory(shared.first(ring_used_bytes(n, sizeof(Entry))), n);
  }

  RingIdx size() const noexcept { return size_; }
  std::span<std::uint8_t> bytes() const noexcept { return shared_; }

  std::atomic_ref<RingIdx> req_prod() const noexcept {
    return index_at(shared_.data(), offsetof(SharedRingHeader, req_prod));
  }
  std::atomic_ref<RingIdx> req_event() const noexcept {
    return index_at(shared_.data(), offsetof(SharedRingHeader, req_event));
  }
  std::atomic_ref<RingIdx> rsp_prod() const noexcept {
    return index_at(shared_.data(), offsetof(SharedRingHeader, rsp_prod));
  }
  std::atomic_ref<RingIdx> rsp_event() const noexcept {
    return index_at(shared_.data(), offsetof(SharedRingHeader, rsp_event));
  }

  // Start of the slot for idx; entry_size bytes are valid there (bounded by construction).
  std::uint8_t* slot(RingIdx idx) const noexcept {
    return shared_.data() + kRingEntriesOffset + std::size_t{ring_slot(idx, size_)} * sizeof(Entry);
  }

  // SHARED_RING_INIT at index `start` (start 0 is exactly ring.h's; other starts let tests and
  // reconnects begin anywhere in the 32-bit index space).
  void init_header(RingIdx start) const noexcept {
    std::memset(shared_.data() + offsetof(SharedRingHeader, pvt), 0,
                sizeof(SharedRingHeader::pvt) + sizeof(SharedRingHeader::pad));
    req_event().store(start + 1, std::memory_order_relaxed);
    rsp_event().store(start + 1, std::memory_order_relaxed);
    rsp_prod().store(start, std::memory_order_relaxed);
    // Release: a back end that acquires req_prod sees a fully initialised header.
    req_prod().store(start, std::memory_order_release);
  }

  // The producer half of RING_PUSH_*_AND_CHECK_NOTIFY. `prod`/`event` are this side's producer
  // index and the peer's event index; `old_prod` is what we last published.
  static bool publish(std::atomic_ref<RingIdx> prod, std::atomic_ref<RingIdx> event, RingIdx old_prod,
                      RingIdx new_prod) noexcept {
    prod.store(new_prod, std::memory_order_release);       // entries before the index (wmb)
    std::atomic_thread_fence(std::memory_order_seq_cst);   // index before reading event (mb)
    return notify_required(old_prod, new_prod, event.load(std::memory_order_acquire));
  }

 private:
  RingMemory(std::span<std::uint8_t> shared, RingIdx n) noexcept : shared_(shared), size_(n) {}

  std::span<std::uint8_t> shared_;
  RingIdx size_ = 0;
};

}  // namespace detail

// ---- front end ----------------------------------------------------------------------------------

// The front end's (guest driver's) side: produces requests, consumes responses.
// One thread at a time (the frontend's queue thread); not copyable (two copies would both own the
// private indexes).
template <class Req, class Rsp>
class FrontRing {
 public:
  using Request = Req;
  using Response = Rsp;
  using Entry = SringEntry<Req, Rsp>;
  static constexpr std::size_t kAlignment = detail::RingMemory<Req, Rsp>::kAlignment;

  // SHARED_RING_INIT + FRONT_RING_INIT: initialise the shared header (both producer indexes =
  // start, both event indexes = start + 1, padding zeroed) and attach to it.
  static Expected<FrontRing, RingError> init(std::span<std::uint8_t> shared,
                                             RingIdx start = 0) noexcept {
    auto mem = detail::RingMemory<Req, Rsp>::make(shared);
    if (!mem) return fail(mem.error());
    mem->init_header(start);
    return FrontRing(*mem, start);
  }

  // FRONT_RING_ATTACH: attach to a ring whose header is already set up, resuming at `start` (the
  // shared req_prod == rsp_prod == start, nothing outstanding). The header is not touched.
  static Expected<FrontRing, RingError> attach(std::span<std::uint8_t> shared, RingIdx start) noexcept {
    auto mem = detail::RingMemory<Req, Rsp>::make(shared);
    if (!mem) return fail(mem.error());
    return FrontRing(*mem, start);
  }

  FrontRing(FrontRing&&) noexcept = default;
  FrontRing& operator=(FrontRing&&) noexcept = default;
  FrontRing(const FrontRing&) = delete;
  FrontRing& operator=(const FrontRing&) = delete;

  RingIdx size() const noexcept { return mem_.size(); }
  std::span<std::uint8_t> bytes() const noexcept { return mem_.bytes(); }
  RingIdx req_prod_pvt() const noexcept { return req_prod_pvt_; }
  RingIdx rsp_cons() const noexcept { return rsp_cons_; }
  // Requests produced (pushed or not) and not yet answered by a consumed response.
  RingIdx outstanding() const noexcept { return req_prod_pvt_ - rsp_cons_; }
  // RING_FREE_REQUESTS / RING_FULL.
  RingIdx free_requests() const noexcept { return size() - outstanding(); }
  bool full() const noexcept { return free_requests() == 0; }
  // The sticky protocol error, if any (then every later call fails with it).
  bool broken() const noexcept { return broken_; }

  // Copy `req` into the next free slot (not yet visible to the back end: see push_requests).
  Expected<void, RingError> produce_request(const Req& req) noexcept {
    if (broken_) return fail(error_);
    if (full()) return fail(RingError::full);
    detail::copy_in(mem_.slot(req_prod_pvt_), req);
    ++req_prod_pvt_;
    return {};
  }

  // RING_PUSH_REQUESTS_AND_CHECK_NOTIFY: publish every produced request; true when the back end
  // must be notified (its req_event lies in the pushed range). False when broken.
  bool push_requests() noexcept {
    if (broken_) return false;
    const RingIdx old_prod = req_prod_pushed_;
    req_prod_pushed_ = req_prod_pvt_;
    return detail::RingMemory<Req, Rsp>::publish(mem_.req_prod(), mem_.req_event(), old_prod,
                                                 req_prod_pvt_);
  }

  // Responses available now (rsp_prod read once, acquire, validated).
  Expected<RingIdx, RingError> unconsumed_responses() noexcept { return refresh(); }

  // RING_COPY_RESPONSE at rsp_cons, then rsp_cons++. RingError::empty when none is available.
  Expected<Rsp, RingError> pop_response() noexcept {
    if (broken_) return fail(error_);
    if (rsp_cons_ == rsp_prod_seen_) {
      auto n = refresh();
      if (!n) return fail(n.error());
      if (*n == 0) return fail(RingError::empty);
    }
    Rsp rsp = detail::copy_out<Rsp>(mem_.slot(rsp_cons_));
    ++rsp_cons_;
    return rsp;
  }

  // RING_FINAL_CHECK_FOR_RESPONSES: call before sleeping. If nothing is pending, ask to be
  // notified at the next response (rsp_event = rsp_cons + 1) and look once more; false means it
  // is safe to sleep until the back end's notification.
  Expected<bool, RingError> final_check_for_responses() noexcept {
    auto n = refresh();
    if (!n) return fail(n.error());
    if (*n != 0) return true;
    detail::arm_event(mem_.rsp_event(), rsp_cons_ + 1);
    n = refresh();
    if (!n) return fail(n.error());
    return *n != 0;
  }

 private:
  FrontRing(detail::RingMemory<Req, Rsp> mem, RingIdx start) noexcept
      : mem_(mem), req_prod_pvt_(start), req_prod_pushed_(start), rsp_cons_(start),
        rsp_prod_seen_(start) {}

  // The one read of the back end's rsp_prod. It may only answer requests we published, and never
  // moves backwards: rsp_prod_seen - rsp_cons <= rsp_prod - rsp_cons <= pushed - rsp_cons.
  Expected<RingIdx, RingError> refresh() noexcept {
    if (broken_) return fail(error_);
    const RingIdx prod = mem_.rsp_prod().load(std::memory_order_acquire);
    const RingIdx avail = prod - rsp_cons_;
    if (avail > static_cast<RingIdx>(req_prod_pushed_ - rsp_cons_) ||
        avail < static_cast<RingIdx>(rsp_prod_seen_ - rsp_cons_)) {
      broken_ = true;
      error_ = RingError::bad_producer_index;
      return fail(error_);
    }
    rsp_prod_seen_ = prod;
    return avail;
  }

  detail::RingMemory<Req, Rsp> mem_;
  RingIdx req_prod_pvt_;     // next request slot to fill (private)
  RingIdx req_prod_pushed_;  // last req_prod we published
  RingIdx rsp_cons_;         // next response to consume
  RingIdx rsp_prod_seen_;    // last validated rsp_prod
  bool broken_ = false;
  RingError error_ = RingError::bad_producer_index;
};

// ---- back end -----------------------------------------------------------------------------------

// The back end's (xpv-blkback/netback data-plane thread's) side: consumes requests (as copies),
// produces responses. One thread at a time; not copyable.
template <class Req, class Rsp>
class BackRing {
 public:
  using Request = Req;
  using Response = Rsp;
  using Entry = SringEntry<Req, Rsp>;
  static constexpr std::size_t kAlignment = detail::RingMemory<Req, Rsp>::kAlignment;

  // BACK_RING_ATTACH at the shared rsp_prod, as a (re)connecting back end does: nothing the front
  // end published after rsp_prod has been answered yet. The front end's req_prod is validated
  // right away (req_prod - rsp_prod <= size), so a bad page is refused here.
  static Expected<BackRing, RingError> attach(std::span<std::uint8_t> shared) noexcept {
    auto mem = detail::RingMemory<Req, Rsp>::make(shared);
    if (!mem) return fail(mem.error());
    return attach_at(*mem, mem->rsp_prod().load(std::memory_order_acquire));
  }

  // BACK_RING_ATTACH at an explicit index (BACK_RING_INIT is start 0).
  static Expected<BackRing, RingError> attach(std::span<std::uint8_t> shared, RingIdx start) noexcept {
    auto mem = detail::RingMemory<Req, Rsp>::make(shared);
    if (!mem) return fail(mem.error());
    return attach_at(*mem, start);
  }

  BackRing(BackRing&&) noexcept = default;
  BackRing& operator=(BackRing&&) noexcept = default;
  BackRing(const BackRing&) = delete;
  BackRing& operator=(const BackRing&) = delete;

  RingIdx size() const noexcept { return mem_.size(); }
  std::span<std::uint8_t> bytes() const noexcept { return mem_.bytes(); }
  RingIdx req_cons() const noexcept { return req_cons_; }
  RingIdx rsp_prod_pvt() const noexcept { return rsp_prod_pvt_; }
  // Requests consumed and not yet answered.
  RingIdx unanswered() const noexcept { return req_cons_ - rsp_prod_pvt_; }
  bool broken() const noexcept { return broken_; }

  // Requests available now (req_prod read once, acquire, validated). Never more than the
  // response slots left, so consuming them all can never overrun (RING_REQUEST_CONS_OVERFLOW).
  Expected<RingIdx, RingError> unconsumed_requests() noexcept { return refresh(); }

  // RING_COPY_REQUEST at req_cons, then req_cons++: the request is a copy; later writes by the
  // front end to the slot cannot change it. RingError::empty when none is available.
  Expected<Req, RingError> pop_request() noexcept {
    if (broken_) return fail(error_);
    if (req_cons_ == req_prod_seen_) {
      auto n = refresh();
      if (!n) return fail(n.error());
      if (*n == 0) return fail(RingError::empty);
    }
    Req req = detail::copy_out<Req>(mem_.slot(req_cons_));
    ++req_cons_;
    return req;
  }

  // Copy `rsp` into the next response slot (not yet visible: see push_responses). Every response
  // answers one consumed request; RingError::full when all consumed requests are answered.
  Expected<void, RingError> produce_response(const Rsp& rsp) noexcept {
    if (broken_) return fail(error_);
    if (rsp_prod_pvt_ == req_cons_) return fail(RingError::full);
    detail::copy_in(mem_.slot(rsp_prod_pvt_), rsp);
    ++rsp_prod_pvt_;
    return {};
  }

  // RING_PUSH_RESPONSES_AND_CHECK_NOTIFY: true when the front end must be notified.
  bool push_responses() noexcept {
    if (broken_) return false;
    const RingIdx old_prod = rsp_prod_pushed_;
    rsp_prod_pushed_ = rsp_prod_pvt_;
    return detail::RingMemory<Req, Rsp>::publish(mem_.rsp_prod(), mem_.rsp_event(), old_prod,
                                                 rsp_prod_pvt_);
  }

  // The front end asked to be notified at a response that is already published: its rsp_event is
  // at most rsp_prod (and no more than a ring behind it, where a front end that consumes
  // responses keeps it). A back end attaching to a ring another one served cannot know whether
  // that one notified before it died: it notifies once when this is true (a front end that had
  // already been told sees one spurious event). A fresh ring (rsp_event = rsp_prod + 1) says no.
  bool response_event_passed() const noexcept {
    const RingIdx prod = mem_.rsp_prod().load(std::memory_order_acquire);
    const RingIdx event = mem_.rsp_event().load(std::memory_order_acquire);
    return static_cast<RingIdx>(prod - event) < size();
  }

  // How the front end left the ring, read once when the back end stops (a diagnostic: the front
  // end may still be writing). Where a guest's I/O stalled, it tells a back end that missed
  // published requests (untaken > 0) from a front end that was owed an event: a front end arms
  // rsp_event = rsp_cons + 1 before it waits (RING_FINAL_CHECK_FOR_RESPONSES), so responses
  // pushed at or after rsp_event were to wake it (responses_since_armed > 0). A front end that
  // polls takes responses without arming, so for it that count says nothing; for one that
  // sleeps (Linux's blkfront and netfront), a count > 0 after a long stall means the event never
  // reached it or it never ran. Both 0: it was not waiting on this ring.
  struct EndState {
    RingIdx req_prod = 0, req_event = 0, rsp_prod = 0, rsp_event = 0;  // as read
    RingIdx untaken = 0;                // req_prod - req_cons (0 when req_prod is out of range)
    RingIdx responses_since_armed = 0;  // rsp_prod - rsp_event + 1 when rsp_event <= rsp_prod
  };
  EndState end_state() const noexcept {
    EndState e;
    e.req_prod = mem_.req_prod().load(std::memory_order_acquire);
    e.req_event = mem_.req_event().load(std::memory_order_relaxed);
    e.rsp_prod = mem_.rsp_prod().load(std::memory_order_relaxed);
    e.rsp_event = mem_.rsp_event().load(std::memory_order_acquire);
    if (static_cast<RingIdx>(e.req_prod - req_cons_) <= size()) e.untaken = e.req_prod - req_cons_;
    // Indexes are free-running: rsp_event at or before rsp_prod is a distance below 2^31 (a
    // front end arms at most a ring ahead of what it has seen).
    const RingIdx since = e.rsp_prod - e.rsp_event;
    if (since < (RingIdx{1} << 31)) e.responses_since_armed = since + 1;
    return e;
  }

  // RING_FINAL_CHECK_FOR_REQUESTS: call before sleeping on the event channel. If nothing is
  // pending, set req_event = req_cons + 1 and re-check; false means sleep is safe.
  Expected<bool, RingError> final_check_for_requests() noexcept {
    auto n = refresh();
    if (!n) return fail(n.error());
    if (*n != 0) return true;
    detail::arm_event(mem_.req_event(), req_cons_ + 1);
    n = refresh();
    if (!n) return fail(n.error());
    return *n != 0;
  }

  // The same before sleeping until at least `need` requests are unconsumed (netif rx: the
  // buffers a packet needs; Linux netback's xenvif_rx_ring_slots_available): true if they are
  // there; otherwise req_event = the request after those posted now, and look again — until a
  // look finds no request that was not counted when the event was set. A request that came in
  // between was pushed while req_event was still behind it, so its push did not notify, and a
  // sleep on an event set from the old count would wait for a notification that no later push
  // sends (req_event stays behind req_prod). Bounded: a round that goes on found more requests
  // than the one before (req_prod moving back is a broken ring), at most a ring's worth; the
  // final true ("look again") is not reached.
  Expected<bool, RingError> check_for_requests(RingIdx need) noexcept {
    for (std::size_t round = 0; round <= size(); ++round) {
      auto n = refresh();
      if (!n) return fail(n.error());
      if (*n >= need) return true;
      detail::arm_event(mem_.req_event(), req_cons_ + *n + 1);
      auto again = refresh();
      if (!again) return fail(again.error());
      if (*again == *n) return false;
    }
    return true;
  }

 private:
  BackRing(detail::RingMemory<Req, Rsp> mem, RingIdx start) noexcept
      : mem_(mem), req_cons_(start), req_prod_seen_(start), rsp_prod_pvt_(start),
        rsp_prod_pushed_(start) {}

  static Expected<BackRing, RingError> attach_at(detail::RingMemory<Req, Rsp> mem,
                                                 RingIdx start) noexcept {
    BackRing ring(mem, start);
    auto n = ring.refresh();
    if (!n) return fail(n.error());
    return ring;
  }

  // The one read of the front end's req_prod. The front end can have at most size() requests
  // unanswered (RING_REQUEST_PROD_OVERFLOW), and req_prod never moves backwards:
  //   req_prod_seen - rsp_prod_pvt <= req_prod - rsp_prod_pvt <= size.
  // Then 0 <= req_prod - req_cons <= size - unanswered(): every request has a response slot.
  Expected<RingIdx, RingError> refresh() noexcept {
    if (broken_) return fail(error_);
    const RingIdx prod = mem_.req_prod().load(std::memory_order_acquire);
    const RingIdx in_flight = prod - rsp_prod_pvt_;
    if (in_flight > size() || in_flight < static_cast<RingIdx>(req_prod_seen_ - rsp_prod_pvt_)) {
      broken_ = true;
      error_ = RingError::bad_producer_index;
      return fail(error_);
    }
    req_prod_seen_ = prod;
    return static_cast<RingIdx>(prod - req_cons_);
  }

  detail::RingMemory<Req, Rsp> mem_;
  RingIdx req_cons_;         // next request to consume
  RingIdx req_prod_seen_;    // last validated req_prod
  RingIdx rsp_prod_pvt_;     // next response slot to fill (private)
  RingIdx rsp_prod_pushed_;  // last rsp_prod we published
  bool broken_ = false;
  RingError error_ = RingError::bad_producer_index;
};

}  // namespace xpv::ring
