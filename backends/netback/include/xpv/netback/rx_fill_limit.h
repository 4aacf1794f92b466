// RxFillLimit — how far ahead of the guest netback may fill its rx ring: byte queue limits (BQL,
// Linux's dynamic queue limits) for a guest's receive ring instead of a NIC's transmit ring.
//
// Why: everything netback puts into the guest's rx ring waits there in arrival order until the
// guest's NAPI poll gets to it. With the ring full of one bulk flow's data (Linux netfront keeps
// 256 buffers posted; a guest that is behind leaves ~120 of them filled), the ACKs of the
// guest's own sending stream wait behind all of it — the guest sender's round trip grows by that
// backlog, and with both directions busy its transmit starves. Packets netback has not put into
// the ring yet wait in RxFlowQueue instead, where a sparse flow goes first (rx_flow_queue.h). So
// the ring should hold just enough to keep the guest busy, and the rest wait where they can be
// ordered — as BQL keeps a NIC's ring short so that the qdisc (fq_codel) orders what waits.
//
// What netback can see: `backlog` = slots the guest has not given back yet (ring size - buffers
// posted and unused; Linux netfront re-posts every buffer it consumed at the end of each poll),
// and whether the guest is idle waiting for us (it re-armed its response event at rsp_prod + 1:
// every response published has been consumed). Pure logic, no clock of its own, no I/O:
//
//   observe(backlog, guest_idle, now) at the start of each rx turn
//     │ guest idle and packets were held back by the limit since the last look ─► starved:
//     │        limit = min(2 * limit, ring)        (the guest waited for packets we kept back)
//     │ else: remember the smallest backlog seen in this period
//     ▼
//   a period (kPeriodUs) without starvation ─► limit -= that smallest backlog (never below
//            min_slots): the guest always had at least that much left when we came back, so it
//            would not have run dry with that much less ahead of it
//   held_back() — called when the limit, not a lack of posted buffers, stops a packet
//
// Holding packets back only pays when there is something to put ahead of them: with one flow
// (a lone bulk stream into the guest) it only costs — a second copy through the flow queue and
// a guest that idles more often (measured: host->guest alone at 0.68–0.98 of the whole ring's
// rate in the testbed, backends/README.md).
// So the limit holds back only while the packets delivered are of more than one flow
// (saw_flow(): a packet of another flow than the one before keeps it engaged for the next
// kMixedPackets packets); otherwise usable() is every posted buffer.
//
// The limit only ever holds back what the guest has not consumed yet: a guest that keeps up
// (consumes everything between our looks) never sees it, and one that idles while we hold
// packets back doubles it at once. Starts at the whole ring (no limit) and comes down only while
// the guest is behind. Off unless the daemon's XPV_NETBACK_RX_FILL=adaptive (not shown to be a
// gain yet). Not thread-safe (one data-plane thread).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace xpv::netback {

class RxFillLimit {
 public:
  static constexpr std::uint64_t kPeriodUs = 20'000;  // how long a backlog must persist to shrink

  // `ring` slots in the guest's rx ring; the limit stays within [min(min_slots, ring), ring].
  // `adaptive` false: the limit is the whole ring, always (netback's behaviour before the limit).
  // `period_us`: see kPeriodUs (0: every look ends a period — unit tests).
  RxFillLimit(std::size_t ring, std::size_t min_slots, bool adaptive, std::uint64_t period_us = kPeriodUs) noexcept
      : ring_(ring), min_(std::min(min_slots, ring)), adaptive_(adaptive), period_us_(period_us), limit_(ring) {}

  static constexpr std::uint32_t kMixedPackets = 64;

  std::size_t limit() const noexcept { return limit_; }
  bool adaptive() const noexcept { return adaptive_; }
  // Whether the limit holds anything back now (adaptive, and packets of several flows lately).
  bool engaged() const noexcept { return adaptive_ && mixed_left_ > 0; }

  // Each packet delivered to the guest, by its flow (RxFlowQueue::flow_of).
  void saw_flow(std::uint32_t flow) noexcept {
    if (!seen_flow_) {  // the first packet is no change of flow
      seen_flow_ = true;
      last_flow_ = flow;
    } else if (flow != last_flow_) {
      last_flow_ = flow;
      mixed_left_ = kMixedPackets;
    } else if (mixed_left_ > 0) {
      --mixed_left_;
    }
  }

  // Of `posted` buffers the guest has posted and netback not yet filled (those netback holds
  // included), how many netback may fill now: those beyond what the limit keeps back.
  std::size_t usable(std::size_t posted) const noexcept {
    const std::size_t kept = kept_back();
    return posted > kept ? posted - kept : 0;
  }
  // Posted buffers (as in usable()) there must be before `need` of them are usable.
  std::size_t posted_needed(std::size_t need) const noexcept { return need + kept_back(); }

  // A packet waited although enough buffers were posted: the limit held it back.
  void held_back() noexcept {
    held_back_ = true;
    ++holds_;
  }

  void observe(std::size_t backlog, bool guest_idle, std::uint64_t now_us) noexcept {
    if (!adaptive_) return;
    backlog = std::min(backlog, ring_);
    if (!period_open_) {
      period_open_ = true;
      period_start_ = now_us;
      min_backlog_ = backlog;
    }
    if (guest_idle && held_back_) {
      limit_ = std::min(ring_, std::max(limit_ * 2, min_));
      ++grows_;
      period_open_ = false;  // a new period starts at the next look
    } else {
      min_backlog_ = std::min(min_backlog_, backlog);
      if (now_us - period_start_ >= period_us_) {
        const std::size_t shrink = std::min(min_backlog_, limit_ - min_);
        if (shrink > 0) {
          limit_ -= shrink;
          ++shrinks_;
        }
        period_open_ = false;
      }
    }
    held_back_ = false;
  }

  std::uint64_t grows() const noexcept { return grows_; }
  std::uint64_t shrinks() const noexcept { return shrinks_; }
  std::uint64_t holds() const noexcept { return holds_; }

 private:
  std::size_t kept_back() const noexcept { return engaged() ? ring_ - limit_ : 0; }

  std::size_t ring_, min_;
  bool adaptive_;
  std::uint64_t period_us_;
  std::size_t limit_;
  bool held_back_ = false;
  bool period_open_ = false;
  std::uint64_t period_start_ = 0;
  std::size_t min_backlog_ = 0;
  std::uint64_t grows_ = 0, shrinks_ = 0, holds_ = 0;
  bool seen_flow_ = false;
  std::uint32_t last_flow_ = 0;
  std::uint32_t mixed_left_ = 0;
};

}  // namespace xpv::netback
