#include <gtest/gtest.h>

#include <cstring>
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
