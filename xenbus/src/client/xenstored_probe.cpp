#include "xpv/xenbus/client/xenstored_probe.h"

#include <spdlog/spdlog.h>

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

void XenstoredProbe::after_loss(const std::string& who, const std::string& socket_path, const std::string& served,
                                std::function<void()> on_answer) {
  spdlog::error("{}: lost xpv-xenstored at {}; control plane stopped, {} keep being served{}", who, socket_path,
                served, on_answer ? "; looking each second whether it answers again" : "");
  if (!on_answer) return;
  start(socket_path, std::chrono::seconds(1), [who, socket_path, served, answer = std::move(on_answer)] {
    spdlog::warn("{}: xpv-xenstored at {} answers again; stopping, so that the next start resumes the {} over a new "
                 "connection",
                 who, socket_path, served);
    answer();
  });
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
