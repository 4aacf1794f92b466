#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "xpv/kvm/le.h"
#include "xpv/kvm/mptable.h"

namespace xpv::kvm {
namespace {

class MpTableTest : public ::testing::TestWithParam<unsigned> {};

TEST_P(MpTableTest, ChecksumsAndEntryCounts) {
  const unsigned n = GetParam();
  std::vector<std::uint8_t> area(4096, 0xee);
  MpTableInput in;
  in.vcpus = n;
  auto r = build_mptable(area, 0xf0000, in);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(*r, mptable_size(n));
  std::span<const std::uint8_t> a(area);
  EXPECT_EQ(std::memcmp(a.data(), "_MP_", 4), 0);
  EXPECT_EQ(le::load<std::uint32_t>(a, 4), 0xf0010u);
  EXPECT_EQ(mp_checksum(a.subspan(0, 16)), 0);
  auto tbl = a.subspan(16, *r - 16);
  EXPECT_EQ(std::memcmp(tbl.data(), "PCMP", 4), 0);
  EXPECT_EQ(le::load<std::uint16_t>(tbl, 4), tbl.size());
  EXPECT_EQ(mp_checksum(tbl), 0);
  EXPECT_EQ(le::load<std::uint16_t>(tbl, 34), n + 21);  // CPUs + 2 buses + IOAPIC + 16 IRQs + 2 LINTs
  EXPECT_EQ(le::load<std::uint32_t>(tbl, 36), kLapicAddress);
  // Processor entries: LAPIC ids 0..n-1, only the first is the BSP.
  for (unsigned i = 0; i < n; ++i) {
    const auto e = tbl.subspan(44 + i * 20, 20);
    EXPECT_EQ(e[0], 0);
    EXPECT_EQ(e[1], i);
    EXPECT_EQ(e[3], i == 0 ? 3 : 1);
  }
  // The IOAPIC entry follows the two buses and names the default address with id n.
  const auto io = tbl.subspan(44 + n * 20 + 16, 8);
  EXPECT_EQ(io[0], 2);
  EXPECT_EQ(io[1], n);
  EXPECT_EQ(le::load<std::uint32_t>(io, 4), kIoapicAddress);
  EXPECT_EQ(area[*r], 0xee);  // nothing written past the table
}

INSTANTIATE_TEST_SUITE_P(Vcpus, MpTableTest, ::testing::Values(1u, 2u, 7u, kMaxVcpus));

// The whole table for 1 vCPU, byte for byte after the processor entry: buses, IOAPIC, the 16 ISA
// entries, the PCI INTx entries, the local interrupts.
TEST(MpTable, PciInterruptEntriesExactBytes) {
  std::vector<std::uint8_t> area(4096, 0xee);
  MpTableInput in;
  in.vcpus = 1;
  in.pci_irqs = {MpPciIrq{3, 1, 16}, MpPciIrq{4, 2, 17}, MpPciIrq{31, 4, 23}};
  EXPECT_EQ(mptable_size(in), mptable_size(1, 3));
  EXPECT_EQ(mptable_size(1, 3), mptable_size(1) + 3 * 8);
  auto r = build_mptable(area, 0xf0000, in);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(*r, 16u + 44 + 20 + (21 + 3) * 8);
  std::span<const std::uint8_t> a(area);
  EXPECT_EQ(mp_checksum(a.subspan(0, 16)), 0);
  auto tbl = a.subspan(16, *r - 16);
  EXPECT_EQ(mp_checksum(tbl), 0);
  EXPECT_EQ(le::load<std::uint16_t>(tbl, 4), tbl.size());
  EXPECT_EQ(le::load<std::uint16_t>(tbl, 34), 1 + 21 + 3);
  EXPECT_EQ(area[*r], 0xee);

  std::vector<std::uint8_t> want;
  auto entry = [&](std::initializer_list<std::uint8_t> b) { want.insert(want.end(), b); };
  entry({1, 0, 'P', 'C', 'I', ' ', ' ', ' '});
  entry({1, 1, 'I', 'S', 'A', ' ', ' ', ' '});
  entry({2, 1, 0x11, 0x01, 0x00, 0x00, 0xc0, 0xfe});  // IOAPIC id 1 at 0xfec00000
  for (std::uint8_t irq = 0; irq < 16; ++irq) entry({3, 0, 0, 0, kMpBusIsa, irq, 1, irq});
  // type 3, INT, flags 0x000f (active low, level), PCI bus, (slot << 2) | (pin - 1), IOAPIC 1, pin
  entry({3, 0, 0x0f, 0x00, kMpBusPci, (3 << 2) | 0, 1, 16});
  entry({3, 0, 0x0f, 0x00, kMpBusPci, (4 << 2) | 1, 1, 17});
  entry({3, 0, 0x0f, 0x00, kMpBusPci, (31 << 2) | 3, 1, 23});
  entry({4, 3, 0, 0, kMpBusIsa, 0, 0, 0});     // ExtINT → BSP LINT0
  entry({4, 1, 0, 0, kMpBusIsa, 0, 0xff, 1});  // NMI → all LINT1
  const auto got = tbl.subspan(44 + 20);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "byte " << i << " of the entries";
}

TEST(MpTable, NoPciEntriesKeepsTheOldLayout) {
  std::vector<std::uint8_t> a(4096), b(4096);
  MpTableInput in;
  in.vcpus = 2;
  ASSERT_TRUE(build_mptable(a, 0xf0000, in));
  in.pci_irqs = {MpPciIrq{3, 1, 16}};
  ASSERT_TRUE(build_mptable(b, 0xf0000, in));
  // Everything up to the local interrupt entries is the same apart from the header's length,
  // checksum and entry count.
  const std::size_t entries = 16 + 44 + 2 * 20 + (2 + 1 + 16) * 8;
  for (std::size_t i = 16 + 44; i < entries; ++i) EXPECT_EQ(a[i], b[i]) << i;
  EXPECT_EQ(le::load<std::uint16_t>(std::span<const std::uint8_t>(a), 16 + 34), 2 + 21);
  EXPECT_EQ(le::load<std::uint16_t>(std::span<const std::uint8_t>(b), 16 + 34), 2 + 22);
}

TEST(MpTable, RefusesBadPciEntries) {
  std::vector<std::uint8_t> area(8192);
  const MpPciIrq bad[] = {{32, 1, 16}, {3, 0, 16}, {3, 5, 16}, {3, 1, 15}, {3, 1, 24}, {3, 1, 0}};
  for (const auto& p : bad) {
    MpTableInput in;
    in.pci_irqs = {p};
    auto r = build_mptable(area, 0xf0000, in);
    ASSERT_FALSE(r) << unsigned{p.slot} << " " << unsigned{p.pin} << " " << unsigned{p.ioapic_pin};
    EXPECT_NE(r.error().message.find("PCI interrupt"), std::string::npos);
  }
  MpTableInput dup;
  dup.pci_irqs = {MpPciIrq{3, 1, 16}, MpPciIrq{3, 2, 17}, MpPciIrq{3, 1, 18}};
  auto r = build_mptable(area, 0xf0000, dup);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("routed twice"), std::string::npos);
  // Two pins sharing one IOAPIC pin is fine (shared level-triggered lines).
  MpTableInput shared;
  shared.pci_irqs = {MpPciIrq{3, 1, 16}, MpPciIrq{4, 1, 16}};
  EXPECT_TRUE(build_mptable(area, 0xf0000, shared));
  MpTableInput many;
  many.pci_irqs.resize(kMaxPciIrqs + 1);
  EXPECT_FALSE(build_mptable(area, 0xf0000, many));
  // The area is sized for the PCI entries too.
  MpTableInput fits;
  fits.pci_irqs = {MpPciIrq{3, 1, 16}};
  std::vector<std::uint8_t> exact(mptable_size(1)), enough(mptable_size(fits));
  auto small = build_mptable(exact, 0xf0000, fits);
  ASSERT_FALSE(small);
  EXPECT_NE(small.error().message.find("needs"), std::string::npos);
  EXPECT_TRUE(build_mptable(enough, 0xf0000, fits));
}

TEST(MpTable, EveryPinOfEverySlotFits) {
  MpTableInput in;
  in.vcpus = kMaxVcpus;
  for (std::uint8_t slot = 0; slot < 32; ++slot) {
    for (std::uint8_t pin = 1; pin <= 4; ++pin) {
      in.pci_irqs.push_back(MpPciIrq{slot, pin, static_cast<std::uint8_t>(16 + (slot + pin) % 8)});
    }
  }
  std::vector<std::uint8_t> area(mptable_size(in));
  auto r = build_mptable(area, 0xf0000, in);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_LE(*r, 0x10000u);  // fits the 64 KiB reserved at 0xf0000
  std::span<const std::uint8_t> tbl = std::span<const std::uint8_t>(area).subspan(16);
  EXPECT_EQ(mp_checksum(tbl), 0);
  EXPECT_EQ(le::load<std::uint16_t>(tbl, 34), kMaxVcpus + 21 + kMaxPciIrqs);
}

TEST(MpTable, RefusesBadInput) {
  std::vector<std::uint8_t> area(4096);
  MpTableInput in;
  in.vcpus = 0;
  EXPECT_FALSE(build_mptable(area, 0xf0000, in));
  in.vcpus = kMaxVcpus + 1;
  EXPECT_FALSE(build_mptable(area, 0xf0000, in));
  in.vcpus = 2;
  std::vector<std::uint8_t> tiny(32);
  auto r = build_mptable(tiny, 0xf0000, in);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("needs"), std::string::npos);
  EXPECT_FALSE(build_mptable(area, 0xffff'ff00, in));  // would cross 4 GiB
}

}  // namespace
}  // namespace xpv::kvm
