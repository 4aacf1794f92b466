// Runs a function on the thread that runs an io_context, from a test's own thread, and hands back
// what it returned (or rethrows what it threw): how a test reads or changes state that belongs to
// a server's io thread (a ControlServer, a xenstored ring daemon, a Domain) without a data race.
//
// The wait is bounded: if the io thread has not run the function within `timeout`, the test
// binary aborts with a message. A stuck io thread is a failure, not a test that never ends, and
// the function may refer to the caller's locals, so there is no returning without it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <utility>

namespace xpv::test {

template <class F>
auto run_on(boost::asio::io_context& io, F f,
            std::chrono::milliseconds timeout = std::chrono::seconds(60)) -> decltype(f()) {
  auto task = std::make_shared<std::packaged_task<decltype(f())()>>(std::move(f));
  auto result = task->get_future();
  boost::asio::post(io, [task] { (*task)(); });
  if (result.wait_for(timeout) != std::future_status::ready) {
    std::fprintf(stderr, "FAILURE: the io thread did not run a task within %lld ms\n",
                 static_cast<long long>(timeout.count()));
    std::abort();
  }
  return result.get();
}

}  // namespace xpv::test
