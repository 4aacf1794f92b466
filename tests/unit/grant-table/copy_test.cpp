// GNTTABOP_copy-like copies between a granted page and a local buffer.
#include <array>
#include <numeric>

#include "fixture.h"

namespace xpv::gnttab::test {
namespace {

using CopyTest = GrantFixture;

TEST_F(CopyTest, CopyFromGranterReadsTheRightBytesAndReleasesThePin) {
  for (std::size_t i = 0; i < kFrameSize; ++i) ram_.page(9)[i] = static_cast<std::uint8_t>(i * 7);
  const GrantRef ref = grant(9, true);
  std::array<std::uint8_t, 300> buf{};
  ASSERT_TRUE(mapper_.copy_from(ref, 1000, buf));
  for (std::size_t i = 0; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], static_cast<std::uint8_t>((1000 + i) * 7)) << i;
  }
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::readonly);
  EXPECT_EQ(mapper_.pins(ref).readers, 0u);
  EXPECT_TRUE(granter_.end_access(ref));
}

TEST_F(CopyTest, CopyToGranterWritesExactlyTheRange) {
  const GrantRef ref = grant(10, false);
  std::array<std::uint8_t, 512> src{};
  std::iota(src.begin(), src.end(), std::uint8_t{1});
  ASSERT_TRUE(mapper_.copy_to(ref, kFrameSize - src.size(), src));  // ends exactly at the page end
  const auto page = ram_.page(10);
  for (std::size_t i = 0; i < kFrameSize - src.size(); ++i) ASSERT_EQ(page[i], 0x1a) << i;
  for (std::size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(page[kFrameSize - src.size() + i], src[i]) << i;
  }
  EXPECT_EQ(ram_.page(11)[0], 0x1b);
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access);
}

TEST_F(CopyTest, CopyIntoAReadonlyGrantIsRefusedAndThePageIsUnchanged) {
  const GrantRef ref = grant(3, true);
  std::array<std::uint8_t, 16> src{};
  auto r = mapper_.copy_to(ref, 0, src);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), Status::general_error);
  EXPECT_EQ(ram_.page(3)[0], 0x13);
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::readonly);
}

TEST_F(CopyTest, OffsetOrLengthBeyondThePageIsBadCopyArg) {
  const GrantRef ref = grant(3, false);
  std::array<std::uint8_t, kFrameSize + 1> big{};
  std::span<std::uint8_t> all(big);
  struct Case {
    std::uint32_t offset;
    std::size_t len;
  };
  for (Case c : {Case{4096, 1}, Case{4000, 97}, Case{5000, 0}, Case{0, 4097}, Case{UINT32_MAX, 1},
                 Case{1, 4096}}) {
    auto r = mapper_.copy_from(ref, c.offset, all.first(c.len));
    ASSERT_FALSE(r) << c.offset << "+" << c.len;
    EXPECT_EQ(r.error(), Status::bad_copy_arg) << c.offset << "+" << c.len;
    auto w = mapper_.copy_to(ref, c.offset, all.first(c.len));
    ASSERT_FALSE(w);
    EXPECT_EQ(w.error(), Status::bad_copy_arg);
  }
  // The edges that are allowed.
  EXPECT_TRUE(mapper_.copy_from(ref, 4096, all.first(0)));
  EXPECT_TRUE(mapper_.copy_from(ref, 0, all.first(4096)));
  EXPECT_TRUE(mapper_.copy_from(ref, 4095, all.first(1)));
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access);
}

TEST_F(CopyTest, CopyChecksRefAndDomidLikeMap) {
  std::array<std::uint8_t, 8> buf{};
  auto bad = mapper_.copy_from(static_cast<GrantRef>(kEntriesPerFrame), 0, buf);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error(), Status::bad_gntref);
  const GrantRef other = grant(1, false, /*to=*/9);
  auto wrong = mapper_.copy_from(other, 0, buf);
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error(), Status::general_error);
  const GrantRef outside = grant(kRamPages + 1, false);
  auto page = mapper_.copy_to(outside, 0, buf);
  ASSERT_FALSE(page);
  EXPECT_EQ(page.error(), Status::bad_page);
  EXPECT_EQ(flags_of(table_, outside), gtf::permit_access);
}

TEST_F(CopyTest, BatchedCopyReportsEachOpAndMovesDataBothWays) {
  const GrantRef rw = grant(12, false);
  const GrantRef ro = grant(13, true);
  std::array<std::uint8_t, 512> in1{}, in2{}, out{};
  out.fill(0xee);
  std::array<CopyOp, 6> ops = {
      CopyOp::from_granter(rw, 0, in1),                  // ok
      CopyOp::to_granter(rw, 512, out),                  // ok: same ref, upgrade to a write pin
      CopyOp::from_granter(rw, 4000, in2),               // bad_copy_arg
      CopyOp::to_granter(ro, 0, out),                    // general_error: read-only grant
      CopyOp::from_granter(ro, 3584, in2),               // ok
      CopyOp::from_granter(UINT32_MAX, 0, in1),          // bad_gntref
  };
  EXPECT_EQ(mapper_.copy(ops), 3u);
  EXPECT_EQ(ops[0].status, Status::okay);
  EXPECT_EQ(ops[1].status, Status::okay);
  EXPECT_EQ(ops[2].status, Status::bad_copy_arg);
  EXPECT_EQ(ops[3].status, Status::general_error);
  EXPECT_EQ(ops[4].status, Status::okay);
  EXPECT_EQ(ops[5].status, Status::bad_gntref);
  EXPECT_EQ(in1[0], 0x1c);
  EXPECT_EQ(in1[511], 0x1c);
  EXPECT_EQ(ram_.page(12)[511], 0x1c);
  EXPECT_EQ(ram_.page(12)[512], 0xee);
  EXPECT_EQ(ram_.page(12)[1023], 0xee);
  EXPECT_EQ(ram_.page(12)[1024], 0x1c);
  EXPECT_EQ(in2[0], 0x1d);
  EXPECT_EQ(ram_.page(13)[0], 0x1d);
  // Every transient pin is gone.
  EXPECT_EQ(flags_of(table_, rw), gtf::permit_access);
  EXPECT_EQ(flags_of(table_, ro), gtf::permit_access | gtf::readonly);
  EXPECT_EQ(mapper_.pins(rw).readers + mapper_.pins(rw).writers, 0u);
}

TEST_F(CopyTest, CopyWhileMappedKeepsTheMappingsPin) {
  const GrantRef ref = grant(14, false);
  auto m = mapper_.map(ref, true);
  ASSERT_TRUE(m);
  std::array<std::uint8_t, 4> src = {1, 2, 3, 4};
  ASSERT_TRUE(mapper_.copy_to(ref, 8, src));  // transient write pin on top of the read mapping
  EXPECT_EQ(m->data()[8], 1);
  EXPECT_EQ(m->data()[11], 4);
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::reading);
  EXPECT_EQ(mapper_.pins(ref).readers, 1u);
  EXPECT_EQ(mapper_.pins(ref).writers, 0u);
  ASSERT_TRUE(mapper_.unmap(*m));
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access);
}

}  // namespace
}  // namespace xpv::gnttab::test
