// The xenstore nodes the toolstack writes for a domain, a virtual block device and a virtual
// network interface — exactly docs/PROCESS-DOMAINS.md's layout (libxl's), as pure data so a unit
// test can hold every (path, value, permissions) triple against the contract.
//
//   /local/domain/N                      ""          nN        (owned by the domain)
//     name, domid, vm, memory, memory/target (KiB)   n0 rN     (read-only to the domain)
//   /vm/<uuid>, /vm/<uuid>/{name,uuid}               n0 rN
//   /local/domain/0/backend/vbd/N/<devid>/…          n0 rN     (dom0 owns the backend half)
//   /local/domain/N/device/vbd/<devid>/…             nN r0     (the domain owns its frontend half)
//   …/backend/vif/N/<devid>/…, …/device/vif/<devid>/…    as vbd
//
// Every directory is listed before its children, so writing the list in order (write + set_perms
// per node, in one transaction) creates each node with exactly the permissions listed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xpv/config/device_specs.h"
#include "xpv/xenbus/perms.h"

namespace xpv::toolstack {

using DomId = std::uint16_t;

struct Node {
  std::string path;
  std::string value;
  xenbus::PermList perms;
  bool operator==(const Node&) const = default;
};
using NodeList = std::vector<Node>;

enum class DeviceKind { vbd, vif };
const char* to_string(DeviceKind k) noexcept;  // "vbd", "vif"

std::string domain_path(DomId domid);                                  // /local/domain/N
std::string backend_dir(DeviceKind k, DomId domid);                    // /local/domain/0/backend/vbd/N
std::string backend_path(DeviceKind k, DomId domid, std::uint32_t devid);   // …/backend/vbd/N/<devid>
std::string frontend_dir(DeviceKind k, DomId domid);                   // /local/domain/N/device/vbd
std::string frontend_path(DeviceKind k, DomId domid, std::uint32_t devid);  // …/device/vbd/<devid>

struct DomainIdentity {
  DomId domid = 0;
  std::string name;
  std::uint64_t memory_mib = 0;  // memory/target
  std::string uuid;  // 8-4-4-4-12 lower-case hex
  std::uint64_t maxmem_mib = 0;  // memory/static-max (0: memory_mib)
};

// dom0's own entries, written by `xpv up` on a fresh store (as Xen's init-xenstore-domain does):
// /local/domain/0/{name = Domain-0, domid = 0}, the backend directories the backends watch
// (/local/domain/0/backend/{vbd,vif}) and /vm; all n0.
NodeList dom0_nodes();
NodeList domain_nodes(const DomainIdentity& d);
NodeList vbd_nodes(DomId domid, const config::DiskSpec& disk);
// `mac` is the vif's address (the spec's, or one the toolstack generated).
NodeList vif_nodes(DomId domid, std::uint32_t devid, const config::VifSpec& vif, const config::Mac& mac);

}  // namespace xpv::toolstack
