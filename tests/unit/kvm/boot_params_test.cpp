#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "xpv/kvm/boot_params.h"
#include "xpv/kvm/le.h"

namespace xpv::kvm {
namespace {

TEST(E820, SmallGuestHasLowRamReservedBiosAreaAndHighRam) {
  const auto map = build_e820(512ull << 20, 0);
  ASSERT_EQ(map.size(), 3u);
  EXPECT_EQ(map[0], (E820Entry{0, 0x9fc00, kE820Ram}));
  EXPECT_EQ(map[1], (E820Entry{0x9fc00, 0x100000 - 0x9fc00, kE820Reserved}));
  EXPECT_EQ(map[2], (E820Entry{0x100000, (512ull << 20) - 0x100000, kE820Ram}));
}

TEST(E820, GuestAboveThreeGiBGetsRamAboveFourGiB) {
  const auto map = build_e820(0xC000'0000, 1ull << 30);
  ASSERT_EQ(map.size(), 4u);
  EXPECT_EQ(map[2], (E820Entry{0x100000, 0xC000'0000 - 0x100000, kE820Ram}));
  EXPECT_EQ(map[3], (E820Entry{0x1'0000'0000, 1ull << 30, kE820Ram}));
}

TEST(BootParams, FieldsAtTheirDocumentedOffsets) {
  std::vector<std::uint8_t> zp(kZeroPageSize, 0xcc);
  BootParamsInput in;
  in.cmdline_gpa = 0x20000;
  in.cmdline_size = 42;
  in.initrd_gpa = 0x1'2345'6000;  // above 4 GiB: the ext_ fields carry the high half
  in.initrd_size = 0x0123'4567;
  in.e820 = build_e820(256ull << 20, 0);
  ASSERT_TRUE(build_boot_params(zp, in));
  std::span<const std::uint8_t> z(zp);
  EXPECT_EQ(le::load<std::uint16_t>(z, 0x1fe), 0xaa55);
  EXPECT_EQ(le::load<std::uint32_t>(z, 0x202), 0x53726448u);
  EXPECT_EQ(z[0x210], 0xff);
  EXPECT_EQ(z[0x211] & 0x81, 0x81);
  EXPECT_EQ(le::load<std::uint32_t>(z, 0x228), 0x20000u);
  EXPECT_EQ(le::load<std::uint32_t>(z, 0x238), 42u);
  EXPECT_EQ(le::load<std::uint32_t>(z, 0x218), 0x2345'6000u);
  EXPECT_EQ(le::load<std::uint32_t>(z, 0x0c0), 0x1u);
  EXPECT_EQ(le::load<std::uint32_t>(z, 0x21c), 0x0123'4567u);
  EXPECT_EQ(z[0x1e8], 3);
  EXPECT_EQ(le::load<std::uint64_t>(z, 0x2d0 + 20 * 2), 0x100000u);
  EXPECT_EQ(le::load<std::uint32_t>(z, 0x2d0 + 20 * 2 + 16), kE820Ram);
  EXPECT_EQ(z[0x100], 0);  // everything else zeroed
}

TEST(BootParams, CopiesTheKernelsSetupHeader) {
  std::vector<std::uint8_t> zp(kZeroPageSize);
  std::vector<std::uint8_t> hdr(0x26c - 0x1f1, 0);
  hdr[0x206 - 0x1f1] = 0x0f;
  hdr[0x207 - 0x1f1] = 0x02;
  hdr[0x22c - 0x1f1] = 0x11;  // initrd_addr_max low byte: must survive
  BootParamsInput in;
  in.setup_header = hdr;
  ASSERT_TRUE(build_boot_params(zp, in));
  EXPECT_EQ(le::load<std::uint16_t>(std::span<const std::uint8_t>(zp), 0x206), 0x020f);
  EXPECT_EQ(zp[0x22c], 0x11);
}

TEST(BootParams, RefusesBadInput) {
  std::vector<std::uint8_t> small(100);
  EXPECT_FALSE(build_boot_params(small, {}));
  std::vector<std::uint8_t> zp(kZeroPageSize);
  BootParamsInput in;
  in.e820.resize(kE820Max + 1);
  auto r = build_boot_params(zp, in);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("e820"), std::string::npos);
  BootParamsInput big;
  std::vector<std::uint8_t> hdr(0x200);
  big.setup_header = hdr;
  EXPECT_FALSE(build_boot_params(zp, big));
}

}  // namespace
}  // namespace xpv::kvm
