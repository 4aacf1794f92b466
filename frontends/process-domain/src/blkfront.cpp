#include "xpv/frontends/blkfront.h"

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

std::uint64_t need_gfn(domain::Domain& dom, std::uint64_t n, const char* what) {
  auto g = dom.alloc_pages(n);
  if (!g) throw std::runtime_error(std::string("blkfront: the domain has no room for ") + what);
  return *g;
}
}  // namespace

std::uint32_t Blkfront::max_segments() const noexcept {
  return config_.indirect_segments ? config_.indirect_segments : kBlkifMaxSegmentsPerRequest;
}

Blkfront::Blkfront(domain::Domain& dom, GuestEvents& events, BlkfrontConfig config)
    : dom_(dom), events_(events), config_(config) {
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
  const std::uint64_t ring_pages = std::uint64_t{1} << config_.ring_page_order;
  ring_gfn_ = need_gfn(dom_, ring_pages, "the ring");
  auto front = BlkifFrontRing::init(dom_.pages(ring_gfn_, ring_pages));
  if (!front) throw std::runtime_error("blkfront: cannot set up the ring");
  ring_.emplace(std::move(*front));
  for (std::uint64_t i = 0; i < ring_pages; ++i) ring_refs_.push_back(grant(ring_gfn_ + i, false));

  slots_.resize(ring_->size());
  const std::uint32_t segs = max_segments();
  const std::uint32_t ind_pages = config_.indirect_segments ? blkif_indirect_pages(segs) : 0;
  for (Slot& s : slots_) {
    const std::uint64_t base = need_gfn(dom_, segs, "data pages");
    for (std::uint32_t i = 0; i < segs; ++i) {
      s.gfns.push_back(base + i);
      s.refs.push_back(grant(base + i, false));  // rw: reads land in them
    }
    if (ind_pages) {
      const std::uint64_t ib = need_gfn(dom_, ind_pages, "indirect pages");
      for (std::uint32_t i = 0; i < ind_pages; ++i) {
        s.indirect_gfns.push_back(ib + i);
        s.indirect_refs.push_back(grant(ib + i, true));  // the backend only reads descriptors
      }
    }
  }
  auto port = dom_.evtchn().alloc_unbound(config_.backend);
  if (!port) throw std::runtime_error("blkfront: no event channel");
  port_ = *port;
  events_.set_handler(port_, [this] { on_event(); });
}

Blkfront::~Blkfront() {
  events_.clear_handler(port_);
  (void)dom_.evtchn().close(port_);
  auto& grants = dom_.grants();
  auto end = [&](gnttab::GrantRef r) {
    if (!grants.end_access(r)) spdlog::warn("blkfront: grant {} still mapped by the backend; leaked", r);
  };
  for (Slot& s : slots_) {
    for (auto r : s.refs) end(r);
    for (auto r : s.indirect_refs) end(r);
    if (!s.gfns.empty()) dom_.free_pages(s.gfns.front(), s.gfns.size());
    if (!s.indirect_gfns.empty()) dom_.free_pages(s.indirect_gfns.front(), s.indirect_gfns.size());
  }
  for (auto r : ring_refs_) end(r);
  dom_.free_pages(ring_gfn_, ring_refs_.size());
}

void Blkfront::connect(const BlkfrontGeometry& g) {
  std::lock_guard l(lock_);
  geometry_ = g;
}

bool Blkfront::broken() const noexcept {
  std::lock_guard l(lock_);
  return broken_;
}

Blkfront::Stats Blkfront::stats() const {
  std::lock_guard l(lock_);
  return stats_;
}

std::uint32_t Blkfront::take_slot(std::unique_lock<std::mutex>& l) {
  for (;;) {
    if (broken_) return UINT32_MAX;
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

int Blkfront::submit_and_wait(const BlkifRequest& req, std::uint32_t slot) {
  std::unique_lock l(lock_);
  if (broken_) return -EIO;
  if (!ring_->produce_request(req)) {
    broken_ = true;  // more requests than slots: cannot happen unless our bookkeeping broke
    completed_.notify_all();
    return -EIO;
  }
  ++stats_.requests;
  if (ring_->push_requests()) {
    ++stats_.notifications;
    (void)dom_.evtchn().send(port_);
  }
  completed_.wait(l, [&] { return slots_[slot].done || broken_; });
  if (!slots_[slot].done) return -EIO;
  switch (slots_[slot].status) {
    case kBlkifRspOkay: return 0;
    case kBlkifRspEopnotsupp: return -EOPNOTSUPP;
    default: return -EIO;
  }
}

void Blkfront::on_event() {
  std::lock_guard l(lock_);
  for (int rounds = 0; rounds < 64 && !broken_; ++rounds) {
    for (;;) {
      auto rsp = ring_->pop_response();
      if (!rsp) {
        if (rsp.error() != RingError::empty) broken_ = true;
        break;
      }
      ++stats_.responses;
      // The backend is not trusted either: the id must name a slot that waits for an answer.
      if (rsp->id >= slots_.size() || !slots_[rsp->id].busy || slots_[rsp->id].done) {
        spdlog::error("blkfront: response for id {:#x} names no outstanding request", rsp->id);
        broken_ = true;
        break;
      }
      Slot& s = slots_[rsp->id];
      s.status = rsp->status;
      s.done = true;
    }
    if (broken_) break;
    auto more = ring_->final_check_for_responses();
    if (!more) {
      broken_ = true;
      break;
    }
    if (!*more) break;
  }
  completed_.notify_all();
}

int Blkfront::io_sectors(bool write, std::uint64_t sector, std::uint8_t* buf, std::uint64_t nsect) {
  const std::uint64_t max_sect = std::uint64_t{max_segments()} * kSectorsPerPage;
  while (nsect > 0) {
    const std::uint64_t n = std::min(nsect, max_sect);
    const auto nsegs = static_cast<std::uint32_t>((n + kSectorsPerPage - 1) / kSectorsPerPage);
    std::uint32_t id;
    {
      std::unique_lock l(lock_);
      id = take_slot(l);
    }
    if (id == UINT32_MAX) return -EIO;
    Slot& s = slots_[id];
    const std::uint64_t bytes = n * kSector;
    if (write) {
      for (std::uint32_t i = 0; i < nsegs; ++i) {
        const std::uint64_t len = std::min<std::uint64_t>(kPageSize, bytes - std::uint64_t{i} * kPageSize);
        std::memcpy(dom_.pages(s.gfns[i], 1).data(), buf + std::uint64_t{i} * kPageSize, len);
      }
    }
    auto seg = [&](std::uint32_t i) {
      const std::uint64_t left = n - std::uint64_t{i} * kSectorsPerPage;
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
    } else {
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
      req = blkif_pack(ind);
    }
    const int rc = submit_and_wait(req, id);
    if (rc == 0 && !write) {
      for (std::uint32_t i = 0; i < nsegs; ++i) {
        const std::uint64_t len = std::min<std::uint64_t>(kPageSize, bytes - std::uint64_t{i} * kPageSize);
        std::memcpy(buf + std::uint64_t{i} * kPageSize, dom_.pages(s.gfns[i], 1).data(), len);
      }
    }
    {
      std::lock_guard l(lock_);
      s.busy = false;
    }
    slot_free_.notify_one();
    if (rc != 0) return rc;
    sector += n;
    nsect -= n;
    buf += bytes;
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

int Blkfront::flush() {
  if (!geometry_.flush || readonly()) return 0;  // no volatile cache to flush
  std::uint32_t id;
  {
    std::unique_lock l(lock_);
    id = take_slot(l);
  }
  if (id == UINT32_MAX) return -EIO;
  BlkifRequest req{};
  req.operation = kBlkifOpFlushDiskcache;
  req.id = id;
  const int rc = submit_and_wait(req, id);
  {
    std::lock_guard l(lock_);
    slots_[id].busy = false;
  }
  slot_free_.notify_one();
  return rc;
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
  std::uint32_t id;
  {
    std::unique_lock l(lock_);
    id = take_slot(l);
  }
  if (id == UINT32_MAX) return -EIO;
  BlkifRequestDiscard d{};
  d.operation = kBlkifOpDiscard;
  d.id = id;
  d.sector_number = first;
  d.nr_sectors = end - first;
  const int rc = submit_and_wait(blkif_pack(d), id);
  {
    std::lock_guard l(lock_);
    slots_[id].busy = false;
  }
  slot_free_.notify_one();
  return rc;
}

}  // namespace xpv::frontends
