// XenstoredProbe — for a daemon whose xenstore connection is lost (xpv-blkback, xpv-netback):
// looks every `interval`, on its io_context's thread, whether xenstored answers at the socket
// again (xenstored_answers, sync_client.h: a fresh connection and one read, each bounded by the
// interval), and calls `on_answer` once when it does. Each look blocks that thread for up to two
// intervals (connect, read) while a daemon is there but does not answer: in xpv-blkback and
// xpv-netback the control plane, stopped while the connection is lost, the stats timer and the
// SIGTERM handler wait that long at most.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace xpv::xenbus::client {

class XenstoredProbe {
 public:
  explicit XenstoredProbe(boost::asio::io_context& io) : timer_(io) {}
  XenstoredProbe(const XenstoredProbe&) = delete;
  XenstoredProbe& operator=(const XenstoredProbe&) = delete;

  // Starts looking (again: a running probe starts over with these arguments).
  void start(std::string socket_path, std::chrono::milliseconds interval, std::function<void()> on_answer);
  // A backend daemon's control plane lost xenstored at `socket_path`: logs that (`who`:
  // "blkback"; `served`: "2 device(s)", what its queues go on serving) and, with `on_answer` set,
  // starts looking each second, logs the answer when it comes and calls `on_answer`.
  void after_loss(const std::string& who, const std::string& socket_path, const std::string& served,
                  std::function<void()> on_answer);
  // No more looks; on_answer is not called after this returns (on the io_context's thread).
  void cancel() noexcept;
  bool running() const noexcept { return running_; }
  std::uint64_t looks() const noexcept { return looks_; }

 private:
  void arm();

  boost::asio::steady_timer timer_;
  std::string path_;
  std::chrono::milliseconds interval_{1000};
  std::function<void()> on_answer_;
  bool running_ = false;
  std::uint64_t looks_ = 0;
};

}  // namespace xpv::xenbus::client
