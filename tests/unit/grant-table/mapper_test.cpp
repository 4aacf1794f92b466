// The mapping (backend) side: map/unmap checks, status codes, pin counting, handles, lifetime.
#include <algorithm>
#include <stdexcept>

#include "fixture.h"

namespace xpv::gnttab::test {
namespace {

using MapperTest = GrantFixture;

bool all_bytes(std::span<const std::uint8_t> s, std::uint8_t v) {
  return std::all_of(s.begin(), s.end(), [v](std::uint8_t b) { return b == v; });
}

TEST_F(MapperTest, ReadonlyMapGivesABoundedConstViewAndSetsOnlyReading) {
  const GrantRef ref = grant(3, /*readonly=*/true);
  auto m = mapper_.map(ref, /*readonly=*/true);
  ASSERT_TRUE(m) << to_string(m.error());
  EXPECT_EQ(m->data().data(), ram_.page(3).data());
  EXPECT_EQ(m->data().size(), kFrameSize);
  EXPECT_TRUE(all_bytes(m->data(), 0x13));
  EXPECT_TRUE(m->writable().empty());
  EXPECT_TRUE(m->readonly());
  EXPECT_EQ(m->ref(), ref);
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::readonly | gtf::reading);
  EXPECT_EQ(mapper_.mapped(), 1u);
  ASSERT_TRUE(mapper_.unmap(*m));
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::readonly);
  EXPECT_EQ(mapper_.mapped(), 0u);
}

TEST_F(MapperTest, ReadWriteMapWritesThroughToTheGranterAndClearsBothBitsOnUnmap) {
  const GrantRef ref = grant(5, false);
  auto m = mapper_.map(ref, false);
  ASSERT_TRUE(m);
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::reading | gtf::writing);
  ASSERT_EQ(m->writable().size(), kFrameSize);
  std::fill(m->writable().begin(), m->writable().end(), std::uint8_t{0xab});
  EXPECT_TRUE(all_bytes(ram_.page(5), 0xab));
  ASSERT_TRUE(mapper_.unmap(m->handle()));
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access);
  EXPECT_TRUE(all_bytes(ram_.page(4), 0x14));  // the neighbours were not touched
  EXPECT_TRUE(all_bytes(ram_.page(6), 0x16));
}

TEST_F(MapperTest, RefOutOfRangeIsBadGntref) {
  for (GrantRef ref : {static_cast<GrantRef>(kEntriesPerFrame), GrantRef{100000}, UINT32_MAX}) {
    auto m = mapper_.map(ref, true);
    ASSERT_FALSE(m);
    EXPECT_EQ(m.error(), Status::bad_gntref) << ref;
  }
  EXPECT_EQ(mapper_.mapped(), 0u);
}

TEST_F(MapperTest, RefInAFrameTheMapperHasNotSeenYetIsBadGntrefUntilSetFrames) {
  ASSERT_TRUE(granter_.add_frame(table_.page(1)));
  const GrantRef ref = kEntriesPerFrame + 3;
  ASSERT_TRUE(granter_.grant_access_ref(ref, kBack, 2, false));
  auto before = mapper_.map(ref, false);
  ASSERT_FALSE(before);
  EXPECT_EQ(before.error(), Status::bad_gntref);
  mapper_.set_frames(granter_.frames());
  EXPECT_EQ(mapper_.capacity(), 2 * kEntriesPerFrame);
  auto after = mapper_.map(ref, false);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->data().data(), ram_.page(2).data());
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::reading | gtf::writing);
  ASSERT_TRUE(mapper_.unmap(*after));
}

TEST_F(MapperTest, GrantForAnotherDomainIsGeneralErrorAndLeavesTheEntryAlone) {
  const GrantRef ref = grant(1, false, /*to=*/7);
  auto m = mapper_.map(ref, true);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error(), Status::general_error);  // Xen: "Bad flags or dom", GNTST_general_error
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access);
  EXPECT_EQ(mapper_.pins(ref).readers, 0u);
}

TEST_F(MapperTest, WriteMapOfAReadonlyGrantIsRefusedButAReadMapWorks) {
  const GrantRef ref = grant(1, /*readonly=*/true);
  auto w = mapper_.map(ref, /*readonly=*/false);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error(), Status::general_error);
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::readonly);
  auto r = mapper_.map(ref, true);
  ASSERT_TRUE(r);
  // Still refused for writing while read-mapped (the readonly check is made on every write pin).
  auto w2 = mapper_.map(ref, false);
  ASSERT_FALSE(w2);
  EXPECT_EQ(w2.error(), Status::general_error);
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::readonly | gtf::reading);
  ASSERT_TRUE(mapper_.unmap(*r));
}

TEST_F(MapperTest, EntryWithoutPermitAccessIsRefused) {
  // A never-granted ref (flags 0), then entries of other types or with v2-only bits set.
  auto idle = mapper_.map(20, true);
  ASSERT_FALSE(idle);
  EXPECT_EQ(idle.error(), Status::general_error);
  const GrantRef ref = grant(1, false);
  for (std::uint16_t f : {gtf::invalid, gtf::accept_transfer, gtf::transitive,
                          static_cast<std::uint16_t>(gtf::permit_access | gtf::sub_page)}) {
    poke_flags(table_, ref, f);
    auto m = mapper_.map(ref, true);
    ASSERT_FALSE(m) << f;
    EXPECT_EQ(m.error(), Status::general_error) << f;
    EXPECT_EQ(flags_of(table_, ref), f);
  }
  // A revoked grant cannot be mapped any more.
  poke_flags(table_, ref, gtf::permit_access);
  ASSERT_TRUE(granter_.end_access(ref));
  auto gone = mapper_.map(ref, true);
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error(), Status::general_error);
}

TEST_F(MapperTest, FrameOutsideGuestMemoryIsBadPageAndTheBitsAreUndone) {
  for (std::uint64_t gfn : {std::uint64_t{kRamPages}, std::uint64_t{0xffffffff}}) {
    const GrantRef ref = grant(gfn, false);
    auto m = mapper_.map(ref, false);
    ASSERT_FALSE(m);
    EXPECT_EQ(m.error(), Status::bad_page);
    EXPECT_EQ(flags_of(table_, ref), gtf::permit_access);
    EXPECT_EQ(mapper_.pins(ref).writers, 0u);
    EXPECT_TRUE(granter_.end_access(ref));
  }
}

TEST_F(MapperTest, EndAccessIsRefusedWhileMappedAndSucceedsAfterUnmap) {
  const GrantRef ref = grant(7, false);
  auto m = mapper_.map(ref, false);
  ASSERT_TRUE(m);
  auto refused = granter_.end_access(ref);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(), Status::eagain);
  auto e = granter_.entry(ref);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->flags, gtf::permit_access | gtf::reading | gtf::writing);
  EXPECT_EQ(e->domid, kBack);
  EXPECT_EQ(e->frame, 7u);
  EXPECT_EQ(granter_.in_use(), 1u);
  m->writable()[0] = 0x5a;  // the mapping is still fully usable
  EXPECT_EQ(ram_.page(7)[0], 0x5a);
  ASSERT_TRUE(mapper_.unmap(*m));
  EXPECT_TRUE(granter_.end_access(ref));
  EXPECT_EQ(granter_.in_use(), 0u);
}

TEST_F(MapperTest, ForcedRevokeWhileMappedIsNotUndoneByUnmap) {
  // A misbehaving granter zeroes the flags of a mapped entry (ignoring the protocol). The
  // backend's view stays the same page; unmap does not resurrect the grant; a new map fails.
  const GrantRef ref = grant(2, false);
  auto m = mapper_.map(ref, false);
  ASSERT_TRUE(m);
  poke_flags(table_, ref, 0);
  EXPECT_EQ(m->data().data(), ram_.page(2).data());
  auto second = mapper_.map(ref, true);  // already pinned: the pin is counted, entry not re-checked
  ASSERT_TRUE(second);
  ASSERT_TRUE(mapper_.unmap(*second));
  ASSERT_TRUE(mapper_.unmap(*m));
  EXPECT_EQ(flags_of(table_, ref), 0);
  auto again = mapper_.map(ref, true);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error(), Status::general_error);
}

TEST_F(MapperTest, DoubleUnmapAndUnknownHandlesAreBadHandle) {
  const GrantRef ref = grant(1, true);
  auto m = mapper_.map(ref, true);
  ASSERT_TRUE(m);
  ASSERT_TRUE(mapper_.unmap(*m));
  auto twice = mapper_.unmap(*m);
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error(), Status::bad_handle);
  for (GrantHandle h : {GrantHandle{1}, GrantHandle{12345}, UINT32_MAX}) {
    auto u = mapper_.unmap(h);
    ASSERT_FALSE(u);
    EXPECT_EQ(u.error(), Status::bad_handle) << h;
  }
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::readonly);
}

TEST_F(MapperTest, StaleHandleOfAReusedSlotDoesNotUnmapTheNewMapping) {
  const GrantRef a = grant(1, true);
  const GrantRef b = grant(2, true);
  auto first = mapper_.map(a, true);
  ASSERT_TRUE(first);
  ASSERT_TRUE(mapper_.unmap(*first));
  auto second = mapper_.map(b, true);  // reuses the slot
  ASSERT_TRUE(second);
  EXPECT_NE(second->handle(), first->handle());
  auto stale = mapper_.unmap(first->handle());
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error(), Status::bad_handle);
  EXPECT_EQ(mapper_.pins(b).readers, 1u);
  EXPECT_EQ(flags_of(table_, b), gtf::permit_access | gtf::readonly | gtf::reading);
  ASSERT_TRUE(mapper_.unmap(*second));
}

TEST_F(MapperTest, TwoMapsOfOneRefArePinCountedAndFlagsGoOnlyWithTheLast) {
  const GrantRef ref = grant(4, false);
  auto m1 = mapper_.map(ref, true);
  auto m2 = mapper_.map(ref, true);
  ASSERT_TRUE(m1);
  ASSERT_TRUE(m2);
  EXPECT_NE(m1->handle(), m2->handle());
  EXPECT_EQ(m1->data().data(), m2->data().data());
  EXPECT_EQ(mapper_.pins(ref).readers, 2u);
  ASSERT_TRUE(mapper_.unmap(*m1));
  EXPECT_EQ(mapper_.pins(ref).readers, 1u);
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::reading);
  EXPECT_FALSE(granter_.end_access(ref));
  ASSERT_TRUE(mapper_.unmap(*m2));
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access);
  EXPECT_TRUE(granter_.end_access(ref));
}

TEST_F(MapperTest, ReadAndWritePinsAreCountedSeparately) {
  const GrantRef ref = grant(4, false);
  auto r = mapper_.map(ref, true);
  ASSERT_TRUE(r);
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::reading);
  auto w = mapper_.map(ref, false);  // upgrade: sets writing as well
  ASSERT_TRUE(w);
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::reading | gtf::writing);
  EXPECT_EQ(mapper_.pins(ref).readers, 1u);
  EXPECT_EQ(mapper_.pins(ref).writers, 1u);
  ASSERT_TRUE(mapper_.unmap(*w));  // last writer: writing goes, reading stays
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::reading);
  ASSERT_TRUE(mapper_.unmap(*r));
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access);
}

TEST_F(MapperTest, HandleTableLimitIsNoDeviceSpaceAndTouchesNothing) {
  GrantMapper small(kBack, kFront, granter_.frames(), mem_, /*max_handles=*/2);
  const GrantRef a = grant(1, true), b = grant(2, true), c = grant(3, true);
  auto ma = small.map(a, true);
  auto mb = small.map(b, true);
  ASSERT_TRUE(ma);
  ASSERT_TRUE(mb);
  auto mc = small.map(c, true);
  ASSERT_FALSE(mc);
  EXPECT_EQ(mc.error(), Status::no_device_space);
  EXPECT_EQ(flags_of(table_, c), gtf::permit_access | gtf::readonly);
  ASSERT_TRUE(small.unmap(*ma));
  auto again = small.map(c, true);  // a freed handle is reused
  ASSERT_TRUE(again);
  EXPECT_THROW(GrantMapper(kBack, kFront, {}, mem_, 0), std::invalid_argument);
}

TEST_F(MapperTest, ScopedMappingUnmapsAtScopeExitAndMovesOwnership) {
  const GrantRef ref = grant(8, false);
  {
    auto s = mapper_.map_scoped(ref, false);
    ASSERT_TRUE(s);
    EXPECT_EQ((*s)->data().data(), ram_.page(8).data());
    ScopedMapping moved = std::move(*s);
    EXPECT_FALSE(*s);
    EXPECT_TRUE(moved);
    EXPECT_EQ(mapper_.mapped(), 1u);
    EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::reading | gtf::writing);
  }
  EXPECT_EQ(mapper_.mapped(), 0u);
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access);
  auto bad = mapper_.map_scoped(UINT32_MAX, true);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error(), Status::bad_gntref);
  // release() hands the mapping back without unmapping it.
  Mapping kept;
  {
    auto s = mapper_.map_scoped(ref, true);
    ASSERT_TRUE(s);
    kept = s->release();
  }
  EXPECT_EQ(mapper_.pins(ref).readers, 1u);
  ASSERT_TRUE(mapper_.unmap(kept));
}

TEST_F(MapperTest, DestroyingTheMapperReleasesEveryPin) {
  const GrantRef a = grant(1, false), b = grant(2, true);
  {
    GrantMapper m(kBack, kFront, granter_.frames(), mem_);
    ASSERT_TRUE(m.map(a, false));
    ASSERT_TRUE(m.map(a, true));
    ASSERT_TRUE(m.map(b, true));
    EXPECT_TRUE(granter_.is_mapped(a));
    EXPECT_TRUE(granter_.is_mapped(b));
  }
  EXPECT_EQ(flags_of(table_, a), gtf::permit_access);
  EXPECT_EQ(flags_of(table_, b), gtf::permit_access | gtf::readonly);
  EXPECT_TRUE(granter_.end_access(a));
  EXPECT_TRUE(granter_.end_access(b));
}

TEST_F(MapperTest, SetFramesRefusesToDropAPinnedRefOrTakeABadFrame) {
  ASSERT_TRUE(granter_.add_frame(table_.page(1)));
  mapper_.set_frames(granter_.frames());
  const GrantRef ref = kEntriesPerFrame + 1;
  ASSERT_TRUE(granter_.grant_access_ref(ref, kBack, 1, true));
  auto m = mapper_.map(ref, true);
  ASSERT_TRUE(m);
  EXPECT_THROW(mapper_.set_frames(table_.pages(0, 1)), std::logic_error);
  EXPECT_EQ(mapper_.capacity(), 2 * kEntriesPerFrame);
  EXPECT_THROW(mapper_.set_frames({table_.page(0).subspan(1, 100)}), std::invalid_argument);
  ASSERT_TRUE(mapper_.unmap(*m));
  mapper_.set_frames(table_.pages(0, 1));  // nothing pinned there any more: fine
  EXPECT_EQ(mapper_.capacity(), kEntriesPerFrame);
}

TEST_F(MapperTest, ConstructorRefusesBadFramesAndHandleLimits) {
  Pages p(2);
  EXPECT_THROW(GrantMapper(kBack, kFront, {p.page(0).subspan(0, 4095)}, mem_),
               std::invalid_argument);
  EXPECT_THROW(GrantMapper(kBack, kFront, {std::span<std::uint8_t>(p.data() + 1, kFrameSize)},
                           mem_),
               std::invalid_argument);
  EXPECT_THROW(GrantMapper(kBack, kFront, p.pages(0, 1), mem_, GrantMapper::kMaxHandlesLimit + 1),
               std::invalid_argument);
  GrantMapper empty(kBack, kFront, {}, mem_);
  EXPECT_EQ(empty.capacity(), 0u);
  auto m = empty.map(0, true);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error(), Status::bad_gntref);
  EXPECT_EQ(empty.self(), kBack);
  EXPECT_EQ(empty.granter(), kFront);
}

}  // namespace
}  // namespace xpv::gnttab::test
