// FairScheduler — who moves packets next, guest-TX or guest-RX (DESIGN.md §3 "Fairness"; the
// 2008 report: 2.05 Gbit/s into a guest alone, 62.9 Mbit/s while it also sent).
//
// A deficit round robin over the two directions of one queue, pure logic (no clock, no I/O):
//
//   begin_turn(tx_backlog, rx_backlog)
//        │  the direction after the last one, if it has backlog, else the other; none → idle
//        ▼
//   credit[d] = min(credit[d] + quantum, quantum)       (a debt from overdrawing is paid first)
//        │
//   may_send()? ── credit > 0 and packets this turn < max_packets ──► move one packet, charge(bytes)
//        │ no
//        ▼
//   end_turn(still_backlogged)    an emptied direction forfeits its credit (no hoarding while idle)
//
// So with both directions backlogged the turns strictly alternate, and each turn moves at most
// `quantum` bytes (plus one packet's overdraw, charged to its next turn) and at most max_packets
// packets: a direction of 64 KiB GSO packets and one of 1.5 KiB packets get equal bytes, and
// neither can starve the other. Used by one data-plane thread (NetbackQueue); not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <optional>

namespace xpv::netback {

enum class Dir : std::uint8_t { tx = 0, rx = 1 };

struct FairConfig {
  std::uint32_t quantum_bytes = 256 * 1024;  // bytes a direction may move per turn
  std::uint32_t max_packets = 64;            // packets a direction may move per turn
};

// What one turn costs in FairShare's ledger (fair_share.h), in bytes: what it moved, but at least
// `quantum / max_packets` a packet (4 KiB with the defaults) — the two limits of a turn, counted
// alike, so that a turn of max_packets small frames costs what a full turn of large ones does. A
// queue's work is as much per packet as per byte (a ring request, a grant copy, a TAP read or
// write each); counted by bytes alone, a vif flooding 64-byte frames was always behind in the
// ledger, and every other vif's queues were held to its byte rate. vhost-net ends a turn by the
// same two limits (VHOST_NET_WEIGHT 512 KiB or VHOST_NET_PKT_WEIGHT 256 packets, whichever comes
// first); Linux netback's credit counts bytes only, but it is a rate limit, not a leveller.
// Dropped packets count: they cost the work too.
constexpr std::uint64_t turn_cost(std::uint64_t bytes, std::uint64_t packets, const FairConfig& cfg) noexcept {
  const std::uint64_t per_packet = cfg.max_packets == 0 ? 0 : cfg.quantum_bytes / cfg.max_packets;
  return std::max(bytes, packets * per_packet);
}

class FairScheduler {
 public:
  explicit FairScheduler(FairConfig cfg = {}) noexcept : cfg_(cfg) {}

  std::optional<Dir> begin_turn(bool tx_backlog, bool rx_backlog) noexcept {
    const Dir other = last_ == Dir::tx ? Dir::rx : Dir::tx;
    const bool other_ready = other == Dir::tx ? tx_backlog : rx_backlog;
    const bool last_ready = last_ == Dir::tx ? tx_backlog : rx_backlog;
    if (!other_ready && !last_ready) return std::nullopt;
    current_ = other_ready ? other : last_;
    last_ = current_;
    std::int64_t& c = credit_[index(current_)];
    c = std::min<std::int64_t>(c + cfg_.quantum_bytes, cfg_.quantum_bytes);
    packets_ = 0;
    ++turns_;
    return current_;
  }
  bool may_send() const noexcept {
    return credit_[index(current_)] > 0 && packets_ < cfg_.max_packets;
  }
  void charge(std::size_t bytes) noexcept {
    credit_[index(current_)] -= static_cast<std::int64_t>(bytes);
    ++packets_;
  }
  void end_turn(bool still_backlogged) noexcept {
    std::int64_t& c = credit_[index(current_)];
    if (!still_backlogged && c > 0) c = 0;
  }

  std::int64_t credit(Dir d) const noexcept { return credit_[index(d)]; }
  std::uint32_t packets_this_turn() const noexcept { return packets_; }
  std::uint64_t turns() const noexcept { return turns_; }
  const FairConfig& config() const noexcept { return cfg_; }

 private:
  static constexpr std::size_t index(Dir d) noexcept { return static_cast<std::size_t>(d); }

  FairConfig cfg_;
  Dir last_ = Dir::rx;  // so that the first turn, with both ready, is TX
  Dir current_ = Dir::tx;
  std::int64_t credit_[2] = {0, 0};
  std::uint32_t packets_ = 0;
  std::uint64_t turns_ = 0;
};

}  // namespace xpv::netback
