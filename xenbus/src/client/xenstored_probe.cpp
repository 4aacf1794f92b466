#include "xpv/xenbus/client/xenstored_probe.h"

#include <utility>

#include "xpv/xenbus/client/sync_client.h"

namespace xpv::xenbus::client {

void XenstoredProbe::start(std::string socket_path, std::chrono::milliseconds interval,
                           std::function<void()> on_answer) {
  path_ = std::move(socket_path);
  interval_ = interval;
  on_answer_ = std::move(on_answer);
  running_ = true;
  arm();
}

void XenstoredProbe::cancel() noexcept {
  running_ = false;
  timer_.cancel();
}

void XenstoredProbe::arm() {
  timer_.expires_after(interval_);
  timer_.async_wait([this](boost::system::error_code ec) {
    // Aborted: cancelled, or the probe is being destroyed (then `this` must not be touched).
    if (ec || !running_) return;
    ++looks_;
    if (!xenstored_answers(path_, interval_)) {
      arm();
      return;
    }
    running_ = false;
    auto answer = std::move(on_answer_);
    if (answer) answer();
  });
}

}  // namespace xpv::xenbus::client
