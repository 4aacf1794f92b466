// The blkfront xenbus driver (see vbd_driver.h). Every function below except the constructor,
// start(), shutdown() and the destructor runs on the RingClient's watch thread.
#include "xpv/frontends/vbd_driver.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <future>
#include <set>
#include <thread>

#include "xpv/ring/blkif.h"

namespace xpv::frontends {

namespace fs = std::filesystem;
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

// VDISK_READONLY in the backend's `info` node (io/blkif.h).
constexpr std::uint64_t kVdiskReadonly = 4;

// Domain pages a Blkfront with this config takes (rings, data pages, indirect pages).
std::uint64_t pages_needed(const BlkfrontConfig& c) {
  const std::uint64_t slots = ring::blkif_ring_size(c.ring_page_order);
  const std::uint64_t segs = c.indirect_segments ? c.indirect_segments : ring::kBlkifMaxSegmentsPerRequest;
  const std::uint64_t ind = c.indirect_segments ? ring::blkif_indirect_pages(c.indirect_segments) : 0;
  return c.queues * ((std::uint64_t{1} << c.ring_page_order) + slots * (segs + ind));
}

// The nodes a frontend of either layout may have written for its rings (blkif.h): what setup()
// removes before it writes its own, so that nothing of an earlier incarnation with another
// layout (one queue vs several, another order) is left for the backend to read.
bool is_ring_node(const std::string& name) {
  return name.rfind("ring-ref", 0) == 0 || name == "ring-page-order" || name == "event-channel" ||
         name == "multi-queue-num-queues" || name.rfind("queue-", 0) == 0;
}

}  // namespace

VbdDriver::VbdDriver(domain::Domain& dom, GuestEvents& events, xenbus::client::RingClient& xs,
                     VbdDriverConfig config)
    : dom_(dom), events_(events), xs_(xs), config_(std::move(config)) {}

VbdDriver::~VbdDriver() {
  if (started_ && !shut_down_) shutdown(config_.close_timeout * 4);
  // Whatever shutdown left behind (it timed out): no mount may outlive the process. The watch
  // thread is idle or finishing; run the last teardown there too.
  std::promise<void> done;
  auto f = done.get_future();
  xs_.post([this, &done] {
    for (auto& [id, v] : devs_) teardown(*v);
    devs_.clear();
    done.set_value();
  });
  f.wait();
}

std::string VbdDriver::base() const {
  return "/local/domain/" + std::to_string(config_.domid) + "/device/vbd";
}

Result<void> VbdDriver::start() {
  started_ = true;
  // The first firing of the watch scans what is there already.
  return xs_.watch(base(), "vbd", [this](const std::string&, const std::string&) { rescan(); });
}

bool VbdDriver::shutdown(std::chrono::milliseconds bound) {
  shut_down_ = true;
  auto done = std::make_shared<std::promise<void>>();
  auto f = done->get_future();
  xs_.post([this, done] {
    stopping_ = true;
    (void)xs_.unwatch(base(), "vbd");
    for (auto& [id, v] : devs_) {
      close_device(*v);
      (void)xs_.unwatch(v->back + "/state", "vbd-be:" + id);
    }
    devs_.clear();
    done->set_value();
  });
  return f.wait_for(bound) == std::future_status::ready;
}

// ---- watch thread ---------------------------------------------------------------------------

void VbdDriver::rescan() {
  if (stopping_) return;
  auto list = xs_.directory(base());
  std::set<std::string> present;
  if (list) present.insert(list->begin(), list->end());
  else if (list.error() != xenbus::wire::Error::enoent) {
    spdlog::warn("dom{}: vbd: cannot list {}: {}", config_.domid, base(),
                 xenbus::wire::error_name(list.error()));
    return;
  }
  // Removed devices: the toolstack deleted the directory (both ends are Closed by then, or the
  // domain is being destroyed). Stop using them; nothing left to publish.
  for (auto it = devs_.begin(); it != devs_.end();) {
    if (present.count(it->first)) {
      ++it;
      continue;
    }
    spdlog::info("dom{}: vbd {}: removed", config_.domid, it->first);
    teardown(*it->second);
    (void)xs_.unwatch(it->second->back + "/state", "vbd-be:" + it->first);
    it = devs_.erase(it);
  }
  for (const auto& id : present) {
    if (devs_.count(id)) continue;
    if (!parse_u64(id)) continue;  // not a device number: not ours to handle
    auto v = std::make_unique<Vbd>();
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
    // A device starts from Initialising whatever an earlier incarnation left in the node.
    auto st = xs_.read(v->front + "/state");
    if (!st || xenbus::parse_state(*st) != XenbusState::initialising) {
      (void)xs_.write(v->front + "/state", "1");
    }
    Vbd& ref = *v;
    devs_.emplace(id, std::move(v));
    spdlog::info("dom{}: vbd {}: backend {} (dom{})", config_.domid, id, ref.back, ref.backend_id);
    auto w = xs_.watch(ref.back + "/state", "vbd-be:" + id,
                       [this](const std::string&, const std::string&) { rescan(); });
    if (!w) {
      spdlog::warn("dom{}: vbd {}: cannot watch {}/state: {}", config_.domid, id, ref.back,
                   xenbus::wire::error_name(w.error()));
    }
  }
  for (auto& [id, v] : devs_) step(*v);
}

std::optional<XenbusState> VbdDriver::backend_state(const Vbd& v) {
  auto s = xs_.read(v.back + "/state");
  if (!s) {
    if (s.error() == xenbus::wire::Error::enoent) return XenbusState::unknown;
    return std::nullopt;  // cannot tell now (timeout): act on the next event
  }
  return xenbus::parse_state(*s);  // garbage from the backend: nullopt, ignored
}

void VbdDriver::step(Vbd& v) {
  auto be = backend_state(v);
  if (!be) return;
  // A failed device waits for the backend to start over (InitWait again after Closed).
  if (v.failed) {
    if (*be == XenbusState::closed || *be == XenbusState::unknown) return;
    if (*be == XenbusState::init_wait && v.state == XenbusState::closed) {
      v.failed = false;
      v.state = XenbusState::initialising;
    } else {
      return;
    }
  }
  // After a close, a backend that offers the device again (InitWait) is set up anew.
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
      return;  // setup() published Initialised with its nodes
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
      spdlog::info("dom{}: vbd {}: backend {}: disconnecting", config_.domid, v.devid,
                   xenbus::to_string(*be));
      teardown(v);
      publish_state(v, s.next);
      return;
  }
}

bool VbdDriver::publish_state(Vbd& v, XenbusState s) {
  auto r = xs_.write(v.front + "/state", std::to_string(static_cast<int>(s)));
  if (!r) {
    spdlog::warn("dom{}: vbd {}: cannot publish state {}: {}", config_.domid, v.devid,
                 xenbus::to_string(s), xenbus::wire::error_name(r.error()));
    return false;
  }
  v.state = s;
  return true;
}

std::uint64_t VbdDriver::free_pages_estimate() const {
  const std::uint64_t total = dom_.config().memory_bytes >> kPageShift;
  const std::uint64_t fixed = domain::Domain::kFirstGrantGfn + dom_.config().max_grant_frames;
  const std::uint64_t used = fixed + pages_in_use_;
  return total > used ? total - used : 0;
}

bool VbdDriver::setup(Vbd& v) {
  auto feature = [&](const char* name) -> std::uint64_t {
    auto r = xs_.read(v.back + "/" + name);
    if (!r) return 0;
    return parse_u64(*r).value_or(0);
  };
  const std::uint64_t be_indirect = feature("feature-max-indirect-segments");
  const std::uint64_t be_order = feature("max-ring-page-order");
  // Absent (or 0, or garbage): the backend has one ring per device.
  const std::uint64_t be_queues = std::max<std::uint64_t>(1, feature("multi-queue-max-queues"));
  BlkfrontConfig cfg;
  cfg.queues = static_cast<std::uint32_t>(
      std::min<std::uint64_t>({be_queues, config_.max_queues, kBlkfrontMaxQueues}));
  cfg.queues = std::max<std::uint32_t>(cfg.queues, 1);
  cfg.backend = v.backend_id;
  cfg.completion_threads = true;  // the FUSE file's reads and writes start asynchronously
  cfg.ring_page_order = static_cast<std::uint32_t>(
      std::min<std::uint64_t>({be_order, config_.max_ring_page_order, 4}));
  std::uint64_t indirect = std::min<std::uint64_t>(
      {be_indirect, config_.max_indirect_segments, ring::kBlkifMaxIndirectSegments});
  if (indirect <= ring::kBlkifMaxSegmentsPerRequest) indirect = 0;  // direct requests do as much
  cfg.indirect_segments = static_cast<std::uint32_t>(indirect);
  // Fit the device into the domain's memory: fewer segments, then smaller rings, then fewer
  // queues.
  const std::uint64_t free = free_pages_estimate();
  while (pages_needed(cfg) > free) {
    if (cfg.indirect_segments > 2 * ring::kBlkifMaxSegmentsPerRequest) cfg.indirect_segments /= 2;
    else if (cfg.indirect_segments) cfg.indirect_segments = 0;
    else if (cfg.ring_page_order) --cfg.ring_page_order;
    else if (cfg.queues > 1) --cfg.queues;
    else {
      spdlog::error("dom{}: vbd {}: the domain's memory has no room for a ring ({} pages free)",
                    config_.domid, v.devid, free);
      return false;
    }
  }
  try {
    v.blk = std::make_unique<Blkfront>(dom_, events_, cfg);
  } catch (const std::exception& e) {
    spdlog::error("dom{}: vbd {}: {}", config_.domid, v.devid, e.what());
    return false;
  }
  pages_in_use_ += pages_needed(cfg);
  const Blkfront& blk = *v.blk;
  // blkif.h, "Multiple hardware queues/rings": with one queue the flat layout (ring-ref[N] and
  // event-channel in the device directory, no multi-queue-num-queues, whether or not the backend
  // offers more); with several, multi-queue-num-queues and queue-<i>/{ring-ref[N], event-channel};
  // ring-page-order always in the device directory.
  auto r = xs_.transaction([&](TxId tx) -> Result<void> {
    auto w = [&](const std::string& name, const std::string& value) {
      return xs_.write(v.front + "/" + name, value, tx);
    };
    Result<void> res;
    auto old = xs_.directory(v.front, tx);
    if (!old) return xpv::fail(old.error());
    for (const auto& name : *old) {
      if (!is_ring_node(name)) continue;
      res = xs_.rm(v.front + "/" + name, tx);
      if (!res && res.error() != xenbus::wire::Error::enoent) return res;
    }
    if (cfg.ring_page_order > 0) {
      res = w("ring-page-order", std::to_string(cfg.ring_page_order));
      if (!res) return res;
    }
    const bool multi = blk.queues() > 1;
    if (multi) {
      res = w("multi-queue-num-queues", std::to_string(blk.queues()));
      if (!res) return res;
    }
    for (std::uint32_t q = 0; q < blk.queues(); ++q) {
      const std::string dir = multi ? "queue-" + std::to_string(q) + "/" : "";
      const auto& refs = blk.ring_refs(q);
      if (cfg.ring_page_order == 0) {
        res = w(dir + "ring-ref", std::to_string(refs.at(0)));
        if (!res) return res;
      } else {
        for (std::size_t i = 0; i < refs.size(); ++i) {
          res = w(dir + "ring-ref" + std::to_string(i), std::to_string(refs[i]));
          if (!res) return res;
        }
      }
      res = w(dir + "event-channel", std::to_string(blk.event_channel(q)));
      if (!res) return res;
    }
    for (auto [k, val] : {std::pair<const char*, std::string>{"protocol", "x86_64-abi"},
                          {"feature-persistent", "0"},
                          {"state", std::to_string(static_cast<int>(XenbusState::initialised))}}) {
      res = w(k, val);
      if (!res) return res;
    }
    return {};
  });
  if (!r) {
    spdlog::error("dom{}: vbd {}: cannot publish the ring: {}", config_.domid, v.devid,
                  xenbus::wire::error_name(r.error()));
    return false;
  }
  v.state = XenbusState::initialised;
  spdlog::info("dom{}: vbd {}: {} ring(s) published (order {}, {} indirect segments, first port {})",
               config_.domid, v.devid, cfg.queues, cfg.ring_page_order, cfg.indirect_segments,
               blk.event_channel(0));
  return true;
}

bool VbdDriver::connect(Vbd& v) {
  if (!v.blk) return false;
  auto num = [&](const char* name) -> std::optional<std::uint64_t> {
    auto r = xs_.read(v.back + "/" + name);
    if (!r) return std::nullopt;
    return parse_u64(*r);
  };
  const auto sectors = num("sectors");
  if (!sectors || *sectors == 0) {
    spdlog::error("dom{}: vbd {}: the backend published no valid `sectors`", config_.domid, v.devid);
    return false;
  }
  const std::uint64_t info = num("info").value_or(0);
  const std::uint64_t sector_size = num("sector-size").value_or(512);
  if (sector_size < 512 || sector_size % 512 != 0) {
    spdlog::error("dom{}: vbd {}: sector-size {} is not a multiple of 512", config_.domid, v.devid,
                  sector_size);
    return false;
  }
  BlkfrontGeometry g;
  g.sectors = *sectors;  // blkif: always 512-byte units, whatever sector-size says
  g.readonly = (info & kVdiskReadonly) != 0;
  g.flush = num("feature-flush-cache").value_or(0) == 1;
  g.discard = num("feature-discard").value_or(0) == 1;
  v.blk->connect(g);
  v.mountpoint = config_.run_dir + "/dom" + std::to_string(config_.domid) + "/vbd/" + v.devid;
  try {
    fs::create_directories(v.mountpoint);
    v.fuse = std::make_unique<FuseDisk>(v.mountpoint, "disk", *v.blk);
  } catch (const std::exception& e) {
    spdlog::error("dom{}: vbd {}: {}", config_.domid, v.devid, e.what());
    return false;
  }
  ++connected_;
  spdlog::info("dom{}: vbd {}: connected, {} sectors{}, disk at {}/disk", config_.domid, v.devid,
               g.sectors, g.readonly ? " (read-only)" : "", v.mountpoint);
  return true;
}

void VbdDriver::teardown(Vbd& v) {
  if (v.fuse) {
    v.fuse.reset();  // unmounts; no more I/O reaches the Blkfront
    --connected_;
  }
  if (v.blk) {
    pages_in_use_ -= std::min(pages_in_use_, pages_needed(v.blk->config()));
    v.blk.reset();
  }
  if (!v.mountpoint.empty()) {
    // The mountpoint and, if they are empty now, vbd/ and dom<N>/ (rmdir refuses non-empty).
    fs::path p = v.mountpoint;
    for (int i = 0; i < 3 && ::rmdir(p.c_str()) == 0; ++i) p = p.parent_path();
    v.mountpoint.clear();
  }
}

// Frontend-initiated close (shutdown): stop I/O, tell the backend, give it a bounded time to
// let go of the ring, then end the grants and say Closed.
void VbdDriver::close_device(Vbd& v) {
  if (v.fuse) {
    v.fuse.reset();
    --connected_;
  }
  if (v.blk && (v.state == XenbusState::initialised || v.state == XenbusState::connected)) {
    if (publish_state(v, XenbusState::closing)) {
      const auto deadline = std::chrono::steady_clock::now() + config_.close_timeout;
      for (;;) {
        auto be = backend_state(v);
        if (be && (*be == XenbusState::closing || *be == XenbusState::closed ||
                   *be == XenbusState::unknown)) {
          break;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
          spdlog::warn("dom{}: vbd {}: the backend did not close within {} ms", config_.domid,
                       v.devid, config_.close_timeout.count());
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  teardown(v);
  if (v.state != XenbusState::closed) publish_state(v, XenbusState::closed);
  spdlog::info("dom{}: vbd {}: closed", config_.domid, v.devid);
}

}  // namespace xpv::frontends
