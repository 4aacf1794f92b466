// RingClient — the xenstore client of a domain's own xenbus (what a guest kernel's xenbus does):
// requests and replies over the domain's xenstore page (struct xenstore_domain_interface, two
// 1 KiB byte rings, io/xs_wire.h), notifications over its xenstore event channel.
//
// The client knows nothing of how the event channel is reached (this library depends on ring/
// only): the owner passes `notify` (a process domain: EventChannels::send(xenstore port)) and
// calls on_event() from the port's handler (GuestEvents::set_handler(port, ...)).
//
//   caller threads ──request──► out queue ─┐
//                                          ▼
//   io thread:  write req ring ─► notify   read rsp ring ─► reply?  → wake the waiting caller
//               (woken by on_event, a new request, or a 200 ms poll) └─► WATCH_EVENT → event queue
//   watch thread: runs watch callbacks and post()ed functions, in order, one at a time
//
// Calls are blocking and thread-safe; each waits at most the timeout (Options::timeout or the
// per-client set_timeout) and then returns EIO (logged with the request's type and path). A
// callback may call back into the client (it runs on the watch thread, not on the io thread).
// Replies that arrive after their caller gave up are dropped. If xenstored marks the page
// broken (`error` != 0) or an index is out of range, every pending and later call fails with
// EIO (sticky), as the ring is unusable.
//
// Before xenstored serves the ring (the toolstack introduces the domain after it started),
// requests simply wait on the ring; wait_connected() waits for the first reply, bounded.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "xpv/ring/xenstore.h"
#include "xpv/xenbus/client/client.h"
#include "xpv/xenbus/perms.h"
#include "xpv/xenbus/wire.h"

namespace xpv::xenbus::client {

class RingClient {
 public:
  struct Options {
    std::chrono::milliseconds timeout{10000};  // per call
    std::size_t max_queued_events = 4096;      // watch events not yet dispatched; beyond, dropped
  };
  struct Stats {
    std::uint64_t requests = 0, replies = 0, events = 0, dropped_events = 0, timeouts = 0,
                  notifications = 0;
    std::uint64_t pumps = 0;  // looks at the two rings by the io thread
  };

  // `page` is the domain's xenstore page (it must outlive the client); `notify` kicks xenstored
  // (called on the io thread). Starts the io and watch threads. Throws std::invalid_argument for
  // a page that is too small or misaligned.
  RingClient(std::span<std::uint8_t> page, std::function<void()> notify, Options options);
  explicit RingClient(std::span<std::uint8_t> page, std::function<void()> notify)
      : RingClient(page, std::move(notify), Options{}) {}
  // Stops both threads; calls still waiting return EIO. Do not destroy from a watch callback.
  ~RingClient();
  RingClient(const RingClient&) = delete;
  RingClient& operator=(const RingClient&) = delete;

  // The event channel's handler (any thread, e.g. GuestEvents' dispatcher): something moved.
  void on_event() noexcept;

  // Sends a probe (a READ of the relative path "domid") once and waits up to `timeout` for any
  // reply: EIO if none came, otherwise ok. Later calls return at once when connected.
  Result<void> wait_connected(std::chrono::milliseconds timeout);
  bool connected() const noexcept { return connected_.load(std::memory_order_acquire); }
  bool broken() const noexcept { return broken_.load(std::memory_order_acquire); }

  void set_timeout(std::chrono::milliseconds t) noexcept { timeout_ms_.store(t.count()); }

  Result<std::string> read(const std::string& path, TxId tx = kNoTx);
  Result<void> write(const std::string& path, std::string_view value, TxId tx = kNoTx);
  Result<void> mkdir(const std::string& path, TxId tx = kNoTx);
  Result<void> rm(const std::string& path, TxId tx = kNoTx);
  Result<std::vector<std::string>> directory(const std::string& path, TxId tx = kNoTx);
  Result<PermList> get_perms(const std::string& path, TxId tx = kNoTx);
  Result<void> set_perms(const std::string& path, const PermList& perms, TxId tx = kNoTx);
  // The callback is registered before WATCH is sent (the initial firing is not lost) and runs
  // on the watch thread.
  Result<void> watch(const std::string& path, const std::string& token, WatchCallback cb);
  // Once it returns, the token's callback is not running and will not run again (called from
  // that callback itself, it returns without waiting for it). So a caller must not unwatch while
  // holding a lock the callback takes, nor while the callback waits for the calling thread.
  Result<void> unwatch(const std::string& path, const std::string& token);
  Result<TxId> transaction_start();
  Result<void> transaction_end(TxId tx, bool commit);
  // body(tx) in a transaction; EAGAIN at commit starts over, at most max_retries times (then
  // EAGAIN). An error from the body aborts the transaction and is returned.
  Result<void> transaction(const std::function<Result<void>(TxId)>& body, int max_retries = 8);

  // Raw request: the reply payload, or the error.
  Result<std::string> request(wire::MsgType type, std::string payload, TxId tx = kNoTx);

  // Runs fn on the watch thread, after the callbacks already queued.
  void post(std::function<void()> fn);

  Stats stats() const;

 private:
  struct Pending {
    bool done = false;
    wire::Header header{};
    std::string payload;
  };

  void io_loop();
  void watch_loop();
  // io thread, under lock_: moves bytes; returns true if anything moved.
  bool pump(std::unique_lock<std::mutex>& l);
  void fail_all_locked();
  void handle_message(const wire::Header& h, std::string payload);  // io thread, under lock_

  ring::XenstoreDomainInterface* intf_;
  std::function<void()> notify_;
  const Options options_;
  std::atomic<std::int64_t> timeout_ms_;
  std::atomic<bool> connected_{false};
  std::atomic<bool> broken_{false};

  mutable std::mutex lock_;          // everything below (io side)
  std::condition_variable io_cv_;    // io thread: kicked / new request / stopping
  std::condition_variable reply_cv_; // callers: a reply arrived / broken / stopping
  bool kicked_ = false;
  bool stopping_ = false;
  std::uint32_t next_req_ = 1;
  std::deque<std::string> out_;  // encoded requests not (fully) on the ring yet
  std::size_t out_off_ = 0;
  // The request ring had no room for the rest of out_ at the last look: the io thread waits for
  // xenstored's kick (or its poll) instead of looking again at once, over and over.
  bool out_blocked_ = false;
  std::map<std::uint32_t, std::shared_ptr<Pending>> pending_;  // by req_id
  std::uint32_t probe_req_ = 0;
  wire::Framer framer_;
  std::string in_;  // rsp bytes not yet fed to the framer
  Stats stats_;

  std::mutex watch_lock_;  // watch_cbs_, events_, watch_stopping_, running_token_
  std::condition_variable watch_cv_;
  std::map<std::string, WatchCallback> watch_cbs_;  // by token
  std::optional<std::string> running_token_;        // whose callback the watch thread runs now
  std::condition_variable watch_idle_cv_;           // running_token_ cleared
  std::deque<std::function<void()>> events_;
  bool watch_stopping_ = false;

  std::thread io_thread_;
  std::thread watch_thread_;
};

}  // namespace xpv::xenbus::client
