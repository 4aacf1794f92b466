#include "xpv/toolstack/nodes.h"

#include <algorithm>
#include <fmt/core.h>

namespace xpv::toolstack {
namespace {

using xenbus::kPermNone;
using xenbus::kPermRead;
using xenbus::PermList;

// Owned by dom0, readable by the domain.
PermList dom0_owned(DomId domid) { return {{0, kPermNone}, {domid, kPermRead}}; }
// Owned by the domain, readable by dom0 (dom0 is privileged anyway; libxl lists it all the same).
PermList domain_owned(DomId domid) { return {{domid, kPermNone}, {0, kPermRead}}; }

}  // namespace

const char* to_string(DeviceKind k) noexcept { return k == DeviceKind::vbd ? "vbd" : "vif"; }

std::string domain_path(DomId domid) { return fmt::format("/local/domain/{}", domid); }
std::string backend_dir(DeviceKind k, DomId domid) {
  return fmt::format("/local/domain/0/backend/{}/{}", to_string(k), domid);
}
std::string backend_path(DeviceKind k, DomId domid, std::uint32_t devid) {
  return fmt::format("{}/{}", backend_dir(k, domid), devid);
}
std::string frontend_dir(DeviceKind k, DomId domid) {
  return fmt::format("/local/domain/{}/device/{}", domid, to_string(k));
}
std::string frontend_path(DeviceKind k, DomId domid, std::uint32_t devid) {
  return fmt::format("{}/{}", frontend_dir(k, domid), devid);
}

NodeList dom0_nodes() {
  const PermList n0 = {{0, kPermNone}};
  return {
      {"/local", "", n0},
      {"/local/domain", "", n0},
      {"/local/domain/0", "", n0},
      {"/local/domain/0/name", "Domain-0", n0},
      {"/local/domain/0/domid", "0", n0},
      {"/local/domain/0/backend", "", n0},
      {"/local/domain/0/backend/vbd", "", n0},
      {"/local/domain/0/backend/vif", "", n0},
      {"/vm", "", n0},
  };
}

NodeList domain_nodes(const DomainIdentity& d) {
  const std::string dom = domain_path(d.domid);
  const std::string vm = "/vm/" + d.uuid;
  const PermList ro = dom0_owned(d.domid);
  const PermList rw = {{d.domid, kPermNone}};  // the guest's own (dom0 has every right anyway)
  return {
      {dom, "", {{d.domid, kPermNone}}},
      // The PV control protocol, laid out as libxl does: the toolstack writes control/shutdown
      // (`xpv shutdown`), the guest's drivers advertise what they handle (feature-poweroff, ...)
      // and acknowledge a request by clearing control/shutdown.
      {dom + "/control", "", ro},
      {dom + "/control/shutdown", "", rw},
      {dom + "/control/feature-poweroff", "", rw},
      {dom + "/control/feature-reboot", "", rw},
      {dom + "/control/feature-suspend", "", rw},
      {dom + "/control/sysrq", "", rw},
      {dom + "/data", "", rw},
      {dom + "/drivers", "", rw},
      {dom + "/feature", "", rw},
      {dom + "/attr", "", rw},
      {dom + "/error", "", rw},
      {dom + "/name", d.name, ro},
      {dom + "/domid", std::to_string(d.domid), ro},
      {dom + "/vm", vm, ro},
      {dom + "/memory", "", ro},
      {dom + "/memory/target", std::to_string(d.memory_mib * 1024), ro},
      // The balloon's ceiling, as libxl writes it (Linux's xen-balloon reads it once, to know
      // how far target is from what the guest booted with).
      {dom + "/memory/static-max", std::to_string(std::max(d.maxmem_mib, d.memory_mib) * 1024), ro},
      {vm, "", ro},
      {vm + "/name", d.name, ro},
      {vm + "/uuid", d.uuid, ro},
  };
}

NodeList vbd_nodes(DomId domid, const config::DiskSpec& disk) {
  const std::uint32_t devid = disk.vdev.devid;
  const std::string be = backend_path(DeviceKind::vbd, domid, devid);
  const std::string fe = frontend_path(DeviceKind::vbd, domid, devid);
  const PermList bp = dom0_owned(domid);
  const PermList fp = domain_owned(domid);
  return {
      {be, "", bp},
      {be + "/frontend", fe, bp},
      {be + "/frontend-id", std::to_string(domid), bp},
      {be + "/online", "1", bp},
      {be + "/removable", "0", bp},
      {be + "/bootable", "1", bp},
      {be + "/state", "1", bp},
      {be + "/dev", disk.vdev.name, bp},
      {be + "/type", "xpv", bp},
      {be + "/mode", disk.access == config::Access::rw ? "w" : "r", bp},
      {be + "/device-type", "disk", bp},
      {be + "/params", disk.target, bp},
      {be + "/discard-enable", disk.discard ? "1" : "0", bp},
      {fe, "", fp},
      {fe + "/backend", be, fp},
      {fe + "/backend-id", "0", fp},
      {fe + "/state", "1", fp},
      {fe + "/virtual-device", std::to_string(devid), fp},
      {fe + "/device-type", "disk", fp},
  };
}

NodeList vif_nodes(DomId domid, std::uint32_t devid, const config::VifSpec& vif, const config::Mac& mac) {
  const std::string be = backend_path(DeviceKind::vif, domid, devid);
  const std::string fe = frontend_path(DeviceKind::vif, domid, devid);
  const PermList bp = dom0_owned(domid);
  const PermList fp = domain_owned(domid);
  NodeList n = {
      {be, "", bp},
      {be + "/frontend", fe, bp},
      {be + "/frontend-id", std::to_string(domid), bp},
      {be + "/online", "1", bp},
      {be + "/state", "1", bp},
      {be + "/handle", std::to_string(devid), bp},
      {be + "/mac", mac.str(), bp},
  };
  if (!vif.bridge.empty()) n.push_back({be + "/bridge", vif.bridge, bp});
  if (vif.rate) {
    n.push_back({be + "/rate", fmt::format("{},{}", vif.rate->bytes_per_interval, vif.rate->interval_us), bp});
  }
  if (vif.ip) n.push_back({be + "/ip", vif.ip->str(), bp});
  if (vif.mtu) n.push_back({be + "/mtu", std::to_string(*vif.mtu), bp});
  if (vif.queues) n.push_back({be + "/queues", std::to_string(*vif.queues), bp});
  n.insert(n.end(), {
                        {fe, "", fp},
                        {fe + "/backend", be, fp},
                        {fe + "/backend-id", "0", fp},
                        {fe + "/state", "1", fp},
                        {fe + "/handle", std::to_string(devid), fp},
                        {fe + "/mac", mac.str(), fp},
                    });
  return n;
}

}  // namespace xpv::toolstack
