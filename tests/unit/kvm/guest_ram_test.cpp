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

TEST(GuestRam, RefusesBadSizes) {
  EXPECT_THROW(GuestRam(0), std::runtime_error);
  EXPECT_THROW(GuestRam(4097), std::runtime_error);
}

}  // namespace
}  // namespace xpv::kvm
