// The unix-socket transport: the socket libxenstore opens (XENSTORED_PATH, default
// /run/xenstored/socket). Every client is dom0 and privileged, like Xen's socket clients.
// Many concurrent clients; one io_context thread serves them all (the Store has no lock).
//
// Per connection: read a 16-byte header, reject len > 4096 by closing the connection (Xen does
// the same), read the payload, hand it to the Store, queue the reply. While the connection has
// `Quotas::outstanding` or more replies not yet written, it stops reading (backpressure);
// watch events beyond `Quotas::pending_events` queued messages are dropped (logged, rate-limited).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <memory>
#include <string>

#include "xpv/xenbus/store.h"

namespace xpv::xenbus::daemon {

class SocketServer {
 public:
  // Binds and listens on `path` (creating its directory; a stale socket file nobody listens on
  // is replaced; a live one is an error). Throws std::runtime_error naming the path.
  SocketServer(boost::asio::io_context& io, Store& store, std::string path);
  // Closes every connection and removes the socket file.
  ~SocketServer();
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
  std::shared_ptr<State> state_;
};

}  // namespace xpv::xenbus::daemon
