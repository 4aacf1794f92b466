// The unix-socket transport: the socket libxenstore opens (XENSTORED_PATH, default
// /run/xenstored/socket). Every client is dom0 and privileged, like Xen's socket clients.
// Many concurrent clients; one io_context thread serves them all (the Store has no lock).
//
// Per connection: read what the socket has (non-blocking, on readiness), frame it, reject
// len > 4096 by closing the connection (Xen does the same), hand each message to the Store,
// queue and write the reply. While the connection has
// `Quotas::outstanding` or more replies not yet written, it stops reading (backpressure);
// watch events beyond `Quotas::pending_events` queued messages are dropped (logged, rate-limited).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "xpv/xenbus/store.h"

namespace xpv::xenbus::daemon {

class SocketServer {
 public:
  // Binds and listens on `path` (creating its directory; a stale socket file nobody listens on
  // is replaced; a live one is an error). Throws std::runtime_error naming the path.
  SocketServer(boost::asio::io_context& io, Store& store, std::string path);
  // Live update: a SocketServer over the listening socket and the client connections of a
  // saved state (their fds inherited across the exec), each with its unhandled input and unsent
  // output; the Store must already hold the connections (Store::restore). Throws
  // std::runtime_error naming a saved fd that is not a socket.
  SocketServer(boost::asio::io_context& io, Store& store, std::string path, const nlohmann::json& saved);
  // Closes every connection and removes the socket file.
  ~SocketServer();
  // Live update: the listening socket's fd and every connection's fd, id, unhandled input and
  // unsent output. Only between handlers on the io thread. fds(): what must survive the exec.
  nlohmann::json save() const;
  std::vector<int> fds();
  SocketServer(const SocketServer&) = delete;
  SocketServer& operator=(const SocketServer&) = delete;

  const std::string& path() const noexcept { return path_; }
  std::size_t connection_count() const noexcept;
  // Counters for logs / xpv top.
  std::uint64_t messages() const noexcept;
  std::uint64_t protocol_errors() const noexcept;

  class Conn;
  struct State;

 private:
  void accept();

  boost::asio::io_context& io_;
  Store& store_;
  std::string path_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  // After a failed accept (EMFILE, ENFILE, ENOMEM: the socket stays readable), the next one waits
  // for this rather than spinning on the same error.
  boost::asio::steady_timer accept_retry_;
  std::shared_ptr<State> state_;
};

}  // namespace xpv::xenbus::daemon
