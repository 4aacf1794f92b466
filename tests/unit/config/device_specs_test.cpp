#include <gtest/gtest.h>

#include "xpv/config/device_specs.h"
#include "xpv/config/error.h"

namespace xpv::config {
namespace {

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(DiskSpec, KeyValueForm) {
  auto d = parse_disk_spec("format=raw, vdev=xvdb, access=ro, target=/srv/a,b.img");
  EXPECT_EQ(d.target, "/srv/a,b.img");  // target= takes the rest, commas included
  EXPECT_EQ(d.vdev.devid, 51728u);
  EXPECT_EQ(d.access, Access::ro);
  EXPECT_EQ(d.format, "raw");
}

TEST(DiskSpec, PositionalFormAndDefaults) {
  auto d = parse_disk_spec("/srv/a.img,raw,xvda,w");
  EXPECT_EQ(d.target, "/srv/a.img");
  EXPECT_EQ(d.vdev.name, "xvda");
  EXPECT_EQ(d.access, Access::rw);
  auto e = parse_disk_spec("/srv/b.img,,xvdc");
  EXPECT_EQ(e.access, Access::rw);
  EXPECT_EQ(e.format, "raw");
}

TEST(DiskSpec, ErrorsNameTheItem) {
  EXPECT_EQ(error_of([] { parse_disk_spec("vdev=xvda"); }),
            "disk spec 'vdev=xvda': no target (the image file or block device)");
  EXPECT_EQ(error_of([] { parse_disk_spec("target=/a"); }), "disk spec 'target=/a': no vdev (e.g. vdev=xvda)");
  EXPECT_EQ(error_of([] { parse_disk_spec("vdev=xvda, access=rx, target=/a"); }),
            "disk spec 'vdev=xvda, access=rx, target=/a': access 'rx' is not one of rw, w, ro, r");
  EXPECT_EQ(error_of([] { parse_disk_spec("vdev=vda, target=/a"); }),
            "disk spec 'vdev=vda, target=/a': 'vda' is not a virtual disk name (xvda, xvdb1, hda, sdc, d0p1)");
  EXPECT_EQ(error_of([] { parse_disk_spec("format=qcow2, vdev=xvda, target=/a"); }),
            "disk spec 'format=qcow2, vdev=xvda, target=/a': format 'qcow2' is not supported (only raw)");
  EXPECT_EQ(error_of([] { parse_disk_spec("colour=red, vdev=xvda, target=/a"); }),
            "disk spec 'colour=red, vdev=xvda, target=/a': unknown key 'colour'");
  EXPECT_EQ(error_of([] { parse_disk_spec("/a,raw,xvda,rw,extra"); }),
            "disk spec '/a,raw,xvda,rw,extra': unexpected extra item 'extra'");
  EXPECT_EQ(error_of([] { parse_disk_spec("vdev=xvda, devtype=cdrom, target=/a"); }),
            "disk spec 'vdev=xvda, devtype=cdrom, target=/a': devtype 'cdrom' is not supported (only disk)");
}

TEST(Mac, ParsesUnicastOnly) {
  auto m = parse_mac("00:16:3e:0A:bc:ff");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->str(), "00:16:3e:0a:bc:ff");
  for (const char* bad : {"01:16:3e:00:00:01", "00:00:00:00:00:00", "00:16:3e:00:00", "00-16-3e-00-00-01",
                          "00:16:3e:00:00:0g", "00:16:3e:00:00:001", ""}) {
    EXPECT_FALSE(parse_mac(bad)) << bad;
  }
}

TEST(Ipv4, HostAddressesWithPrefix) {
  auto a = parse_ipv4_cidr("10.1.2.3");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->prefix, 24u);
  EXPECT_EQ(a->str(), "10.1.2.3/24");
  EXPECT_EQ(a->network(), 0x0a010200u);
  auto b = parse_ipv4_cidr("192.168.7.9/16");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->network(), 0xc0a80000u);
  for (const char* bad : {"10.1.2", "10.1.2.3.4", "10.1.2.256", "10.1.2.0", "10.1.2.255", "10.01.2.3",
                          "10.1.2.3/31", "10.1.2.3/0", "10.1.2.3/x", "a.b.c.d", ""}) {
    EXPECT_FALSE(parse_ipv4_cidr(bad)) << bad;
  }
}

TEST(Rate, XlSyntax) {
  auto r = parse_rate("10Mb/s");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->interval_us, 50000u);
  EXPECT_EQ(r->bytes_per_interval, 10'000'000u / 8 / 20);
  auto r2 = parse_rate("100MB/s@20ms");
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2->interval_us, 20000u);
  EXPECT_EQ(r2->bytes_per_interval, 2'000'000u);
  for (const char* bad : {"10Mb", "10Xb/s", "Mb/s", "0Mb/s", "10Mb/s@", "10Mb/s@0ms", "10Mb/s@20m", "10Mb/s@20s"}) {
    EXPECT_FALSE(parse_rate(bad)) << bad;
  }
}

// Found by tests/fuzz/config: products that wrapped around 2^64 turned a huge rate into an
// arbitrary small one and let an interval far beyond 10 s through.
TEST(Rate, HugeValuesAreExactOrRefusedNeverWrapped) {
  // 10^15 B/s over 50 ms: 5 * 10^13 bytes (bytes/s * interval overflowed before the division).
  auto r = parse_rate("1000000GB/s");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->bytes_per_interval, 50'000'000'000'000u);
  EXPECT_EQ(parse_rate("1099511627776KB/s@1us")->bytes_per_interval, 1099511627u);
  // 2 * 10^19 B/s does not fit in 64 bits; 18446744073709552 ms is 384 µs modulo 2^64.
  for (const char* bad : {"20000000000GB/s", "1099511627776GB/s@1us", "1Mb/s@18446744073709552ms",
                          "1Mb/s@18446744073709552s"}) {
    EXPECT_FALSE(parse_rate(bad)) << bad;
  }
}

TEST(VifSpec, AllKeys) {
  auto v = parse_vif_spec("mac=00:16:3e:00:00:01, ip=10.0.0.2/24, rate=1Gb/s, vifname=web0, bridge=br0, model=vif");
  ASSERT_TRUE(v.mac);
  EXPECT_EQ(v.mac->str(), "00:16:3e:00:00:01");
  ASSERT_TRUE(v.ip);
  EXPECT_EQ(v.ip->str(), "10.0.0.2/24");
  ASSERT_TRUE(v.rate);
  EXPECT_EQ(v.vifname, "web0");
  EXPECT_EQ(v.bridge, "br0");
  EXPECT_FALSE(v.queues);
  EXPECT_FALSE(parse_vif_spec("").mac);
}

// queues=N: at most N netif queues for this vif (QEMU's queues= of a tap NIC); 1..64.
TEST(VifSpec, QueuesIsOneToSixtyFour) {
  EXPECT_EQ(parse_vif_spec("queues=1").queues, 1u);
  EXPECT_EQ(parse_vif_spec("ip=10.0.0.2/24, queues=64").queues, 64u);
  for (const char* bad : {"0", "65", "-1", "2x", "", "1.5"}) {
    const std::string spec = std::string("queues=") + bad;
    EXPECT_EQ(error_of([&] { parse_vif_spec(spec); }),
              "vif spec '" + spec + "': queues '" + bad + "' is not 1..64");
  }
}

// A setting given twice — also once positional and once as key=value — is an error, not
// last-one-wins (a second target would replace the first silently; xl refuses it too).
TEST(DiskSpec, ASettingGivenTwiceIsAnError) {
  EXPECT_EQ(error_of([] { parse_disk_spec("vdev=xvda, vdev=xvdb, target=/a"); }),
            "disk spec 'vdev=xvda, vdev=xvdb, target=/a': 'vdev' is given twice");
  EXPECT_EQ(error_of([] { parse_disk_spec("/a, raw, xvda, target=/b"); }),
            "disk spec '/a, raw, xvda, target=/b': 'target' is given twice");
  EXPECT_EQ(error_of([] { parse_disk_spec("access=ro, /a, raw, xvda, rw"); }),
            "disk spec 'access=ro, /a, raw, xvda, rw': 'access' is given twice");
  EXPECT_EQ(error_of([] { parse_disk_spec("discard, no-discard, vdev=xvda, target=/a"); }),
            "disk spec 'discard, no-discard, vdev=xvda, target=/a': 'discard' is given twice");
}

// xl's flags: discard / no-discard set what the frontend is offered, direct-io-safe changes
// nothing (xpv-blkback opens O_DIRECT where it can), cdrom is refused rather than taken for the
// target (it would have attached the next target= writable as a disk).
TEST(DiskSpec, XlFlags) {
  EXPECT_TRUE(parse_disk_spec("vdev=xvda, target=/a").discard);
  EXPECT_FALSE(parse_disk_spec("no-discard, vdev=xvda, target=/a").discard);
  EXPECT_TRUE(parse_disk_spec("/a,raw,xvda,rw,discard").discard);
  const auto d = parse_disk_spec("/a, raw, direct-io-safe, xvda, ro");  // flags take no positional slot
  EXPECT_EQ(d.target, "/a");
  EXPECT_EQ(d.vdev.name, "xvda");
  EXPECT_EQ(d.access, Access::ro);
  EXPECT_EQ(error_of([] { parse_disk_spec("vdev=hdc, cdrom, target=/iso/x.iso"); }),
            "disk spec 'vdev=hdc, cdrom, target=/iso/x.iso': 'cdrom' is not supported (xpv offers PV disks only)");
}

TEST(VifSpec, AKeyGivenTwiceIsAnError) {
  EXPECT_EQ(error_of([] { parse_vif_spec("mac=00:16:3e:00:00:01, mac=00:16:3e:00:00:02"); }),
            "vif spec 'mac=00:16:3e:00:00:01, mac=00:16:3e:00:00:02': 'mac' is given twice");
  EXPECT_EQ(error_of([] { parse_vif_spec("ip=10.0.0.2, mtu=1500, ip=10.0.0.3"); }),
            "vif spec 'ip=10.0.0.2, mtu=1500, ip=10.0.0.3': 'ip' is given twice");
}

TEST(VifSpec, ErrorsNameTheItem) {
  EXPECT_EQ(error_of([] { parse_vif_spec("mac=01:00:00:00:00:01"); }),
            "vif spec 'mac=01:00:00:00:00:01': '01:00:00:00:00:01' is not a unicast MAC address (aa:bb:cc:dd:ee:ff)");
  EXPECT_EQ(error_of([] { parse_vif_spec("mac=fe:ff:00:01:00:00"); }),
            "vif spec 'mac=fe:ff:00:01:00:00': 'fe:ff:00:01:00:00': MAC addresses fe:ff:* are the host sides of vifs");
  EXPECT_TRUE(parse_vif_spec("mac=fe:fe:00:01:00:00").mac);
  EXPECT_TRUE(parse_vif_spec("mac=02:ff:00:01:00:00").mac);
  EXPECT_EQ(error_of([] { parse_vif_spec("ip=10.0.0.300"); }),
            "vif spec 'ip=10.0.0.300': '10.0.0.300' is not an IPv4 host address with an optional /1../30 prefix");
  EXPECT_EQ(error_of([] { parse_vif_spec("model=e1000"); }),
            "vif spec 'model=e1000': model 'e1000' is not supported (xpv offers PV NICs only)");
  EXPECT_EQ(error_of([] { parse_vif_spec("mac"); }), "vif spec 'mac': 'mac' is not key=value");
  EXPECT_EQ(error_of([] { parse_vif_spec("vifname=abcdefghijklmnop"); }),
            "vif spec 'vifname=abcdefghijklmnop': vifname must be 1..15 characters");
  EXPECT_EQ(error_of([] { parse_vif_spec("script=vif-nat"); }),
            "vif spec 'script=vif-nat': script 'vif-nat' is not supported: xpv-netback configures the host side "
            "itself (vif-bridge and vif-route are understood)");
  EXPECT_EQ(error_of([] { parse_vif_spec("script=vif-route, bridge=br0"); }),
            "vif spec 'script=vif-route, bridge=br0': script vif-route routes: it takes no bridge");
  EXPECT_EQ(error_of([] { parse_vif_spec("bridge="); }), "vif spec 'bridge=': bridge needs a name (bridge=xenbr0)");
}

// Xen's two scripts, as xl configurations name them: vif-bridge is bridge mode (libxl's default
// bridge xenbr0 when none is given), vif-route is the routed host side.
TEST(VifSpec, XensVifBridgeAndVifRouteScriptsAreUnderstood) {
  EXPECT_EQ(parse_vif_spec("script=vif-bridge").bridge, "xenbr0");
  EXPECT_EQ(parse_vif_spec("script=/etc/xen/scripts/vif-bridge, bridge=br1").bridge, "br1");
  EXPECT_EQ(parse_vif_spec("bridge=br2, script=vif-bridge").bridge, "br2");
  EXPECT_EQ(parse_vif_spec("script=vif-route, ip=10.0.0.2").bridge, "");
  EXPECT_EQ(parse_vif_spec("ip=10.0.0.2").bridge, "") << "no script: routed, xpv's default";
}

}  // namespace
}  // namespace xpv::config
