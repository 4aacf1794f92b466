// Blocking wrapper (see sync_client.h). The caller's thread waits on a future; the async client
// lives on the internal io thread.
#include "xpv/xenbus/client/sync_client.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <cstdio>
#include <future>
#include <stdexcept>

#include "xpv/thread_name.h"

namespace xpv::xenbus::client {

namespace asio = boost::asio;
using wire::Error;

SyncClient::SyncClient(const std::string& socket_path, std::chrono::milliseconds timeout)
    : io_(std::make_unique<asio::io_context>(1)), timeout_(timeout) {
  client_ = Client::create(*io_);
  thread_ = std::thread([io = io_.get()] {
    set_thread_name("xs-client");
    auto guard = asio::make_work_guard(*io);
    try {
      io->run();
    } catch (const std::exception& e) {
      // A handler threw (a user callback): stop serving; pending calls time out with EIO.
      std::fprintf(stderr, "xenstore SyncClient: io thread stopped: %s\n", e.what());
    }
  });
  auto r = call<void>([this, socket_path](Done d) { client_->connect(socket_path, std::move(d)); });
  if (!r) {
    io_->stop();
    thread_.join();
    throw std::runtime_error("cannot connect to xenstored at " + socket_path);
  }
}

void SyncClient::on_lost(std::function<void()> cb) {
  asio::post(*io_, [c = client_, cb = std::move(cb)]() mutable { c->on_broken(std::move(cb)); });
}

SyncClient::~SyncClient() {
  asio::post(*io_, [c = client_] { c->close(); });
  io_->stop();
  thread_.join();
}

template <class T, class Start>
Result<T> SyncClient::call(Start start) {
  auto promise = std::make_shared<std::promise<Result<T>>>();
  auto future = promise->get_future();
  asio::post(*io_, [start = std::move(start), promise]() mutable {
    start([promise](Result<T> r) { promise->set_value(std::move(r)); });
  });
  if (future.wait_for(timeout_) != std::future_status::ready) return fail(Error::eio);
  return future.get();
}

Result<std::string> SyncClient::control(const std::vector<std::string>& args) {
  std::string payload;
  for (const auto& a : args) payload += a + std::string(1, '\0');
  auto r = call<std::string>([this, payload](ValueHandler h) {
    client_->request(wire::MsgType::control, payload, kNoTx, std::move(h));
  });
  if (r && !r->empty() && r->back() == '\0') r->pop_back();
  return r;
}

Result<std::string> SyncClient::read(const std::string& path, TxId tx) {
  return call<std::string>([this, tx, path](ValueHandler h) { client_->read(path, std::move(h), tx); });
}
Result<void> SyncClient::write(const std::string& path, std::string_view value, TxId tx) {
  return call<void>([this, tx, path, v = std::string(value)](Done h) {
    client_->write(path, v, std::move(h), tx);
  });
}
Result<void> SyncClient::mkdir(const std::string& path, TxId tx) {
  return call<void>([this, tx, path](Done h) { client_->mkdir(path, std::move(h), tx); });
}
Result<void> SyncClient::rm(const std::string& path, TxId tx) {
  return call<void>([this, tx, path](Done h) { client_->rm(path, std::move(h), tx); });
}
Result<std::vector<std::string>> SyncClient::directory(const std::string& path, TxId tx) {
  return call<std::vector<std::string>>(
      [this, tx, path](ListHandler h) { client_->directory(path, std::move(h), tx); });
}
Result<PermList> SyncClient::get_perms(const std::string& path, TxId tx) {
  return call<PermList>([this, tx, path](PermsHandler h) { client_->get_perms(path, std::move(h), tx); });
}
Result<void> SyncClient::set_perms(const std::string& path, const PermList& perms, TxId tx) {
  return call<void>(
      [this, tx, path, perms](Done h) { client_->set_perms(path, perms, std::move(h), tx); });
}
Result<void> SyncClient::watch(const std::string& path, const std::string& token,
                               WatchCallback cb) {
  return call<void>([this, path, token, cb = std::move(cb)](Done h) mutable {
    client_->watch(path, token, std::move(cb), std::move(h));
  });
}
Result<void> SyncClient::unwatch(const std::string& path, const std::string& token) {
  return call<void>([this, path, token](Done h) { client_->unwatch(path, token, std::move(h)); });
}
Result<TxId> SyncClient::transaction_start() {
  return call<TxId>([this](std::function<void(Result<TxId>)> h) {
    client_->transaction_start(std::move(h));
  });
}
Result<void> SyncClient::transaction_end(TxId tx, bool commit) {
  return call<void>([this, tx, commit](Done h) { client_->transaction_end(tx, commit, std::move(h)); });
}

Result<void> SyncClient::transaction(const std::function<Result<void>(TxId)>& body,
                                     int max_retries) {
  for (int attempt = 0;; ++attempt) {
    auto tx = transaction_start();
    if (!tx) return fail(tx.error());
    auto r = body(*tx);
    if (!r) {
      (void)transaction_end(*tx, false);
      // EAGAIN inside the body (a transaction xenstored ended under it, e.g. `live-update -F`)
      // is a conflict like one at commit: start again.
      if (r.error() == Error::eagain && attempt < max_retries) {
        ++retries_;
        continue;
      }
      return r;
    }
    auto e = transaction_end(*tx, true);
    if (e || e.error() != Error::eagain || attempt >= max_retries) return e;
    ++retries_;
  }
}

bool xenstored_answers(const std::string& socket_path, std::chrono::milliseconds timeout) noexcept {
  try {
    SyncClient probe(socket_path, timeout);
    auto r = probe.read("/");
    return r || r.error() != wire::Error::eio;  // EIO: no answer in time, or the connection went
  } catch (const std::exception&) {
    return false;  // not there, or out of memory or threads: not known to answer
  }
}

}  // namespace xpv::xenbus::client
