// When the toolstack considers a device connected or closed (pure), from the `state` nodes of
// its two ends (io/xenbus.h numbers; nullopt = node absent, garbage reads as Unknown).
//
//   attach: wait for  frontend 4 Connected  and  backend 4 Connected
//           give up early when either end reaches 5 Closing / 6 Closed (the peer refused it)
//   detach: write backend online = 0, state = 5 Closing (libxl's way of asking), then wait for
//           the frontend to be idle (absent, 1 Initialising, 6 Closed) and the backend to be
//           Closed — or, for a frontend that never connected, anything that maps nothing
//           (1, 2 InitWait, 5). A frontend whose process is gone, or a backend with no daemon
//           to serve it, cannot answer: nothing to wait for.
#pragma once

#include <optional>
#include <string>

#include "xpv/xenbus/device_state.h"

namespace xpv::toolstack {

struct DeviceStates {
  std::optional<xenbus::XenbusState> frontend;
  std::optional<xenbus::XenbusState> backend;
};

// A `state` node's value → state (absent → nullopt, garbage → unknown).
std::optional<xenbus::XenbusState> state_from_node(const std::optional<std::string>& node);

bool device_connected(const DeviceStates& s);
bool device_refused(const DeviceStates& s);
bool device_closed(const DeviceStates& s, bool frontend_alive, bool backend_running);

// "frontend 3 (Initialised), backend 2 (InitWait)"
std::string describe(const DeviceStates& s);

}  // namespace xpv::toolstack
