#include "xpv/toolstack/vif_checks.h"

#include <arpa/inet.h>
#include <fmt/core.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <regex>

#include "xpv/netback/bridge.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/inventory.h"
#include "xpv/toolstack/nodes.h"
#include "xpv/toolstack/xenstore.h"

namespace xpv::toolstack {

namespace {

std::uint32_t mask(unsigned prefix) { return prefix == 0 ? 0 : ~0u << (32 - prefix); }

// Two subnets overlap when they agree on the shorter prefix.
bool overlap(std::uint32_t a, unsigned pa, std::uint32_t b, unsigned pb) {
  const std::uint32_t m = mask(std::min(pa, pb));
  return (a & m) == (b & m);
}

std::string cidr(std::uint32_t addr, unsigned prefix) { return fmt::format("{}/{}", netback::ipv4_string(addr), prefix); }

}  // namespace

std::optional<netback::VifAddresses> vif_addresses_of(const config::VifSpec& vif) {
  if (!vif.ip) return std::nullopt;
  return netback::vif_addresses(vif.ip->str());
}

std::vector<ExistingVif> existing_vifs(Xenstore& xs, const std::vector<DomainSummary>& domains) {
  std::vector<ExistingVif> out;
  for (const auto& d : domains) {
    const std::string dir = backend_dir(DeviceKind::vif, d.domid);
    for (const auto& dev : xs.list(dir)) {
      ExistingVif v;
      v.owner = fmt::format("{} vif {}", domain_label(d), dev);
      v.mac = xs.read(dir + "/" + dev + "/mac").value_or("");
      if (auto ip = xs.read(dir + "/" + dev + "/ip")) v.addresses = netback::vif_addresses(*ip);
      v.bridge = netback::vif_bridge(xs.read(dir + "/" + dev + "/bridge"), xs.read(dir + "/" + dev + "/script"));
      out.push_back(std::move(v));
    }
  }
  return out;
}

std::vector<HostAddress> host_addresses() {
  std::vector<HostAddress> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  static const std::regex vif_tap(R"(vif[0-9]+\.[0-9]+)");
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || i->ifa_name == nullptr) continue;
    const std::string name = i->ifa_name;
    if (std::regex_match(name, vif_tap)) continue;  // a vif's own TAP: covered by its vif
    HostAddress h;
    h.ifname = name;
    h.addr = ntohl(reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
    h.prefix = 32;
    if (i->ifa_netmask != nullptr) {
      const std::uint32_t m = ntohl(reinterpret_cast<const sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr);
      h.prefix = static_cast<unsigned>(__builtin_popcount(m));
    }
    out.push_back(h);
  }
  ::freeifaddrs(list);
  return out;
}

void check_new_vif(const std::string& what, const config::VifSpec& vif, const std::vector<ExistingVif>& vifs,
                   const std::vector<HostAddress>& host) {
  if (vif.mac) {
    for (const auto& v : vifs) {
      if (v.mac == vif.mac->str()) throw ToolstackError(fmt::format("{}: MAC {} is already used by {}", what, v.mac, v.owner));
    }
  }
  const auto a = vif_addresses_of(vif);
  if (!a) return;
  const std::string mine = cidr(a->domain, a->prefix);
  const bool bridged = !vif.bridge.empty();
  for (const auto& v : vifs) {
    if (!v.addresses) continue;
    const std::string theirs = cidr(v.addresses->domain, v.addresses->prefix);
    if (bridged && !v.bridge.empty()) {
      // Two bridged vifs: on one LAN or two, only the same address clashes.
      if (a->domain == v.addresses->domain) {
        throw ToolstackError(fmt::format("{}: address {} is already {}'s ({})", what, mine, v.owner, theirs));
      }
    } else if (bridged || !v.bridge.empty()) {
      // A routed vif's subnet goes to its TAP: no bridged vif's address may be in it.
      const bool clash = bridged ? overlap(v.addresses->network(), v.addresses->prefix, a->domain, 32)
                                 : overlap(a->network(), a->prefix, v.addresses->domain, 32);
      if (clash) {
        throw ToolstackError(fmt::format("{}: address {} clashes with {} ({}): a routed vif's subnet must not hold a "
                                         "bridged vif's address",
                                         what, mine, v.owner, theirs));
      }
    } else if (overlap(a->network(), a->prefix, v.addresses->network(), v.addresses->prefix)) {
      throw ToolstackError(fmt::format("{}: address {} clashes with {} ({}): each vif needs a subnet of its own", what,
                                       mine, v.owner, theirs));
    }
  }
  for (const auto& h : host) {
    // A bridged vif shares its bridge's subnet with the host: only the address itself clashes.
    const bool clash = bridged ? h.addr == a->domain
                               : h.addr == a->domain || h.addr == a->host || overlap(a->network(), a->prefix, h.addr, h.prefix);
    if (clash) {
      throw ToolstackError(fmt::format("{}: address {} clashes with {} on the host's interface {}", what, mine,
                                       cidr(h.addr, h.prefix), h.ifname));
    }
  }
}

void check_vif_bridge(const std::string& what, const config::VifSpec& vif) {
  if (vif.bridge.empty()) return;
  if (const std::string why = netback::bridge_problem(vif.bridge); !why.empty()) {
    throw ToolstackError(fmt::format("{}: {}", what, why));
  }
}

void adopt_bridge_mtu(config::VifSpec& vif) {
  if (vif.bridge.empty() || vif.mtu) return;
  if (auto mtu = netback::interface_mtu(vif.bridge); mtu && *mtu >= 68 && *mtu <= 65535) vif.mtu = *mtu;
}

std::string vif_host_side(std::uint32_t domid, std::uint32_t devid, const config::VifSpec& vif) {
  std::string out = fmt::format("host side vif{}.{}", domid, devid);
  if (!vif.bridge.empty()) return out + " in bridge " + vif.bridge;
  if (auto a = vif_addresses_of(vif)) out += " " + cidr(a->host, a->prefix);
  return out;
}

}  // namespace xpv::toolstack
