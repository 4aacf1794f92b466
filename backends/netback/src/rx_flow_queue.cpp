#include "xpv/netback/rx_flow_queue.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>

namespace xpv::netback {

RxFlowQueue::RxFlowQueue(RxFlowConfig cfg, std::size_t max_packet)
    : cfg_(cfg), read_chunks_((max_packet + kChunk - 1) / kChunk) {
  const std::size_t chunks = cfg_.pool_bytes / kChunk;
  if (cfg_.flows == 0 || cfg_.quantum == 0 || max_packet == 0 || chunks < read_chunks_) {
    throw std::invalid_argument("rx flow queue: the pool must hold one largest packet; flows and quantum > 0");
  }
  if (cfg_.seed == 0) cfg_.seed = std::random_device{}() | 1u;
  pool_.resize(chunks * kChunk);
  chunk_next_.assign(chunks, kNone);
  free_chunks_.reserve(chunks);
  for (std::size_t i = chunks; i-- > 0;) free_chunks_.push_back(static_cast<std::uint32_t>(i));
  pkts_.resize(chunks);  // every packet takes at least one chunk
  free_pkts_.reserve(chunks);
  for (std::size_t i = chunks; i-- > 0;) free_pkts_.push_back(static_cast<std::uint32_t>(i));
  flows_.resize(cfg_.flows);
  fresh_.slots.resize(cfg_.flows);
  old_.slots.resize(cfg_.flows);
  in_iov_.reserve(read_chunks_ + 1);
}

std::uint32_t RxFlowQueue::flow_of(std::span<const std::uint8_t> f) const noexcept {
  std::uint8_t key[40];
  std::size_t k = 0;
  auto take = [&](std::span<const std::uint8_t> bytes) {
    if (bytes.empty()) return;  // memcpy from an empty span's null pointer is undefined
    std::memcpy(key + k, bytes.data(), bytes.size());
    k += bytes.size();
  };
  if (const auto ip = parse_ip(f)) {
    key[k++] = ip->proto;
    take(ip->src);
    take(ip->dst);
    take(ip->ports);
  } else {
    take(f.first(std::min(f.size(), kEthHeader)));
  }
  // FNV-1a over the key, perturbed by the seed, then a final avalanche (murmur3's).
  std::uint32_t h = 2166136261u ^ cfg_.seed;
  for (std::size_t i = 0; i < k; ++i) h = (h ^ key[i]) * 16777619u;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h % cfg_.flows;
}

void RxFlowQueue::unlink_head(std::uint32_t flow) noexcept {
  Flow& fl = flows_[flow];
  const std::uint32_t idx = fl.head;
  Packet& p = pkts_[idx];
  fl.head = p.next;
  if (fl.head == kNone) fl.tail = kNone;
  fl.bytes -= p.len;
  bytes_ -= p.len;
  --packets_;
  for (std::uint32_t c = p.first; c != kNone;) {
    const std::uint32_t next = chunk_next_[c];
    chunk_next_[c] = kNone;
    free_chunks_.push_back(c);
    c = next;
  }
  p = Packet{};
  free_pkts_.push_back(idx);
}

std::size_t RxFlowQueue::make_room() noexcept {
  std::size_t dropped = 0;
  // Each drop frees at least one chunk, and the pool holds a largest packet: bounded.
  while (free_chunks_.size() < read_chunks_ && packets_ > 0) {
    std::uint32_t fattest = 0;
    for (std::uint32_t f = 1; f < flows_.size(); ++f) {
      if (flows_[f].bytes > flows_[fattest].bytes) fattest = f;
    }
    unlink_head(fattest);  // it stays on its list; front() retires it once empty
    ++dropped;
  }
  current_ = kNone;
  return dropped;
}

std::span<const iovec> RxFlowQueue::ingress_iov() noexcept {
  in_iov_.clear();
  in_iov_.push_back({&in_vnet_, sizeof in_vnet_});
  const std::size_t n = std::min(read_chunks_, free_chunks_.size());
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t c = free_chunks_[free_chunks_.size() - 1 - i];
    in_iov_.push_back({pool_.data() + std::size_t{c} * kChunk, kChunk});
  }
  return in_iov_;
}

void RxFlowQueue::commit(std::size_t n) noexcept {
  if (n <= sizeof(VnetHdr) || free_pkts_.empty()) return;
  const std::size_t len = std::min(n - sizeof(VnetHdr), (in_iov_.size() - 1) * kChunk);
  const std::size_t used = (len + kChunk - 1) / kChunk;
  // The chunks the readv filled are the top `used` of the free stack, first one on top.
  std::uint32_t first = kNone, prev = kNone;
  for (std::size_t i = 0; i < used; ++i) {
    const std::uint32_t c = free_chunks_.back();
    free_chunks_.pop_back();
    if (prev == kNone) {
      first = c;
    } else {
      chunk_next_[prev] = c;
    }
    prev = c;
  }
  const std::uint32_t idx = free_pkts_.back();
  free_pkts_.pop_back();
  Packet& p = pkts_[idx];
  p.vnet = in_vnet_;
  p.len = static_cast<std::uint32_t>(len);
  p.first = first;
  p.next = kNone;
  p.flow = flow_of({pool_.data() + std::size_t{first} * kChunk, std::min(len, kChunk)});
  Flow& fl = flows_[p.flow];
  if (fl.tail == kNone) {
    fl.head = idx;
  } else {
    pkts_[fl.tail].next = idx;
  }
  fl.tail = idx;
  fl.bytes += len;
  bytes_ += len;
  ++packets_;
  if (fl.where == Where::none) {
    fl.where = Where::fresh;
    fl.deficit = cfg_.quantum;
    fresh_.push_back(p.flow);
  }
}

const RxFlowQueue::Packet* RxFlowQueue::front() noexcept {
  if (current_ != kNone && flows_[current_].head != kNone) return &pkts_[flows_[current_].head];
  current_ = kNone;
  if (packets_ == 0) return nullptr;
  // Each round either returns, retires an empty flow, or adds a quantum to a flow's deficit
  // (a 64 KiB packet needs at most 64 KiB / quantum of those): bounded.
  const std::size_t bound = flows_.size() * (pool_.size() / cfg_.quantum + 3);
  for (std::size_t round = 0; round < bound; ++round) {
    FlowList* list = !fresh_.empty() ? &fresh_ : !old_.empty() ? &old_ : nullptr;
    if (list == nullptr) return nullptr;
    const std::uint32_t f = list->front();
    Flow& fl = flows_[f];
    if (fl.deficit <= 0) {  // its round is over: to the back of the old flows, with a new quantum
      fl.deficit += cfg_.quantum;
      list->pop_front();
      old_.push_back(f);
      fl.where = Where::old;
      continue;
    }
    if (fl.head == kNone) {
      list->pop_front();
      // A new flow that emptied goes through the old list once before it may count as new
      // again (fq_codel's rule: otherwise a flow sending just under a quantum per round would
      // always be "new" and starve the old ones).
      if (list == &fresh_ && !old_.empty()) {
        old_.push_back(f);
        fl.where = Where::old;
      } else {
        fl.where = Where::none;
      }
      continue;
    }
    current_ = f;
    return &pkts_[fl.head];
  }
  return nullptr;
}

void RxFlowQueue::pop() noexcept {
  if (current_ == kNone || flows_[current_].head == kNone) return;
  const std::uint32_t f = current_;
  flows_[f].deficit -= pkts_[flows_[f].head].len;
  unlink_head(f);
  current_ = kNone;
}

void RxFlowQueue::copy(const Packet& p, std::size_t at, std::span<std::uint8_t> dst) const noexcept {
  std::uint32_t c = p.first;
  for (std::size_t skip = at / kChunk; skip > 0 && c != kNone; --skip) c = chunk_next_[c];
  std::size_t in = at % kChunk, done = 0;
  while (done < dst.size() && c != kNone) {
    const std::size_t n = std::min(kChunk - in, dst.size() - done);
    std::memcpy(dst.data() + done, pool_.data() + std::size_t{c} * kChunk + in, n);
    done += n;
    in = 0;
    c = chunk_next_[c];
  }
}

std::size_t RxFlowQueue::clear() noexcept {
  std::size_t n = 0;
  for (std::uint32_t f = 0; f < flows_.size(); ++f) {
    while (flows_[f].head != kNone) {
      unlink_head(f);
      ++n;
    }
  }
  current_ = kNone;
  return n;
}

}  // namespace xpv::netback
