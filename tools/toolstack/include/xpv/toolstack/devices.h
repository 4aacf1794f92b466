// Adding and removing a domain's devices in xenstore and waiting for the two ends
// (device_states.h says when a device counts as connected or closed). Every wait is bounded;
// the poll interval is 20 ms.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "xpv/toolstack/device_states.h"
#include "xpv/toolstack/nodes.h"

namespace xpv::toolstack {

class Xenstore;

struct DeviceRef {
  DeviceKind kind = DeviceKind::vbd;
  std::uint32_t devid = 0;
  bool operator==(const DeviceRef&) const = default;
};

// "xvda" (a vbd with an xvd-style id), "vbd 768", "vif 0".
std::string device_label(const DeviceRef& d);
// The daemon that serves this kind: "xpv-blkback" / "xpv-netback".
const char* backend_program(DeviceKind k) noexcept;

// Every vbd and vif of the domain that has a backend or a frontend directory.
std::vector<DeviceRef> devices_of(Xenstore& xs, DomId domid);
DeviceStates read_states(Xenstore& xs, DomId domid, const DeviceRef& d);

// Writes the nodes of one device in one transaction; throws if the device exists already.
void add_device(Xenstore& xs, DomId domid, const DeviceRef& d, const NodeList& nodes);

// Waits until every device is connected. Throws ToolstackError naming the first device that was
// refused, whose domain process died (`frontend_alive` false), or that was not connected within
// `timeout`; `hint` ends the message (where to look).
void wait_connected(Xenstore& xs, DomId domid, const std::vector<DeviceRef>& devices,
                    std::chrono::milliseconds timeout, const std::function<bool()>& frontend_alive,
                    const std::string& hint);

// Asks each device to close (backend online = 0, state = 5), waits up to `timeout` for all of
// them to be closed, then removes both ends' directories (and the domain's backend directory
// when it is left empty). Returns one warning per device removed without having closed.
std::vector<std::string> close_and_remove(Xenstore& xs, DomId domid, const std::vector<DeviceRef>& devices,
                                          bool frontend_alive,
                                          const std::function<bool(DeviceKind)>& backend_running,
                                          std::chrono::milliseconds timeout);

}  // namespace xpv::toolstack
