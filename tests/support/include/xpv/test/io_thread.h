// An io_context run by a thread of its own for as long as the object lives: the daemon side of a
// test (a xenstored's Store and transports, a server) lives on it, and the test reaches it with
// run(), which hands a function over and waits for it (run_on.h: bounded). Declare it before
// the members bound to it (so the io_context outlives them), and stop() it before they go.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <thread>
#include <utility>

#include "xpv/test/run_on.h"

namespace xpv::test {

class IoThread {
 public:
  IoThread() : thread_([this] { io_.run(); }) {}
  ~IoThread() { stop(); }
  // Stops the io_context and joins the thread (idempotent); the io_context itself stays, for the
  // objects still bound to it to be destroyed.
  void stop() {
    if (!thread_.joinable()) return;
    work_.reset();
    io_.stop();
    thread_.join();
  }
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  boost::asio::io_context& io() { return io_; }
  template <class F>
  auto run(F f) -> decltype(f()) {
    return run_on(io_, std::move(f));
  }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_ = boost::asio::make_work_guard(io_);
  std::thread thread_;
};

}  // namespace xpv::test
