#include "xpv/toolstack/devices.h"

#include <fmt/core.h>

#include <thread>

#include "xpv/config/vdev.h"
#include "xpv/toolstack/allocation.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/process.h"
#include "xpv/toolstack/xenstore.h"

namespace xpv::toolstack {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(20);

}  // namespace

std::string device_label(const DeviceRef& d) {
  if (d.kind == DeviceKind::vbd) {
    if (auto n = config::xvd_name(d.devid)) return *n;
    return fmt::format("vbd {}", d.devid);
  }
  return fmt::format("vif {}", d.devid);
}

const char* backend_program(DeviceKind k) noexcept {
  return k == DeviceKind::vbd ? "xpv-blkback" : "xpv-netback";
}

std::vector<DeviceRef> devices_of(Xenstore& xs, DomId domid) {
  std::vector<DeviceRef> out;
  for (DeviceKind k : {DeviceKind::vbd, DeviceKind::vif}) {
    auto add = [&](const std::string& s) {
      auto id = parse_devid(s);
      if (!id) return;
      DeviceRef d{k, *id};
      for (const auto& e : out) {
        if (e == d) return;
      }
      out.push_back(d);
    };
    for (const auto& s : xs.list(backend_dir(k, domid))) add(s);
    for (const auto& s : xs.list(frontend_dir(k, domid))) add(s);
  }
  return out;
}

DeviceStates read_states(Xenstore& xs, DomId domid, const DeviceRef& d) {
  return {state_from_node(xs.read(frontend_path(d.kind, domid, d.devid) + "/state")),
          state_from_node(xs.read(backend_path(d.kind, domid, d.devid) + "/state"))};
}

void add_device(Xenstore& xs, DomId domid, const DeviceRef& d, const NodeList& nodes) {
  xs.transaction([&](TxId tx) {
    if (xs.exists(backend_path(d.kind, domid, d.devid), tx) || xs.exists(frontend_path(d.kind, domid, d.devid), tx)) {
      throw ToolstackError(fmt::format("{} exists already in domain {}", device_label(d), domid));
    }
    xs.write_nodes(nodes, tx);
  });
}

void wait_connected(Xenstore& xs, DomId domid, const std::vector<DeviceRef>& devices,
                    std::chrono::milliseconds timeout, const std::function<bool()>& frontend_alive,
                    const std::string& hint) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const DeviceRef& d : devices) {
    for (;;) {
      const DeviceStates s = read_states(xs, domid, d);
      if (device_connected(s)) break;
      if (device_refused(s)) {
        // The backend says why in its `error` node (xenbus_dev_fatal's way).
        const auto why = xs.read(backend_path(d.kind, domid, d.devid) + "/error");
        throw ToolstackError(fmt::format("{} was refused ({}){}; {}", device_label(d), describe(s),
                                         why ? ": " + *why : std::string(), hint));
      }
      if (!frontend_alive()) {
        throw ToolstackError(fmt::format("the domain process died while {} was connecting; {}", device_label(d), hint));
      }
      throw_if_interrupted();  // Ctrl-C: the caller undoes (process.h, InterruptGuard)
      if (std::chrono::steady_clock::now() >= deadline) {
        throw ToolstackError(fmt::format("{} did not connect within {} s ({}); {}", device_label(d),
                                         std::chrono::duration_cast<std::chrono::seconds>(timeout).count(),
                                         describe(s), hint));
      }
      std::this_thread::sleep_for(kPoll);
    }
  }
}

std::vector<std::string> close_and_remove(Xenstore& xs, DomId domid, const std::vector<DeviceRef>& devices,
                                          bool frontend_alive,
                                          const std::function<bool(DeviceKind)>& backend_running,
                                          std::chrono::milliseconds timeout) {
  std::vector<std::string> warnings;
  for (const DeviceRef& d : devices) {
    const std::string be = backend_path(d.kind, domid, d.devid);
    if (!xs.exists(be)) continue;
    xs.transaction([&](TxId tx) {
      if (!xs.exists(be, tx)) return;
      xs.write(be + "/online", "0", tx);
      xs.write(be + "/state", "5", tx);
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const DeviceRef& d : devices) {
    const bool backend_up = backend_running(d.kind);
    for (;;) {
      const DeviceStates s = read_states(xs, domid, d);
      if (device_closed(s, frontend_alive, backend_up)) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        warnings.push_back(fmt::format("{} did not close within {} s ({}); removed anyway", device_label(d),
                                       std::chrono::duration_cast<std::chrono::seconds>(timeout).count(),
                                       describe(s)));
        break;
      }
      std::this_thread::sleep_for(kPoll);
    }
  }
  for (const DeviceRef& d : devices) {
    xs.transaction([&](TxId tx) {
      xs.rm(frontend_path(d.kind, domid, d.devid), tx);
      xs.rm(backend_path(d.kind, domid, d.devid), tx);
    });
  }
  for (DeviceKind k : {DeviceKind::vbd, DeviceKind::vif}) {
    if (xs.exists(backend_dir(k, domid)) && xs.list(backend_dir(k, domid)).empty()) xs.rm(backend_dir(k, domid));
  }
  return warnings;
}

}  // namespace xpv::toolstack
