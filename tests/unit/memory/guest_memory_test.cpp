#include "xpv/guest_memory.h"

#include <gtest/gtest.h>

#include <array>
#include <stdexcept>

namespace xpv {
namespace {

struct TwoRegions : ::testing::Test {
  std::array<std::uint8_t, 2 * kPageSize> low{};
  std::array<std::uint8_t, kPageSize> high{};
  // low at gpa 0..8K, a hole, high at 1 MiB.
  GuestMemory mem{{{0x100000, high.size(), high.data()}, {0, low.size(), low.data()}}};
};

TEST_F(TwoRegions, TranslatesInsideARegion) {
  auto s = mem.translate(0x1000, 16);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->data(), low.data() + 0x1000);
  EXPECT_EQ(s->size(), 16u);
  auto h = mem.page(0x100);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->data(), high.data());
  EXPECT_EQ(h->size(), kPageSize);
}

TEST_F(TwoRegions, RefusesARangeThatCrossesTheEndOfARegion) {
  auto s = mem.translate(2 * kPageSize - 8, 16);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error(), MemError::out_of_range);
}

TEST_F(TwoRegions, RefusesTheHoleAndBelowAndAbove) {
  EXPECT_FALSE(mem.translate(0x3000, 1));
  EXPECT_FALSE(mem.page(2));
  EXPECT_FALSE(mem.translate(0x100000 + kPageSize, 1));
}

TEST_F(TwoRegions, RefusesLengthsThatWrapAround) {
  EXPECT_FALSE(mem.translate(0x10, UINT64_MAX));
  EXPECT_FALSE(mem.translate(UINT64_MAX, 2));
  EXPECT_FALSE(mem.page(UINT64_MAX));
}

TEST_F(TwoRegions, ZeroLengthAtTheEndIsAnEmptySpan) {
  auto s = mem.translate(low.size(), 0);
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->empty());
}

TEST(GuestMemory, OverlappingRegionsAreRejected) {
  std::array<std::uint8_t, 2 * kPageSize> buf{};
  EXPECT_THROW(GuestMemory({{0, 2 * kPageSize, buf.data()}, {kPageSize, kPageSize, buf.data()}}),
               std::invalid_argument);
  EXPECT_THROW(GuestMemory({{0, 0, buf.data()}}), std::invalid_argument);
}

}  // namespace
}  // namespace xpv
