#include <gtest/gtest.h>

#include <regex>

#include "xpv/toolstack/allocation.h"
#include "xpv/toolstack/error.h"

namespace xpv::toolstack {
namespace {

TEST(Allocation, PickDomidLowestFree) {
  EXPECT_EQ(pick_domid({}), 1);
  EXPECT_EQ(pick_domid({1, 2, 4}), 3);
  EXPECT_EQ(pick_domid({0, 1}), 2);  // 0 is dom0, never handed out
  std::set<std::uint16_t> all;
  for (std::uint32_t d = 1; d <= kLastDomid; ++d) all.insert(static_cast<std::uint16_t>(d));
  EXPECT_EQ(pick_domid(all), std::nullopt);
  all.erase(32751);
  EXPECT_EQ(pick_domid(all), 32751);
}

TEST(Allocation, ParseDomid) {
  EXPECT_EQ(parse_domid("7"), 7);
  EXPECT_EQ(parse_domid("0"), 0);
  EXPECT_EQ(parse_domid("32751"), 32751);
  EXPECT_EQ(parse_domid("32752"), std::nullopt);  // DOMID_FIRST_RESERVED and up
  for (const char* bad : {"", "07", "+7", "-1", "7x", " 7", "web1", "99999999999"}) {
    EXPECT_EQ(parse_domid(bad), std::nullopt) << bad;
  }
}

TEST(Allocation, ParseDevid) {
  EXPECT_EQ(parse_devid("51712"), 51712u);
  EXPECT_EQ(parse_devid("0"), 0u);
  EXPECT_EQ(parse_devid("2147483647"), 2147483647u);
  for (const char* bad : {"", "01", "2147483648", "1a", "-0"}) EXPECT_EQ(parse_devid(bad), std::nullopt) << bad;
}

TEST(Allocation, VifDevid) {
  EXPECT_EQ(pick_vif_devid({}), 0u);
  EXPECT_EQ(pick_vif_devid({0, 1, 3}), 2u);
}

TEST(Allocation, GeneratedMacAvoidsUsed) {
  std::uint8_t next = 0;
  auto counter = [&] { return next++; };
  // First candidate would be 00:16:3e:00:01:02; mark it used, the next is 00:16:3e:03:04:05.
  const auto m = generate_mac({"00:16:3e:00:01:02"}, counter);
  EXPECT_EQ(m.str(), "00:16:3e:03:04:05");
  auto stuck = [] { return std::uint8_t{7}; };
  EXPECT_THROW(generate_mac({"00:16:3e:07:07:07"}, stuck), ToolstackError);
}

TEST(Allocation, UuidIsVersion4) {
  std::uint8_t b = 0xff;
  const auto u = generate_uuid([&] { return b; });
  EXPECT_EQ(u, "ffffffff-ffff-4fff-bfff-ffffffffffff");
  const auto r = generate_uuid(system_random_byte);
  EXPECT_TRUE(std::regex_match(r, std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"))) << r;
}

}  // namespace
}  // namespace xpv::toolstack
