#include "xpv/netback/connection.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <stdexcept>

#include "xpv/thread_name.h"

namespace xpv::netback {

std::array<std::uint8_t, 6> host_side_mac(std::uint16_t domid, std::uint32_t devid) noexcept {
  return {0xfe, 0xff, static_cast<std::uint8_t>(domid >> 8), static_cast<std::uint8_t>(domid),
          static_cast<std::uint8_t>(devid >> 8), static_cast<std::uint8_t>(devid)};
}

VifConnection::VifConnection(std::string name, std::shared_ptr<domain::ForeignDomain> dom,
                             const std::vector<VifQueueRings>& queues, const VifSettings& settings,
                             std::function<void(unsigned)> on_exit)
    : name_(std::move(name)), dom_(std::move(dom)), on_exit_(std::move(on_exit)) {
  try {
    try {
      tap_ = Tap::create({settings.tap_name, "", static_cast<unsigned>(queues.size()), settings.offload});
      LinkSettings link;
      link.mtu = settings.mtu;
      link.mac = settings.mac;
      link.up = true;
      if (settings.addresses && settings.bridge.empty()) {
        link.ipv4 = Ipv4Address{settings.addresses->host, settings.addresses->prefix};
      }
      tap_.set_link(link);
      if (!settings.bridge.empty()) tap_.join_bridge(settings.bridge);
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("host interface {}: {}", settings.tap_name, e.what()));
    }
    // A guest grows its grant table as it needs refs: look at its frames as they are now.
    dom_->refresh_grant_frames();
    NetbackConfig cfg = settings.queue;
    for (unsigned i = 0; i < tap_.queues(); ++i) tap_fds_.push_back(tap_.fd(i));
    if (settings.steer && queues.size() > 1) {
      steer_ = std::make_unique<FlowSteering>(FlowSteeringConfig{.queues = static_cast<unsigned>(queues.size())});
      cfg.steer = steer_.get();
      cfg.tap_fds = tap_fds_;
    }
    for (unsigned i = 0; i < queues.size(); ++i) {
      cfg.queue_index = i;
      add_queue(i, queues[i], cfg, settings.shadow_dir);
    }
  } catch (...) {
    if (!settings.queue.resume) forget_shadows_ = true;  // nothing made is left behind
    teardown();
    throw;
  }
  // Threads last: a failure above leaves nothing running. One that cannot be started (no
  // threads or memory left) stops and joins those started before it: this device fails to
  // connect, the daemon goes on (a joinable std::thread destroyed would end the process).
  try {
    for (unsigned i = 0; i < queues_.size(); ++i) {
      Queue& q = *queues_[i];
      q.thread = std::thread([this, &q, i] {
        set_thread_name(name_ + "-q" + std::to_string(i));  // vif<N>.<devid>-q<i>, as top -H shows it
        q.queue->run();
        if (on_exit_) on_exit_(i);
      });
    }
  } catch (...) {
    if (!settings.queue.resume) forget_shadows_ = true;
    teardown();
    throw;
  }
}

VifConnection::~VifConnection() { teardown(); }

void VifConnection::stop() noexcept {
  for (auto& q : queues_) {
    if (q->queue) q->queue->stop();
  }
}

bool VifConnection::disabled() const noexcept {
  for (const auto& q : queues_) {
    if (q->queue && q->queue->disabled()) return true;
  }
  return false;
}

void VifConnection::add_queue(unsigned index, const VifQueueRings& rings, NetbackConfig cfg,
                              const std::string& shadow_dir) {
  auto q = std::make_unique<Queue>();
  Queue& r = *q;
  queues_.push_back(std::move(q));
  r.mapper = dom_->make_mapper();
  auto map_ring = [&](gnttab::GrantRef ref, const char* what) {
    auto m = r.mapper->map(ref, /*readonly=*/false);
    if (!m) {
      throw std::runtime_error(fmt::format("queue {}: mapping {} ref {}: {}", index, what, ref,
                                           gnttab::to_string(m.error())));
    }
    r.ring_handles.push_back(m->handle());
    return m->writable();
  };
  // Attach at the shared rsp_prod: a fresh ring has rsp_prod == req_prod; a ring a dead backend
  // served resumes there (queue.h, "Resume").
  auto tx = ring::NetifTxBackRing::attach(map_ring(rings.tx_ref, "tx-ring"));
  if (!tx) throw std::runtime_error(fmt::format("queue {}: the tx ring is unusable: {}", index, ring::to_string(tx.error())));
  auto rx = ring::NetifRxBackRing::attach(map_ring(rings.rx_ref, "rx-ring"));
  if (!rx) throw std::runtime_error(fmt::format("queue {}: the rx ring is unusable: {}", index, ring::to_string(rx.error())));
  auto bind = [&](std::uint32_t port, const char* what) {
    std::uint32_t local = 0;
    try {
      auto p = dom_->bind(port, &local);
      r.dom0_ports.push_back(local);
      return p;
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("queue {}: binding {} {}: {}", index, what, port, e.what()));
    }
  };
  std::unique_ptr<domain::EventChannel> tx_ch = bind(rings.tx_evtchn, rings.rx_evtchn ? "event-channel-tx" : "event-channel");
  std::unique_ptr<domain::EventChannel> rx_ch;
  if (rings.rx_evtchn) rx_ch = bind(*rings.rx_evtchn, "event-channel-rx");
  if (!shadow_dir.empty()) {
    const std::string path = fmt::format("{}/{}-q{}.rxids", shadow_dir, name_, index);
    try {
      r.rx_shadow = std::make_unique<RxShadow>(cfg.resume ? RxShadow::open(path, rx->size())
                                                          : RxShadow::create(path, rx->size()));
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("queue {}: {}", index, e.what()));
    }
  }
  if (cfg.resume) {
    spdlog::info("{}: queue {}: resuming at tx rsp_prod {} ({} unanswered), rx rsp_prod {} ({} unanswered; their ids {})",
                 name_, index, tx->req_cons(), tx->unconsumed_requests().value_or(0), rx->req_cons(),
                 rx->unconsumed_requests().value_or(0),
                 r.rx_shadow && r.rx_shadow->reused() ? "from the rx shadow" : "from the ring: no rx shadow");
  }
  r.queue = std::make_unique<NetbackQueue>(fmt::format("{}-q{}", name_, index), *r.mapper, std::move(*tx),
                                           std::move(*rx), std::move(tx_ch), std::move(rx_ch),
                                           tap_.fd(index), cfg, r.rx_shadow.get());
}

void VifConnection::teardown() noexcept {
  stop();
  for (auto& q : queues_) {
    if (q->thread.joinable()) q->thread.join();
  }
  for (auto& q : queues_) {
    if (q->queue) {
      // What this queue moved in its life: the log line an operator reads after a run.
      const NetbackCounters& c = q->queue->counters();
      const auto tx_end = q->queue->tx_end_state();
      const auto rx_end = q->queue->rx_end_state();
      auto n = [](const std::atomic<std::uint64_t>& v) { return v.load(std::memory_order_relaxed); };
      spdlog::info("{}: guest tx {} packets {} bytes (errors {}, dropped {}, not from the vif's address {}); guest rx {} packets {} bytes "
                   "(queued {}, dropped {}, overflow {}, errors {}); rx fill limit {} (held back {}, grew {}, shrank {}); "
                   "waited for rx buffers {} times ({} of them found the buffers only at the {} ms timeout); "
                   "turns tx {} rx {} ({} / {} ms); new tx requests found {} times, {} us after the last look on average "
                   "({} times after 1 ms or more, at most {} us); notifications {}; wakeups {} ({} by kicks with nothing new, the "
                   "port muted {} times); fair waits {}; rate-limited {}; "
                   "tx written on another queue's TAP queue {}; rings left: tx {} published and not taken, {} answered "
                   "since the frontend last armed its event; rx {} buffers posted and not taken, {} answered since the frontend last armed its event",
                   q->queue->name(), n(c.tx_packets), n(c.tx_bytes), n(c.tx_errors), n(c.tx_dropped), n(c.tx_spoofed),
                   n(c.rx_packets), n(c.rx_bytes), n(c.rx_queued), n(c.rx_dropped), n(c.rx_overflow), n(c.rx_errors),
                   n(c.rx_fill_limit), n(c.rx_fill_holds), n(c.rx_fill_grows), n(c.rx_fill_shrinks), n(c.rx_waits),
                   n(c.rx_waits_late), q->queue->rx_stall_ms(), n(c.tx_turns), n(c.rx_turns),
                   n(c.tx_turn_us) / 1000, n(c.rx_turn_us) / 1000, n(c.tx_found),
                   n(c.tx_found) ? n(c.tx_found_after_us) / n(c.tx_found) : 0, n(c.tx_found_after_1ms),
                   n(c.tx_found_after_max_us), n(c.notifications), n(c.wakeups), n(c.spurious_kicks), n(c.kick_mutes), n(c.fair_waits),
                   n(c.rate_limited),
                   n(c.tx_steered), tx_end.untaken, tx_end.responses_since_armed, rx_end.untaken, rx_end.responses_since_armed);
    }
    q->queue.reset();
    if (q->rx_shadow && forget_shadows_) q->rx_shadow->remove();
    q->rx_shadow.reset();
    for (auto h : q->ring_handles) (void)q->mapper->unmap(h);
    q->ring_handles.clear();
    q->mapper.reset();
    for (auto port : q->dom0_ports) {
      try {
        dom_->unbind(port);
      } catch (const std::exception& e) {
        // The domain went away: its end of the channel went with it.
        spdlog::debug("{}: unbinding port {}: {}", name_, port, e.what());
      }
    }
    q->dom0_ports.clear();
  }
  if (steer_) spdlog::info("{}: flow steering made {} move(s)", name_, steer_->moves());
  queues_.clear();
  tap_fds_.clear();
  tap_ = Tap();  // the interface vanishes with its fds
}

}  // namespace xpv::netback
