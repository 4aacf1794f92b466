// A tiny 64-bit guest on this host's /dev/kvm issues hypercalls through xpv's port-I/O trap (the
// convention the rewritten Linux stubs use: nr in rax, args in rdi rsi rdx r10 r8, `out %al,
// $0xe8`): unknown numbers, unknown subcommands, bad pointers and bad ports get Xen's error codes
// in rax, a valid call still works after them, and the VM runs on to its own clean stop. The
// hypercall-page MSR (older kernels): the page is filled and called through; a bad index faults.
// A hypercall from ring 3 is refused with -EPERM, as Xen does.
// Skipped with the reason when /dev/kvm cannot be used.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "xpv/kvm/linux_boot.h"
#include "xpv/kvm/pci_host.h"
#include "xpv/kvm/vm.h"
#include "xpv/unique_fd.h"
#include "xpv/vmm/xen_domain.h"
#include "xpv/xen/config.h"
#include "xpv/xen/stubs.h"
#include "xpv/test/kvm.h"
#include "xpv/test/scoped_env.h"

namespace xpv::vmm {
namespace {

using xpv::test::kvm_usable;
using xpv::test::ScopedEnv;

// x86-64 machine code, assembled by hand (each helper says what it encodes).
struct Code {
  std::vector<std::uint8_t> b;
  void imm32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void mov_eax(std::uint32_t v) { b.push_back(0xb8); imm32(v); }  // mov $v, %eax (zero-extends)
  void mov_edi(std::uint32_t v) { b.push_back(0xbf); imm32(v); }  // mov $v, %edi
  void mov_rsi(std::uint64_t v) {                                  // movabs $v, %rsi
    b.insert(b.end(), {0x48, 0xbe});
    imm32(static_cast<std::uint32_t>(v));
    imm32(static_cast<std::uint32_t>(v >> 32));
  }
  void mov_rax_minus1() { b.insert(b.end(), {0x48, 0xc7, 0xc0, 0xff, 0xff, 0xff, 0xff}); }  // mov $-1, %rax
  void hypercall() { b.insert(b.end(), {0xe6, xen::kHypercallPort}); }                       // out %al, $port
  void store_rax(std::uint32_t addr) { b.insert(b.end(), {0x48, 0x89, 0x04, 0x25}); imm32(addr); }  // mov %rax, addr
  void stop() { b.insert(b.end(), {0xfa, 0xf4, 0xeb, 0xfd}); }  // cli; hlt; jmp back to hlt
  void wrmsr(std::uint32_t msr, std::uint32_t lo) {  // mov $msr, %ecx; mov $lo, %eax; xor %edx, %edx; wrmsr
    b.push_back(0xb9);
    imm32(msr);
    mov_eax(lo);
    b.insert(b.end(), {0x31, 0xd2, 0x0f, 0x30});
  }
  void call_abs(std::uint32_t addr) { mov_eax(addr); b.insert(b.end(), {0xff, 0xd0}); }  // mov $addr, %eax; call *%rax
  void lgdt_abs(std::uint32_t addr) { b.insert(b.end(), {0x0f, 0x01, 0x14, 0x25}); imm32(addr); }  // lgdt addr
  void push(std::uint32_t v) { b.push_back(0x68); imm32(v); }  // push $v (sign-extended to 64 bits)
  void iretq() { b.insert(b.end(), {0x48, 0xcf}); }
  void hlt() { b.push_back(0xf4); }
};

struct TinyRun {
  kvm::StopReason stop = kvm::StopReason::none;
  std::string message;
};

// Runs `c` at 0x100000 in long mode on a 1-vCPU, 32 MiB Xen domain until it stops (60 s
// watchdog); prepare() fills guest memory first, inspect() looks at the VM before teardown.
TinyRun run_tiny(const Code& c, const std::function<void(kvm::Vm&, XenDomain&)>& prepare,
                 const std::function<void(kvm::Vm&, XenDomain&)>& inspect) {
  TinyRun out;
  char tmpl[] = "/tmp/xpv-xenvm-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    ADD_FAILURE() << "mkdtemp";
    return out;
  }
  const std::string run_dir = tmpl;
  kvm::VmConfig cfg;
  cfg.vcpus = 1;
  cfg.memory_bytes = 32ull << 20;
  cfg.halt_poll = std::chrono::milliseconds(50);
  XenDomainConfig xcfg;
  xcfg.domid = 5;
  xcfg.name = "tiny";
  xcfg.run_dir = run_dir;
  xcfg.max_grant_frames = 4;
  add_xen_device_memory(cfg, xcfg);
  {
    kvm::Vm vm(cfg);
    kvm::PciHost pci;
    XenDomain xen(vm, pci, xcfg);
    EXPECT_TRUE(kvm::write_long_mode_tables(vm.memory()));
    auto code = vm.memory().translate(0x100000, c.b.size());
    EXPECT_TRUE(code);
    if (code) std::memcpy(code->data(), c.b.data(), c.b.size());
    prepare(vm, xen);
    kvm::LinuxBootEntry e;
    e.rip = 0x100000;
    vm.boot_cpu_long_mode(e);
    std::atomic<bool> done{false};
    std::thread dog([&] {  // bounded: a broken stop path fails the test instead of hanging it
      for (int i = 0; i < 600 && !done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!done.load()) vm.request_stop(kvm::StopReason::error, "test watchdog: guest did not stop in 60 s");
    });
    out.stop = vm.run();
    done.store(true);
    dog.join();
    out.message = vm.stop_message();
    inspect(vm, xen);
  }
  std::filesystem::remove_all(run_dir);
  return out;
}

constexpr std::uint32_t kResults = 0x3000;  // one u64 per call
constexpr std::uint32_t kArgs = 0x2000;     // argument structs
constexpr std::uint32_t kUnmapped = 0x7f00'0000;  // no page maps it (identity map covers only RAM up to 4 GiB… and RAM is 32 MiB)

TEST(XenHypercallGuest, BadHypercallsGetErrorsAndTheVmmLivesOn) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  std::vector<std::int64_t> got;
  Code c;
  auto call = [&](auto setup) {
    setup();
    c.hypercall();
    c.store_rax(kResults + 8 * static_cast<std::uint32_t>(got.size()));
    got.push_back(0);
  };
  call([&] { c.mov_eax(63); });                                                   // 0: no such hypercall
  call([&] { c.mov_rax_minus1(); });                                              // 1: nr = 2^64-1
  call([&] { c.mov_eax(17); c.mov_edi(0x9999); });                                // 2: xen_version, unknown cmd
  call([&] { c.mov_eax(17); c.mov_edi(1); c.mov_rsi(kUnmapped); });               // 3: extraversion into nowhere
  call([&] { c.mov_eax(32); c.mov_edi(4); c.mov_rsi(kArgs); });                   // 4: EVTCHNOP_send, port 4000
  call([&] { c.mov_eax(32); c.mov_edi(4); c.mov_rsi(kUnmapped); });               // 5: EVTCHNOP_send, bad pointer
  call([&] { c.mov_eax(34); c.mov_edi(0x7777); c.mov_rsi(kArgs); });              // 6: hvm_op, unknown op
  call([&] { c.mov_eax(12); c.mov_edi(0x5555); c.mov_rsi(kArgs); });              // 7: memory_op, unknown cmd
  call([&] { c.mov_eax(17); c.mov_edi(0); });                                     // 8: XENVER_version, valid
  c.stop();
  const auto r = run_tiny(
      c,
      [](kvm::Vm& vm, XenDomain&) {
        const std::uint32_t port = 4000;
        std::memcpy(vm.memory().translate(kArgs, 4)->data(), &port, 4);
      },
      [&](kvm::Vm& vm, XenDomain& xen) {
        for (std::size_t i = 0; i < got.size(); ++i) {
          std::memcpy(&got[i], vm.memory().translate(kResults + 8 * i, 8)->data(), 8);
        }
        EXPECT_EQ(xen.platform().calls(17), 3u) << "each xen_version call reached the dispatcher";
        EXPECT_EQ(xen.platform().calls(32), 2u);
      });

  ASSERT_EQ(r.stop, kvm::StopReason::poweroff) << "the guest ran on to its own halt: " << r.message;
  ASSERT_EQ(got.size(), 9u);
  constexpr std::int64_t kEnosys = -38, kEfault = -14, kEinval = -22;
  EXPECT_EQ(got[0], kEnosys);
  EXPECT_EQ(got[1], kEnosys);
  EXPECT_EQ(got[2], kEnosys);
  EXPECT_EQ(got[3], kEfault);
  EXPECT_EQ(got[4], kEinval);
  EXPECT_EQ(got[5], kEfault);
  EXPECT_EQ(got[6], kEnosys);
  EXPECT_EQ(got[7], kEnosys);
  EXPECT_EQ(got[8], (4 << 16) | 17) << "Xen 4.17, after all the bad calls";
}

// Xen refuses a hypercall from outside the guest's kernel with -EPERM. The guest drops to ring 3
// with IOPL 3, so its `out` reaches the trap as a guest process's would: xen_version and a
// poweroff are both refused. It then halts in ring 3, which (no IDT) ends in a triple fault; had
// the poweroff been done, the VM would have stopped with poweroff instead.
constexpr std::uint32_t kUserGdt = 0x4000, kUserGdtr = 0x4100, kUserStack = 0x6ff0;
constexpr std::uint16_t kUserDs = 0x20 | 3, kUserCs = 0x28 | 3;

TEST(XenHypercallGuest, ACallFromRing3IsRefusedWithEperm) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  Code c;
  c.lgdt_abs(kUserGdtr);  // the boot GDT plus ring-3 code and data
  c.push(kUserDs);        // ss
  c.push(kUserStack);     // rsp
  c.push(0x3002);         // rflags: IOPL 3, interrupts off
  c.push(kUserCs);        // cs
  const std::size_t entry_at = c.b.size() + 1;
  c.push(0);              // rip: patched below
  c.iretq();
  const auto user_entry = static_cast<std::uint32_t>(0x100000 + c.b.size());
  std::memcpy(c.b.data() + entry_at, &user_entry, 4);
  c.mov_eax(17);          // xen_version(XENVER_version)
  c.mov_edi(0);
  c.hypercall();
  c.store_rax(kResults);
  c.mov_eax(29);          // sched_op(SCHEDOP_shutdown, {SHUTDOWN_poweroff})
  c.mov_edi(2);
  c.mov_rsi(kArgs);
  c.hypercall();
  c.store_rax(kResults + 8);
  c.hlt();                // #GP in ring 3 → triple fault
  std::array<std::int64_t, 2> got{7, 7};
  const auto r = run_tiny(
      c,
      [](kvm::Vm& vm, XenDomain&) {
        const GuestMemory& m = vm.memory();
        const std::array<std::uint64_t, 6> gdt{0, 0, 0x00af'9b00'0000'ffffull, 0x00cf'9300'0000'ffffull,
                                               0x00cf'f300'0000'ffffull, 0x00af'fb00'0000'ffffull};
        std::memcpy(m.translate(kUserGdt, sizeof(gdt))->data(), gdt.data(), sizeof(gdt));
        const std::uint16_t limit = sizeof(gdt) - 1;
        const std::uint64_t base = kUserGdt;
        std::memcpy(m.translate(kUserGdtr, 2)->data(), &limit, 2);
        std::memcpy(m.translate(kUserGdtr + 2, 8)->data(), &base, 8);
        // The first 2 MiB (code, stack, results) user-accessible at every level of the tables.
        for (std::uint64_t table : {kvm::kPml4Gpa, kvm::kPml4Gpa + 0x1000, kvm::kPml4Gpa + 0x2000}) {
          std::uint64_t e;
          std::memcpy(&e, m.translate(table, 8)->data(), 8);
          e |= 4;  // U/S
          std::memcpy(m.translate(table, 8)->data(), &e, 8);
        }
        const std::uint32_t poweroff = 0;
        std::memcpy(m.translate(kArgs, 4)->data(), &poweroff, 4);
        std::memcpy(m.translate(kResults, 16)->data(), std::array<std::int64_t, 2>{7, 7}.data(), 16);
      },
      [&](kvm::Vm& vm, XenDomain& xen) {
        std::memcpy(got.data(), vm.memory().translate(kResults, 16)->data(), 16);
        EXPECT_EQ(xen.platform().calls(17), 1u) << "the call reached the dispatcher";
        EXPECT_EQ(xen.platform().calls(29), 1u);
      });
  EXPECT_EQ(r.stop, kvm::StopReason::triple_fault) << "ring 3's halt, not the refused poweroff: " << r.message;
  constexpr std::int64_t kEperm = -1;
  EXPECT_EQ(got[0], kEperm) << "xen_version from ring 3";
  EXPECT_EQ(got[1], kEperm) << "poweroff from ring 3";
}

// A kernel older than XSA-466 asks for the hypercall page with WRMSR 0x40000000 and then calls
// entry nr at page + nr*32: the VMM fills the page with port-I/O stubs, so the call reaches the
// dispatcher with the right number.
constexpr std::uint32_t kHypercallPageGpa = 0x5000;

struct PageRun {
  TinyRun run;
  bool trapped = false;                // this KVM hands the MSR write to the VMM
  std::array<std::uint8_t, 4096> page{};  // kHypercallPageGpa afterwards
};

PageRun run_page_guest(const Code& c, const std::function<void(kvm::Vm&, XenDomain&)>& more,
                       const std::function<void(kvm::Vm&, XenDomain&)>& prepare = [](kvm::Vm&, XenDomain&) {}) {
  PageRun out;
  out.run = run_tiny(
      c, prepare,
      [&](kvm::Vm& vm, XenDomain& xen) {
        out.trapped = xen.hypercall_page_msr();
        std::memcpy(out.page.data(), vm.memory().translate(kHypercallPageGpa, 4096)->data(), 4096);
        more(vm, xen);
      });
  return out;
}

TEST(XenHypercallGuest, TheHypercallPageMsrGivesAPageToCallThrough) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  ScopedEnv fast("XPV_EVTCHN_FAST_SEND", nullptr);  // the default: entry 32 is the fast send
  Code c;
  c.wrmsr(xen::kHypercallPageMsr, kHypercallPageGpa);
  c.mov_edi(0);  // XENVER_version
  c.call_abs(kHypercallPageGpa + 17 * 32);
  c.store_rax(kResults);
  c.mov_edi(0x9999);  // an unknown xen_version command through the page: Xen's error
  c.call_abs(kHypercallPageGpa + 17 * 32);
  c.store_rax(kResults + 8);
  c.stop();
  std::int64_t version = 0, unknown = 0;
  const auto r = run_page_guest(c, [&](kvm::Vm& vm, XenDomain& xen) {
    std::memcpy(&version, vm.memory().translate(kResults, 8)->data(), 8);
    std::memcpy(&unknown, vm.memory().translate(kResults + 8, 8)->data(), 8);
    if (xen.hypercall_page_msr()) {  // else skipped below
      EXPECT_EQ(xen.platform().calls(17), 2u);
    }
  });
  if (!r.trapped) GTEST_SKIP() << "this KVM cannot hand MSR writes to the VMM";
  ASSERT_EQ(r.run.stop, kvm::StopReason::poweroff) << r.run.message;
  EXPECT_EQ(r.page, xen::build_hypercall_page(xen::kHypercallPort, xen::kEvtchnSendPort));
  EXPECT_EQ(version, (4 << 16) | 17);
  EXPECT_EQ(unknown, -38);
}

// Through the page's event_channel_op entry (stubs.h), EVTCHNOP_send on a port connected to a
// dom0 endpoint signals the endpoint's eventfd inside KVM — the dispatcher never sees it — while
// a send on a port that is not connected still reaches the dispatcher and gets its error.
struct PageSends {
  PageRun run;
  std::uint64_t kicks_before = 0, kicks = 0;  // the endpoint's eventfd: at the bind, after the run
  std::uint64_t dispatched_sends = 0, dispatched = 0;  // EVTCHNOP_send / event_channel_op calls
  std::int64_t got[5] = {};
};

// Through the page's entry 32: two sends on a port bound to a dom0 endpoint, one on a port not
// in use, an unknown command; then xen_version through entry 17.
PageSends run_page_sends() {
  PageSends out;
  constexpr std::uint32_t kRouted = kArgs, kBad = kArgs + 8;  // struct evtchn_send { port }
  Code c;
  c.wrmsr(xen::kHypercallPageMsr, kHypercallPageGpa);
  auto send = [&](std::uint32_t arg, std::uint32_t result) {
    c.mov_edi(4);  // EVTCHNOP_send
    c.mov_rsi(arg);
    c.call_abs(kHypercallPageGpa + 32 * 32);
    c.store_rax(result);
  };
  send(kRouted, kResults);
  send(kRouted, kResults + 8);
  send(kBad, kResults + 16);
  c.mov_edi(0x7777);  // an unknown EVTCHNOP: the entry's other path, to the dispatcher
  c.mov_rsi(kArgs);
  c.call_abs(kHypercallPageGpa + 32 * 32);
  c.store_rax(kResults + 24);
  c.mov_edi(0);  // XENVER_version: the page's other entries still work
  c.call_abs(kHypercallPageGpa + 17 * 32);
  c.store_rax(kResults + 32);
  c.stop();
  UniqueFd to_dom0;
  out.run = run_page_guest(
      c,
      [&](kvm::Vm& vm, XenDomain& xen) {
        std::memcpy(out.got, vm.memory().translate(kResults, sizeof out.got)->data(), sizeof out.got);
        out.dispatched_sends = xen.platform().evtchn_calls(4);
        out.dispatched = xen.platform().calls(32);
        std::uint64_t v = 0;
        if (::read(to_dom0.get(), &v, sizeof v) == static_cast<ssize_t>(sizeof v)) out.kicks = v;
      },
      [&](kvm::Vm& vm, XenDomain& xen) {
        // A backend's endpoint on a guest port the guest left unbound for dom 0.
        auto& ev = xen.domain().evtchn();
        auto port = ev.alloc_unbound(0);
        ASSERT_TRUE(port);
        auto fds = ev.bind_to_dom0(*port);
        ASSERT_TRUE(fds);
        to_dom0 = std::move(fds->to_dom0);
        std::uint64_t v = 0;  // the bind's own notification (event_channels.h)
        if (::read(to_dom0.get(), &v, sizeof v) == static_cast<ssize_t>(sizeof v)) out.kicks_before = v;
        const std::uint32_t routed = *port, bad = 4000;
        std::memcpy(vm.memory().translate(kRouted, 4)->data(), &routed, 4);
        std::memcpy(vm.memory().translate(kBad, 4)->data(), &bad, 4);
      });
  return out;
}

// The fast send through the page: the sends on the connected port signal the endpoint's eventfd
// inside KVM and never reach the dispatcher; the rest does, with its error.
TEST(XenHypercallGuest, TheHypercallPageSendsToABackendWithoutTheDispatcher) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  ScopedEnv fast("XPV_EVTCHN_FAST_SEND", nullptr);
  const PageSends r = run_page_sends();
  if (!r.run.trapped) GTEST_SKIP() << "this KVM cannot hand MSR writes to the VMM";
  ASSERT_EQ(r.run.run.stop, kvm::StopReason::poweroff) << r.run.run.message;
  EXPECT_EQ(r.run.page, xen::build_hypercall_page(xen::kHypercallPort, xen::kEvtchnSendPort));
  EXPECT_EQ(r.kicks_before, 1u);
  EXPECT_EQ(r.kicks, 2u) << "both sends on the connected port signalled its eventfd";
  EXPECT_EQ(r.dispatched_sends, 1u) << "only the send on the port not in use reached the dispatcher";
  EXPECT_EQ(r.dispatched, 2u) << "that send and the unknown command";
  EXPECT_EQ(r.got[0], 0);
  EXPECT_EQ(r.got[1], 0);
  EXPECT_EQ(r.got[2], -22) << "EINVAL for a port not in use, from the dispatcher";
  EXPECT_EQ(r.got[3], -38) << "ENOSYS for an unknown EVTCHNOP";
  EXPECT_EQ(r.got[4], (4 << 16) | 17);
}

// XPV_EVTCHN_FAST_SEND=0: the plain page, every send through the dispatcher, the same results.
TEST(XenHypercallGuest, WithoutFastSendsEverySendThroughThePageReachesTheDispatcher) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  ScopedEnv fast("XPV_EVTCHN_FAST_SEND", "0");
  const PageSends r = run_page_sends();
  if (!r.run.trapped) GTEST_SKIP() << "this KVM cannot hand MSR writes to the VMM";
  ASSERT_EQ(r.run.run.stop, kvm::StopReason::poweroff) << r.run.run.message;
  EXPECT_EQ(r.run.page, xen::build_hypercall_page(xen::kHypercallPort));
  EXPECT_EQ(r.kicks, 2u) << "the dispatcher signals the endpoint for each send";
  EXPECT_EQ(r.dispatched_sends, 3u);
  EXPECT_EQ(r.dispatched, 4u);
  EXPECT_EQ(r.got[0], 0);
  EXPECT_EQ(r.got[1], 0);
  EXPECT_EQ(r.got[2], -22);
  EXPECT_EQ(r.got[3], -38);
  EXPECT_EQ(r.got[4], (4 << 16) | 17);
}

TEST(XenHypercallGuest, AHypercallPageIndexBeyondTheOfferFaultsAndWritesNothing) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  Code c;
  c.wrmsr(xen::kHypercallPageMsr, kHypercallPageGpa | 1);  // page 1: CPUID offers one page
  c.stop();
  const auto r = run_page_guest(c, [](kvm::Vm&, XenDomain&) {});
  if (!r.trapped) GTEST_SKIP() << "this KVM cannot hand MSR writes to the VMM";
  // The #GP finds no IDT in this guest, so it ends as a triple fault; it never reaches the hlt.
  EXPECT_EQ(r.run.stop, kvm::StopReason::triple_fault) << r.run.message;
  EXPECT_EQ(r.page, (std::array<std::uint8_t, 4096>{})) << "nothing was written for the refused write";
}

}  // namespace
}  // namespace xpv::vmm
