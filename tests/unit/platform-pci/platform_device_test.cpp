#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "xpv/kvm/pci_host.h"
#include "xpv/platform_pci/platform_device.h"

namespace xpv::platform_pci {
namespace {

struct Moves {
  std::vector<std::pair<unsigned, std::uint32_t>> seen;
};

PlatformDeviceConfig config(Moves* moves = nullptr) {
  PlatformDeviceConfig c;
  c.io_base = 0xc000;
  c.mmio_base = 0xf000'0000;
  c.gsi = 17;
  if (moves) c.on_bar_moved = [moves](unsigned bar, std::uint32_t base) { moves->seen.emplace_back(bar, base); };
  return c;
}

// The whole expected header, byte by byte (PCI 3.0 §6.1, type 0), for config() above.
std::array<std::uint8_t, 256> expected_image() {
  std::array<std::uint8_t, 256> e{};
  const std::pair<unsigned, std::uint8_t> bytes[] = {
      {0x00, 0x53}, {0x01, 0x58},                // vendor 0x5853
      {0x02, 0x01}, {0x03, 0x00},                // device 0x0001
      {0x04, 0x03}, {0x05, 0x00},                // command: I/O + memory decode
      {0x06, 0x00}, {0x07, 0x00},                // status
      {0x08, 0x01},                              // revision 1
      {0x09, 0x00}, {0x0a, 0x80}, {0x0b, 0xff},  // class ff/80/00
      {0x0e, 0x00},                              // header type 0
      {0x10, 0x01}, {0x11, 0xc0},                // BAR0 = 0xc000 | I/O
      {0x14, 0x08}, {0x17, 0xf0},                // BAR1 = 0xf0000000 | prefetchable
      {0x2c, 0x53}, {0x2d, 0x58}, {0x2e, 0x01}, {0x2f, 0x00},  // subsystem 5853:0001
      {0x3c, 17},                                // interrupt line = GSI
      {0x3d, 0x01},                              // interrupt pin INTA
  };
  for (auto [off, v] : bytes) e[off] = v;
  return e;
}

TEST(XenPlatformDevice, EveryHeaderByteAtSizes124) {
  XenPlatformDevice dev(config());
  const auto e = expected_image();
  for (unsigned off = 0; off < 256; ++off) {
    EXPECT_EQ(dev.config_read(off, 1), e[off]) << "offset " << off;
    if (off % 2 == 0) {
      EXPECT_EQ(dev.config_read(off, 2), e[off] | (e[off + 1] << 8)) << "offset " << off;
    }
    if (off % 4 == 0) {
      const std::uint32_t want = e[off] | (e[off + 1] << 8) | (e[off + 2] << 16) | (std::uint32_t{e[off + 3]} << 24);
      EXPECT_EQ(dev.config_read(off, 4), want) << "offset " << off;
    }
  }
  // The same fields as dwords, spelled out.
  EXPECT_EQ(dev.config_read(0x00, 4), 0x0001'5853u);
  EXPECT_EQ(dev.config_read(0x08, 4), 0xff80'0001u);
  EXPECT_EQ(dev.config_read(0x10, 4), 0x0000'c001u);
  EXPECT_EQ(dev.config_read(0x14, 4), 0xf000'0008u);
  EXPECT_EQ(dev.config_read(0x2c, 4), 0x0001'5853u);
  EXPECT_EQ(dev.config_read(0x3c, 4), 0x0000'0111u);
  EXPECT_EQ(dev.command(), 0x0003);
  EXPECT_TRUE(dev.io_decode());
  EXPECT_TRUE(dev.mmio_decode());
  EXPECT_EQ(dev.bar_base(0), 0xc000u);
  EXPECT_EQ(dev.bar_base(1), 0xf000'0000u);
  EXPECT_EQ(dev.bar_base(2), 0u);
  EXPECT_EQ(dev.gsi(), 17);
  EXPECT_EQ(dev.bad_accesses(), 0u);
}

// Linux's __pci_read_base: decode off, save, write all-ones, read the mask, restore, decode on.
std::uint32_t size_bar(XenPlatformDevice& dev, unsigned reg) {
  const std::uint32_t cmd = dev.config_read(0x04, 2);
  dev.config_write(0x04, 2, cmd & ~0x3u);
  const std::uint32_t orig = dev.config_read(reg, 4);
  dev.config_write(reg, 4, 0xffff'ffffu);
  const std::uint32_t mask = dev.config_read(reg, 4);
  dev.config_write(reg, 4, orig);
  EXPECT_EQ(dev.config_read(reg, 4), orig);
  dev.config_write(0x04, 2, cmd);
  return mask;
}

TEST(XenPlatformDevice, BarSizingReturnsTheSizeMaskWithTypeBits) {
  Moves moves;
  XenPlatformDevice dev(config(&moves));
  const std::uint32_t io = size_bar(dev, 0x10);
  EXPECT_EQ(io, 0x0000'ff01u);
  EXPECT_EQ((~(io & 0xffff'fffcu) & 0xffffu) + 1, kIoBarSize);  // 16-bit decoder: size 0x100
  const std::uint32_t mem = size_bar(dev, 0x14);
  EXPECT_EQ(mem, 0xff00'0008u);
  EXPECT_EQ(~(mem & 0xffff'fff0u) + 1, kMmioBarSize);
  EXPECT_TRUE(moves.seen.empty());  // sizing and restoring is not a move
  EXPECT_EQ(dev.bar_base(0), 0xc000u);
  EXPECT_EQ(dev.bar_base(1), 0xf000'0000u);
  EXPECT_EQ(dev.bar_moves(), 0u);
  EXPECT_EQ(dev.command(), 0x0003);
}

TEST(XenPlatformDevice, UnimplementedBarsAndRomReadZeroAfterSizing) {
  XenPlatformDevice dev(config());
  for (unsigned reg : {0x18u, 0x1cu, 0x20u, 0x24u, 0x30u}) {
    dev.config_write(reg, 4, 0xffff'ffffu);
    EXPECT_EQ(dev.config_read(reg, 4), 0u) << reg;
  }
}

TEST(XenPlatformDevice, BarWritesAreAcceptedAndReported) {
  Moves moves;
  XenPlatformDevice dev(config(&moves));
  dev.config_write(0x10, 4, 0x0000'd000u);
  EXPECT_EQ(dev.config_read(0x10, 4), 0x0000'd001u);
  dev.config_write(0x10, 4, 0x0000'd0feu);  // low bits are read-only: same base, no report
  EXPECT_EQ(dev.config_read(0x10, 4), 0x0000'd001u);
  dev.config_write(0x10, 4, 0x1234'e000u);  // bits 31:16 hardwired to 0
  EXPECT_EQ(dev.config_read(0x10, 4), 0x0000'e001u);
  dev.config_write(0x14, 4, 0xfe00'0000u);
  EXPECT_EQ(dev.config_read(0x14, 4), 0xfe00'0008u);
  dev.config_write(0x17, 1, 0xe0);  // a byte write to the top of BAR1
  EXPECT_EQ(dev.config_read(0x14, 4), 0xe000'0008u);
  dev.config_write(0x14, 2, 0xffff);  // bits 15:0 are read-only: nothing changes
  EXPECT_EQ(dev.config_read(0x14, 4), 0xe000'0008u);
  const std::vector<std::pair<unsigned, std::uint32_t>> want = {
      {0, 0xd000}, {0, 0xe000}, {1, 0xfe00'0000u}, {1, 0xe000'0000u}};
  EXPECT_EQ(moves.seen, want);
  EXPECT_EQ(dev.bar_base(0), 0xe000u);
  EXPECT_EQ(dev.bar_base(1), 0xe000'0000u);
  EXPECT_EQ(dev.bar_moves(), 4u);
}

TEST(XenPlatformDevice, CommandBitsWritableStatusReadOnly) {
  XenPlatformDevice dev(config());
  dev.config_write(0x04, 4, 0xffff'ffffu);
  EXPECT_EQ(dev.config_read(0x04, 4), 0x0000'0003u);
  dev.config_write(0x04, 2, 0x0000);
  EXPECT_EQ(dev.command(), 0);
  EXPECT_FALSE(dev.io_decode());
  EXPECT_FALSE(dev.mmio_decode());
  dev.config_write(0x04, 1, 0x02);
  EXPECT_EQ(dev.command(), 0x0002);
  EXPECT_TRUE(dev.mmio_decode());
  dev.config_write(0x06, 2, 0xffff);  // status: nothing to set or clear
  EXPECT_EQ(dev.config_read(0x06, 2), 0u);
  dev.config_write(0x05, 1, 0xff);  // command bits 15:8 are reserved/unimplemented
  EXPECT_EQ(dev.command(), 0x0002);
}

TEST(XenPlatformDevice, ReadOnlyFieldsIgnoreWritesInterruptLineIsScratch) {
  XenPlatformDevice dev(config());
  const auto e = expected_image();
  for (unsigned reg = 0; reg < 256; reg += 4) {
    if (reg == 0x04 || reg == 0x10 || reg == 0x14 || reg == 0x3c) continue;
    dev.config_write(reg, 4, 0xffff'ffffu);
    dev.config_write(reg, 2, 0x5a5a);
    dev.config_write(reg + 3, 1, 0xa5);
  }
  for (unsigned off = 0; off < 256; ++off) {
    if ((off >= 0x04 && off < 0x08) || (off >= 0x10 && off < 0x18) || off == 0x3c) continue;
    EXPECT_EQ(dev.config_read(off, 1), e[off]) << off;
  }
  dev.config_write(0x3c, 4, 0xffff'ff0bu);  // line is writable, pin/min_gnt/max_lat are not
  EXPECT_EQ(dev.config_read(0x3c, 4), 0x0000'010bu);
  EXPECT_EQ(dev.interrupt_line(), 0x0b);
  EXPECT_EQ(dev.gsi(), 17);  // the wiring does not change with the scratch byte
}

TEST(XenPlatformDevice, BadSizesAndOffsetsReadOnesAndAreDropped) {
  XenPlatformDevice dev(config());
  const std::pair<unsigned, unsigned> bad[] = {{0x00, 0}, {0x00, 3}, {0x00, 8}, {0x03, 2},
                                               {0x02, 4}, {0x11, 4}, {256, 1}, {300, 4}};
  for (auto [off, size] : bad) {
    EXPECT_EQ(dev.config_read(off, size), 0xffff'ffffu) << off << "/" << size;
    dev.config_write(off, size, 0);
  }
  EXPECT_EQ(dev.bad_accesses(), 2 * std::size(bad));
  EXPECT_EQ(dev.config_read(0x00, 4), 0x0001'5853u);
  EXPECT_EQ(dev.config_read(0x10, 4), 0x0000'c001u);
  EXPECT_EQ(dev.command(), 0x0003);
}

TEST(XenPlatformDevice, RefusesBadConfiguration) {
  auto make = [](std::uint16_t io, std::uint32_t mmio, std::uint8_t gsi) {
    PlatformDeviceConfig c;
    c.io_base = io;
    c.mmio_base = mmio;
    c.gsi = gsi;
    return XenPlatformDevice(c).bar_base(0);
  };
  EXPECT_THROW(make(0, 0xf000'0000u, 16), std::invalid_argument);
  EXPECT_THROW(make(0xc010, 0xf000'0000u, 16), std::invalid_argument);
  EXPECT_THROW(make(0xc000, 0, 16), std::invalid_argument);
  EXPECT_THROW(make(0xc000, 0xf010'0000u, 16), std::invalid_argument);
  EXPECT_THROW(make(0xc000, 0xf000'0000u, 255), std::invalid_argument);
  EXPECT_EQ(make(0xff00, 0xfe00'0000u, 23), 0xff00u);  // the last 256 ports are fine
}

// Through the real PCI host (configuration mechanism #1), as Linux's conf1 accessors do it.
std::uint32_t conf1_read(kvm::PciHost& pci, unsigned dev, unsigned reg, unsigned size) {
  const std::uint32_t addr = 0x8000'0000u | (dev << 11) | (reg & 0xfc);
  std::uint8_t a[4];
  for (unsigned i = 0; i < 4; ++i) a[i] = static_cast<std::uint8_t>(addr >> (8 * i));
  pci.write(kvm::PciHost::kAddressPort, 0, std::span<const std::uint8_t>(a, 4));
  std::uint8_t d[4] = {};
  pci.read(kvm::PciHost::kDataPort, reg & 3, std::span(d, size));
  std::uint32_t v = 0;
  for (unsigned i = 0; i < size; ++i) v |= std::uint32_t{d[i]} << (8 * i);
  return v;
}

void conf1_write(kvm::PciHost& pci, unsigned dev, unsigned reg, unsigned size, std::uint32_t v) {
  const std::uint32_t addr = 0x8000'0000u | (dev << 11) | (reg & 0xfc);
  std::uint8_t a[4], d[4];
  for (unsigned i = 0; i < 4; ++i) {
    a[i] = static_cast<std::uint8_t>(addr >> (8 * i));
    d[i] = static_cast<std::uint8_t>(v >> (8 * i));
  }
  pci.write(kvm::PciHost::kAddressPort, 0, std::span<const std::uint8_t>(a, 4));
  pci.write(kvm::PciHost::kDataPort, reg & 3, std::span<const std::uint8_t>(d, size));
}

TEST(XenPlatformDevice, ThroughThePciHost) {
  kvm::PciHost pci;
  XenPlatformDevice dev(config());
  ASSERT_TRUE(pci.plug(3, &dev));
  EXPECT_EQ(conf1_read(pci, 3, 0x00, 4), 0x0001'5853u);
  EXPECT_EQ(conf1_read(pci, 3, 0x02, 2), 0x0001u);
  EXPECT_EQ(conf1_read(pci, 3, 0x0b, 1), 0xffu);
  EXPECT_EQ(conf1_read(pci, 3, 0x0a, 2), 0xff80u);
  EXPECT_EQ(conf1_read(pci, 3, 0x3d, 1), 1u);
  conf1_write(pci, 3, 0x14, 4, 0xffff'ffffu);
  EXPECT_EQ(conf1_read(pci, 3, 0x14, 4), 0xff00'0008u);
  conf1_write(pci, 3, 0x14, 4, 0xf000'0008u);
  EXPECT_EQ(conf1_read(pci, 3, 0x14, 4), 0xf000'0008u);
  EXPECT_EQ(dev.bar_moves(), 0u);
}

TEST(XenPlatformDevice, ConcurrentSizingAndReadsStayConsistent) {
  Moves moves;  // must stay empty: only sizing/restore cycles happen
  XenPlatformDevice dev(config(&moves));
  std::atomic<unsigned> bad{0};
  constexpr unsigned kThreads = 4, kIters = 2000;
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (unsigned i = 0; i < kIters; ++i) {
        if (t % 2 == 0) {
          dev.config_write(0x14, 4, 0xffff'ffffu);
          dev.config_write(0x14, 4, 0xf000'0008u);
        } else {
          const std::uint32_t bar = dev.config_read(0x14, 4);
          if (bar != 0xf000'0008u && bar != 0xff00'0008u) bad.fetch_add(1);
          if (dev.config_read(0x00, 4) != 0x0001'5853u) bad.fetch_add(1);
          if (dev.bar_base(1) != 0xf000'0000u) bad.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_TRUE(moves.seen.empty());
  EXPECT_EQ(dev.config_read(0x14, 4), 0xf000'0008u);
}

}  // namespace
}  // namespace xpv::platform_pci
