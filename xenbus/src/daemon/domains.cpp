// xpv-xenstored's attachment of real domains (see domains.h). io_context thread only.
#include "xpv/xenbus/daemon/domains.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <cerrno>
#include <exception>

#include "xpv/domain/foreign_domain.h"
#include "xpv/xenbus/daemon/ring_connection.h"

namespace xpv::xenbus::daemon {

namespace asio = boost::asio;

struct Domains::Attached {
  DomId domid = 0;
  std::unique_ptr<domain::ForeignDomain> foreign;  // memory mapping + control socket
  std::shared_ptr<domain::Dom0Port> port;          // the xenstore event channel, dom0's end
  std::uint32_t dom0_port = 0;
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
  auto a = std::make_shared<Attached>();
  a->domid = domid;
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
  // start() registers the connection with the Store and serves requests already on the ring:
  // not from inside this Store call.
  asio::post(io_, [a, mfn] {
    if (a->dropped) return;
    a->ring->start();
    spdlog::info("xenstored: dom{} attached (ring gfn {:#x}, port {})", a->domid, mfn, a->dom0_port);
  });
  return {};
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
