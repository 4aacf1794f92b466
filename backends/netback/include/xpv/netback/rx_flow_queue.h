// RxFlowQueue — the host→guest packets netback has read from the TAP but the guest has no rx
// buffers for yet: a bounded, flow-fair queue (DESIGN.md §3 "Fairness"). Pure logic and memory,
// no I/O; one per NetbackQueue, used by its thread only.
//
// Why it exists. A TAP is a FIFO (the kernel's tun ring: 500 frames of up to 64 KiB each, and it
// never pushes back into the qdisc in front of it). When the guest receives more slowly than the
// host sends — the usual case for a busy vCPU — that FIFO fills with the bulk flow's data, and
// every other packet to the guest waits behind megabytes of it: in a `--bidir` run, the ACKs of
// the guest's own sending flow. Its sender then sees RTTs of hundreds of milliseconds and
// starves (measured: the guest's sending side at 1.2 % of its receiving side). Linux netback
// avoids this by stopping its net device's queue, so the backlog forms in the qdisc (fq_codel by
// default), which is flow-fair. A TAP offers no such back-pressure, so netback can drain the TAP
// itself whenever the guest is behind and keep the backlog here, scheduled per flow
// (NetbackConfig::rx_drain, opt-in: by default only the packet at the head waits here):
//
//   TAP ──readv──► free chunks ──hash(addresses, protocol, ports)──► flow FIFO (1024 buckets)
//                                                                        │
//   rx ring ◄──copy into the guest's buffers──◄ deficit round robin over active flows, quantum
//                                               bytes each; a flow that just became active
//                                               ("new", e.g. a stream of ACKs) goes before the
//                                               ones that stayed backlogged ("old")
//
// Bounded: packets live in a fixed pool of 2 KiB chunks (a 64 KiB GSO frame takes 33, an ACK
// one). To make room for the next read the queue drops from the head of the flow holding the
// most bytes (as fq_codel does): the bulk flow pays, sparse flows keep going, and TCP's loss
// response keeps the standing queue short. Nothing is allocated after construction.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "xpv/netback/offload.h"

namespace xpv::netback {

struct RxFlowConfig {
  std::size_t pool_bytes = 2u << 20;   // chunk pool: the most packet bytes held
  std::uint32_t quantum = 1514;        // bytes a flow may move per round (one full frame)
  std::uint32_t flows = 1024;          // hash buckets (as fq_codel)
  std::uint32_t seed = 0;              // hash perturbation; 0: a random one
};

class RxFlowQueue {
 public:
  static constexpr std::size_t kChunk = 2048;
  static constexpr std::uint32_t kNone = ~0u;

  struct Packet {
    VnetHdr vnet{};
    std::uint32_t len = 0;          // frame bytes (without the vnet header)
    std::uint32_t first = kNone;    // first chunk
    std::uint32_t next = kNone;     // next packet of the same flow
    std::uint32_t flow = 0;
  };

  // `max_packet`: the largest frame a read may bring (sizes each read's room).
  RxFlowQueue(RxFlowConfig cfg, std::size_t max_packet);

  // Frees chunks for one packet of up to max_packet bytes, dropping packets from the head of the
  // fattest flow while there are too few. Returns how many it dropped.
  std::size_t make_room() noexcept;
  // After make_room(): iovecs for one readv — the vnet header, then free chunks for max_packet.
  std::span<const iovec> ingress_iov() noexcept;
  // That readv returned `n` bytes (vnet header included, n > sizeof(VnetHdr)): the frame is
  // queued on its flow.
  void commit(std::size_t n) noexcept;

  bool empty() const noexcept { return packets_ == 0; }
  std::size_t packets() const noexcept { return packets_; }
  std::size_t bytes() const noexcept { return bytes_; }

  // The packet to deliver next (deficit round robin), or null when empty. It stays the answer
  // until pop(); commit() and make_room() must not come between the two.
  const Packet* front() noexcept;
  void pop() noexcept;
  // Copies `dst.size()` bytes of `p`'s frame from offset `at` into `dst`.
  void copy(const Packet& p, std::size_t at, std::span<std::uint8_t> dst) const noexcept;
  // Drops everything (a frontend that stopped taking packets); returns how many.
  std::size_t clear() noexcept;

  // The flow bucket of a frame: what parse_ip finds (protocol, addresses) and the TCP/UDP ports
  // (not for IPv4 fragments); a frame parse_ip refuses hashes by its MACs and ethertype.
  std::uint32_t flow_of(std::span<const std::uint8_t> frame) const noexcept;

 private:
  // A fixed-capacity FIFO of flow indexes (a flow is in at most one of the two lists).
  struct FlowList {
    std::vector<std::uint32_t> slots;
    std::size_t head = 0, size = 0;
    bool empty() const noexcept { return size == 0; }
    std::uint32_t front() const noexcept { return slots[head]; }
    void pop_front() noexcept {
      head = (head + 1) % slots.size();
      --size;
    }
    void push_back(std::uint32_t f) noexcept {
      slots[(head + size) % slots.size()] = f;
      ++size;
    }
  };
  enum class Where : std::uint8_t { none, fresh, old };
  struct Flow {
    std::uint32_t head = kNone, tail = kNone;
    std::size_t bytes = 0;
    std::int64_t deficit = 0;
    Where where = Where::none;
  };

  void unlink_head(std::uint32_t flow) noexcept;  // removes and frees the flow's head packet

  RxFlowConfig cfg_;
  std::size_t read_chunks_;                 // chunks one read needs (max_packet)
  std::vector<std::uint8_t> pool_;          // chunk i at i * kChunk
  std::vector<std::uint32_t> chunk_next_;   // chunk chain of a packet
  std::vector<std::uint32_t> free_chunks_;  // a stack
  std::vector<Packet> pkts_;
  std::vector<std::uint32_t> free_pkts_;    // a stack
  std::vector<Flow> flows_;
  FlowList fresh_, old_;
  std::uint32_t current_ = kNone;           // the flow front() chose
  std::size_t packets_ = 0, bytes_ = 0;
  VnetHdr in_vnet_{};
  std::vector<iovec> in_iov_;
};

}  // namespace xpv::netback
