// Checks before a vif is added (create, network-attach): its MAC must be unused on the host, and
// its address must not clash. A routed vif (no `bridge`; vif_address.h: the `ip` is the domain's
// address, the host side takes the subnet's lowest other address and routes the subnet to the
// vif's TAP) needs a subnet of its own: overlapping neither another routed vif's subnet, nor a
// bridged vif's address, nor an address the host already has on an interface (a clash of routes).
// A bridged vif (`bridge=NAME`: its TAP a port of that bridge, no host address, as Xen's
// vif-bridge) shares the bridge's LAN: only its address itself must be nobody else's — no other
// bridged vif's, no host interface's, and in no routed vif's subnet. Its bridge must exist.
// Pure parts are unit-tested (tests/unit/tools/vif_checks_test.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "xpv/config/device_specs.h"
#include "xpv/netback/vif_address.h"

namespace xpv::toolstack {

class Xenstore;
struct DomainSummary;

// A vif already on the host, as xenstore shows it.
struct ExistingVif {
  std::string owner;  // "web1 (id 1) vif 0"
  std::string mac;
  std::optional<netback::VifAddresses> addresses;
  std::string bridge;  // empty: routed
};

// An IPv4 address on one of the host's interfaces.
struct HostAddress {
  std::string ifname;
  std::uint32_t addr = 0;
  unsigned prefix = 32;
};

// Every vif of `domains` (backend directories).
std::vector<ExistingVif> existing_vifs(Xenstore& xs, const std::vector<DomainSummary>& domains);
// getifaddrs in the toolstack's network namespace, without the vifs' own TAPs (vif<N>.<M>).
std::vector<HostAddress> host_addresses();

// Throws ToolstackError ("MAC … is already used by …", "address … : subnet … overlaps …") —
// `what` prefixes the message ("vif 0", "web1.cfg: vif 1").
void check_new_vif(const std::string& what, const config::VifSpec& vif, const std::vector<ExistingVif>& vifs,
                   const std::vector<HostAddress>& host);

// Throws ToolstackError ("`what`: bridge 'br0' does not exist …") unless the vif is routed or
// its bridge is a bridge in the toolstack's network namespace (netback::bridge_problem).
void check_vif_bridge(const std::string& what, const config::VifSpec& vif);
// A bridged vif without an `mtu` takes its bridge's, as Xen's vif-bridge does: a port of a smaller
// MTU would pull the bridge's own down (a Linux bridge whose MTU was not set by hand follows its
// smallest port).
void adopt_bridge_mtu(config::VifSpec& vif);

// The vif's addresses, from its spec (nullopt: no ip).
std::optional<netback::VifAddresses> vif_addresses_of(const config::VifSpec& vif);

// "host side vif<domid>.<devid>" and what it is: its address (routed, with an ip) or
// "in bridge NAME"; for the toolstack's messages.
std::string vif_host_side(std::uint32_t domid, std::uint32_t devid, const config::VifSpec& vif);

}  // namespace xpv::toolstack
