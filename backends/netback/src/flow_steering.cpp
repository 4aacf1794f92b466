#include "xpv/netback/flow_steering.h"

#include "xpv/netback/offload.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>

namespace xpv::netback {

namespace {

// One end of a flow: address (4 or 16 bytes, zero-padded) and port.
struct End {
  std::uint8_t addr[16] = {};
  std::uint8_t port[2] = {};
  bool operator<(const End& o) const noexcept {
    const int c = std::memcmp(addr, o.addr, sizeof addr);
    return c != 0 ? c < 0 : std::memcmp(port, o.port, sizeof port) < 0;
  }
};

}  // namespace

std::size_t FlowSteering::SeededHash::operator()(std::uint64_t k) const noexcept {
  // splitmix64's finaliser over the key and a per-table seed: a guest that picks its addresses
  // and ports cannot line its flows up in one bucket (the default hash is the key itself).
  std::uint64_t z = k ^ seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<std::size_t>(z ^ (z >> 31));
}

FlowSteering::FlowSteering(FlowSteeringConfig cfg)
    : cfg_(cfg), flows_(0, SeededHash{(std::uint64_t{std::random_device{}()} << 32) | std::random_device{}()}) {
  if (cfg_.queues == 0 || cfg_.max_flows == 0 || cfg_.period_us == 0 || cfg_.idle_us <= cfg_.period_us) {
    throw std::invalid_argument("flow steering: queues, max_flows and period_us > 0, idle_us > period_us");
  }
  flows_.reserve(cfg_.max_flows);
  busy_.resize(cfg_.queues);
}

std::optional<std::uint64_t> FlowSteering::flow_key(std::span<const std::uint8_t> f) noexcept {
  const auto ip = parse_ip(f);
  if (!ip || ip->ports.empty()) return std::nullopt;
  End a, b;
  const std::size_t alen = ip->src.size();
  std::memcpy(a.addr, ip->src.data(), alen);
  std::memcpy(b.addr, ip->dst.data(), alen);
  std::memcpy(a.port, ip->ports.data(), 2);
  std::memcpy(b.port, ip->ports.data() + 2, 2);
  if (b < a) std::swap(a, b);  // both directions: one key
  // FNV-1a (64-bit) over protocol, address length and the two ends in order.
  std::uint64_t h = 14695981039346656037ull;
  auto mix = [&](const std::uint8_t* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  const std::uint8_t head[2] = {ip->proto, static_cast<std::uint8_t>(alen)};
  mix(head, 2);
  mix(a.addr, sizeof a.addr);
  mix(a.port, 2);
  mix(b.addr, sizeof b.addr);
  mix(b.port, 2);
  return h;
}

FlowSteering::Flow* FlowSteering::find(std::uint64_t key, std::uint64_t now_us) {
  if (!started_) {
    started_ = true;
    period_start_us_ = now_us;
  }
  auto it = flows_.find(key);
  if (it == flows_.end()) {
    if (flows_.size() >= cfg_.max_flows) return nullptr;
    it = flows_.emplace(key, Flow{}).first;
  }
  it->second.last_us = std::max(it->second.last_us, now_us);
  return &it->second;
}

unsigned FlowSteering::on_tx(std::uint64_t key, unsigned arrival, std::size_t bytes, std::uint64_t now_us) {
  std::lock_guard l(m_);
  Flow* f = find(key, now_us);
  if (f == nullptr) return arrival;
  f->bytes += bytes;
  f->tx_seen = true;
  if (!f->moved) f->write_q = static_cast<int>(arrival);  // the guest's choice until we move it
  look(now_us);  // keeps f: it was seen just now (idle_us > 0) and it moved bytes in this period
  return static_cast<unsigned>(f->write_q);
}

void FlowSteering::on_rx(std::uint64_t key, unsigned queue, std::size_t bytes, std::uint64_t now_us) {
  std::lock_guard l(m_);
  Flow* f = find(key, now_us);
  if (f == nullptr) return;
  f->bytes += bytes;
  f->rx_bytes += bytes;
  f->rx_q = static_cast<int>(queue);
  f->rx_seen = true;
  look(now_us);
}

void FlowSteering::look(std::uint64_t now_us) {
  // Callers on other threads may pass a slightly older time: never a negative interval.
  auto since = [&](std::uint64_t t) { return now_us > t ? now_us - t : 0; };
  if (since(period_start_us_) < cfg_.period_us) return;
  period_start_us_ = now_us;
  // Forget flows unseen for idle_us; with the table full, also those that moved nothing in this
  // period (a moved one among them goes back to the guest's queue), so new flows find room.
  const bool full = flows_.size() >= cfg_.max_flows;
  std::erase_if(flows_, [&](const auto& kv) {
    return since(kv.second.last_us) >= cfg_.idle_us || (full && kv.second.bytes == 0);
  });
  std::fill(busy_.begin(), busy_.end(), 0u);
  auto where = [](const Flow& f) { return f.rx_seen ? f.rx_q : f.write_q; };
  for (const auto& [key, f] : flows_) {
    const int q = where(f);
    if (f.bytes >= cfg_.heavy_bytes && q >= 0 && static_cast<unsigned>(q) < cfg_.queues) ++busy_[static_cast<unsigned>(q)];
  }
  const bool may_move = moves_ == 0 || since(last_move_us_) >= cfg_.hold_us;
  const auto most = std::max_element(busy_.begin(), busy_.end());
  const auto least = std::min_element(busy_.begin(), busy_.end());
  if (may_move && *most >= 2 && *least == 0) {
    const int from = static_cast<int>(most - busy_.begin());
    // A move changes where the flow's host→guest packets go, so the flow with the most of them
    // goes, and only one that receives at least as much as it sends (a sending flow's are its
    // ACKs: moving it would split them from its data and relieve the queue of nothing). Only a
    // flow netback wrote in this period can be moved: the kernel learns its new queue from the
    // next packet written, so one with no guest-tx packets (a UDP stream to the guest) would
    // stay where it is.
    Flow* pick = nullptr;
    for (auto& [key, f] : flows_) {
      if (f.rx_bytes >= cfg_.heavy_bytes && f.rx_bytes >= f.bytes - f.rx_bytes && where(f) == from && f.tx_seen &&
          (pick == nullptr || f.rx_bytes > pick->rx_bytes)) {
        pick = &f;
      }
    }
    if (pick != nullptr) {
      pick->write_q = static_cast<int>(least - busy_.begin());
      pick->moved = true;
      last_move_us_ = now_us;
      ++moves_;
    }
  }
  for (auto& [key, f] : flows_) {
    f.bytes = f.rx_bytes = 0;
    f.rx_seen = f.tx_seen = false;
  }
}

std::optional<FlowSteering::FlowView> FlowSteering::flow(std::uint64_t key) const {
  std::lock_guard l(m_);
  auto it = flows_.find(key);
  if (it == flows_.end()) return std::nullopt;
  return FlowView{it->second.write_q, it->second.rx_q, it->second.bytes, it->second.rx_bytes, it->second.moved};
}

std::uint64_t FlowSteering::moves() const {
  std::lock_guard l(m_);
  return moves_;
}

std::size_t FlowSteering::flows() const {
  std::lock_guard l(m_);
  return flows_.size();
}

}  // namespace xpv::netback
