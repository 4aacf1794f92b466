// Dom0-side endpoints: eventfds toward dom0 services, kicks serviced by the domain's event loop,
// close on either side, and a two-thread test of the dom0 → guest path.
#include <fcntl.h>
#include <poll.h>

#include <thread>

#include "fixture.h"

namespace xpv::domain::test {
namespace {

using EvtchnDom0 = EvtchnTest;

TEST(EvtchnEventFd, NotifyConsumeWaitAndDup) {
  auto e = EventFd::create();
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->valid());
  EXPECT_EQ(*e->consume(), 0u);
  EXPECT_EQ(*e->wait(0), 0u);  // timeout
  ASSERT_TRUE(e->notify());
  ASSERT_TRUE(e->notify(2));
  EXPECT_EQ(*e->consume(), 3u);
  EXPECT_EQ(*e->consume(), 0u);
  auto d = e->dup();
  ASSERT_TRUE(d);
  EventFd other(std::move(*d));
  EXPECT_NE(other.fd(), e->fd());
  ASSERT_TRUE(other.notify(5));
  EXPECT_EQ(*e->wait(1000), 5u);  // same counter
  EXPECT_EQ(fcntl(other.fd(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_EQ(fcntl(e->fd(), F_GETFL) & O_NONBLOCK, O_NONBLOCK);
}

TEST(EvtchnEventFd, ErrorsOnABadDescriptor) {
  EventFd none;
  EXPECT_FALSE(none.valid());
  auto r = none.consume();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), EBADF);
  EXPECT_EQ(none.notify().error(), EBADF);
}

TEST_F(EvtchnDom0, BindToDom0NeedsAPortUnboundForDom0) {
  auto other = ev_->alloc_unbound(5);
  auto self = ev_->alloc_unbound(kDomidSelf);
  auto ipi = ev_->bind_ipi(0);
  ASSERT_TRUE(other && self && ipi);
  EXPECT_EQ(ev_->bind_to_dom0(*other).error(), XenErrno::einval);
  EXPECT_EQ(ev_->bind_to_dom0(*self).error(), XenErrno::einval);
  EXPECT_EQ(ev_->bind_to_dom0(*ipi).error(), XenErrno::einval);
  EXPECT_EQ(ev_->bind_to_dom0(0).error(), XenErrno::einval);
  EXPECT_EQ(ev_->bind_to_dom0(200).error(), XenErrno::einval);
  EXPECT_EQ(ev_->bind_to_dom0(4096).error(), XenErrno::einval);
  auto p = ev_->alloc_unbound(0);
  ASSERT_TRUE(ev_->bind_to_dom0(*p));
  EXPECT_EQ(ev_->bind_to_dom0(*p).error(), XenErrno::einval);  // already interdomain
}

TEST_F(EvtchnDom0, BindToDom0ConnectsAndWakesTheBackendOnce) {
  auto p = ev_->alloc_unbound(0);
  ASSERT_TRUE(p);
  auto fds = ev_->bind_to_dom0(*p);
  ASSERT_TRUE(fds);
  EXPECT_EQ(fds->dom0_port, 1u);
  EXPECT_EQ(fds->guest_port, *p);
  EXPECT_TRUE(fds->to_dom0.valid() && fds->from_dom0.valid());
  EXPECT_NE(fds->from_dom0.get(), ev_->kick_fd(fds->dom0_port));  // a dup the caller owns
  EXPECT_EQ(fcntl(fds->to_dom0.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  auto s = ev_->status(*p);
  EXPECT_EQ(s->status, EvtchnStat::interdomain);
  EXPECT_EQ(s->remote_dom, 0);
  EXPECT_EQ(s->remote_port, fds->dom0_port);
  auto ds = ev_->dom0_status(fds->dom0_port);
  EXPECT_EQ(ds->status, EvtchnStat::interdomain);
  EXPECT_EQ(ds->guest_port, *p);
  const Port dp = fds->dom0_port;
  Dom0Port backend(std::move(*fds));
  EXPECT_EQ(*backend.consume(), 1u);  // the binder's port starts pending (Xen)
  EXPECT_EQ(*backend.consume(), 0u);
  EXPECT_FALSE(pending(*p));
  EXPECT_NE(ev_->kick_fd(dp), -1);
}

TEST_F(EvtchnDom0, GuestSendMakesToDom0ReadableWithTheCount) {
  auto p = ev_->alloc_unbound(0);
  auto fds = ev_->bind_to_dom0(*p);
  ASSERT_TRUE(fds);
  Dom0Port backend(std::move(*fds));
  ASSERT_EQ(*backend.consume(), 1u);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ev_->send(*p));
  pollfd pfd{backend.wait_fd(), POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 0), 1);
  EXPECT_EQ(*backend.wait(1000), 3u);
  EXPECT_EQ(*backend.wait(0), 0u);
  EXPECT_EQ(sink_.count(), 0u);  // nothing toward the guest
}

TEST_F(EvtchnDom0, Dom0NotifyIsDeliveredToTheGuestWhenServiced) {
  auto p = ev_->alloc_unbound(0);
  ASSERT_TRUE(ev_->bind_vcpu(*p, 1));
  auto fds = ev_->bind_to_dom0(*p);
  ASSERT_TRUE(fds);
  const Port dp = fds->dom0_port;
  Dom0Port backend(std::move(*fds));
  ASSERT_TRUE(backend.notify());
  ASSERT_TRUE(backend.notify());
  EXPECT_FALSE(pending(*p));  // nothing until the event loop services the kick
  pollfd pfd{ev_->kick_fd(dp), POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 0), 1);
  auto n = ev_->service_dom0_kick(dp);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 2u);
  EXPECT_TRUE(pending(*p));
  EXPECT_EQ(sel(1), 1u);
  EXPECT_EQ(upcall_pending(1), 1);
  EXPECT_EQ(sink_.calls(), std::vector<unsigned>{1});
  EXPECT_EQ(*ev_->service_dom0_kick(dp), 0u);  // drained
  EXPECT_EQ(sink_.count(), 1u);
}

TEST_F(EvtchnDom0, ServiceAllKicksCoversEveryEndpoint) {
  auto a = ev_->alloc_unbound(0);
  auto b = ev_->alloc_unbound(0);
  auto fa = ev_->bind_to_dom0(*a);
  auto fb = ev_->bind_to_dom0(*b);
  ASSERT_TRUE(fa && fb);
  EXPECT_EQ(fb->dom0_port, 2u);
  Dom0Port ba(std::move(*fa)), bb(std::move(*fb));
  ASSERT_TRUE(ba.notify());
  ASSERT_TRUE(bb.notify());
  ASSERT_TRUE(bb.notify());
  EXPECT_EQ(ev_->service_dom0_kicks(), 3u);
  EXPECT_TRUE(pending(*a));
  EXPECT_TRUE(pending(*b));
  EXPECT_EQ(sink_.count(), 1u);  // same word, same vCPU: one upcall
  EXPECT_EQ(ev_->service_dom0_kicks(), 0u);
}

TEST_F(EvtchnDom0, UnknownEndpointsAreRefused) {
  EXPECT_EQ(ev_->service_dom0_kick(0).error(), XenErrno::einval);
  EXPECT_EQ(ev_->service_dom0_kick(1).error(), XenErrno::einval);
  EXPECT_EQ(ev_->dom0_close(1).error(), XenErrno::einval);
  EXPECT_EQ(ev_->dom0_status(1).error(), XenErrno::einval);
  EXPECT_EQ(ev_->kick_fd(1), -1);
  EXPECT_EQ(ev_->kick_fd(0), -1);
}

TEST_F(EvtchnDom0, GuestCloseLeavesTheDom0EndpointUnboundAndWakesTheBackend) {
  auto p = ev_->alloc_unbound(0);
  auto fds = ev_->bind_to_dom0(*p);
  ASSERT_TRUE(fds);
  const Port dp = fds->dom0_port;
  Dom0Port backend(std::move(*fds));
  ASSERT_EQ(*backend.consume(), 1u);
  ASSERT_TRUE(ev_->close(*p));
  auto ds = ev_->dom0_status(dp);
  EXPECT_EQ(ds->status, EvtchnStat::unbound);
  EXPECT_EQ(ds->guest_port, 0u);
  EXPECT_EQ(*backend.wait(1000), 1u);  // the wake-up
  // A kick to an unbound endpoint is consumed and dropped.
  ASSERT_TRUE(backend.notify());
  EXPECT_EQ(*ev_->service_dom0_kick(dp), 1u);
  EXPECT_FALSE(pending(*p));
  EXPECT_EQ(sink_.count(), 0u);
  // The guest can connect to it again (bind_interdomain to dom 0's port): new port pending.
  auto q = ev_->bind_interdomain(0, dp);
  ASSERT_TRUE(q);
  EXPECT_TRUE(pending(*q));
  EXPECT_EQ(ev_->dom0_status(dp)->guest_port, *q);
  ASSERT_TRUE(ev_->send(*q));
  EXPECT_EQ(*backend.consume(), 1u);
}

TEST_F(EvtchnDom0, Dom0CloseReturnsTheGuestPortToUnboundForDom0) {
  auto p = ev_->alloc_unbound(0);
  auto fds = ev_->bind_to_dom0(*p);
  ASSERT_TRUE(fds);
  const Port dp = fds->dom0_port;
  Dom0Port backend(std::move(*fds));
  ASSERT_EQ(*backend.consume(), 1u);
  ASSERT_TRUE(ev_->dom0_close(dp));
  auto s = ev_->status(*p);
  EXPECT_EQ(s->status, EvtchnStat::unbound);
  EXPECT_EQ(s->remote_dom, 0);
  EXPECT_EQ(ev_->kick_fd(dp), -1);
  EXPECT_EQ(ev_->dom0_close(dp).error(), XenErrno::einval);
  EXPECT_TRUE(ev_->send(*p));            // unbound: dropped
  EXPECT_EQ(*backend.consume(), 0u);     // the backend's old fds no longer hear the guest
  ASSERT_TRUE(backend.notify());         // nor reach it
  EXPECT_EQ(ev_->service_dom0_kicks(), 0u);
  EXPECT_FALSE(pending(*p));
  auto again = ev_->bind_to_dom0(*p);    // a restarted backend binds again
  ASSERT_TRUE(again);
  EXPECT_EQ(again->dom0_port, dp);       // the endpoint number is reused
}

TEST_F(EvtchnDom0, Dom0AllocUnboundThenTheGuestBindsIt) {
  auto fds = ev_->dom0_alloc_unbound();
  ASSERT_TRUE(fds);
  EXPECT_EQ(fds->guest_port, 0u);
  const Port dp = fds->dom0_port;
  EXPECT_EQ(ev_->dom0_status(dp)->status, EvtchnStat::unbound);
  Dom0Port backend(std::move(*fds));
  EXPECT_EQ(ev_->bind_interdomain(0, dp + 1).error(), XenErrno::einval);
  EXPECT_EQ(ev_->bind_interdomain(0, 0).error(), XenErrno::einval);
  auto p = ev_->bind_interdomain(0, dp);
  ASSERT_TRUE(p);
  EXPECT_TRUE(pending(*p));  // the guest's new port starts pending (Xen)
  EXPECT_EQ(sink_.count(), 1u);
  EXPECT_EQ(ev_->bind_interdomain(0, dp).error(), XenErrno::einval);  // already connected
  auto s = ev_->status(*p);
  EXPECT_EQ(s->remote_dom, 0);
  EXPECT_EQ(s->remote_port, dp);
  ASSERT_TRUE(ev_->send(*p));
  EXPECT_EQ(*backend.consume(), 1u);
  guest_handle(0);
  ASSERT_TRUE(backend.notify());
  EXPECT_EQ(*ev_->service_dom0_kick(dp), 1u);
  EXPECT_TRUE(pending(*p));
  EXPECT_EQ(sink_.count(), 2u);
}

TEST_F(EvtchnDom0, ResetUnbindsDom0Endpoints) {
  auto p = ev_->alloc_unbound(0);
  auto fds = ev_->bind_to_dom0(*p);
  ASSERT_TRUE(fds);
  ev_->reset();
  EXPECT_EQ(ev_->dom0_status(fds->dom0_port)->status, EvtchnStat::unbound);
  EXPECT_EQ(ev_->status(*p)->status, EvtchnStat::closed);
}

class EvtchnDom0Small : public EvtchnTest {
 protected:
  EvtchnDom0Small() : EvtchnTest(1, 3) {}
};

TEST_F(EvtchnDom0Small, Dom0EndpointsAreLimited) {
  ASSERT_TRUE(ev_->dom0_alloc_unbound());
  ASSERT_TRUE(ev_->dom0_alloc_unbound());
  EXPECT_EQ(ev_->dom0_alloc_unbound().error(), XenErrno::enospc);
  ASSERT_TRUE(ev_->dom0_close(1));
  auto again = ev_->dom0_alloc_unbound();
  ASSERT_TRUE(again);
  EXPECT_EQ(again->dom0_port, 1u);
}

// Thread A (a backend) notifies N times through its Dom0Port; thread B (the domain's event loop
// plus the guest's handler) polls the kick fd, lets the guest handle what was delivered before,
// then services the kick. Every notification must be consumed exactly once in total, every
// non-empty service must produce exactly one upcall (the guest had cleared everything before),
// and the last one leaves the port pending.
TEST_F(EvtchnDom0, TwoThreadsEveryKickIsDelivered) {
  auto p = ev_->alloc_unbound(0);
  auto fds = ev_->bind_to_dom0(*p);
  ASSERT_TRUE(fds);
  const Port dp = fds->dom0_port;
  const int kick = ev_->kick_fd(dp);
  Dom0Port backend(std::move(*fds));
  constexpr std::uint64_t kN = 20000;

  std::thread a([&] {
    for (std::uint64_t i = 0; i < kN; ++i) {
      (void)backend.notify();
      if (i % 64 == 0) std::this_thread::yield();
    }
  });

  std::uint64_t consumed = 0, services = 0, handled = 0;
  for (std::uint64_t iter = 0; iter < 4 * kN && consumed < kN; ++iter) {
    pollfd pfd{kick, POLLIN, 0};
    if (poll(&pfd, 1, 1000) != 1) continue;
    handled += guest_handle(0).size();
    auto n = ev_->service_dom0_kick(dp);
    ASSERT_TRUE(n);
    consumed += *n;
    if (*n) ++services;
  }
  a.join();
  consumed += *ev_->service_dom0_kick(dp);  // nothing may be left over

  EXPECT_EQ(consumed, kN);
  EXPECT_GE(services, 1u);
  EXPECT_EQ(sink_.count(), services);
  EXPECT_EQ(handled + 1, services);
  EXPECT_TRUE(pending(*p));
  EXPECT_EQ(upcall_pending(0), 1);
}

}  // namespace
}  // namespace xpv::domain::test
