#include "xpv/toolstack/device_states.h"

#include <fmt/core.h>

namespace xpv::toolstack {

using xenbus::XenbusState;

std::optional<XenbusState> state_from_node(const std::optional<std::string>& node) {
  if (!node) return std::nullopt;
  return xenbus::parse_state(*node).value_or(XenbusState::unknown);
}

bool device_connected(const DeviceStates& s) {
  return s.frontend == XenbusState::connected && s.backend == XenbusState::connected;
}

bool device_refused(const DeviceStates& s) {
  auto closing = [](const std::optional<XenbusState>& x) {
    return x == XenbusState::closing || x == XenbusState::closed;
  };
  return closing(s.frontend) || closing(s.backend);
}

bool device_closed(const DeviceStates& s, bool frontend_alive, bool backend_running) {
  if (!frontend_alive) return true;
  const auto f = s.frontend.value_or(XenbusState::unknown);
  const auto b = s.backend.value_or(XenbusState::unknown);
  const bool front_never_connected = f == XenbusState::unknown || f == XenbusState::initialising;
  const bool front_idle = front_never_connected || f == XenbusState::closed;
  if (!front_idle) return false;
  if (!backend_running) return true;
  if (b == XenbusState::unknown || b == XenbusState::closed) return true;
  if (front_never_connected) {
    return b == XenbusState::initialising || b == XenbusState::init_wait || b == XenbusState::closing;
  }
  return false;
}

std::string describe(const DeviceStates& s) {
  auto one = [](const std::optional<XenbusState>& x) {
    if (!x) return std::string("absent");
    return fmt::format("{} ({})", static_cast<int>(*x), xenbus::to_string(*x));
  };
  return fmt::format("frontend {}, backend {}", one(s.frontend), one(s.backend));
}

}  // namespace xpv::toolstack
