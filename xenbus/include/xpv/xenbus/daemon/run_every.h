// run_every — a daemon's periodic chore on its io_context (e.g. the backends publishing their
// devices' statistics every second): fn() runs on the timer's executor every `period` until
// `stopped()` says so or the timer is cancelled. The timer, and whatever fn and stopped use, must
// outlive the io_context's run (a cancelled wait completes with an error and touches nothing).
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <chrono>

namespace xpv::daemon {

template <class Stopped, class Fn>
void run_every(boost::asio::steady_timer& timer, std::chrono::steady_clock::duration period, Stopped stopped, Fn fn) {
  timer.expires_after(period);
  timer.async_wait([&timer, period, stopped, fn](const boost::system::error_code& ec) {
    if (ec || stopped()) return;
    fn();
    run_every(timer, period, stopped, fn);
  });
}

}  // namespace xpv::daemon
