#include "xpv/blkback/queue.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/uio.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <utility>

namespace xpv::blkback {

using namespace xpv::ring;

namespace {
constexpr std::int16_t kOkay = kBlkifRspOkay;
constexpr std::int16_t kError = kBlkifRspError;
constexpr std::int16_t kUnsupported = kBlkifRspEopnotsupp;
constexpr std::uint64_t kSector = kBlkifSectorSize;
}  // namespace

// One admitted request: what its completion needs to answer it and to release its grants.
struct BlkifQueue::Pending {
  enum class State : std::uint8_t { free, in_flight, done };
  State state = State::free;
  std::int16_t status = 0;     // valid when done
  RingIdx idx = 0;             // the request's ring index
  std::uint64_t id = 0;
  std::uint8_t op = 0;         // the operation as the guest wrote it (echoed in the response)
  std::uint64_t expect = 0;    // bytes a read/write must transfer; 0 for flush/discard
  std::uint64_t taken_us = 0;  // when it was taken from the ring (QueueCounters::answered_us)
  std::vector<gnttab::GrantHandle> maps;
  std::vector<iovec> iov;
  std::vector<BlkifRequestSegment> segs;  // indirect segments copied out of the guest's pages
};

namespace {
std::uint64_t now_us() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

// Whether `slot`, as the ring holds it now, is the request `copy` was taken from: either intact
// (equal in full), or torn by that request's own response, which overwrites only the first
// sizeof(BlkifResponse) bytes — starting with the request's id — and leaves the rest as the
// request had it. (Not its operation: an indirect request is answered with the operation it
// carries inside, as Linux's blkback does.)
bool slot_holds(const BlkifRequest& slot, const BlkifRequest& copy) noexcept {
  static_assert(sizeof(BlkifRequest) > sizeof(BlkifResponse));
  if (std::memcmp(&slot, &copy, sizeof slot) == 0) return true;
  BlkifResponse torn;
  std::memcpy(&torn, &slot, sizeof torn);
  const auto* ps = reinterpret_cast<const std::uint8_t*>(&slot);
  const auto* pc = reinterpret_cast<const std::uint8_t*>(&copy);
  return torn.id == copy.id &&
         std::memcmp(ps + sizeof(BlkifResponse), pc + sizeof(BlkifResponse),
                     sizeof(BlkifRequest) - sizeof(BlkifResponse)) == 0;
}

// A guest can make a queue complain at line rate: log the first few, then one in a thousand.
template <class... Args>
void log_limited(std::uint64_t& logged, spdlog::level::level_enum level, const std::string& name,
                 const char* format, Args&&... args) noexcept {
  ++logged;
  if (logged > 10 && logged % 1000 != 0) return;
  try {
    spdlog::log(level, "{}: {}{}", name, fmt::format(fmt::runtime(format), std::forward<Args>(args)...),
                logged > 10 ? " (rate-limited)" : "");
  } catch (...) {
  }
}
}  // namespace

template <class... Args>
void BlkifQueue::guest_error(const char* format, Args&&... args) noexcept {
  log_limited(guest_errors_logged_, spdlog::level::warn, name_, format, std::forward<Args>(args)...);
}

template <class... Args>
void BlkifQueue::io_error(const char* format, Args&&... args) noexcept {
  log_limited(io_errors_logged_, spdlog::level::err, name_, format, std::forward<Args>(args)...);
}

BlkifQueue::BlkifQueue(std::string name, const Disk& disk, gnttab::GrantMapper& mapper,
                       BlkifBackRing ring, std::unique_ptr<domain::EventChannel> evtchn,
                       QueueConfig config, ShadowRing* shadow)
    : name_(std::move(name)),
      disk_(disk),
      mapper_(mapper),
      ring_(std::move(ring)),
      evtchn_(std::move(evtchn)),
      config_(config),
      io_(std::max<unsigned>(ring_.size(), 8)),
      shadow_(shadow),
      poll_(config_.poll_max) {
  auto s = domain::EventFd::create();
  if (!s) throw std::system_error(s.error(), std::generic_category(), "eventfd");
  stop_ = std::move(*s);
  const std::size_t max_segs =
      std::max<std::size_t>(kBlkifMaxSegmentsPerRequest, config_.max_indirect_segments);
  // One request is one readv/writev (pwritev for buffered disks), and the kernel refuses more
  // than IOV_MAX (1024) iovecs with EINVAL: a larger maximum would be advertised and then every
  // request that used it answered with an error (found writing tests/fuzz/blkback). Linux's
  // blkback offers 256, as the daemon does.
  if (config_.max_indirect_segments > std::min<std::uint32_t>(kBlkifMaxIndirectSegments, IOV_MAX)) {
    throw std::invalid_argument("max_indirect_segments above what one readv/writev takes (IOV_MAX)");
  }
  // Everything the data path needs is allocated here, never on it.
  pending_.resize(ring_.size());
  for (Pending& p : pending_) {
    p.maps.reserve(max_segs + kBlkifMaxIndirectPagesPerRequest);
    p.iov.reserve(max_segs);
    p.segs.reserve(max_segs);
  }
  notify_owed_ = ring_.response_event_passed();  // false on a fresh ring
}

BlkifQueue::~BlkifQueue() {
  // The kernel may still be writing into granted pages: wait for every I/O before the grants
  // (and the pages behind them) are released.
  for (int i = 0; i < 100000 && io_.in_flight() > 0; ++i) {
    (void)io_.submit_and_wait(1);
    io_.reap([this](std::uint64_t user, int) {
      Pending& p = pending_[user];
      release(p);
      p.state = Pending::State::free;
    });
  }
}

void BlkifQueue::stop() noexcept {
  stop_requested_.store(true, std::memory_order_release);  // seen by a spinning thread
  (void)stop_.notify();                                     // wakes a sleeping one
}

void BlkifQueue::disable(const char* why) noexcept {
  if (!disabled_.exchange(true, std::memory_order_acq_rel)) {
    spdlog::error("{}: disabled: {}", name_, why);
  }
}

void BlkifQueue::release(Pending& p) noexcept {
  for (gnttab::GrantHandle h : p.maps) {
    if (auto r = mapper_.unmap(h); !r) {
      // Our own handle table disagrees with us: a host bug, not a guest fault.
      spdlog::critical("{}: unmap of our own grant handle failed: {}", name_, gnttab::to_string(r.error()));
      std::abort();
    }
  }
  p.maps.clear();
  p.iov.clear();
  p.segs.clear();
}

bool BlkifQueue::respond(std::uint64_t id, std::uint8_t op, std::int16_t status) noexcept {
  BlkifResponse rsp{};
  rsp.id = id;
  rsp.operation = op;
  rsp.status = status;
  if (auto r = ring_.produce_response(rsp); !r) {
    disable(to_string(r.error()));
    return false;
  }
  if (status == kError) counters_.errors.fetch_add(1, std::memory_order_relaxed);
  if (status == kUnsupported) counters_.unsupported.fetch_add(1, std::memory_order_relaxed);
  respond_pending_ = true;
  return true;
}

void BlkifQueue::push_and_notify() noexcept {
  // Never notify without new responses (late-EOI frontends), except once for responses a dead
  // backend published without notifying.
  bool kick = std::exchange(notify_owed_, false);
  if (respond_pending_) {
    respond_pending_ = false;
    const std::uint64_t pushed = now_us();
    counters_.batches.fetch_add(1, std::memory_order_relaxed);
    if (ring_.push_responses()) kick = true;
    // Everything answered and nothing more on the ring: what comes next is the guest's turn.
    if (ring_.rsp_prod_pvt() == ring_.req_cons() && ring_.unconsumed_requests().value_or(1) == 0) idle_since_us_ = pushed;
  }
  if (kick) {
    counters_.notifications.fetch_add(1, std::memory_order_relaxed);
    if (auto r = evtchn_->notify(); !r) disable("event channel notify failed");
  }
}

bool BlkifQueue::map_segments(Pending& p, const BlkifRequestSegment* segs, unsigned n,
                              bool write) noexcept {
  for (unsigned i = 0; i < n; ++i) {
    const BlkifRequestSegment s = segs[i];
    if (s.first_sect > s.last_sect || s.last_sect >= kBlkifSectorsPerPage) {
      guest_error("request {:#x}: segment {} sectors {}..{} do not fit a page", p.id, i,
                  s.first_sect, s.last_sect);
      return false;
    }
    // A write to the disk only reads the guest's page: map it read-only.
    auto m = mapper_.map(s.gref, /*readonly=*/write);
    if (!m) {
      guest_error("request {:#x}: segment {} grant {}: {}", p.id, i, s.gref, gnttab::to_string(m.error()));
      return false;
    }
    p.maps.push_back(m->handle());
    std::uint8_t* base = write ? const_cast<std::uint8_t*>(m->data().data()) : m->writable().data();
    const std::size_t len = (std::size_t{s.last_sect} - s.first_sect + 1) * kSector;
    p.iov.push_back({base + std::size_t{s.first_sect} * kSector, len});
    p.expect += len;
  }
  return true;
}

BlkifQueue::Admit BlkifQueue::admit_rw(const BlkifRequest& req, Pending& p) noexcept {
  const bool write = req.operation == kBlkifOpWrite;
  if (req.nr_segments == 0 || req.nr_segments > kBlkifMaxSegmentsPerRequest) {
    guest_error("request {:#x}: {} segments", req.id, req.nr_segments);
    return Admit::answered;
  }
  if (!map_segments(p, req.seg, req.nr_segments, write)) return Admit::answered;
  return Admit::queued;
}

BlkifQueue::Admit BlkifQueue::admit_indirect(const BlkifRequest& raw, Pending& p) noexcept {
  const auto req = blkif_view<BlkifRequestIndirect>(raw);
  if (req.indirect_op != kBlkifOpRead && req.indirect_op != kBlkifOpWrite) {
    guest_error("request {:#x}: indirect operation {}", req.id, req.indirect_op);
    return Admit::answered;
  }
  if (req.nr_segments == 0 || req.nr_segments > config_.max_indirect_segments) {
    guest_error("request {:#x}: {} indirect segments (max {})", req.id, req.nr_segments,
                config_.max_indirect_segments);
    return Admit::answered;
  }
  // Copy the descriptors out of the guest's indirect pages, then let go of those pages.
  p.segs.resize(req.nr_segments);
  const std::uint32_t pages = blkif_indirect_pages(req.nr_segments);
  std::uint32_t done = 0;
  for (std::uint32_t i = 0; i < pages; ++i) {
    const std::uint32_t n = std::min(req.nr_segments - done, kBlkifSegsPerIndirectFrame);
    auto m = mapper_.map(req.indirect_grefs[i], /*readonly=*/true);
    if (!m) {
      guest_error("request {:#x}: indirect page {} grant {}: {}", req.id, i, req.indirect_grefs[i],
                  gnttab::to_string(m.error()));
      return Admit::answered;
    }
    std::memcpy(p.segs.data() + done, m->data().data(), n * sizeof(BlkifRequestSegment));
    (void)mapper_.unmap(*m);
    done += n;
  }
  if (!map_segments(p, p.segs.data(), req.nr_segments, req.indirect_op == kBlkifOpWrite)) {
    return Admit::answered;
  }
  return Admit::queued;
}

namespace {
// One pwritev (again after a signal): the bytes written, or -errno. A short write of a regular
// file means the next call would fail; complete() answers it as the io_uring path's short I/O.
int write_now(int fd, const std::vector<iovec>& iov, std::uint64_t offset) noexcept {
  ssize_t n;
  do {
    n = ::pwritev(fd, iov.data(), static_cast<int>(iov.size()), static_cast<off_t>(offset));
  } while (n < 0 && errno == EINTR);
  return n < 0 ? -errno : static_cast<int>(n);
}
}  // namespace

BlkifQueue::Admit BlkifQueue::admit(const BlkifRequest& req, std::uint32_t slot) noexcept {
  counters_.requests.fetch_add(1, std::memory_order_relaxed);
  Pending& p = pending_[slot];
  p.idx = ring_.req_cons() - 1;
  p.id = req.id;
  p.op = req.operation;
  // blkfront matches a response to an indirect request by its indirect_op (READ or WRITE).
  if (req.operation == kBlkifOpIndirect) {
    const auto ind = blkif_view<BlkifRequestIndirect>(req);
    if (ind.indirect_op == kBlkifOpRead || ind.indirect_op == kBlkifOpWrite) p.op = ind.indirect_op;
  }
  p.expect = 0;
  std::int16_t reject = kError;
  Admit a = Admit::answered;
  bool queued = false;
  std::optional<int> sync_result;  // a write done in this thread (buffered disks): its result
  const int fd = disk_.fd();

  switch (req.operation) {
    case kBlkifOpRead:
    case kBlkifOpWrite:
    case kBlkifOpIndirect: {
      if (req.operation == kBlkifOpIndirect && config_.max_indirect_segments == 0) {
        reject = kUnsupported;
        break;
      }
      const auto sector = req.operation == kBlkifOpIndirect
                              ? blkif_view<BlkifRequestIndirect>(req).sector_number
                              : req.sector_number;
      const bool write = req.operation == kBlkifOpIndirect
                             ? blkif_view<BlkifRequestIndirect>(req).indirect_op == kBlkifOpWrite
                             : req.operation == kBlkifOpWrite;
      if (write && disk_.info().readonly) {
        guest_error("request {:#x}: write to a read-only disk", req.id);
        break;
      }
      a = req.operation == kBlkifOpIndirect ? admit_indirect(req, p) : admit_rw(req, p);
      if (a != Admit::queued) break;
      const std::uint64_t sectors = p.expect / kSector;
      if (sector > disk_.info().sectors || sectors > disk_.info().sectors - sector) {
        guest_error("request {:#x}: sectors {}+{} beyond the disk's {}", req.id, sector, sectors,
                    disk_.info().sectors);
        a = Admit::answered;
        break;
      }
      if (write && !disk_.info().direct) {
        // Through the page cache (no O_DIRECT: tmpfs and the like), io_uring cannot write without
        // blocking on most file systems and hands every such write to an io-wq worker: a thread
        // hand-off per request that costs more than the copy itself. Measured in the testbed's L1
        // (Linux 6.1, tmpfs, fio 128 KiB writes): psync 394 MB/s, io_uring 181 MB/s at qd1 and
        // 302 at qd16. So the queue thread copies it here; the answer still goes out in its turn.
        // (Reads of cached pages complete inside io_uring's submit already.)
        sync_result = write_now(fd, p.iov, sector * kSector);
        queued = true;
      } else {
        queued = write ? io_.writev(fd, p.iov.data(), static_cast<unsigned>(p.iov.size()), sector * kSector, slot)
                       : io_.readv(fd, p.iov.data(), static_cast<unsigned>(p.iov.size()), sector * kSector, slot);
      }
      (write ? counters_.sectors_written : counters_.sectors_read).fetch_add(sectors, std::memory_order_relaxed);
      (write ? counters_.writes : counters_.reads).fetch_add(1, std::memory_order_relaxed);
      break;
    }
    case kBlkifOpFlushDiskcache:
      if (!config_.flush) {
        reject = kUnsupported;
        break;
      }
      if (req.nr_segments != 0) {
        // A flush carrying data (blkfront never sends one: the block layer splits them). Answered
        // as an error rather than OK after a flush that did not write the data.
        guest_error("request {:#x}: flush with {} data segments", req.id, req.nr_segments);
        break;
      }
      counters_.flushes.fetch_add(1, std::memory_order_relaxed);
      queued = io_.fsync(fd, /*datasync=*/true, slot);
      a = Admit::queued;
      break;
    case kBlkifOpDiscard: {
      const auto d = blkif_view<BlkifRequestDiscard>(req);
      if (!config_.discard || !disk_.info().discard || (d.flag & kBlkifDiscardSecure) != 0) {
        reject = kUnsupported;
        break;
      }
      if (d.nr_sectors == 0 || d.sector_number > disk_.info().sectors ||
          d.nr_sectors > disk_.info().sectors - d.sector_number) {
        guest_error("request {:#x}: discard {}+{} beyond the disk's {}", req.id, d.sector_number,
                    d.nr_sectors, disk_.info().sectors);
        break;
      }
      counters_.discards.fetch_add(1, std::memory_order_relaxed);
      queued = io_.punch_hole(fd, d.sector_number * kSector, d.nr_sectors * kSector, slot);
      a = Admit::queued;
      break;
    }
    default:
      // WRITE_BARRIER is not offered (feature-barrier absent); anything else is unknown.
      reject = kUnsupported;
      break;
  }

  if (a == Admit::queued && !queued) {
    // The submission queue is sized to the ring, so this means earlier SQEs are unsubmitted:
    // submit them and try once more.
    (void)io_.submit();
    a = Admit::ring_busy;
  }
  if (a != Admit::queued) {
    release(p);
    // Answered at once, but only in its turn: after every earlier request (retire()).
    if (a == Admit::answered) finish(p, reject);
    return a;
  }
  p.state = Pending::State::in_flight;
  if (sync_result) complete(slot, *sync_result);
  return a;
}

void BlkifQueue::complete(std::uint32_t slot, int res) noexcept {
  Pending& p = pending_[slot];
  std::int16_t status = kOkay;
  if (res < 0) {
    status = (p.op == kBlkifOpDiscard && res == -EOPNOTSUPP) ? kUnsupported : kError;
    if (status == kError) io_error("request {:#x}: I/O failed: {}", p.id, std::strerror(-res));
  } else if (static_cast<std::uint64_t>(res) != p.expect) {
    io_error("request {:#x}: short I/O ({} of {} bytes)", p.id, res, p.expect);
    status = kError;
  }
  release(p);
  finish(p, status);
}

void BlkifQueue::finish(Pending& p, std::int16_t status) noexcept {
  p.state = Pending::State::done;
  p.status = status;
  // Held: some earlier request of this ring is not done yet, so this answer must wait. (The
  // walk stops at the first request not done; done ones ahead of it are this batch's.)
  for (RingIdx i = ring_.rsp_prod_pvt(); i != p.idx; ++i) {
    if (pending_[ring_slot(i, ring_.size())].state != Pending::State::done) {
      counters_.held.fetch_add(1, std::memory_order_relaxed);
      break;
    }
  }
}

// Responses in request order: answer the oldest unanswered requests while they are done.
void BlkifQueue::retire() noexcept {
  std::uint64_t now = 0;  // read once per pass, when the first answer goes out
  while (!disabled() && ring_.rsp_prod_pvt() != ring_.req_cons()) {
    Pending& p = pending_[ring_slot(ring_.rsp_prod_pvt(), ring_.size())];
    if (p.state != Pending::State::done) return;
    p.state = Pending::State::free;
    if (now == 0) now = now_us();
    if (respond(p.id, p.op, p.status)) {
      counters_.answered.fetch_add(1, std::memory_order_relaxed);
      counters_.answered_us.fetch_add(now - p.taken_us, std::memory_order_relaxed);
    }
  }
}

void BlkifQueue::drain_ring(bool arm) noexcept {
  for (int rounds = 0; rounds < 1024; ++rounds) {
    // The ring refuses more than size() unanswered requests (RING_REQUEST_PROD_OVERFLOW), so
    // the slot of every request it hands out is free.
    while (true) {
      auto req = ring_.pop_request();
      if (!req) {
        if (req.error() != RingError::empty) disable(to_string(req.error()));
        break;
      }
      const RingIdx idx = ring_.req_cons() - 1;
      if (shadow_ != nullptr) {
        // A restarted backend: an index the dead one had consumed is taken from its copy (the
        // ring slot may already hold that request's unpublished response). A copy the slot does
        // not match, intact or torn (slot_holds), is some other ring's request at this index (a
        // shadow kept over rings that are gone, resumed from xenstore that still said
        // Connected): the slot's own request is done instead.
        auto old = shadow_->get(idx);
        if (old && slot_holds(*req, *old)) {
          *req = *old;
          counters_.redone_from_shadow.fetch_add(1, std::memory_order_relaxed);
        } else {
          if (old && counters_.shadow_mismatches.fetch_add(1, std::memory_order_relaxed) == 0) {
            guest_error("the restart shadow's request at index {} is not the ring's; doing the ring's (the shadow "
                        "is of an earlier ring)", idx);
          }
          shadow_->put(idx, *req);
        }
      }
      const std::uint32_t slot = ring_slot(idx, ring_.size());
      const std::uint64_t now = now_us();
      pending_[slot].taken_us = now;
      if (idle_since_us_ != 0) {
        const std::uint64_t gap = now - idle_since_us_;
        if (gap >= kLongIdleGapUs) {
          counters_.long_idle_gaps.fetch_add(1, std::memory_order_relaxed);
        } else {
          counters_.idle_gaps.fetch_add(1, std::memory_order_relaxed);
          counters_.idle_gap_us.fetch_add(gap, std::memory_order_relaxed);
        }
        idle_since_us_ = 0;
      }
      Admit a = admit(*req, slot);
      if (a == Admit::ring_busy) {
        // Retry the same request after the submit admit() did.
        a = admit(*req, slot);
        if (a == Admit::ring_busy) {
          disable("io_uring submission queue stuck");
          return;
        }
      }
    }
    if (disabled() || !arm) return;
    // Nothing more right now: re-arm req_event and look once more (no lost wake-up).
    auto more = ring_.final_check_for_requests();
    if (!more) {
      disable(to_string(more.error()));
      return;
    }
    if (!*more) return;
  }
}

bool BlkifQueue::poll_once() noexcept { return step(/*arm=*/true); }

bool BlkifQueue::step(bool arm) noexcept {
  io_.reap([this](std::uint64_t user, int res) { complete(static_cast<std::uint32_t>(user), res); });
  if (!disabled() && draining_) drain_ring(arm);
  if (io_.in_flight() > 0) {
    if (auto s = io_.submit(); !s) disable("io_uring submit failed");
  }
  retire();
  if (!disabled()) push_and_notify();
  return !disabled();
}

// Something for step() to do: a completion, or (while taking requests) a request in the ring.
bool BlkifQueue::work_ready() noexcept {
  if (io_.completions_ready()) return true;
  if (!draining_) return false;
  if (stop_requested_.load(std::memory_order_relaxed)) return true;
  auto n = ring_.unconsumed_requests();
  return !n || *n != 0;  // a broken index is work too: step() disables the queue
}

void BlkifQueue::run() noexcept {
  pollfd fds[3] = {{evtchn_->wait_fd(), POLLIN, 0}, {io_.completion_fd(), POLLIN, 0}, {stop_.fd(), POLLIN, 0}};
  bool stopping = false;
  while (true) {
    if (!step(/*arm=*/false)) break;
    if (!stopping && stop_requested_.load(std::memory_order_acquire)) {
      stopping = true;  // finish what is in flight, answer it, then leave
      draining_ = false;
      continue;
    }
    if (stopping && io_.in_flight() == 0) break;
    // Spin only while no I/O of ours is in flight: spinning through it held the I/O up — at qd1
    // on a cloud volume it halved the IOPS (backends/README.md; likely because the CQE is posted
    // by task work that runs when this thread enters the kernel, and on two vCPUs the spinner
    // takes a CPU the completion needs — not proven). An I/O the kernel finished within the
    // submit (page cache, tmpfs) is not in flight: reap it first.
    if (io_.in_flight() > 0 && io_.completions_ready()) continue;
    const bool io_busy = io_.in_flight() > 0;
    if (!io_busy && poll_.spin([this] { return work_ready(); })) {
      counters_.poll_hits.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    // Going to sleep: ask for a kick (req_event) and look once more, so that no request that came
    // before it was armed is slept through; the same for completions (io_ring.h: the eventfd is
    // consumed, then the CQ looked at). The kicks so far go first: the look after them covers
    // what they announced, so a kick that wakes the sleep below came after it (kick_throttle.h).
    (void)evtchn_->consume();
    if (draining_) {
      auto more = ring_.final_check_for_requests();
      if (!more) {
        disable(to_string(more.error()));
        break;
      }
      if (*more) continue;
    }
    if (io_.ready_before_sleep()) continue;
    counters_.poll_misses.fetch_add(1, std::memory_order_relaxed);
    // A port muted for kicking with nothing new (kick_throttle.h) stays out of the poll set
    // until its mute ends; what it sent meanwhile waits in its eventfd.
    const int mute_ms = kicks_.mute_left_ms(now_us());
    const int first = mute_ms >= 0 ? 1 : 0;
    fds[0].revents = 0;
    if (::poll(fds + first, (stopping ? 2 : 3) - first, mute_ms) < 0 && errno != EINTR) {
      disable("poll failed");
      break;
    }
    if (!io_busy) poll_.after_sleep();  // a wait for our own I/O says nothing about the ring
    counters_.wakeups.fetch_add(1, std::memory_order_relaxed);
    if (fds[0].revents) {
      (void)evtchn_->consume();
      // The ring was empty when the thread armed req_event, after the kicks before were
      // consumed: a kick that finds it empty still brought nothing (while the queue takes
      // requests; a broken index is news: step() disables the queue).
      const auto n = ring_.unconsumed_requests();
      const bool news = !draining_ || !n || *n != 0;
      if (!news) counters_.spurious_kicks.fetch_add(1, std::memory_order_relaxed);
      const std::uint64_t mutes = kicks_.mutes();
      kicks_.kicked(news, now_us());
      if (kicks_.mutes() != mutes) {
        counters_.kick_mutes.fetch_add(1, std::memory_order_relaxed);
        if (mutes == 0) {
          spdlog::warn("{}: the frontend keeps kicking with an empty ring (over {} times in a row): its event channel "
                       "is looked at less often for a while (each such kick doubles the pause, up to {} ms)",
                       name_, KickThrottle::kStreak, KickThrottle::kMaxMuteUs / 1000);
        }
      }
    }
    if (!stopping && fds[2].revents) {  // what the sleep had left, for the teardown line
      counters_.stop_in_flight.store(io_.in_flight(), std::memory_order_relaxed);
      counters_.stop_completed_unreaped.store(io_.completions_waiting(), std::memory_order_relaxed);
      counters_.stop_woke.store(1, std::memory_order_relaxed);
    }
  }
  // Disabled: wait for the kernel to finish with the guest's pages, answer nothing more.
  for (int i = 0; i < 100000 && io_.in_flight() > 0; ++i) {
    (void)io_.submit_and_wait(1);
    io_.reap([this](std::uint64_t user, int res) { complete(static_cast<std::uint32_t>(user), res); });
  }
  retire();
  if (!disabled()) push_and_notify();
}

}  // namespace xpv::blkback
