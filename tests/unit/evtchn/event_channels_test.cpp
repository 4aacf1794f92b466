// EventChannels operations: success paths, state changes and Xen's error codes.
#include <array>
#include <stdexcept>

#include "fixture.h"

namespace xpv::domain::test {
namespace {

using EvtchnOps = EvtchnTest;

TEST(EvtchnSetup, RejectsBadConstructorArguments) {
  RecordingSink sink;
  auto page = std::make_unique<Page>();
  EXPECT_THROW(EventChannels(0, 1, page->span(), sink), std::invalid_argument);
  EXPECT_THROW(EventChannels(kDomidSelf, 1, page->span(), sink), std::invalid_argument);
  EXPECT_THROW(EventChannels(1, 0, page->span(), sink), std::invalid_argument);
  EXPECT_THROW(EventChannels(1, 1, page->span().first(3000), sink), std::invalid_argument);
  EXPECT_THROW(EventChannels(1, 1, page->span().subspan(4, 4000), sink), std::invalid_argument);
  EXPECT_THROW(EventChannels(1, 1, page->span(), sink, 0), std::invalid_argument);
  EXPECT_THROW(EventChannels(1, 1, page->span(), sink, 4097), std::invalid_argument);
  EXPECT_NO_THROW(EventChannels(1, 1, page->span(), sink, 4096));
}

TEST_F(EvtchnOps, AllocUnboundHandsOutPortsFromOne) {
  auto a = ev_->alloc_unbound(0);
  auto b = ev_->alloc_unbound(3);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, 1u);
  EXPECT_EQ(*b, 2u);
  auto s = ev_->status(*b);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, EvtchnStat::unbound);
  EXPECT_EQ(s->remote_dom, 3);
  EXPECT_EQ(s->vcpu, 0u);
}

TEST_F(EvtchnOps, AllocUnboundDomidSelfMeansThisDomain) {
  auto a = ev_->alloc_unbound(kDomidSelf);
  ASSERT_TRUE(a);
  EXPECT_EQ(ev_->status(*a)->remote_dom, kDomid);
}

class EvtchnSmallTable : public EvtchnTest {
 protected:
  EvtchnSmallTable() : EvtchnTest(2, 8) {}
};

TEST_F(EvtchnSmallTable, PortsRunOutWithEnospcAndTheLowestFreeIsReused) {
  for (Port expect = 1; expect < 8; ++expect) {
    auto p = ev_->bind_ipi(0);
    ASSERT_TRUE(p);
    EXPECT_EQ(*p, expect);
  }
  auto full = ev_->alloc_unbound(0);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error(), XenErrno::enospc);
  EXPECT_EQ(ev_->bind_virq(kVirqTimer, 0).error(), XenErrno::enospc);
  EXPECT_EQ(ev_->bind_interdomain(kDomidSelf, 1).error(), XenErrno::enospc);  // ENOSPC first
  ASSERT_TRUE(ev_->close(3));
  ASSERT_TRUE(ev_->close(5));
  EXPECT_EQ(*ev_->alloc_unbound(0), 3u);
  EXPECT_EQ(ev_->status(8).error(), XenErrno::einval);
}

TEST_F(EvtchnOps, StatusOfPortZeroAndFreePortsIsClosedOutOfRangeIsEinval) {
  auto z = ev_->status(0);
  ASSERT_TRUE(z);
  EXPECT_EQ(z->status, EvtchnStat::closed);
  EXPECT_EQ(ev_->status(4095)->status, EvtchnStat::closed);
  EXPECT_EQ(ev_->status(4096).error(), XenErrno::einval);
  EXPECT_EQ(ev_->status(0xffffffffu).error(), XenErrno::einval);
}

TEST_F(EvtchnOps, CloseRejectsPortZeroOutOfRangeAndClosedPorts) {
  EXPECT_EQ(ev_->close(0).error(), XenErrno::einval);
  EXPECT_EQ(ev_->close(4096).error(), XenErrno::einval);
  EXPECT_EQ(ev_->close(17).error(), XenErrno::einval);
  auto p = ev_->bind_ipi(1);
  ASSERT_TRUE(p);
  EXPECT_TRUE(ev_->close(*p));
  EXPECT_EQ(ev_->close(*p).error(), XenErrno::einval);
}

TEST_F(EvtchnOps, SendOnClosedPortZeroOutOfRangeOrVirqIsEinval) {
  EXPECT_EQ(ev_->send(0).error(), XenErrno::einval);
  EXPECT_EQ(ev_->send(4096).error(), XenErrno::einval);
  EXPECT_EQ(ev_->send(9).error(), XenErrno::einval);
  auto v = ev_->bind_virq(kVirqTimer, 0);
  ASSERT_TRUE(v);
  EXPECT_EQ(ev_->send(*v).error(), XenErrno::einval);
  EXPECT_FALSE(pending(*v));
  EXPECT_EQ(sink_.count(), 0u);
}

TEST_F(EvtchnOps, SendOnUnboundPortSucceedsAndDropsTheEvent) {
  auto p = ev_->alloc_unbound(0);
  ASSERT_TRUE(p);
  EXPECT_TRUE(ev_->send(*p));  // Xen: "silently drop the notification"
  EXPECT_FALSE(pending(*p));
  EXPECT_EQ(sink_.count(), 0u);
}

TEST_F(EvtchnOps, CloseThenSendIsEinval) {
  auto p = ev_->bind_ipi(0);
  ASSERT_TRUE(p);
  ASSERT_TRUE(ev_->send(*p));
  ASSERT_TRUE(ev_->close(*p));
  EXPECT_FALSE(pending(*p));  // close clears the pending bit
  EXPECT_EQ(ev_->send(*p).error(), XenErrno::einval);
}

TEST_F(EvtchnOps, BindVirqPerVcpuAndStatus) {
  auto t0 = ev_->bind_virq(kVirqTimer, 0);
  auto t3 = ev_->bind_virq(kVirqTimer, 3);
  ASSERT_TRUE(t0 && t3);
  EXPECT_NE(*t0, *t3);
  auto s = ev_->status(*t3);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, EvtchnStat::virq);
  EXPECT_EQ(s->virq, kVirqTimer);
  EXPECT_EQ(s->vcpu, 3u);
}

TEST_F(EvtchnOps, BindVirqTwiceOnTheSameVcpuIsEexist) {
  ASSERT_TRUE(ev_->bind_virq(kVirqTimer, 1));
  auto again = ev_->bind_virq(kVirqTimer, 1);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error(), XenErrno::eexist);
  ASSERT_TRUE(ev_->bind_virq(kVirqConsole, 0));
  EXPECT_EQ(ev_->bind_virq(kVirqConsole, 0).error(), XenErrno::eexist);
}

TEST_F(EvtchnOps, BindVirqBadArguments) {
  EXPECT_EQ(ev_->bind_virq(kNrVirqs, 0).error(), XenErrno::einval);
  EXPECT_EQ(ev_->bind_virq(0xffffffffu, 0).error(), XenErrno::einval);
  EXPECT_EQ(ev_->bind_virq(kVirqConsole, 1).error(), XenErrno::einval);  // global: vCPU 0 only
  EXPECT_EQ(ev_->bind_virq(kVirqTimer, 4).error(), XenErrno::enoent);    // 4 vCPUs
  EXPECT_EQ(ev_->bind_virq(kVirqTimer, 0xffffffffu).error(), XenErrno::enoent);
}

TEST_F(EvtchnOps, ClosingAVirqPortAllowsRebinding) {
  auto p = ev_->bind_virq(kVirqDebug, 2);
  ASSERT_TRUE(p);
  ASSERT_TRUE(ev_->close(*p));
  auto again = ev_->bind_virq(kVirqDebug, 2);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *p);
}

TEST_F(EvtchnOps, BindIpiAndBadVcpu) {
  auto a = ev_->bind_ipi(2);
  auto b = ev_->bind_ipi(2);  // several IPI ports per vCPU are allowed
  ASSERT_TRUE(a && b);
  auto s = ev_->status(*a);
  EXPECT_EQ(s->status, EvtchnStat::ipi);
  EXPECT_EQ(s->vcpu, 2u);
  EXPECT_EQ(ev_->bind_ipi(4).error(), XenErrno::enoent);
}

TEST_F(EvtchnOps, BindVcpuFollowsXenRules) {
  auto unbound = ev_->alloc_unbound(0);
  auto ipi = ev_->bind_ipi(1);
  auto timer = ev_->bind_virq(kVirqTimer, 1);
  auto console = ev_->bind_virq(kVirqConsole, 0);
  ASSERT_TRUE(unbound && ipi && timer && console);

  EXPECT_TRUE(ev_->bind_vcpu(*unbound, 3));
  EXPECT_EQ(ev_->status(*unbound)->vcpu, 3u);
  EXPECT_TRUE(ev_->bind_vcpu(*console, 2));
  EXPECT_EQ(ev_->status(*console)->vcpu, 2u);
  EXPECT_EQ(ev_->bind_vcpu(*ipi, 0).error(), XenErrno::einval);    // fixed at bind time
  EXPECT_EQ(ev_->bind_vcpu(*timer, 0).error(), XenErrno::einval);  // per-vCPU virq: fixed
  EXPECT_EQ(ev_->status(*ipi)->vcpu, 1u);
  EXPECT_EQ(ev_->bind_vcpu(40, 0).error(), XenErrno::einval);      // closed
  EXPECT_EQ(ev_->bind_vcpu(0, 0).error(), XenErrno::einval);       // port 0
  EXPECT_EQ(ev_->bind_vcpu(4096, 0).error(), XenErrno::einval);
  EXPECT_EQ(ev_->bind_vcpu(*unbound, 4).error(), XenErrno::enoent);  // vCPU checked first
  EXPECT_EQ(ev_->bind_vcpu(4096, 4).error(), XenErrno::enoent);
}

TEST_F(EvtchnOps, LoopbackInterdomainConnectsTwoLocalPorts) {
  auto a = ev_->alloc_unbound(kDomidSelf);
  ASSERT_TRUE(a);
  auto b = ev_->bind_interdomain(kDomidSelf, *a);
  ASSERT_TRUE(b);
  auto sa = ev_->status(*a);
  auto sb = ev_->status(*b);
  EXPECT_EQ(sa->status, EvtchnStat::interdomain);
  EXPECT_EQ(sa->remote_dom, kDomid);
  EXPECT_EQ(sa->remote_port, *b);
  EXPECT_EQ(sb->status, EvtchnStat::interdomain);
  EXPECT_EQ(sb->remote_dom, kDomid);
  EXPECT_EQ(sb->remote_port, *a);
  // Xen sets the binder's new port pending once, in case the peer sent while unbound.
  EXPECT_TRUE(pending(*b));
  EXPECT_FALSE(pending(*a));
  guest_handle(0);
  ASSERT_TRUE(ev_->send(*a));
  EXPECT_TRUE(pending(*b));
  EXPECT_FALSE(pending(*a));
  ASSERT_TRUE(ev_->send(*b));
  EXPECT_TRUE(pending(*a));
}

TEST_F(EvtchnOps, LoopbackByNumericOwnDomid) {
  auto a = ev_->alloc_unbound(kDomid);
  ASSERT_TRUE(a);
  auto b = ev_->bind_interdomain(kDomid, *a);
  ASSERT_TRUE(b);
  EXPECT_EQ(ev_->status(*a)->remote_port, *b);
}

TEST_F(EvtchnOps, BindInterdomainRejectsPortsThatAreNotUnboundForUs) {
  auto for_dom0 = ev_->alloc_unbound(0);
  auto ipi = ev_->bind_ipi(0);
  ASSERT_TRUE(for_dom0 && ipi);
  EXPECT_EQ(ev_->bind_interdomain(kDomidSelf, *for_dom0).error(), XenErrno::einval);  // remote_dom
  EXPECT_EQ(ev_->bind_interdomain(kDomidSelf, *ipi).error(), XenErrno::einval);
  EXPECT_EQ(ev_->bind_interdomain(kDomidSelf, 100).error(), XenErrno::einval);  // closed
  EXPECT_EQ(ev_->bind_interdomain(kDomidSelf, 0).error(), XenErrno::einval);
  EXPECT_EQ(ev_->bind_interdomain(kDomidSelf, 4096).error(), XenErrno::einval);
  auto a = ev_->alloc_unbound(kDomidSelf);
  ASSERT_TRUE(ev_->bind_interdomain(kDomidSelf, *a));
  EXPECT_EQ(ev_->bind_interdomain(kDomidSelf, *a).error(), XenErrno::einval);  // already bound
  // A failed bind leaves no port behind.
  EXPECT_EQ(ev_->status(*a + 2)->status, EvtchnStat::closed);
}

TEST_F(EvtchnOps, BindInterdomainToAnotherDomainIsEsrch) {
  EXPECT_EQ(ev_->bind_interdomain(3, 1).error(), XenErrno::esrch);
  EXPECT_EQ(ev_->bind_interdomain(0x7FF1, 1).error(), XenErrno::esrch);
}

TEST_F(EvtchnOps, ClosingOneLoopbackEndLeavesThePeerUnbound) {
  auto a = ev_->alloc_unbound(kDomidSelf);
  auto b = ev_->bind_interdomain(kDomidSelf, *a);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(ev_->close(*a));
  auto sb = ev_->status(*b);
  EXPECT_EQ(sb->status, EvtchnStat::unbound);
  EXPECT_EQ(sb->remote_dom, kDomid);
  EXPECT_EQ(ev_->send(*a).error(), XenErrno::einval);
  guest_handle(0);
  EXPECT_TRUE(ev_->send(*b));  // unbound: dropped
  EXPECT_FALSE(pending(*a));
  auto c = ev_->bind_interdomain(kDomidSelf, *b);  // the peer can be connected again
  ASSERT_TRUE(c);
  EXPECT_EQ(ev_->status(*b)->remote_port, *c);
}

TEST_F(EvtchnOps, ClosedPortIsReusedWithVcpuZero) {
  auto p = ev_->alloc_unbound(0);
  ASSERT_TRUE(ev_->bind_vcpu(*p, 2));
  ASSERT_TRUE(ev_->close(*p));
  auto q = ev_->alloc_unbound(0);
  ASSERT_EQ(*q, *p);
  EXPECT_EQ(ev_->status(*q)->vcpu, 0u);
}

TEST_F(EvtchnOps, ResetClosesEverything) {
  auto a = ev_->alloc_unbound(kDomidSelf);
  auto b = ev_->bind_interdomain(kDomidSelf, *a);
  auto t = ev_->bind_virq(kVirqTimer, 1);
  auto i = ev_->bind_ipi(2);
  ASSERT_TRUE(a && b && t && i);
  ASSERT_TRUE(ev_->send(*i));
  ev_->reset();
  for (Port p : {*a, *b, *t, *i}) EXPECT_EQ(ev_->status(p)->status, EvtchnStat::closed) << p;
  EXPECT_FALSE(pending(*i));
  EXPECT_FALSE(pending(*b));
  EXPECT_TRUE(ev_->bind_virq(kVirqTimer, 1));  // the virq slot was released
  EXPECT_EQ(ev_->send(*a).error(), XenErrno::einval);
}

TEST_F(EvtchnOps, RaiseVirqDeliversToTheBoundVcpu) {
  EXPECT_EQ(ev_->raise_virq(kVirqTimer, 1).error(), XenErrno::enoent);
  EXPECT_EQ(ev_->raise_virq(kNrVirqs, 0).error(), XenErrno::einval);
  EXPECT_EQ(ev_->raise_virq(kVirqTimer, 4).error(), XenErrno::einval);
  auto t = ev_->bind_virq(kVirqTimer, 1);
  ASSERT_TRUE(t);
  EXPECT_EQ(ev_->raise_virq(kVirqTimer, 0).error(), XenErrno::enoent);  // bound on vCPU 1 only
  ASSERT_TRUE(ev_->raise_virq(kVirqTimer, 1));
  EXPECT_TRUE(pending(*t));
  EXPECT_EQ(upcall_pending(1), 1);
  EXPECT_EQ(sink_.calls(), std::vector<unsigned>{1});
}

TEST_F(EvtchnOps, GlobalVirqFollowsBindVcpu) {
  auto c = ev_->bind_virq(kVirqConsole, 0);
  ASSERT_TRUE(c);
  ASSERT_TRUE(ev_->bind_vcpu(*c, 2));
  ASSERT_TRUE(ev_->raise_virq(kVirqConsole));
  EXPECT_TRUE(pending(*c));
  EXPECT_EQ(upcall_pending(0), 0);
  EXPECT_EQ(upcall_pending(2), 1);
  EXPECT_EQ(sink_.calls(), std::vector<unsigned>{2});
}

TEST_F(EvtchnOps, DeliverNeedsABoundPort) {
  EXPECT_EQ(ev_->deliver(0).error(), XenErrno::einval);
  EXPECT_EQ(ev_->deliver(5).error(), XenErrno::einval);
  EXPECT_EQ(ev_->deliver(4096).error(), XenErrno::einval);
  auto p = ev_->alloc_unbound(0);
  ASSERT_TRUE(ev_->deliver(*p));
  EXPECT_TRUE(pending(*p));
}

TEST_F(EvtchnOps, RegisterVcpuInfoValidatesItsArguments) {
  auto area = std::make_unique<Page>();
  EXPECT_EQ(ev_->register_vcpu_info(4, area->span().subspan(0, 64)).error(), XenErrno::enoent);
  EXPECT_EQ(ev_->register_vcpu_info(1, area->span().subspan(4, 64)).error(), XenErrno::enxio);
  EXPECT_EQ(ev_->register_vcpu_info(1, area->span().subspan(4096 - 32, 32)).error(),
            XenErrno::enxio);  // too short
  EXPECT_EQ(ev_->register_vcpu_info(1, area->span().subspan(0, 63)).error(), XenErrno::enxio);
  ASSERT_TRUE(ev_->register_vcpu_info(1, area->span().subspan(64, 64)));
  EXPECT_EQ(ev_->register_vcpu_info(1, area->span().subspan(128, 64)).error(), XenErrno::einval);
}

TEST_F(EvtchnOps, RegisterVcpuInfoRefusesAnAreaThatCrossesAPage) {
  struct alignas(4096) TwoPages {
    std::uint8_t b[8192] = {};
  };
  auto two = std::make_unique<TwoPages>();
  EXPECT_EQ(ev_->register_vcpu_info(1, std::span<std::uint8_t>(two->b + 4096 - 32, 64)).error(),
            XenErrno::enxio);
  EXPECT_TRUE(ev_->register_vcpu_info(1, std::span<std::uint8_t>(two->b + 4096 - 64, 64)));
}

TEST_F(EvtchnOps, RegisterVcpuInfoThroughGuestMemory) {
  auto area = std::make_unique<Page>();
  GuestMemory mem({{0x5000, 4096, area->bytes}});
  EXPECT_EQ(ev_->register_vcpu_info(1, mem, 5, 4096 - 63).error(), XenErrno::enxio);
  EXPECT_EQ(ev_->register_vcpu_info(1, mem, 6, 0).error(), XenErrno::einval);  // not guest RAM
  EXPECT_EQ(ev_->register_vcpu_info(1, mem, UINT64_MAX, 0).error(), XenErrno::einval);
  EXPECT_EQ(ev_->register_vcpu_info(9, mem, 5, 0).error(), XenErrno::enoent);
  ASSERT_TRUE(ev_->register_vcpu_info(1, mem, 5, 4096 - 64));
  EXPECT_EQ(reinterpret_cast<VcpuInfo*>(area->bytes + 4096 - 64)->evtchn_pending_sel,
            ~std::uint64_t{0});
}

}  // namespace
}  // namespace xpv::domain::test
