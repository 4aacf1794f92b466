#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <set>

#include "xpv/netback/backend.h"
#include "xpv/netback/connection.h"
#include "xpv/netback/vif_address.h"

namespace xpv::netback {
namespace {

TEST(VifAddresses, TheHostTakesTheLowestOtherAddressOfTheSubnet) {
  auto a = vif_addresses("10.1.2.7/24");
  ASSERT_TRUE(a);
  EXPECT_EQ(ipv4_string(a->domain), "10.1.2.7");
  EXPECT_EQ(ipv4_string(a->host), "10.1.2.1");
  EXPECT_EQ(a->prefix, 24u);
  EXPECT_EQ(ipv4_string(a->network()), "10.1.2.0");
  auto b = vif_addresses("10.1.2.1/24");
  ASSERT_TRUE(b);
  EXPECT_EQ(ipv4_string(b->host), "10.1.2.2");
  auto c = vif_addresses("192.168.0.6/30");  // .4/30: .5 and .6 usable
  ASSERT_TRUE(c);
  EXPECT_EQ(ipv4_string(c->host), "192.168.0.5");
  auto d = vif_addresses("172.16.9.9");  // no prefix: /24
  ASSERT_TRUE(d);
  EXPECT_EQ(d->prefix, 24u);
  EXPECT_EQ(ipv4_string(d->host), "172.16.9.1");
}

TEST(VifAddresses, AnythingButAHostAddressIsRefused) {
  for (const char* bad : {"", "10.1.2", "10.1.2.3.4", "10.1.2.256", "10.1.2.3/31", "10.1.2.3/0", "10.1.2.3/",
                          "10.1.2.0/24", "10.1.2.255/24", "010.1.2.3", "10.1.2.x", "10.1.2.3/24x", " 10.1.2.3"}) {
    EXPECT_FALSE(vif_addresses(bad)) << bad;
  }
}

TEST(RateNode, BytesCommaMicroseconds) {
  auto r = parse_rate_node("125000,50000");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->first, 125000u);
  EXPECT_EQ(r->second, 50000u);
  auto none = parse_rate_node("0,0");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->first, 0u);
  for (const char* bad : {"", "125000", "125000,", ",50000", "1,0", "-1,5", "1,2,3", "1.5,2"}) {
    EXPECT_FALSE(parse_rate_node(bad)) << bad;
  }
}

TEST(HostSideMac, IsFeFfThenTheDomidThenTheDevidEachBigEndian) {
  using Mac = std::array<std::uint8_t, 6>;
  EXPECT_EQ(host_side_mac(1, 0), (Mac{0xfe, 0xff, 0x00, 0x01, 0x00, 0x00}));
  EXPECT_EQ(host_side_mac(0x1234, 0xabcd), (Mac{0xfe, 0xff, 0x12, 0x34, 0xab, 0xcd}));
  EXPECT_EQ(host_side_mac(0x7ff0, 0x1ffff), (Mac{0xfe, 0xff, 0x7f, 0xf0, 0xff, 0xff}));  // devid's low 16 bits
  // Unicast (bit 0 clear) and locally administered (bit 1 set), for every vif.
  EXPECT_EQ(host_side_mac(7, 3)[0] & 0x03, 0x02);
  // Each (domid, devid) pair with a 16-bit devid has its own.
  std::set<Mac> seen;
  for (std::uint16_t dom : {1, 2, 256, 0x7fef}) {
    for (std::uint32_t dev : {0u, 1u, 255u, 256u, 0xffffu}) {
      EXPECT_TRUE(seen.insert(host_side_mac(dom, dev)).second) << dom << "/" << dev;
    }
  }
}

}  // namespace
}  // namespace xpv::netback
