// Device specification strings as xl takes them in `disk = [...]` / `vif = [...]` and on the
// command line of block-attach / network-attach.
//
// Disk (xl-disk-configuration(5)): comma-separated; `key=value` items (target, format, vdev,
// access, devtype) and/or positional items in the order target, format, vdev, access. `target=`
// swallows the rest of the string (paths may contain commas), as in xl. The flags `discard` /
// `no-discard` and `direct-io-safe` are taken as xl takes them; `cdrom` is refused. A setting
// given twice (also once positional, once as key=value) is an error, not last-one-wins.
//   'format=raw, vdev=xvda, access=rw, target=/srv/a.img'     '/srv/a.img,raw,xvda,rw'
// Vif (xl-network-configuration(5)): comma-separated key=value: mac, ip, bridge, vifname, rate,
// model, type, backend, script, mtu. xpv uses mac, ip (IPv4, optional /prefix, default /24), rate, mtu,
// bridge (the host side a port of that bridge instead of a routed TAP) and vifname; model/type
// are accepted only with the values that mean a PV NIC; script only as Xen's vif-bridge (bridge
// mode, bridge xenbr0 unless given, as libxl) or vif-route (routed, xpv's default).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "xpv/config/vdev.h"

namespace xpv::config {

enum class Access { rw, ro };

struct DiskSpec {
  std::string target;  // image file or block device path
  std::string format = "raw";
  Vdev vdev;
  Access access = Access::rw;
  bool discard = true;  // offered to the frontend (xl's `discard` / `no-discard` flags)
};

// Throws ConfigError naming the spec and the bad item.
DiskSpec parse_disk_spec(std::string_view spec);

struct Mac {
  std::array<std::uint8_t, 6> bytes{};
  std::string str() const;  // "00:16:3e:12:34:56"
  bool operator==(const Mac&) const = default;
};
std::optional<Mac> parse_mac(std::string_view s);

struct Ipv4Cidr {
  std::uint32_t addr = 0;  // host byte order
  unsigned prefix = 24;
  std::string str() const;  // "10.0.0.2/24"
  std::uint32_t network() const { return prefix == 0 ? 0 : addr & (~0u << (32 - prefix)); }
};
std::optional<Ipv4Cidr> parse_ipv4_cidr(std::string_view s);

struct Rate {
  std::uint64_t bytes_per_interval = 0;  // as netback's `rate` node: bytes,usec
  std::uint64_t interval_us = 50000;
};

struct VifSpec {
  std::optional<Mac> mac;  // generated (00:16:3e:…) when absent
  std::optional<Ipv4Cidr> ip;
  std::optional<Rate> rate;
  std::string bridge;
  std::string vifname;
  std::optional<unsigned> mtu;  // 68..65535; the `mtu` node of both ends (default 1500)
  // 1..64: at most this many netif queues for this vif (the backend's `queues` node; xpv-netback
  // offers the smaller of it and its --max-queues). Absent: the daemon's --max-queues.
  std::optional<unsigned> queues;
};

// Throws ConfigError naming the spec and the bad item.
VifSpec parse_vif_spec(std::string_view spec);

// xl's rate syntax: NUM{B,K,M,G}{b,B}/s[@INTERVAL{s,ms,us}], e.g. "10Mb/s@20ms".
std::optional<Rate> parse_rate(std::string_view s);

}  // namespace xpv::config
