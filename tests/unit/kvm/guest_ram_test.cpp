#include <gtest/gtest.h>
#include <sys/stat.h>

#include <stdexcept>

#include "xpv/kvm/guest_ram.h"

namespace xpv::kvm {
namespace {

TEST(GuestRam, SmallGuestIsOneRegionAtZero) {
  GuestRam ram(64ull << 20);
  ASSERT_EQ(ram.regions().size(), 1u);
  EXPECT_EQ(ram.regions()[0].gpa, 0u);
  EXPECT_EQ(ram.regions()[0].size, 64ull << 20);
  EXPECT_EQ(ram.low_end(), 64ull << 20);
  struct stat st {};
  ASSERT_EQ(fstat(ram.fd(), &st), 0);  // the memfd dom0 services will map
  EXPECT_EQ(static_cast<std::uint64_t>(st.st_size), 64ull << 20);
  auto s = ram.memory().translate((64ull << 20) - 8, 8);
  ASSERT_TRUE(s);
  (*s)[7] = 0x5a;
  EXPECT_FALSE(ram.memory().translate((64ull << 20) - 8, 9));
}

TEST(GuestRam, LargeGuestSkipsThePciHole) {
  GuestRam ram(kLowRamMax + (512ull << 20));  // sparse memfd: nothing is touched
  ASSERT_EQ(ram.regions().size(), 2u);
  EXPECT_EQ(ram.low_end(), kLowRamMax);
  const auto& hi = ram.regions()[1];
  EXPECT_EQ(hi.gpa, kHighRamBase);
  EXPECT_EQ(hi.size, 512ull << 20);
  EXPECT_EQ(hi.fd_offset, kLowRamMax);
  EXPECT_FALSE(ram.memory().translate(kLowRamMax, 1));  // the hole
  EXPECT_TRUE(ram.memory().translate(kHighRamBase, 4096));
  EXPECT_FALSE(ram.memory().translate(kLowRamMax - 4, 8));  // straddles the hole
}

TEST(GuestRam, DeviceMemoryFollowsRamInTheMemfd) {
  GuestRam ram(64ull << 20, {{0xf000'0000, 0x4000}, {0xfeff'0000, 0x2000}});
  EXPECT_EQ(ram.size(), 64ull << 20);
  EXPECT_EQ(ram.file_size(), (64ull << 20) + 0x6000);
  ASSERT_EQ(ram.regions().size(), 3u);
  EXPECT_EQ(ram.regions()[1].gpa, 0xf000'0000u);
  EXPECT_EQ(ram.regions()[1].fd_offset, 64ull << 20);
  EXPECT_EQ(ram.regions()[2].fd_offset, (64ull << 20) + 0x4000);
  auto page = ram.memory().translate(0xfeff'1000, 4096);
  ASSERT_TRUE(page);
  (*page)[0] = 0x5a;
  EXPECT_EQ(ram.regions()[2].host[0x1000], 0x5a);
  EXPECT_FALSE(ram.memory().translate(0xf000'4000, 1));  // past the grant frames
}

TEST(GuestRam, RefusesBadDeviceMemory) {
  EXPECT_THROW(GuestRam(64ull << 20, {{0x100'0000, 0x1000}}), std::runtime_error);        // inside RAM
  EXPECT_THROW(GuestRam(64ull << 20, {{0xf000'0800, 0x1000}}), std::runtime_error);       // unaligned
  EXPECT_THROW(GuestRam(64ull << 20, {{0xffff'f000, 0x2000}}), std::runtime_error);       // past 4 GiB
  EXPECT_THROW(GuestRam(64ull << 20, {{0xf000'0000, 0x2000}, {0xf000'1000, 0x1000}}), std::runtime_error);
  EXPECT_THROW(GuestRam(64ull << 20, {{0xf000'0000, 0}}), std::runtime_error);
}

TEST(GuestRam, RefusesBadSizes) {
  EXPECT_THROW(GuestRam(0), std::runtime_error);
  EXPECT_THROW(GuestRam(4097), std::runtime_error);
}

}  // namespace
}  // namespace xpv::kvm
