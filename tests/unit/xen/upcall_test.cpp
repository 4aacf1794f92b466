// Upcall routing: per-vCPU vector, global callback vector, platform-pci INTx (level, EOI), the
// drop-then-deliver-once rule before the guest chose, and the guest's choice over the offer.
#include <atomic>
#include <map>
#include <thread>

#include "fakes.h"
#include "xpv/domain/shared_info.h"

namespace xpv::xen::test {
namespace {

using namespace abi;
using domain::kDomidSelf;

constexpr std::uint64_t kVectorCb = (std::uint64_t{2} << 56);
constexpr std::uint64_t kPciIntxCb = (std::uint64_t{1} << 56) | (3u << 3);  // 00:03.0 INTA
constexpr std::uint64_t kGsiCb = 10;                                       // GSI 10

using Inj = std::vector<std::pair<unsigned, std::uint8_t>>;

class Upcalls : public PlatformTest {
 protected:
  explicit Upcalls(UpcallMode offered = UpcallMode::vcpu_vector)
      : PlatformTest(test_config(offered)) {
    ram_ = &host_.add_ram(0x800);
    mem_.put(kArg, AddToPhysmap{kDomidSelf, 0, kMapspaceSharedInfo, 0, 0x800});
    EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmap, kArg), 0);
  }
  domain::SharedInfo& si() { return *reinterpret_cast<domain::SharedInfo*>(ram_->bytes); }
  std::int64_t set_callback(std::uint64_t v) {
    mem_.put(kArg, HvmParam{kDomidSelf, 0, kParamCallbackIrq, v});
    return call(kHcHvmOp, kHvmopSetParam, kArg);
  }
  std::int64_t set_vcpu_vector(std::uint32_t vcpu, std::uint8_t vec) {
    mem_.put(kArg, HvmEvtchnUpcallVector{vcpu, vec, {}});
    return call(kHcHvmOp, kHvmopSetEvtchnUpcallVector, kArg);
  }
  domain::Port ipi(unsigned vcpu) {
    auto p = ev_->bind_ipi(vcpu);
    EXPECT_TRUE(p);
    return p ? *p : 0;
  }
  // The guest's upcall handler: clears upcall_pending, the selector and the pending bits.
  void guest_handles(unsigned v) {
    std::atomic_ref<std::uint8_t>(si().vcpu_info[v].evtchn_upcall_pending).store(0);
    std::atomic_ref<std::uint64_t>(si().vcpu_info[v].evtchn_pending_sel).store(0);
    for (auto& w : si().evtchn_pending) std::atomic_ref<std::uint64_t>(w).store(0);
  }

  Page* ram_ = nullptr;
};

TEST_F(Upcalls, BeforeTheGuestChoosesEventsStayPendingAndAreDeliveredOnceOnChoice) {
  const auto p = ipi(0);
  ASSERT_TRUE(ev_->send(p));
  EXPECT_TRUE(host_.injected().empty());
  EXPECT_TRUE(host_.intx().empty());
  EXPECT_EQ(platform_->upcalls_dropped(), 1u);
  EXPECT_EQ(si().vcpu_info[0].evtchn_upcall_pending, 1);
  ASSERT_EQ(set_callback(kVectorCb | 0xf3), 0);
  EXPECT_EQ(host_.injected(), (Inj{{0, 0xf3}}));  // only vCPU 0 had something waiting
  ASSERT_EQ(set_callback(kVectorCb | 0xf3), 0);   // still pending (guest has not handled it)
  EXPECT_EQ(host_.injected(), (Inj{{0, 0xf3}, {0, 0xf3}}));
}

TEST_F(Upcalls, PerVcpuVectorWinsOverTheGlobalVector) {
  ASSERT_EQ(set_callback(kVectorCb | 0xf3), 0);
  ASSERT_EQ(set_vcpu_vector(1, 0xf2), 0);
  EXPECT_TRUE(host_.injected().empty());
  ASSERT_TRUE(ev_->send(ipi(1)));
  ASSERT_TRUE(ev_->send(ipi(2)));
  EXPECT_EQ(host_.injected(), (Inj{{1, 0xf2}, {2, 0xf3}}));
  EXPECT_TRUE(host_.intx().empty());
}

TEST_F(Upcalls, SettingTheVcpuVectorDeliversWhatIsAlreadyPending) {
  ASSERT_TRUE(ev_->send(ipi(3)));
  EXPECT_TRUE(host_.injected().empty());
  ASSERT_EQ(set_vcpu_vector(2, 0xf3), 0);
  EXPECT_TRUE(host_.injected().empty());  // vCPU 2 has nothing pending
  ASSERT_EQ(set_vcpu_vector(3, 0xf3), 0);
  EXPECT_EQ(host_.injected(), (Inj{{3, 0xf3}}));
}

TEST_F(Upcalls, LinuxMarkerVectorZeroIsStoredButNeverInjected) {
  // A CALLBACK_IRQ of vector type with a vector below 0x10 (Linux with per-vCPU vectors writes GSI 1
  // "to trick the toolstack", FreeBSD 1 too; a vector 0 must be just as harmless): it must not
  // turn into injections of vector 0.
  for (unsigned v = 0; v < 3; ++v) ASSERT_EQ(set_vcpu_vector(v, 0xf3), 0);
  ASSERT_EQ(set_callback(kVectorCb | 0), 0);
  ASSERT_TRUE(ev_->send(ipi(0)));
  ASSERT_TRUE(ev_->send(ipi(3)));  // vCPU 3 has no per-vCPU vector: dropped
  EXPECT_EQ(host_.injected(), (Inj{{0, 0xf3}}));
  EXPECT_EQ(platform_->upcalls_dropped(), 1u);
}

TEST_F(Upcalls, TheHostIsToldOfTheGlobalVectorBeforeItIsUsedAndWhenItIsGivenUp) {
  // Xen injects the global callback vector outside the LAPIC and Linux sends no EOI for it: the
  // host must know before the first injection, and again when the guest leaves that mode.
  ASSERT_EQ(set_callback(kVectorCb | 0xf3), 0);
  EXPECT_EQ(host_.callback_vectors(), std::vector<std::uint8_t>{0xf3});
  ASSERT_EQ(set_callback(kVectorCb | 0xf3), 0);  // the same choice again: nothing to tell
  EXPECT_EQ(host_.callback_vectors(), std::vector<std::uint8_t>{0xf3});
  ASSERT_EQ(set_callback(kVectorCb | 0xe0), 0);
  ASSERT_EQ(set_callback(kPciIntxCb), 0);
  EXPECT_EQ(host_.callback_vectors(), (std::vector<std::uint8_t>{0xf3, 0xe0, 0}));
  ASSERT_EQ(set_callback(kVectorCb | 0), 0);  // Linux's marker is no global vector: nothing to tell
  ASSERT_EQ(set_callback(kGsiCb), 0);
  EXPECT_EQ(host_.callback_vectors(), (std::vector<std::uint8_t>{0xf3, 0xe0, 0}));
}

TEST_F(Upcalls, TheHostLearnsEveryVcpusUpcallRouteWheneverTheGuestChangesIt) {
  // What xpv-vmm routes its direct upcall lines to (kvm/README.md "Upcall lines").
  using Routes = std::map<unsigned, std::uint8_t>;
  EXPECT_TRUE(host_.routes().empty());
  ASSERT_EQ(set_callback(kVectorCb | 0xf3), 0);  // the global vector: every vCPU
  EXPECT_EQ(host_.routes(), (Routes{{0, 0xf3}, {1, 0xf3}, {2, 0xf3}, {3, 0xf3}}));
  ASSERT_EQ(set_vcpu_vector(1, 0xe0), 0);  // a vCPU's own vector wins
  EXPECT_EQ(host_.routes(), (Routes{{0, 0xf3}, {1, 0xe0}, {2, 0xf3}, {3, 0xf3}}));
  const unsigned calls = host_.route_calls();
  ASSERT_EQ(set_vcpu_vector(1, 0xe0), 0);  // no change, nothing to tell
  EXPECT_EQ(host_.route_calls(), calls);
  ASSERT_EQ(set_callback(kPciIntxCb), 0);  // INTx: no vector, except vCPU 1's own
  EXPECT_EQ(host_.routes(), (Routes{{0, 0}, {1, 0xe0}, {2, 0}, {3, 0}}));
  ASSERT_EQ(set_callback(kVectorCb | 0), 0);  // Linux's marker: still no global vector
  EXPECT_EQ(host_.routes(), (Routes{{0, 0}, {1, 0xe0}, {2, 0}, {3, 0}}));
}

TEST_F(Upcalls, AGlobalVectorTheHostCannotDeliverIsRefusedAndThePreviousChoiceStays) {
  ASSERT_EQ(set_callback(kPciIntxCb), 0);
  host_.refuse_callback_vectors();
  EXPECT_EQ(set_callback(kVectorCb | 0xf3), -38);  // -ENOSYS: Linux then keeps to what it had
  mem_.put(kArg, HvmParam{kDomidSelf, 0, kParamCallbackIrq, 0});
  ASSERT_EQ(call(kHcHvmOp, kHvmopGetParam, kArg), 0);
  EXPECT_EQ(mem_.get<HvmParam>(kArg).value, kPciIntxCb);
  ASSERT_TRUE(ev_->send(ipi(0)));
  EXPECT_TRUE(host_.injected().empty());
  EXPECT_EQ(host_.intx(), std::vector<bool>{true});
}

TEST_F(Upcalls, RegisteringVcpuInfoRaisesAnUpcallThroughTheChosenMode) {
  ASSERT_EQ(set_vcpu_vector(1, 0xf3), 0);
  host_.add_ram(0x900);
  mem_.put(kArg, VcpuRegisterVcpuInfo{0x900, 0, 0});
  ASSERT_EQ(call(kHcVcpuOp, kVcpuopRegisterVcpuInfo, 1, kArg), 0);
  EXPECT_EQ(host_.injected(), (Inj{{1, 0xf3}}));
}

TEST_F(Upcalls, IntxIsALevelForVcpu0OnlyAndFollowsEoi) {
  ASSERT_EQ(set_callback(kPciIntxCb), 0);
  EXPECT_TRUE(host_.intx().empty());  // nothing pending yet
  ASSERT_TRUE(ev_->send(ipi(1)));
  EXPECT_TRUE(host_.intx().empty());  // vCPU 1's event: not on INTx
  const auto p = ipi(0);
  ASSERT_TRUE(ev_->send(p));
  EXPECT_EQ(host_.intx(), std::vector<bool>{true});
  EXPECT_TRUE(host_.injected().empty());

  // EOI while vCPU 0's upcall_pending is still 1: stays asserted.
  platform_->intx_eoi();
  EXPECT_EQ(host_.intx(), (std::vector<bool>{true, true}));
  // The guest handled it, then EOIs: de-asserted.
  guest_handles(0);
  platform_->intx_eoi();
  EXPECT_EQ(host_.intx(), (std::vector<bool>{true, true, false}));
  // A new event asserts again.
  ASSERT_TRUE(ev_->send(p));
  EXPECT_EQ(host_.intx(), (std::vector<bool>{true, true, false, true}));
}

TEST_F(Upcalls, GsiCallbackIsIntxAndGsiZeroIsNone) {
  ASSERT_TRUE(ev_->send(ipi(0)));
  ASSERT_EQ(set_callback(kGsiCb), 0);
  EXPECT_EQ(host_.intx(), std::vector<bool>{true});  // delivered once on choice
  guest_handles(0);
  ASSERT_EQ(set_callback(0), 0);  // GSI 0: callback disabled → line lowered
  EXPECT_EQ(host_.intx(), (std::vector<bool>{true, false}));
  ASSERT_TRUE(ev_->send(ipi(0)));
  EXPECT_EQ(host_.intx().size(), 2u);
  EXPECT_TRUE(host_.injected().empty());
}

TEST_F(Upcalls, LeavingIntxLowersTheLine) {
  ASSERT_EQ(set_callback(kPciIntxCb), 0);
  ASSERT_TRUE(ev_->send(ipi(0)));
  ASSERT_EQ(set_callback(kVectorCb | 0xf3), 0);
  // De-asserted, then the still-pending event goes out as the vector.
  EXPECT_EQ(host_.intx(), (std::vector<bool>{true, false}));
  EXPECT_EQ(host_.injected(), (Inj{{0, 0xf3}}));
  platform_->intx_eoi();  // not in INTx mode: only ever lowers
  EXPECT_EQ(host_.intx(), (std::vector<bool>{true, false, false}));
}

TEST_F(Upcalls, BadVcpuUpcallIsIgnored) {
  ASSERT_EQ(set_callback(kVectorCb | 0xf3), 0);
  platform_->upcall(4);
  platform_->upcall(~0u);
  EXPECT_TRUE(host_.injected().empty());
}

TEST_F(Upcalls, ConcurrentSendersAndEoiNeverLoseTheLevel) {
  // vCPU 0's events from several threads while the "guest" handles and EOIs: at the end, if
  // upcall_pending is set the line's last level must be asserted.
  ASSERT_EQ(set_callback(kPciIntxCb), 0);
  const auto p = ipi(0);
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    for (int i = 0; i < 2000 && !stop.load(); ++i) (void)ev_->send(p);
  });
  for (int i = 0; i < 2000; ++i) {
    guest_handles(0);
    platform_->intx_eoi();
  }
  stop = true;
  sender.join();
  auto levels = host_.intx();
  ASSERT_FALSE(levels.empty());
  if (ev_->upcall_pending(0)) {
    EXPECT_TRUE(levels.back());  // an undelivered event: the line is high
  }
  platform_->intx_eoi();
  levels = host_.intx();
  EXPECT_EQ(levels.back(), ev_->upcall_pending(0));
}

class UpcallsIntxOffered : public Upcalls {
 protected:
  UpcallsIntxOffered() : Upcalls(UpcallMode::intx) {}
};

TEST_F(UpcallsIntxOffered, TheGuestsOwnChoiceIsHonoured) {
  ASSERT_EQ(set_vcpu_vector(0, 0xf3), 0);
  ASSERT_TRUE(ev_->send(ipi(0)));
  EXPECT_EQ(host_.injected(), (Inj{{0, 0xf3}}));
}

// vCPUs ≥ 32 have no vcpu_info the guest can see until they register one; an event recorded in
// the host placeholder meanwhile is not an upcall to raise when the guest picks its upcall mode
// (found by tests/fuzz/xen, seed 73: HVMOP_set_evtchn_upcall_vector injected into vCPU 32).
class UpcallsManyVcpus : public PlatformTest {
 protected:
  static PlatformConfig config() {
    PlatformConfig c = test_config();
    c.vcpus = 34;
    return c;
  }
  UpcallsManyVcpus() : PlatformTest(config()) {}
};

TEST_F(UpcallsManyVcpus, NoUpcallForAVcpuWhoseVcpuInfoTheGuestCannotSee) {
  auto p = ev_->bind_ipi(33);
  ASSERT_TRUE(p && ev_->send(*p));
  mem_.put(kArg, HvmEvtchnUpcallVector{33, 0xf3, {}});
  ASSERT_EQ(call(kHcHvmOp, kHvmopSetEvtchnUpcallVector, kArg), 0);
  mem_.put(kArg, HvmParam{kDomidSelf, 0, kParamCallbackIrq, kVectorCb | 0xf2});
  ASSERT_EQ(call(kHcHvmOp, kHvmopSetParam, kArg), 0);
  EXPECT_TRUE(host_.injected().empty());
  EXPECT_FALSE(ev_->upcall_pending(33));  // what xpv-vmm's re-assertion looks at
  // Registered: the upcall comes, with the vCPU's own vector, and the guest can see it.
  Page& ram = host_.add_ram(0x900);
  mem_.put(kArg, VcpuRegisterVcpuInfo{0x900, 64, 0});
  ASSERT_EQ(call(kHcVcpuOp, kVcpuopRegisterVcpuInfo, 33, kArg), 0);
  EXPECT_EQ(host_.injected(), (Inj{{33, 0xf3}}));
  EXPECT_EQ(ram.bytes[64], 1);  // evtchn_upcall_pending of the registered vcpu_info
  EXPECT_TRUE(ev_->upcall_pending(33));
}

}  // namespace
}  // namespace xpv::xen::test
