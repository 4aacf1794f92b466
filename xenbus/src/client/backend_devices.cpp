#include "xpv/xenbus/client/backend_devices.h"

#include <optional>

#include "xpv/xenbus/client/sync_client.h"
#include "xpv/xenbus/path.h"

namespace xpv::xenbus::client {

namespace {

// A decimal name from xenstore (anyone with write access below the base may add one), at most
// `max`.
std::optional<std::uint32_t> number(const std::string& s, std::uint32_t max) {
  const auto v = parse_uint(s);
  if (!v || *v > max) return std::nullopt;
  return *v;
}

}  // namespace

BackendDevices list_backend_devices(SyncClient& xs, const std::string& base) {
  BackendDevices out;
  const auto listed = [&](const auto& r) {
    if (!r && r.error() != wire::Error::enoent) out.complete = false;
    return r.has_value();
  };
  auto doms = xs.directory(base);
  if (!listed(doms)) return out;
  for (const auto& dom : *doms) {
    const auto domid = number(dom, 32751);
    if (!domid || *domid == 0) continue;
    auto devs = xs.directory(base + "/" + dom);
    if (!listed(devs)) continue;
    for (const auto& dev : *devs) {
      if (const auto devid = number(dev, UINT32_MAX)) out.keys.emplace_back(static_cast<std::uint16_t>(*domid), *devid);
    }
  }
  return out;
}

}  // namespace xpv::xenbus::client
