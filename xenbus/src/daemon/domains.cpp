// xpv-xenstored's attachment of real domains (see domains.h). io_context thread only.
#include "xpv/xenbus/daemon/domains.h"

#include <fcntl.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <nlohmann/json.hpp>
#include <thread>

#include "xpv/domain/control_protocol.h"
#include "xpv/domain/foreign_domain.h"
#include "xpv/xenbus/daemon/ring_connection.h"

namespace xpv::xenbus::daemon {

namespace asio = boost::asio;

struct Domains::Attached {
  DomId domid = 0;
  std::unique_ptr<domain::ForeignDomain> foreign;  // memory mapping + control socket
  std::shared_ptr<domain::Dom0Port> port;          // the xenstore event channel, dom0's end
  std::uint32_t dom0_port = 0;
  std::uint64_t mfn = 0;            // as introduced
  std::uint32_t port_number = 0;    // the domain's end of the channel, as introduced
  std::shared_ptr<RingConnection> ring;
  std::unique_ptr<asio::posix::stream_descriptor> death;  // a dup of the control socket
  bool dropped = false;
};

Domains::Domains(asio::io_context& io, Store& store, std::string run_dir)
    : io_(io), store_(store), run_dir_(std::move(run_dir)) {}

Domains::~Domains() {
  // The daemon is going down: stop serving every ring before the mappings go away.
  auto doms = doms_;
  for (auto& [id, a] : doms) drop(a);
}

Expected<void, wire::Error> Domains::attach(DomId domid, std::uint64_t mfn, std::uint32_t port) {
  // A RELEASE whose drop is still queued: let go of the old binding now so that the port is
  // unbound for dom0 again (the posted drop closes the old ring; it cannot run inside this call).
  if (auto it = doms_.find(domid); it != doms_.end()) {
    auto old = it->second;
    doms_.erase(it);
    if (old->foreign && old->port) {
      try {
        old->foreign->unbind(old->dom0_port);
      } catch (const std::exception&) {
      }
      old->port.reset();
    }
    asio::post(io_, [this, old] { drop(old); });
  }
  auto a = connect(domid, mfn, port);
  if (!a) return fail(a.error());
  // start() registers the connection with the Store and serves requests already on the ring:
  // not from inside this Store call.
  asio::post(io_, [a = *a, mfn] {
    if (a->dropped) return;
    a->ring->start();
    spdlog::info("xenstored: dom{} attached (ring gfn {:#x}, port {})", a->domid, mfn, a->dom0_port);
  });
  return {};
}

Expected<std::shared_ptr<Domains::Attached>, wire::Error> Domains::connect(DomId domid, std::uint64_t mfn,
                                                                           std::uint32_t port) {
  auto a = std::make_shared<Attached>();
  a->domid = domid;
  a->mfn = mfn;
  a->port_number = port;
  try {
    a->foreign = std::make_unique<domain::ForeignDomain>(
        domain::ForeignDomain::connect(domid, "xenstored", run_dir_));
    const domain::XenstoreInfo xs = a->foreign->xenstore();
    if (xs.gfn != mfn || xs.port != port) {
      spdlog::warn("xenstored: introduce dom{}: mfn {:#x} port {} is not its xenstore ring "
                   "(the domain says gfn {:#x} port {})",
                   domid, mfn, port, xs.gfn, xs.port);
      return fail(wire::Error::einval);
    }
    auto page = a->foreign->memory().page(xs.gfn);
    if (!page) {
      spdlog::warn("xenstored: introduce dom{}: gfn {:#x} is outside its memory", domid, xs.gfn);
      return fail(wire::Error::einval);
    }
    a->port = std::shared_ptr<domain::Dom0Port>(a->foreign->bind(port, &a->dom0_port));
    const int kick_in = ::fcntl(a->port->wait_fd(), F_DUPFD_CLOEXEC, 0);
    if (kick_in < 0) {
      spdlog::warn("xenstored: introduce dom{}: dup of the event channel fd failed", domid);
      return fail(wire::Error::enomem);
    }
    std::weak_ptr<domain::Dom0Port> weak = a->port;
    a->ring = std::make_shared<RingConnection>(
        io_, store_, *page, kick_in,
        [weak] {
          auto p = weak.lock();
          return p && p->notify().has_value();
        },
        domid);
    const int death = ::fcntl(a->foreign->death_fd(), F_DUPFD_CLOEXEC, 0);
    if (death < 0) return fail(wire::Error::enomem);
    a->death = std::make_unique<asio::posix::stream_descriptor>(io_, death);
  } catch (const std::exception& e) {
    // No socket, a domain that does not answer, a bind refused: Xen's xenstored fails the
    // introduce with the errno of its map/bind call, which libxenstore sees as EINVAL unless it
    // is one of the xsd_errors names.
    spdlog::warn("xenstored: introduce dom{}: {}", domid, e.what());
    return fail(wire::Error::einval);
  }
  doms_[domid] = a;
  watch_death(a);
  return a;
}

nlohmann::json Domains::save() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [id, a] : doms_) {
    if (a->dropped || !a->ring) continue;
    out.push_back({{"domid", id}, {"mfn", a->mfn}, {"port", a->port_number}, {"ring", a->ring->save()}});
  }
  return out;
}

void Domains::restore(const nlohmann::json& saved) {
  for (const auto& e : saved) {
    const nlohmann::json& ring = e.at("ring");
    reattach(e.at("domid").get<DomId>(), e.at("mfn").get<std::uint64_t>(), e.at("port").get<std::uint32_t>(),
             ring.at("id").get<ConnId>(), [&ring](RingConnection& r) { r.restore(ring); }, false, "live update");
  }
}

nlohmann::json Domains::journal_state() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [id, a] : doms_) {
    if (a->dropped || !a->ring) continue;
    nlohmann::json j = a->ring->journal_state().to_json();
    j["domid"] = id;
    out.push_back(std::move(j));
  }
  return out;
}

void Domains::recover(const std::vector<Store::RecoveredDomain>& domains, const std::map<DomId, RingJournalState>& rings) {
  for (const auto& d : domains) {
    const auto it = rings.find(d.domid);
    // Without a record of the ring (a domain introduced by an older daemon): served from the
    // page's indexes, what was between the ring and the store lost.
    const RingJournalState none;
    const RingJournalState& st = it != rings.end() ? it->second : none;
    reattach(d.domid, d.mfn, d.port, d.conn, [&](RingConnection& r) { r.recover(d.conn, st); }, true, "crash restart");
  }
}

void Domains::reattach(DomId domid, std::uint64_t mfn, std::uint32_t port, ConnId conn,
                       const std::function<void(RingConnection&)>& load, bool refire, const char* why) {
  const auto ids = store_.connection_ids();
  if (std::find(ids.begin(), ids.end(), conn) == ids.end()) {
    spdlog::warn("xenstored: {}: dom{}'s ring connection {} is not in the state; not attached", why, domid, conn);
    return;
  }
  // The previous process's binding of the port ends when the domain sees its control connection
  // close (at the exec, or the death); until it has, the bind is refused: a bounded retry.
  auto a = connect(domid, mfn, port);
  for (int i = 0; !a && i < 50 && ::access(domain::control::socket_path(domid, run_dir_).c_str(), F_OK) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    a = connect(domid, mfn, port);
  }
  auto give_up = [&](const std::string& reason) {
    // What the domain's death would have done.
    spdlog::warn("xenstored: {}: dom{} {}; releasing it", why, domid, reason);
    if (a) drop(*a);
    store_.disconnect(conn);
    if (store_.is_introduced(domid)) (void)store_.release(domid);
  };
  if (!a) {
    give_up("cannot be attached again");  // it went away while no daemon watched it
    return;
  }
  try {
    load(*(*a)->ring);
  } catch (const std::exception& e) {
    give_up(std::string("has a ring state that cannot be taken over: ") + e.what());
    return;
  }
  // Served once every transport of the state has its Sink again (posted after the rest).
  asio::post(io_, [this, a = *a, conn, refire, why] {
    if (a->dropped) return;
    a->ring->serve();
    if (refire) store_.refire_watches(conn);
    spdlog::info("xenstored: dom{} ring served again after the {} (port {})", a->domid, why, a->dom0_port);
  });
}

void Domains::watch_death(const std::shared_ptr<Attached>& a) {
  std::weak_ptr<Attached> weak = a;
  a->death->async_wait(asio::posix::stream_descriptor::wait_read,
                       [this, weak](boost::system::error_code ec) {
                         auto self = weak.lock();
                         if (ec || !self || self->dropped) return;
                         // The control socket is readable only at EOF (ControlClient calls are
                         // request/reply and none is in flight): the domain process is gone.
                         spdlog::info("xenstored: dom{} went away; releasing it", self->domid);
                         if (store_.is_introduced(self->domid)) (void)store_.release(self->domid);
                         drop(self);
                       });
}

void Domains::released(DomId domid) {
  auto it = doms_.find(domid);
  if (it == doms_.end()) return;
  auto a = it->second;
  asio::post(io_, [this, a] { drop(a); });
}

void Domains::drop(const std::shared_ptr<Attached>& a) {
  if (a->dropped) return;
  a->dropped = true;
  if (auto it = doms_.find(a->domid); it != doms_.end() && it->second == a) doms_.erase(it);
  if (a->ring) a->ring->close();  // before the page's mapping goes with the ForeignDomain
  if (a->death) {
    boost::system::error_code ignored;
    a->death->close(ignored);
  }
  if (a->foreign && a->port) {  // not already unbound by a re-introduce
    try {
      a->foreign->unbind(a->dom0_port);
    } catch (const std::exception&) {
      // The domain is gone: its end of the channel went with it.
    }
  }
  a->port.reset();
  a->foreign.reset();
  spdlog::info("xenstored: dom{} ring dropped", a->domid);
}

}  // namespace xpv::xenbus::daemon
