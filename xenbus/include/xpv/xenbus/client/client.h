// Async xenstore client for xpv's own daemons (Boost.Asio, unix socket).
//
//   auto c = xpv::xenbus::client::Client::create(io);
//   c->connect("/run/xenstored/socket", [](Result<void> r) { ... });
//   c->write("/local/domain/1/device/vif/0/state", "4", [](Result<void> r) { ... });
//   c->watch("/local/domain/1/device", "tok", [](std::string path, std::string token) { ... },
//            [](Result<void>) {});
//   c->transaction([c](TxId tx, Finish finish) {
//       c->read("/a", [=](Result<std::string> v) { ... c->write("/b", ..., finish, tx); }, tx);
//     }, [](Result<void> r) { ... });          // retried on EAGAIN up to max_retries
//
// Requests are pipelined and matched to replies by req_id. Every handler runs on the io_context
// thread that runs `io`. Failures are wire::Error values: the daemon's error name, or EIO when
// the connection broke (every pending handler then gets EIO). Watch callbacks are keyed by
// token; events for tokens nobody registered are ignored.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "xpv/expected.h"
#include "xpv/xenbus/perms.h"
#include "xpv/xenbus/wire.h"

namespace xpv::xenbus::client {

template <class T>
using Result = Expected<T, wire::Error>;
using TxId = std::uint32_t;
inline constexpr TxId kNoTx = 0;

using Done = std::function<void(Result<void>)>;
using ValueHandler = std::function<void(Result<std::string>)>;
using ListHandler = std::function<void(Result<std::vector<std::string>>)>;
using PermsHandler = std::function<void(Result<PermList>)>;
using WatchCallback = std::function<void(const std::string& path, const std::string& token)>;
using Finish = std::function<void(Result<void>)>;
// A transaction body: do the work with `tx`, then call finish({}) to commit or
// finish(fail(e)) to abort with e.
using TxBody = std::function<void(TxId tx, Finish finish)>;

class Client : public std::enable_shared_from_this<Client> {
 public:
  static std::shared_ptr<Client> create(boost::asio::io_context& io);
  ~Client();

  void connect(const std::string& socket_path, Done done);
  void close();
  bool connected() const noexcept { return connected_; }
  // `cb` runs once, on the io thread, when the connection breaks (the daemon closed it, went
  // away, or sent garbage) — at once if it already has; not for close(). Pending requests get
  // EIO first.
  void on_broken(std::function<void()> cb);

  void read(const std::string& path, ValueHandler h, TxId tx = kNoTx);
  void write(const std::string& path, std::string_view value, Done h, TxId tx = kNoTx);
  void mkdir(const std::string& path, Done h, TxId tx = kNoTx);
  void rm(const std::string& path, Done h, TxId tx = kNoTx);
  void directory(const std::string& path, ListHandler h, TxId tx = kNoTx);
  void get_perms(const std::string& path, PermsHandler h, TxId tx = kNoTx);
  void set_perms(const std::string& path, const PermList& perms, Done h, TxId tx = kNoTx);
  void watch(const std::string& path, const std::string& token, WatchCallback cb, Done h);
  void unwatch(const std::string& path, const std::string& token, Done h);
  void transaction_start(std::function<void(Result<TxId>)> h);
  void transaction_end(TxId tx, bool commit, Done h);
  // Runs body in a transaction; on EAGAIN at commit starts over, at most max_retries times.
  void transaction(TxBody body, Done done, int max_retries = 8);

  // Raw request: the reply payload or the error name's wire::Error.
  void request(wire::MsgType type, std::string payload, TxId tx, ValueHandler h);

  std::uint64_t retries() const noexcept { return retries_; }

 private:
  explicit Client(boost::asio::io_context& io);
  void read_header();
  // A read or write ended with `ec` (or the daemon sent garbage: no ec): close(); then, unless
  // the connection was closed already (our own close(), or the other direction's error),
  // on_broken_ (once).
  void broke(boost::system::error_code ec);
  void write_next();
  void fail_all(wire::Error e);
  void run_transaction(std::shared_ptr<TxBody> body, Done done, int left);

  boost::asio::io_context& io_;
  boost::asio::local::stream_protocol::socket sock_;
  bool connected_ = false;
  bool broken_ = false;
  std::function<void()> on_broken_;
  std::uint32_t next_req_ = 1;
  std::map<std::uint32_t, ValueHandler> pending_;
  std::map<std::string, WatchCallback> watches_;  // by token
  std::deque<std::string> out_;
  bool writing_ = false;
  std::array<std::uint8_t, wire::kHeaderSize> hdr_buf_{};
  std::vector<char> payload_;
  std::uint64_t retries_ = 0;
};

}  // namespace xpv::xenbus::client
