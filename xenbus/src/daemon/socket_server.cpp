// Unix-socket transport (see socket_server.h). Calling context: the daemon's io_context thread
// only; the Store is touched from completion handlers on that thread.
#include "xpv/xenbus/daemon/socket_server.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <deque>
#include <filesystem>
#include <stdexcept>
#include <unordered_map>

#include "xpv/log_rate_limit.h"
#include "xpv/xenbus/daemon/connection.h"

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

class SocketServer::Conn : public Connection, public std::enable_shared_from_this<Conn> {
 public:
  Conn(stream::socket s, Store& store, std::shared_ptr<State> st)
      : sock_(std::move(s)), store_(store), st_(std::move(st)) {}

  void start() {
    id_ = store_.connect(0, *this);
    read_header();
  }

  DomId domid() const noexcept override { return 0; }

  void deliver(const wire::Header& h, std::string_view payload) override {
    if (closed_) return;
    bool reply = h.type != static_cast<std::uint32_t>(wire::MsgType::watch_event);
    if (!reply && out_.size() >= store_.quotas().pending_events) {
      ++st_->dropped_events;
      if (st_->log_limit.allow())
        spdlog::warn("xenstored: socket client {}: watch event queue full, event dropped", id_);
      return;
    }
    out_.push_back(Out{wire::encode(h, payload), reply});
    if (reply) ++replies_queued_;
    if (!writing_) write_next();
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

  void read_header() {
    auto self = shared_from_this();
    asio::async_read(sock_, asio::buffer(hdr_buf_),
                     [this, self](boost::system::error_code ec, std::size_t) {
                       if (ec || closed_) return close();
                       hdr_ = wire::decode_header(hdr_buf_);
                       if (!wire::check_header(hdr_)) {
                         ++st_->protocol_errors;
                         if (st_->log_limit.allow())
                           spdlog::warn("xenstored: socket client {}: payload length {} > {}, "
                                        "closing", id_, hdr_.len, wire::kPayloadMax);
                         return close();
                       }
                       payload_.resize(hdr_.len);
                       if (hdr_.len == 0) return process();
                       read_payload();
                     });
  }

  void read_payload() {
    auto self = shared_from_this();
    asio::async_read(sock_, asio::buffer(payload_),
                     [this, self](boost::system::error_code ec, std::size_t) {
                       if (ec || closed_) return close();
                       process();
                     });
  }

  void process() {
    ++st_->messages;
    store_.handle(id_, hdr_, std::string_view(payload_.data(), payload_.size()));
    if (closed_) return;
    if (replies_queued_ >= store_.quotas().outstanding) {
      paused_ = true;  // resumed by write_next once the peer reads its replies
      return;
    }
    read_header();
  }

  void write_next() {
    if (out_.empty() || closed_) {
      writing_ = false;
      return;
    }
    writing_ = true;
    auto self = shared_from_this();
    asio::async_write(sock_, asio::buffer(out_.front().bytes),
                      [this, self](boost::system::error_code ec, std::size_t) {
                        if (ec || closed_) return close();
                        if (out_.front().reply) --replies_queued_;
                        out_.pop_front();
                        if (paused_ && replies_queued_ < store_.quotas().outstanding) {
                          paused_ = false;
                          read_header();
                        }
                        write_next();
                      });
  }

  stream::socket sock_;
  Store& store_;
  std::shared_ptr<State> st_;
  ConnId id_ = 0;
  std::array<std::uint8_t, wire::kHeaderSize> hdr_buf_{};
  wire::Header hdr_{};
  std::vector<char> payload_;
  std::deque<Out> out_;
  std::size_t replies_queued_ = 0;
  bool writing_ = false;
  bool paused_ = false;
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
    : io_(io), store_(store), path_(std::move(path)), acceptor_(io),
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

SocketServer::~SocketServer() {
  boost::system::error_code ec;
  acceptor_.close(ec);
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
    } else if (st->log_limit.allow()) {
      spdlog::warn("xenstored: accept on {}: {}", path_, ec.message());
    }
    accept();
  });
}

std::size_t SocketServer::connection_count() const noexcept { return state_->conns.size(); }
std::uint64_t SocketServer::messages() const noexcept { return state_->messages; }
std::uint64_t SocketServer::protocol_errors() const noexcept { return state_->protocol_errors; }

}  // namespace xpv::xenbus::daemon
