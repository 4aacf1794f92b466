// A process Domain (memory, grant table, event channels, control socket) and a dom0 service's
// ForeignDomain view of it, over a real control socket: the contract every backend relies on.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>

#include "xpv/domain/domain.h"
#include "xpv/domain/foreign_domain.h"
#include "xpv/domain/shared_info.h"
#include "xpv/test/run_on.h"

namespace xpv::domain {
namespace {

namespace asio = boost::asio;

class CountingSink : public UpcallSink {
 public:
  void upcall(unsigned) noexcept override {
    count.fetch_add(1);
    (void)ev.notify();
  }
  std::atomic<int> count{0};
  EventFd ev = EventFd::create().value();
};

bool readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1;
}

class ForeignDomainTest : public ::testing::Test {
 protected:
  template <class F>
  auto on_io(F f) -> decltype(f()) {
    return xpv::test::run_on(io_, std::move(f));
  }
  void SetUp() override {
    char tmpl[] = "/tmp/xpv-run-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    run_dir_ = tmpl;
    DomainConfig cfg;
    cfg.domid = 9;
    cfg.name = "proc9";
    cfg.memory_bytes = 16 << 20;
    cfg.max_grant_frames = 4;
    cfg.run_dir = run_dir_;
    domain_ = std::make_unique<Domain>(io_, cfg, sink_);
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    on_io([this] { domain_.reset(); });
    work_.reset();
    io_.stop();
    thread_.join();
    std::filesystem::remove_all(run_dir_);
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  CountingSink sink_;
  std::string run_dir_;
  std::unique_ptr<Domain> domain_;
  std::thread thread_;
};

TEST_F(ForeignDomainTest, SeesTheDomainsMemoryAndGrantTable) {
  auto d = ForeignDomain::connect(9, "test", run_dir_);
  EXPECT_EQ(d.domid(), 9);
  EXPECT_EQ(d.info().name, "proc9");
  EXPECT_EQ(d.grant_frames().size(), 4u);
  auto gfn = domain_->alloc_pages(1);
  ASSERT_TRUE(gfn);
  std::memcpy(domain_->pages(*gfn, 1).data(), "granted", 8);
  auto ref = domain_->grants().grant_access(0, *gfn, /*readonly=*/true);
  ASSERT_TRUE(ref);
  auto mapper = d.make_mapper();
  auto m = mapper->map(*ref, true);
  ASSERT_TRUE(m);
  EXPECT_STREQ(reinterpret_cast<const char*>(m->data().data()), "granted");
  EXPECT_FALSE(mapper->map(*ref, false)) << "a read-only grant cannot be mapped writable";
  EXPECT_EQ(domain_->grants().end_access(*ref).error(), gnttab::Status::eagain) << "still mapped";
  ASSERT_TRUE(mapper->unmap(*m));
  EXPECT_TRUE(domain_->grants().end_access(*ref));
}

TEST_F(ForeignDomainTest, EventChannelBothWays) {
  auto d = ForeignDomain::connect(9, "test", run_dir_);
  auto port = domain_->evtchn().alloc_unbound(0);
  ASSERT_TRUE(port);
  auto ch = d.bind(*port);
  // As Xen does, binding leaves one conservative notification for the binder (events sent to
  // the port while it was unbound would otherwise be lost).
  EXPECT_EQ(ch->consume().value(), 1u);
  // Guest → dom0.
  ASSERT_TRUE(domain_->evtchn().send(*port));
  ASSERT_TRUE(readable(ch->wait_fd(), 5000));
  EXPECT_EQ(ch->consume().value(), 1u);
  // dom0 → guest: the domain's event loop turns the kick into a pending bit and an upcall.
  ASSERT_TRUE(ch->notify());
  ASSERT_TRUE(readable(sink_.ev.fd(), 5000));
  EXPECT_EQ(sink_.count.load(), 1);
  auto* si = reinterpret_cast<const SharedInfo*>(domain_->pages(Domain::kSharedInfoGfn, 1).data());
  EXPECT_NE(si->evtchn_pending[*port / 64] & (std::uint64_t{1} << (*port % 64)), 0u);
}

TEST_F(ForeignDomainTest, AProcessDomainOffersNoDirectUpcalls) {
  auto d = ForeignDomain::connect(9, "test", run_dir_);
  EXPECT_EQ(d.direct(), nullptr);
  auto c = ControlClient::connect(domain_->socket_path(), "raw");
  try {
    (void)c.direct_upcall(0);
    ADD_FAILURE() << "a domain without a table answered";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.error(), EOPNOTSUPP) << e.what();
  }
}

TEST_F(ForeignDomainTest, DirectUpcallsOverTheControlSocket) {
  // What xpv-vmm does with its KVM irqfds, here with plain eventfds standing in for them.
  std::vector<EventFd> lines;
  std::vector<UniqueFd> theirs;
  lines.push_back(EventFd::create().value());  // one vCPU
  theirs.emplace_back(::dup(lines.back().fd()));
  on_io([&] { domain_->enable_direct_upcalls(std::move(theirs), domain_->mem().view()); });
  EXPECT_THROW(on_io([&] { domain_->enable_direct_upcalls({}, domain_->mem().view()); }), std::logic_error);
  auto c = ControlClient::connect(domain_->socket_path(), "raw");
  try {
    (void)c.direct_upcall(1);  // the domain has one vCPU
    ADD_FAILURE() << "vCPU 1 answered";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.error(), ENOENT) << e.what();
  }
  auto d = ForeignDomain::connect(9, "test", run_dir_);
  ASSERT_NE(d.direct(), nullptr);
  EXPECT_EQ(d.direct()->nr_vcpus(), 1u);
  auto port = domain_->evtchn().alloc_unbound(0);
  ASSERT_TRUE(port);
  auto ch = d.bind(*port);
  // Not routed yet (the VMM routes a vCPU once the guest chose its vector): the event loop.
  ASSERT_TRUE(ch->notify());
  ASSERT_TRUE(readable(sink_.ev.fd(), 5000));
  EXPECT_EQ(sink_.count.load(), 1);
  EXPECT_EQ(lines[0].consume().value(), 0u);
  // Routed: the service raises vCPU 0's line itself, the domain's sink is not involved.
  auto* si = reinterpret_cast<SharedInfo*>(domain_->pages(Domain::kSharedInfoGfn, 1).data());
  std::atomic_ref<std::uint64_t>(si->evtchn_pending[*port / 64]).store(0);
  std::atomic_ref<std::uint64_t>(si->vcpu_info[0].evtchn_pending_sel).store(0);
  std::atomic_ref<std::uint8_t>(si->vcpu_info[0].evtchn_upcall_pending).store(0);
  domain_->evtchn().set_direct_route(0, true);
  ASSERT_TRUE(ch->notify());
  EXPECT_EQ(lines[0].consume().value(), 1u);
  EXPECT_EQ(sink_.count.load(), 1);
  EXPECT_NE(std::atomic_ref<std::uint64_t>(si->evtchn_pending[*port / 64]).load() & (std::uint64_t{1} << (*port % 64)), 0u);
  EXPECT_EQ(d.direct()->interrupts(), 1u);
}

TEST_F(ForeignDomainTest, ABackendThatGoesAwayCanBindAgain) {
  auto port = domain_->evtchn().alloc_unbound(0);
  ASSERT_TRUE(port);
  {
    auto d = ForeignDomain::connect(9, "first", run_dir_);
    auto ch = d.bind(*port);
    EXPECT_THROW(d.bind(*port), ControlError) << "already bound";
  }
  // The first connection closed: the domain's port is unbound for dom0 again (bounded wait).
  for (int i = 0; i < 500; ++i) {
    auto st = domain_->evtchn().status(*port);
    if (st && st->status == EvtchnStat::unbound) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto again = ForeignDomain::connect(9, "second", run_dir_);
  auto ch = again.bind(*port);
  ASSERT_TRUE(domain_->evtchn().send(*port));
  ASSERT_TRUE(readable(ch->wait_fd(), 5000));
}

TEST_F(ForeignDomainTest, AKickWrittenJustBeforeTheEndpointClosesIsDelivered) {
  // A backend's last notification and its endpoint's close (its control connection dropped, or
  // it unbound) can reach the domain's loop in either order; here the close is served first, in
  // the same handler, before the loop could look at the kick.
  auto d = ForeignDomain::connect(9, "test", run_dir_);
  auto port = domain_->evtchn().alloc_unbound(0);
  ASSERT_TRUE(port);
  std::uint32_t dom0_port = 0;
  auto ch = d.bind(*port, &dom0_port);
  on_io([&] {
    ASSERT_TRUE(ch->notify());
    ASSERT_TRUE(domain_->unbind(dom0_port));
  });
  EXPECT_EQ(sink_.count.load(), 1);
  auto* si = reinterpret_cast<const SharedInfo*>(domain_->pages(Domain::kSharedInfoGfn, 1).data());
  EXPECT_NE(si->evtchn_pending[*port / 64] & (std::uint64_t{1} << (*port % 64)), 0u);
  EXPECT_EQ(domain_->evtchn().status(*port)->status, EvtchnStat::unbound);
}

TEST_F(ForeignDomainTest, AServiceThatDiesWithoutUnbindingGetsItsTornKickUndone) {
  // With direct upcalls, a service killed inside a kick can leave the port pending with nothing
  // raised (EventChannels::dom0_close, owner_gone). Its connection drops: the domain raises the
  // guest. A service that unbinds first raises nothing.
  std::vector<EventFd> lines;
  std::vector<UniqueFd> theirs;
  lines.push_back(EventFd::create().value());
  theirs.emplace_back(::dup(lines.back().fd()));
  on_io([&] { domain_->enable_direct_upcalls(std::move(theirs), domain_->mem().view()); });
  auto* si = reinterpret_cast<SharedInfo*>(domain_->pages(Domain::kSharedInfoGfn, 1).data());
  for (const bool unbinds_first : {true, false}) {
    SCOPED_TRACE(unbinds_first ? "unbinds, then goes" : "dies bound");
    auto port = domain_->evtchn().alloc_unbound(0);
    ASSERT_TRUE(port);
    const int before = sink_.count.load();
    {
      auto d = ForeignDomain::connect(9, "dies", run_dir_);
      std::uint32_t dom0_port = 0;
      auto ch = d.bind(*port, &dom0_port);
      std::atomic_ref<std::uint64_t>(si->evtchn_pending[*port / 64]).fetch_or(std::uint64_t{1} << (*port % 64));
      if (unbinds_first) d.unbind(dom0_port);
    }
    // The connection's close is served on the domain's loop (bounded wait).
    for (int i = 0; i < 500; ++i) {
      auto st = domain_->evtchn().status(*port);
      if (st && st->status == EvtchnStat::unbound) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    on_io([] {});  // whatever the close queued has run
    EXPECT_EQ(sink_.count.load(), unbinds_first ? before : before + 1);
    std::atomic_ref<std::uint64_t>(si->evtchn_pending[*port / 64]).store(0);
    std::atomic_ref<std::uint8_t>(si->vcpu_info[0].evtchn_upcall_pending).store(0);
    std::atomic_ref<std::uint64_t>(si->vcpu_info[0].evtchn_pending_sel).store(0);
    ASSERT_TRUE(domain_->evtchn().close(*port));
  }
}

TEST_F(ForeignDomainTest, XenstoreRingIsExported) {
  auto d = ForeignDomain::connect(9, "xenstored", run_dir_);
  auto x = d.xenstore();
  EXPECT_EQ(x.gfn, Domain::kXenstoreGfn);
  EXPECT_EQ(x.port, domain_->xenstore_port());
  EXPECT_TRUE(d.memory().page(x.gfn));
}

TEST_F(ForeignDomainTest, UnpauseStartsAPausedDomainOnce) {
  auto c = ControlClient::connect(control::socket_path(9, run_dir_), "xpv");
  try {
    c.unpause();
    FAIL() << "a process domain runs from the start";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.error(), EALREADY);
  }
  int started = 0;
  on_io([&] { domain_->set_unpause_handler([&] { return started++ == 0; }); });
  EXPECT_NO_THROW(c.unpause());
  EXPECT_EQ(started, 1);
  EXPECT_THROW(c.unpause(), ControlError) << "the second unpause finds it running";
}

TEST_F(ForeignDomainTest, PauseIsRefusedWithoutAHandlerAndCarriesItsAnswer) {
  // A process domain has no vCPUs to stop: EOPNOTSUPP. With a pause handler (xpv-vmm's), its
  // answer goes back as it is: done, then EALREADY; the connection stays usable throughout.
  auto c = ControlClient::connect(control::socket_path(9, run_dir_), "xpv");
  auto code = [&] {
    try {
      c.pause();
      return 0;
    } catch (const ControlError& e) {
      return e.error();
    }
  };
  EXPECT_EQ(code(), EOPNOTSUPP);
  int pauses = 0;
  on_io([&] {
    domain_->set_pause_handler([&]() -> Expected<void, int> {
      if (pauses++ > 0) return fail(EALREADY);
      return {};
    });
  });
  EXPECT_EQ(code(), 0);
  EXPECT_EQ(code(), EALREADY);
  EXPECT_EQ(pauses, 2);
  EXPECT_EQ(c.xenstore().gfn, Domain::kXenstoreGfn);
}

TEST_F(ForeignDomainTest, VcpuThreadsAreRefusedWithoutAHandlerAndCarryItsAnswer) {
  // A process domain has no vCPU threads: EOPNOTSUPP. xpv-vmm's handler's ids come back in order.
  auto c = ControlClient::connect(control::socket_path(9, run_dir_), "xpv");
  try {
    c.vcpu_threads();
    FAIL() << "a process domain has no vCPU threads";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.error(), EOPNOTSUPP);
  }
  const std::uint16_t n = c.domain().nr_vcpus;  // what the domain said at hello
  ASSERT_GE(n, 1u);
  std::vector<std::uint32_t> ids(n, 0);
  ids[0] = 4321;
  on_io([&] { domain_->set_vcpu_threads_handler([&] { return ids; }); });
  EXPECT_EQ(c.vcpu_threads(), ids);
  // An answer with another count than the domain's vCPUs is a broken server, refused.
  on_io([&] { domain_->set_vcpu_threads_handler([&] { return std::vector<std::uint32_t>(n + 1u, 7); }); });
  try {
    c.vcpu_threads();
    FAIL() << "a count other than the domain's vCPUs";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.error(), EPROTO);
  }
  // A handler with nothing to say is an error answer, not a malformed one; the connection lives on.
  on_io([&] { domain_->set_vcpu_threads_handler([] { return std::vector<std::uint32_t>{}; }); });
  try {
    c.vcpu_threads();
    FAIL() << "an empty answer";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.error(), EIO);
  }
  EXPECT_EQ(c.xenstore().gfn, Domain::kXenstoreGfn);
}

TEST_F(ForeignDomainTest, VcpuAffinityIsRefusedWithoutAHandlerAndCarriesTheSetAndTheAnswer) {
  auto c = ControlClient::connect(control::socket_path(9, run_dir_), "xpv");
  ControlHandler::CpuMask mask{};
  mask[0] = 0b101;          // CPUs 0 and 2
  mask[15] = 1ull << 63;    // CPU 1023
  auto code = [&](std::uint32_t vcpu) {
    try {
      c.set_vcpu_affinity(vcpu, mask);
      return 0;
    } catch (const ControlError& e) {
      return e.error();
    }
  };
  EXPECT_EQ(code(0), EOPNOTSUPP) << "a process domain has no vCPU threads";
  std::vector<std::pair<std::uint32_t, ControlHandler::CpuMask>> seen;
  on_io([&] {
    domain_->set_vcpu_affinity_handler([&](std::uint32_t vcpu, const ControlHandler::CpuMask& m) -> Expected<void, int> {
      seen.emplace_back(vcpu, m);
      if (vcpu == 5) return fail(ENOENT);
      return {};
    });
  });
  EXPECT_EQ(code(1), 0);
  EXPECT_EQ(code(control::kAllVcpus), 0);
  EXPECT_EQ(code(5), ENOENT);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].first, 1u);
  EXPECT_EQ(seen[1].first, control::kAllVcpus);
  EXPECT_EQ(seen[0].second, mask) << "every word of the set arrives";
  EXPECT_EQ(c.xenstore().gfn, Domain::kXenstoreGfn);
}

TEST_F(ForeignDomainTest, DeathOfTheDomainIsVisible) {
  auto d = ForeignDomain::connect(9, "test", run_dir_);
  EXPECT_FALSE(readable(d.death_fd(), 0));
  on_io([this] { domain_.reset(); });
  EXPECT_TRUE(readable(d.death_fd(), 5000));
}

TEST_F(ForeignDomainTest, UnknownDomainIsAClearError) {
  try {
    ForeignDomain::connect(42, "test", run_dir_);
    FAIL() << "connected to a domain that does not exist";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("dom42.sock"), std::string::npos) << e.what();
  }
}

TEST_F(ForeignDomainTest, PageAllocatorHandsOutFreeRuns) {
  auto a = domain_->alloc_pages(3);
  auto b = domain_->alloc_pages(2);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, Domain::kFirstGrantGfn + 4) << "after the fixed pages";
  EXPECT_EQ(*b, *a + 3);
  domain_->free_pages(*a, 3);
  EXPECT_EQ(domain_->alloc_pages(2), *a);
  EXPECT_FALSE(domain_->alloc_pages(1u << 20));
  EXPECT_FALSE(domain_->alloc_pages(0));
}

// An HVM domain (xpv-vmm's layout): RAM, grant frames and the xenstore page at fixed gfns outside
// RAM, all in one memfd the VMM made; a backend sees exactly those frames.
TEST(HvmDomainLayout, ExportsTheVmsFramesAndXenstorePage) {
  char tmpl[] = "/tmp/xpv-run-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string run_dir = tmpl;
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::thread t([&] { io.run(); });
  CountingSink sink;
  constexpr std::uint64_t kRam = 8 << 20, kGrantGpa = 0xf000'0000, kSpecialGpa = 0xfeff'0000;
  auto mem = DomainMemory::create("hvm-test", {{0, kRam}, {kGrantGpa, 2 * kPageSize}, {kSpecialGpa, kPageSize}});
  DomainConfig cfg;
  cfg.domid = 11;
  cfg.name = "hvm11";
  cfg.kind = control::DomainKind::hvm;
  cfg.max_grant_frames = 2;
  cfg.run_dir = run_dir;
  std::unique_ptr<Domain> dom;
  {
    std::packaged_task<void()> mk([&] {
      dom = std::make_unique<Domain>(io, cfg, sink, std::move(mem),
                                     HvmLayout{kGrantGpa >> kPageShift, kSpecialGpa >> kPageShift});
    });
    auto f = mk.get_future();
    asio::post(io, [&] { mk(); });
    f.get();
  }
  std::memcpy(dom->pages((kGrantGpa >> kPageShift) + 1, 1).data(), "frame1", 7);
  {
    auto d = ForeignDomain::connect(11, "test", run_dir);
    EXPECT_EQ(d.info().kind, control::DomainKind::hvm);
    ASSERT_EQ(d.grant_frames().size(), 2u);
    EXPECT_STREQ(reinterpret_cast<const char*>(d.grant_frames()[1].data()), "frame1");
    EXPECT_EQ(d.xenstore().gfn, kSpecialGpa >> kPageShift);
    EXPECT_EQ(d.xenstore().port, dom->xenstore_port());
    EXPECT_FALSE(dom->alloc_pages(1)) << "no page allocator in an HVM domain";
    // Events work before the guest maps shared_info (they wait in the placeholder page).
    auto port = dom->evtchn().alloc_unbound(0);
    ASSERT_TRUE(port);
    auto ch = d.bind(*port);
    ASSERT_TRUE(dom->evtchn().send(*port));
    EXPECT_TRUE(readable(ch->wait_fd(), 5000));
  }
  std::packaged_task<void()> rm([&] { dom.reset(); });
  auto f = rm.get_future();
  asio::post(io, [&] { rm(); });
  f.get();
  work.reset();
  io.stop();
  t.join();
  std::filesystem::remove_all(run_dir);
}

TEST(HvmDomainLayout, RefusesFramesOutsideItsMemory) {
  asio::io_context io;
  CountingSink sink;
  auto mem = DomainMemory::create("hvm-bad", {{0, 8 << 20}, {0xf000'0000, kPageSize}});
  DomainConfig cfg;
  cfg.domid = 12;
  cfg.max_grant_frames = 2;  // only one frame exists
  cfg.run_dir = "/tmp/xpv-never-created-dir";
  EXPECT_THROW(Domain(io, cfg, sink, std::move(mem), HvmLayout{0xf0000, 0xf0000}), std::invalid_argument);
  EXPECT_FALSE(std::filesystem::exists("/tmp/xpv-never-created-dir"));
}

}  // namespace
}  // namespace xpv::domain
