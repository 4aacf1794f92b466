// The blkif frontend device over its queues (see blkfront.h; one ring is blkfront_queue.cpp).
#include "xpv/frontends/blkfront.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "xpv/thread_name.h"

namespace xpv::frontends {

using namespace xpv::ring;

namespace {
constexpr std::uint64_t kSector = 512;
}  // namespace

Blkfront::Blkfront(domain::Domain& dom, GuestEvents& events, BlkfrontConfig config) : config_(config) {
  if (config_.queues < 1 || config_.queues > kBlkfrontMaxQueues) {
    throw std::invalid_argument("blkfront: queues must be 1.." + std::to_string(kBlkfrontMaxQueues));
  }
  BlkfrontQueueConfig q;
  q.poll_max = config_.poll_max;
  q.ring_page_order = config_.ring_page_order;
  q.indirect_segments = config_.indirect_segments;
  q.backend = config_.backend;
  // A throw here destroys the queues made so far (members), which give back what they hold.
  for (std::uint32_t i = 0; i < config_.queues; ++i) {
    queues_.push_back(std::make_unique<BlkfrontQueue>(dom, events, q, broken_));
  }
  if (config_.completion_threads) {
    for (std::size_t i = 0; i < queues_.size(); ++i) {
      completers_.emplace_back([q = queues_[i].get(), i] {
        set_thread_name("blkfront-c" + std::to_string(i));
        q->run_completions();
      });
    }
  }
}

Blkfront::~Blkfront() {
  for (auto& q : queues_) q->stop_completions();
  for (auto& t : completers_) t.join();
}

unsigned Blkfront::complete(std::uint32_t queue, unsigned min) {
  if (config_.completion_threads) throw std::logic_error("blkfront: complete() with completion threads running");
  return queues_.at(queue)->complete(min);
}

bool Blkfront::start_read(std::uint64_t offset, std::span<std::uint8_t> out, Done& done) {
  return start_io(false, offset, out.data(), out.size(), done);
}

bool Blkfront::start_write(std::uint64_t offset, std::span<const std::uint8_t> in, Done& done) {
  // Write data is copied into the slot's granted pages before start() returns.
  return start_io(true, offset, const_cast<std::uint8_t*>(in.data()), in.size(), done);
}

void Blkfront::polling(bool on) {
  if (completers_.empty()) return;
  for (auto& q : queues_) q->polling(on);
}

void Blkfront::poll() {
  if (completers_.empty()) return;
  for (auto& q : queues_) (void)q->poll();
}

bool Blkfront::start_io(bool write, std::uint64_t offset, std::uint8_t* buf, std::uint64_t len, Done& done) {
  if (completers_.empty() || (write && readonly()) || !one_request(offset, len)) return false;
  // `done` stays the caller's unless the request started.
  auto held = std::make_shared<Done>(std::move(done));
  // The caller's queue first; if all its slots are in flight, the next queue with a free slot
  // (an asynchronous caller must not wait for one: FUSE's io_uring worker starts every request
  // of its CPU's queue from one thread).
  const std::size_t first = my_queue_index();
  for (std::size_t k = 0; k < queues_.size(); ++k) {
    const int rc = queues_[(first + k) % queues_.size()]->start(
        write, offset / kSector, buf, len / kSector, [held, len](int r) { (*held)(r == 0 ? static_cast<long>(len) : r); });
    if (rc == 0) return true;
    if (rc != -EBUSY) break;
  }
  done = std::move(*held);
  return false;
}

void Blkfront::connect(const BlkfrontGeometry& g) { geometry_ = g; }

Blkfront::Stats Blkfront::stats() const {
  Stats sum;
  for (const auto& q : queues_) {
    const Stats s = q->stats();
    sum.requests += s.requests;
    sum.notifications += s.notifications;
    sum.responses += s.responses;
    sum.polled += s.polled;
    sum.async_requests += s.async_requests;
  }
  return sum;
}

Blkfront::Stats Blkfront::queue_stats(std::uint32_t queue) const { return queues_.at(queue)->stats(); }

std::size_t Blkfront::my_queue_index() const noexcept {
  // Process-wide, so a thread keeps one ordinal for every Blkfront (see blkfront.h).
  static std::atomic<std::uint32_t> next_ordinal{0};
  thread_local const std::uint32_t ordinal = next_ordinal.fetch_add(1, std::memory_order_relaxed);
  return ordinal % queues_.size();
}

BlkfrontQueue& Blkfront::my_queue() noexcept { return *queues_[my_queue_index()]; }

int Blkfront::io_sectors(bool write, std::uint64_t sector, std::uint8_t* buf, std::uint64_t nsect) {
  BlkfrontQueue& q = my_queue();
  const std::uint64_t max_sect = q.max_sectors();
  while (nsect > 0) {
    const std::uint64_t n = std::min(nsect, max_sect);
    if (int rc = q.transfer(write, sector, buf, n); rc != 0) return rc;
    sector += n;
    nsect -= n;
    buf += n * kSector;
  }
  return 0;
}

long Blkfront::read(std::uint64_t offset, std::span<std::uint8_t> out) {
  if (offset > size_bytes() || out.size() > size_bytes() - offset) return -EINVAL;
  if (offset % kSector == 0 && out.size() % kSector == 0) {
    const int rc = io_sectors(false, offset / kSector, out.data(), out.size() / kSector);
    return rc ? rc : static_cast<long>(out.size());
  }
  const std::uint64_t first = offset / kSector;
  const std::uint64_t last = (offset + out.size() + kSector - 1) / kSector;
  std::vector<std::uint8_t> tmp((last - first) * kSector);
  if (int rc = io_sectors(false, first, tmp.data(), last - first); rc) return rc;
  std::memcpy(out.data(), tmp.data() + (offset - first * kSector), out.size());
  return static_cast<long>(out.size());
}

long Blkfront::write(std::uint64_t offset, std::span<const std::uint8_t> in) {
  if (readonly()) return -EROFS;
  if (offset > size_bytes() || in.size() > size_bytes() - offset) return -EINVAL;
  if (offset % kSector == 0 && in.size() % kSector == 0) {
    const int rc = io_sectors(true, offset / kSector, const_cast<std::uint8_t*>(in.data()), in.size() / kSector);
    return rc ? rc : static_cast<long>(in.size());
  }
  // A partial sector: read the covering sectors, patch, write them back (one at a time).
  std::lock_guard rmw(rmw_);
  const std::uint64_t first = offset / kSector;
  const std::uint64_t last = (offset + in.size() + kSector - 1) / kSector;
  std::vector<std::uint8_t> tmp((last - first) * kSector);
  if (int rc = io_sectors(false, first, tmp.data(), last - first); rc) return rc;
  std::memcpy(tmp.data() + (offset - first * kSector), in.data(), in.size());
  if (int rc = io_sectors(true, first, tmp.data(), last - first); rc) return rc;
  return static_cast<long>(in.size());
}

bool Blkfront::one_request(std::uint64_t offset, std::uint64_t len) const noexcept {
  return offset % kSector == 0 && len % kSector == 0 && len != 0 && len <= max_io_bytes() && offset <= size_bytes() &&
         len <= size_bytes() - offset;
}

int Blkfront::start(std::uint32_t queue, bool write, std::uint64_t offset, std::span<std::uint8_t> buf,
                    BlkfrontQueue::Done done) {
  if (queue >= queues_.size()) return -EINVAL;
  if (write && readonly()) return -EROFS;
  if (!one_request(offset, buf.size())) return -EINVAL;
  return queues_[queue]->start(write, offset / kSector, buf.data(), buf.size() / kSector, std::move(done));
}

// See blkfront.h, "Flush guarantee": one flush on the caller's queue covers every write
// acknowledged before this call, whatever queue carried it.
int Blkfront::flush() {
  if (!geometry_.flush || readonly()) return 0;  // no volatile cache to flush
  BlkifRequest req{};
  req.operation = kBlkifOpFlushDiskcache;
  return my_queue().simple(req);
}

int Blkfront::discard(std::uint64_t offset, std::uint64_t length) {
  if (readonly()) return -EROFS;
  if (!geometry_.discard) return -EOPNOTSUPP;
  if (offset > size_bytes() || length > size_bytes() - offset) return -EINVAL;
  // Whole sectors are discarded; the partial sectors at either end are written with zeros, so
  // the range reads back as zeros either way (what punch-hole promises).
  const std::uint64_t first = (offset + kSector - 1) / kSector;
  const std::uint64_t end = (offset + length) / kSector;
  if (first >= end) {
    std::vector<std::uint8_t> zeros(length, 0);
    const long w = write(offset, zeros);
    return w < 0 ? static_cast<int>(w) : 0;
  }
  if (offset < first * kSector) {
    std::vector<std::uint8_t> zeros(first * kSector - offset, 0);
    if (long w = write(offset, zeros); w < 0) return static_cast<int>(w);
  }
  if (offset + length > end * kSector) {
    std::vector<std::uint8_t> zeros(offset + length - end * kSector, 0);
    if (long w = write(end * kSector, zeros); w < 0) return static_cast<int>(w);
  }
  BlkifRequestDiscard d{};
  d.operation = kBlkifOpDiscard;
  d.sector_number = first;
  d.nr_sectors = end - first;
  return my_queue().simple(blkif_pack(d));
}

}  // namespace xpv::frontends
