#include "xpv/frontends/netfront.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "xpv/thread_name.h"

namespace xpv::frontends {

using namespace xpv::ring;
using netback::VnetHdr;

namespace {
constexpr std::size_t kPage = kXenPageSize;
constexpr std::uint32_t kMaxDataSlots = 17;  // 64 KiB + headers in 4 KiB pages
constexpr std::size_t kHdrCopy = 256;

std::uint64_t need_gfn(domain::Domain& dom, std::uint64_t n, const char* what) {
  auto g = dom.alloc_pages(n);
  if (!g) throw std::runtime_error(std::string("netfront: the domain has no room for ") + what);
  return *g;
}
}  // namespace

Netfront::Netfront(domain::Domain& dom, GuestEvents& events, int tap_fd, NetfrontConfig config)
    : dom_(dom), events_(events), tap_(tap_fd), config_(config) {
  auto& grants = dom_.grants();
  auto grant = [&](std::uint64_t gfn, bool ro) {
    auto r = grants.grant_access(config_.backend, gfn, ro);
    if (!r) throw std::runtime_error("netfront: grant table full");
    return *r;
  };
  tx_ring_gfn_ = need_gfn(dom_, 1, "the tx ring");
  rx_ring_gfn_ = need_gfn(dom_, 1, "the rx ring");
  auto tx = NetifTxFrontRing::init(dom_.pages(tx_ring_gfn_, 1));
  auto rx = NetifRxFrontRing::init(dom_.pages(rx_ring_gfn_, 1));
  if (!tx || !rx) throw std::runtime_error("netfront: cannot set up the rings");
  tx_.emplace(std::move(*tx));
  rx_.emplace(std::move(*rx));
  tx_ring_ref_ = grant(tx_ring_gfn_, false);
  rx_ring_ref_ = grant(rx_ring_gfn_, false);
  tx_pages_gfn_ = need_gfn(dom_, tx_->size(), "tx buffers");
  rx_pages_gfn_ = need_gfn(dom_, rx_->size(), "rx buffers");
  for (std::uint32_t i = 0; i < tx_->size(); ++i) tx_refs_.push_back(grant(tx_pages_gfn_ + i, true));
  for (std::uint32_t i = 0; i < rx_->size(); ++i) rx_refs_.push_back(grant(rx_pages_gfn_ + i, false));
  for (std::uint32_t i = tx_->size(); i-- > 0;) tx_free_.push_back(static_cast<std::uint16_t>(i));
  tx_busy_.assign(tx_->size(), false);
  rx_pkt_.reserve(rx_->size());

  auto k = domain::EventFd::create();
  auto s = domain::EventFd::create();
  if (!k || !s) throw std::runtime_error("netfront: eventfd");
  kick_ = std::move(*k);
  stop_ = std::move(*s);
  auto port = dom_.evtchn().alloc_unbound(config_.backend);
  if (!port) throw std::runtime_error("netfront: no event channel");
  tx_port_ = rx_port_ = *port;
  if (config_.split_event_channels) {
    auto p2 = dom_.evtchn().alloc_unbound(config_.backend);
    if (!p2) throw std::runtime_error("netfront: no event channel");
    rx_port_ = *p2;
  }
  // The handler runs on the GuestEvents thread: it only wakes the data thread.
  events_.set_handler(tx_port_, [this] { (void)kick_.notify(); });
  if (rx_port_ != tx_port_) events_.set_handler(rx_port_, [this] { (void)kick_.notify(); });
}

Netfront::~Netfront() {
  stop();
  events_.clear_handler(tx_port_);
  (void)dom_.evtchn().close(tx_port_);
  if (rx_port_ != tx_port_) {
    events_.clear_handler(rx_port_);
    (void)dom_.evtchn().close(rx_port_);
  }
  // A backend that is closing at the same moment (the toolstack's detach tells both ends at once)
  // may still have the rings mapped for a few milliseconds: give it a bounded while (1 s) before
  // calling a grant leaked, as Linux defers the end of a grant still in use.
  auto& grants = dom_.grants();
  std::vector<gnttab::GrantRef> left;
  for (auto r : tx_refs_) left.push_back(r);
  for (auto r : rx_refs_) left.push_back(r);
  left.push_back(tx_ring_ref_);
  left.push_back(rx_ring_ref_);
  for (int round = 0; !left.empty(); ++round) {
    std::erase_if(left, [&](gnttab::GrantRef r) { return static_cast<bool>(grants.end_access(r)); });
    if (left.empty() || round == 100) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // A page whose grant is still mapped is not given back (the backend may still write into it),
  // as Linux's frontends keep such a page for a deferred free.
  for (auto r : left) spdlog::warn("netfront: grant {} still mapped by the backend; it and its page are kept, not reused", r);
  const auto none_left = [&](const std::vector<gnttab::GrantRef>& refs) {
    return std::none_of(refs.begin(), refs.end(), [&](gnttab::GrantRef r) { return std::ranges::count(left, r) != 0; });
  };
  if (none_left(tx_refs_)) dom_.free_pages(tx_pages_gfn_, tx_refs_.size());
  if (none_left(rx_refs_)) dom_.free_pages(rx_pages_gfn_, rx_refs_.size());
  if (none_left({tx_ring_ref_})) dom_.free_pages(tx_ring_gfn_, 1);
  if (none_left({rx_ring_ref_})) dom_.free_pages(rx_ring_gfn_, 1);
}

void Netfront::start() {
  if (thread_.joinable()) return;
  post_rx(rx_->size());
  thread_ = std::thread([this] {
    set_thread_name("netfront");
    loop();
  });
}

void Netfront::stop() noexcept {
  if (!thread_.joinable()) return;
  (void)stop_.notify();
  thread_.join();
}

void Netfront::break_device(const char* why) noexcept {
  if (!broken_.exchange(true)) spdlog::error("netfront: broken: {}", why);
}

void Netfront::post_rx(std::uint32_t n) noexcept {
  for (std::uint32_t i = 0; i < n; ++i) {
    NetifRxRequest req{};
    const auto id = static_cast<std::uint16_t>(rx_->req_prod_pvt() & (rx_->size() - 1));
    req.id = id;
    req.gref = rx_refs_[id];
    if (!rx_->produce_request(req)) {
      break_device("rx ring overfull");
      return;
    }
  }
  if (n > 0 && rx_->push_requests()) {
    stats_.notifications.fetch_add(1, std::memory_order_relaxed);
    (void)dom_.evtchn().send(rx_port_);
  }
}

bool Netfront::tx_responses() noexcept {
  bool any = false;
  for (;;) {
    auto r = tx_->pop_response();
    if (!r) {
      if (r.error() != RingError::empty) break_device(to_string(r.error()));
      return any;
    }
    any = true;
    if (r->status == kNetifRspNull) continue;  // the answer to an extra-info slot
    if (r->id >= tx_busy_.size() || !tx_busy_[r->id]) {
      break_device("tx response for an id that is not outstanding");
      return any;
    }
    tx_busy_[r->id] = false;
    tx_free_.push_back(r->id);
    if (r->status != kNetifRspOkay) stats_.tx_errors.fetch_add(1, std::memory_order_relaxed);
  }
}

void Netfront::deliver_rx() noexcept {
  const std::uint32_t slots = static_cast<std::uint32_t>(rx_pkt_.size()) + (rx_expect_extra_ ? 1 : 0);
  rx_to_post_ += slots;
  if (rx_bad_) {
    stats_.rx_errors.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  iovec iov[kMaxDataSlots + 2];
  VnetHdr vnet{};
  std::uint8_t hdr[kHdrCopy];
  std::size_t hlen = 0, total = 0;
  int n = 0;
  iov[n++] = {&vnet, sizeof vnet};
  for (const RxSlot& s : rx_pkt_) {
    auto page = dom_.pages(rx_pages_gfn_ + (s.index & (rx_->size() - 1)), 1).subspan(s.offset, s.len);
    iov[n++] = {page.data(), page.size()};
    const std::size_t c = std::min(kHdrCopy - hlen, page.size());
    std::memcpy(hdr + hlen, page.data(), c);
    hlen += c;
    total += s.len;
  }
  auto v = netback::vnet_from_netif(rx_off_, std::span<const std::uint8_t>(hdr, hlen));
  if (!v) {
    stats_.rx_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  vnet = *v;
  if (::writev(tap_, iov, n) < 0) {
    stats_.rx_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  stats_.rx_packets.fetch_add(1, std::memory_order_relaxed);
  stats_.rx_bytes.fetch_add(total, std::memory_order_relaxed);
}

bool Netfront::rx_responses() noexcept {
  std::uint32_t packets = 0;
  while (packets < config_.batch && !broken()) {
    const RingIdx index = rx_->rsp_cons();
    auto r = rx_->pop_response();
    if (!r) {
      if (r.error() != RingError::empty) break_device(to_string(r.error()));
      break;
    }
    if (rx_in_packet_ && rx_expect_extra_ && !rx_extra_seen_) {
      // The extra-info slot right after the first response.
      rx_extra_seen_ = true;
      const NetifExtraInfo e = netif_extra_from_rx(*r);
      if (e.type == kXenNetifExtraTypeGso) {
        rx_off_.gso_type = e.u.gso.type;
        rx_off_.gso_size = e.u.gso.size;
      }
      if (e.flags & kXenNetifExtraFlagMore) rx_bad_ = true;  // we only ever accept one extra
      if (!(rx_first_flags_ & kNetrxfMoreData)) {
        deliver_rx();
        rx_in_packet_ = false;
        ++packets;
      }
      continue;
    }
    // Buffers are found by ring position (as Linux's netfront does); the id is only checked on
    // a response that carries data. An error response may name another id: a restarted
    // backend without its predecessor's rx shadow gives back every buffer that one had taken
    // with the id its slot holds, and the slot of a GSO extra-info response written but never
    // published no longer holds ours (backends/netback/include/xpv/netback/queue.h, "Resume").
    // Its buffer is posted again.
    const std::uint16_t id_expected = static_cast<std::uint16_t>(index & (rx_->size() - 1));
    if (r->id != id_expected) {
      if (r->status >= 0) {
        break_device("rx response id does not match its slot");
        break;
      }
      stats_.rx_foreign_ids.fetch_add(1, std::memory_order_relaxed);
    }
    RxSlot s{index, 0, 0};
    if (r->status < 0 || std::size_t{r->offset} + static_cast<std::uint16_t>(r->status) > kPage) {
      if (r->status >= 0) {
        break_device("rx response past its page");
        break;
      }
      rx_bad_ = true;
    } else {
      s.offset = r->offset;
      s.len = static_cast<std::uint16_t>(r->status);
    }
    if (!rx_in_packet_) {
      rx_in_packet_ = true;
      rx_pkt_.clear();
      rx_bad_ = r->status < 0;
      rx_first_flags_ = r->flags;
      rx_expect_extra_ = (r->flags & kNetrxfExtraInfo) != 0;
      rx_extra_seen_ = false;
      rx_off_ = {};
      rx_off_.csum_blank = (r->flags & kNetrxfCsumBlank) != 0;
      rx_off_.data_validated = (r->flags & kNetrxfDataValidated) != 0;
      rx_pkt_.push_back(s);
      if (rx_expect_extra_) continue;  // the extra slot decides whether the packet is complete
    } else {
      rx_pkt_.push_back(s);
      if (rx_pkt_.size() > kMaxDataSlots) rx_bad_ = true;
    }
    if (!(r->flags & kNetrxfMoreData)) {
      deliver_rx();
      rx_in_packet_ = false;
      ++packets;
      // Give the buffers back as soon as a whole packet's worth is free, not at the end of the
      // batch: the backend may be waiting for them (no pipeline bubble while we deliver).
      if (rx_to_post_ >= kMaxDataSlots + 1) {
        post_rx(rx_to_post_);
        rx_to_post_ = 0;
      }
    }
  }
  if (rx_to_post_ > 0 && !broken()) {
    post_rx(rx_to_post_);
    rx_to_post_ = 0;
  }
  return packets == config_.batch;
}

bool Netfront::tx_from_tap() noexcept {
  std::uint32_t packets = 0;
  bool notify = false;
  while (packets < config_.batch && tap_readable_ && !broken()) {
    if (tx_free_.size() < kMaxDataSlots || tx_->free_requests() < kMaxDataSlots + 1) break;
    VnetHdr vnet{};
    iovec iov[kMaxDataSlots + 1];
    iov[0] = {&vnet, sizeof vnet};
    for (std::uint32_t i = 0; i < kMaxDataSlots; ++i) {
      const std::uint16_t id = tx_free_[tx_free_.size() - 1 - i];
      iov[i + 1] = {dom_.pages(tx_pages_gfn_ + id, 1).data(), kPage};
    }
    const ssize_t n = ::readv(tap_, iov, kMaxDataSlots + 1);
    if (n < 0) {
      tap_readable_ = false;
      break;
    }
    if (static_cast<std::size_t>(n) <= sizeof vnet) continue;
    const std::size_t len = static_cast<std::size_t>(n) - sizeof vnet;
    auto off = netback::netif_from_vnet(vnet, config_.backend_gso);
    const auto slots = static_cast<std::uint32_t>((len + kPage - 1) / kPage);
    if (!off || len > kXenNetifMaxTxSize || (!config_.backend_sg && slots > 1)) {
      stats_.tx_dropped.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    for (std::uint32_t i = 0; i < slots; ++i) {
      const std::uint16_t id = tx_free_.back();
      tx_free_.pop_back();
      tx_busy_[id] = true;
      NetifTxRequest req{};
      req.gref = tx_refs_[id];
      req.offset = 0;
      req.id = id;
      if (i == 0) {
        req.size = static_cast<std::uint16_t>(len);
        if (off->csum_blank) req.flags |= kNettxfCsumBlank;
        if (off->data_validated) req.flags |= kNettxfDataValidated;
        if (off->gso_type) req.flags |= kNettxfExtraInfo;
      } else {
        req.size = static_cast<std::uint16_t>(std::min(kPage, len - std::size_t{i} * kPage));
      }
      if (i + 1 < slots) req.flags |= kNettxfMoreData;
      (void)tx_->produce_request(req);
      if (i == 0 && off->gso_type) {
        NetifExtraInfo e{};
        e.type = kXenNetifExtraTypeGso;
        e.u.gso.size = off->gso_size;
        e.u.gso.type = off->gso_type;
        (void)tx_->produce_request(netif_extra_to_tx(e));
      }
    }
    ++packets;
    stats_.tx_packets.fetch_add(1, std::memory_order_relaxed);
    stats_.tx_bytes.fetch_add(len, std::memory_order_relaxed);
    // Publish each packet whole (a backend may treat a half-published packet as a violation).
    notify |= tx_->push_requests();
  }
  if (notify) {
    stats_.notifications.fetch_add(1, std::memory_order_relaxed);
    (void)dom_.evtchn().send(tx_port_);
  }
  return packets == config_.batch;
}

void Netfront::loop() noexcept {
  while (true) {
    bool busy = false;
    if (!broken()) {
      tx_responses();
      busy |= rx_responses();
      busy |= tx_from_tap();
      tx_responses();
    }
    if (!busy && !broken()) {
      auto t = tx_->final_check_for_responses();
      auto r = rx_->final_check_for_responses();
      if (!t || !r) break_device("bad response producer index");
      else busy = *t || *r;
    }
    const bool can_tx = tx_free_.size() >= kMaxDataSlots && tx_->free_requests() >= kMaxDataSlots + 1;
    pollfd fds[3] = {{stop_.fd(), POLLIN, 0},
                     {kick_.fd(), POLLIN, 0},
                     {tap_, static_cast<short>(can_tx && !broken() ? POLLIN : 0), 0}};
    if (::poll(fds, 3, busy ? 0 : -1) < 0 && errno != EINTR) break;
    stats_.wakeups.fetch_add(1, std::memory_order_relaxed);
    if (fds[0].revents) break;
    if (fds[1].revents) (void)kick_.consume();
    if (fds[2].revents) tap_readable_ = true;
  }
}

}  // namespace xpv::frontends
