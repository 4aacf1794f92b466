// SendRouteSink: which guest ports EventChannels hands to the VMM for in-kernel sends (a KVM
// ioeventfd per port connected to a dom0 endpoint), and that each route is taken back, with the
// same descriptor, whenever the connection goes — from either side.
#include <sys/eventfd.h>

#include <algorithm>
#include <vector>

#include "fixture.h"

namespace xpv::domain::test {
namespace {

// Records the routes as the VMM's ioeventfds would be: routing a port twice, or taking back a
// route that is not there, is a test failure (KVM would answer EEXIST / ENOENT).
class RecordingRoutes final : public SendRouteSink {
 public:
  bool refuse = false;
  struct Route {
    Port port;
    int fd;
    bool operator==(const Route&) const = default;
  };
  std::vector<Route> live;
  int routes = 0, unroutes = 0;

  bool route(Port guest_port, int to_dom0_fd) noexcept override {
    if (refuse) return false;
    EXPECT_EQ(std::count_if(live.begin(), live.end(), [&](const Route& r) { return r.port == guest_port; }), 0)
        << "port " << guest_port << " routed twice";
    live.push_back({guest_port, to_dom0_fd});
    ++routes;
    return true;
  }
  void unroute(Port guest_port, int to_dom0_fd) noexcept override {
    auto it = std::find(live.begin(), live.end(), Route{guest_port, to_dom0_fd});
    EXPECT_NE(it, live.end()) << "port " << guest_port << " unrouted but not routed with that descriptor";
    if (it != live.end()) live.erase(it);
    ++unroutes;
  }
  bool routed(Port p) const {
    return std::any_of(live.begin(), live.end(), [&](const Route& r) { return r.port == p; });
  }
  int fd_of(Port p) const {
    for (const Route& r : live)
      if (r.port == p) return r.fd;
    return -1;
  }
};

class EvtchnSendRoute : public EvtchnTest {
 protected:
  EvtchnSendRoute() { ev_->set_send_route_sink(&routes_); }
  ~EvtchnSendRoute() override { ev_->set_send_route_sink(nullptr); }
  RecordingRoutes routes_;
};

TEST_F(EvtchnSendRoute, APortBoundByTheBackendIsRoutedToItsToDom0EventFd) {
  auto p = ev_->alloc_unbound(0);
  auto fds = ev_->bind_to_dom0(*p);
  ASSERT_TRUE(fds);
  ASSERT_TRUE(routes_.routed(*p));
  Dom0Port backend(std::move(*fds));
  ASSERT_EQ(*backend.consume(), 1u);
  // What KVM does with the route on a send: signal that eventfd. The backend hears it.
  ASSERT_EQ(eventfd_write(routes_.fd_of(*p), 1), 0);
  EXPECT_EQ(*backend.consume(), 1u);
}

TEST_F(EvtchnSendRoute, APortTheGuestBindsToADom0EndpointIsRouted) {
  auto fds = ev_->dom0_alloc_unbound();
  ASSERT_TRUE(fds);
  EXPECT_TRUE(routes_.live.empty());  // nothing to route before the guest connects
  auto p = ev_->bind_interdomain(0, fds->dom0_port);
  ASSERT_TRUE(p);
  EXPECT_TRUE(routes_.routed(*p));
  EXPECT_EQ(routes_.live.size(), 1u);
}

TEST_F(EvtchnSendRoute, TheRouteGoesWithTheGuestsCloseAndComesBackWithItsRebind) {
  auto p = ev_->alloc_unbound(0);
  auto fds = ev_->bind_to_dom0(*p);
  ASSERT_TRUE(fds);
  const Port dp = fds->dom0_port;
  ASSERT_TRUE(ev_->close(*p));
  EXPECT_TRUE(routes_.live.empty());
  auto q = ev_->bind_interdomain(0, dp);
  ASSERT_TRUE(q);
  EXPECT_TRUE(routes_.routed(*q));
  EXPECT_EQ(routes_.routes, 2);
  EXPECT_EQ(routes_.unroutes, 1);
}

TEST_F(EvtchnSendRoute, TheRouteGoesWithTheBackendsCloseAndComesBackWhenARestartedOneBinds) {
  auto p = ev_->alloc_unbound(0);
  auto fds = ev_->bind_to_dom0(*p);
  ASSERT_TRUE(fds);
  ASSERT_TRUE(ev_->dom0_close(fds->dom0_port));
  EXPECT_TRUE(routes_.live.empty());
  EXPECT_TRUE(ev_->send(*p));  // unbound again: dropped, through send() now
  auto again = ev_->bind_to_dom0(*p);
  ASSERT_TRUE(again);
  EXPECT_TRUE(routes_.routed(*p));
  EXPECT_EQ(routes_.unroutes, 1);
  // The new route reaches the restarted backend, not the old one.
  Dom0Port old_backend(std::move(*fds));
  Dom0Port new_backend(std::move(*again));
  ASSERT_EQ(*new_backend.consume(), 1u);  // its bind's own wake-up
  (void)old_backend.consume();
  ASSERT_EQ(eventfd_write(routes_.fd_of(*p), 1), 0);
  EXPECT_EQ(*new_backend.consume(), 1u);
  EXPECT_EQ(*old_backend.consume(), 0u);
}

TEST_F(EvtchnSendRoute, ResetTakesEveryRouteBack) {
  for (int i = 0; i < 3; ++i) {
    auto p = ev_->alloc_unbound(0);
    ASSERT_TRUE(ev_->bind_to_dom0(*p));
  }
  EXPECT_EQ(routes_.live.size(), 3u);
  ev_->reset();
  EXPECT_TRUE(routes_.live.empty());
  EXPECT_EQ(routes_.unroutes, 3);
}

TEST_F(EvtchnSendRoute, LoopbackIpiVirqAndUnboundPortsAreNeverRouted) {
  auto a = ev_->alloc_unbound(kDomidSelf);
  ASSERT_TRUE(a);
  ASSERT_TRUE(ev_->bind_interdomain(kDomidSelf, *a));
  ASSERT_TRUE(ev_->bind_ipi(0));
  ASSERT_TRUE(ev_->bind_virq(0, 0));
  ASSERT_TRUE(ev_->alloc_unbound(0));
  ASSERT_TRUE(ev_->dom0_alloc_unbound());
  EXPECT_TRUE(routes_.live.empty());
  EXPECT_EQ(routes_.routes, 0);
}

TEST_F(EvtchnSendRoute, ASinkInstalledLaterRoutesWhatIsConnectedAndNullTakesItAllBack) {
  ev_->set_send_route_sink(nullptr);
  auto p = ev_->alloc_unbound(0);
  auto fds = ev_->bind_to_dom0(*p);
  ASSERT_TRUE(fds);
  EXPECT_TRUE(routes_.live.empty());
  ev_->set_send_route_sink(&routes_);
  EXPECT_TRUE(routes_.routed(*p));
  ev_->set_send_route_sink(nullptr);
  EXPECT_TRUE(routes_.live.empty());
  ASSERT_TRUE(ev_->close(*p));  // no sink: nothing to take back
  EXPECT_EQ(routes_.unroutes, 1);
}

TEST_F(EvtchnSendRoute, ARefusedRouteIsNeverTakenBack) {
  routes_.refuse = true;
  auto p = ev_->alloc_unbound(0);
  ASSERT_TRUE(ev_->bind_to_dom0(*p));
  ASSERT_TRUE(ev_->close(*p));
  EXPECT_EQ(routes_.unroutes, 0);
}

}  // namespace
}  // namespace xpv::domain::test
