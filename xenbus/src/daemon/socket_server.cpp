// Unix-socket transport (see socket_server.h). Calling context: the daemon's io_context thread
// only; the Store is touched from completion handlers on that thread.
#include "xpv/xenbus/daemon/socket_server.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <boost/asio/post.hpp>
#include <deque>
#include <filesystem>
#include <stdexcept>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "xpv/log_rate_limit.h"
#include "xpv/xenbus/daemon/connection.h"
#include "xpv/xenbus/hex.h"

namespace xpv::xenbus::daemon {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;

struct SocketServer::State {
  std::unordered_map<Conn*, std::shared_ptr<Conn>> conns;
  std::uint64_t messages = 0;
  std::uint64_t protocol_errors = 0;
  std::uint64_t dropped_events = 0;
  xpv::LogRateLimit log_limit{10};
};

// One client. Readiness-driven: the socket is waited on (async_wait) and read and written with
// non-blocking calls, so that every byte taken from the socket and not yet handled is in this
// object (framer_, pending_) and every byte not yet written is in out_ — what a live update
// saves (save()) and the next binary picks up (the adopting constructor).
class SocketServer::Conn : public Connection, public std::enable_shared_from_this<Conn> {
 public:
  Conn(stream::socket s, Store& store, std::shared_ptr<State> st)
      : sock_(std::move(s)), store_(store), st_(std::move(st)) {}

  void start() {
    id_ = store_.connect(0, *this);
    wait_readable();
  }

  // A connection from a saved state: the Store already has it (restore()).
  void adopt(const nlohmann::json& saved) {
    id_ = saved.at("id").get<ConnId>();
    store_.attach_sink(id_, *this);
    pending_ = unhex(saved.at("in").get<std::string>());
    for (const auto& o : saved.at("out")) {
      out_.push_back(Out{unhex(o.at("bytes").get<std::string>()), o.at("reply").get<bool>()});
      if (out_.back().reply) ++replies_queued_;
    }
    out_off_ = saved.at("out_off").get<std::size_t>();
    if (!out_.empty() && out_off_ >= out_.front().bytes.size()) throw std::runtime_error("bad out_off");
    auto self = shared_from_this();
    // Not from inside whatever called adopt(): the first drain may hand requests to the Store.
    asio::post(sock_.get_executor(), [this, self] {
      flush();
      drain();
    });
  }

  nlohmann::json save() const {
    std::string in(reinterpret_cast<const char*>(framer_.partial().data()), framer_.partial().size());
    in += pending_;
    nlohmann::json out = nlohmann::json::array();
    for (const auto& o : out_) out.push_back({{"bytes", hex(o.bytes)}, {"reply", o.reply}});
    return {{"fd", const_cast<stream::socket&>(sock_).native_handle()}, {"id", id_}, {"in", hex(in)}, {"out", std::move(out)},
            {"out_off", out_off_}};
  }
  int fd() noexcept { return sock_.native_handle(); }

  DomId domid() const noexcept override { return 0; }

  void deliver(const wire::Header& h, std::string_view payload) override {
    if (closed_ || broken_) return;
    bool reply = h.type != static_cast<std::uint32_t>(wire::MsgType::watch_event);
    if (!reply && out_.size() >= store_.quotas().pending_events) {
      ++st_->dropped_events;
      if (st_->log_limit.allow())
        spdlog::warn("xenstored: socket client {}: watch event queue full, event dropped", id_);
      return;
    }
    out_.push_back(Out{wire::encode(h, payload), reply});
    if (reply) ++replies_queued_;
    flush();  // never calls the Store: this may run inside a request
  }

  void close() noexcept override {
    if (closed_) return;
    closed_ = true;
    auto self = shared_from_this();  // keep alive until this returns
    store_.disconnect(id_);
    boost::system::error_code ec;
    sock_.close(ec);
    st_->conns.erase(this);
  }

 private:
  struct Out {
    std::string bytes;
    bool reply;
  };

  void wait_readable() {
    if (reading_ || closed_ || broken_) return;
    reading_ = true;
    auto self = shared_from_this();
    sock_.async_wait(stream::socket::wait_read, [this, self](boost::system::error_code ec) {
      reading_ = false;
      if (ec || closed_) return close();
      std::array<char, 4096> buf;
      const ssize_t n = ::recv(sock_.native_handle(), buf.data(), buf.size(), MSG_DONTWAIT);
      if (n == 0) return close();  // the client went away
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return wait_readable();
        return close();
      }
      pending_.append(buf.data(), static_cast<std::size_t>(n));
      drain();
    });
  }

  // Hands every complete message in pending_ to the Store, until backpressure says stop; then
  // waits for more bytes unless paused.
  void drain() {
    while (!closed_ && !broken_ && replies_queued_ < store_.quotas().outstanding && !pending_.empty()) {
      const std::size_t used = framer_.feed(std::span<const std::uint8_t>(
          reinterpret_cast<const std::uint8_t*>(pending_.data()), pending_.size()));
      pending_.erase(0, used);
      if (framer_.violated()) {
        ++st_->protocol_errors;
        if (st_->log_limit.allow()) {
          spdlog::warn("xenstored: socket client {}: payload length {} > {}, closing", id_,
                       framer_.header().len, wire::kPayloadMax);
        }
        return close();
      }
      if (!framer_.ready()) break;
      ++st_->messages;
      store_.handle(id_, framer_.header(), framer_.payload());
      framer_.consume();
    }
    if (closed_ || broken_) return;
    // Over the quota of unanswered replies: stop reading (backpressure) until the client has
    // read enough of them (flush() resumes).
    if (replies_queued_ < store_.quotas().outstanding) wait_readable();
  }

  // Writes what the socket takes now; waits for writability for the rest. Never calls the Store
  // and never closes synchronously (a failed write is handled from a posted close).
  void flush() {
    while (!out_.empty() && !broken_ && !closed_) {
      const std::string& b = out_.front().bytes;
      const ssize_t n = ::send(sock_.native_handle(), b.data() + out_off_, b.size() - out_off_,
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return wait_writable();
        broken_ = true;
        auto self = shared_from_this();
        asio::post(sock_.get_executor(), [self] { self->close(); });
        return;
      }
      out_off_ += static_cast<std::size_t>(n);
      if (out_off_ < b.size()) continue;
      if (out_.front().reply) --replies_queued_;
      out_.pop_front();
      out_off_ = 0;
    }
  }

  void wait_writable() {
    if (writing_) return;
    writing_ = true;
    auto self = shared_from_this();
    sock_.async_wait(stream::socket::wait_write, [this, self](boost::system::error_code ec) {
      writing_ = false;
      if (ec || closed_) return close();
      const bool was_paused = replies_queued_ >= store_.quotas().outstanding;
      flush();
      if (was_paused && replies_queued_ < store_.quotas().outstanding) drain();  // resume reading
    });
  }

  stream::socket sock_;
  Store& store_;
  std::shared_ptr<State> st_;
  ConnId id_ = 0;
  wire::Framer framer_;
  std::string pending_;       // read from the socket, not yet given to the framer
  std::deque<Out> out_;
  std::size_t out_off_ = 0;   // bytes of out_.front() already written
  std::size_t replies_queued_ = 0;
  bool reading_ = false;
  bool writing_ = false;
  bool broken_ = false;  // a write failed: closing
  bool closed_ = false;
};

namespace {

// Replaces a stale socket file (nobody accepting); refuses to steal a live one.
void prepare_socket_path(asio::io_context& io, const std::string& path) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (p.has_parent_path() && !std::filesystem::exists(p.parent_path(), ec)) {
    std::filesystem::create_directories(p.parent_path(), ec);
    if (ec)
      throw std::runtime_error("cannot create directory " + p.parent_path().string() + ": " +
                               ec.message());
  }
  if (!std::filesystem::exists(std::filesystem::symlink_status(p, ec))) return;
  if (!std::filesystem::is_socket(std::filesystem::symlink_status(p, ec)))
    throw std::runtime_error(path + " exists and is not a socket");
  stream::socket probe(io);
  boost::system::error_code bec;
  probe.connect(stream::endpoint(path), bec);
  if (!bec) throw std::runtime_error("another xenstored is listening on " + path);
  std::filesystem::remove(p, ec);
}

}  // namespace

SocketServer::SocketServer(asio::io_context& io, Store& store, std::string path)
    : io_(io), store_(store), path_(std::move(path)), acceptor_(io), accept_retry_(io),
      state_(std::make_shared<State>()) {
  if (path_.size() >= sizeof(sockaddr_un::sun_path))
    throw std::runtime_error("socket path too long: " + path_);
  prepare_socket_path(io_, path_);
  boost::system::error_code ec;
  stream::endpoint ep(path_);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (ec) throw std::runtime_error("cannot bind " + path_ + ": " + ec.message());
  ::chmod(path_.c_str(), 0600);  // root-only like Xen's socket; socket clients are dom0
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error("cannot listen on " + path_ + ": " + ec.message());
  accept();
}

SocketServer::SocketServer(asio::io_context& io, Store& store, std::string path, const nlohmann::json& saved)
    : io_(io), store_(store), path_(std::move(path)), acceptor_(io), accept_retry_(io),
      state_(std::make_shared<State>()) {
  const int lfd = saved.at("listen_fd").get<int>();
  struct stat st {};
  if (::fstat(lfd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
    throw std::runtime_error(fmt::format("saved listening socket fd {} is not a socket", lfd));
  }
  boost::system::error_code ec;
  acceptor_.assign(stream(), lfd, ec);
  if (ec) throw std::runtime_error(fmt::format("cannot adopt listening socket fd {}: {}", lfd, ec.message()));
  ::fcntl(lfd, F_SETFD, FD_CLOEXEC);
  for (const auto& c : saved.at("conns")) {
    const int fd = c.at("fd").get<int>();
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
      throw std::runtime_error(fmt::format("saved client socket fd {} is not a socket", fd));
    }
    stream::socket sock(io_);
    sock.assign(stream(), fd, ec);
    if (ec) throw std::runtime_error(fmt::format("cannot adopt client socket fd {}: {}", fd, ec.message()));
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    auto conn = std::make_shared<Conn>(std::move(sock), store_, state_);
    state_->conns.emplace(conn.get(), conn);
    conn->adopt(c);
  }
  accept();
}

nlohmann::json SocketServer::save() const {
  nlohmann::json conns = nlohmann::json::array();
  for (const auto& [p, c] : state_->conns) conns.push_back(c->save());
  return {{"listen_fd", const_cast<stream::acceptor&>(acceptor_).native_handle()}, {"conns", std::move(conns)}};
}

std::vector<int> SocketServer::fds() {
  std::vector<int> out{acceptor_.native_handle()};
  for (const auto& [p, c] : state_->conns) out.push_back(c->fd());
  return out;
}

SocketServer::~SocketServer() {
  boost::system::error_code ec;
  acceptor_.close(ec);
  accept_retry_.cancel();
  auto conns = state_->conns;  // close() erases from the map
  for (auto& [p, c] : conns) c->close();
  ::unlink(path_.c_str());
}

void SocketServer::accept() {
  acceptor_.async_accept([this, st = state_](boost::system::error_code ec, stream::socket s) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      auto c = std::make_shared<Conn>(std::move(s), store_, st);
      st->conns.emplace(c.get(), c);
      c->start();
    } else {
      if (st->log_limit.allow()) spdlog::warn("xenstored: accept on {}: {}", path_, ec.message());
      // Out of descriptors or memory: the pending connection stays and the next accept would fail
      // at once, for ever, on the daemon's only thread. Look again a little later. (Any other
      // error, e.g. a client that gave up: at once.)
      const int e = ec.value();
      if (ec.category() != boost::system::system_category() ||
          (e != EMFILE && e != ENFILE && e != ENOBUFS && e != ENOMEM)) {
        accept();
        return;
      }
      accept_retry_.expires_after(std::chrono::milliseconds(100));
      accept_retry_.async_wait([this](boost::system::error_code wait_ec) {
        if (!wait_ec && acceptor_.is_open()) accept();
      });
      return;
    }
    accept();
  });
}

std::size_t SocketServer::connection_count() const noexcept { return state_->conns.size(); }
std::uint64_t SocketServer::messages() const noexcept { return state_->messages; }
std::uint64_t SocketServer::protocol_errors() const noexcept { return state_->protocol_errors; }

}  // namespace xpv::xenbus::daemon
