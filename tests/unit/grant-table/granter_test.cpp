// The granting (frontend) side: ref allocation, publication, revocation, growth and limits.
#include <stdexcept>

#include "fixture.h"

namespace xpv::gnttab::test {
namespace {

using GranterTest = GrantFixture;

TEST_F(GranterTest, FirstGrantSkipsReservedRefsAndPublishesTheEntry) {
  auto r = granter_.grant_access(kBack, 3, /*readonly=*/false);
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, kNrReservedEntries);  // 0..7 are reserved
  auto e = granter_.entry(*r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->flags, gtf::permit_access);
  EXPECT_EQ(e->domid, kBack);
  EXPECT_EQ(e->frame, 3u);
  EXPECT_EQ(granter_.in_use(), 1u);
  EXPECT_EQ(granter_.capacity(), kEntriesPerFrame);
  EXPECT_FALSE(granter_.is_mapped(*r));
}

TEST_F(GranterTest, ReadonlyGrantCarriesTheReadonlyFlag) {
  const GrantRef ref = grant(4, /*readonly=*/true, /*to=*/7);
  auto e = granter_.entry(ref);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->flags, gtf::permit_access | gtf::readonly);
  EXPECT_EQ(e->domid, 7);
}

TEST_F(GranterTest, EndAccessClearsFlagsAndFreesTheRef) {
  const GrantRef ref = grant(2, false);
  ASSERT_TRUE(granter_.end_access(ref));
  EXPECT_EQ(flags_of(table_, ref), 0);
  EXPECT_EQ(granter_.in_use(), 0u);
  // A second end_access on the now-free ref is refused.
  auto again = granter_.end_access(ref);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error(), Status::bad_gntref);
}

TEST_F(GranterTest, FreeListIsFifoSoARevokedRefIsNotReusedAtOnce) {
  const GrantRef a = grant(1, false);
  ASSERT_TRUE(granter_.end_access(a));
  const GrantRef b = grant(1, false);
  EXPECT_NE(a, b);
  EXPECT_EQ(b, a + 1);
}

TEST_F(GranterTest, FullTableReturnsNoSpaceUntilARefIsFreed) {
  const std::size_t usable = kEntriesPerFrame - kNrReservedEntries;  // 504
  for (std::size_t i = 0; i < usable; ++i) {
    ASSERT_TRUE(granter_.grant_access(kBack, i % kRamPages, false)) << i;
  }
  EXPECT_EQ(granter_.in_use(), usable);
  auto full = granter_.grant_access(kBack, 0, false);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error(), Status::no_space);
  ASSERT_TRUE(granter_.end_access(100));
  auto again = granter_.grant_access(kBack, 0, false);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, 100u);
}

TEST_F(GranterTest, AddFrameGrowsTheTableUpToTheFrameLimit) {
  for (std::size_t i = 1; i < kTableFrames; ++i) ASSERT_TRUE(granter_.add_frame(table_.page(i)));
  EXPECT_EQ(granter_.frame_count(), kTableFrames);
  EXPECT_EQ(granter_.capacity(), kTableFrames * kEntriesPerFrame);
  Pages extra(1);
  auto over = granter_.add_frame(extra.page(0));
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error(), Status::no_space);
  EXPECT_EQ(granter_.frame_count(), kTableFrames);
  // Refs of a grown frame are usable, and the entry lands in that frame's memory.
  ASSERT_TRUE(granter_.grant_access_ref(3 * kEntriesPerFrame + 5, kBack, 9, true));
  EXPECT_EQ(flags_of(table_, 3 * kEntriesPerFrame + 5), gtf::permit_access | gtf::readonly);
}

TEST_F(GranterTest, AddFrameRefusesSomethingThatIsNotOneAlignedPage) {
  Pages p(2);
  auto small = granter_.add_frame(p.page(0).subspan(0, 100));
  ASSERT_FALSE(small);
  EXPECT_EQ(small.error(), Status::general_error);
  auto misaligned = granter_.add_frame(std::span<std::uint8_t>(p.data() + 2, kFrameSize));
  ASSERT_FALSE(misaligned);
  EXPECT_EQ(misaligned.error(), Status::general_error);
  EXPECT_EQ(granter_.frame_count(), 1u);
}

TEST(GranterSetup, ConstructorEnforcesFrameLimitAndFrameShape) {
  Pages p(65);
  EXPECT_THROW(GrantTable(p.pages(0, 65)), std::invalid_argument);  // default limit is 64
  EXPECT_NO_THROW(GrantTable(p.pages(0, 64)));
  EXPECT_THROW(GrantTable(p.pages(0, 3), 2), std::invalid_argument);
  EXPECT_THROW(GrantTable({}, 0), std::invalid_argument);
  EXPECT_THROW(GrantTable({p.page(0).subspan(0, 4095)}), std::invalid_argument);
  GrantTable empty({}, 2);
  EXPECT_EQ(empty.capacity(), 0u);
  EXPECT_EQ(empty.max_frames(), 2u);
  auto none = empty.grant_access(0, 1, false);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error(), Status::no_space);
}

TEST_F(GranterTest, ReservedRefIsSetByGrantAccessRefAndNeverAllocated) {
  ASSERT_TRUE(granter_.grant_access_ref(kReservedXenstore, kBack, 11, false));
  auto e = granter_.entry(kReservedXenstore);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->flags, gtf::permit_access);
  EXPECT_EQ(e->frame, 11u);
  EXPECT_EQ(granter_.in_use(), 0u);  // reserved refs are not counted
  ASSERT_TRUE(granter_.end_access(kReservedXenstore));
  EXPECT_EQ(flags_of(table_, kReservedXenstore), 0);
  for (int i = 0; i < 20; ++i) EXPECT_GE(grant(1, false), kNrReservedEntries);
}

TEST_F(GranterTest, GrantAccessRefTakesAFreeRefOffTheFreeList) {
  ASSERT_TRUE(granter_.grant_access_ref(8, kBack, 1, false));  // the free-list head
  EXPECT_EQ(granter_.in_use(), 1u);
  EXPECT_EQ(grant(1, false), 9u);  // 8 is no longer free
  // Re-granting an in-use (unmapped) ref changes it in place.
  ASSERT_TRUE(granter_.grant_access_ref(8, 3, 2, true));
  EXPECT_EQ(granter_.in_use(), 2u);
  auto e = granter_.entry(8);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->domid, 3);
  EXPECT_EQ(e->frame, 2u);
  EXPECT_EQ(e->flags, gtf::permit_access | gtf::readonly);
}

TEST_F(GranterTest, RefsOutsideTheTableAndHugeFramesAreRefused) {
  const auto cap = static_cast<GrantRef>(granter_.capacity());
  auto a = granter_.grant_access_ref(cap, kBack, 1, false);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error(), Status::bad_gntref);
  auto b = granter_.end_access(cap);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error(), Status::bad_gntref);
  auto c = granter_.entry(UINT32_MAX);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error(), Status::bad_gntref);
  EXPECT_FALSE(granter_.is_mapped(cap));
  auto d = granter_.grant_access(kBack, std::uint64_t{1} << 32, false);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error(), Status::address_too_big);
  EXPECT_EQ(granter_.in_use(), 0u);
}

TEST_F(GranterTest, EndAccessIsRefusedWhileThePeerHoldsEitherBitAndLeavesTheEntryIntact) {
  const GrantRef ref = grant(6, false);
  for (std::uint16_t held : {gtf::reading, static_cast<std::uint16_t>(gtf::reading | gtf::writing),
                             gtf::writing}) {
    poke_flags(table_, ref, gtf::permit_access | held);  // what a mapper does
    EXPECT_TRUE(granter_.is_mapped(ref));
    auto r = granter_.end_access(ref);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), Status::eagain);
    EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | held);
    auto regrant = granter_.grant_access_ref(ref, kBack, 7, true);
    ASSERT_FALSE(regrant);
    EXPECT_EQ(regrant.error(), Status::eagain);
    auto e = granter_.entry(ref);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->frame, 6u);
    EXPECT_EQ(e->domid, kBack);
  }
  poke_flags(table_, ref, gtf::permit_access);  // the mapper let go
  EXPECT_TRUE(granter_.end_access(ref));
  EXPECT_EQ(granter_.in_use(), 0u);
}

TEST_F(GranterTest, AFreeEntryWithStrayPeerBitsIsSkippedNotOverwritten) {
  // A misbehaving peer set GTF_reading on ref 8, which was never granted. grant_access must not
  // wipe the peer's bits; it refuses once and moves on to another ref next time.
  poke_flags(table_, 8, gtf::reading);
  auto first = granter_.grant_access(kBack, 1, false);
  ASSERT_FALSE(first);
  EXPECT_EQ(first.error(), Status::eagain);
  EXPECT_EQ(flags_of(table_, 8), gtf::reading);
  EXPECT_EQ(granter_.in_use(), 0u);
  auto second = granter_.grant_access(kBack, 1, false);
  ASSERT_TRUE(second);
  EXPECT_EQ(*second, 9u);
}

}  // namespace
}  // namespace xpv::gnttab::test
