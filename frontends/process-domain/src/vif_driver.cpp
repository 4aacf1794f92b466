// The netfront xenbus driver (see vif_driver.h). Every function below except the constructor,
// start(), shutdown() and the destructor runs on the RingClient's watch thread.
#include "xpv/frontends/vif_driver.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <future>
#include <set>
#include <thread>

#include "xpv/netback/netns.h"

namespace xpv::frontends {

using xenbus::XenbusState;
using xenbus::client::Result;
using xenbus::client::TxId;

namespace {

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  std::uint64_t v = 0;
  if (s.empty() || s.size() > 20) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

VifDriver::VifDriver(domain::Domain& dom, GuestEvents& events, xenbus::client::RingClient& xs, VifDriverConfig config)
    : dom_(dom), events_(events), xs_(xs), config_(std::move(config)) {
  if (config_.max_queues == 0) config_.max_queues = 1;
}

VifDriver::~VifDriver() {
  if (started_ && !shut_down_) shutdown(config_.close_timeout * 4);
  std::promise<void> done;
  auto f = done.get_future();
  xs_.post([this, &done] {
    for (auto& [id, v] : devs_) teardown(*v);
    devs_.clear();
    done.set_value();
  });
  f.wait();
}

std::string VifDriver::base() const { return "/local/domain/" + std::to_string(config_.domid) + "/device/vif"; }

Result<void> VifDriver::start() {
  started_ = true;
  return xs_.watch(base(), "vif", [this](const std::string&, const std::string&) { rescan(); });
}

bool VifDriver::shutdown(std::chrono::milliseconds bound) {
  shut_down_ = true;
  auto done = std::make_shared<std::promise<void>>();
  auto f = done->get_future();
  xs_.post([this, done] {
    stopping_ = true;
    (void)xs_.unwatch(base(), "vif");
    for (auto& [id, v] : devs_) {
      close_device(*v);
      (void)xs_.unwatch(v->back + "/state", "vif-be:" + id);
    }
    devs_.clear();
    done->set_value();
  });
  return f.wait_for(bound) == std::future_status::ready;
}

// ---- watch thread ---------------------------------------------------------------------------

void VifDriver::rescan() {
  if (stopping_) return;
  auto list = xs_.directory(base());
  std::set<std::string> present;
  if (list) {
    present.insert(list->begin(), list->end());
  } else if (list.error() != xenbus::wire::Error::enoent) {
    spdlog::warn("dom{}: vif: cannot list {}: {}", config_.domid, base(), xenbus::wire::error_name(list.error()));
    return;
  }
  for (auto it = devs_.begin(); it != devs_.end();) {
    if (present.count(it->first)) {
      ++it;
      continue;
    }
    spdlog::info("dom{}: vif {}: removed", config_.domid, it->first);
    teardown(*it->second);
    (void)xs_.unwatch(it->second->back + "/state", "vif-be:" + it->first);
    it = devs_.erase(it);
  }
  for (const auto& id : present) {
    if (devs_.count(id)) continue;
    if (!parse_u64(id)) continue;
    auto v = std::make_unique<Vif>();
    v->devid = id;
    v->front = base() + "/" + id;
    auto back = xs_.read(v->front + "/backend");
    auto backend_id = xs_.read(v->front + "/backend-id");
    if (!back || back->empty()) continue;  // not complete yet: the next firing brings it
    v->back = *back;
    if (backend_id) {
      auto b = parse_u64(*backend_id);
      if (b && *b < 0x7ff0) v->backend_id = static_cast<domain::DomId>(*b);
    }
    auto st = xs_.read(v->front + "/state");
    if (!st || xenbus::parse_state(*st) != XenbusState::initialising) (void)xs_.write(v->front + "/state", "1");
    Vif& ref = *v;
    devs_.emplace(id, std::move(v));
    spdlog::info("dom{}: vif {}: backend {} (dom{})", config_.domid, id, ref.back, ref.backend_id);
    auto w = xs_.watch(ref.back + "/state", "vif-be:" + id, [this](const std::string&, const std::string&) { rescan(); });
    if (!w) {
      spdlog::warn("dom{}: vif {}: cannot watch {}/state: {}", config_.domid, id, ref.back,
                   xenbus::wire::error_name(w.error()));
    }
  }
  for (auto& [id, v] : devs_) step(*v);
}

std::optional<XenbusState> VifDriver::backend_state(const Vif& v) {
  auto s = xs_.read(v.back + "/state");
  if (!s) {
    if (s.error() == xenbus::wire::Error::enoent) return XenbusState::unknown;
    return std::nullopt;
  }
  return xenbus::parse_state(*s);
}

void VifDriver::step(Vif& v) {
  auto be = backend_state(v);
  if (!be) return;
  if (v.failed) {
    if (*be == XenbusState::closed || *be == XenbusState::unknown) return;
    if (*be == XenbusState::init_wait && v.state == XenbusState::closed) {
      v.failed = false;
      v.state = XenbusState::initialising;
    } else {
      return;
    }
  }
  // After a close, a backend that offers the vif again (InitWait) is set up anew.
  if (v.state == XenbusState::closed && *be == XenbusState::init_wait) v.state = XenbusState::initialising;
  const auto s = xenbus::frontend_step(v.state, *be);
  switch (s.action) {
    case xenbus::FrontendAction::none:
      return;
    case xenbus::FrontendAction::setup:
      if (!setup(v)) {
        teardown(v);
        v.failed = true;
        publish_state(v, XenbusState::closed);
      }
      return;
    case xenbus::FrontendAction::connect:
      if (!connect(v)) {
        teardown(v);
        v.failed = true;
        publish_state(v, XenbusState::closed);
        return;
      }
      publish_state(v, s.next);
      return;
    case xenbus::FrontendAction::disconnect:
      spdlog::info("dom{}: vif {}: backend {}: disconnecting", config_.domid, v.devid, xenbus::to_string(*be));
      teardown(v);
      publish_state(v, s.next);
      return;
  }
}

bool VifDriver::publish_state(Vif& v, XenbusState s) {
  auto r = xs_.write(v.front + "/state", std::to_string(static_cast<int>(s)));
  if (!r) {
    spdlog::warn("dom{}: vif {}: cannot publish state {}: {}", config_.domid, v.devid, xenbus::to_string(s),
                 xenbus::wire::error_name(r.error()));
    return false;
  }
  v.state = s;
  return true;
}

bool VifDriver::setup(Vif& v) {
  auto node = [&](const std::string& path) -> std::optional<std::string> {
    auto r = xs_.read(path);
    if (!r) return std::nullopt;
    return *r;
  };
  auto feature = [&](const char* name) { return node(v.back + "/" + name) == "1"; };
  const std::string tag = "dom" + std::to_string(config_.domid) + ": vif " + v.devid;
  // What the vif is (the toolstack's nodes).
  auto mac_s = node(v.front + "/mac");
  auto mac = mac_s ? netback::parse_mac(*mac_s) : std::nullopt;
  if (!mac) {
    spdlog::error("{}: mac '{}' is not a MAC address", tag, mac_s.value_or(""));
    return false;
  }
  v.mac = *mac;
  v.mtu = 1500;
  if (auto m = node(v.back + "/mtu")) {
    auto n = parse_u64(*m);
    if (!n || *n < 68 || *n > 65535) {
      spdlog::error("{}: mtu '{}': expected 68..65535", tag, *m);
      return false;
    }
    v.mtu = static_cast<unsigned>(*n);
  }
  v.addresses.reset();
  if (auto ip = node(v.back + "/ip"); ip && !ip->empty()) {
    v.addresses = netback::vif_addresses(*ip);
    if (!v.addresses) {
      spdlog::error("{}: ip '{}' is not a host address a.b.c.d[/1..30]", tag, *ip);
      return false;
    }
  }
  // What the backend offers (Linux netfront's reading of it).
  if (!feature("feature-rx-copy")) {
    spdlog::error("{}: the backend does not offer feature-rx-copy (the only receive mode)", tag);
    return false;
  }
  const bool sg = feature("feature-sg");
  const bool gso4 = sg && feature("feature-gso-tcpv4");
  const bool gso6 = sg && feature("feature-gso-tcpv6");
  const bool split = feature("feature-split-event-channels");
  std::uint64_t be_queues = 1;
  if (auto q = node(v.back + "/multi-queue-max-queues")) be_queues = std::max<std::uint64_t>(1, parse_u64(*q).value_or(1));
  const unsigned nq = static_cast<unsigned>(std::min<std::uint64_t>({config_.max_queues, be_queues, 64}));

  if (!netback::netns_exists(config_.netns)) {
    spdlog::error("{}: the domain's network namespace {} does not exist (the toolstack creates it)", tag, config_.netns);
    return false;
  }
  const std::string ifname = "eth" + v.devid;
  try {
    // The reader of this TAP is the backend: it takes checksum-partial frames always, TSO when
    // it offered GSO (and scatter-gather).
    v.tap = netback::Tap::create({ifname, config_.netns, nq, {true, gso4, gso6}});
    for (unsigned q = 0; q < nq; ++q) {
      NetfrontConfig cfg;
      cfg.backend = v.backend_id;
      cfg.split_event_channels = split;
      cfg.backend_sg = sg;
      cfg.backend_gso = {gso4, gso6};
      v.queues.push_back(std::make_unique<Netfront>(dom_, events_, v.tap.fd(q), cfg));
    }
  } catch (const std::exception& e) {
    spdlog::error("{}: {}", tag, e.what());
    return false;
  }
  auto r = xs_.transaction([&](TxId tx) -> Result<void> {
    auto w = [&](const std::string& name, const std::string& value) { return xs_.write(v.front + "/" + name, value, tx); };
    Result<void> res;
    if (nq > 1) {
      res = w("multi-queue-num-queues", std::to_string(nq));
      if (!res) return res;
    }
    for (unsigned q = 0; q < nq; ++q) {
      const Netfront& f = *v.queues[q];
      const std::string dir = nq > 1 ? "queue-" + std::to_string(q) + "/" : "";
      std::vector<std::pair<std::string, std::string>> n = {{dir + "tx-ring-ref", std::to_string(f.tx_ring_ref())},
                                                            {dir + "rx-ring-ref", std::to_string(f.rx_ring_ref())}};
      if (split) {
        n.emplace_back(dir + "event-channel-tx", std::to_string(f.tx_port()));
        n.emplace_back(dir + "event-channel-rx", std::to_string(f.rx_port()));
      } else {
        n.emplace_back(dir + "event-channel", std::to_string(f.tx_port()));
      }
      for (const auto& [k, val] : n) {
        res = w(k, val);
        if (!res) return res;
      }
    }
    for (const char* f : {"request-rx-copy", "feature-rx-notify", "feature-sg", "feature-gso-tcpv4", "feature-gso-tcpv6",
                          "feature-ipv6-csum-offload"}) {
      res = w(f, "1");
      if (!res) return res;
    }
    return w("state", std::to_string(static_cast<int>(XenbusState::initialised)));
  });
  if (!r) {
    spdlog::error("{}: cannot publish the rings: {}", tag, xenbus::wire::error_name(r.error()));
    return false;
  }
  v.state = XenbusState::initialised;
  spdlog::info("{}: {} in {}, {} queue(s), {} event channels, sg {}, gso v4 {} v6 {}; rings published", tag, ifname,
               config_.netns, nq, split ? "split" : "shared", sg, gso4, gso6);
  return true;
}

bool VifDriver::connect(Vif& v) {
  if (v.queues.empty()) return false;
  const std::string tag = "dom" + std::to_string(config_.domid) + ": vif " + v.devid;
  try {
    netback::LinkSettings link;
    link.mtu = v.mtu;
    link.mac = v.mac;
    link.up = true;
    if (v.addresses) link.ipv4 = netback::Ipv4Address{v.addresses->domain, v.addresses->prefix};
    v.tap.set_link(link);
    for (auto& q : v.queues) q->start();
  } catch (const std::exception& e) {
    spdlog::error("{}: {}", tag, e.what());
    return false;
  }
  v.running = true;
  ++connected_;
  spdlog::info("{}: connected: {} mtu {}{}", tag, v.tap.name(), v.mtu,
               v.addresses ? ", address " + netback::ipv4_string(v.addresses->domain) + "/" +
                                 std::to_string(v.addresses->prefix)
                           : std::string());
  return true;
}

void VifDriver::teardown(Vif& v) {
  for (auto& q : v.queues) q->stop();
  v.queues.clear();  // grants ended, pages and channels freed
  v.tap = netback::Tap();  // the NIC leaves the namespace with its fds
  if (v.running) {
    v.running = false;
    --connected_;
  }
}

void VifDriver::close_device(Vif& v) {
  if (!v.queues.empty() && (v.state == XenbusState::initialised || v.state == XenbusState::connected)) {
    if (publish_state(v, XenbusState::closing)) {
      const auto deadline = std::chrono::steady_clock::now() + config_.close_timeout;
      for (;;) {
        auto be = backend_state(v);
        if (be && (*be == XenbusState::closing || *be == XenbusState::closed || *be == XenbusState::unknown)) break;
        if (std::chrono::steady_clock::now() >= deadline) {
          spdlog::warn("dom{}: vif {}: the backend did not close within {} ms", config_.domid, v.devid,
                       config_.close_timeout.count());
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  teardown(v);
  if (v.state != XenbusState::closed) publish_state(v, XenbusState::closed);
  spdlog::info("dom{}: vif {}: closed", config_.domid, v.devid);
}

}  // namespace xpv::frontends
