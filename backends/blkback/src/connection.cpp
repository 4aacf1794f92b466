#include "xpv/blkback/connection.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>

#include "xpv/gnttab/abi.h"
#include "xpv/gnttab/mapper.h"
#include "xpv/ring/blkif.h"
#include "xpv/thread_name.h"

namespace xpv::blkback {

std::string VbdConnection::shadow_path(const std::string& dir, const std::string& name, unsigned q) {
  return fmt::format("{}/{}-q{}.shadow", dir, name, q);
}

VbdConnection::VbdConnection(std::string name, std::shared_ptr<domain::ForeignDomain> dom,
                             const Disk& disk, const std::vector<QueueRings>& queues,
                             QueueConfig config, const std::string& shadow_dir, bool resume,
                             std::function<void(unsigned)> on_exit)
    : name_(std::move(name)), dom_(std::move(dom)), on_exit_(std::move(on_exit)) {
  try {
    // A guest grows its grant table as it needs refs: look at its frames as they are now.
    dom_->refresh_grant_frames();
    for (unsigned i = 0; i < queues.size(); ++i) add_queue(i, queues[i], disk, config, shadow_dir, resume);
  } catch (...) {
    teardown();
    throw;
  }
  // Threads last: a failure above leaves nothing running. One that cannot be started (no
  // threads or memory left) stops and joins those started before it: this device fails to
  // connect, the daemon goes on (a joinable std::thread destroyed would end the process).
  try {
    for (unsigned i = 0; i < queues_.size(); ++i) {
      Queue& q = *queues_[i];
      q.thread = std::thread([this, &q, i] {
        set_thread_name(name_ + "-q" + std::to_string(i));  // vbd<N>.<devid>-q<i>, as top -H shows it
        q.queue->run();
        if (on_exit_) on_exit_(i);
      });
    }
  } catch (...) {
    teardown();
    throw;
  }
}

VbdConnection::~VbdConnection() { teardown(); }

void VbdConnection::stop() noexcept {
  for (auto& q : queues_) {
    if (q->queue) q->queue->stop();
  }
}

bool VbdConnection::disabled() const noexcept {
  for (const auto& q : queues_) {
    if (q->queue && q->queue->disabled()) return true;
  }
  return false;
}

void VbdConnection::add_queue(unsigned index, const QueueRings& rings, const Disk& disk,
                              QueueConfig config, const std::string& shadow_dir, bool resume) {
  auto q = std::make_unique<Queue>();
  Queue& r = *q;
  queues_.push_back(std::move(q));
  const std::size_t pages = std::size_t{1} << rings.page_order;
  // Every request of a full ring may hold all its data grants mapped until its I/O completes,
  // plus the ring's pages and one request's indirect pages: a frontend that uses what was
  // advertised (order 4, 256 indirect segments: 131 072 grants) must not find the mapper full —
  // its reads and writes would fail with EIO.
  const std::size_t per_request = std::max<std::size_t>(ring::kBlkifMaxSegmentsPerRequest, config.max_indirect_segments);
  const std::size_t handles = pages + std::size_t{ring::blkif_ring_size(rings.page_order)} * per_request +
                              ring::kBlkifMaxIndirectPagesPerRequest;
  if (handles > gnttab::GrantMapper::kMaxHandlesLimit) {  // not with the orders and segments offered now
    throw std::runtime_error(fmt::format("queue {}: a full ring may hold {} grants, more than a mapper can ({})", index,
                                         handles, gnttab::GrantMapper::kMaxHandlesLimit));
  }
  r.mapper = dom_->make_mapper(0, std::max(handles, gnttab::GrantMapper::kDefaultMaxHandles));
  if (rings.refs.size() != pages) {
    throw std::runtime_error(fmt::format("queue {}: {} ring refs for ring-page-order {}", index,
                                         rings.refs.size(), rings.page_order));
  }
  std::vector<std::span<std::uint8_t>> spans;
  for (const gnttab::GrantRef ref : rings.refs) {
    auto m = r.mapper->map(ref, /*readonly=*/false);
    if (!m) {
      throw std::runtime_error(fmt::format("queue {}: mapping ring ref {}: {}", index, ref,
                                           gnttab::to_string(m.error())));
    }
    r.ring_handles.push_back(m->handle());
    spans.push_back(m->writable());
  }
  std::span<std::uint8_t> ring_bytes;
  bool consecutive = true;
  for (std::size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].data() != spans[0].data() + i * gnttab::kFrameSize) consecutive = false;
  }
  if (consecutive) {
    ring_bytes = std::span<std::uint8_t>(spans[0].data(), pages * gnttab::kFrameSize);
  } else {
    // The frames are pinned now: read them from the grant entries and map them back to back.
    std::vector<std::uint64_t> gfns;
    const auto& frames = dom_->grant_frames();
    for (const gnttab::GrantRef ref : rings.refs) {
      auto* entry = frames.at(ref / gnttab::kEntriesPerFrame).data() +
                    (ref % gnttab::kEntriesPerFrame) * sizeof(gnttab::GrantEntryV1);
      gfns.push_back(std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(entry + 4))
                         .load(std::memory_order_acquire));
    }
    r.scattered = dom_->map_contiguous(gfns);
    ring_bytes = r.scattered.bytes();
  }
  // Attach at the shared rsp_prod: a fresh ring has rsp_prod == req_prod; a ring a dead backend
  // served resumes with its unanswered requests (queue.h).
  auto back = ring::BlkifBackRing::attach(ring_bytes);
  if (!back) {
    throw std::runtime_error(fmt::format("queue {}: the shared ring is unusable: {}", index,
                                         ring::to_string(back.error())));
  }
  const std::string path = shadow_path(shadow_dir, name_, index);
  r.shadow = std::make_unique<ShadowRing>(resume ? ShadowRing::open(path, back->size())
                                                 : ShadowRing::create(path, back->size()));
  if (resume) {
    spdlog::info("{}: queue {}: resuming at rsp_prod {}, {} request(s) left unanswered{}", name_, index,
                 back->req_cons(), back->unconsumed_requests().value_or(0),
                 r.shadow->reused() ? "" : " (no shadow file: taking them from the ring)");
  }
  std::unique_ptr<domain::Dom0Port> port;
  try {
    port = dom_->bind(rings.event_channel, &r.dom0_port);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("queue {}: binding event channel {}: {}", index,
                                         rings.event_channel, e.what()));
  }
  r.bound = true;
  const std::string qn = queues_.size() == 1 && index == 0 ? name_ : fmt::format("{}q{}", name_, index);
  r.queue = std::make_unique<BlkifQueue>(qn, disk, *r.mapper, std::move(*back), std::move(port), config,
                                         r.shadow.get());
}

void VbdConnection::join() noexcept {
  stop();
  for (auto& q : queues_) {
    if (q->thread.joinable()) q->thread.join();
  }
  for (auto& q : queues_) {
    if (q->queue) {
      // What this queue did in its life: the log line an operator reads after a run.
      const QueueCounters& c = q->queue->counters();
      const auto end = q->queue->ring_end_state();
      auto n = [](const std::atomic<std::uint64_t>& v) { return v.load(std::memory_order_relaxed); };
      spdlog::info("{}: requests {} (reads {}, writes {}, flushes {}, discards {}; errors {}, unsupported {}); "
                   "sectors read {} written {}; batches {}, notifications {}, wakeups {} ({} by kicks with nothing new, "
                   "the port muted {} times), held {}; "
                   "polling: {} waits ended spinning, {} slept; answered {} us after being taken on average; "
                   "{} taken with nothing outstanding, {} us after the push that answered the last on average "
                   "(and {} after {} ms or more); ring left: {} published and not taken, {} taken and not answered, "
                   "{} answered since the frontend last armed its event (req_prod {}, rsp_prod {}, rsp_event {}); {}",
                   q->queue->name(), n(c.requests), n(c.reads), n(c.writes), n(c.flushes), n(c.discards),
                   n(c.errors), n(c.unsupported), n(c.sectors_read), n(c.sectors_written), n(c.batches),
                   n(c.notifications), n(c.wakeups), n(c.spurious_kicks), n(c.kick_mutes), n(c.held), n(c.poll_hits), n(c.poll_misses),
                   n(c.answered) == 0 ? 0 : n(c.answered_us) / n(c.answered), n(c.idle_gaps),
                   n(c.idle_gaps) == 0 ? 0 : n(c.idle_gap_us) / n(c.idle_gaps), n(c.long_idle_gaps),
                   kLongIdleGapUs / 1000, end.untaken, q->queue->unanswered(), end.responses_since_armed, end.req_prod,
                   end.rsp_prod, end.rsp_event,
                   n(c.stop_woke) == 0 ? std::string("the stop came while it was awake")
                                       : fmt::format("the stop woke it from a sleep with {} I/O in flight, {} of them "
                                                     "completed and not reaped",
                                                     n(c.stop_in_flight), n(c.stop_completed_unreaped)));
    }
    // Waits for the kernel to finish with the guest's pages: the I/O a queue disabled in the
    // middle (a ring protocol violation) left in flight.
    q->queue.reset();
  }
}

void VbdConnection::teardown() noexcept {
  join();
  for (auto& q : queues_) {
    for (auto h : q->ring_handles) (void)q->mapper->unmap(h);
    q->ring_handles.clear();
    q->scattered = {};
    q->mapper.reset();
    if (q->bound) {
      try {
        dom_->unbind(q->dom0_port);
      } catch (const std::exception& e) {
        // The domain went away: its end of the channel went with it.
        spdlog::debug("{}: unbinding port {}: {}", name_, q->dom0_port, e.what());
      }
      q->bound = false;
    }
    if (q->shadow && forget_shadows_) q->shadow->remove();
    q->shadow.reset();
  }
  queues_.clear();
}

}  // namespace xpv::blkback
