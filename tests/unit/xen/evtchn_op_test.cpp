// event_channel_op through the platform: structs copied in/out exactly, DOMID_SELF checks, the
// EventChannels errors as -errno, the FIFO ops refused.
#include "fakes.h"

namespace xpv::xen::test {
namespace {

using namespace domain;
using abi::kHcEventChannelOp;

constexpr std::int64_t kEperm = -1, kEnoent = -2, kEfault = -14, kEexist = -17, kEinval = -22,
                       kEnosys = -38;

class EvtchnOps : public PlatformTest {
 protected:
  std::int64_t op(EvtchnOp cmd, std::uint64_t arg = kArg) {
    return call(kHcEventChannelOp, static_cast<std::uint64_t>(cmd), arg);
  }
  template <class T>
  std::int64_t op(EvtchnOp cmd, const T& in) {
    mem_.put(kArg, in);
    return op(cmd);
  }
};

TEST_F(EvtchnOps, AllocUnboundWritesThePortAndKeepsTheRest) {
  EXPECT_EQ(op(EvtchnOp::alloc_unbound, EvtchnAllocUnboundOp{kDomidSelf, 0, 0xffff}), 0);
  const auto a = mem_.get<EvtchnAllocUnboundOp>(kArg);
  EXPECT_EQ(a.port, 1u);
  EXPECT_EQ(a.dom, kDomidSelf);
  EXPECT_EQ(a.remote_dom, 0);
  EXPECT_EQ(ev_->status(1)->status, EvtchnStat::unbound);
  EXPECT_EQ(op(EvtchnOp::alloc_unbound, EvtchnAllocUnboundOp{5 /*own id*/, 0, 0}), 0);
  EXPECT_EQ(mem_.get<EvtchnAllocUnboundOp>(kArg).port, 2u);
  EXPECT_EQ(op(EvtchnOp::alloc_unbound, EvtchnAllocUnboundOp{6, 0, 0}), kEperm);
  EXPECT_EQ(op(EvtchnOp::alloc_unbound, kBad), kEfault);
}

TEST_F(EvtchnOps, LoopbackInterdomainAndStatus) {
  ASSERT_EQ(op(EvtchnOp::alloc_unbound, EvtchnAllocUnboundOp{kDomidSelf, kDomidSelf, 0}), 0);
  const Port a = mem_.get<EvtchnAllocUnboundOp>(kArg).port;
  ASSERT_EQ(op(EvtchnOp::bind_interdomain, EvtchnBindInterdomainOp{kDomidSelf, {}, a, 0}), 0);
  const Port b = mem_.get<EvtchnBindInterdomainOp>(kArg).local_port;
  EXPECT_EQ(b, 2u);

  EvtchnStatusOp s{};
  s.dom = kDomidSelf;
  s.port = b;
  std::memset(&s.u, 0xee, sizeof s.u);
  ASSERT_EQ(op(EvtchnOp::status, s), 0);
  auto r = mem_.get<EvtchnStatusOp>(kArg);
  EXPECT_EQ(r.status, static_cast<std::uint32_t>(EvtchnStat::interdomain));
  EXPECT_EQ(r.vcpu, 0u);
  EXPECT_EQ(r.u.interdomain.dom, 5);
  EXPECT_EQ(r.u.interdomain.port, a);
  EXPECT_EQ(r.u.interdomain.pad[0], 0);  // the union is cleared before filling

  EXPECT_EQ(op(EvtchnOp::bind_interdomain, EvtchnBindInterdomainOp{kDomidSelf, {}, a, 0}),
            kEinval);  // a is no longer unbound
  EXPECT_EQ(op(EvtchnOp::bind_interdomain, EvtchnBindInterdomainOp{9, {}, 1, 0}), -3);  // ESRCH
}

TEST_F(EvtchnOps, StatusOfEachKind) {
  auto status = [&](Port p) {
    EvtchnStatusOp s{};
    s.dom = kDomidSelf;
    s.port = p;
    EXPECT_EQ(op(EvtchnOp::status, s), 0);
    return mem_.get<EvtchnStatusOp>(kArg);
  };
  EXPECT_EQ(status(100).status, static_cast<std::uint32_t>(EvtchnStat::closed));
  ASSERT_EQ(op(EvtchnOp::bind_virq, EvtchnBindVirqOp{kVirqTimer, 3, 0}), 0);
  const Port v = mem_.get<EvtchnBindVirqOp>(kArg).port;
  auto s = status(v);
  EXPECT_EQ(s.status, static_cast<std::uint32_t>(EvtchnStat::virq));
  EXPECT_EQ(s.vcpu, 3u);
  EXPECT_EQ(s.u.virq, kVirqTimer);
  ASSERT_EQ(op(EvtchnOp::alloc_unbound, EvtchnAllocUnboundOp{kDomidSelf, 0, 0}), 0);
  s = status(mem_.get<EvtchnAllocUnboundOp>(kArg).port);
  EXPECT_EQ(s.status, static_cast<std::uint32_t>(EvtchnStat::unbound));
  EXPECT_EQ(s.u.unbound.dom, 0);
  ASSERT_EQ(op(EvtchnOp::bind_ipi, EvtchnBindIpiOp{2, 0}), 0);
  s = status(mem_.get<EvtchnBindIpiOp>(kArg).port);
  EXPECT_EQ(s.status, static_cast<std::uint32_t>(EvtchnStat::ipi));
  EXPECT_EQ(s.vcpu, 2u);

  EvtchnStatusOp bad{};
  bad.dom = 3;
  bad.port = v;
  EXPECT_EQ(op(EvtchnOp::status, bad), kEperm);
  bad.dom = kDomidSelf;
  bad.port = 4096;
  EXPECT_EQ(op(EvtchnOp::status, bad), kEinval);
  EXPECT_EQ(op(EvtchnOp::status, kBad), kEfault);
}

TEST_F(EvtchnOps, VirqIpiSendUnmaskCloseBindVcpu) {
  ASSERT_EQ(op(EvtchnOp::bind_virq, EvtchnBindVirqOp{kVirqTimer, 1, 0}), 0);
  const Port t = mem_.get<EvtchnBindVirqOp>(kArg).port;
  EXPECT_EQ(op(EvtchnOp::bind_virq, EvtchnBindVirqOp{kVirqTimer, 1, 0}), kEexist);
  EXPECT_EQ(op(EvtchnOp::bind_virq, EvtchnBindVirqOp{kVirqTimer, 4, 0}), kEnoent);
  EXPECT_EQ(op(EvtchnOp::bind_virq, EvtchnBindVirqOp{99, 0, 0}), kEinval);
  ASSERT_EQ(op(EvtchnOp::bind_ipi, EvtchnBindIpiOp{2, 0}), 0);
  const Port i = mem_.get<EvtchnBindIpiOp>(kArg).port;
  EXPECT_EQ(op(EvtchnOp::bind_ipi, EvtchnBindIpiOp{4, 0}), kEnoent);

  EXPECT_EQ(op(EvtchnOp::send, EvtchnPortOp{i}), 0);
  EXPECT_TRUE(ev_->port_pending(i));
  EXPECT_EQ(op(EvtchnOp::send, EvtchnPortOp{t}), kEinval);  // virq ports cannot be sent on
  EXPECT_EQ(op(EvtchnOp::send, EvtchnPortOp{4096}), kEinval);
  EXPECT_EQ(op(EvtchnOp::unmask, EvtchnPortOp{i}), 0);
  EXPECT_EQ(op(EvtchnOp::unmask, EvtchnPortOp{4096}), kEinval);
  EXPECT_EQ(op(EvtchnOp::bind_vcpu, EvtchnBindVcpuOp{i, 1}), kEinval);  // ipi is fixed
  EXPECT_EQ(op(EvtchnOp::bind_vcpu, EvtchnBindVcpuOp{i, 9}), kEnoent);
  EXPECT_EQ(op(EvtchnOp::close, EvtchnPortOp{i}), 0);
  EXPECT_FALSE(ev_->port_pending(i));
  EXPECT_EQ(op(EvtchnOp::close, EvtchnPortOp{i}), kEinval);
  EXPECT_EQ(op(EvtchnOp::close, EvtchnPortOp{0}), kEinval);
  for (auto c : {EvtchnOp::send, EvtchnOp::unmask, EvtchnOp::close, EvtchnOp::bind_vcpu,
                 EvtchnOp::bind_virq, EvtchnOp::bind_ipi, EvtchnOp::bind_interdomain,
                 EvtchnOp::reset})
    EXPECT_EQ(op(c, kBad), kEfault) << static_cast<int>(c);
}

TEST_F(EvtchnOps, ResetClosesEverythingForSelfOnly) {
  ASSERT_EQ(op(EvtchnOp::bind_ipi, EvtchnBindIpiOp{0, 0}), 0);
  ASSERT_EQ(op(EvtchnOp::bind_ipi, EvtchnBindIpiOp{1, 0}), 0);
  EXPECT_EQ(op(EvtchnOp::reset, EvtchnResetOp{4}), kEperm);
  EXPECT_EQ(ev_->status(1)->status, EvtchnStat::ipi);
  EXPECT_EQ(op(EvtchnOp::reset, EvtchnResetOp{kDomidSelf}), 0);
  EXPECT_EQ(ev_->status(1)->status, EvtchnStat::closed);
  EXPECT_EQ(ev_->status(2)->status, EvtchnStat::closed);
}

TEST_F(EvtchnOps, FifoAndPirqOpsAreRefused) {
  for (auto c : {EvtchnOp::bind_pirq, EvtchnOp::init_control, EvtchnOp::expand_array,
                 EvtchnOp::set_priority})
    EXPECT_EQ(op(c), kEnosys) << static_cast<int>(c);
  EXPECT_EQ(call(kHcEventChannelOp, 14, kArg), kEnosys);
  EXPECT_EQ(call(kHcEventChannelOp, ~0ul, kArg), kEnosys);
}

TEST_F(EvtchnOps, AResultThatCannotBeCopiedOutIsEfault) {
  mem_.put(kArg, EvtchnBindIpiOp{0, 0});
  mem_.read_only(kArg, kArg + 8);
  EXPECT_EQ(op(EvtchnOp::bind_ipi), kEfault);
  EXPECT_EQ(ev_->status(1)->status, EvtchnStat::ipi);  // as Xen: the port stays allocated
}

}  // namespace
}  // namespace xpv::xen::test
