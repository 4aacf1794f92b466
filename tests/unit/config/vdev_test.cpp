#include <gtest/gtest.h>

#include "xpv/config/vdev.h"

namespace xpv::config {
namespace {

std::uint32_t id(std::string_view n) {
  auto v = parse_vdev(n);
  EXPECT_TRUE(v) << n;
  return v ? v->devid : 0;
}

TEST(Vdev, XvdNumbersAsXenDoes) {
  EXPECT_EQ(id("xvda"), 51712u);
  EXPECT_EQ(id("xvdb"), 51728u);
  EXPECT_EQ(id("xvda1"), 51713u);
  EXPECT_EQ(id("xvdp15"), (202u << 8) | (15u << 4) | 15u);
  // Past 16 disks or 15 partitions: the extended scheme.
  EXPECT_EQ(id("xvdq"), (1u << 28) | (16u << 8));
  EXPECT_EQ(id("xvda16"), (1u << 28) | 16u);
  EXPECT_EQ(id("xvdaa"), (1u << 28) | (26u << 8));
  EXPECT_EQ(id("d0p1"), 51713u);
  EXPECT_EQ(id("d26"), (1u << 28) | (26u << 8));
}

TEST(Vdev, IdeAndScsiNames) {
  EXPECT_EQ(id("hda"), 3u << 8);
  EXPECT_EQ(id("hdb1"), (3u << 8) | (1u << 6) | 1u);
  EXPECT_EQ(id("hdc"), 22u << 8);
  EXPECT_EQ(id("sda"), 8u << 8);
  EXPECT_EQ(id("sdb2"), (8u << 8) | (1u << 4) | 2u);
}

TEST(Vdev, CanonicalNames) {
  EXPECT_EQ(parse_vdev("xvdaa")->name, "xvdaa");
  EXPECT_EQ(parse_vdev("d1p3")->name, "xvdb3");
  EXPECT_EQ(xvd_name(51712), "xvda");
  EXPECT_EQ(xvd_name(51745), "xvdc1");
  EXPECT_EQ(xvd_name((1u << 28) | (27u << 8) | 2u), "xvdab2");
  EXPECT_FALSE(xvd_name(8u << 8));
}

// Found by tests/fuzz/config: disks from 475254 on have five-letter names, which xvd_name()
// gave (`xpv block-list`) but parse_vdev() refused (`xpv block-detach` of that name).
TEST(Vdev, EveryNameXvdNameGivesParsesBack) {
  EXPECT_EQ(id("xvdzzzz"), (1u << 28) | (475253u << 8));
  EXPECT_EQ(id("xvdaaaaa"), (1u << 28) | (475254u << 8));
  EXPECT_EQ(xvd_name((1u << 28) | (475254u << 8) | 3u), "xvdaaaaa3");
  for (const std::uint32_t disk : {475253u, 475254u, 500000u, 1048575u}) {
    const auto name = xvd_name((1u << 28) | (disk << 8));
    ASSERT_TRUE(name) << disk;
    EXPECT_EQ(id(*name), (1u << 28) | (disk << 8)) << *name;
    EXPECT_EQ(parse_vdev("d" + std::to_string(disk))->name, *name);
  }
}

TEST(Vdev, RejectsWhatIsNotADiskName) {
  for (const char* bad : {"", "xvd", "xvdA", "xvda0x", "xvda01", "hde", "hda64", "sdq", "sda16",
                          "vda", "d", "dp1", "d1p", "xvdzzzzz", "xvda256", "d1048576"}) {
    EXPECT_FALSE(parse_vdev(bad)) << bad;
  }
}

}  // namespace
}  // namespace xpv::config
