#include "xpv/toolstack/vif_checks.h"

#include <arpa/inet.h>
#include <fmt/core.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <regex>

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
  for (const auto& v : vifs) {
    if (!v.addresses) continue;
    if (overlap(a->network(), a->prefix, v.addresses->network(), v.addresses->prefix)) {
      throw ToolstackError(fmt::format("{}: address {} clashes with {} ({}): each vif needs a subnet of its own", what,
                                       mine, v.owner, cidr(v.addresses->domain, v.addresses->prefix)));
    }
  }
  for (const auto& h : host) {
    if (h.addr == a->domain || h.addr == a->host || overlap(a->network(), a->prefix, h.addr, h.prefix)) {
      throw ToolstackError(fmt::format("{}: address {} clashes with {} on the host's interface {}", what, mine,
                                       cidr(h.addr, h.prefix), h.ifname));
    }
  }
}

}  // namespace xpv::toolstack
