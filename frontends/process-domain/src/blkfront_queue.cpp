// One blkif ring of a Blkfront (see blkfront_queue.h).
#include "xpv/frontends/blkfront_queue.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xpv::frontends {

using namespace xpv::ring;

namespace {
constexpr std::uint64_t kSector = 512;
constexpr std::uint64_t kSectorsPerPage = kPageSize / kSector;
}  // namespace

std::uint32_t BlkfrontQueue::max_segments() const noexcept {
  return config_.indirect_segments ? config_.indirect_segments : kBlkifMaxSegmentsPerRequest;
}

std::uint64_t BlkfrontQueue::max_sectors() const noexcept {
  return std::uint64_t{max_segments()} * kSectorsPerPage;
}

BlkfrontQueue::BlkfrontQueue(domain::Domain& dom, GuestEvents& events, BlkfrontQueueConfig config,
                             std::atomic<bool>& broken)
    : dom_(dom), events_(events), config_(config), broken_(broken), poll_(config.poll_max) {
  if (config_.ring_page_order > 4) throw std::invalid_argument("blkfront: ring page order above 4");
  if (config_.indirect_segments > kBlkifMaxIndirectSegments) {
    throw std::invalid_argument("blkfront: more indirect segments than blkif allows");
  }
  auto& grants = dom_.grants();
  auto grant = [&](std::uint64_t gfn, bool ro) {
    auto r = grants.grant_access(config_.backend, gfn, ro);
    if (!r) throw std::runtime_error("blkfront: grant table full");
    return *r;
  };
  auto need_gfn = [&](std::uint64_t n, const char* what) {
    auto g = dom_.alloc_pages(n);
    if (!g) throw std::runtime_error(std::string("blkfront: the domain has no room for ") + what);
    return *g;
  };
  try {
    const std::uint64_t ring_pages = std::uint64_t{1} << config_.ring_page_order;
    ring_gfn_ = need_gfn(ring_pages, "the ring");
    auto front = BlkifFrontRing::init(dom_.pages(ring_gfn_, ring_pages));
    if (!front) throw std::runtime_error("blkfront: cannot set up the ring");
    ring_.emplace(std::move(*front));
    for (std::uint64_t i = 0; i < ring_pages; ++i) ring_refs_.push_back(grant(ring_gfn_ + i, false));

    slots_.resize(ring_->size());
    wake_ = std::vector<std::condition_variable>(ring_->size());
    const std::uint32_t segs = max_segments();
    const std::uint32_t ind_pages = config_.indirect_segments ? blkif_indirect_pages(segs) : 0;
    for (Slot& s : slots_) {
      const std::uint64_t base = need_gfn(segs, "data pages");
      for (std::uint32_t i = 0; i < segs; ++i) s.gfns.push_back(base + i);
      for (std::uint32_t i = 0; i < segs; ++i) s.refs.push_back(grant(base + i, false));  // rw: reads land in them
      if (ind_pages) {
        const std::uint64_t ib = need_gfn(ind_pages, "indirect pages");
        for (std::uint32_t i = 0; i < ind_pages; ++i) s.indirect_gfns.push_back(ib + i);
        for (std::uint32_t i = 0; i < ind_pages; ++i) {
          s.indirect_refs.push_back(grant(ib + i, true));  // the backend only reads descriptors
        }
      }
    }
    auto port = dom_.evtchn().alloc_unbound(config_.backend);
    if (!port) throw std::runtime_error("blkfront: no event channel");
    port_alloc_ = *port;
    port_ = *port;
    events_.set_handler(port_, [this] { on_event(); });
  } catch (...) {
    release();
    throw;
  }
}

BlkfrontQueue::~BlkfrontQueue() { release(); }

void BlkfrontQueue::release() noexcept {
  if (port_alloc_) {
    events_.clear_handler(*port_alloc_);
    (void)dom_.evtchn().close(*port_alloc_);
    port_alloc_.reset();
  }
  // A grant the backend still maps cannot be ended, and its page is not given back either: the
  // backend may still write into it (a response, a read's data), and the next user of the page
  // would find that there. Both stay with the domain for good, as Linux's frontends keep such a
  // page for a deferred free.
  auto& grants = dom_.grants();
  auto end_all = [&](const std::vector<gnttab::GrantRef>& refs) {
    bool all = true;
    for (auto r : refs) {
      if (!grants.end_access(r)) {
        spdlog::warn("blkfront: grant {} still mapped by the backend; it and its page are kept, not reused", r);
        all = false;
      }
    }
    return all;
  };
  for (Slot& s : slots_) {
    if (end_all(s.refs) && !s.gfns.empty()) dom_.free_pages(s.gfns.front(), s.gfns.size());
    if (end_all(s.indirect_refs) && !s.indirect_gfns.empty()) {
      dom_.free_pages(s.indirect_gfns.front(), s.indirect_gfns.size());
    }
  }
  slots_.clear();
  if (end_all(ring_refs_) && ring_gfn_) dom_.free_pages(ring_gfn_, std::uint64_t{1} << config_.ring_page_order);
  ring_refs_.clear();
  ring_gfn_ = 0;
}

BlkfrontQueue::Stats BlkfrontQueue::stats() const {
  std::lock_guard l(lock_);
  return stats_;
}

void BlkfrontQueue::break_queue() {
  dead_ = true;
  broken_.store(true, std::memory_order_release);
  for (auto& w : wake_) w.notify_all();
  slot_free_.notify_all();
  async_wake_.notify_all();
}

std::uint32_t BlkfrontQueue::take_slot() {
  std::unique_lock l(lock_);
  for (;;) {
    if (dead_ || broken_.load(std::memory_order_acquire)) return UINT32_MAX;
    for (std::uint32_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i].busy) {
        slots_[i].busy = true;
        slots_[i].done = false;
        return i;
      }
    }
    slot_free_.wait(l);
  }
}

void BlkfrontQueue::free_slot(std::uint32_t id) {
  {
    std::lock_guard l(lock_);
    slots_[id].busy = false;
  }
  slot_free_.notify_one();
}

int BlkfrontQueue::submit_and_wait(const BlkifRequest& req, std::uint32_t slot) {
  std::unique_lock l(lock_);
  if (dead_ || broken_.load(std::memory_order_acquire)) return -EIO;
  if (!produce_locked(req)) return -EIO;
  auto answered = [&] { return slots_[slot].done || dead_; };
  // Spin first: a fast backend answers within microseconds, sooner than a notification and two
  // thread wake-ups would bring the answer here.
  const auto window = poll_.window();
  const auto began = AdaptivePoll::Clock::now();
  if (window.count() > 0) {
    l.unlock();
    const bool hit = AdaptivePoll::spin_until(began + window, [&] {
      std::lock_guard g(lock_);
      // Someone asleep relies on a notification for the next answer: re-arm for it (popping
      // moved rsp_cons past the event index that sleeper set) and wake whoever is answered.
      if (reap_locked() && sleepers_ > 0) arm_locked();
      return answered();
    });
    l.lock();
    if (hit && slots_[slot].done) ++stats_.polled;
  }
  if (!answered()) {
    arm_locked();
    ++sleepers_;
    slots_[slot].sleeping = true;
    wake_[slot].wait(l, answered);
    slots_[slot].sleeping = false;
    --sleepers_;
    poll_.adjust(AdaptivePoll::Clock::now() - began);
  }
  if (!slots_[slot].done) return -EIO;
  return result_of(slots_[slot].status);
}

bool BlkfrontQueue::produce_locked(const BlkifRequest& req) {
  if (!ring_->produce_request(req)) {
    break_queue();  // more requests than slots: cannot happen unless our bookkeeping broke
    return false;
  }
  ++stats_.requests;
  if (ring_->push_requests()) {
    ++stats_.notifications;
    (void)dom_.evtchn().send(port_);
  }
  return true;
}

int BlkfrontQueue::result_of(std::int16_t status) {
  switch (status) {
    case kBlkifRspOkay: return 0;
    case kBlkifRspEopnotsupp: return -EOPNOTSUPP;
    default: return -EIO;
  }
}

bool BlkfrontQueue::reap_locked() {
  bool any = false;
  while (!dead_) {
    auto rsp = ring_->pop_response();
    if (!rsp) {
      if (rsp.error() != RingError::empty) break_queue();
      break;
    }
    ++stats_.responses;
    // The backend is not trusted either: the id must name a slot that waits for an answer.
    if (rsp->id >= slots_.size() || !slots_[rsp->id].busy || slots_[rsp->id].done) {
      spdlog::error("blkfront: response for id {:#x} names no outstanding request", rsp->id);
      break_queue();
      break;
    }
    Slot& s = slots_[rsp->id];
    s.status = rsp->status;
    s.done = true;
    if (s.sleeping) wake_[rsp->id].notify_one();  // only the caller this answer is for
    if (s.async) {
      ++async_answered_;
      if (async_waiting_) async_wake_.notify_one();
    }
    any = true;
  }
  return any;
}

void BlkfrontQueue::arm_locked() {
  for (int rounds = 0; rounds < 64 && !dead_; ++rounds) {
    auto more = ring_->final_check_for_responses();
    if (!more) {
      break_queue();
      return;
    }
    if (!*more) return;
    reap_locked();
  }
}

// GuestEvents dispatcher thread.
void BlkfrontQueue::on_event() {
  std::lock_guard l(lock_);
  reap_locked();
  // Re-arm rsp_event only for someone asleep on it. A completion thread that is spinning pops
  // the answers itself, and arms before it sleeps; re-arming here every time made the backend
  // notify for every response, so a notification per request kept itself going (and woke this
  // thread each time) even while the completion thread spun.
  if (sleepers_ > 0) arm_locked();
}

BlkifRequest BlkfrontQueue::prepare(std::uint32_t id, bool write, std::uint64_t sector, const std::uint8_t* buf,
                                    std::uint64_t nsect) {
  // The slot is its caller's until it is freed: its pages and descriptors are touched without lock_.
  Slot& s = slots_[id];
  const auto nsegs = static_cast<std::uint32_t>((nsect + kSectorsPerPage - 1) / kSectorsPerPage);
  const std::uint64_t bytes = nsect * kSector;
  if (write) {
    for (std::uint32_t i = 0; i < nsegs; ++i) {
      const std::uint64_t len = std::min<std::uint64_t>(kPageSize, bytes - std::uint64_t{i} * kPageSize);
      std::memcpy(dom_.pages(s.gfns[i], 1).data(), buf + std::uint64_t{i} * kPageSize, len);
    }
  }
  auto seg = [&](std::uint32_t i) {
    const std::uint64_t left = nsect - std::uint64_t{i} * kSectorsPerPage;
    BlkifRequestSegment g{};
    g.gref = s.refs[i];
    g.first_sect = 0;
    g.last_sect = static_cast<std::uint8_t>(std::min<std::uint64_t>(left, kSectorsPerPage) - 1);
    return g;
  };
  BlkifRequest req{};
  if (nsegs <= kBlkifMaxSegmentsPerRequest) {
    req.operation = write ? kBlkifOpWrite : kBlkifOpRead;
    req.nr_segments = static_cast<std::uint8_t>(nsegs);
    req.id = id;
    req.sector_number = sector;
    for (std::uint32_t i = 0; i < nsegs; ++i) req.seg[i] = seg(i);
    return req;
  }
  BlkifRequestIndirect ind{};
  ind.operation = kBlkifOpIndirect;
  ind.indirect_op = write ? kBlkifOpWrite : kBlkifOpRead;
  ind.nr_segments = static_cast<std::uint16_t>(nsegs);
  ind.id = id;
  ind.sector_number = sector;
  for (std::uint32_t i = 0; i < nsegs; ++i) {
    auto page = dom_.pages(s.indirect_gfns[i / kBlkifSegsPerIndirectFrame], 1);
    const BlkifRequestSegment g = seg(i);
    std::memcpy(page.data() + (i % kBlkifSegsPerIndirectFrame) * sizeof g, &g, sizeof g);
  }
  for (std::uint32_t p = 0; p < blkif_indirect_pages(nsegs); ++p) ind.indirect_grefs[p] = s.indirect_refs[p];
  return blkif_pack(ind);
}

void BlkfrontQueue::copy_out(std::uint32_t id, std::uint8_t* buf, std::uint64_t bytes) {
  const Slot& s = slots_[id];
  for (std::uint64_t off = 0, i = 0; off < bytes; off += kPageSize, ++i) {
    std::memcpy(buf + off, dom_.pages(s.gfns[i], 1).data(), std::min<std::uint64_t>(kPageSize, bytes - off));
  }
}

int BlkfrontQueue::transfer(bool write, std::uint64_t sector, std::uint8_t* buf, std::uint64_t nsect) {
  if (nsect == 0 || nsect > max_sectors()) return -EINVAL;
  const std::uint32_t id = take_slot();
  if (id == UINT32_MAX) return -EIO;
  const int rc = submit_and_wait(prepare(id, write, sector, buf, nsect), id);
  if (rc == 0 && !write) copy_out(id, buf, nsect * kSector);
  free_slot(id);
  return rc;
}

int BlkfrontQueue::start(bool write, std::uint64_t sector, std::uint8_t* buf, std::uint64_t nsect, Done done) {
  if (nsect == 0 || nsect > max_sectors()) return -EINVAL;
  std::uint32_t id = UINT32_MAX;
  {
    std::lock_guard l(lock_);
    if (dead_ || broken_.load(std::memory_order_acquire)) return -EIO;
    for (std::uint32_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i].busy) {
        id = i;
        break;
      }
    }
    if (id == UINT32_MAX) return -EBUSY;
    Slot& s = slots_[id];
    s.busy = true;
    s.done = false;
    s.async = true;
    s.on_done = std::move(done);
    s.buf = buf;
    s.bytes = nsect * kSector;
    s.write = write;
    ++async_in_flight_;
    ++stats_.async_requests;
  }
  const BlkifRequest req = prepare(id, write, sector, buf, nsect);
  std::lock_guard l(lock_);
  // A ring that broke meanwhile: complete() finishes this slot with -EIO.
  if (!dead_) (void)produce_locked(req);
  // A completion thread waiting for work, unless a poller collects the answer.
  if (idle_waiting_ && pollers_ == 0) async_wake_.notify_one();
  return 0;
}

void BlkfrontQueue::run_completions() {
  for (;;) {
    {
      std::unique_lock l(lock_);
      idle_waiting_ = true;
      async_wake_.wait(l, [&] { return (async_in_flight_ > 0 && pollers_ == 0) || stopping_; });
      idle_waiting_ = false;
      if (stopping_) {
        if (async_in_flight_ > 0) {
          spdlog::warn("blkfront: {} asynchronous request(s) still in flight at shutdown", async_in_flight_);
        }
        return;
      }
    }
    (void)complete(1);
  }
}

void BlkfrontQueue::stop_completions() {
  std::lock_guard l(lock_);
  stopping_ = true;
  async_wake_.notify_all();
}

unsigned BlkfrontQueue::in_flight() const {
  std::lock_guard l(lock_);
  return async_in_flight_;
}

unsigned BlkfrontQueue::complete(unsigned min) {
  unsigned ran = 0;
  std::vector<std::uint32_t> finished;
  for (;;) {
    finished.clear();
    {
      std::unique_lock l(lock_);
      auto ready = [&] { return async_answered_ > 0 || dead_ || async_in_flight_ == 0 || stopping_; };
      if (!ready() && ran < min) {
        // Spin first, popping responses ourselves (rsp_event stays unarmed: no notification).
        const auto window = poll_.window();
        const auto began = AdaptivePoll::Clock::now();
        if (window.count() > 0) {
          l.unlock();
          (void)AdaptivePoll::spin_until(began + window, [&] {
            std::lock_guard g(lock_);
            if (reap_locked() && sleepers_ > 0) arm_locked();
            return ready();
          });
          l.lock();
        }
        if (!ready()) {
          arm_locked();
          ++sleepers_;
          async_waiting_ = true;
          async_wake_.wait(l, ready);
          async_waiting_ = false;
          --sleepers_;
          poll_.adjust(AdaptivePoll::Clock::now() - began);
        }
      }
      claim_locked(finished);
    }
    finish(finished);
    ran += static_cast<unsigned>(finished.size());
    std::lock_guard l(lock_);
    if (ran >= min || async_in_flight_ == 0 || stopping_) return ran;
  }
}

void BlkfrontQueue::polling(bool on) {
  std::lock_guard l(lock_);
  if (on) {
    ++pollers_;
  } else if (pollers_ > 0 && --pollers_ == 0 && async_in_flight_ > 0 && idle_waiting_) {
    async_wake_.notify_one();  // the completion thread takes over what is in flight
  }
}

unsigned BlkfrontQueue::poll() {
  thread_local std::vector<std::uint32_t> finished;
  finished.clear();
  {
    std::lock_guard l(lock_);
    if (async_in_flight_ == 0) return 0;
    if (reap_locked() && sleepers_ > 0) arm_locked();
    claim_locked(finished);
  }
  finish(finished);
  return static_cast<unsigned>(finished.size());
}

void BlkfrontQueue::claim_locked(std::vector<std::uint32_t>& finished) {
  if (async_answered_ == 0 && !dead_) return;
  for (std::uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.busy && s.async && (s.done || dead_)) {
      s.async = false;  // claimed: still busy until its data is out
      if (s.done) --async_answered_;
      --async_in_flight_;
      finished.push_back(i);
    }
  }
}

void BlkfrontQueue::finish(const std::vector<std::uint32_t>& finished) {
  for (std::uint32_t id : finished) {
    Slot& s = slots_[id];
    const int rc = s.done ? result_of(s.status) : -EIO;
    if (rc == 0 && !s.write) copy_out(id, s.buf, s.bytes);
    Done cb = std::move(s.on_done);
    s.on_done = nullptr;
    free_slot(id);
    cb(rc);
  }
}

int BlkfrontQueue::simple(BlkifRequest req) {
  const std::uint32_t id = take_slot();
  if (id == UINT32_MAX) return -EIO;
  req.id = id;
  const int rc = submit_and_wait(req, id);
  free_slot(id);
  return rc;
}

}  // namespace xpv::frontends
