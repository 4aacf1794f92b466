#include <gtest/gtest.h>

#include <vector>

#include "xpv/kvm/io_bus.h"

namespace xpv::kvm {
namespace {

struct Recorder final : BusDevice {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> reads, writes;  // (base, offset)
  void read(std::uint64_t base, std::uint64_t offset, std::span<std::uint8_t> d) noexcept override {
    reads.emplace_back(base, offset);
    for (auto& b : d) b = static_cast<std::uint8_t>(offset);
  }
  void write(std::uint64_t base, std::uint64_t offset, std::span<const std::uint8_t>) noexcept override {
    writes.emplace_back(base, offset);
  }
};

TEST(IoBus, DispatchesByRangeWithOffsets) {
  IoBus bus("pio");
  Recorder a, b;
  ASSERT_TRUE(bus.add(0x3f8, 8, &a, "com1"));
  ASSERT_TRUE(bus.add(0x60, 1, &b, "kbd"));
  std::uint8_t d[2] = {};
  EXPECT_TRUE(bus.read(0x3fd, std::span(d, 1)));
  EXPECT_EQ(d[0], 5);
  EXPECT_TRUE(bus.write(0x60, std::span<const std::uint8_t>(d, 1)));
  EXPECT_EQ(a.reads, (std::vector<std::pair<std::uint64_t, std::uint64_t>>{{0x3f8, 5}}));
  EXPECT_EQ(b.writes, (std::vector<std::pair<std::uint64_t, std::uint64_t>>{{0x60, 0}}));
  EXPECT_EQ(bus.unclaimed(), 0u);
}

TEST(IoBus, UnclaimedReadsAllOnesAndIsCounted) {
  IoBus bus("pio");
  Recorder a;
  ASSERT_TRUE(bus.add(0x3f8, 8, &a, "com1"));
  std::uint8_t d[4] = {};
  EXPECT_FALSE(bus.read(0x2f8, std::span(d, 4)));
  EXPECT_EQ(d[0], 0xff);
  EXPECT_EQ(d[3], 0xff);
  EXPECT_FALSE(bus.write(0x3ff, std::span<const std::uint8_t>(d, 2)));  // crosses the range end
  EXPECT_FALSE(bus.read(0x3f7, std::span(d, 2)));                       // starts before it
  EXPECT_EQ(bus.unclaimed(), 3u);
  EXPECT_TRUE(a.reads.empty());
  EXPECT_TRUE(a.writes.empty());
}

TEST(IoBus, RefusesOverlapsAndEmptyRanges) {
  IoBus bus("mmio");
  Recorder a;
  ASSERT_TRUE(bus.add(0x1000, 0x100, &a, "one"));
  auto r = bus.add(0x10ff, 2, &a, "two");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("overlaps one"), std::string::npos);
  EXPECT_FALSE(bus.add(0x0f00, 0x101, &a, "three"));
  EXPECT_FALSE(bus.add(0x5000, 0, &a, "empty"));
  EXPECT_FALSE(bus.add(~0ull, 2, &a, "wraps"));
  EXPECT_FALSE(bus.add(0x6000, 1, nullptr, "null"));
  EXPECT_TRUE(bus.add(0x1100, 1, &a, "adjacent"));
}

}  // namespace
}  // namespace xpv::kvm
