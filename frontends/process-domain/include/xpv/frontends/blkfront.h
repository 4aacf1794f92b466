// Blkfront — xpv's own blkif frontend, the data path (its xenbus negotiation is separate):
// turns blocking read/write/flush/discard calls from any thread (FUSE's worker threads) into
// blkif requests on a shared ring in the domain's memory, with data in pre-granted pages of that
// memory, and completes them from the domain's event handler.
//
//   caller thread: take a free slot → copy data into its granted pages → request → push
//                  (notify the backend if the ring says so) → wait for the slot's completion
//   event handler: pop responses → validate id → complete the slot → final check → repeat
//
// The data pages of each slot are granted to the backend once, at construction (the backend
// maps and unmaps them per request; what Linux calls persistent grants is only the frontend
// half). A response that names no outstanding request, or a bad ring index, breaks the device:
// every later call returns -EIO (DESIGN.md §5 — the guest side distrusts the backend too).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "xpv/domain/domain.h"
#include "xpv/frontends/fuse_disk.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/ring/blkif.h"

namespace xpv::frontends {

struct BlkfrontGeometry {
  std::uint64_t sectors = 0;  // 512-byte sectors, from the backend's `sectors` node
  bool readonly = false;
  bool flush = false;         // backend offers feature-flush-cache
  bool discard = false;       // backend offers feature-discard
};

struct BlkfrontConfig {
  std::uint32_t ring_page_order = 0;     // 2^order ring pages (≤ backend's max-ring-page-order)
  std::uint32_t indirect_segments = 0;   // 0: direct requests only (11 segments)
  domain::DomId backend = 0;
};

class Blkfront final : public BlockTarget {
 public:
  // Allocates and grants the ring and data pages in `dom`, allocates the event channel (unbound
  // for the backend) and registers its handler with `events`. Throws if the domain has no room.
  Blkfront(domain::Domain& dom, GuestEvents& events, BlkfrontConfig config);
  ~Blkfront() override;
  Blkfront(const Blkfront&) = delete;
  Blkfront& operator=(const Blkfront&) = delete;

  // What the xenbus negotiation publishes (ring-ref / ring-refN, event-channel).
  const std::vector<gnttab::GrantRef>& ring_refs() const noexcept { return ring_refs_; }
  domain::Port event_channel() const noexcept { return port_; }
  const BlkfrontConfig& config() const noexcept { return config_; }

  // Called once the backend is Connected and its geometry is known.
  void connect(const BlkfrontGeometry& g);
  bool broken() const noexcept;

  // BlockTarget (any thread).
  std::uint64_t size_bytes() const override { return geometry_.sectors * 512; }
  bool readonly() const override { return geometry_.readonly; }
  long read(std::uint64_t offset, std::span<std::uint8_t> out) override;
  long write(std::uint64_t offset, std::span<const std::uint8_t> in) override;
  int flush() override;
  int discard(std::uint64_t offset, std::uint64_t length) override;

  struct Stats {
    std::uint64_t requests = 0, notifications = 0, responses = 0;
  };
  Stats stats() const;

 private:
  struct Slot {
    std::vector<std::uint64_t> gfns;               // data pages
    std::vector<gnttab::GrantRef> refs;            // their grants (rw to the backend)
    std::vector<std::uint64_t> indirect_gfns;      // pages of indirect descriptors
    std::vector<gnttab::GrantRef> indirect_refs;
    bool busy = false, done = false;
    std::int16_t status = 0;
  };

  std::uint32_t max_segments() const noexcept;
  // Sector-aligned I/O of whole sectors through one slot at a time; returns 0 or -errno.
  int io_sectors(bool write, std::uint64_t sector, std::uint8_t* buf, std::uint64_t nsect);
  int submit_and_wait(const ring::BlkifRequest& req, std::uint32_t slot);
  std::uint32_t take_slot(std::unique_lock<std::mutex>& l);
  void on_event();

  domain::Domain& dom_;
  GuestEvents& events_;
  BlkfrontConfig config_;
  BlkfrontGeometry geometry_;
  std::uint64_t ring_gfn_ = 0;
  std::vector<gnttab::GrantRef> ring_refs_;
  domain::Port port_ = 0;

  mutable std::mutex lock_;             // ring, slots, stats
  std::condition_variable slot_free_;   // a slot was returned
  std::condition_variable completed_;   // a slot completed
  std::optional<ring::BlkifFrontRing> ring_;
  std::vector<Slot> slots_;
  bool broken_ = false;
  Stats stats_;
  std::mutex rmw_;  // serialises read-modify-write of partial sectors
};

}  // namespace xpv::frontends
