#include "xpv/netback/bridge.h"

#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "xpv/unique_fd.h"

namespace xpv::netback {

namespace {

// Linux's rule for interface names (dev_valid_name).
bool valid_name(const std::string& name) {
  return !name.empty() && name.size() < IFNAMSIZ && name != "." && name != ".." &&
         name.find_first_of("/: \t\n\r\v\f") == std::string::npos;
}

// Over netlink (glibc's if_nameindex): no module is loaded for a name that is not there.
bool exists(const std::string& name) {
  struct if_nameindex* all = ::if_nameindex();
  if (all == nullptr) return false;
  bool found = false;
  for (const struct if_nameindex* i = all; i->if_index != 0 && !found; ++i) found = name == i->if_name;
  ::if_freenameindex(all);
  return found;
}

ifreq named(const std::string& name) {
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, name.data(), std::min(name.size(), std::size_t{IFNAMSIZ - 1}));
  return ifr;
}

}  // namespace

std::string bridge_problem(const std::string& name) {
  if (!valid_name(name)) {
    return "bridge '" + name + "' is not an interface name (1..15 characters, no '/', ':' or white space)";
  }
  if (!exists(name)) return "bridge '" + name + "' does not exist (make it first, e.g. ip link add " + name + " type bridge)";
  UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock) return std::string("bridge '") + name + "': socket: " + std::strerror(errno);
  ethtool_drvinfo info{};
  info.cmd = ETHTOOL_GDRVINFO;
  ifreq ifr = named(name);
  ifr.ifr_data = reinterpret_cast<char*>(&info);
  if (::ioctl(sock.get(), SIOCETHTOOL, &ifr) != 0) {
    return "'" + name + "' is not a bridge (it does not say its driver: " + std::strerror(errno) + ")";
  }
  info.driver[sizeof info.driver - 1] = '\0';
  if (std::strcmp(info.driver, "bridge") != 0) return "'" + name + "' is not a bridge (its driver is " + info.driver + ")";
  return {};
}

std::string vif_bridge(const std::optional<std::string>& bridge_node, const std::optional<std::string>& script_node) {
  if (!bridge_node || bridge_node->empty()) return {};
  if (script_node && script_node->substr(script_node->rfind('/') + 1) == "vif-route") return {};
  return *bridge_node;
}

std::optional<unsigned> interface_mtu(const std::string& name) {
  if (!valid_name(name) || !exists(name)) return std::nullopt;
  UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock) return std::nullopt;
  ifreq ifr = named(name);
  if (::ioctl(sock.get(), SIOCGIFMTU, &ifr) != 0 || ifr.ifr_mtu <= 0) return std::nullopt;
  return static_cast<unsigned>(ifr.ifr_mtu);
}

}  // namespace xpv::netback
