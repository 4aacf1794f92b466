// Bridges for bridged vifs (`bridge=NAME`, as Xen's vif-bridge script): what xpv-netback and the
// toolstack ask of the bridge a vif names, in the caller's network namespace. Making a TAP a port
// of it is Tap::join_bridge (tap.h).
//
// Names are looked up over netlink (if_nameindex) before any ioctl: an ioctl on a name that does
// not exist makes the kernel try to load a module of that name (dev_load), which a typo in a
// configuration must not do.
#pragma once

#include <optional>
#include <string>

namespace xpv::netback {

// Why the interface `name` cannot take a vif as a bridge port: not an interface name, no such
// interface, or not a bridge (its ethtool driver name is not "bridge"). Empty when it can.
std::string bridge_problem(const std::string& name);

// The bridge a vif's backend nodes put it on: its `bridge` node, unless its `script` node names
// vif-route (with or without a directory: libxl writes a `bridge`, xenbr0 by default, beside
// every script); empty for a routed vif. One rule for xpv-netback and the toolstack.
std::string vif_bridge(const std::optional<std::string>& bridge_node, const std::optional<std::string>& script_node);

// The MTU of the existing interface `name`; nullopt when there is none of that name.
std::optional<unsigned> interface_mtu(const std::string& name);

}  // namespace xpv::netback
