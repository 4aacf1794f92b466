// NetbackQueue — one netif queue of one vif (a tx ring, an rx ring, one or two event channels and
// one TAP fd), served by one data-plane thread (DESIGN.md §3).
//
//   guest TX: tx ring ──pop (copies)──► validate slots ──map grants ro──► VnetHdr + iovec
//             ──writev──► TAP (host stack)          responses in ring order, one per slot
//             (tx_respond_early: ──memcpy──► own buffer, unmap, respond, push + notify, then
//             ──writev──► TAP)
//   guest RX: with rx buffers for the largest packet (kRxDirectSlots) popped and mapped
//             writable: TAP ──readv (VnetHdr + frame) straight into those pages──► rx responses
//             (+ GSO extra-info slot); with fewer posted: TAP ──readv──► bounce buffer ──wait for
//             enough rx buffers──► memcpy into them.   request-rx-copy is the only mode offered
//             (netfront grants writable buffers; whether we copy or map is ours to choose)
//
// Fairness: a FairScheduler (fair_scheduler.h) decides which direction runs next; each turn
// moves a bounded batch (quantum bytes, max packets), responses are pushed after every turn (and
// with tx_respond_early after every tx packet), so a bulk TX stream cannot starve RX or the other
// way round.
//
// Flow-fair, bounded buffering (the XSA-392 lesson): while the frontend has not posted buffers for
// the next packet, netback keeps reading the TAP into an RxFlowQueue (rx_flow_queue.h) instead of
// leaving the backlog in the TAP's FIFO, where the packets of a sparse flow (the ACKs of the
// guest's own sending stream) would wait behind megabytes of a bulk one — when
// NetbackConfig::rx_drain is on. By default it is off: only the packet at the head is read (and
// waits there for buffers of its size) and the rest waits in the TAP, as under vhost-net, since
// the second copy cost more than the flow order was measured to give. The flow queue is bounded
// (RxFlowConfig::pool_bytes); making room drops from the fattest flow (counted in rx_overflow).
// Packets are delivered from it by deficit round robin over flows, new flows first; with buffers
// posted and nothing queued, packets go straight from the TAP into the guest's pages. Once the
// frontend has posted no buffers for the head packet for rx_stall_ms, everything queued and every
// packet read while it still posts none is dropped, counting each in rx_dropped.
// Optionally (NetbackConfig::rx_fill_adaptive), how many of the posted buffers netback fills
// ahead of a guest that is behind is bounded too, adaptively (RxFillLimit, rx_fill_limit.h: BQL
// for the guest's ring), so that what the guest cannot take yet waits in that flow-ordered queue
// rather than in the ring's arrival order.
//
// Guest faults, in DESIGN.md §5's tiers:
//   malformed packet (size < 14, a slot with offset+size past its page, more than
//   kXenNetifNrSlotsMin slots, fragment sizes above the packet size, bad/unknown extra info, a
//   grant that cannot be mapped, offload metadata that does not parse)
//                → NETIF_RSP_ERROR for each of its slots (NULL for extra slots) + rate-limited log
//   protocol violation (bad producer index; a packet whose slots are not all on the ring)
//                → the queue is disabled (sticky): nothing more is read from its rings.
// Notifications: only after pushing new responses, and only when the ring's event index asks
// (late-EOI frontends count an event without new responses as spurious).
//
// Resume (NetbackConfig::resume; a restarted xpv-netback reattaching at the shared rsp_prod): the
// requests in [rsp_prod, req_prod) at attach time were consumed by the dead backend, maybe used
// (a tx packet sent, an rx buffer filled), not answered. Worse, a response is copied into its
// request's slot before rsp_prod is published, so a kill between the two leaves a torn slot: a tx
// response (4 bytes) overwrote the request's gref (bytes 0..3; offset, flags, id, size intact), an
// rx response (8 bytes) the whole rx request except the id, which it repeats — but a GSO packet's
// extra-info response (8 bytes, no id) overwrote its slot's id too (with the extra's type and
// flags). So no gref from that range is ever used: each tx packet there is walked by its flags and
// answered OKAY without being sent (a lost packet: the dead backend may have sent it already; TCP
// retransmits), each rx buffer is given back with NETIF_RSP_ERROR (the frontend drops it and posts
// it again) and the frontend's id: the rx shadow's copy of the request taken at that index when it
// has one, else the slot's (a slot the dead backend never took is intact). Without a shadow, a
// torn extra-info slot's id is not the frontend's (Linux's netfront and xpv-front find an rx buffer
// by ring position and do not mind). Counted in
// resume_tx_dropped / resume_rx_returned. A grant flag the dead process left set on a tx buffer
// is cleared by the next normal use of that grant (GrantMapper's pin protocol).
//
// Threading: everything runs on the queue's thread (run() or poll_once()); stop() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <sys/uio.h>
#include <vector>

#include "xpv/kick_throttle.h"
#include "xpv/shadow_ring.h"
#include "xpv/domain/dom0_port.h"
#include "xpv/domain/event_fd.h"
#include "xpv/gnttab/mapper.h"
#include "xpv/netback/fair_scheduler.h"
#include "xpv/netback/fair_share.h"
#include "xpv/netback/flow_steering.h"
#include "xpv/netback/offload.h"
#include "xpv/netback/rate_limiter.h"
#include "xpv/netback/rx_fill_limit.h"
#include "xpv/netback/rx_flow_queue.h"
#include "xpv/ring/netif.h"

namespace xpv::netback {

// The rx requests a queue took, kept in a file across a restart (xpv/shadow_ring.h).
using RxShadow = xpv::ShadowRing<ring::NetifRxRequest>;

struct NetbackConfig {
  bool sg = true;        // frontend's feature-sg: rx packets may span several slots
  GsoCaps rx_gso;        // frontend's feature-gso-tcpv4/v6: rx packets may carry a GSO extra
  FairConfig fair;
  // The ledger shared with every other queue thread of this xpv-netback (fair_share.h); null:
  // this queue's two directions take turns with each other only.
  FairShare* share = nullptr;
  std::uint64_t share_group = 0;  // this vif's group in `share` (nonzero: one weight per vif)
  std::uint64_t rate_bytes = 0, rate_usec = 0;  // the vif's `rate` node; 0 = unlimited
  std::uint32_t rx_stall_ms = 1000;  // a packet waits this long for rx buffers, then drops start
  RxFlowConfig rx_queue;             // the host→guest backlog while the guest is behind
  // How far ahead of the guest its rx ring is filled (rx_fill_limit.h): always the whole ring
  // (false, the default), or adaptive (the daemon's XPV_NETBACK_RX_FILL=adaptive; an experiment:
  // measured in backends/README.md "Fairness", not yet shown to be a gain).
  bool rx_fill_adaptive = false;
  // While the frontend has not posted buffers for the next packet: read only that packet and
  // leave the rest in the TAP's FIFO, as vhost-net does (false, the default: one copy for nearly
  // every packet), or read the TAP's backlog into rx_queue (true, the daemon's
  // XPV_NETBACK_RX_DRAIN=all: flow order, a second copy for what waits there). Measured in
  // backends/README.md "Fairness". Always on with rx_fill_adaptive.
  bool rx_drain = false;
  // When a guest-tx packet is answered: after the TAP's writev has handed it to the host stack
  // (false, the default: zero copy, the data written straight from the guest's pages), or
  // before it (true, the daemon's XPV_NETBACK_TX_RESPOND=early: the packet is copied out, its
  // pages let go of, answered, pushed and the guest notified if it asked, then written — so the
  // guest's transmit completion does not wait for the host's receive path that writev runs. Linux
  // netback grant-maps all but a packet's first 128 bytes and answers when the host stack lets
  // go of the pages, which for traffic to the host itself is when its receive path copies them
  // early on (skb_orphan_frags_rx), before TCP runs. An experiment: backends/README.md
  // "Fairness".
  bool tx_respond_early = false;
  std::uint64_t rx_fill_period_us = RxFillLimit::kPeriodUs;
  // Which TAP queue a guest-tx packet is written on, and so which netif queue its flow's
  // host->guest packets come back on (flow_steering.h): null, its own (`tap_fd`); else the vif's
  // table decides, `queue_index` is this queue's index and `tap_fds` every TAP queue's fd by
  // index (the daemon's default with more than one queue; backends/README.md "Fairness").
  FlowSteering* steer = nullptr;
  unsigned queue_index = 0;
  std::span<const int> tap_fds;
  // The domain's IPv4 address (host byte order) when the vif's `ip` node gives it one: guest-tx
  // IPv4 and ARP from any other source, and VLAN-tagged frames, are dropped (tx_source.h, as
  // Xen's vif scripts' iptables rules). 0: nothing checked.
  std::uint32_t tx_source = 0;
  // Reattaching to rings a dead xpv-netback served (restart without a guest reboot): whatever it
  // left unanswered is answered without being used (see "Resume" above).
  bool resume = false;
};

// Per-queue counters (xpv top shows them). Written only by the queue thread; read racily.
struct NetbackCounters {
  std::atomic<std::uint64_t> tx_packets{0}, tx_bytes{0};  // guest → host, written to the TAP
  std::atomic<std::uint64_t> tx_errors{0};                 // packets answered NETIF_RSP_ERROR
  std::atomic<std::uint64_t> tx_dropped{0};                // the TAP refused the write
  std::atomic<std::uint64_t> tx_spoofed{0};                // dropped by the source check (tx_source)
  std::atomic<std::uint64_t> rx_packets{0}, rx_bytes{0};   // host → guest, delivered
  std::atomic<std::uint64_t> rx_dropped{0};                // no buffers in time / too big / bad offload
  std::atomic<std::uint64_t> rx_errors{0};                 // a grant copy into a buffer failed
  std::atomic<std::uint64_t> rx_overflow{0};               // dropped from the fattest flow: backlog full
  std::atomic<std::uint64_t> rx_queued{0};                 // delivered from the flow queue (not straight)
  std::atomic<std::uint64_t> rx_fill_limit{0};             // now: rx slots netback may keep filled ahead of the guest
  std::atomic<std::uint64_t> rx_fill_holds{0};             // packets the fill limit held back (buffers were posted)
  std::atomic<std::uint64_t> rx_fill_grows{0}, rx_fill_shrinks{0};  // the guest idled while held back / stayed behind
  // A packet waited for the guest's rx buffers (rx_waits), and of those waits, how many found the
  // buffers only when the stall's timeout looked (rx_waits_late): the guest had posted them
  // without a notification reaching this thread — a lost wake-up, or a guest that does not notify.
  std::atomic<std::uint64_t> rx_waits{0}, rx_waits_late{0};
  std::atomic<std::uint64_t> rate_limited{0};              // TX turns stopped by the credit
  std::atomic<std::uint64_t> tx_turns{0}, rx_turns{0}, notifications{0}, wakeups{0};
  std::atomic<std::uint64_t> fair_waits{0};  // turns given up to a queue thread that was behind
  // Kicks that woke a sleep and found the rings as they were, and how often a port was muted for
  // a streak of them (kick_throttle.h: a frontend kicking with nothing new).
  std::atomic<std::uint64_t> spurious_kicks{0}, kick_mutes{0};
  std::atomic<std::uint64_t> resume_tx_dropped{0};   // resume: tx packets answered, not sent
  std::atomic<std::uint64_t> resume_rx_returned{0};  // resume: rx buffers returned unused
  // Where the thread's time goes, and how long new guest-tx requests can have waited for it
  // while it was busy: the time from a look at the tx ring that found nothing (or the end of a
  // tx turn that emptied it, or poll's return after it could sleep) to the next look that found
  // requests. Time asleep in poll is not counted, nor the delay from being woken to getting a
  // CPU (schedstat's run delay has that); time runnable without a CPU while busy is.
  std::atomic<std::uint64_t> tx_turn_us{0}, rx_turn_us{0};
  std::atomic<std::uint64_t> tx_found{0};            // looks that found new tx requests
  std::atomic<std::uint64_t> tx_found_after_us{0};   // their summed time since the last look
  std::atomic<std::uint64_t> tx_found_after_max_us{0};
  std::atomic<std::uint64_t> tx_found_after_1ms{0};  // of them, after 1 ms or more
  std::atomic<std::uint64_t> tx_steered{0};  // guest-tx packets written on another queue's TAP queue (steer)
};

class NetbackQueue {
 public:
  static constexpr std::size_t kMaxRxBytes = 17 * ring::kXenPageSize;  // 64 KiB GSO + headers
  // Rx buffers held for reading a packet straight into them: its 17 pages + the GSO extra slot.
  static constexpr std::size_t kRxDirectSlots = kMaxRxBytes / ring::kXenPageSize + 1;

  // `mapper` belongs to this queue's thread from now on; the rings are attached to the mapped
  // ring pages; `rx_evtchn` null: one event channel for both rings. `tap_fd` (non-blocking, with
  // 10-byte vnet headers) is borrowed and must outlive the queue.
  // `rx_shadow` (may be null; borrowed, must outlive the queue): every rx request taken is
  // copied there first, and a resumed queue answers with the copy's id (see Resume).
  NetbackQueue(std::string name, gnttab::GrantMapper& mapper, ring::NetifTxBackRing tx,
               ring::NetifRxBackRing rx, std::unique_ptr<domain::EventChannel> tx_evtchn,
               std::unique_ptr<domain::EventChannel> rx_evtchn, int tap_fd, NetbackConfig cfg,
               RxShadow* rx_shadow = nullptr);
  ~NetbackQueue();
  NetbackQueue(const NetbackQueue&) = delete;
  NetbackQueue& operator=(const NetbackQueue&) = delete;

  // The data-plane loop: returns after stop() or once the queue is disabled.
  void run() noexcept;
  void stop() noexcept;

  // One pass without blocking (tests drive the queue with it). False once disabled.
  bool poll_once() noexcept;

  bool disabled() const noexcept { return disabled_.load(std::memory_order_acquire); }
  const NetbackCounters& counters() const noexcept { return counters_; }
  std::uint32_t rx_stall_ms() const noexcept { return cfg_.rx_stall_ms; }
  const std::string& name() const noexcept { return name_; }
  // How the frontend left the rings (BackRing::end_state): for the log line when the queue
  // stops; read them only when run() has returned.
  ring::NetifTxBackRing::EndState tx_end_state() const noexcept { return tx_.end_state(); }
  ring::NetifRxBackRing::EndState rx_end_state() const noexcept { return rx_.end_state(); }

 private:
  enum class Step { none, moved, dropped, blocked };
  struct Slot {
    std::uint16_t id = 0;
    bool extra = false;
    std::uint16_t offset = 0, len = 0;
    gnttab::GrantRef gref = 0;
  };

  bool pass() noexcept;  // one pass of the loop (run() and poll_once()); false: disabled
  bool serve() noexcept;  // pass() but for what a disabled queue leaves behind
  // Both our accounts idle in cfg_.share: a queue that is disabled or stopping waits for no turn,
  // so no other queue may wait for it (fair_share.h).
  void idle_in_share() noexcept;
  void resume_drain() noexcept;  // answers what a dead backend left unanswered (see Resume)
  std::uint64_t now_us() const noexcept;
  bool tx_has_work() noexcept;
  bool rx_has_work() noexcept;
  bool tx_turn() noexcept;
  bool rx_turn() noexcept;
  Step tx_one(std::size_t& bytes) noexcept;
  void tx_unmap() noexcept;  // lets go of the packet's pages (tx_maps_)
  void tx_header_from_copy(std::size_t hdr) noexcept;  // the first hdr bytes written from tx_hdr_
  void tx_written(ssize_t w, std::size_t size, std::size_t& bytes) noexcept;  // counts a writev
  int tx_fd(std::span<const std::uint8_t> head, std::size_t size) noexcept;  // the TAP fd to write on
  void rx_steer_seen(std::span<const std::uint8_t> head, std::size_t size) noexcept;  // tells cfg_.steer
  Step rx_one(std::size_t& bytes) noexcept;
  void rx_ingest(int max) noexcept;  // reads up to `max` packets from the TAP into rx_queue_
  Step rx_direct(std::size_t& bytes) noexcept;  // read one packet straight into held buffers
  bool rx_hold(std::size_t n) noexcept;         // at least n requests popped and mapped
  std::size_t rx_available() noexcept;          // held + unconsumed rx requests (0 on error)
  void rx_observe_guest() noexcept;             // feeds rx_fill_ at the start of an rx turn
  // Answers the first `need` held requests for a packet of rx_len_ bytes (its data already in
  // their pages unless `failed`), and lets go of them.
  void rx_respond(const NetifOffload& off, std::size_t data_slots, bool failed) noexcept;
  void tx_respond(std::int16_t status) noexcept;
  void push_and_notify() noexcept;
  void disable(const char* why) noexcept;
  // A guest's fault, logged rate-limited (the first 10, then one in 1000) against `logged`:
  // guest_error's budget for malformed packets, spoof_logged_'s for the source check's drops, so
  // a flood of one kind does not hide the other.
  template <class... Args>
  void guest_error_in(std::uint64_t& logged, const char* fmt, Args&&... args) noexcept;
  template <class... Args>
  void guest_error(const char* fmt, Args&&... args) noexcept {
    guest_error_in(guest_errors_logged_, fmt, std::forward<Args>(args)...);
  }

  std::string name_;
  gnttab::GrantMapper& mapper_;
  ring::NetifTxBackRing tx_;
  ring::NetifRxBackRing rx_;
  std::unique_ptr<domain::EventChannel> tx_evtchn_, rx_evtchn_;
  int tap_;
  NetbackConfig cfg_;
  FairScheduler sched_;
  FairShare::Account* share_acc_[2] = {nullptr, nullptr};  // [Dir]: our accounts in cfg_.share
  std::size_t turn_bytes_ = 0;                              // bytes moved in the current turn
  std::size_t turn_packets_ = 0;                            // packets it moved or dropped
  CreditLimiter limiter_;
  domain::EventFd stop_;
  std::atomic<bool> disabled_{false};
  NetbackCounters counters_;
  std::uint64_t guest_errors_logged_ = 0;
  std::uint64_t spoof_logged_ = 0;
  std::string tx_source_str_;  // cfg_.tx_source as a.b.c.d (made once, for the drops' log line)

  // TX state.
  std::optional<ring::NetifTxRequest> tx_held_;  // first slot of a packet waiting for credit
  bool tx_rate_blocked_ = false;
  bool tx_resp_pending_ = false;
  std::vector<Slot> tx_slots_;
  std::vector<gnttab::GrantHandle> tx_maps_;
  std::vector<iovec> tx_iov_;
  VnetHdr tx_vnet_{};
  std::vector<std::uint8_t> tx_hdr_;  // the first bytes of a packet, contiguous, for parsing
  std::vector<std::uint8_t> tx_copy_;  // tx_respond_early: the packet, copied out of the guest

  // RX state.
  VnetHdr rx_vnet_{};
  RxFlowQueue rx_queue_;          // read from the TAP, not delivered yet
  RxFillLimit rx_fill_;           // how many posted buffers we may fill (rx_fill_limit.h)
  std::size_t rx_len_ = 0;        // bytes of the packet being answered
  bool tap_readable_ = true;
  bool rx_stalled_ = false;       // the head of rx_queue_ waits for rx buffers
  std::uint64_t rx_stall_since_ = 0;
  bool rx_stall_dropped_ = false;  // this wait's timeout came and dropped (not a late wake-up)
  void rx_wait_ends() noexcept;    // buffers came: rx_stalled_ off, a late end counted
  ring::RingIdx rx_need_ = 0;     // more rx requests the head packet needs
  bool rx_resp_pending_ = false;
  // Rx requests popped from the ring and mapped (writable), not answered yet, in ring order:
  // the buffers the next packets go into. At most kRxDirectSlots; page empty if the grant could
  // not be mapped (a packet that would use it is answered NETIF_RSP_ERROR).
  struct RxHeld {
    ring::NetifRxRequest req{};
    gnttab::GrantHandle handle = 0;
    std::span<std::uint8_t> page;
  };
  std::vector<RxHeld> rx_held_;
  std::vector<iovec> rx_iov_;
  bool busy_ = false;             // poll_once left work behind: do not sleep
  RxShadow* rx_shadow_ = nullptr;  // borrowed; null: none
  // Spurious kicks (kick_throttle.h), per event channel (the tx one carries rx kicks too when
  // there is no rx one). Before it arms and looks at the rings for the last time, serve()
  // consumes the kicks so far and notes the rings' unconsumed requests: a kick that wakes the
  // sleep then and finds them as noted brought nothing.
  struct RingCounts {
    std::int64_t tx = -1, rx = -1;  // -1: a broken index (news: pass() disables the queue)
    bool operator==(const RingCounts&) const = default;
  };
  RingCounts ring_counts() noexcept;
  void kicked(KickThrottle& throttle, bool news) noexcept;
  KickThrottle tx_kicks_, rx_kicks_;
  RingCounts asleep_counts_;
  bool tx_seen_ = false;          // the last look at the tx ring found requests
  std::uint64_t tx_looked_us_ = 0;  // when the tx ring was last looked at (or poll returned)
  ring::RingIdx tx_resume_ = 0, rx_resume_ = 0;  // slots left to answer unused (resume)
  // The frontend waits for responses already published on that ring (a dead backend's; see
  // BackRing::response_event_passed): notified once, at the first pass.
  bool tx_notify_owed_ = false, rx_notify_owed_ = false;
};

}  // namespace xpv::netback
