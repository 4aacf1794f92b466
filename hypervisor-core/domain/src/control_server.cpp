#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <variant>

#include "xpv/domain/control.h"
#include "xpv/domain/seqpacket.h"

namespace xpv::domain {

namespace asio = boost::asio;
using namespace control;

struct ControlServer::Connection {
  explicit Connection(asio::io_context& io, UniqueFd fd)
      : sock(io, fd.release()) {}
  asio::posix::stream_descriptor sock;
  bool said_hello = false;
  std::string client = "?";
  std::set<std::uint32_t> bound;  // dom0-side ports this connection holds
};

ControlServer::ControlServer(asio::io_context& io, std::string path, ControlHandler& handler)
    : io_(io), path_(std::move(path)), handler_(handler), listener_(io), accept_retry_(io) {
  ::unlink(path_.c_str());  // a stale socket of a previous run of this domain id
  listener_.assign(listen_seqpacket(path_).release());
  accept_next();
}

ControlServer::~ControlServer() {
  for (const auto& c : std::set(conns_)) close(c);
  boost::system::error_code ignored;
  accept_retry_.cancel();
  listener_.close(ignored);
  ::unlink(path_.c_str());
}

void ControlServer::accept_next() {
  listener_.async_wait(asio::posix::stream_descriptor::wait_read, [this](boost::system::error_code ec) {
    if (ec) return;  // listener closed: the server is going away
    UniqueFd fd(::accept4(listener_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    const int err = errno;
    if (fd) {
      // Root-only: the socket file is 0600, and the peer's uid is checked too (a file mode can be
      // changed by mistake; SO_PEERCRED cannot).
      auto uid = peer_uid(fd.get());
      if (!uid || (*uid != 0 && *uid != ::geteuid())) {
        spdlog::warn("{}: refused a client with uid {}", path_, uid ? static_cast<int>(*uid) : -1);
      } else {
        auto c = std::make_shared<Connection>(io_, std::move(fd));
        conns_.insert(c);
        read_next(c);
      }
    } else if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
      // The connection stays in the backlog and the listener readable: waiting for it again at
      // once would spin (and log) as fast as the thread runs. Try again a little later.
      spdlog::error("{}: accept: {}; trying again in {} ms", path_, std::strerror(err), kAcceptRetryMs);
      accept_retry_.expires_after(std::chrono::milliseconds(kAcceptRetryMs));
      accept_retry_.async_wait([this, alive = std::weak_ptr<int>(alive_)](boost::system::error_code e) {
        if (!e && !alive.expired()) accept_next();  // else the server is going away
      });
      return;
    } else if (err != EAGAIN && err != EINTR && err != ECONNABORTED) {
      spdlog::error("{}: accept: {}", path_, std::strerror(err));
    }
    accept_next();
  });
}

void ControlServer::read_next(const std::shared_ptr<Connection>& c) {
  c->sock.async_wait(asio::posix::stream_descriptor::wait_read,
                     [this, c](boost::system::error_code ec) {
                       if (ec) return;  // closed by close()
                       bool ok = false;
                       try {
                         ok = serve_one(*c);
                       } catch (const std::exception& e) {
                         // A handler that failed outside its error returns (no memory, no
                         // descriptors): that client's connection ends, its ports released;
                         // the domain and the other clients go on.
                         try {
                           spdlog::error("{}: {}: {}; closing the connection", path_, c->client, e.what());
                         } catch (...) {
                         }
                       } catch (...) {
                       }
                       if (!ok) {
                         close(c);
                         return;
                       }
                       read_next(c);
                     });
}

void ControlServer::close(const std::shared_ptr<Connection>& c) {
  for (std::uint32_t port : c->bound) {
    if (auto r = handler_.release(port); !r) {
      spdlog::warn("{}: {} went away; unbinding port {} failed: {}", path_, c->client, port,
                   std::strerror(r.error()));
    }
  }
  c->bound.clear();
  boost::system::error_code ignored;
  c->sock.cancel(ignored);
  c->sock.close(ignored);
  conns_.erase(c);
}

namespace {

bool reply(int sock, std::uint16_t type, std::uint32_t seq, std::span<const std::uint8_t> payload,
           std::span<const int> fds = {}) {
  auto msg = encode(type, seq, payload);
  return static_cast<bool>(send_datagram(sock, msg, fds));
}

bool reply_error(int sock, std::uint32_t seq, int error, const std::string& text) {
  ErrorPayload e{};
  e.error = error;
  copy_string(e.message, text);
  return reply(sock, kErrorType, seq, bytes_of(e));
}

}  // namespace

bool ControlServer::serve_one(Connection& c) {
  const int fd = c.sock.native_handle();
  auto d = recv_datagram(fd, kMaxMessage, 0);
  if (!d) {
    if (d.error().value() == EAGAIN) return true;  // spurious wakeup
    spdlog::warn("{}: {}: receive failed: {}", path_, c.client, d.error().message());
    return false;
  }
  if (d->bytes.empty()) return false;  // orderly close
  auto m = parse(d->bytes);
  if (!m) {
    spdlog::warn("{}: {}: {}; closing the connection", path_, c.client, to_string(m.error()));
    return false;
  }
  if ((m->header.type & kResponseBit) != 0) {
    spdlog::warn("{}: {}: a client sent a response; closing the connection", path_, c.client);
    return false;
  }
  auto rq = decode_request(*m);
  if (!rq) {
    spdlog::warn("{}: {}: {} in a request of type {}; closing the connection", path_, c.client,
                 to_string(rq.error()), m->header.type);
    return false;
  }
  const std::uint32_t seq = rq->seq;
  const MsgType type = rq->type;
  const std::uint16_t rsp = m->header.type | kResponseBit;

  if (type == MsgType::hello) {
    const auto& req = std::get<HelloRequest>(rq->body);
    if (req.client_domid != 0) {
      return reply_error(fd, seq, EPERM, "only dom0 services may use the control socket");
    }
    c.said_hello = true;
    c.client = req.client_name;
    DomainInfo info = handler_.info();
    HelloResponse r{};
    r.domid = info.domid;
    r.nr_vcpus = info.nr_vcpus;
    r.kind = static_cast<std::uint32_t>(info.kind);
    copy_string(r.name, info.name);
    spdlog::debug("{}: hello from {}", path_, c.client);
    return reply(fd, rsp, seq, bytes_of(r));
  }
  if (!c.said_hello) return reply_error(fd, seq, EPROTO, "hello must come first");

  switch (type) {
    case MsgType::hello: break;  // handled above
    case MsgType::get_memory: {
      const DomainMemory& mem = handler_.memory();
      std::vector<RegionWire> regions;
      for (const MemoryRegion& r : mem.layout()) regions.push_back({r.gpa, r.size, r.offset});
      const int mfd = mem.fd();
      return reply(fd, rsp, seq, encode_memory(regions), std::span<const int>(&mfd, 1));
    }
    case MsgType::get_grant_table: {
      GrantTableInfo g = handler_.grant_table();
      return reply(fd, rsp, seq, encode_grant_table(g.max_frames, g.gfns));
    }
    case MsgType::bind_interdomain: {
      const auto& req = std::get<BindRequest>(rq->body);
      auto b = handler_.bind_interdomain(req.remote_port);
      if (!b) {
        return reply_error(fd, seq, b.error(),
                           "cannot bind port " + std::to_string(req.remote_port) + ": " +
                               std::strerror(b.error()));
      }
      try {
        c.bound.insert(b->port);
      } catch (...) {
        (void)handler_.release(b->port);  // not recorded, so not kept
        throw;
      }
      BindResponse r{b->port, 0};
      const int fds[2] = {b->to_dom0.get(), b->from_dom0.get()};
      spdlog::debug("{}: {} bound guest port {} as dom0 port {}", path_, c.client, req.remote_port,
                    b->port);
      return reply(fd, rsp, seq, bytes_of(r), fds);
    }
    case MsgType::unbind: {
      const auto& req = std::get<UnbindRequest>(rq->body);
      if (c.bound.count(req.port) == 0) {
        return reply_error(fd, seq, ENOENT, "port " + std::to_string(req.port) +
                                                " is not bound by this connection");
      }
      c.bound.erase(req.port);
      if (auto r = handler_.unbind(req.port); !r) {
        return reply_error(fd, seq, r.error(), std::strerror(r.error()));
      }
      return reply(fd, rsp, seq, {});
    }
    case MsgType::get_xenstore: {
      auto x = handler_.xenstore();
      if (!x) return reply_error(fd, seq, x.error(), "no xenstore ring");
      XenstoreResponse r{x->gfn, x->port, 0};
      return reply(fd, rsp, seq, bytes_of(r));
    }
    case MsgType::unpause: {
      if (auto r = handler_.unpause(); !r) return reply_error(fd, seq, r.error(), std::strerror(r.error()));
      return reply(fd, rsp, seq, {});
    }
    case MsgType::pause: {
      if (auto r = handler_.pause(); !r) return reply_error(fd, seq, r.error(), std::strerror(r.error()));
      return reply(fd, rsp, seq, {});
    }
    case MsgType::get_vcpu_threads: {
      auto tids = handler_.vcpu_threads();
      if (!tids) return reply_error(fd, seq, tids.error(), std::strerror(tids.error()));
      if (tids->empty() || tids->size() > kMaxVcpuThreads) {
        return reply_error(fd, seq, EIO, "the domain has " + std::to_string(tids->size()) + " vCPU threads");
      }
      return reply(fd, rsp, seq, encode_vcpu_threads(*tids));
    }
    case MsgType::set_vcpu_affinity: {
      const auto& req = std::get<VcpuAffinityRequest>(rq->body);
      ControlHandler::CpuMask mask{};
      std::copy(std::begin(req.cpus), std::end(req.cpus), mask.begin());
      if (auto r = handler_.set_vcpu_affinity(req.vcpu, mask); !r) {
        return reply_error(fd, seq, r.error(), std::strerror(r.error()));
      }
      return reply(fd, rsp, seq, {});
    }
    case MsgType::get_direct_upcall: {
      const auto& req = std::get<DirectUpcallRequest>(rq->body);
      auto du = handler_.direct_upcall(req.vcpu);
      if (!du) {
        return reply_error(fd, seq, du.error(), "no direct upcalls for vCPU " + std::to_string(req.vcpu) + ": " +
                                                   std::strerror(du.error()));
      }
      DirectUpcallResponse r{du->nr_vcpus, 0};
      const int fds[2] = {du->table, du->vcpu};
      return reply(fd, rsp, seq, bytes_of(r), fds);
    }
  }
  return false;
}

}  // namespace xpv::domain
