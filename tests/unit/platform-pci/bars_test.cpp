#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "xpv/platform_pci/bars.h"

namespace xpv::platform_pci {
namespace {

std::uint32_t rd(kvm::BusDevice& d, std::uint64_t off, unsigned size) {
  std::uint8_t b[8];
  std::fill(std::begin(b), std::end(b), std::uint8_t{0xee});
  d.read(0, off, std::span(b, size));
  std::uint32_t v = 0;
  for (unsigned i = 0; i < size && i < 4; ++i) v |= std::uint32_t{b[i]} << (8 * i);
  return v;
}

void wr(kvm::BusDevice& d, std::uint64_t off, unsigned size, std::uint32_t v) {
  std::uint8_t b[8] = {};
  for (unsigned i = 0; i < size && i < 4; ++i) b[i] = static_cast<std::uint8_t>(v >> (8 * i));
  d.write(0, off, std::span<const std::uint8_t>(b, size));
}

TEST(PlatformIoBar, FlagsAtZeroLogAtEightZeroElsewhere) {
  std::vector<std::string> lines;
  UnplugConfig cfg;
  cfg.on_guest_log = [&](std::string_view l) { lines.emplace_back(l); };
  UnplugPorts ports(std::move(cfg));
  PlatformIoBar bar(ports);
  EXPECT_EQ(rd(bar, 0, 1), 0u);
  wr(bar, 0, 1, 0xff);
  EXPECT_EQ(rd(bar, 0, 1), kFlagRomLock);
  EXPECT_EQ(ports.platform_flags(), kFlagRomLock);  // the same byte as port 0x10
  for (char c : std::string("ok\n")) wr(bar, 8, 1, static_cast<std::uint8_t>(c));
  EXPECT_EQ(lines, std::vector<std::string>{"ok"});
  // Everything else: reads 0, writes dropped.
  EXPECT_EQ(rd(bar, 0, 2), 0u);
  EXPECT_EQ(rd(bar, 0, 4), 0u);
  EXPECT_EQ(rd(bar, 8, 1), 0u);
  EXPECT_EQ(rd(bar, 0xff, 1), 0u);
  wr(bar, 0, 2, 0);  // not a byte write: flags stay
  wr(bar, 8, 2, 0x0a41);
  wr(bar, 1, 1, 0xff);
  EXPECT_EQ(ports.platform_flags(), kFlagRomLock);
  EXPECT_EQ(lines.size(), 1u);
  EXPECT_EQ(ports.unplugged_mask(), 0);
}

TEST(PlatformMmioBar, ReadsZeroAndCounts) {
  PlatformMmioBar bar;
  EXPECT_EQ(rd(bar, 0, 4), 0u);
  EXPECT_EQ(rd(bar, PlatformMmioBar::kLength - 8, 8), 0u);
  wr(bar, 0x1000, 4, 0xdeadbeef);
  EXPECT_EQ(rd(bar, 0x1000, 4), 0u);
  EXPECT_EQ(bar.accesses(), 4u);
}

}  // namespace
}  // namespace xpv::platform_pci
