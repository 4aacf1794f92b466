// The exact 2-level delivery sequence (XEN-GUEST-ABI.md "Upcalls"): pending → (mask) →
// pending_sel → upcall_pending → sink, and unmask's re-delivery.
#include <algorithm>
#include <thread>
#include <utility>

#include "fixture.h"

namespace xpv::domain::test {
namespace {

class EvtchnDelivery : public EvtchnTest {
 protected:
  // A loopback pair: a send on .first makes .second pending, and .second notifies vCPU v (the
  // bind's own event already handled on vCPU 0). {0, 0} if a step failed.
  std::pair<Port, Port> loopback_to(unsigned v) {
    auto a = ev_->alloc_unbound(kDomidSelf);
    if (!a) return {0, 0};
    auto b = ev_->bind_interdomain(kDomidSelf, *a);
    if (!b) return {0, 0};
    guest_handle(0);
    if (!ev_->bind_vcpu(*b, v)) return {0, 0};
    return {*a, *b};
  }
};

// Binds IPI ports on vcpu until `want` is allocated (ports are handed out lowest first).
Port ipi_port_number(EventChannels& ev, unsigned vcpu, Port want) {
  Port got = 0;
  while (got != want) got = *ev.bind_ipi(vcpu);
  return got;
}

TEST_F(EvtchnDelivery, SendSetsPendingThenSelThenUpcallPendingThenCallsTheSink) {
  const Port p = ipi_port_number(*ev_, 0, 5);
  ASSERT_TRUE(ev_->send(p));
  EXPECT_EQ(si().evtchn_pending[0], std::uint64_t{1} << 5);
  EXPECT_EQ(sel(0), 1u);  // word 0
  EXPECT_EQ(upcall_pending(0), 1);
  EXPECT_EQ(sink_.calls(), std::vector<unsigned>{0});
  for (unsigned v = 1; v < 4; ++v) {
    EXPECT_EQ(sel(v), 0u);
    EXPECT_EQ(upcall_pending(v), 0);
  }
}

TEST_F(EvtchnDelivery, PortInTheSecondWordSetsSelectorBitOne) {
  const Port p = ipi_port_number(*ev_, 1, 70);
  ASSERT_TRUE(ev_->send(p));
  EXPECT_EQ(si().evtchn_pending[0], 0u);
  EXPECT_EQ(si().evtchn_pending[1], std::uint64_t{1} << 6);
  EXPECT_EQ(sel(1), 2u);
  EXPECT_EQ(sink_.calls(), std::vector<unsigned>{1});
}

TEST_F(EvtchnDelivery, LastPortUsesTheLastWordAndSelectorBit) {
  const Port p = ipi_port_number(*ev_, 0, 4095);
  ASSERT_TRUE(ev_->send(p));
  EXPECT_EQ(si().evtchn_pending[63], std::uint64_t{1} << 63);
  EXPECT_EQ(sel(0), std::uint64_t{1} << 63);
}

TEST_F(EvtchnDelivery, TwoSendsBeforeTheGuestClearsGiveExactlyOneUpcall) {
  auto p = ev_->bind_ipi(0);
  ASSERT_TRUE(ev_->send(*p));
  ASSERT_TRUE(ev_->send(*p));
  EXPECT_EQ(sink_.count(), 1u);
  EXPECT_EQ(guest_handle(0), std::vector<Port>{*p});
  EXPECT_EQ(sel(0), 0u);
  EXPECT_EQ(upcall_pending(0), 0);
  ASSERT_TRUE(ev_->send(*p));  // after the guest handled it, the next send upcalls again
  EXPECT_EQ(sink_.count(), 2u);
}

TEST_F(EvtchnDelivery, AnAlreadyPendingPortDoesNothingElse) {
  auto p = ev_->bind_ipi(0);
  ASSERT_TRUE(ev_->send(*p));
  // The guest cleared the selector and upcall_pending but not (yet) the port's pending bit.
  std::atomic_ref<std::uint8_t>(si().vcpu_info[0].evtchn_upcall_pending).store(0);
  std::atomic_ref<std::uint64_t>(si().vcpu_info[0].evtchn_pending_sel).store(0);
  ASSERT_TRUE(ev_->send(*p));
  EXPECT_EQ(sel(0), 0u);
  EXPECT_EQ(upcall_pending(0), 0);
  EXPECT_EQ(sink_.count(), 1u);
}

TEST_F(EvtchnDelivery, SecondPortOfAWordWhoseSelectorBitIsSetDoesNotUpcall) {
  auto a = ev_->bind_ipi(0);
  auto b = ev_->bind_ipi(0);
  ASSERT_TRUE(ev_->send(*a));
  std::atomic_ref<std::uint8_t>(si().vcpu_info[0].evtchn_upcall_pending).store(0);
  ASSERT_TRUE(ev_->send(*b));
  EXPECT_TRUE(pending(*a) && pending(*b));
  EXPECT_EQ(upcall_pending(0), 0);  // stopped at the selector
  EXPECT_EQ(sink_.count(), 1u);
}

TEST_F(EvtchnDelivery, UpcallPendingStillSetMeansNoSecondUpcall) {
  const Port a = ipi_port_number(*ev_, 0, 1);
  const Port b = ipi_port_number(*ev_, 0, 65);
  ASSERT_TRUE(ev_->send(a));
  ASSERT_TRUE(ev_->send(b));  // new word: selector bit 1 set, upcall_pending already 1
  EXPECT_EQ(sel(0), 3u);
  EXPECT_EQ(sink_.count(), 1u);
}

TEST_F(EvtchnDelivery, MaskedPortSetsPendingOnly) {
  auto p = ev_->bind_ipi(2);
  set_mask(*p, true);
  ASSERT_TRUE(ev_->send(*p));
  EXPECT_TRUE(pending(*p));
  EXPECT_EQ(sel(2), 0u);
  EXPECT_EQ(upcall_pending(2), 0);
  EXPECT_EQ(sink_.count(), 0u);
}

TEST_F(EvtchnDelivery, UnmaskDeliversAPendingMaskedPort) {
  auto p = ev_->bind_ipi(2);
  set_mask(*p, true);
  ASSERT_TRUE(ev_->send(*p));
  ASSERT_TRUE(ev_->unmask(*p));
  EXPECT_FALSE(masked(*p));
  EXPECT_EQ(sel(2), 1u);
  EXPECT_EQ(upcall_pending(2), 1);
  EXPECT_EQ(sink_.calls(), std::vector<unsigned>{2});
}

TEST_F(EvtchnDelivery, UnmaskWithNothingPendingOnlyClearsTheMask) {
  auto p = ev_->bind_ipi(0);
  set_mask(*p, true);
  ASSERT_TRUE(ev_->unmask(*p));
  EXPECT_FALSE(masked(*p));
  EXPECT_EQ(sel(0), 0u);
  EXPECT_EQ(sink_.count(), 0u);
}

TEST_F(EvtchnDelivery, UnmaskOfAnUnmaskedPortDoesNotRedeliver) {
  // Xen re-delivers only on a 1 → 0 mask transition.
  auto p = ev_->bind_ipi(0);
  ASSERT_TRUE(ev_->send(*p));
  std::atomic_ref<std::uint8_t>(si().vcpu_info[0].evtchn_upcall_pending).store(0);
  std::atomic_ref<std::uint64_t>(si().vcpu_info[0].evtchn_pending_sel).store(0);
  ASSERT_TRUE(ev_->unmask(*p));
  EXPECT_EQ(sel(0), 0u);
  EXPECT_EQ(sink_.count(), 1u);
}

// A local unmask in the order of older Linux kernels (no hypercall): it saw the port not pending,
// then an event arrived while the port was still masked, then it cleared the mask bit itself.
TEST_F(EvtchnDelivery, AnEdgeTheGuestsOwnUnmaskLostIsSignalledAgainOnTheSecondLook) {
  auto p = ev_->bind_ipi(2);
  set_mask(*p, true);
  ASSERT_TRUE(ev_->send(*p));  // masked: pending only
  set_mask(*p, false);         // the guest's own unmask, no hypercall
  ASSERT_TRUE(ev_->send(*p));  // already pending: nothing either
  EXPECT_EQ(sink_.count(), 0u);
  Port first = 0;
  EXPECT_EQ(ev_->redeliver_lost_edges(&first), 0u) << "one sighting is not enough";
  EXPECT_EQ(sink_.count(), 0u);
  EXPECT_EQ(ev_->redeliver_lost_edges(&first), 1u);
  EXPECT_EQ(first, *p);
  EXPECT_EQ(sel(2), 1u);
  EXPECT_EQ(upcall_pending(2), 1);
  EXPECT_EQ(sink_.calls(), std::vector<unsigned>{2});
  EXPECT_EQ(guest_handle(2), std::vector<Port>{*p});
  // Handled: nothing more to find.
  EXPECT_EQ(ev_->redeliver_lost_edges(), 0u);
  EXPECT_EQ(ev_->redeliver_lost_edges(), 0u);
  EXPECT_EQ(sink_.count(), 1u);
}

TEST_F(EvtchnDelivery, PortsAlreadySignalledMaskedOrHandledInBetweenAreLeftAlone) {
  auto signalled = ev_->bind_ipi(1);  // pending with its selector bit: the guest will scan it
  auto masked_port = ev_->bind_ipi(1);
  auto handled = ev_->bind_ipi(3);
  ASSERT_TRUE(ev_->send(*signalled));
  set_mask(*masked_port, true);
  ASSERT_TRUE(ev_->send(*masked_port));
  set_mask(*handled, true);
  ASSERT_TRUE(ev_->send(*handled));
  set_mask(*handled, false);
  EXPECT_EQ(ev_->redeliver_lost_edges(), 0u);  // first sighting of `handled`
  // The guest finds `handled` on a scan of its own in between (another port's event).
  std::atomic_ref<std::uint64_t>(si().evtchn_pending[0]).fetch_and(~(std::uint64_t{1} << *handled));
  EXPECT_EQ(ev_->redeliver_lost_edges(), 0u);
  EXPECT_EQ(ev_->redeliver_lost_edges(), 0u);
  EXPECT_EQ(sink_.calls(), std::vector<unsigned>{1});
  EXPECT_EQ(sel(3), 0u);
}

TEST_F(EvtchnDelivery, ALostEdgeGoesToThePortsNotifyVcpu) {
  const auto [a, b] = loopback_to(3);
  ASSERT_NE(b, 0u);
  set_mask(b, true);
  ASSERT_TRUE(ev_->send(a));
  set_mask(b, false);
  const unsigned before = sink_.count();
  (void)ev_->redeliver_lost_edges();
  EXPECT_EQ(ev_->redeliver_lost_edges(), 1u);
  EXPECT_EQ(sink_.count(), before + 1);
  EXPECT_EQ(sink_.calls().back(), 3u);
  EXPECT_EQ(guest_handle(3), std::vector<Port>{b});
}

TEST_F(EvtchnDelivery, UnmaskRangeChecks) {
  EXPECT_EQ(ev_->unmask(4096).error(), XenErrno::einval);
  set_mask(0, true);
  EXPECT_TRUE(ev_->unmask(0));  // port 0 is a valid index in Xen
  EXPECT_FALSE(masked(0));
}

TEST_F(EvtchnDelivery, UpcallMaskDoesNotSuppressRecordingOrTheSink) {
  std::atomic_ref<std::uint8_t>(si().vcpu_info[1].evtchn_upcall_mask).store(1);
  EXPECT_TRUE(ev_->upcall_masked(1));
  EXPECT_FALSE(ev_->upcall_masked(0));
  auto p = ev_->bind_ipi(1);
  ASSERT_TRUE(ev_->send(*p));
  EXPECT_EQ(upcall_pending(1), 1);
  EXPECT_EQ(sink_.calls(), std::vector<unsigned>{1});  // the sink decides about the mask
}

TEST_F(EvtchnDelivery, BindVcpuMovesDeliveryToAnotherVcpu) {
  const auto [a, b] = loopback_to(3);
  ASSERT_NE(b, 0u);
  ASSERT_TRUE(ev_->send(a));
  EXPECT_TRUE(pending(b));
  EXPECT_EQ(sel(0), 0u);
  EXPECT_EQ(upcall_pending(0), 0);
  EXPECT_EQ(sel(3), 1u);
  EXPECT_EQ(upcall_pending(3), 1);
  EXPECT_EQ(sink_.calls().back(), 3u);
  EXPECT_EQ(guest_handle(3), std::vector<Port>{b});
}

TEST_F(EvtchnDelivery, RegisteredVcpuInfoReplacesTheLegacySlot) {
  auto area = std::make_unique<Page>();
  auto* info = reinterpret_cast<VcpuInfo*>(area->bytes + 256);
  ASSERT_TRUE(ev_->register_vcpu_info(1, area->span().subspan(256, 64)));
  // Registration marks everything possibly pending and raises an upcall, as Xen does.
  EXPECT_EQ(info->evtchn_pending_sel, ~std::uint64_t{0});
  EXPECT_EQ(info->evtchn_upcall_pending, 1);
  EXPECT_EQ(sink_.calls(), std::vector<unsigned>{1});
  info->evtchn_pending_sel = 0;
  info->evtchn_upcall_pending = 0;

  const Port p = ipi_port_number(*ev_, 1, 66);
  ASSERT_TRUE(ev_->send(p));
  EXPECT_EQ(info->evtchn_pending_sel, 2u);
  EXPECT_EQ(info->evtchn_upcall_pending, 1);
  EXPECT_EQ(sel(1), 0u);  // the legacy slot is no longer used
  EXPECT_EQ(upcall_pending(1), 0);
  EXPECT_EQ(sink_.count(), 2u);
}

TEST_F(EvtchnDelivery, RegistrationCarriesOverPendingState) {
  auto p = ev_->bind_ipi(2);
  ASSERT_TRUE(ev_->send(*p));  // upcall_pending = 1 in the legacy slot
  si().vcpu_info[2].time.system_time = 12345;
  auto area = std::make_unique<Page>();
  ASSERT_TRUE(ev_->register_vcpu_info(2, area->span().subspan(0, 64)));
  auto* info = reinterpret_cast<VcpuInfo*>(area->bytes);
  EXPECT_EQ(info->evtchn_upcall_pending, 1);
  EXPECT_EQ(info->time.system_time, 12345u);
  EXPECT_EQ(sink_.count(), 1u);  // upcall_pending was already 1: no second upcall
}

// Four "vCPU" threads send on their own IPI ports while a fifth binds and closes other ports of
// the same pending word (exclusive lock, atomic clears next to the senders' atomic sets). Nothing
// is lost: every port ends pending and each vCPU got exactly one upcall (the guest never cleared).
TEST_F(EvtchnDelivery, ConcurrentSendersAndBindersLoseNothing) {
  std::vector<Port> ports;
  for (unsigned v = 0; v < 4; ++v) ports.push_back(*ev_->bind_ipi(v));
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (unsigned v = 0; v < 4; ++v) {
    threads.emplace_back([&, v] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < 5000; ++i) (void)ev_->send(ports[v]);
    });
  }
  threads.emplace_back([&] {
    while (!go.load()) std::this_thread::yield();
    for (int i = 0; i < 2000; ++i) {
      auto p = ev_->bind_ipi(0);
      if (p) {
        (void)ev_->send(*p);
        (void)ev_->close(*p);
      }
    }
  });
  go.store(true);
  for (auto& t : threads) t.join();
  for (unsigned v = 0; v < 4; ++v) {
    EXPECT_TRUE(pending(ports[v])) << v;
    EXPECT_EQ(sel(v), 1u) << v;
    EXPECT_EQ(upcall_pending(v), 1) << v;
  }
  auto calls = sink_.calls();
  std::sort(calls.begin(), calls.end());
  EXPECT_EQ(calls, (std::vector<unsigned>{0, 1, 2, 3}));
  EXPECT_EQ(si().evtchn_pending[0], (std::uint64_t{1} << 1) | (1 << 2) | (1 << 3) | (1 << 4));
}

class EvtchnManyVcpus : public EvtchnTest {
 protected:
  EvtchnManyVcpus() : EvtchnTest(40) {}
};

TEST_F(EvtchnManyVcpus, VcpuBeyond32HasNoUpcallUntilItRegisters) {
  auto p = ev_->bind_ipi(35);
  ASSERT_TRUE(p);
  ASSERT_TRUE(ev_->send(*p));
  EXPECT_TRUE(pending(*p));
  EXPECT_EQ(sink_.count(), 0u);
  EXPECT_FALSE(ev_->upcall_pending(35));  // the host placeholder is not an upcall to raise
  auto area = std::make_unique<Page>();
  ASSERT_TRUE(ev_->register_vcpu_info(35, area->span().subspan(512, 64)));
  auto* info = reinterpret_cast<VcpuInfo*>(area->bytes + 512);
  EXPECT_EQ(info->evtchn_pending_sel, ~std::uint64_t{0});
  EXPECT_EQ(info->evtchn_upcall_pending, 1);
  EXPECT_EQ(sink_.calls(), std::vector<unsigned>{35});
  EXPECT_TRUE(ev_->upcall_pending(35));
}

}  // namespace
}  // namespace xpv::domain::test
