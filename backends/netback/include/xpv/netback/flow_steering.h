// FlowSteering — which netif queue of a multi-queue vif each busy flow's host→guest packets
// arrive on, chosen by xpv-netback instead of by chance.
//
// Who decides without it: the guest picks a tx queue per flow (Linux netfront: the flow's hash modulo
// the queue count), and the kernel's multi-queue TAP sends a flow's host→guest packets back to
// the TAP queue its packets were last *written* on (tun's flow table, keyed by a symmetric flow
// hash; entries age out after 3 s). netback writes each guest-tx packet on the TAP queue of the
// netif queue it came from, so a flow's two directions share one netif queue — and whether two
// busy flows share one is chance: with two queues, half of the time. When they do (iperf3's two
// flows of a `--bidir` or a two-process pair), one netback thread, one rx ring and one guest
// interrupt carry both, and the guest's sending flow waits: its ACKs queue in the rx ring behind
// the other flow's data, its tx completions behind that data's copies (backends/README.md
// "Fairness": pairs on one queue 0.21–0.27 min/max, on two 0.54–0.57).
//
// What this does: netback writes a flow's guest-tx packets on a TAP queue it chooses, and the
// kernel then returns the flow's host→guest packets on that queue, hence to that netif queue's
// ring and thread (tested against the real tun: net_path_test `Tap.*`). Per vif, one table:
//
//   flow      = TCP or UDP over IPv4/IPv6, keyed by a symmetric hash of its addresses and ports
//               (both directions one flow); anything else is not steered
//   on_tx     = a guest-tx packet of the flow arrived on queue q: count its bytes; until the
//               flow is moved it is written where each packet came from (q), as without steering
//   on_rx     = a host→guest packet of the flow was read from queue q: count, note q
//   every period (the first call after it ends): a flow that moved ≥ heavy_bytes in it is busy;
//               its queue is where its host→guest packets were seen in the period (else where it
//               is written). If one queue holds two or more busy flows while another holds none,
//               the one of them with the most host→guest bytes — at least heavy_bytes, and at
//               least what it sent: a move changes where those go, nothing else — that netback
//               wrote in the period (it had guest-tx packets: the kernel learns the new queue
//               from the next one) is moved to the emptiest queue; then no move for `hold_us`.
//               A flow that sends more than it receives (its host→guest side is ACKs) is never
//               moved: that would split its ACKs from its data and relieve its queue of nothing
//   idle      = a flow not seen for idle_us is forgotten (tun forgets it after 3 s too); with the
//               table full, so is every flow that moved nothing in the period
//
// A single busy flow is never moved; nothing changes until two busy flows share a queue while
// another is idle. A move can reorder the few packets of the moved flow that were already in the
// old queue (TCP tolerates that; at most one move per hold_us). The table is bounded (max_flows;
// flows beyond it are written where they came from) and hashed with a random seed, so a guest
// choosing its addresses and ports cannot pile its flows into one bucket. The host→guest side
// of a flow is recognised from the delivered packet in the guest's page: a guest that rewrites
// it can only misdirect the accounting of its own vif.
//
// xpv-netback does this for every vif with more than one queue unless XPV_NETBACK_STEER=guest
// (backends/README.md "Fairness" has what it measured).
//
// Threads: every queue thread of the vif calls on_tx/on_rx; one mutex, held for a map lookup
// per packet (a period's evaluation walks the table: at most max_flows entries).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace xpv::netback {

struct FlowSteeringConfig {
  unsigned queues = 1;                   // the vif's netif queues (= TAP queues)
  std::uint64_t period_us = 200'000;     // how often the table is looked at
  std::uint64_t heavy_bytes = 512 << 10; // bytes in a period that make a flow busy (~21 Mbit/s)
  std::uint64_t hold_us = 1'000'000;     // after a move, the next no sooner than this
  std::uint64_t idle_us = 3'000'000;     // a flow unseen this long is forgotten
  std::size_t max_flows = 1024;
};

class FlowSteering {
 public:
  explicit FlowSteering(FlowSteeringConfig cfg);

  // The symmetric key of an Ethernet frame's TCP/UDP flow (headers as parse_ip reads them, in
  // offload.h; IPv4 fragments have none); nullopt for anything else or a frame too short to tell.
  // Both directions of a flow get the same key.
  static std::optional<std::uint64_t> flow_key(std::span<const std::uint8_t> frame) noexcept;

  // A guest-tx packet of flow `key` that came on netif queue `arrival`: the TAP queue to write
  // it on.
  unsigned on_tx(std::uint64_t key, unsigned arrival, std::size_t bytes, std::uint64_t now_us);
  // A host→guest packet of flow `key`, read from TAP queue `queue`.
  void on_rx(std::uint64_t key, unsigned queue, std::size_t bytes, std::uint64_t now_us);

  std::uint64_t moves() const;  // moves made so far
  std::size_t flows() const;    // flows in the table now
  // One flow as the table has it now (for tests and diagnostics): bytes are this period's.
  struct FlowView {
    int write_q, rx_q;
    std::uint64_t bytes, rx_bytes;
    bool moved;
  };
  std::optional<FlowView> flow(std::uint64_t key) const;

 private:
  struct Flow {
    int write_q = -1;          // where its guest-tx packets are written; -1: none seen yet
    bool moved = false;        // write_q is ours; until then the queue each packet came on
    int rx_q = -1;             // where its host→guest packets were last read
    std::uint64_t bytes = 0;   // this period, both directions
    std::uint64_t rx_bytes = 0;  // this period, host→guest (what a move moves)
    bool rx_seen = false;      // host→guest packets in this period
    bool tx_seen = false;      // guest-tx packets in this period (only such a flow can be moved)
    std::uint64_t last_us = 0;
  };
  struct SeededHash {
    std::uint64_t seed;
    std::size_t operator()(std::uint64_t k) const noexcept;
  };
  Flow* find(std::uint64_t key, std::uint64_t now_us);  // inserted if there is room
  void look(std::uint64_t now_us);                      // the period's evaluation (lock held)

  const FlowSteeringConfig cfg_;
  mutable std::mutex m_;
  std::unordered_map<std::uint64_t, Flow, SeededHash> flows_;  // reserved for max_flows
  std::vector<unsigned> busy_;                                 // per queue, in look()
  std::uint64_t period_start_us_ = 0;
  bool started_ = false;
  std::uint64_t last_move_us_ = 0;
  std::uint64_t moves_ = 0;
};

}  // namespace xpv::netback
