#include <gtest/gtest.h>

#include "xpv/kvm/pci_host.h"

namespace xpv::kvm {
namespace {

std::uint32_t cfg_read(PciHost& pci, unsigned dev, unsigned reg, unsigned size = 4, unsigned bus = 0) {
  std::uint32_t addr = 0x8000'0000u | (bus << 16) | (dev << 11) | (reg & 0xfc);
  pci.write(PciHost::kAddressPort, 0, std::span<const std::uint8_t>(reinterpret_cast<std::uint8_t*>(&addr), 4));
  std::uint8_t d[4] = {};
  pci.read(PciHost::kDataPort, reg & 3, std::span(d, size));
  std::uint32_t v = 0;
  for (unsigned i = 0; i < size; ++i) v |= std::uint32_t{d[i]} << (8 * i);
  return v;
}

TEST(PciHost, HostBridgeAtZeroAndAnEmptyBus) {
  PciHost pci;
  EXPECT_EQ(cfg_read(pci, 0, 0x00), 0x0d57'8086u);
  EXPECT_EQ(cfg_read(pci, 0, 0x00, 2), 0x8086u);
  EXPECT_EQ(cfg_read(pci, 0, 0x02, 2), 0x0d57u);
  EXPECT_EQ(cfg_read(pci, 0, 0x0b, 1), 0x06u);  // class: bridge
  EXPECT_EQ(cfg_read(pci, 3, 0x00), 0xffff'ffffu);  // empty slot
  EXPECT_EQ(cfg_read(pci, 0, 0x00, 4, 1), 0xffff'ffffu);  // no bus 1
}

TEST(PciHost, AddressRegisterReadsBackAndDisabledCyclesReadOnes) {
  PciHost pci;
  std::uint32_t addr = 0x8000'1800u;
  pci.write(PciHost::kAddressPort, 0, std::span<const std::uint8_t>(reinterpret_cast<std::uint8_t*>(&addr), 4));
  std::uint8_t d[4] = {};
  pci.read(PciHost::kAddressPort, 0, std::span(d, 4));
  EXPECT_EQ(d[1], 0x18);
  EXPECT_EQ(d[3], 0x80);
  addr = 0;  // enable bit clear: no config cycle
  pci.write(PciHost::kAddressPort, 0, std::span<const std::uint8_t>(reinterpret_cast<std::uint8_t*>(&addr), 4));
  pci.read(PciHost::kDataPort, 0, std::span(d, 4));
  EXPECT_EQ(d[0], 0xff);
}

struct FakeFn final : PciFunction {
  std::uint32_t config_read(unsigned offset, unsigned) noexcept override { return offset == 0 ? 0x0001'5853u : 0; }
  void config_write(unsigned, unsigned, std::uint32_t) noexcept override {}
};

TEST(PciHost, PlugsADeviceIntoAFreeSlotOnly) {
  PciHost pci;
  FakeFn fn;
  EXPECT_FALSE(pci.plug(0, &fn));  // the host bridge's
  EXPECT_FALSE(pci.plug(32, &fn));
  ASSERT_TRUE(pci.plug(3, &fn));
  EXPECT_FALSE(pci.plug(3, &fn));
  EXPECT_EQ(cfg_read(pci, 3, 0), 0x0001'5853u);
}

}  // namespace
}  // namespace xpv::kvm
