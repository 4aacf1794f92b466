// VbdConnection — the data plane of one connected virtual block device: for each of its queues
// the shared ring mapped from the frontend's grants, the interdomain event channel bound, a
// BlkifQueue and the thread that runs it (DESIGN.md §3: one data-plane thread per queue).
//
// Ring pages (blkif ring-page-order, ring-ref0..N-1): BackRing needs them virtually contiguous.
// Each ref is mapped (pinned) through the queue's GrantMapper; when the granted frames are
// consecutive in the domain's memfd those page spans already follow each other in our mapping
// of it and are used as one span (checked, never assumed); otherwise the frames — read from the
// pinned grant entries, which the granter may not change while pinned — are mapped back to back
// with ForeignDomain::map_contiguous. The pins stay until the connection goes.
//
// Threading: built and destroyed on the control thread (the ForeignDomain is a control-plane
// object); each queue's mapper and BlkifQueue belong to its thread between start and join.
// on_exit(queue index) is called on the queue's thread when its run() returned.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "xpv/blkback/disk.h"
#include "xpv/blkback/queue.h"
#include "xpv/blkback/shadow_ring.h"
#include "xpv/domain/foreign_domain.h"
#include "xpv/domain/memory.h"
#include "xpv/gnttab/mapper.h"

namespace xpv::blkback {

// What a frontend published for one queue (its xenstore directory, or queue-N/ under it).
struct QueueRings {
  std::uint32_t page_order = 0;
  std::vector<gnttab::GrantRef> refs;  // 2^page_order refs
  std::uint32_t event_channel = 0;     // the frontend's port, unbound for us
};

class VbdConnection {
 public:
  // Maps every queue's ring, binds its event channel and starts its thread. `resume`: a
  // restarted backend reattaching to rings a dead one served (the shadow files in `shadow_dir`
  // are reused); otherwise they are made afresh. Throws std::runtime_error (a message for the
  // xenstore error node) — nothing is left mapped or bound then.
  VbdConnection(std::string name, std::shared_ptr<domain::ForeignDomain> dom, const Disk& disk,
                const std::vector<QueueRings>& queues, QueueConfig config,
                const std::string& shadow_dir, bool resume, std::function<void(unsigned)> on_exit);
  // stop(), join, then unmap and unbind. The shadow files stay (see forget_shadows()).
  ~VbdConnection();
  VbdConnection(const VbdConnection&) = delete;
  VbdConnection& operator=(const VbdConnection&) = delete;

  // Asks every queue to finish what is in flight and leave (non-blocking).
  void stop() noexcept;
  // stop(), then waits until every queue has answered what it had in flight and left, and its
  // I/O is done (a queue disabled in the middle leaves some): the part of the teardown that can
  // take as long as the storage does, and the only part that may run on another thread than the
  // control thread (nothing else may use the connection meanwhile; queue() and disabled() are
  // gone after it). Logs each queue's counters. Idempotent; the destructor does the rest
  // (unmap the rings, unbind, the shadows).
  void join() noexcept;
  // The device closed for good: nothing is left to redo, the shadow files go with it.
  void forget_shadows() noexcept { forget_shadows_ = true; }
  // A queue was disabled (protocol violation).
  bool disabled() const noexcept;
  std::size_t queues() const noexcept { return queues_.size(); }
  const BlkifQueue& queue(std::size_t i) const noexcept { return *queues_[i]->queue; }
  const std::string& name() const noexcept { return name_; }

  // Queue q's restart shadow in `dir` ("vbd1.51712-q0.shadow": the form backend_main.h's
  // restart_file_owner and sweep_orphan_files read).
  static std::string shadow_path(const std::string& dir, const std::string& name, unsigned q);

 private:
  struct Queue {
    std::unique_ptr<gnttab::GrantMapper> mapper;
    std::vector<gnttab::GrantHandle> ring_handles;
    domain::ContiguousMapping scattered;  // only when the ring's frames are not consecutive
    std::uint32_t dom0_port = 0;
    bool bound = false;
    std::unique_ptr<ShadowRing> shadow;
    std::unique_ptr<BlkifQueue> queue;
    std::thread thread;
  };
  void add_queue(unsigned index, const QueueRings& rings, const Disk& disk, QueueConfig config,
                 const std::string& shadow_dir, bool resume);
  void teardown() noexcept;

  std::string name_;
  std::shared_ptr<domain::ForeignDomain> dom_;
  std::function<void(unsigned)> on_exit_;
  std::vector<std::unique_ptr<Queue>> queues_;
  bool forget_shadows_ = false;
};

}  // namespace xpv::blkback
