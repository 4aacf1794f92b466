#include "xpv/blkback/backend.h"
#include "xpv/xenbus/client/backend_devices.h"
#include "xpv/xenbus/daemon/backend_main.h"
#include "xpv/xenbus/daemon/run_every.h"
#include "xpv/xenbus/path.h"
#include "xpv/xenbus/peer_value.h"
#include "xpv/xenbus/queue_layout.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <poll.h>
#include <sys/stat.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>

namespace xpv::blkback {

namespace asio = boost::asio;
using xenbus::XenbusState;

namespace {

constexpr std::uint32_t kVdiskReadonly = 0x4;  // io/blkif.h VDISK_READONLY, in `info`

// A decimal number from xenstore (a guest may write anything): digits only, <= max.
std::optional<std::uint32_t> parse_uint(const std::string& s, std::uint32_t max) {
  const auto v = xenbus::parse_uint(s);
  if (!v || *v > max) return std::nullopt;
  return *v;
}

}  // namespace

Backend::Backend(asio::io_context& io, BackendOptions options)
    : io_(io),
      options_(std::move(options)),
      shadow_dir_(options_.run_dir + "/blkback"),
      stats_(stats::stats_dir(options_.run_dir), "xpv-blkback"),
      stats_timer_(io),
      xs_probe_(io) {
  if (options_.max_queues == 0) options_.max_queues = 1;
  std::filesystem::create_directories(shadow_dir_);
  ::chmod(shadow_dir_.c_str(), 0700);
  std::filesystem::create_directories(stats_.dir());
  stats_.remove_leftovers("vbd");
  try {
    xs_ = std::make_unique<xenbus::client::SyncClient>(options_.xenstore_path);
  } catch (const std::exception&) {
    throw std::runtime_error("cannot connect to xpv-xenstored at " + options_.xenstore_path);
  }
  // xenstore client thread: hand the break to the control thread (shutdown() joins that thread
  // before the Backend goes).
  xs_->on_lost([this] { asio::post(io_, [this] { on_xenstore_lost(); }); });
  auto w = xs_->watch(kBase, "vbd", [this](const std::string& path, const std::string&) {
    // xenstore client thread: hand the event to the control thread.
    asio::post(io_, [this, path] { guarded([&] { on_event(path); }); });
  });
  if (!w) throw std::runtime_error(fmt::format("cannot watch {}: {}", kBase, xenbus::wire::error_name(w.error())));
  spdlog::info("blkback: watching {} (max {} queues, ring page order {}, {} indirect segments, poll ≤ {} µs)",
               kBase, options_.max_queues, options_.max_ring_page_order, options_.max_indirect_segments,
               options_.poll_max_us);
  daemon::run_every(stats_timer_, std::chrono::seconds(1), [this] { return shut_down_; }, [this] { publish_stats(); });
}

Backend::~Backend() { shutdown(); }

void Backend::publish_stats() {
  for (const auto& [key, d] : devices_) {
    if (!d.conn) continue;
    std::uint64_t req = 0, rd = 0, wr = 0, fl = 0, ds = 0, rs = 0, ws = 0, err = 0, uns = 0;
    for (std::size_t i = 0; i < d.conn->queues(); ++i) {
      const QueueCounters& c = d.conn->queue(i).counters();
      auto n = [](const std::atomic<std::uint64_t>& v) { return v.load(std::memory_order_relaxed); };
      req += n(c.requests), rd += n(c.reads), wr += n(c.writes), fl += n(c.flushes), ds += n(c.discards);
      rs += n(c.sectors_read), ws += n(c.sectors_written), err += n(c.errors), uns += n(c.unsupported);
    }
    // Linux blkback's statistics names where there is one (xentop's VBD_RD, VBD_WR, …).
    const stats::Counters counters = {{"queues", d.conn->queues()}, {"requests", req}, {"rd_req", rd},
                                      {"wr_req", wr},  {"f_req", fl},  {"ds_req", ds},   {"rd_sect", rs},
                                      {"wr_sect", ws}, {"errors", err}, {"unsupported", uns}};
    if (const int e = stats_.put(d.name, counters); e != 0) {
      spdlog::warn("blkback: cannot publish statistics in {}: {} (not said again)", stats_.dir(), std::strerror(e));
    }
  }
  stats_.sweep();
}

void Backend::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  stats_timer_.cancel();
  xs_probe_.cancel();
  // Stop every queue of every device first so they all drain in parallel, then tear down.
  for (auto& [key, d] : devices_) {
    if (d.conn) d.conn->stop();
  }
  for (auto& [key, d] : devices_) d.conn.reset();
  for (auto& [key, r] : reapers_) {  // their posts are not run: the loop is ending
    if (r.thread.joinable()) r.thread.join();
    r.conn.reset();
  }
  reapers_.clear();
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
  xs_probe_.after_loss("blkback", options_.xenstore_path, fmt::format("{} device(s)", devices_.size()),
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
    spdlog::error("blkback: control plane: {}", e.what());
  }
}

bool Backend::write_state(Device& d, XenbusState s) {
  // In a transaction that first checks the node is there: a state written after the toolstack
  // removed the directory would bring a lone `state` back (the watch event we act on may be
  // older than the removal).
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
  // kBase/<domid>[/<devid>[/...]]
  std::string rest = path.substr(base.size() + 1);
  const auto s1 = rest.find('/');
  if (s1 == std::string::npos) {
    scan();
    return;
  }
  const auto s2 = rest.find('/', s1 + 1);
  auto domid = parse_uint(rest.substr(0, s1), 32751);
  auto devid = parse_uint(rest.substr(s1 + 1, s2 == std::string::npos ? std::string::npos : s2 - s1 - 1), UINT32_MAX);
  if (!domid || !devid || *domid == 0) return;  // not a device of ours
  reconcile({static_cast<std::uint16_t>(*domid), *devid});
}

void Backend::scan() {
  const auto listed = xenbus::client::list_backend_devices(*xs_, kBase);
  std::vector<Key> seen = listed.keys;
  for (const auto& [key, d] : devices_) seen.push_back(key);  // gone ones are noticed and forgotten
  for (const Key& k : seen) reconcile(k);
  // Once, on the first listing that is the whole truth: the shadows of disks not in xenstore (a
  // domain destroyed while no daemon ran) are removed, after the disks found were resumed. (A
  // stale one would not be redone — the slot check in queue.cpp — but nothing else removes it.)
  if (listed.complete && !swept_ && !shut_down_) {
    swept_ = true;
    std::set<std::string, std::less<>> live;
    for (const Key& k : seen) live.insert(fmt::format("vbd{}.{}", k.first, k.second));
    daemon::sweep_orphan_files(shadow_dir_, "vbd", ".shadow", live, "blkback");  // VbdConnection::shadow_path
  }
}

Backend::Device* Backend::adopt(const Key& key) {
  const std::string be = fmt::format("{}/{}/{}", kBase, key.first, key.second);
  auto fe = read(be + "/frontend");
  auto feid = read(be + "/frontend-id");
  if (!fe || !feid) return nullptr;  // the toolstack has not finished writing it
  const std::string name = fmt::format("vbd{}.{}", key.first, key.second);
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
  spdlog::info("{}: new device, frontend {}", name, d.fe_path);
  return &devices_.emplace(key, std::move(d)).first->second;
}

void Backend::forget(const Key& key, bool removed) {
  auto it = devices_.find(key);
  if (it == devices_.end()) return;
  Device& d = it->second;
  (void)disconnect(d, /*for_good=*/true);  // a teardown going on keeps what it needs (disk, domain)
  (void)xs_->unwatch(d.fe_path + "/state", d.fe_token);
  spdlog::info("{}: {}", d.name, removed ? "backend directory removed; device forgotten" : "forgotten");
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

  // The last connection is still being torn down: no step until it is (reaped() reconciles
  // again then). Not even Closing: xpv's own blkfront takes it as the end and takes back its
  // pages, and the queues may still write responses and read data into them.
  if (reapers_.contains(key)) return;
  // An error's state (fatal()), held back while the connection was torn down: said now.
  if (const auto held = d->state_after_teardown) {
    if (!write_state(*d, *held)) return;
    d->state_after_teardown.reset();
    be_state = held;
  }

  // Held in error (ErrorHold, device_state.h): only a closing or closed frontend goes on.
  const bool was_held = d->fatal.held();
  if (!d->fatal.lets_through(fe_state, online)) return;
  if (was_held && !d->fatal.held()) spdlog::info("{}: the error is over (frontend {}); the disk may start over", d->name, xenbus::to_string(fe_state));

  if (d->reaped) {
    d->reaped = false;
    // While the old rings were being let go, the frontend went on without us: Linux's blkfront
    // reset by a kexec kernel (Closing, Closed, Initialising, each waited for 5 s at most) takes
    // our Connected for an offer and connects new rings. Connect those; the step below would
    // wait for a close that is not coming.
    if (!d->conn && online && *be_state == XenbusState::connected &&
        (fe_state == XenbusState::connected || fe_state == XenbusState::initialised)) {
      spdlog::info("{}: the frontend connected new rings while the old ones were let go; connecting them", d->name);
      if (d->disk || probe(*d)) connect(*d, /*resume=*/false);
      return;
    }
  }

  // Restart: the device was Connected when a previous xpv-blkback died. Reattach to the
  // published rings without touching `state`: the frontend sees nothing.
  if (!d->resume_checked) {
    d->resume_checked = true;
    if (!d->conn && *be_state == XenbusState::connected &&
        (fe_state == XenbusState::connected || fe_state == XenbusState::initialised)) {
      if (probe(*d)) connect(*d, /*resume=*/true);
      return;
    }
  }

  if (!d->disk && *be_state != XenbusState::closing && *be_state != XenbusState::closed) {
    if (!probe(*d)) return;
  }
  if (*be_state == XenbusState::initialising) {
    if (!write_state(*d, XenbusState::init_wait)) return;
    be_state = XenbusState::init_wait;
  }

  const xenbus::BackendStep step = xenbus::backend_step(*be_state, fe_state, online);
  switch (step.action) {
    case xenbus::BackendAction::connect:
      if (!d->disk && !probe(*d)) return;
      if (!d->conn) connect(*d, /*resume=*/false);
      return;
    case xenbus::BackendAction::disconnect:
      if (step.next == XenbusState::init_wait) {
        spdlog::info("{}: the frontend started over (Initialising) while the disk was Connected; offering it again",
                     d->name);
      }
      if (!disconnect(*d, /*for_good=*/true)) return;  // the step is taken once it is done
      write_state(*d, step.next);
      return;
    case xenbus::BackendAction::disconnect_remove:
      if (!disconnect(*d, /*for_good=*/true)) return;
      d->disk.reset();
      write_state(*d, step.next);
      return;
    case xenbus::BackendAction::none:
      if (step.next != *be_state) {
        if (step.next == XenbusState::init_wait) {
          // The frontend starts over after a close: offer the device again.
          if (!d->disk && !probe(*d)) return;
          (void)xs_->rm(d->be_path + "/error");
        }
        write_state(*d, step.next);
      }
      return;
  }
}

bool Backend::probe(Device& d) {
  auto params = read(d.be_path + "/params");
  auto mode = read(d.be_path + "/mode").value_or("w");
  if (!params || params->empty()) {
    fatal(d, XenbusState::closed, ENOENT, "no params (image path) in " + d.be_path);
    return false;
  }
  if (mode != "r" && mode != "w") {
    fatal(d, XenbusState::closed, EINVAL, "mode '" + mode + "': expected r or w");
    return false;
  }
  try {
    d.disk = std::make_shared<Disk>(Disk::open(*params, mode == "r"));
  } catch (const std::exception& e) {
    fatal(d, XenbusState::closed, ENOENT, e.what());
    return false;
  }
  const DiskInfo& info = d.disk->info();
  const bool discard = info.discard && read(d.be_path + "/discard-enable").value_or("1") != "0";
  auto r = xs_->transaction([&](xenbus::client::TxId tx) -> xenbus::client::Result<void> {
    auto w = [&](const char* node, const std::string& v) { return xs_->write(d.be_path + "/" + node, v, tx); };
    for (auto res : {w("feature-flush-cache", "1"), w("feature-discard", discard ? "1" : "0"),
                     w("feature-max-indirect-segments", std::to_string(options_.max_indirect_segments)),
                     w("max-ring-page-order", std::to_string(options_.max_ring_page_order)),
                     w("multi-queue-max-queues", std::to_string(options_.max_queues)),
                     w("feature-persistent", "0")}) {
      if (!res) return res;
    }
    if (discard) {
      for (auto res : {w("discard-granularity", std::to_string(std::max<std::uint32_t>(info.physical_block_size, 4096))),
                       w("discard-alignment", "0"), w("discard-secure", "0")}) {
        if (!res) return res;
      }
    }
    return {};
  });
  if (!r) {
    d.disk.reset();
    spdlog::error("{}: cannot publish the features: {}", d.name, xenbus::wire::error_name(r.error()));
    return false;
  }
  spdlog::info("{}: {} ({} sectors, {}{}{})", d.name, d.disk->path(), info.sectors, info.readonly ? "read-only" : "read-write",
               info.direct ? ", O_DIRECT" : ", buffered", discard ? ", discard" : "");
  return true;
}

void Backend::connect(Device& d, bool resume) {
  const std::string& fe = d.fe_path;
  std::vector<QueueRings> rings;
  const std::uint64_t generation = next_generation_++;
  try {
    const auto layout = xenbus::queue_layout(read(fe + "/multi-queue-num-queues"), options_.max_queues);
    if (!layout) throw std::runtime_error(fmt::format("{}/multi-queue-num-queues {}", fe, layout.error()));
    const unsigned nq = layout->queues;
    if (auto p = read(fe + "/protocol"); p && *p != "x86_64-abi") {
      throw std::runtime_error(fmt::format("{}/protocol {}: only x86_64-abi is served", fe, xenbus::shown(*p)));
    }
    const auto root_order = read(fe + "/ring-page-order");
    for (unsigned q = 0; q < nq; ++q) {
      const std::string dir = layout->dir(fe, q);
      QueueRings r;
      auto order_s = read(dir + "/ring-page-order");
      if (!order_s) order_s = root_order;
      if (order_s) {
        auto o = parse_uint(*order_s, options_.max_ring_page_order);
        if (!o) throw std::runtime_error(fmt::format("{}/ring-page-order {}: expected 0..{}", dir, xenbus::shown(*order_s), options_.max_ring_page_order));
        r.page_order = *o;
      }
      auto ref_at = [&](const std::string& node) {
        auto v = read(dir + "/" + node);
        if (!v) throw std::runtime_error(fmt::format("{}/{} is missing", dir, node));
        auto ref = parse_uint(*v, UINT32_MAX);
        if (!ref) throw std::runtime_error(fmt::format("{}/{} {} is not a grant reference", dir, node, xenbus::shown(*v)));
        return *ref;
      };
      if (r.page_order == 0) {
        r.refs.push_back(read(dir + "/ring-ref") ? ref_at("ring-ref") : ref_at("ring-ref0"));
      } else {
        for (unsigned i = 0; i < (1u << r.page_order); ++i) r.refs.push_back(ref_at(fmt::format("ring-ref{}", i)));
      }
      r.event_channel = ref_at("event-channel");
      rings.push_back(std::move(r));
    }
    QueueConfig cfg;
    cfg.max_indirect_segments = options_.max_indirect_segments;
    cfg.poll_max = std::chrono::microseconds(options_.poll_max_us);
    cfg.flush = true;
    cfg.discard = read(d.be_path + "/feature-discard") == "1";
    const Key key = d.key;
    d.conn = std::make_unique<VbdConnection>(
        d.name, domain(d.key.first), *d.disk, rings, cfg, shadow_dir_, resume, [this, key, generation](unsigned q) {
          // Queue thread: report to the control thread (a disabled queue closes the device).
          asio::post(io_, [this, key, generation, q] { guarded([&] { on_queue_exit(key, generation, q); }); });
        });
    d.generation = generation;
  } catch (const std::exception& e) {
    fatal(d, XenbusState::closing, EINVAL, std::string(resume ? "reconnecting: " : "connecting: ") + e.what());
    return;
  }
  if (resume) {
    spdlog::info("{}: reconnected to {} queue(s) of a previous xpv-blkback; state left Connected", d.name, rings.size());
    return;
  }
  const DiskInfo& info = d.disk->info();
  auto r = xs_->transaction([&](xenbus::client::TxId tx) -> xenbus::client::Result<void> {
    auto w = [&](const char* node, const std::string& v) { return xs_->write(d.be_path + "/" + node, v, tx); };
    for (auto res : {w("sectors", std::to_string(info.sectors)), w("info", std::to_string(info.readonly ? kVdiskReadonly : 0)),
                     w("sector-size", std::to_string(info.logical_block_size)),
                     w("physical-sector-size", std::to_string(info.physical_block_size)), w("state", "4")}) {
      if (!res) return res;
    }
    return {};
  });
  if (!r) {
    fatal(d, XenbusState::closing, EIO, "cannot publish the disk geometry");
    return;
  }
  spdlog::info("{}: connected, {} queue(s), ring page order {}; backend state Connected", d.name, rings.size(),
               rings.front().page_order);
}

bool Backend::disconnect(Device& d, bool for_good) {
  if (reapers_.contains(d.key)) return false;
  if (!d.conn) return true;
  if (for_good) d.conn->forget_shadows();
  d.conn->stop();  // the queues stop taking requests now
  // The queues' end waits for the I/O in flight: on a thread of its own, so that a disk whose
  // storage hangs holds up nothing but itself (the header).
  const Key key = d.key;
  Reaper& r = reapers_[key];
  r.conn = std::move(d.conn);
  r.disk = d.disk;
  try {
    r.thread = std::thread([this, key, conn = r.conn.get()] {
      conn->join();
      asio::post(io_, [this, key] { reaped(key); });
    });
  } catch (const std::exception& e) {
    spdlog::warn("{}: no thread for the teardown ({}); waiting for its queues here", d.name, e.what());
    reapers_.erase(key);  // joins and tears down the connection, on this thread
    spdlog::info("{}: disconnected", d.name);
    return true;
  }
  spdlog::info("{}: disconnecting: its queues finish the I/O in flight; the device waits for them", d.name);
  return false;
}

void Backend::reaped(const Key& key) {
  auto it = reapers_.find(key);
  if (it == reapers_.end()) return;
  it->second.thread.join();  // it posted this as its last act
  const std::string name = it->second.conn->name();
  reapers_.erase(it);  // unmap, unbind, the shadows (VbdConnection's destructor)
  spdlog::info("{}: disconnected", name);
  auto d = devices_.find(key);
  if (d == devices_.end()) return;  // forgotten meanwhile
  d->second.reaped = true;
  guarded([&] { reconcile(key); });  // the step that waited for it
}

void Backend::fatal(Device& d, XenbusState state, int err, const std::string& what) {
  // Like Linux's xenbus_dev_fatal: say why in xenstore, then leave the connected state.
  spdlog::error("{}: {}", d.name, what);
  // Only into a directory that is still there (see write_state).
  (void)xs_->transaction([&](xenbus::client::TxId tx) -> xenbus::client::Result<void> {
    if (auto cur = xs_->read(d.be_path + "/state", tx); !cur) return fail(cur.error());
    return xs_->write(d.be_path + "/error", fmt::format("{} {}", err, what), tx);
  });
  // Written once the connection is let go (reaped(), for one torn down on a reaper).
  if (disconnect(d, /*for_good=*/true)) {
    write_state(d, state);
  } else {
    d.state_after_teardown = state;
  }
  d.fatal.hold();
}

void Backend::on_queue_exit(const Key& key, std::uint64_t generation, unsigned queue) {
  if (shut_down_) return;
  auto it = devices_.find(key);
  if (it == devices_.end()) return;
  Device& d = it->second;
  if (!d.conn || d.generation != generation || !d.conn->disabled()) return;
  fatal(d, XenbusState::closing, EPROTO, fmt::format("queue {}: ring protocol violation; device disabled", queue));
}

std::shared_ptr<domain::ForeignDomain> Backend::domain(std::uint16_t domid) {
  if (auto it = domains_.find(domid); it != domains_.end()) {
    // Alive, unless its control connection has ended: a connection still being torn down keeps
    // a destroyed domain's object, and a new domain may have been given its id since.
    if (auto d = it->second.lock()) {
      pollfd p{d->death_fd(), POLLRDHUP, 0};
      if (::poll(&p, 1, 0) <= 0 || (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) return d;
    }
  }
  auto d = std::make_shared<domain::ForeignDomain>(domain::ForeignDomain::connect(domid, "xpv-blkback", options_.run_dir));
  domains_[domid] = d;
  return d;
}

}  // namespace xpv::blkback
