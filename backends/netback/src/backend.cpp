#include "xpv/netback/backend.h"
#include "xpv/netback/bridge.h"
#include "xpv/xenbus/client/backend_devices.h"
#include "xpv/xenbus/daemon/backend_main.h"
#include "xpv/xenbus/daemon/run_every.h"
#include "xpv/xenbus/peer_value.h"
#include "xpv/xenbus/queue_layout.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <linux/if.h>
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <stdexcept>
#include <string_view>

namespace xpv::netback {

namespace asio = boost::asio;
using xenbus::XenbusState;

namespace {

// A decimal number from xenstore (a guest may write anything): digits only, <= max.
std::optional<std::uint64_t> parse_uint(const std::string& s, std::uint64_t max) {
  std::uint64_t v = 0;
  if (s.empty() || s.size() > 20) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v > max) return std::nullopt;
  return v;
}

// A switch in the daemon's environment for A/B measurements (backends/README.md "Fairness"):
// unset, empty or `off` keeps the default; `on` selects the variant; anything else is logged and
// keeps the default.
bool env_switch(const char* var, std::string_view off, std::string_view on) {
  const char* env = std::getenv(var);
  if (env == nullptr || *env == '\0' || off == env) return false;
  if (on == env) return true;
  spdlog::warn("netback: {}={:?} is neither '{}' nor '{}'; keeping '{}'", var, env, off, on, off);
  return false;
}

// XPV_NETBACK_RX_FILL=adaptive: every queue bounds how far ahead of the guest it fills its rx
// ring (rx_fill_limit.h); `ring` (the default) fills the whole ring, as Linux netback.
bool rx_fill_adaptive() { return env_switch("XPV_NETBACK_RX_FILL", "ring", "adaptive"); }

// XPV_NETBACK_RX_DRAIN=all: while the guest has not posted buffers for the next packet, every
// queue drains its TAP into its flow queue (flow order, a second copy) instead of reading only
// that packet and leaving the rest in the TAP as vhost-net does (`head`, the default).
bool rx_drain_all() { return env_switch("XPV_NETBACK_RX_DRAIN", "head", "all"); }

// XPV_NETBACK_TX_RESPOND=early: every queue copies a guest-tx packet out of the guest's pages
// and answers it before handing it to the TAP (NetbackConfig::tx_respond_early); `after` (the
// default) writes it from the guest's pages and answers once the TAP has taken it.
bool tx_respond_early() { return env_switch("XPV_NETBACK_TX_RESPOND", "after", "early"); }

// A vif with several queues spreads its busy flows over them (which TAP queue a flow's guest-tx
// packets are written on decides where its host->guest packets come back: flow_steering.h), the
// default since session 39; XPV_NETBACK_STEER=guest leaves each flow on the queue the guest sends
// it on, as Linux netback does.
bool steer_spread() { return !env_switch("XPV_NETBACK_STEER", "spread", "guest"); }

// The rx shadow files: "<vif>-q<k>.rxids" (restart_file_owner, backend_main.h).
constexpr std::string_view kShadowPrefix = "vif", kShadowSuffix = ".rxids";

}  // namespace

std::optional<std::pair<std::uint64_t, std::uint64_t>> parse_rate_node(const std::string& s) noexcept {
  const auto comma = s.find(',');
  if (comma == std::string::npos) return std::nullopt;
  auto bytes = parse_uint(s.substr(0, comma), UINT64_MAX);
  auto usec = parse_uint(s.substr(comma + 1), UINT32_MAX);
  if (!bytes || !usec) return std::nullopt;
  if (*bytes != 0 && *usec == 0) return std::nullopt;  // a rate needs a window
  return std::pair{*bytes, *usec};
}

Backend::Backend(asio::io_context& io, BackendOptions options)
    : io_(io),
      options_(std::move(options)),
      stats_(stats::stats_dir(options_.run_dir), "xpv-netback"),
      shadow_dir_(options_.run_dir + "/netback"),
      stats_timer_(io),
      xs_probe_(io) {
  if (options_.max_queues == 0) options_.max_queues = 1;
  std::filesystem::create_directories(stats_.dir());
  std::filesystem::create_directories(shadow_dir_);
  ::chmod(shadow_dir_.c_str(), 0700);
  stats_.remove_leftovers("vif");
  try {
    xs_ = std::make_unique<xenbus::client::SyncClient>(options_.xenstore_path);
  } catch (const std::exception&) {
    throw std::runtime_error("cannot connect to xpv-xenstored at " + options_.xenstore_path);
  }
  // xenstore client thread: hand the break to the control thread (shutdown() joins that thread
  // before the Backend goes).
  xs_->on_lost([this] { asio::post(io_, [this] { on_xenstore_lost(); }); });
  auto w = xs_->watch(kBase, "vif", [this](const std::string& path, const std::string&) {
    // xenstore client thread: hand the event to the control thread.
    asio::post(io_, [this, path] { guarded([&] { on_event(path); }); });
  });
  if (!w) throw std::runtime_error(fmt::format("cannot watch {}: {}", kBase, xenbus::wire::error_name(w.error())));
  spdlog::info("netback: watching {} (max {} queues)", kBase, options_.max_queues);
  daemon::run_every(stats_timer_, std::chrono::seconds(1), [this] { return shut_down_; }, [this] { publish_stats(); });
}

Backend::~Backend() { shutdown(); }

void Backend::publish_stats() {
  for (const auto& [key, d] : devices_) {
    if (!d.conn) continue;
    // tx: the guest's transmit (written to the TAP); rx: what the guest received — the guest's
    // view, as xentop's NETTX / NETRX.
    std::uint64_t txp = 0, txb = 0, txe = 0, txd = 0, txs = 0, rxp = 0, rxb = 0, rxd = 0, rxe = 0, rxo = 0, rxq = 0, fw = 0;
    for (std::size_t i = 0; i < d.conn->queues(); ++i) {
      const NetbackCounters& c = d.conn->queue(i).counters();
      auto n = [](const std::atomic<std::uint64_t>& v) { return v.load(std::memory_order_relaxed); };
      txp += n(c.tx_packets), txb += n(c.tx_bytes), txe += n(c.tx_errors), txd += n(c.tx_dropped);
      txs += n(c.tx_spoofed);
      rxp += n(c.rx_packets), rxb += n(c.rx_bytes), rxd += n(c.rx_dropped), rxe += n(c.rx_errors);
      rxo += n(c.rx_overflow), rxq += n(c.rx_queued), fw += n(c.fair_waits);
    }
    const stats::Counters counters = {
        {"queues", d.conn->queues()}, {"tx_packets", txp}, {"tx_bytes", txb},       {"tx_errors", txe},
        {"tx_dropped", txd},          {"tx_spoofed", txs}, {"rx_packets", rxp}, {"rx_bytes", rxb},       {"rx_dropped", rxd},
        {"rx_errors", rxe},           {"rx_overflow", rxo}, {"rx_queued", rxq},     {"fair_waits", fw}};
    if (const int e = stats_.put(d.name, counters); e != 0) {
      spdlog::warn("netback: cannot publish statistics in {}: {} (not said again)", stats_.dir(), std::strerror(e));
    }
  }
  stats_.sweep();
}

void Backend::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  stats_timer_.cancel();
  xs_probe_.cancel();
  for (auto& [key, d] : devices_) {
    if (d.conn) d.conn->stop();
  }
  for (auto& [key, d] : devices_) d.conn.reset();
  stats_.clear();
  devices_.clear();
  xs_.reset();  // joins the client's thread: no more watch events
}

std::optional<std::string> Backend::read(const std::string& path) {
  auto r = xs_->read(path);
  if (!r) {
    if (r.error() == xenbus::wire::Error::eio) throw XenstoreLost{};
    return std::nullopt;
  }
  return *r;
}

void Backend::on_xenstore_lost() {
  if (shut_down_ || xs_lost_) return;
  xs_lost_ = true;
  xs_probe_.after_loss("netback", options_.xenstore_path, fmt::format("{} vif(s)", devices_.size()),
                       options_.xenstore_back);
}

template <class F>
void Backend::guarded(F&& f) {
  if (shut_down_ || xs_lost_) return;
  try {
    f();
  } catch (const XenstoreLost&) {
    on_xenstore_lost();
  } catch (const std::exception& e) {
    // A control-plane bug must not take the data plane of every domain down with it.
    spdlog::error("netback: control plane: {}", e.what());
  }
}

bool Backend::write_state(Device& d, XenbusState s) {
  // In a transaction that first checks the node is there: a state written after the toolstack
  // removed the directory would bring a lone `state` back.
  const std::string v = std::to_string(static_cast<int>(s));
  bool wrote = false;
  auto r = xs_->transaction([&](xenbus::client::TxId tx) -> xenbus::client::Result<void> {
    wrote = false;
    auto cur = xs_->read(d.be_path + "/state", tx);
    if (!cur) return fail(cur.error());
    if (*cur == v) return {};
    wrote = true;
    return xs_->write(d.be_path + "/state", v, tx);
  });
  if (!r) {
    if (r.error() != xenbus::wire::Error::enoent) {
      spdlog::error("{}: cannot write state {}: {}", d.name, xenbus::to_string(s), xenbus::wire::error_name(r.error()));
    }
    return false;
  }
  if (wrote) spdlog::info("{}: backend state {}", d.name, xenbus::to_string(s));
  return true;
}

void Backend::on_event(const std::string& path) {
  if (shut_down_) return;
  const std::string base = kBase;
  if (path.size() <= base.size() || path.compare(0, base.size(), base) != 0 || path[base.size()] != '/') {
    scan();
    return;
  }
  std::string rest = path.substr(base.size() + 1);
  const auto s1 = rest.find('/');
  if (s1 == std::string::npos) {
    scan();
    return;
  }
  const auto s2 = rest.find('/', s1 + 1);
  auto domid = parse_uint(rest.substr(0, s1), 32751);
  auto devid = parse_uint(rest.substr(s1 + 1, s2 == std::string::npos ? std::string::npos : s2 - s1 - 1), UINT32_MAX);
  if (!domid || !devid || *domid == 0) return;
  reconcile({static_cast<std::uint16_t>(*domid), static_cast<std::uint32_t>(*devid)});
}

void Backend::scan() {
  const auto listed = xenbus::client::list_backend_devices(*xs_, kBase);
  std::vector<Key> seen = listed.keys;
  for (const auto& [key, d] : devices_) seen.push_back(key);
  for (const Key& k : seen) reconcile(k);
  // Once, on the first listing that is the whole truth: rx shadows of vifs not in xenstore (a
  // domain destroyed while no daemon ran) are removed, after the vifs found were resumed.
  if (listed.complete && !swept_ && !shut_down_) {
    swept_ = true;
    std::set<std::string, std::less<>> live;
    for (const Key& k : seen) live.insert(fmt::format("vif{}.{}", k.first, k.second));
    daemon::sweep_orphan_files(shadow_dir_, kShadowPrefix, kShadowSuffix, live, "netback");
  }
}

Backend::Device* Backend::adopt(const Key& key) {
  const std::string be = fmt::format("{}/{}/{}", kBase, key.first, key.second);
  auto fe = read(be + "/frontend");
  auto feid = read(be + "/frontend-id");
  if (!fe || !feid) return nullptr;  // the toolstack has not finished writing it
  const std::string name = fmt::format("vif{}.{}", key.first, key.second);
  if (parse_uint(*feid, 32751) != key.first || fe->rfind(fmt::format("/local/domain/{}/", key.first), 0) != 0) {
    spdlog::error("{}: frontend {} (frontend-id {}) does not belong to domain {}; ignored", name, *fe, *feid,
                  key.first);
    return nullptr;
  }
  Device d;
  d.key = key;
  d.name = name;
  d.be_path = be;
  d.fe_path = *fe;
  d.fe_token = fmt::format("fe:{}:{}", key.first, key.second);
  auto w = xs_->watch(d.fe_path + "/state", d.fe_token, [this, key](const std::string&, const std::string&) {
    // The guest writes that node as often as it likes: one reconcile queued per device at most.
    fe_events_.post_once(
        key, [this](auto handler) { asio::post(io_, std::move(handler)); },
        [this, key] { guarded([&] { reconcile(key); }); });
  });
  if (!w) {
    spdlog::error("{}: cannot watch {}/state", name, d.fe_path);
    return nullptr;
  }
  spdlog::info("{}: new vif, frontend {}", name, d.fe_path);
  return &devices_.emplace(key, std::move(d)).first->second;
}

void Backend::forget(const Key& key, bool removed) {
  auto it = devices_.find(key);
  if (it == devices_.end()) return;
  Device& d = it->second;
  disconnect(d);
  (void)xs_->unwatch(d.fe_path + "/state", d.fe_token);
  spdlog::info("{}: {}", d.name, removed ? "backend directory removed; vif forgotten" : "forgotten");
  devices_.erase(it);
}

void Backend::reconcile(const Key& key) {
  if (shut_down_) return;
  const std::string be = fmt::format("{}/{}/{}", kBase, key.first, key.second);
  auto st = read(be + "/state");
  auto it = devices_.find(key);
  if (!st) {
    if (it != devices_.end()) forget(key, /*removed=*/true);
    return;
  }
  Device* d = it != devices_.end() ? &it->second : adopt(key);
  if (d == nullptr) return;

  auto be_state = xenbus::parse_state(*st);
  if (!be_state) return;  // only we and the toolstack write it; wait for a sane value
  auto fe_node = read(d->fe_path + "/state");
  XenbusState fe_state = XenbusState::unknown;
  if (fe_node) {
    auto p = xenbus::parse_state(*fe_node);
    if (!p) return;  // garbage from the guest: no change (never a reason to tear down)
    fe_state = *p;
  }
  const bool online = read(be + "/online") == "1";

  // The toolstack asks a vif to go by writing our state Closing (libxl's detach): let go of the
  // frontend's pages now, before it ends its grants on seeing Closing.
  if (d->conn && (*be_state == XenbusState::closing || *be_state == XenbusState::closed)) disconnect(*d);

  // Held in error (ErrorHold, device_state.h): only a closing or closed frontend goes on.
  const bool was_held = d->fatal.held();
  if (!d->fatal.lets_through(fe_state, online)) return;
  if (was_held && !d->fatal.held()) spdlog::info("{}: the error is over (frontend {}); the vif may start over", d->name, xenbus::to_string(fe_state));

  // Restart: the vif was Connected when a previous xpv-netback died. Reattach to the published
  // rings without touching `state`: the frontend sees nothing but a few lost packets.
  if (!d->resume_checked) {
    d->resume_checked = true;
    if (!d->conn && *be_state == XenbusState::connected &&
        (fe_state == XenbusState::connected || fe_state == XenbusState::initialised)) {
      if (probe(*d, /*publish=*/false)) connect(*d, /*resume=*/true);
      return;
    }
  }

  if (!d->nodes && *be_state != XenbusState::closing && *be_state != XenbusState::closed) {
    if (!probe(*d)) return;
  }
  if (*be_state == XenbusState::initialising) {
    if (!write_state(*d, XenbusState::init_wait)) return;
    be_state = XenbusState::init_wait;
  }

  const xenbus::BackendStep step = xenbus::backend_step(*be_state, fe_state, online);
  switch (step.action) {
    case xenbus::BackendAction::connect:
      if (!d->nodes && !probe(*d)) return;
      if (!d->conn) connect(*d, /*resume=*/false);
      return;
    case xenbus::BackendAction::disconnect:
      if (step.next == XenbusState::init_wait) {
        spdlog::info("{}: the frontend started over (Initialising) while the vif was Connected; offering it again",
                     d->name);
      }
      disconnect(*d);
      write_state(*d, step.next);
      return;
    case xenbus::BackendAction::disconnect_remove:
      disconnect(*d);
      d->nodes.reset();
      write_state(*d, step.next);
      return;
    case xenbus::BackendAction::none:
      if (step.next != *be_state) {
        if (step.next == XenbusState::init_wait) {
          // The frontend starts over after a close: offer the vif again (nodes read afresh).
          d->nodes.reset();
          if (!probe(*d)) return;
          (void)xs_->rm(d->be_path + "/error");
        }
        write_state(*d, step.next);
      }
      return;
  }
}

bool Backend::probe(Device& d, bool publish) {
  VifBackendNodes n;
  // Bridge mode, as Xen's vif-bridge script: the bridge must exist here already. libxl writes a
  // `bridge` (xenbr0 by default) for every vif, also beside `script` = vif-route: that one routes.
  if (const std::string bridge = vif_bridge(read(d.be_path + "/bridge"), read(d.be_path + "/script")); !bridge.empty()) {
    if (const std::string why = bridge_problem(bridge); !why.empty()) {
      fatal(d, XenbusState::closed, ENODEV, why);
      return false;
    }
    n.bridge = bridge;
  }
  if (d.name.size() >= IFNAMSIZ) {
    fatal(d, XenbusState::closed, ENAMETOOLONG, "host interface name " + d.name + " is longer than 15 characters");
    return false;
  }
  if (auto ip = read(d.be_path + "/ip"); ip && !ip->empty()) {
    n.addresses = vif_addresses(*ip);
    if (!n.addresses) {
      fatal(d, XenbusState::closed, EINVAL, "ip '" + *ip + "': expected a host address a.b.c.d[/1..30]");
      return false;
    }
  }
  if (auto mtu = read(d.be_path + "/mtu")) {
    auto v = parse_uint(*mtu, 65535);
    if (!v || *v < 68) {
      fatal(d, XenbusState::closed, EINVAL, "mtu '" + *mtu + "': expected 68..65535");
      return false;
    }
    n.mtu = static_cast<unsigned>(*v);
  }
  if (auto rate = read(d.be_path + "/rate")) {
    auto r = parse_rate_node(*rate);
    if (!r) {
      fatal(d, XenbusState::closed, EINVAL, "rate '" + *rate + "': expected bytes,usec");
      return false;
    }
    n.rate_bytes = r->first;
    n.rate_usec = r->second;
  }
  n.max_queues = options_.max_queues;
  if (auto queues = read(d.be_path + "/queues")) {
    auto v = parse_uint(*queues, 64);
    if (!v || *v < 1) {
      fatal(d, XenbusState::closed, EINVAL, "queues '" + *queues + "': expected 1..64");
      return false;
    }
    n.max_queues = std::min(n.max_queues, static_cast<unsigned>(*v));
  }
  if (!publish) {
    // Resuming a vif a dead daemon served: its frontend chose its queues from that daemon's
    // offer, which this one's limits (another --max-queues, a `queues` node it did not know)
    // do not take back.
    if (auto offered = read(d.be_path + "/multi-queue-max-queues")) {
      if (auto v = parse_uint(*offered, 64); v && *v >= 1) n.max_queues = static_cast<unsigned>(*v);
    }
  }
  // Only what is implemented (no control ring, no multicast control, no XDP headroom).
  auto r = !publish ? xenbus::client::Result<void>{} : xs_->transaction([&](xenbus::client::TxId tx) -> xenbus::client::Result<void> {
    auto w = [&](const char* node, const std::string& v) { return xs_->write(d.be_path + "/" + node, v, tx); };
    for (auto res : {w("feature-sg", "1"), w("feature-gso-tcpv4", "1"), w("feature-gso-tcpv6", "1"),
                     w("feature-ipv6-csum-offload", "1"), w("feature-rx-copy", "1"), w("feature-rx-flip", "0"),
                     w("feature-split-event-channels", "1"),
                     w("multi-queue-max-queues", std::to_string(n.max_queues))}) {
      if (!res) return res;
    }
    return {};
  });
  if (!r) {
    spdlog::error("{}: cannot publish the features: {}", d.name, xenbus::wire::error_name(r.error()));
    return false;
  }
  d.nodes = n;
  spdlog::info("{}: mtu {}{}{}, up to {} queue(s)", d.name, n.mtu,
               !n.bridge.empty() ? fmt::format(", a port of bridge {}{}", n.bridge,
                                               n.addresses ? ", domain " + ipv4_string(n.addresses->domain) : "")
               : n.addresses ? fmt::format(", host {}/{}, domain {}", ipv4_string(n.addresses->host),
                                           n.addresses->prefix, ipv4_string(n.addresses->domain))
                             : std::string(", no address"),
               n.rate_bytes ? fmt::format(", rate {} bytes per {} us", n.rate_bytes, n.rate_usec) : std::string(),
               n.max_queues);
  return true;
}

void Backend::connect(Device& d, bool resume) {
  const std::string& fe = d.fe_path;
  std::vector<VifQueueRings> rings;
  const std::uint64_t generation = next_generation_++;
  try {
    auto flag = [&](const char* node) { return read(fe + "/" + node) == "1"; };
    const auto layout = xenbus::queue_layout(read(fe + "/multi-queue-num-queues"), d.nodes->max_queues);
    if (!layout) throw std::runtime_error(fmt::format("{}/multi-queue-num-queues {}", fe, layout.error()));
    const unsigned nq = layout->queues;
    // Linux netback's rules: rx-copy is the only receive mode; rx-notify is mandatory.
    if (!flag("request-rx-copy")) throw std::runtime_error(fmt::format("{}/request-rx-copy is not 1: only rx-copy is served", fe));
    if (!flag("feature-rx-notify")) throw std::runtime_error(fmt::format("{}/feature-rx-notify is not 1: it is mandatory", fe));
    for (unsigned q = 0; q < nq; ++q) {
      const std::string dir = layout->dir(fe, q);
      auto number = [&](const std::string& node) -> std::optional<std::uint32_t> {
        auto v = read(dir + "/" + node);
        if (!v) return std::nullopt;
        auto n = parse_uint(*v, UINT32_MAX);
        if (!n) throw std::runtime_error(fmt::format("{}/{} {} is not a number", dir, node, xenbus::shown(*v)));
        return static_cast<std::uint32_t>(*n);
      };
      auto need = [&](const std::string& node) {
        auto n = number(node);
        if (!n) throw std::runtime_error(fmt::format("{}/{} is missing", dir, node));
        return *n;
      };
      VifQueueRings r;
      r.tx_ref = need("tx-ring-ref");
      r.rx_ref = need("rx-ring-ref");
      if (auto tx = number("event-channel-tx")) {
        r.tx_evtchn = *tx;
        r.rx_evtchn = need("event-channel-rx");
      } else {
        r.tx_evtchn = need("event-channel");
      }
      rings.push_back(r);
    }
    const bool sg = flag("feature-sg");
    const bool gso4 = sg && flag("feature-gso-tcpv4");
    const bool gso6 = sg && flag("feature-gso-tcpv6");
    // TUN's checksum offload covers IPv4 and IPv6 alike: checksum-partial frames go to the
    // frontend only when it takes both.
    const bool csum = !flag("feature-no-csum-offload") && flag("feature-ipv6-csum-offload");
    VifSettings s;
    s.tap_name = d.name;
    s.bridge = d.nodes->bridge;
    s.mac = s.bridge.empty() ? host_side_mac(d.key.first, d.key.second) : kBridgePortMac;
    s.mtu = d.nodes->mtu;
    s.addresses = d.nodes->addresses;
    s.offload = {csum, csum && gso4, csum && gso6};
    s.queue.sg = sg;
    s.queue.rx_gso = {csum && gso4, csum && gso6};
    s.queue.tx_source = d.nodes->addresses ? d.nodes->addresses->domain : 0;
    s.queue.rate_bytes = d.nodes->rate_bytes;
    s.queue.rate_usec = d.nodes->rate_usec;
    s.queue.resume = resume;
    s.shadow_dir = shadow_dir_;
    s.queue.rx_fill_adaptive = rx_fill_adaptive();
    s.queue.rx_drain = rx_drain_all() || s.queue.rx_fill_adaptive;  // as NetbackQueue enforces
    s.queue.tx_respond_early = tx_respond_early();
    s.steer = steer_spread();
    s.queue.share = &share_;
    s.queue.share_group = generation + 1;  // unique per connection, never 0: one weight per vif
    const Key key = d.key;
    d.conn = std::make_unique<VifConnection>(d.name, domain(d.key.first), rings, s, [this, key, generation](unsigned q) {
      // Queue thread: report to the control thread (a disabled queue closes the vif).
      asio::post(io_, [this, key, generation, q] { guarded([&] { on_queue_exit(key, generation, q); }); });
    });
    d.generation = generation;
    spdlog::info("{}: {} queue(s), {} event channels, sg {}, gso v4 {} v6 {}, csum offload {}; rx fill {}, "
                 "backlog while the guest is behind: {}; tx answered {}; flows {}",
                 d.name, nq, rings.front().rx_evtchn ? "split" : "shared", sg, gso4, gso6, csum,
                 s.queue.rx_fill_adaptive ? "adaptive" : "ring",
                 s.queue.rx_drain ? "drained into the flow queue" : "left in the TAP",
                 s.queue.tx_respond_early ? "before the TAP takes it (copied)" : "after the TAP took it",
                 s.steer && nq > 1 ? "spread over the queues by netback" : "on the guest's queue");
  } catch (const std::exception& e) {
    fatal(d, XenbusState::closing, EINVAL, std::string(resume ? "reconnecting: " : "connecting: ") + e.what());
    return;
  }
  if (resume) {
    spdlog::info("{}: reconnected to {} queue(s) of a previous xpv-netback; state left Connected", d.name, rings.size());
    return;
  }
  if (!write_state(d, XenbusState::connected)) {
    disconnect(d);
    return;
  }
  spdlog::info("{}: connected; backend state Connected", d.name);
}

void Backend::remove_shadows(const std::string& name) noexcept {
  // Also those of queues that never connected here (a failed resume, a vif closed or removed
  // while no xpv-netback ran): every `<name>-q<k>.rxids`.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(shadow_dir_, ec)) {
    const std::string f = e.path().filename().string();
    if (daemon::restart_file_owner(f, kShadowPrefix, kShadowSuffix) == name) std::filesystem::remove(e.path(), ec);
  }
}

void Backend::disconnect(Device& d) {
  remove_shadows(d.name);  // every disconnect is for good (a SIGTERM resets the connections itself)
  if (!d.conn) return;
  d.conn->forget_shadows();
  d.conn.reset();  // stops the queues, unmaps, unbinds; the TAP goes
  spdlog::info("{}: disconnected", d.name);
}

void Backend::fatal(Device& d, XenbusState state, int err, const std::string& what) {
  // Like Linux's xenbus_dev_fatal: say why in xenstore, then leave the connected state.
  spdlog::error("{}: {}", d.name, what);
  (void)xs_->transaction([&](xenbus::client::TxId tx) -> xenbus::client::Result<void> {
    if (auto cur = xs_->read(d.be_path + "/state", tx); !cur) return fail(cur.error());
    return xs_->write(d.be_path + "/error", fmt::format("{} {}", err, what), tx);
  });
  disconnect(d);
  write_state(d, state);
  d.fatal.hold();
}

void Backend::on_queue_exit(const Key& key, std::uint64_t generation, unsigned queue) {
  if (shut_down_) return;
  auto it = devices_.find(key);
  if (it == devices_.end()) return;
  Device& d = it->second;
  if (!d.conn || d.generation != generation || !d.conn->disabled()) return;
  fatal(d, XenbusState::closing, EPROTO, fmt::format("queue {}: ring protocol violation; vif disabled", queue));
}

std::shared_ptr<domain::ForeignDomain> Backend::domain(std::uint16_t domid) {
  if (auto it = domains_.find(domid); it != domains_.end()) {
    if (auto d = it->second.lock()) return d;
  }
  auto d = std::make_shared<domain::ForeignDomain>(domain::ForeignDomain::connect(domid, "xpv-netback", options_.run_dir));
  domains_[domid] = d;
  return d;
}

}  // namespace xpv::netback
