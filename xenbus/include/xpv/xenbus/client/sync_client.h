// Blocking wrapper over client::Client for tests and simple tools: owns an io_context on its
// own thread; each call posts the async operation there and waits for its result (bounded by
// `timeout`, EIO on expiry). Watch callbacks run on that internal thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "xpv/xenbus/client/client.h"

namespace xpv::xenbus::client {

class SyncClient {
 public:
  // Connects; throws std::runtime_error if the daemon is not there.
  explicit SyncClient(const std::string& socket_path,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~SyncClient();
  SyncClient(const SyncClient&) = delete;
  SyncClient& operator=(const SyncClient&) = delete;

  Result<std::string> read(const std::string& path, TxId tx = kNoTx);
  Result<void> write(const std::string& path, std::string_view value, TxId tx = kNoTx);
  Result<void> mkdir(const std::string& path, TxId tx = kNoTx);
  Result<void> rm(const std::string& path, TxId tx = kNoTx);
  Result<std::vector<std::string>> directory(const std::string& path, TxId tx = kNoTx);
  Result<PermList> get_perms(const std::string& path, TxId tx = kNoTx);
  Result<void> set_perms(const std::string& path, const PermList& perms, TxId tx = kNoTx);
  Result<void> watch(const std::string& path, const std::string& token, WatchCallback cb);
  Result<void> unwatch(const std::string& path, const std::string& token);
  Result<TxId> transaction_start();
  Result<void> transaction_end(TxId tx, bool commit);
  // Runs body(tx) in a transaction, retrying on EAGAIN (at most max_retries times). The body
  // runs on the calling thread and uses the calls above with `tx`; an error from it aborts.
  Result<void> transaction(const std::function<Result<void>(TxId)>& body, int max_retries = 8);

  // CONTROL with its arguments (NUL-separated on the wire, as xenstore-control sends them): the
  // reply text without its NUL.
  Result<std::string> control(const std::vector<std::string>& args);
  std::uint64_t retries() const noexcept { return retries_; }
  // `cb` runs once, on the client's own thread, when the connection to xenstored breaks (at once
  // if it already has); not when this SyncClient goes. A call that merely times out is not a
  // break: its EIO is the caller's to judge.
  void on_lost(std::function<void()> cb);

 private:
  template <class T, class Start>
  Result<T> call(Start start);

  std::unique_ptr<boost::asio::io_context> io_;
  std::shared_ptr<Client> client_;
  std::thread thread_;
  std::chrono::milliseconds timeout_;
  std::uint64_t retries_ = 0;
};

// Does an xenstored answer at `socket_path` now? A fresh connection and one read, each bounded by
// `timeout`: any answer (the node's value or an error reply such as ENOENT) is yes; no daemon, a
// refused connection or no answer within the bound is no. For a daemon whose own connection was
// lost, to learn when a new one would work (xpv-blkback, xpv-netback).
bool xenstored_answers(const std::string& socket_path, std::chrono::milliseconds timeout) noexcept;

}  // namespace xpv::xenbus::client
