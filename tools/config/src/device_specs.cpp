#include "xpv/config/device_specs.h"

#include <fmt/core.h>

#include <charconv>
#include <set>
#include <vector>

#include "xpv/config/error.h"

namespace xpv::config {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

template <class T>
std::optional<T> to_number(std::string_view s, int base = 10) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<Access> parse_access(std::string_view s) {
  if (s == "rw" || s == "w") return Access::rw;
  if (s == "ro" || s == "r") return Access::ro;
  return std::nullopt;
}

}  // namespace

DiskSpec parse_disk_spec(std::string_view spec) {
  auto bad = [&](const std::string& why) -> ConfigError {
    return ConfigError(fmt::format("disk spec '{}': {}", spec, why));
  };
  DiskSpec d;
  bool have_target = false, have_vdev = false;
  int positional = 0;
  std::set<std::string_view> seen;  // each setting once, positional or key=value (xl refuses a
                                    // second target or vdev; xpv every repeat)
  auto once = [&](std::string_view key) {
    if (!seen.insert(key).second) throw bad(fmt::format("'{}' is given twice", key));
  };
  std::string_view rest = spec;
  while (!rest.empty()) {
    std::string_view item;
    std::string_view t = trim(rest);
    if (t.starts_with("target=")) {  // the rest of the string, commas included
      item = t;
      rest = {};
    } else {
      auto comma = rest.find(',');
      item = trim(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
    std::string_view key, value;
    if (auto eq = item.find('='); eq != std::string_view::npos) {
      key = trim(item.substr(0, eq));
      value = trim(item.substr(eq + 1));
    } else if (item == "discard" || item == "no-discard") {
      // xl's flags: whether the frontend is offered discard (the backend's discard-enable).
      once("discard");
      d.discard = item == "discard";
      continue;
    } else if (item == "direct-io-safe") {
      // xl's hint that the backend may open the target with O_DIRECT: xpv-blkback always does
      // where the file system allows it, so the flag changes nothing here.
      once(item);
      continue;
    } else if (item == "cdrom") {
      throw bad("'cdrom' is not supported (xpv offers PV disks only)");
    } else {
      // Positional: target, format, vdev, access. An empty positional keeps the default.
      static constexpr std::string_view kOrder[] = {"target", "format", "vdev", "access"};
      const int pos = positional++;
      if (item.empty()) continue;
      if (pos >= 4) throw bad(fmt::format("unexpected extra item '{}'", item));
      key = kOrder[pos];
      value = item;
    }
    if (key == "target" || key == "format" || key == "vdev" || key == "access" || key == "devtype" ||
        key == "backendtype") {
      once(key);
    }
    if (key == "target") {
      if (value.empty()) throw bad("empty target");
      d.target = std::string(value);
      have_target = true;
    } else if (key == "format") {
      if (value != "raw") throw bad(fmt::format("format '{}' is not supported (only raw)", value));
      d.format = std::string(value);
    } else if (key == "vdev") {
      auto v = parse_vdev(value);
      if (!v) throw bad(fmt::format("'{}' is not a virtual disk name (xvda, xvdb1, hda, sdc, d0p1)", value));
      d.vdev = *v;
      have_vdev = true;
    } else if (key == "access") {
      auto a = parse_access(value);
      if (!a) throw bad(fmt::format("access '{}' is not one of rw, w, ro, r", value));
      d.access = *a;
    } else if (key == "devtype") {
      if (value != "disk") throw bad(fmt::format("devtype '{}' is not supported (only disk)", value));
    } else if (key == "backendtype") {
      if (value != "phy" && value != "qdisk" && value != "xpv") {
        throw bad(fmt::format("backendtype '{}' is not supported", value));
      }
    } else {
      throw bad(fmt::format("unknown key '{}'", key));
    }
  }
  if (!have_target) throw bad("no target (the image file or block device)");
  if (!have_vdev) throw bad("no vdev (e.g. vdev=xvda)");
  return d;
}

std::string Mac::str() const {
  return fmt::format("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", bytes[0], bytes[1], bytes[2],
                     bytes[3], bytes[4], bytes[5]);
}

std::optional<Mac> parse_mac(std::string_view s) {
  Mac m;
  if (s.size() != 17) return std::nullopt;
  for (int i = 0; i < 6; ++i) {
    if (i > 0 && s[static_cast<std::size_t>(i * 3 - 1)] != ':') return std::nullopt;
    auto v = to_number<std::uint8_t>(s.substr(static_cast<std::size_t>(i * 3), 2), 16);
    if (!v) return std::nullopt;
    m.bytes[static_cast<std::size_t>(i)] = *v;
  }
  if ((m.bytes[0] & 1) != 0) return std::nullopt;  // multicast: not a NIC address
  if (m == Mac{}) return std::nullopt;
  return m;
}

std::string Ipv4Cidr::str() const {
  return fmt::format("{}.{}.{}.{}/{}", addr >> 24, (addr >> 16) & 0xff, (addr >> 8) & 0xff,
                     addr & 0xff, prefix);
}

std::optional<Ipv4Cidr> parse_ipv4_cidr(std::string_view s) {
  Ipv4Cidr c;
  auto slash = s.find('/');
  std::string_view a = s.substr(0, slash);
  if (slash != std::string_view::npos) {
    auto p = to_number<unsigned>(s.substr(slash + 1));
    if (!p || *p < 1 || *p > 30) return std::nullopt;  // /31 and /32 leave no peer address
    c.prefix = *p;
  }
  std::uint32_t addr = 0;
  for (int i = 0; i < 4; ++i) {
    auto dot = a.find('.');
    if ((i < 3) == (dot == std::string_view::npos)) return std::nullopt;
    std::string_view part = a.substr(0, dot);
    if (part.size() > 1 && part[0] == '0') return std::nullopt;
    auto v = to_number<unsigned>(part);
    if (!v || *v > 255) return std::nullopt;
    addr = (addr << 8) | *v;
    a = dot == std::string_view::npos ? std::string_view{} : a.substr(dot + 1);
  }
  c.addr = addr;
  const std::uint32_t host = c.addr & ~(~0u << (32 - c.prefix));
  if (host == 0 || host == ~(~0u << (32 - c.prefix))) return std::nullopt;  // network / broadcast
  return c;
}

std::optional<Rate> parse_rate(std::string_view s) {
  auto at = s.find('@');
  std::string_view amount = s.substr(0, at);
  Rate r;
  if (!amount.ends_with("/s")) return std::nullopt;
  amount.remove_suffix(2);
  if (amount.empty()) return std::nullopt;
  const char unit = amount.back();  // b (bits) or B (bytes)
  if (unit != 'b' && unit != 'B') return std::nullopt;
  amount.remove_suffix(1);
  std::uint64_t mult = 1;
  if (!amount.empty()) {
    switch (amount.back()) {
      case 'K': mult = 1000; break;
      case 'M': mult = 1000 * 1000; break;
      case 'G': mult = 1000 * 1000 * 1000; break;
      default: mult = 0;
    }
    if (mult != 0) amount.remove_suffix(1);
    else mult = 1;
  }
  auto n = to_number<std::uint64_t>(amount);
  if (!n || *n == 0 || *n > (1ull << 40)) return std::nullopt;
  // Every product below is checked: a wrapped one would turn a huge rate into an arbitrary
  // small one (or accept an interval far beyond 10 s). Too large to count is refused.
  if (*n > UINT64_MAX / mult) return std::nullopt;
  std::uint64_t bytes_per_s = *n * mult;
  if (unit == 'b') bytes_per_s /= 8;
  if (at != std::string_view::npos) {
    std::string_view iv = s.substr(at + 1);
    std::uint64_t scale = 0;
    if (iv.ends_with("us")) { scale = 1; iv.remove_suffix(2); }
    else if (iv.ends_with("ms")) { scale = 1000; iv.remove_suffix(2); }
    else if (iv.ends_with("s")) { scale = 1000000; iv.remove_suffix(1); }
    auto v = to_number<std::uint64_t>(iv);
    if (scale == 0 || !v || *v == 0 || *v > 10'000'000 / scale) return std::nullopt;
    r.interval_us = *v * scale;
  }
  // bytes_per_s * interval_us / 10^6 without the 128-bit product: whole MB/s times the interval,
  // plus the remainder's share (< 10^6 * 10^7, no overflow).
  const std::uint64_t mb = bytes_per_s / 1000000, rest = bytes_per_s % 1000000;
  if (mb > (UINT64_MAX - rest * r.interval_us / 1000000) / r.interval_us) return std::nullopt;
  r.bytes_per_interval = mb * r.interval_us + rest * r.interval_us / 1000000;
  if (r.bytes_per_interval == 0) return std::nullopt;
  return r;
}

VifSpec parse_vif_spec(std::string_view spec) {
  auto bad = [&](const std::string& why) -> ConfigError {
    return ConfigError(fmt::format("vif spec '{}': {}", spec, why));
  };
  VifSpec v;
  std::set<std::string_view> seen;  // each key once: a second mac= is a mistake, not an override
  std::string_view script;          // xl's hotplug script, by its name: what it means for the host side
  std::string_view rest = spec;
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string_view::npos) throw bad(fmt::format("'{}' is not key=value", item));
    std::string_view key = trim(item.substr(0, eq));
    std::string_view value = trim(item.substr(eq + 1));
    if (!seen.insert(key).second) throw bad(fmt::format("'{}' is given twice", key));
    if (key == "mac") {
      v.mac = parse_mac(value);
      if (!v.mac) throw bad(fmt::format("'{}' is not a unicast MAC address (aa:bb:cc:dd:ee:ff)", value));
      // xpv-netback names each vif's host side fe:ff:<domid>:<devid> (host_side_mac): a guest
      // with such an address could be the host side of another vif, or of its own.
      if (v.mac->bytes[0] == 0xfe && v.mac->bytes[1] == 0xff) {
        throw bad(fmt::format("'{}': MAC addresses fe:ff:* are the host sides of vifs", value));
      }
    } else if (key == "ip") {
      v.ip = parse_ipv4_cidr(value);
      if (!v.ip) throw bad(fmt::format("'{}' is not an IPv4 host address with an optional /1../30 prefix", value));
    } else if (key == "rate") {
      v.rate = parse_rate(value);
      if (!v.rate) throw bad(fmt::format("'{}' is not a rate like 10Mb/s or 100MB/s@20ms", value));
    } else if (key == "bridge") {
      if (value.empty()) throw bad("bridge needs a name (bridge=xenbr0)");
      v.bridge = std::string(value);
    } else if (key == "mtu") {
      auto m = to_number<unsigned>(value);
      if (!m || *m < 68 || *m > 65535) throw bad(fmt::format("mtu '{}' is not 68..65535", value));
      v.mtu = *m;
    } else if (key == "queues") {
      auto q = to_number<unsigned>(value);
      if (!q || *q < 1 || *q > 64) throw bad(fmt::format("queues '{}' is not 1..64", value));
      v.queues = *q;
    } else if (key == "vifname") {
      if (value.empty() || value.size() > 15) throw bad("vifname must be 1..15 characters");
      v.vifname = std::string(value);
    } else if (key == "model" || key == "type") {
      if (value != "vif" && value != "netfront" && value != "xen") {
        throw bad(fmt::format("{} '{}' is not supported (xpv offers PV NICs only)", key, value));
      }
    } else if (key == "backend") {
      if (value != "0" && value != "Domain-0") throw bad("backend must be dom0");
    } else if (key == "script") {
      // xpv-netback does the host side itself; the two scripts of Xen's that it does as they do
      // are taken by name (with or without their directory), as configurations copied from xl
      // carry them.
      const auto slash = value.rfind('/');
      script = slash == std::string_view::npos ? value : value.substr(slash + 1);
      if (script != "vif-bridge" && script != "vif-route") {
        throw bad(fmt::format("script '{}' is not supported: xpv-netback configures the host side itself "
                              "(vif-bridge and vif-route are understood)",
                              value));
      }
    } else {
      throw bad(fmt::format("unknown key '{}'", key));
    }
  }
  // vif-bridge without a bridge: libxl's default bridge. vif-route: routed, which a bridge contradicts.
  if (script == "vif-bridge" && v.bridge.empty()) v.bridge = "xenbr0";
  if (script == "vif-route" && !v.bridge.empty()) throw bad("script vif-route routes: it takes no bridge");
  return v;
}

}  // namespace xpv::config
