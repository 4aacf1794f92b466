#include "xpv/netback/queue.h"

#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "xpv/netback/tx_source.h"
#include "xpv/netback/vif_address.h"

namespace xpv::netback {

using namespace xpv::ring;

namespace {
constexpr std::size_t kPage = kXenPageSize;
constexpr std::size_t kHdrCopy = 256;  // header bytes gathered for offload parsing
constexpr int kTurnsPerPoll = 32;      // turns before re-checking the stop fd and event channels
constexpr int kDrainBatch = 64;        // TAP reads per look while the guest is behind
// The fill limit's floor: two of the largest packets (rx_fill_limit.h).
constexpr std::size_t kRxFillMinSlots = 2 * NetbackQueue::kRxDirectSlots;
}  // namespace

template <class... Args>
void NetbackQueue::guest_error_in(std::uint64_t& logged, const char* format, Args&&... args) noexcept {
  // A guest can send bad packets at line rate: log the first few, then one in a thousand.
  ++logged;
  if (logged > 10 && logged % 1000 != 0) return;
  try {
    spdlog::warn("{}: {}{}", name_, fmt::format(fmt::runtime(format), std::forward<Args>(args)...),
                 logged > 10 ? " (rate-limited)" : "");
  } catch (...) {
  }
}

NetbackQueue::NetbackQueue(std::string name, gnttab::GrantMapper& mapper, NetifTxBackRing tx,
                           NetifRxBackRing rx, std::unique_ptr<domain::EventChannel> tx_evtchn,
                           std::unique_ptr<domain::EventChannel> rx_evtchn, int tap_fd,
                           NetbackConfig cfg, RxShadow* rx_shadow)
    : name_(std::move(name)),
      mapper_(mapper),
      tx_(std::move(tx)),
      rx_(std::move(rx)),
      tx_evtchn_(std::move(tx_evtchn)),
      rx_evtchn_(std::move(rx_evtchn)),
      tap_(tap_fd),
      cfg_(cfg),
      sched_(cfg.fair),
      limiter_(cfg.rate_bytes, cfg.rate_usec),
      rx_queue_(cfg.rx_queue, kMaxRxBytes),
      rx_fill_(rx_.size(), kRxFillMinSlots, cfg.rx_fill_adaptive, cfg.rx_fill_period_us) {
  rx_shadow_ = rx_shadow;
  counters_.rx_fill_limit.store(rx_fill_.limit(), std::memory_order_relaxed);
  // What the fill limit holds back is meant to wait in flow order (rx_fill_limit.h), not in the
  // TAP's arrival order: with it, the backlog is always drained into rx_queue_.
  if (cfg_.rx_fill_adaptive) cfg_.rx_drain = true;
  if (!tx_evtchn_) throw std::invalid_argument("netback: no event channel");
  if (cfg_.steer != nullptr && (cfg_.queue_index >= cfg_.tap_fds.size() || cfg_.tap_fds[cfg_.queue_index] != tap_)) {
    throw std::invalid_argument("netback: flow steering needs every TAP queue's fd, this queue's at its index");
  }
  auto s = domain::EventFd::create();
  if (!s) throw std::system_error(s.error(), std::generic_category(), "eventfd");
  stop_ = std::move(*s);
  if (cfg_.share != nullptr) {
    share_acc_[0] = cfg_.share->join(cfg_.share_group);
    share_acc_[1] = cfg_.share->join(cfg_.share_group);
  }
  // Everything the data path needs is allocated here, never on it.
  tx_slots_.reserve(tx_.size());
  tx_maps_.reserve(kXenNetifNrSlotsMin);
  tx_iov_.reserve(kXenNetifNrSlotsMin + 2);  // the vnet header, the header copy, the slots
  tx_hdr_.resize(kHdrCopy);
  if (cfg_.tx_source != 0) tx_source_str_ = ipv4_string(cfg_.tx_source);
  if (cfg_.tx_respond_early) tx_copy_.resize(0xffff);  // a tx packet's size is 16 bits
  rx_held_.reserve(kRxDirectSlots);
  rx_iov_.reserve(kRxDirectSlots + 1);
  if (cfg_.resume) {
    // What the dead backend consumed and did not answer (bad indexes disable the queue in pass()).
    tx_resume_ = tx_.unconsumed_requests().value_or(0);
    rx_resume_ = rx_.unconsumed_requests().value_or(0);
  }
  // Responses published that the frontend may never have been told about: a backend killed
  // between its push and its notification (false on a fresh ring).
  tx_notify_owed_ = tx_.response_event_passed();
  rx_notify_owed_ = rx_.response_event_passed();
}

NetbackQueue::~NetbackQueue() {
  // Held rx buffers go back to the frontend's control (they stay unanswered, as a dead backend's
  // would: a reconnecting one answers them, see Resume).
  for (const RxHeld& h : rx_held_) {
    if (!h.page.empty()) (void)mapper_.unmap(h.handle);
  }
  if (cfg_.share != nullptr) {
    for (FairShare::Account* a : share_acc_) cfg_.share->leave(a);
  }
}

void NetbackQueue::stop() noexcept { (void)stop_.notify(); }

void NetbackQueue::disable(const char* why) noexcept {
  if (!disabled_.exchange(true, std::memory_order_acq_rel)) {
    spdlog::error("{}: disabled: {}", name_, why);
  }
}

std::uint64_t NetbackQueue::now_us() const noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

// ---- guest TX ------------------------------------------------------------------------------------

bool NetbackQueue::tx_has_work() noexcept {
  if (tx_rate_blocked_) {
    if (now_us() < limiter_.next_window_us()) return false;
    tx_rate_blocked_ = false;
  }
  if (tx_held_) return true;
  auto n = tx_.unconsumed_requests();
  if (!n) {
    disable(to_string(n.error()));
    return false;
  }
  return *n > 0;
}

void NetbackQueue::tx_respond(std::int16_t status) noexcept {
  for (const Slot& s : tx_slots_) {
    NetifTxResponse rsp{};
    rsp.id = s.id;
    rsp.status = s.extra ? kNetifRspNull : status;
    if (auto r = tx_.produce_response(rsp); !r) {
      disable(to_string(r.error()));
      return;
    }
  }
  tx_resp_pending_ = true;
}

void NetbackQueue::tx_unmap() noexcept {
  for (gnttab::GrantHandle h : tx_maps_) {
    if (auto r = mapper_.unmap(h); !r) {
      spdlog::critical("{}: unmap of our own grant handle failed: {}", name_, gnttab::to_string(r.error()));
      std::abort();
    }
  }
  tx_maps_.clear();
}

void NetbackQueue::tx_written(ssize_t w, std::size_t size, std::size_t& bytes) noexcept {
  if (w < 0) {
    // The host stack refused it (queue full, interface down): a drop on the wire, not a guest
    // fault — the guest is answered OKAY as a NIC would.
    counters_.tx_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  counters_.tx_packets.fetch_add(1, std::memory_order_relaxed);
  counters_.tx_bytes.fetch_add(size, std::memory_order_relaxed);
  bytes = size;
}

int NetbackQueue::tx_fd(std::span<const std::uint8_t> head, std::size_t size) noexcept {
  if (cfg_.steer == nullptr) return tap_;
  const auto key = FlowSteering::flow_key(head);
  if (!key) return tap_;
  unsigned q = cfg_.queue_index;
  try {
    q = cfg_.steer->on_tx(*key, cfg_.queue_index, size, now_us());
  } catch (const std::exception&) {  // no memory for the table's entry: as without steering
  }
  if (q == cfg_.queue_index || q >= cfg_.tap_fds.size()) return tap_;
  counters_.tx_steered.fetch_add(1, std::memory_order_relaxed);
  return cfg_.tap_fds[q];
}

void NetbackQueue::rx_steer_seen(std::span<const std::uint8_t> head, std::size_t size) noexcept {
  if (cfg_.steer == nullptr) return;
  if (const auto key = FlowSteering::flow_key(head)) {
    try {
      cfg_.steer->on_rx(*key, cfg_.queue_index, size, now_us());
    } catch (const std::exception&) {
    }
  }
}

NetbackQueue::Step NetbackQueue::tx_one(std::size_t& bytes) noexcept {
  bytes = 0;
  NetifTxRequest first;
  if (tx_held_) {
    first = *tx_held_;
    tx_held_.reset();
  } else {
    auto r = tx_.pop_request();
    if (!r) {
      if (r.error() != RingError::empty) disable(to_string(r.error()));
      return Step::none;
    }
    first = *r;
  }
  if (!limiter_.consume(first.size, now_us())) {
    tx_held_ = first;  // its other slots stay on the ring until the credit allows it
    tx_rate_blocked_ = true;
    counters_.rate_limited.fetch_add(1, std::memory_order_relaxed);
    return Step::blocked;
  }

  // Gather every slot of the packet (copies). A frontend publishes a packet's slots together:
  // one missing is a protocol violation, as in Linux netback.
  tx_slots_.clear();
  tx_slots_.push_back({first.id, false, first.offset, first.size, first.gref});
  const char* bad = nullptr;
  NetifOffload off;
  off.csum_blank = (first.flags & kNettxfCsumBlank) != 0;
  off.data_validated = (first.flags & kNettxfDataValidated) != 0;
  auto next = [&]() -> std::optional<NetifTxRequest> {
    auto r = tx_.pop_request();
    if (!r) {
      disable(r.error() == RingError::empty ? "a packet's slots are not all on the tx ring"
                                            : to_string(r.error()));
      return std::nullopt;
    }
    return *r;
  };
  if (first.flags & kNettxfExtraInfo) {
    for (unsigned i = 0;; ++i) {
      auto r = next();
      if (!r) return Step::none;
      const NetifExtraInfo e = netif_extra_from_tx(*r);
      tx_slots_.push_back({0, true, 0, 0, 0});
      if (i >= kXenNetifExtraTypeMax) {
        bad = "too many extra-info slots";
      } else if (e.type == kXenNetifExtraTypeGso) {
        off.gso_type = e.u.gso.type;
        off.gso_size = e.u.gso.size;
        if (off.gso_type == kXenNetifGsoTypeNone) bad = "GSO extra of type none";
      } else if (e.type != kXenNetifExtraTypeMcastAdd && e.type != kXenNetifExtraTypeMcastDel) {
        bad = "unknown extra-info type";  // multicast filters are accepted and ignored
      }
      if (!(e.flags & kXenNetifExtraFlagMore)) break;
    }
  }
  std::uint16_t flags = first.flags;
  std::uint32_t data_slots = 1;
  std::uint32_t frag_bytes = 0;
  while (flags & kNettxfMoreData) {
    auto r = next();
    if (!r) return Step::none;
    flags = r->flags;
    tx_slots_.push_back({r->id, false, r->offset, r->size, r->gref});
    ++data_slots;
    frag_bytes += r->size;
    if (tx_slots_.size() > tx_.size()) {
      disable("a packet larger than the tx ring");
      return Step::none;
    }
  }

  // Validate (all slots are consumed now: whatever happens, each gets its response).
  if (!bad && first.size < kEthHeader) bad = "packet shorter than an Ethernet header";
  if (!bad && data_slots > kXenNetifNrSlotsMin) bad = "too many slots";
  if (!bad && frag_bytes > first.size) bad = "fragments larger than the packet";
  if (!bad) tx_slots_.front().len = static_cast<std::uint16_t>(first.size - frag_bytes);
  if (!bad) {
    for (const Slot& s : tx_slots_) {
      if (!s.extra && std::size_t{s.offset} + s.len > kPage) {
        bad = "a slot crosses its page";
        break;
      }
    }
  }
  if (bad) {
    guest_error("tx packet id {}: {} (size {}, {} slots)", first.id, bad, first.size, tx_slots_.size());
    tx_respond(kNetifRspError);
    counters_.tx_errors.fetch_add(1, std::memory_order_relaxed);
    return Step::dropped;
  }

  // Map each data slot read-only; gather the first bytes for header parsing.
  tx_maps_.clear();
  tx_iov_.clear();
  tx_iov_.push_back({&tx_vnet_, sizeof tx_vnet_});
  std::size_t hdr = 0;
  std::int16_t status = kNetifRspOkay;
  for (const Slot& s : tx_slots_) {
    if (s.extra || s.len == 0) continue;
    auto m = mapper_.map(s.gref, /*readonly=*/true);
    if (!m) {
      guest_error("tx packet id {}: grant {}: {}", first.id, s.gref, gnttab::to_string(m.error()));
      status = kNetifRspError;
      break;
    }
    tx_maps_.push_back(m->handle());
    const auto data = m->data().subspan(s.offset, s.len);
    tx_iov_.push_back({const_cast<std::uint8_t*>(data.data()), data.size()});
    const std::size_t n = std::min(kHdrCopy - hdr, data.size());
    std::memcpy(tx_hdr_.data() + hdr, data.data(), n);
    hdr += n;
  }
  if (status == kNetifRspOkay) {
    tx_header_from_copy(hdr);
    const std::span<const std::uint8_t> head(tx_hdr_.data(), hdr);
    auto v = vnet_from_netif(off, head);
    if (!v) {
      guest_error("tx packet id {}: {}", first.id, to_string(v.error()));
      status = kNetifRspError;
    } else if (const TxSource src = check_tx_source(head, cfg_.tx_source); src != TxSource::pass) {
      // Dropped as a firewall drops it: the guest is answered OKAY (tx_source.h).
      counters_.tx_spoofed.fetch_add(1, std::memory_order_relaxed);
      guest_error_in(spoof_logged_, "tx packet id {}: dropped: {} ({})", first.id, to_string(src), tx_source_str_);
      tx_unmap();
      tx_respond(kNetifRspOkay);
      return Step::dropped;
    } else {
      tx_vnet_ = *v;
      const int fd = tx_fd(std::span<const std::uint8_t>(tx_hdr_.data(), hdr), first.size);
      if (cfg_.tx_respond_early) {
        std::size_t n = 0;
        for (std::size_t i = 1; i < tx_iov_.size(); ++i) {  // [0] is the vnet header
          std::memcpy(tx_copy_.data() + n, tx_iov_[i].iov_base, tx_iov_[i].iov_len);
          n += tx_iov_[i].iov_len;  // the slots add up to first.size (validated above)
        }
        tx_unmap();
        tx_respond(kNetifRspOkay);
        if (!disabled()) push_and_notify();
        const iovec iov[2] = {{&tx_vnet_, sizeof tx_vnet_}, {tx_copy_.data(), n}};
        tx_written(::writev(fd, iov, 2), first.size, bytes);
        return Step::moved;
      }
      tx_written(::writev(fd, tx_iov_.data(), static_cast<int>(tx_iov_.size())), first.size, bytes);
    }
  }
  tx_unmap();
  tx_respond(status);
  if (status != kNetifRspOkay) {
    counters_.tx_errors.fetch_add(1, std::memory_order_relaxed);
    return Step::dropped;
  }
  return Step::moved;
}

void NetbackQueue::tx_header_from_copy(std::size_t hdr) noexcept {
  // tx_iov_: [0] the vnet header, then the data slots in the guest's pages. The first `hdr` bytes
  // of those were copied to tx_hdr_ and are what the offload parsing and the source check saw:
  // they go to the TAP from the copy, the rest from the pages.
  std::size_t skip = hdr;
  std::size_t i = 1;
  while (skip > 0 && i < tx_iov_.size()) {
    if (tx_iov_[i].iov_len <= skip) {
      skip -= tx_iov_[i].iov_len;
      tx_iov_.erase(tx_iov_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      tx_iov_[i].iov_base = static_cast<std::uint8_t*>(tx_iov_[i].iov_base) + skip;
      tx_iov_[i].iov_len -= skip;
      skip = 0;
    }
  }
  if (hdr > 0) tx_iov_.insert(tx_iov_.begin() + 1, iovec{tx_hdr_.data(), hdr});
}

bool NetbackQueue::tx_turn() noexcept {
  counters_.tx_turns.fetch_add(1, std::memory_order_relaxed);
  while (sched_.may_send()) {
    std::size_t bytes = 0;
    const Step s = tx_one(bytes);
    if (s == Step::none || s == Step::blocked || disabled()) return false;
    sched_.charge(bytes);
    turn_bytes_ += bytes;
    ++turn_packets_;
  }
  return true;
}

// ---- guest RX ------------------------------------------------------------------------------------

void NetbackQueue::rx_ingest(int max) noexcept {
  for (int i = 0; i < max && tap_readable_; ++i) {
    if (const std::size_t d = rx_queue_.make_room(); d > 0) {
      counters_.rx_overflow.fetch_add(d, std::memory_order_relaxed);
    }
    const auto iov = rx_queue_.ingress_iov();
    const ssize_t n = ::readv(tap_, iov.data(), static_cast<int>(iov.size()));
    if (n < 0) {
      tap_readable_ = false;  // EAGAIN (or an error: poll tells us when to try again)
      return;
    }
    if (static_cast<std::size_t>(n) > sizeof(VnetHdr)) rx_queue_.commit(static_cast<std::size_t>(n));
  }
}

bool NetbackQueue::rx_has_work() noexcept {
  if (rx_stalled_) {
    // Did the frontend post buffers, or has the packet waited too long?
    const bool timed_out = now_us() - rx_stall_since_ >= std::uint64_t{cfg_.rx_stall_ms} * 1000;
    auto n = rx_.unconsumed_requests();
    if (!n) {
      disable(to_string(n.error()));
      return false;
    }
    // Not yet enough for the head packet: stay asleep until more come or time runs out (then
    // what is queued is dropped), but keep draining the TAP (the backlog belongs in rx_queue_,
    // see the header) unless the config leaves it there; with nothing queued (all of it dropped
    // at the stall's timeout) the TAP is what we wait for. Timed out with nothing queued and
    // nothing to read: no work.
    const bool head = !rx_queue_.empty();
    return (head && *n >= rx_need_) || ((cfg_.rx_drain || !head) && tap_readable_) || (timed_out && head);
  }
  return !rx_queue_.empty() || tap_readable_;
}

std::size_t NetbackQueue::rx_available() noexcept {
  auto n = rx_.unconsumed_requests();
  if (!n) {
    disable(to_string(n.error()));
    return 0;
  }
  return rx_held_.size() + *n;
}

bool NetbackQueue::rx_hold(std::size_t n) noexcept {
  while (rx_held_.size() < n) {
    const RingIdx at = rx_.req_cons();
    auto r = rx_.pop_request();  // the caller saw enough requests (rx_available)
    if (!r) {
      disable(to_string(r.error()));
      return false;
    }
    if (rx_shadow_ != nullptr) rx_shadow_->put(at, *r);  // before any response lands in the slot
    RxHeld h;
    h.req = *r;
    if (auto m = mapper_.map(r->gref, /*readonly=*/false)) {
      h.handle = m->handle();
      h.page = m->writable();
    } else {
      guest_error("rx: buffer {} grant {}: {}", r->id, r->gref, gnttab::to_string(m.error()));
    }
    rx_held_.push_back(h);
  }
  return true;
}

void NetbackQueue::rx_respond(const NetifOffload& off, std::size_t data_slots, bool failed) noexcept {
  // Data is in request 0, then (after the extra slot's request, whose buffer stays unused)
  // requests 1+extra ... : netfront finds a response's buffer by its ring position.
  const std::size_t extra = off.gso_type ? 1 : 0;
  const std::size_t need = data_slots + extra;
  auto produce = [&](const NetifRxResponse& rsp) {
    if (auto r = rx_.produce_response(rsp); !r) disable(to_string(r.error()));
  };
  for (std::size_t i = 0; i < data_slots; ++i) {
    const RxHeld& h = rx_held_[i == 0 ? 0 : i + extra];
    const std::size_t len = std::min(kPage, rx_len_ - std::min(rx_len_, i * kPage));
    NetifRxResponse rsp{};
    rsp.id = h.req.id;
    rsp.offset = 0;
    rsp.status = failed ? kNetifRspError : static_cast<std::int16_t>(len);
    if (i + 1 < data_slots) rsp.flags |= kNetrxfMoreData;
    if (i == 0) {
      if (off.csum_blank) rsp.flags |= kNetrxfCsumBlank;
      if (off.data_validated) rsp.flags |= kNetrxfDataValidated;
      if (extra) rsp.flags |= kNetrxfExtraInfo;
    }
    produce(rsp);
    if (i == 0 && extra) {
      NetifExtraInfo e{};
      e.type = kXenNetifExtraTypeGso;
      e.u.gso.size = off.gso_size;
      e.u.gso.type = off.gso_type;
      produce(netif_extra_to_rx(e));
    }
  }
  // Our writes into the pages are done: let go of them before the responses are pushed.
  for (std::size_t i = 0; i < need; ++i) {
    if (!rx_held_[i].page.empty()) (void)mapper_.unmap(rx_held_[i].handle);
  }
  rx_held_.erase(rx_held_.begin(), rx_held_.begin() + static_cast<std::ptrdiff_t>(need));
  rx_resp_pending_ = true;
}

// The fast path: with buffers for the largest packet held, the TAP's next packet is read
// straight into the guest's pages (one copy, the kernel's). Its data goes to held buffers 0, 2,
// 3, ... since a GSO packet's extra info takes slot 1; one that turns out not to be GSO and
// spans pages is moved down one slot (rare: jumbo frames without GSO).
NetbackQueue::Step NetbackQueue::rx_direct(std::size_t& bytes) noexcept {
  rx_iov_.clear();
  rx_iov_.push_back({&rx_vnet_, sizeof rx_vnet_});
  for (std::size_t i = 0; i < kRxDirectSlots; ++i) {
    if (i != 1) rx_iov_.push_back({rx_held_[i].page.data(), kPage});
  }
  ssize_t n = -1;
  for (int frames = 0; frames < 64; ++frames) {  // skips frames without data (bounded)
    n = ::readv(tap_, rx_iov_.data(), static_cast<int>(rx_iov_.size()));
    if (n < 0) {
      tap_readable_ = false;  // EAGAIN (or an error: poll tells us when to try again)
      return Step::none;
    }
    if (static_cast<std::size_t>(n) > sizeof(VnetHdr)) break;
  }
  if (static_cast<std::size_t>(n) <= sizeof(VnetHdr)) return Step::none;
  rx_len_ = static_cast<std::size_t>(n) - sizeof(VnetHdr);
  auto drop = [&] {  // the buffers stay held for the next packet
    counters_.rx_dropped.fetch_add(1, std::memory_order_relaxed);
    return Step::dropped;
  };
  auto off = netif_from_vnet(rx_vnet_, cfg_.rx_gso);
  if (!off) return drop();
  const std::size_t data_slots = std::max<std::size_t>(1, (rx_len_ + kPage - 1) / kPage);
  if (!cfg_.sg && data_slots > 1) return drop();
  if (!off->gso_type) {
    for (std::size_t i = 1; i < data_slots; ++i) {
      const std::size_t len = std::min(kPage, rx_len_ - i * kPage);
      std::memcpy(rx_held_[i].page.data(), rx_held_[i + 1].page.data(), len);
    }
  }
  if (rx_fill_.adaptive()) rx_fill_.saw_flow(rx_queue_.flow_of(rx_held_[0].page.first(std::min(rx_len_, kPage))));
  rx_steer_seen(rx_held_[0].page.first(std::min(rx_len_, kPage)), rx_len_);
  rx_respond(*off, data_slots, /*failed=*/false);
  rx_wait_ends();  // the frontend takes packets again
  counters_.rx_packets.fetch_add(1, std::memory_order_relaxed);
  counters_.rx_bytes.fetch_add(rx_len_, std::memory_order_relaxed);
  bytes = rx_len_;
  return Step::moved;
}

void NetbackQueue::rx_wait_ends() noexcept {
  // A wait that reached its timeout with the buffers there, and was not ended by a drop at that
  // timeout (a frontend that stopped receiving for a while, then posted and notified): late.
  if (rx_stalled_ && !rx_stall_dropped_ && now_us() - rx_stall_since_ >= std::uint64_t{cfg_.rx_stall_ms} * 1000) {
    counters_.rx_waits_late.fetch_add(1, std::memory_order_relaxed);
  }
  rx_stalled_ = false;
}

NetbackQueue::Step NetbackQueue::rx_one(std::size_t& bytes) noexcept {
  bytes = 0;
  if (rx_queue_.empty() && tap_readable_ && rx_fill_.usable(rx_available()) >= kRxDirectSlots &&
      rx_hold(kRxDirectSlots)) {
    bool all_mapped = true;
    for (std::size_t i = 0; i < kRxDirectSlots; ++i) all_mapped = all_mapped && !rx_held_[i].page.empty();
    if (all_mapped) return rx_direct(bytes);
  }
  if (disabled()) return Step::none;
  // The queued path (packets already waiting, fewer buffers posted than the largest packet
  // needs, or one of them unusable): the next packet by flow order waits for buffers for *it*.
  if (rx_queue_.empty()) rx_ingest(1);
  const RxFlowQueue::Packet* p = rx_queue_.front();
  if (p == nullptr) return Step::none;
  rx_len_ = p->len;
  auto drop = [&] {
    rx_queue_.pop();
    counters_.rx_dropped.fetch_add(1, std::memory_order_relaxed);
    return Step::dropped;
  };
  auto off = netif_from_vnet(p->vnet, cfg_.rx_gso);
  if (!off) return drop();
  const std::size_t data_slots = std::max<std::size_t>(1, (rx_len_ + kPage - 1) / kPage);
  const std::size_t extra = off->gso_type ? 1 : 0;
  const std::size_t need = data_slots + extra;
  if ((!cfg_.sg && data_slots > 1) || need > rx_.size()) return drop();
  const std::size_t avail = rx_available();
  if (disabled()) return Step::none;
  if (rx_fill_.usable(avail) < need) {
    if (avail >= need) {  // posted, but the guest has enough ahead of it (rx_fill_limit.h)
      rx_fill_.held_back();
      counters_.rx_fill_holds.fetch_add(1, std::memory_order_relaxed);
    }
    const std::uint64_t now = now_us();
    rx_need_ = static_cast<RingIdx>(rx_fill_.posted_needed(need) - rx_held_.size());  // more than we hold
    if (!rx_stalled_) {
      rx_stalled_ = true;
      rx_stall_since_ = now;
      rx_stall_dropped_ = false;
      counters_.rx_waits.fetch_add(1, std::memory_order_relaxed);
    } else if (now - rx_stall_since_ >= std::uint64_t{cfg_.rx_stall_ms} * 1000) {
      // The frontend stopped consuming: drop rather than buffer (and keep draining the TAP).
      rx_stall_dropped_ = true;
      counters_.rx_dropped.fetch_add(rx_queue_.clear(), std::memory_order_relaxed);
      return Step::dropped;
    }
    // Take what waits in the TAP into the flow queue, so that the backlog is scheduled by flow
    // and not in the TAP's arrival order (unless the config leaves it in the TAP).
    if (cfg_.rx_drain) rx_ingest(kDrainBatch);
    return Step::blocked;
  }
  rx_wait_ends();
  if (!rx_hold(need)) return Step::none;
  bool failed = false;
  for (std::size_t i = 0; i < data_slots; ++i) {
    const RxHeld& h = rx_held_[i == 0 ? 0 : i + extra];
    const std::size_t at = i * kPage;
    const std::size_t len = std::min(kPage, rx_len_ - std::min(rx_len_, at));
    if (h.page.empty()) {
      failed = true;
    } else {
      rx_queue_.copy(*p, at, h.page.first(len));
    }
  }
  if (failed) {
    guest_error("rx: a posted buffer could not be mapped");
    counters_.rx_errors.fetch_add(1, std::memory_order_relaxed);
  }
  rx_fill_.saw_flow(p->flow);
  if (!failed) rx_steer_seen(rx_held_[0].page.first(std::min(rx_len_, kPage)), rx_len_);
  rx_respond(*off, data_slots, failed);
  rx_queue_.pop();
  if (failed) return Step::dropped;
  counters_.rx_queued.fetch_add(1, std::memory_order_relaxed);
  counters_.rx_packets.fetch_add(1, std::memory_order_relaxed);
  counters_.rx_bytes.fetch_add(rx_len_, std::memory_order_relaxed);
  bytes = rx_len_;
  return Step::moved;
}

// How far behind the guest is (rx_fill_limit.h). Two upper bounds on the responses it has not
// consumed, the smaller taken: the buffers it has not posted again (Linux netfront re-posts what
// it consumed at the end of each poll; a frontend that posts fewer than the ring would look
// behind for ever by this one alone) and the responses after the point where it last re-armed
// its event (stale while it is busy). The guest writes rsp_event: a wild value only makes the
// second bound the whole ring, and then the first decides.
void NetbackQueue::rx_observe_guest() noexcept {
  if (!rx_fill_.adaptive()) return;
  auto n = rx_.unconsumed_requests();
  if (!n) return;  // the caller's next ring access disables the queue
  const std::size_t ring = rx_.size();
  const std::size_t posted = rx_held_.size() + *n;
  std::size_t backlog = ring > posted ? ring - posted : 0;
  const std::atomic_ref<RingIdx> rsp_event(
      *reinterpret_cast<RingIdx*>(rx_.bytes().data() + offsetof(SharedRingHeader, rsp_event)));
  const RingIdx published = rx_.rsp_prod_pvt();  // pushed after every turn (push_and_notify)
  const RingIdx since_armed = static_cast<RingIdx>(published - (rsp_event.load(std::memory_order_relaxed) - 1));
  if (since_armed <= ring) backlog = std::min<std::size_t>(backlog, since_armed);
  // Idle: it consumed every response published and asked to hear of the next one.
  const bool idle = !rx_resp_pending_ && since_armed == 0;
  rx_fill_.observe(backlog, idle, now_us());
  counters_.rx_fill_limit.store(rx_fill_.limit(), std::memory_order_relaxed);
  counters_.rx_fill_grows.store(rx_fill_.grows(), std::memory_order_relaxed);
  counters_.rx_fill_shrinks.store(rx_fill_.shrinks(), std::memory_order_relaxed);
}

bool NetbackQueue::rx_turn() noexcept {
  counters_.rx_turns.fetch_add(1, std::memory_order_relaxed);
  rx_observe_guest();
  while (sched_.may_send()) {
    std::size_t bytes = 0;
    const Step s = rx_one(bytes);
    if (s == Step::none || s == Step::blocked || disabled()) return false;
    sched_.charge(bytes);
    turn_bytes_ += bytes;
    ++turn_packets_;
  }
  return true;
}

// ---- the loop ------------------------------------------------------------------------------------

void NetbackQueue::push_and_notify() noexcept {
  bool kick_tx = std::exchange(tx_notify_owed_, false), kick_rx = std::exchange(rx_notify_owed_, false);
  if (tx_resp_pending_) {
    tx_resp_pending_ = false;
    if (tx_.push_responses()) kick_tx = true;
  }
  if (rx_resp_pending_) {
    rx_resp_pending_ = false;
    if (rx_.push_responses()) kick_rx = true;
  }
  // Never notify without new responses (late-EOI frontends): only a push that the ring's event
  // index asks for notifies (or, once, responses a dead backend published unannounced), and only
  // on the channel of that ring.
  auto kick = [&](domain::EventChannel& ch) {
    counters_.notifications.fetch_add(1, std::memory_order_relaxed);
    if (auto r = ch.notify(); !r) disable("event channel notify failed");
  };
  if (rx_evtchn_) {
    if (kick_tx) kick(*tx_evtchn_);
    if (kick_rx) kick(*rx_evtchn_);
  } else if (kick_tx || kick_rx) {
    kick(*tx_evtchn_);
  }
}

bool NetbackQueue::poll_once() noexcept {
  tap_readable_ = true;  // no poll() told us: just try (one EAGAIN at worst)
  tx_looked_us_ = now_us();  // as after poll(): the time between calls is not ours
  return pass();
}

void NetbackQueue::resume_drain() noexcept {
  // RX: every buffer goes back unused, with the frontend's id: the rx shadow's copy where it has one
  // (a torn slot keeps the id, except an extra-info response's), else the slot's (see queue.h).
  for (; rx_resume_ > 0 && !disabled(); --rx_resume_) {
    const RingIdx at = rx_.req_cons();
    auto r = rx_.pop_request();
    if (!r) {
      if (r.error() != RingError::empty) disable(to_string(r.error()));
      rx_resume_ = 0;
      break;
    }
    NetifRxResponse rsp{};
    rsp.id = r->id;
    if (rx_shadow_ != nullptr) {
      if (auto taken = rx_shadow_->get(at)) rsp.id = taken->id;  // the slot may be torn
    }
    rsp.status = kNetifRspError;
    if (auto p = rx_.produce_response(rsp); !p) {
      disable(to_string(p.error()));
      break;
    }
    rx_resp_pending_ = true;
    counters_.resume_rx_returned.fetch_add(1, std::memory_order_relaxed);
  }
  // TX: each packet is walked by its flags (intact in a torn slot) and answered, never sent.
  while (tx_resume_ > 0 && !disabled()) {
    const RingIdx before = tx_.req_cons();
    auto first = tx_.pop_request();
    if (!first) {
      if (first.error() != RingError::empty) disable(to_string(first.error()));
      tx_resume_ = 0;
      break;
    }
    tx_slots_.clear();
    tx_slots_.push_back({first->id, false, 0, 0, 0});
    std::uint16_t flags = first->flags;
    bool extra = (flags & kNettxfExtraInfo) != 0;
    for (unsigned i = 0; extra || (flags & kNettxfMoreData); ++i) {
      if (i >= tx_.size()) {
        disable("a packet larger than the tx ring");
        return;
      }
      auto r = tx_.pop_request();
      if (!r) {
        disable(r.error() == RingError::empty ? "a packet's slots are not all on the tx ring"
                                              : to_string(r.error()));
        return;
      }
      if (extra) {
        tx_slots_.push_back({0, true, 0, 0, 0});
        extra = (netif_extra_from_tx(*r).flags & kXenNetifExtraFlagMore) != 0;
        continue;
      }
      flags = r->flags;
      tx_slots_.push_back({r->id, false, 0, 0, 0});
    }
    tx_respond(kNetifRspOkay);
    counters_.resume_tx_dropped.fetch_add(1, std::memory_order_relaxed);
    const RingIdx used = tx_.req_cons() - before;
    tx_resume_ = used >= tx_resume_ ? 0 : tx_resume_ - used;
  }
  if (!disabled()) push_and_notify();
}

void NetbackQueue::idle_in_share() noexcept {
  if (cfg_.share == nullptr) return;
  cfg_.share->set_backlog(share_acc_[0], false);
  cfg_.share->set_backlog(share_acc_[1], false);
}

bool NetbackQueue::pass() noexcept {
  if (serve()) return true;
  // Disabled, maybe in the middle of a turn that moved bytes and left its direction marked
  // backlogged: marked so, it would hold every other vif's queues to its frozen count until the
  // teardown (never, with xenstored gone: backend.cpp keeps serving then).
  idle_in_share();
  return false;
}

bool NetbackQueue::serve() noexcept {
  if (disabled()) return false;
  if (tx_resume_ > 0 || rx_resume_ > 0) resume_drain();
  if (!disabled() && (tx_notify_owed_ || rx_notify_owed_)) push_and_notify();
  if (disabled()) return false;
  busy_ = false;
  for (int t = 0; t < kTurnsPerPoll && !disabled(); ++t) {
    const bool tx_ready = tx_has_work();
    const std::uint64_t look = now_us();
    if (tx_ready && !tx_seen_) {
      // New tx requests: at most this long they waited for us (counters, queue.h).
      const std::uint64_t after = look - std::min(tx_looked_us_, look);
      counters_.tx_found.fetch_add(1, std::memory_order_relaxed);
      counters_.tx_found_after_us.fetch_add(after, std::memory_order_relaxed);
      if (after >= 1000) counters_.tx_found_after_1ms.fetch_add(1, std::memory_order_relaxed);
      if (after > counters_.tx_found_after_max_us.load(std::memory_order_relaxed)) {
        counters_.tx_found_after_max_us.store(after, std::memory_order_relaxed);
      }
    }
    tx_seen_ = tx_ready || tx_rate_blocked_;  // a credit window that reopens is not news
    tx_looked_us_ = look;
    const bool rx_ready = !disabled() && rx_has_work();
    if (disabled()) break;
    bool tx_go = tx_ready, rx_go = rx_ready;
    FairShare* share = cfg_.share;
    if (share != nullptr) {
      // Across threads (fair_share.h): a direction that is ahead of another queue's lets it
      // catch up; if neither of ours may go, give the CPU away for a bounded time.
      share->set_backlog(share_acc_[0], tx_ready);
      share->set_backlog(share_acc_[1], rx_ready);
      const std::uint64_t seen = share->generation();  // a charge after this ends the wait below
      tx_go = tx_ready && share->may_go(share_acc_[0]);
      rx_go = rx_ready && share->may_go(share_acc_[1]);
      if ((tx_ready || rx_ready) && !tx_go && !rx_go) {
        counters_.fair_waits.fetch_add(1, std::memory_order_relaxed);
        (void)share->wait(std::chrono::milliseconds(1), seen);
        busy_ = true;  // the work is still there
        continue;
      }
    }
    auto d = sched_.begin_turn(tx_go, rx_go);
    if (!d) break;
    turn_bytes_ = 0;
    turn_packets_ = 0;
    const bool more = *d == Dir::tx ? tx_turn() : rx_turn();
    sched_.end_turn(more);
    const std::uint64_t turn_end = now_us();
    (*d == Dir::tx ? counters_.tx_turn_us : counters_.rx_turn_us)
        .fetch_add(turn_end - look, std::memory_order_relaxed);
    if (*d == Dir::tx && !more && !tx_rate_blocked_ && !tx_held_) {
      // The turn emptied the tx ring: what comes next is new, and waits from now.
      tx_seen_ = false;
      tx_looked_us_ = turn_end;
    }
    if (share != nullptr) {
      FairShare::Account* a = share_acc_[*d == Dir::tx ? 0 : 1];
      share->charge(a, turn_cost(turn_bytes_, turn_packets_, sched_.config()));
      // Ready but nothing moved or dropped (no rx buffers, rate limit): not holding anyone back.
      if (turn_packets_ == 0) share->set_backlog(a, false);
    }
    if (!disabled()) push_and_notify();
    if (t + 1 == kTurnsPerPoll) busy_ = true;
  }
  if (disabled()) return false;
  // Before sleeping: re-arm the event indexes and look once more (no lost wake-up). The kicks so
  // far go first, on every channel, and the rings' counts are noted: the looks below cover what
  // those kicks announced (a ring not looked at needs no kick: tx waiting for credit wakes by its
  // timer, and without a stalled packet nothing waits for rx buffers), so a kick that wakes the
  // sleep came after them, and one that finds the counts as noted brought nothing
  // (kick_throttle.h). What is posted between the note and the looks, they find: no sleep then.
  const bool tx_arm = !tx_rate_blocked_ && !tx_held_;
  const bool rx_arm = rx_stalled_ && !rx_queue_.empty();
  (void)tx_evtchn_->consume();
  if (rx_evtchn_) (void)rx_evtchn_->consume();
  asleep_counts_ = ring_counts();
  if (tx_arm) {
    auto more = tx_.final_check_for_requests();
    if (!more) {
      disable(to_string(more.error()));
      return false;
    }
    if (*more) busy_ = true;
  }
  if (rx_arm) {
    // Waiting for rx buffers: the usual final check (req_event = req_cons + 1) would be already
    // passed while some buffers are posted but not enough, and we would spin. Ask instead to be
    // notified at the next buffer after those posted now (Linux netback does the same), and look
    // again until no buffer came in between (shared_ring.h: an event set from a count that
    // buffers posted meanwhile made stale was a lost wake-up until session 41 — the packet then
    // waited for the stall's timeout, rx_stall_ms).
    auto enough = rx_.check_for_requests(rx_need_);
    if (!enough) {
      disable(to_string(enough.error()));
      return false;
    }
    if (*enough) busy_ = true;
  }
  return true;
}

NetbackQueue::RingCounts NetbackQueue::ring_counts() noexcept {
  RingCounts c;
  if (auto n = tx_.unconsumed_requests()) c.tx = *n;
  if (auto n = rx_.unconsumed_requests()) c.rx = *n;
  return c;
}

void NetbackQueue::kicked(KickThrottle& throttle, bool news) noexcept {
  if (!news) counters_.spurious_kicks.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t mutes = throttle.mutes();
  throttle.kicked(news, now_us());
  if (throttle.mutes() != mutes) {
    counters_.kick_mutes.fetch_add(1, std::memory_order_relaxed);
    if (throttle.mutes() == 1) {
      spdlog::warn("{}: the frontend keeps kicking with nothing new in its rings (over {} times in a row): its event "
                   "channel is looked at less often for a while (each such kick doubles the pause, up to {} ms)",
                   name_, KickThrottle::kStreak, KickThrottle::kMaxMuteUs / 1000);
    }
  }
}

void NetbackQueue::run() noexcept {
  try {
    tx_looked_us_ = now_us();
    while (pass()) {
      pollfd fds[4];
      int n = 0;
      fds[n++] = {stop_.fd(), POLLIN, 0};
      // A muted port (kick_throttle.h) stays out until its mute ends; its kicks wait meanwhile.
      const std::uint64_t before_poll = now_us();
      const int tx_at = tx_kicks_.muted(before_poll) ? -1 : n;
      if (tx_at >= 0) fds[n++] = {tx_evtchn_->wait_fd(), POLLIN, 0};
      const int rx_at = rx_evtchn_ && !rx_kicks_.muted(before_poll) ? n : -1;
      if (rx_at >= 0) fds[n++] = {rx_evtchn_->wait_fd(), POLLIN, 0};
      // The TAP wakes us whenever it has packets, except while a packet waits for buffers and
      // the backlog is left in the TAP (rx_drain off, the default): then only the frontend's
      // buffers (or the stall's timeout) wake us. With rx_drain the backlog goes into the
      // bounded flow queue (see the header) and never piles up in the TAP's FIFO.
      const int tap_at = cfg_.rx_drain || !rx_stalled_ || rx_queue_.empty() ? n : -1;
      if (tap_at >= 0) fds[n++] = {tap_, POLLIN, 0};
      int timeout = -1;
      const std::uint64_t now = before_poll;  // the mutes above and their timeouts below: one time
      if (!busy_) idle_in_share();  // going to sleep: no work to be waited for
      if (busy_) {
        timeout = 0;
      } else {
        if (tx_rate_blocked_) {
          const std::uint64_t at = limiter_.next_window_us();
          timeout = static_cast<int>(std::min<std::uint64_t>(at > now ? (at - now + 999) / 1000 : 0, 1000));
        }
        if (rx_stalled_ && !rx_queue_.empty()) {  // wake up to drop what waits, once its time is up
          const std::uint64_t at = rx_stall_since_ + std::uint64_t{cfg_.rx_stall_ms} * 1000;
          const int t = static_cast<int>(std::min<std::uint64_t>(at > now ? (at - now + 999) / 1000 : 0, 1000));
          timeout = timeout < 0 ? t : std::min(timeout, t);
        }
        for (const KickThrottle* k : {&tx_kicks_, &rx_kicks_}) {
          if (const int t = k->mute_left_ms(now); t >= 0) timeout = timeout < 0 ? t : std::min(timeout, t);
        }
      }
      if (::poll(fds, static_cast<nfds_t>(n), timeout) < 0 && errno != EINTR) {
        disable("poll failed");
        break;
      }
      counters_.wakeups.fetch_add(1, std::memory_order_relaxed);
      // Maybe asleep until now: not time the tx ring waited for us (a poll that could not
      // sleep, with work left, ends nothing).
      if (timeout != 0) tx_looked_us_ = now_us();
      if (fds[0].revents) break;
      // A kick that woke a real sleep (after serve() consumed that channel's earlier kicks and
      // looked at its ring) and finds the rings unchanged brought nothing.
      const bool slept = timeout != 0;
      const RingCounts now_counts = slept ? ring_counts() : RingCounts{};
      if (tx_at >= 0 && fds[tx_at].revents) {
        (void)tx_evtchn_->consume();
        if (slept) {
          const bool news = rx_evtchn_ ? now_counts.tx != asleep_counts_.tx : !(now_counts == asleep_counts_);
          kicked(tx_kicks_, news || now_counts.tx < 0 || now_counts.rx < 0);
        }
      }
      if (rx_at >= 0 && fds[rx_at].revents) {
        (void)rx_evtchn_->consume();
        if (slept) kicked(rx_kicks_, now_counts.rx != asleep_counts_.rx || now_counts.rx < 0);
      }
      // Not watched: maybe readable (one EAGAIN at worst, once the frontend's buffers came).
      if (tap_at < 0 || fds[tap_at].revents) tap_readable_ = true;
    }
    if (!disabled()) push_and_notify();
  } catch (...) {
    disable("unexpected exception on the data-plane thread");
  }
  idle_in_share();  // stopped or disabled: this thread takes no more turns
}

}  // namespace xpv::netback
