// Hypercalls other than event_channel_op: exact results, exact bytes written to guest memory,
// bad pointers, bad vCPUs, unknown numbers and sub-commands.
#include <gmock/gmock.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include "fakes.h"
#include "xpv/domain/shared_info.h"

namespace xpv::xen::test {
namespace {

using namespace abi;
using domain::kDomidSelf;

constexpr std::int64_t kEperm = -1, kEnoent = -2, kEnxio = -6, kEfault = -14, kEinval = -22,
                       kEnosys = -38;

using Hypercalls = PlatformTest;

// ---- construction ------------------------------------------------------------------------------

TEST(XenPlatformSetup, RejectsBadConfigAndMismatchedEventChannels) {
  FakeHost host;
  PlatformConfig c = test_config();
  c.vcpus = 0;
  EXPECT_THROW(Platform(c, host), std::invalid_argument);
  c = test_config();
  c.domid = 0;
  EXPECT_THROW(Platform(c, host), std::invalid_argument);
  c.domid = kDomidSelf;
  EXPECT_THROW(Platform(c, host), std::invalid_argument);
  Platform p(test_config(), host);
  Page page;
  domain::EventChannels ev(5, 2, page.span(), p);
  EXPECT_THROW(p.attach(ev), std::invalid_argument);
}

TEST(XenPlatformSetup, WithoutEventChannelsTheDependentCallsAreEnosys) {
  FakeHost host;
  FakeVirt mem;
  Platform p(test_config(), host);
  host.add_ram(0x100);
  mem.put(kArg, AddToPhysmap{kDomidSelf, 0, kMapspaceSharedInfo, 0, 0x100});
  EXPECT_EQ(p.hypercall(0, Regs{kHcMemoryOp, kXenmemAddToPhysmap, kArg, 0, 0, 0}, mem), kEnosys);
  mem.put(kArg, domain::EvtchnBindIpiOp{0, 0});
  EXPECT_EQ(p.hypercall(0, Regs{kHcEventChannelOp, 7, kArg, 0, 0, 0}, mem), kEnosys);
  mem.put(kArg, VcpuRegisterVcpuInfo{0x100, 0, 0});
  EXPECT_EQ(p.hypercall(0, Regs{kHcVcpuOp, kVcpuopRegisterVcpuInfo, 0, kArg, 0, 0}, mem), kEnosys);
  EXPECT_FALSE(p.shared_info_mapped());
  p.upcall(0);  // no mode, no event channels: dropped, no crash
  p.intx_eoi();
  EXPECT_EQ(host.intx(), std::vector<bool>{false});
}

// ---- unknown numbers, counters, the vCPU index -------------------------------------------------

TEST_F(Hypercalls, UnknownHypercallNumbersAreEnosysAndCounted) {
  for (std::uint64_t nr : {0ul, 1ul, 6ul, 13ul, 15ul, 16ul, 33ul, 35ul, 55ul, 63ul,
                           64ul, 1000ul, ~0ul})
    EXPECT_EQ(call(nr, 0, kArg), kEnosys) << nr;
  EXPECT_EQ(platform_->calls(13), 1u);
  EXPECT_EQ(platform_->calls(63), 1u);
  EXPECT_EQ(platform_->calls(64), 0u);  // out of the table
  EXPECT_EQ(platform_->calls(~0u), 0u);
  EXPECT_EQ(call(kHcXenVersion, kXenverVersion), 0x40011);
  EXPECT_EQ(call(kHcXenVersion, kXenverVersion), 0x40011);
  EXPECT_EQ(platform_->calls(kHcXenVersion), 2u);
  EXPECT_EQ(platform_->calls(kHcMemoryOp), 0u);
}

TEST_F(Hypercalls, IntArgumentsAreTruncatedTo32BitsAsInXen) {
  // vcpu_op(int cmd, unsigned int vcpuid, ...): the upper halves are ignored.
  EXPECT_EQ(call(kHcVcpuOp, (1ul << 32) | kVcpuopStopPeriodicTimer, (7ul << 32) | 3), 0);
  EXPECT_EQ(call(kHcSchedOp, (1ul << 32) | kSchedopYield), 0);
  EXPECT_EQ(call(kHcXenVersion, (1ul << 40) | kXenverPagesize), 4096);
  // memory_op(unsigned long cmd, ...): not truncated.
  EXPECT_EQ(call(kHcMemoryOp, (1ul << 32) | kXenmemAddToPhysmap, kArg), kEnosys);
}

TEST_F(Hypercalls, ACallFromANonexistentVcpuIsRefused) {
  EXPECT_EQ(platform_->hypercall(4, Regs{kHcXenVersion, 0, 0, 0, 0, 0}, mem_), kEinval);
}

// Xen refuses hypercalls made outside the guest's kernel (hvm_hypercall: CPL != 0 → -EPERM): a
// guest process with I/O-port access must not shut the domain down, open event channels or read
// the version strings. The kernel's next call works as before.
TEST_F(Hypercalls, ACallFromOutsideTheGuestKernelIsRefusedAndDoesNothing) {
  mem_.fill(0xaa);
  for (unsigned cpl : {1u, 2u, 3u}) {
    auto from = [&](std::uint64_t nr, std::uint64_t a1, std::uint64_t a2) {
      Regs r{nr, a1, a2, 0, 0, 0};
      r.cpl = cpl;
      return platform_->hypercall(0, r, mem_);
    };
    mem_.put(kArg, SchedShutdown{0});
    EXPECT_EQ(from(kHcSchedOp, kSchedopShutdown, kArg), kEperm) << cpl;
    EXPECT_EQ(from(kHcXenVersion, kXenverExtraversion, kArg2), kEperm) << cpl;
    EXPECT_EQ(from(kHcXenVersion, kXenverVersion, 0), kEperm) << cpl;
    mem_.put(kArg, domain::EvtchnAllocUnboundOp{kDomidSelf, 0, 0xdead});
    EXPECT_EQ(from(kHcEventChannelOp, static_cast<std::uint64_t>(domain::EvtchnOp::alloc_unbound), kArg), kEperm)
        << cpl;
    EXPECT_EQ(mem_.get<domain::EvtchnAllocUnboundOp>(kArg).port, 0xdeadu) << "no port allocated";
  }
  EXPECT_TRUE(host_.shutdowns().empty());
  EXPECT_EQ(mem_.get<std::uint8_t>(kArg2), 0xaa) << "nothing written";
  EXPECT_EQ(platform_->calls(kHcXenVersion), 6u) << "refused calls are counted";
  EXPECT_EQ(call(kHcXenVersion, kXenverVersion), 0x40011);
  mem_.put(kArg, SchedShutdown{0});
  EXPECT_EQ(call(kHcSchedOp, kSchedopShutdown, kArg), 0);
  EXPECT_EQ(host_.shutdowns(), std::vector<ShutdownReason>{ShutdownReason::poweroff});
}

// ---- xen_version -------------------------------------------------------------------------------

TEST_F(Hypercalls, XenVersionStringsAreWrittenExactly) {
  mem_.fill(0xaa);
  EXPECT_EQ(call(kHcXenVersion, kXenverExtraversion, kArg), 0);
  std::vector<std::uint8_t> want(16, 0);
  want[0] = '.';
  want[1] = '0';
  EXPECT_EQ(mem_.bytes(kArg, 16), want);
  EXPECT_EQ(mem_.get<std::uint8_t>(kArg + 16), 0xaa);

  EXPECT_EQ(call(kHcXenVersion, kXenverCapabilities, kArg), 0);
  const std::string caps = "hvm-3.0-x86_64";
  auto got = mem_.bytes(kArg, 1024);
  EXPECT_EQ(std::string(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(caps.size())), caps);
  for (std::size_t i = caps.size(); i < 1024; ++i) ASSERT_EQ(got[i], 0) << i;
  EXPECT_EQ(mem_.get<std::uint8_t>(kArg + 1024), 0xaa);

  EXPECT_EQ(call(kHcXenVersion, kXenverChangeset, kArg2), 0);
  EXPECT_STREQ(reinterpret_cast<const char*>(mem_.bytes(kArg2, 64).data()),
               "xpv (no Xen changeset)");
  EXPECT_EQ(mem_.get<std::uint8_t>(kArg2 + 64), 0xaa);

  EXPECT_EQ(call(kHcXenVersion, kXenverCompileInfo, kArg2), 0);
  const auto ci = mem_.get<CompileInfo>(kArg2);
  EXPECT_EQ(std::string(ci.compiler), "xpv: Xen HVM ABI on KVM, not Xen");
  EXPECT_EQ(std::string(ci.compile_by), "xpv");
  EXPECT_EQ(ci.compile_domain[0], 0);
  EXPECT_EQ(ci.compile_date[0], 0);
  EXPECT_EQ(mem_.get<std::uint8_t>(kArg2 + sizeof(CompileInfo)), 0xaa);
}

TEST_F(Hypercalls, XenVersionNumbersAndStructs) {
  mem_.fill(0xaa);
  EXPECT_EQ(call(kHcXenVersion, kXenverPagesize), 4096);
  EXPECT_EQ(call(kHcXenVersion, kXenverPlatformParameters, kArg), 0);
  EXPECT_EQ(mem_.get<std::uint64_t>(kArg), 0u);
  EXPECT_EQ(call(kHcXenVersion, kXenverGuestHandle, kArg2), 0);
  EXPECT_EQ(mem_.bytes(kArg2, 16), std::vector<std::uint8_t>(16, 0));
  EXPECT_EQ(mem_.get<std::uint8_t>(kArg2 + 16), 0xaa);
  for (std::uint64_t cmd : {9ul, 10ul, 11ul, 0x1000ul})
    EXPECT_EQ(call(kHcXenVersion, cmd, kArg), kEnosys) << cmd;
  for (std::uint64_t cmd : {kXenverExtraversion, kXenverCompileInfo, kXenverCapabilities,
                            kXenverChangeset, kXenverPlatformParameters, kXenverGetFeatures,
                            kXenverGuestHandle})
    EXPECT_EQ(call(kHcXenVersion, cmd, kBad), kEfault) << cmd;
}

TEST_F(Hypercalls, GetFeaturesOffersTranslatedPhysmapAndCallbackVector) {
  mem_.put(kArg, FeatureInfo{0, 0xdeadbeef});
  EXPECT_EQ(call(kHcXenVersion, kXenverGetFeatures, kArg), 0);
  const auto fi = mem_.get<FeatureInfo>(kArg);
  EXPECT_EQ(fi.submap_idx, 0u);
  EXPECT_EQ(fi.submap, (1u << 2) | (1u << 8));  // no hvm_safe_pvclock (9), no hvm_pirqs (10)
  mem_.put(kArg, FeatureInfo{1, 0});
  EXPECT_EQ(call(kHcXenVersion, kXenverGetFeatures, kArg), kEinval);
  mem_.put(kArg, FeatureInfo{0, 0});
  mem_.read_only(kArg, kArg + 8);
  EXPECT_EQ(call(kHcXenVersion, kXenverGetFeatures, kArg), kEfault);  // readable, not writable
}

TEST(XenPlatformFeatures, IntxModeDoesNotOfferTheCallbackVector) {
  for (auto mode : {UpcallMode::callback_vector, UpcallMode::intx}) {
    FakeHost host;
    FakeVirt mem;
    Platform p(test_config(mode), host);
    mem.put(kArg, FeatureInfo{0, 0});
    EXPECT_EQ(p.hypercall(1, Regs{kHcXenVersion, kXenverGetFeatures, kArg, 0, 0, 0}, mem), 0);
    EXPECT_EQ(mem.get<FeatureInfo>(kArg).submap,
              mode == UpcallMode::intx ? (1u << 2) : (1u << 2) | (1u << 8));
  }
}

// ---- memory_op ---------------------------------------------------------------------------------

TEST_F(Hypercalls, SharedInfoMapsIntoTheGuestPageWithTheStateCarriedOver) {
  auto p = ev_->bind_ipi(1);
  ASSERT_TRUE(p && ev_->send(*p));  // recorded in the placeholder before the guest maps
  Page& ram = host_.add_ram(0x1234);
  std::memset(ram.bytes, 0x5a, sizeof ram.bytes);
  mem_.put(kArg, AddToPhysmap{kDomidSelf, 0, kMapspaceSharedInfo, 0, 0x1234});
  EXPECT_FALSE(platform_->shared_info_mapped());
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmap, kArg), 0);
  EXPECT_TRUE(platform_->shared_info_mapped());
  auto& si = *reinterpret_cast<domain::SharedInfo*>(ram.bytes);
  EXPECT_EQ(si.evtchn_pending[0], std::uint64_t{1} << *p);
  EXPECT_EQ(si.vcpu_info[1].evtchn_upcall_pending, 1);
  EXPECT_EQ(si.vcpu_info[0].evtchn_upcall_pending, 0);
  EXPECT_EQ(si.wc_sec, 0u);
  EXPECT_EQ(ram.bytes[4095], 0);
  // Later events land in the guest's page.
  auto q = ev_->bind_ipi(0);
  ASSERT_TRUE(q && ev_->send(*q));
  EXPECT_EQ(si.evtchn_pending[0], (std::uint64_t{1} << *p) | (std::uint64_t{1} << *q));
  EXPECT_EQ(si.vcpu_info[0].evtchn_upcall_pending, 1);
  // Own domid is "self" too; mapping again (another page) moves it.
  host_.add_ram(0x1235);
  mem_.put(kArg, AddToPhysmap{5, 0, kMapspaceSharedInfo, 0, 0x1235});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmap, kArg), 0);
  EXPECT_EQ(reinterpret_cast<domain::SharedInfo*>(host_.add_ram(0x1235).bytes)->evtchn_pending[0],
            si.evtchn_pending[0]);
}

TEST_F(Hypercalls, SharedInfoErrors) {
  host_.add_ram(0x1234);
  mem_.put(kArg, AddToPhysmap{kDomidSelf, 0, kMapspaceSharedInfo, 1, 0x1234});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmap, kArg), kEinval);  // idx must be 0
  mem_.put(kArg, AddToPhysmap{kDomidSelf, 0, kMapspaceSharedInfo, 0, 0x9999});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmap, kArg), kEinval);  // not RAM
  mem_.put(kArg, AddToPhysmap{7, 0, kMapspaceSharedInfo, 0, 0x1234});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmap, kArg), kEperm);   // another domain
  mem_.put(kArg, AddToPhysmap{kDomidSelf, 0, 2 /*gmfn*/, 0, 0x1234});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmap, kArg), kEnosys);
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmap, kBad), kEfault);
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmap, mem_.end() - 23), kEfault);  // runs off the end
  EXPECT_FALSE(platform_->shared_info_mapped());
  for (std::uint64_t cmd : {0ul, 9ul, 12ul, 22ul, 24ul, 7ul | (1ul << 6), 1ul | (1ul << 6)})
    EXPECT_EQ(call(kHcMemoryOp, cmd, kArg), kEnosys) << cmd;
}

// Ballooning as Linux's xen-balloon does it: a page of GPFNs per call, order 0.
TEST_F(Hypercalls, DecreaseReservationHandsGuestRamBackExtentByExtent) {
  for (std::uint64_t g = 0x100; g < 0x110; ++g) host_.add_ram(g);
  const std::uint64_t gpfns[4] = {0x105, 0x100, 0x10f, 0x101};
  mem_.put(kArg2, gpfns);
  mem_.put(kArg, MemoryReservation{kArg2, 4, 0, 0, kDomidSelf});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemDecreaseReservation, kArg), 4);
  using R = std::vector<std::pair<std::uint64_t, std::uint64_t>>;
  EXPECT_EQ(host_.released(), (R{{0x105, 1}, {0x100, 1}, {0x10f, 1}, {0x101, 1}}));
  // And back again.
  mem_.put(kArg, MemoryReservation{kArg2, 2, 0, 0, kDomidSelf});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemPopulatePhysmap, kArg), 2);
  EXPECT_EQ(host_.populated(), (R{{0x105, 1}, {0x100, 1}}));
  // Larger extents: 2^3 pages each, aligned to their size.
  const std::uint64_t big[2] = {0x108, 0x100};
  mem_.put(kArg2, big);
  mem_.put(kArg, MemoryReservation{kArg2, 2, 3, 0, kDomidSelf});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemDecreaseReservation, kArg), 2);
  EXPECT_EQ(host_.released().back(), (std::pair<std::uint64_t, std::uint64_t>{0x100, 8}));
  // Nothing asked for, nothing done.
  mem_.put(kArg, MemoryReservation{kBad, 0, 0, 0, kDomidSelf});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemDecreaseReservation, kArg), 0);
}

TEST_F(Hypercalls, ReservationCallsStopAtTheFirstExtentTheyCannotDo) {
  for (std::uint64_t g = 0x100; g < 0x108; ++g) host_.add_ram(g);
  const auto released = [&] { return host_.released().size(); };
  // Not RAM (0x200), then never looked at (0x102): the count says how far it got.
  const std::uint64_t gpfns[3] = {0x101, 0x200, 0x102};
  mem_.put(kArg2, gpfns);
  mem_.put(kArg, MemoryReservation{kArg2, 3, 0, 0, kDomidSelf});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemDecreaseReservation, kArg), 1);
  EXPECT_EQ(call(kHcMemoryOp, kXenmemPopulatePhysmap, kArg), 1);
  EXPECT_EQ(released(), 1u);
  // A range partly outside RAM is not done at all (0x104..0x10b; RAM ends at 0x107).
  const std::uint64_t tail[1] = {0x108 - 4};
  mem_.put(kArg2, tail);
  mem_.put(kArg, MemoryReservation{kArg2, 1, 2, 0, kDomidSelf});  // 0x104..0x107: RAM
  EXPECT_EQ(call(kHcMemoryOp, kXenmemDecreaseReservation, kArg), 1);
  mem_.put(kArg, MemoryReservation{kArg2, 1, 3, 0, kDomidSelf});  // 0x104 is not 8-aligned
  EXPECT_EQ(call(kHcMemoryOp, kXenmemDecreaseReservation, kArg), 0);
  const std::uint64_t over[1] = {0x100};
  mem_.put(kArg2, over);
  mem_.put(kArg, MemoryReservation{kArg2, 1, 4, 0, kDomidSelf});  // 0x100..0x10f: half is not RAM
  EXPECT_EQ(call(kHcMemoryOp, kXenmemDecreaseReservation, kArg), 0);
  EXPECT_EQ(released(), 2u);
  // The list runs off mapped memory after two entries.
  mem_.put(mem_.end() - 16, std::array<std::uint64_t, 2>{0x103, 0x104});
  mem_.put(kArg, MemoryReservation{mem_.end() - 16, 5, 0, 0, kDomidSelf});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemDecreaseReservation, kArg), 2);
  EXPECT_EQ(released(), 4u);
  // Extents above order 9 (2 MiB), another domain, an unreadable argument.
  mem_.put(kArg, MemoryReservation{kArg2, 1, 10, 0, kDomidSelf});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemDecreaseReservation, kArg), 0);
  mem_.put(kArg, MemoryReservation{kArg2, 1, 0, 0, 3});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemDecreaseReservation, kArg), kEperm);
  EXPECT_EQ(call(kHcMemoryOp, kXenmemPopulatePhysmap, kBad), kEfault);
  EXPECT_EQ(released(), 4u);
  // A huge count is bounded: the list ends (unmapped) long before, and the count says where.
  mem_.put(kArg, MemoryReservation{mem_.end() - 16, ~std::uint64_t{0}, 0, 0, kDomidSelf});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemPopulatePhysmap, kArg), 2);
}

TEST(HypercallsNoBalloon, AHostThatCannotBalloonDoesNoExtent) {
  struct Host final : PlatformHost {
    void inject_vector(unsigned, std::uint8_t) noexcept override {}
    bool set_callback_vector(std::uint8_t) noexcept override { return true; }
    void set_intx(bool) noexcept override {}
    void shutdown(ShutdownReason) noexcept override {}
    std::span<std::uint8_t> guest_page(std::uint64_t) noexcept override { return {}; }
    void console_write(std::string_view) noexcept override {}
  } host;
  Platform p(test_config(), host);
  FakeVirt mem(0x4000);
  mem.put(kArg2, std::uint64_t{0x100});
  mem.put(kArg, MemoryReservation{kArg2, 1, 0, 0, kDomidSelf});
  EXPECT_EQ(p.hypercall(0, Regs{kHcMemoryOp, kXenmemDecreaseReservation, kArg, 0, 0, 0}, mem), 0);
}

TEST_F(Hypercalls, GrantFramesAreAcceptedOnlyWhereBar1HasThem) {
  auto map = [&](std::uint64_t idx, std::uint64_t gpfn) {
    mem_.put(kArg, AddToPhysmap{kDomidSelf, 0, kMapspaceGrantTable, idx, gpfn});
    return call(kHcMemoryOp, kXenmemAddToPhysmap, kArg);
  };
  EXPECT_EQ(platform_->grant_frames_mapped(), 0u);
  EXPECT_EQ(map(0, 0xf0000), 0);
  EXPECT_EQ(platform_->grant_frames_mapped(), 1u);
  EXPECT_EQ(map(3, 0xf0003), 0);
  EXPECT_EQ(platform_->grant_frames_mapped(), 4u);
  EXPECT_EQ(map(1, 0xf0001), 0);
  EXPECT_EQ(platform_->grant_frames_mapped(), 4u);
  EXPECT_EQ(map(2, 0xf0003), kEinval);  // not where frame 2 lives
  EXPECT_EQ(map(31, 0xf001f), 0);       // the last one
  EXPECT_EQ(map(32, 0xf0020), kEinval); // beyond max_grant_frames
  EXPECT_EQ(map(kMapidxGrantTableStatus | 0, 0xf0000), kEinval);  // v2 status frames
  EXPECT_EQ(platform_->grant_frames_mapped(), 32u);
}

TEST_F(Hypercalls, AddToPhysmapBatchReportsPerEntry) {
  const std::uint64_t idxs[4] = {0, 1, 5, 40};
  const std::uint64_t gpfns[4] = {0xf0000, 0xf0001, 0xdead, 0xf0028};
  mem_.put(kArg2, idxs);
  mem_.put(kArg2 + 0x100, gpfns);
  mem_.put(kArg2 + 0x200, std::array<std::int32_t, 5>{7, 7, 7, 7, 7});
  mem_.put(kArg, AddToPhysmapBatch{kDomidSelf, kMapspaceGrantTable, 4, 0, kArg2, kArg2 + 0x100,
                                   kArg2 + 0x200});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmapBatch, kArg), 0);
  EXPECT_EQ((mem_.get<std::array<std::int32_t, 5>>(kArg2 + 0x200)),
            (std::array<std::int32_t, 5>{0, 0, -22, -22, 7}));
  EXPECT_EQ(platform_->grant_frames_mapped(), 2u);

  // shared_info through the batch.
  host_.add_ram(0x77);
  mem_.put(kArg2, std::uint64_t{0});
  mem_.put(kArg2 + 0x100, std::uint64_t{0x77});
  mem_.put(kArg, AddToPhysmapBatch{kDomidSelf, kMapspaceSharedInfo, 1, 0, kArg2, kArg2 + 0x100,
                                   kArg2 + 0x200});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmapBatch, kArg), 0);
  EXPECT_EQ(mem_.get<std::int32_t>(kArg2 + 0x200), 0);
  EXPECT_TRUE(platform_->shared_info_mapped());

  // Errors: bad arrays, another domain, an unsupported space, zero entries.
  mem_.put(kArg, AddToPhysmapBatch{kDomidSelf, kMapspaceGrantTable, 1, 0, kBad, kArg2, kArg2});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmapBatch, kArg), kEfault);
  mem_.put(kArg, AddToPhysmapBatch{kDomidSelf, kMapspaceGrantTable, 1, 0, kArg2, kArg2 + 0x100,
                                   kBad});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmapBatch, kArg), kEfault);
  mem_.put(kArg, AddToPhysmapBatch{9, kMapspaceGrantTable, 1, 0, kArg2, kArg2, kArg2});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmapBatch, kArg), kEperm);
  mem_.put(kArg, AddToPhysmapBatch{kDomidSelf, 2, 1, 0, kArg2, kArg2, kArg2});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmapBatch, kArg), kEnosys);
  mem_.put(kArg, AddToPhysmapBatch{kDomidSelf, kMapspaceGrantTable, 0, 0, kBad, kBad, kBad});
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmapBatch, kArg), 0);
  EXPECT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmapBatch, kBad), kEfault);
}

// ---- grant_table_op ----------------------------------------------------------------------------

TEST_F(Hypercalls, GrantQuerySizeReportsMappedAndMaxFrames) {
  mem_.fill(0xaa);
  mem_.put(kArg, GnttabQuerySize{kDomidSelf, 0xaaaa, 9, 9, 9, 0xaaaa});
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopQuerySize, kArg, 1), 0);
  auto q = mem_.get<GnttabQuerySize>(kArg);
  EXPECT_EQ(q.nr_frames, 0u);
  EXPECT_EQ(q.max_nr_frames, 32u);
  EXPECT_EQ(q.status, 0);
  EXPECT_EQ(q.dom, kDomidSelf);
  EXPECT_EQ(mem_.get<std::uint8_t>(kArg + 16), 0xaa);

  mem_.put(kArg2, AddToPhysmap{kDomidSelf, 0, kMapspaceGrantTable, 1, 0xf0001});
  ASSERT_EQ(call(kHcMemoryOp, kXenmemAddToPhysmap, kArg2), 0);
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopQuerySize, kArg, 1), 0);
  EXPECT_EQ(mem_.get<GnttabQuerySize>(kArg).nr_frames, 2u);

  mem_.put(kArg, GnttabQuerySize{3, 0, 0, 0, 0, 0});
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopQuerySize, kArg, 1), 0);
  q = mem_.get<GnttabQuerySize>(kArg);
  EXPECT_EQ(q.status, kGntstPermissionDenied);
  EXPECT_EQ(q.nr_frames, 0u);
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopQuerySize, kArg, 2), kEinval);
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopQuerySize, kArg, 0), kEinval);
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopQuerySize, kBad, 1), kEfault);
}

TEST_F(Hypercalls, GrantTableVersionIsOne) {
  mem_.put(kArg, GnttabSetVersion{1});
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopSetVersion, kArg, 1), 0);
  EXPECT_EQ(mem_.get<std::uint32_t>(kArg), 1u);
  mem_.put(kArg, GnttabSetVersion{2});
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopSetVersion, kArg, 1), kEinval);
  EXPECT_EQ(mem_.get<std::uint32_t>(kArg), 1u);  // the version in force, written back
  mem_.put(kArg, GnttabSetVersion{0});
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopSetVersion, kArg, 1), kEinval);
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopSetVersion, kArg, 3), kEinval);
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopSetVersion, kBad, 1), kEfault);

  mem_.put(kArg, GnttabGetVersion{kDomidSelf, 0, 0});
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopGetVersion, kArg, 1), 0);
  EXPECT_EQ(mem_.get<GnttabGetVersion>(kArg).version, 1u);
  mem_.put(kArg, GnttabGetVersion{4, 0, 0});
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopGetVersion, kArg, 1), kEperm);
  EXPECT_EQ(call(kHcGrantTableOp, kGnttabopGetVersion, kBad, 1), kEfault);
  for (std::uint64_t cmd : {0ul, 1ul, 2ul, 3ul, 4ul, 5ul, 7ul, 9ul, 11ul, 12ul, 99ul})
    EXPECT_EQ(call(kHcGrantTableOp, cmd, kArg, 1), kEnosys) << cmd;
}

// ---- hvm_op ------------------------------------------------------------------------------------

TEST_F(Hypercalls, StoreAndConsoleParamsAreReadableNotWritable) {
  struct Want { std::uint32_t index; std::uint64_t value; };
  for (const Want w : {Want{kParamStorePfn, 0xfeffc}, Want{kParamStoreEvtchn, 1},
                       Want{kParamConsolePfn, 0xfeffd}, Want{kParamConsoleEvtchn, 2},
                       Want{kParamCallbackIrq, 0}, Want{kParamVm86Tss, 0},
                       Want{kParamX87FipWidth, 0}}) {
    mem_.put(kArg, HvmParam{kDomidSelf, 0x1234, w.index, 0xdeadbeef});
    EXPECT_EQ(call(kHcHvmOp, kHvmopGetParam, kArg), 0) << w.index;
    const auto p = mem_.get<HvmParam>(kArg);
    EXPECT_EQ(p.value, w.value) << w.index;
    EXPECT_EQ(p.domid, kDomidSelf);
    EXPECT_EQ(p.pad, 0x1234);
    EXPECT_EQ(p.index, w.index);
  }
  for (std::uint32_t index : {kParamStorePfn, kParamStoreEvtchn, kParamConsolePfn,
                              kParamConsoleEvtchn, 10u /*TIMER_MODE*/, 38u}) {
    mem_.put(kArg, HvmParam{kDomidSelf, 0, index, 0x42});
    EXPECT_EQ(call(kHcHvmOp, kHvmopSetParam, kArg), kEperm) << index;
  }
  mem_.put(kArg, HvmParam{kDomidSelf, 0, kParamStorePfn, 0});
  EXPECT_EQ(call(kHcHvmOp, kHvmopGetParam, kArg), 0);
  EXPECT_EQ(mem_.get<HvmParam>(kArg).value, 0xfeffcu);  // unchanged
}

TEST_F(Hypercalls, HvmParamErrors) {
  mem_.put(kArg, HvmParam{kDomidSelf, 0, 10 /*TIMER_MODE: not for the guest*/, 0});
  EXPECT_EQ(call(kHcHvmOp, kHvmopGetParam, kArg), kEperm);
  mem_.put(kArg, HvmParam{kDomidSelf, 0, kNrParams, 0});
  EXPECT_EQ(call(kHcHvmOp, kHvmopGetParam, kArg), kEinval);
  EXPECT_EQ(call(kHcHvmOp, kHvmopSetParam, kArg), kEinval);
  mem_.put(kArg, HvmParam{6, 0, kParamStorePfn, 0});
  EXPECT_EQ(call(kHcHvmOp, kHvmopGetParam, kArg), kEperm);
  mem_.put(kArg, HvmParam{kDomidSelf, 0, kParamCallbackIrq, std::uint64_t{3} << 56});
  EXPECT_EQ(call(kHcHvmOp, kHvmopSetParam, kArg), kEinval);  // unknown callback type
  EXPECT_EQ(call(kHcHvmOp, kHvmopGetParam, kBad), kEfault);
  EXPECT_EQ(call(kHcHvmOp, kHvmopSetParam, kBad), kEfault);
  mem_.put(kArg, HvmParam{kDomidSelf, 0, kParamStorePfn, 0});
  mem_.read_only(kArg, kArg + 16);
  EXPECT_EQ(call(kHcHvmOp, kHvmopGetParam, kArg), kEfault);
}

TEST_F(Hypercalls, CallbackIrqReadsBackAsSet) {
  const std::uint64_t v = (std::uint64_t{2} << 56) | 0xf3;
  mem_.put(kArg, HvmParam{kDomidSelf, 0, kParamCallbackIrq, v});
  EXPECT_EQ(call(kHcHvmOp, kHvmopSetParam, kArg), 0);
  mem_.put(kArg, HvmParam{kDomidSelf, 0, kParamCallbackIrq, 0});
  EXPECT_EQ(call(kHcHvmOp, kHvmopGetParam, kArg), 0);
  EXPECT_EQ(mem_.get<HvmParam>(kArg).value, v);
}

// Two vCPUs choosing different global callback vectors at the same moment: whichever comes
// last, the host was told the vector the parameter holds.
TEST_F(Hypercalls, TwoVcpusSettingCallbackVectorsAtOnceLeaveTheHostWithTheStoredOne) {
  host_.delay_callback_vectors();
  constexpr std::uint64_t kVectorType = std::uint64_t{2} << 56;
  for (int round = 0; round < 100; ++round) {
    const std::uint8_t a = round % 2 ? 0xf3 : 0xf5, b = round % 2 ? 0xf4 : 0xf6;
    mem_.put(kArg, HvmParam{kDomidSelf, 0, kParamCallbackIrq, kVectorType | a});
    mem_.put(kArg2, HvmParam{kDomidSelf, 0, kParamCallbackIrq, kVectorType | b});
    std::atomic<int> ready{0};
    std::int64_t rc0 = -1, rc1 = -1;
    auto set = [&](unsigned vcpu, std::uint64_t arg, std::int64_t& rc) {
      ready.fetch_add(1);
      for (int spin = 0; ready.load() < 2 && spin < 1'000'000; ++spin) std::this_thread::yield();
      rc = call_on(vcpu, kHcHvmOp, kHvmopSetParam, arg);
    };
    std::thread t0(set, 0u, kArg, std::ref(rc0)), t1(set, 1u, kArg2, std::ref(rc1));
    t0.join();
    t1.join();
    ASSERT_EQ(rc0, 0);
    ASSERT_EQ(rc1, 0);
    mem_.put(kArg, HvmParam{kDomidSelf, 0, kParamCallbackIrq, 0});
    ASSERT_EQ(call(kHcHvmOp, kHvmopGetParam, kArg), 0);
    const std::uint64_t stored = mem_.get<HvmParam>(kArg).value;
    ASSERT_TRUE(stored == (kVectorType | a) || stored == (kVectorType | b)) << std::hex << stored;
    const auto told = host_.callback_vectors();
    ASSERT_FALSE(told.empty());
    ASSERT_EQ(told.back(), stored & 0xff) << "round " << round << ": the host was told another vector than the stored one";
  }
}

TEST_F(Hypercalls, UpcallVectorAndOtherHvmOps) {
  mem_.put(kArg, HvmEvtchnUpcallVector{1, 0xf3, {}});
  EXPECT_EQ(call(kHcHvmOp, kHvmopSetEvtchnUpcallVector, kArg), 0);
  mem_.put(kArg, HvmEvtchnUpcallVector{4, 0xf3, {}});
  EXPECT_EQ(call(kHcHvmOp, kHvmopSetEvtchnUpcallVector, kArg), kEnoent);
  mem_.put(kArg, HvmEvtchnUpcallVector{1, 0x0f, {}});
  EXPECT_EQ(call(kHcHvmOp, kHvmopSetEvtchnUpcallVector, kArg), kEinval);
  EXPECT_EQ(call(kHcHvmOp, kHvmopSetEvtchnUpcallVector, kBad), kEfault);
  EXPECT_EQ(call(kHcHvmOp, kHvmopPagetableDying, kArg), kEnosys);
  for (std::uint64_t op : {2ul, 5ul, 10ul, 15ul, 22ul, 24ul, 99ul})
    EXPECT_EQ(call(kHcHvmOp, op, kArg), kEnosys) << op;
}

// ---- vcpu_op -----------------------------------------------------------------------------------

TEST_F(Hypercalls, RegisterVcpuInfoPlacesItInTheGuestPage) {
  Page& ram = host_.add_ram(0x2000);
  mem_.put(kArg, VcpuRegisterVcpuInfo{0x2000, 64, 0});
  // Registered from vCPU 0 for vCPU 1 (Linux does this before starting a secondary vCPU).
  EXPECT_EQ(call_on(0, kHcVcpuOp, kVcpuopRegisterVcpuInfo, 1, kArg), 0);
  const auto& vi = *reinterpret_cast<domain::VcpuInfo*>(ram.bytes + 64);
  EXPECT_EQ(vi.evtchn_pending_sel, ~std::uint64_t{0});
  EXPECT_EQ(vi.evtchn_upcall_pending, 1);
  EXPECT_TRUE(ev_->upcall_pending(1));
  EXPECT_EQ(ram.bytes[0], 0);    // nothing before it
  EXPECT_EQ(ram.bytes[128], 0);  // nothing after it
  EXPECT_EQ(call_on(1, kHcVcpuOp, kVcpuopRegisterVcpuInfo, 1, kArg), kEinval);  // only once
}

TEST_F(Hypercalls, RegisterVcpuInfoErrors) {
  host_.add_ram(0x2000);
  mem_.put(kArg, VcpuRegisterVcpuInfo{0x2000, 4096 - 63, 0});
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterVcpuInfo, 0, kArg), kEnxio);   // crosses the page
  mem_.put(kArg, VcpuRegisterVcpuInfo{0x2000, 4, 0});
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterVcpuInfo, 0, kArg), kEnxio);   // misaligned
  mem_.put(kArg, VcpuRegisterVcpuInfo{0x3000, 0, 0});
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterVcpuInfo, 0, kArg), kEinval);  // not RAM
  mem_.put(kArg, VcpuRegisterVcpuInfo{0x2000, 4096 - 64, 0});
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterVcpuInfo, 4, kArg), kEinval);  // no vCPU 4
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterVcpuInfo, ~0ul, kArg), kEinval);
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterVcpuInfo, 0, kBad), kEfault);
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterVcpuInfo, 0, kArg), 0);        // the last slot
}

TEST_F(Hypercalls, RunstateAreaGetsOneRunningRecord) {
  mem_.fill(0xaa);
  mem_.put(kArg, VcpuRegisterMemoryArea{kArg2});
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterRunstateMemoryArea, 2, kArg), 0);
  EXPECT_EQ(mem_.bytes(kArg2, 48), std::vector<std::uint8_t>(48, 0));  // state 0 = running
  EXPECT_EQ(mem_.get<std::uint8_t>(kArg2 + 48), 0xaa);
  EXPECT_EQ(mem_.get<std::uint8_t>(kArg2 - 1), 0xaa);
  mem_.put(kArg, VcpuRegisterMemoryArea{kBad});
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterRunstateMemoryArea, 2, kArg), kEfault);
  mem_.put(kArg, VcpuRegisterMemoryArea{0});
  const unsigned writes = mem_.writes();
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterRunstateMemoryArea, 2, kArg), 0);  // unregister
  EXPECT_EQ(mem_.writes(), writes);
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterRunstateMemoryArea, 2, kBad), kEfault);
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterRunstateMemoryArea, 4, kArg), kEinval);
}

TEST_F(Hypercalls, TimeAreaAcceptedButNeverWrittenAndTimersAreStopOnly) {
  mem_.put(kArg, VcpuRegisterMemoryArea{kArg2});
  const unsigned writes = mem_.writes();
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterVcpuTimeMemoryArea, 0, kArg), 0);
  EXPECT_EQ(mem_.writes(), writes);
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopRegisterVcpuTimeMemoryArea, 0, kBad), kEfault);
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopStopPeriodicTimer, 3, 0), 0);
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopStopSingleshotTimer, 3, 0), 0);
  EXPECT_EQ(call(kHcVcpuOp, kVcpuopStopPeriodicTimer, 4, 0), kEinval);
  for (std::uint64_t cmd : {kVcpuopSetSingleshotTimer, kVcpuopSetPeriodicTimer, kVcpuopInitialise,
                            kVcpuopUp, kVcpuopDown, kVcpuopIsUp, kVcpuopGetRunstateInfo, 11ul,
                            12ul, 14ul, 99ul})
    EXPECT_EQ(call(kHcVcpuOp, cmd, 1, kArg), kEnosys) << cmd;
  EXPECT_EQ(mem_.writes(), writes);
}

// ---- sched_op ----------------------------------------------------------------------------------

TEST_F(Hypercalls, ShutdownReasonsReachTheHost) {
  for (std::uint32_t r = 0; r < 5; ++r) {
    mem_.put(kArg, SchedShutdown{r});
    EXPECT_EQ(call(kHcSchedOp, kSchedopShutdown, kArg), 0) << r;
  }
  EXPECT_EQ(host_.shutdowns(),
            (std::vector<ShutdownReason>{ShutdownReason::poweroff, ShutdownReason::reboot,
                                         ShutdownReason::suspend, ShutdownReason::crash,
                                         ShutdownReason::watchdog}));
  mem_.put(kArg, SchedShutdown{5});  // soft_reset: not supported
  EXPECT_EQ(call(kHcSchedOp, kSchedopShutdown, kArg), kEinval);
  mem_.put(kArg, SchedShutdown{0x1000});
  EXPECT_EQ(call(kHcSchedOp, kSchedopShutdown, kArg), kEinval);
  EXPECT_EQ(call(kHcSchedOp, kSchedopShutdown, kBad), kEfault);
  EXPECT_EQ(host_.shutdowns().size(), 5u);
}

TEST_F(Hypercalls, OtherSchedOps) {
  EXPECT_EQ(call(kHcSchedOp, kSchedopYield, 0), 0);
  EXPECT_EQ(call(kHcSchedOp, kSchedopBlock, 0), 0);
  EXPECT_EQ(call(kHcSchedOp, kSchedopShutdownCode, kArg), 0);
  EXPECT_EQ(call(kHcSchedOp, kSchedopRemoteShutdown, kArg), kEperm);
  for (std::uint64_t cmd : {6ul, 7ul, 8ul, 99ul})
    EXPECT_EQ(call(kHcSchedOp, cmd, kArg), kEnosys) << cmd;
  EXPECT_TRUE(host_.shutdowns().empty());
}

TEST_F(Hypercalls, PollReturnsForAPendingPortAndChecksItsArguments) {
  auto p = ev_->bind_ipi(0);
  auto q = ev_->bind_ipi(0);
  ASSERT_TRUE(p && q);
  mem_.put(kArg2, std::array<std::uint32_t, 2>{*q, *p});
  mem_.put(kArg, SchedPoll{kArg2, 2, 0, 0});
  EXPECT_EQ(call(kHcSchedOp, kSchedopPoll, kArg), 0);  // nothing pending: bounded wait, then 0
  ASSERT_TRUE(ev_->send(*p));
  EXPECT_EQ(call(kHcSchedOp, kSchedopPoll, kArg), 0);
  mem_.put(kArg, SchedPoll{kArg2, 0, 0, 0});
  EXPECT_EQ(call(kHcSchedOp, kSchedopPoll, kArg), 0);

  mem_.put(kArg2, std::array<std::uint32_t, 2>{*p, 4096});
  mem_.put(kArg, SchedPoll{kArg2, 2, 0, 0});
  EXPECT_EQ(call(kHcSchedOp, kSchedopPoll, kArg), kEinval);  // port out of range
  mem_.put(kArg, SchedPoll{kArg2, 129, 0, 0});
  EXPECT_EQ(call(kHcSchedOp, kSchedopPoll, kArg), kEinval);  // Xen's limit is 128
  mem_.put(kArg, SchedPoll{kBad, 1, 0, 0});
  EXPECT_EQ(call(kHcSchedOp, kSchedopPoll, kArg), kEfault);
  mem_.put(kArg, SchedPoll{mem_.end() - 4, 2, 0, 0});
  EXPECT_EQ(call(kHcSchedOp, kSchedopPoll, kArg), kEfault);
  EXPECT_EQ(call(kHcSchedOp, kSchedopPoll, kBad), kEfault);
}

// ---- console_io --------------------------------------------------------------------------------

TEST_F(Hypercalls, ConsoleWriteIsBoundedAndReadIsEmpty) {
  const std::string text = "Linux version 6.1.0\n";
  for (std::size_t i = 0; i < text.size(); ++i) mem_.put(kArg + i, text[i]);
  EXPECT_EQ(call(kHcConsoleIo, kConsoleioWrite, text.size(), kArg), 0);
  EXPECT_EQ(host_.console(), text);
  EXPECT_EQ(call(kHcConsoleIo, kConsoleioWrite, 0, kBad), 0);
  EXPECT_EQ(call(kHcConsoleIo, kConsoleioWrite, 4096, kArg), 0);  // the maximum
  EXPECT_EQ(host_.console().size(), text.size() + 4096);
  EXPECT_EQ(call(kHcConsoleIo, kConsoleioWrite, 4097, kArg), kEinval);
  EXPECT_EQ(call(kHcConsoleIo, kConsoleioWrite, ~0ul, kArg), kEinval);
  EXPECT_EQ(call(kHcConsoleIo, kConsoleioWrite, 8, kBad), kEfault);
  EXPECT_EQ(call(kHcConsoleIo, kConsoleioWrite, 8, mem_.end() - 7), kEfault);
  EXPECT_EQ(host_.console().size(), text.size() + 4096);
  EXPECT_EQ(call(kHcConsoleIo, kConsoleioRead, 16, kArg), 0);
  EXPECT_EQ(call(kHcConsoleIo, 2, 16, kArg), kEnosys);
}

// What reaches the host (which logs it): printable ASCII and newlines, and a bounded number of
// writes a second — a guest looping on console_io cannot fill the host's log or drive its terminal.
TEST_F(Hypercalls, ConsoleWriteReachesTheHostPrintableAndRateLimited) {
  const std::string text = "a\x1b[2Jb\rc\x7f\xff\n";
  for (std::size_t i = 0; i < text.size(); ++i) mem_.put(kArg + i, text[i]);
  EXPECT_EQ(call(kHcConsoleIo, kConsoleioWrite, text.size(), kArg), 0);
  EXPECT_EQ(host_.console(), "a.[2Jb.c..\n");
  // Many more writes than a second's worth, as fast as they go: each answered 0 (as if written),
  // and at most the limit a second passed on, with one note of how many were dropped.
  constexpr int kWrites = 20 * kConsoleWritesPerSecond;
  const auto began = std::chrono::steady_clock::now();
  for (int i = 0; i < kWrites; ++i) EXPECT_EQ(call(kHcConsoleIo, kConsoleioWrite, 1, kArg), 0);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - began).count();
  const std::string out = host_.console().substr(std::string("a.[2Jb.c..\n").size());
  const auto passed = static_cast<std::size_t>(std::count(out.begin(), out.end(), 'a'));
  EXPECT_LE(passed, std::size_t{kConsoleWritesPerSecond} * static_cast<std::size_t>(seconds + 2)) << out.size();
  EXPECT_LT(passed, std::size_t{kWrites});
  // After a second without writes, the next one passes, with the note first.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const std::size_t seen = host_.console().size();
  EXPECT_EQ(call(kHcConsoleIo, kConsoleioWrite, 1, kArg), 0);
  EXPECT_THAT(host_.console().substr(seen), ::testing::MatchesRegex("\\[xpv: [0-9]+ console_io writes dropped: more than 50 a second\\]\na"));
}

}  // namespace
}  // namespace xpv::xen::test
