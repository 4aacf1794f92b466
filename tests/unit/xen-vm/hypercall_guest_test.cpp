// A tiny 64-bit guest on this host's /dev/kvm issues hypercalls through xpv's port-I/O trap (the
// convention the rewritten Linux stubs use: nr in rax, args in rdi rsi rdx r10 r8, `out %al,
// $0xe8`): unknown numbers, unknown subcommands, bad pointers and bad ports get Xen's error codes
// in rax, a valid call still works after them, and the VM runs on to its own clean stop.
// Skipped with the reason when /dev/kvm cannot be used.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "xpv/kvm/linux_boot.h"
#include "xpv/kvm/pci_host.h"
#include "xpv/kvm/vm.h"
#include "xpv/vmm/xen_domain.h"
#include "xpv/test/kvm.h"

namespace xpv::vmm {
namespace {

using xpv::test::kvm_usable;

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
};

constexpr std::uint32_t kResults = 0x3000;  // one u64 per call
constexpr std::uint32_t kArgs = 0x2000;     // argument structs
constexpr std::uint32_t kUnmapped = 0x7f00'0000;  // no page maps it (identity map covers only RAM up to 4 GiB… and RAM is 32 MiB)

TEST(XenHypercallGuest, BadHypercallsGetErrorsAndTheVmmLivesOn) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  char tmpl[] = "/tmp/xpv-xenvm-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
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
  std::vector<std::int64_t> got;
  kvm::StopReason stop = kvm::StopReason::none;
  std::string stop_message;
  {
    kvm::Vm vm(cfg);
    kvm::PciHost pci;
    XenDomain xen(vm, pci, xcfg);
    ASSERT_TRUE(kvm::write_long_mode_tables(vm.memory()));

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
    auto code = vm.memory().translate(0x100000, c.b.size());
    ASSERT_TRUE(code);
    std::memcpy(code->data(), c.b.data(), c.b.size());
    const std::uint32_t port = 4000;
    std::memcpy(vm.memory().translate(kArgs, 4)->data(), &port, 4);
    kvm::LinuxBootEntry e;
    e.rip = 0x100000;
    vm.boot_cpu_long_mode(e);

    std::atomic<bool> done{false};
    std::thread dog([&] {  // bounded: a broken stop path fails the test instead of hanging it
      for (int i = 0; i < 600 && !done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!done.load()) vm.request_stop(kvm::StopReason::error, "test watchdog: guest did not stop in 60 s");
    });
    stop = vm.run();
    done.store(true);
    dog.join();
    stop_message = vm.stop_message();
    for (std::size_t i = 0; i < got.size(); ++i) {
      std::memcpy(&got[i], vm.memory().translate(kResults + 8 * i, 8)->data(), 8);
    }
    EXPECT_EQ(xen.platform().calls(17), 3u) << "each xen_version call reached the dispatcher";
    EXPECT_EQ(xen.platform().calls(32), 2u);
  }
  std::filesystem::remove_all(run_dir);

  ASSERT_EQ(stop, kvm::StopReason::poweroff) << "the guest ran on to its own halt: " << stop_message;
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

}  // namespace
}  // namespace xpv::vmm
