// EventChannels::move_shared_info (HVM: the guest places shared_info with XENMEM_add_to_physmap
// after the VMM created the event channels over a host placeholder), and the two inspection
// accessors the HVM platform uses (upcall_pending, port_pending).
#include <cstring>

#include "fixture.h"

namespace xpv::domain::test {
namespace {

using EvtchnMove = EvtchnTest;  // 4 vCPUs, the fixture's page_ is the placeholder

SharedInfo& view(Page& p) { return *reinterpret_cast<SharedInfo*>(p.bytes); }

bool bit(const std::uint64_t* words, Port p) {
  return (words[p / 64] >> (p % 64)) & 1;
}

TEST_F(EvtchnMove, CopiesBitmapsAndLegacySlotsAndZeroesTheRest) {
  auto ipi = ev_->bind_ipi(2);
  auto masked = ev_->bind_ipi(0);
  ASSERT_TRUE(ipi && masked);
  set_mask(*masked, true);
  set_mask(300, true);
  ASSERT_TRUE(ev_->send(*ipi));
  ASSERT_TRUE(ev_->send(*masked));
  si().vcpu_info[1].evtchn_upcall_mask = 1;
  si().vcpu_info[3].arch.cr2 = 0x1234;
  si().wc_sec = 77;  // not event-channel state: not carried over

  auto dst = std::make_unique<Page>();
  std::memset(dst->bytes, 0xa5, sizeof dst->bytes);  // whatever the guest had in that RAM page
  ASSERT_TRUE(ev_->move_shared_info(dst->span()));

  SharedInfo& n = view(*dst);
  EXPECT_TRUE(bit(n.evtchn_pending, *ipi));
  EXPECT_TRUE(bit(n.evtchn_pending, *masked));
  EXPECT_TRUE(bit(n.evtchn_mask, *masked));
  EXPECT_TRUE(bit(n.evtchn_mask, 300));
  EXPECT_EQ(n.vcpu_info[2].evtchn_upcall_pending, 1);
  EXPECT_EQ(n.vcpu_info[2].evtchn_pending_sel, 1u);
  EXPECT_EQ(n.vcpu_info[1].evtchn_upcall_mask, 1);
  EXPECT_EQ(n.vcpu_info[3].arch.cr2, 0x1234u);
  // Everything else is zero: other slots (vCPUs 4..31 do not exist), wallclock, arch, the tail.
  EXPECT_EQ(n.vcpu_info[0].evtchn_upcall_pending, 0);
  EXPECT_EQ(n.vcpu_info[5].evtchn_upcall_pending, 0);
  EXPECT_EQ(n.vcpu_info[31].arch.cr2, 0u);
  EXPECT_EQ(n.wc_sec, 0u);
  EXPECT_EQ(n.arch.max_pfn, 0u);
  for (std::size_t i = sizeof(SharedInfo); i < 4096; ++i) ASSERT_EQ(dst->bytes[i], 0) << i;
  unsigned pending_bits = 0;
  for (auto w : n.evtchn_pending) pending_bits += static_cast<unsigned>(__builtin_popcountll(w));
  EXPECT_EQ(pending_bits, 2u);
}

TEST_F(EvtchnMove, DeliveryGoesToTheNewPageOnly) {
  auto p = ev_->bind_ipi(1);
  ASSERT_TRUE(p);
  auto dst = std::make_unique<Page>();
  ASSERT_TRUE(ev_->move_shared_info(dst->span()));
  const Page before = *page_;
  ASSERT_TRUE(ev_->send(*p));
  EXPECT_EQ(std::memcmp(before.bytes, page_->bytes, 4096), 0);  // old page untouched
  SharedInfo& n = view(*dst);
  EXPECT_TRUE(bit(n.evtchn_pending, *p));
  EXPECT_EQ(n.vcpu_info[1].evtchn_pending_sel, 1u);
  EXPECT_EQ(n.vcpu_info[1].evtchn_upcall_pending, 1);
  EXPECT_EQ(sink_.calls(), std::vector<unsigned>{1});
  EXPECT_TRUE(ev_->upcall_pending(1));
  EXPECT_TRUE(ev_->port_pending(*p));
  // The guest's mask in the new page is honoured; unmask re-delivers from the new page.
  n.vcpu_info[1].evtchn_upcall_pending = 0;
  n.vcpu_info[1].evtchn_pending_sel = 0;
  n.evtchn_pending[0] = 0;
  n.evtchn_mask[0] = std::uint64_t{1} << *p;
  ASSERT_TRUE(ev_->send(*p));
  EXPECT_EQ(sink_.count(), 1u);
  ASSERT_TRUE(ev_->unmask(*p));
  EXPECT_EQ(sink_.count(), 2u);
  EXPECT_EQ(n.vcpu_info[1].evtchn_upcall_pending, 1);
}

TEST_F(EvtchnMove, NoUpcallIsRaisedByTheMove) {
  auto p = ev_->bind_ipi(0);
  ASSERT_TRUE(p && ev_->send(*p));
  EXPECT_EQ(sink_.count(), 1u);
  auto dst = std::make_unique<Page>();
  ASSERT_TRUE(ev_->move_shared_info(dst->span()));
  EXPECT_EQ(sink_.count(), 1u);
  EXPECT_TRUE(ev_->upcall_pending(0));
}

TEST_F(EvtchnMove, RegisteredVcpuInfoStaysWhereTheGuestPutIt) {
  auto area = std::make_unique<Page>();
  ASSERT_TRUE(ev_->register_vcpu_info(1, area->span().subspan(128, 64)));
  // Registration raises an upcall with all selector bits set; the guest handles it.
  std::memset(area->bytes + 128, 0, 16);  // upcall_pending, mask, pad, pending_sel
  auto p = ev_->bind_ipi(1);
  ASSERT_TRUE(p);
  auto dst = std::make_unique<Page>();
  std::memset(dst->bytes, 0xff, sizeof dst->bytes);
  ASSERT_TRUE(ev_->move_shared_info(dst->span()));
  SharedInfo& n = view(*dst);
  EXPECT_EQ(n.vcpu_info[1].evtchn_pending_sel, 0u);  // the legacy slot of vCPU 1 is dead: zero
  ASSERT_TRUE(ev_->send(*p));
  EXPECT_EQ(area->bytes[128], 1);                 // upcall_pending in the registered area
  EXPECT_EQ(n.vcpu_info[1].evtchn_upcall_pending, 0);
  EXPECT_TRUE(bit(n.evtchn_pending, *p));         // the bitmap is in the new page
}

TEST_F(EvtchnMove, VcpuInfoRegisteredInsideTheNewPageKeepsItsContents) {
  auto dst = std::make_unique<Page>();
  // vCPU 3 registers at offset 0xd00 of the page the guest will later give as shared_info (an
  // odd guest, but the move must not wipe a live vcpu_info).
  ASSERT_TRUE(ev_->register_vcpu_info(3, dst->span().subspan(0xd00, 64)));
  std::uint64_t sel = 0;
  std::memcpy(&sel, dst->bytes + 0xd08, 8);
  EXPECT_EQ(sel, ~std::uint64_t{0});
  ASSERT_TRUE(ev_->move_shared_info(dst->span()));
  std::memcpy(&sel, dst->bytes + 0xd08, 8);
  EXPECT_EQ(sel, ~std::uint64_t{0});
  EXPECT_EQ(dst->bytes[0xd00], 1);
  EXPECT_TRUE(ev_->upcall_pending(3));
}

TEST_F(EvtchnMove, MovingTwiceCarriesTheStateAgain) {
  auto p = ev_->bind_ipi(0);
  ASSERT_TRUE(p && ev_->send(*p));
  auto a = std::make_unique<Page>();
  auto b = std::make_unique<Page>();
  ASSERT_TRUE(ev_->move_shared_info(a->span()));
  ASSERT_TRUE(ev_->move_shared_info(a->span()));  // same page: no-op
  EXPECT_TRUE(bit(view(*a).evtchn_pending, *p));
  ASSERT_TRUE(ev_->move_shared_info(b->span()));
  EXPECT_TRUE(bit(view(*b).evtchn_pending, *p));
  EXPECT_EQ(view(*b).vcpu_info[0].evtchn_upcall_pending, 1);
  auto q = ev_->bind_ipi(2);
  ASSERT_TRUE(q && ev_->send(*q));
  EXPECT_TRUE(bit(view(*b).evtchn_pending, *q));
  EXPECT_FALSE(bit(view(*a).evtchn_pending, *q));
}

TEST_F(EvtchnMove, RejectsShortMisalignedAndOverlappingPages) {
  struct alignas(4096) Two { std::uint8_t b[8192]; };
  auto two = std::make_unique<Two>();
  std::span<std::uint8_t> s(two->b, sizeof two->b);
  EXPECT_EQ(ev_->move_shared_info(s.first(4095)).error(), XenErrno::einval);
  EXPECT_EQ(ev_->move_shared_info(s.subspan(4, 4096)).error(), XenErrno::einval);
  ASSERT_TRUE(ev_->move_shared_info(s.first(4096)));
  EXPECT_EQ(ev_->move_shared_info(s.subspan(2048, 4096)).error(), XenErrno::einval);  // overlaps
  ASSERT_TRUE(ev_->move_shared_info(s.subspan(4096, 4096)));  // adjacent: fine
  ASSERT_TRUE(ev_->move_shared_info(page_->span()));          // and back to the first page
}

TEST_F(EvtchnMove, InspectionAccessorsRejectBadIndexes) {
  EXPECT_FALSE(ev_->upcall_pending(4));
  EXPECT_FALSE(ev_->port_pending(4096));
  EXPECT_FALSE(ev_->upcall_pending(0));
  EXPECT_FALSE(ev_->port_pending(1));
  auto p = ev_->bind_ipi(0);
  ASSERT_TRUE(p && ev_->send(*p));
  EXPECT_TRUE(ev_->port_pending(*p));
  EXPECT_TRUE(ev_->upcall_pending(0));
  EXPECT_FALSE(ev_->port_pending(*p + 1));
}

TEST(EvtchnMoveManyVcpus, VcpusBeyondLegacySlotsKeepTheirPlaceholder) {
  RecordingSink sink;
  auto page = std::make_unique<Page>();
  EventChannels ev(3, 40, page->span(), sink);
  auto p = ev.bind_ipi(35);
  ASSERT_TRUE(p && ev.send(*p));
  auto dst = std::make_unique<Page>();
  ASSERT_TRUE(ev.move_shared_info(dst->span()));
  // Still in the host placeholder, which the guest cannot see: not an upcall to raise.
  EXPECT_FALSE(ev.upcall_pending(35));
  EXPECT_TRUE(bit(view(*dst).evtchn_pending, *p));
  EXPECT_EQ(sink.count(), 0u);
}

}  // namespace
}  // namespace xpv::domain::test
