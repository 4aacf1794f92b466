// Creates a real VM on this host's /dev/kvm and runs tiny guest stubs (a handful of instructions:
// CPL-0 code is emulated here at ~1 µs per instruction, ENVIRONMENT.md). Skipped with the reason
// when /dev/kvm cannot be used.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "xpv/kvm/cpu_list.h"
#include "xpv/kvm/linux_boot.h"
#include "xpv/kvm/pc_devices.h"
#include "xpv/kvm/uart.h"
#include "xpv/kvm/vm.h"
#include "xpv/test/kvm.h"

namespace xpv::kvm {
namespace {

using xpv::test::kvm_usable;

struct Guest {
  Vm vm;
  std::mutex mu;
  std::string out;
  Uart16550 uart{[this](std::span<const std::uint8_t> b) {
                   std::lock_guard lk(mu);
                   out.append(b.begin(), b.end());
                 },
                 [this](bool l) { vm.set_irq(4, l); }};
  ResetPorts reset{[this] { vm.request_stop(StopReason::reboot, "reset"); }};
  explicit Guest(const VmConfig& c) : vm(c) {
    EXPECT_TRUE(vm.pio().add(0x3f8, 8, &uart, "com1"));
    EXPECT_TRUE(vm.pio().add(0x64, 1, &reset, "i8042"));
  }
  // Runs with a 60 s watchdog (bounded: a broken stop path fails the test instead of hanging it).
  StopReason run() {
    std::atomic<bool> done{false};
    std::thread dog([&] {
      for (int i = 0; i < 600 && !done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!done.load()) vm.request_stop(StopReason::error, "test watchdog: guest did not stop in 60 s");
    });
    const StopReason r = vm.run();
    done.store(true);
    dog.join();
    return r;
  }
};

VmConfig small(unsigned vcpus = 1) {
  VmConfig c;
  c.vcpus = vcpus;
  c.memory_bytes = 32ull << 20;
  c.halt_poll = std::chrono::milliseconds(50);
  return c;
}

// A guest that counts as long as it runs, for protected mode at 0x100000: 1: inc dword
// [0x1800000]; jmp 1b. Returns the counter (null when guest memory could not be reached).
std::uint32_t* load_counting_guest(Guest& g) {
  const std::uint8_t code[] = {0xff, 0x05, 0x00, 0x00, 0x80, 0x01, 0xeb, 0xf8};
  auto m = g.vm.memory().translate(0x100000, sizeof code);
  auto c = g.vm.memory().translate(0x1800000, 4);
  if (!m || !c) return nullptr;
  std::memcpy(m->data(), code, sizeof code);
  return reinterpret_cast<std::uint32_t*>(c->data());
}

TEST(VmSmoke, RealModeStubWritesToTheUartAndHaltsAsPoweroff) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  Guest g(small(2));  // the AP is never started: counts as off
  // mov dx,0x3f8; mov al,'O'; out dx,al; mov al,'K'; out dx,al; cli; hlt
  const std::uint8_t code[] = {0xba, 0xf8, 0x03, 0xb0, 'O', 0xee, 0xb0, 'K', 0xee, 0xfa, 0xf4};
  auto m = g.vm.memory().translate(0x1000, sizeof code);
  ASSERT_TRUE(m);
  std::memcpy(m->data(), code, sizeof code);
  g.vm.boot_cpu_real_mode(0x100, 0);
  EXPECT_EQ(g.run(), StopReason::poweroff) << g.vm.stop_message();
  EXPECT_EQ(g.out, "OK");
  const auto s = g.vm.stats();
  EXPECT_EQ(s.by_reason[KVM_EXIT_IO], 2u);
  // What xpv-vmm --stats-file publishes for `xpv top`: the same count under its name.
  const auto c = exit_counters(s);
  EXPECT_NE(std::ranges::find(c, std::pair<std::string, std::uint64_t>{"exit_io", 2}), c.end());
}

TEST(VmSmoke, ExitCountersNameEachReasonSumThemAndMergeTheUnnamed) {
  ExitStats s;
  s.by_reason[KVM_EXIT_IO] = 7;
  s.by_reason[KVM_EXIT_HLT] = 3;
  s.by_reason[KVM_EXIT_MMIO] = 5;
  s.by_reason[40] = 1;  // no name: "other", with the next one
  s.by_reason[41] = 2;
  s.mmio_unclaimed = 4;
  const std::vector<std::pair<std::string, std::uint64_t>> want{
      {"exits", 18}, {"exit_io", 7}, {"exit_hlt", 3}, {"exit_mmio", 5}, {"exit_other", 3},
      {"pio_unclaimed", 0}, {"mmio_unclaimed", 4}};
  EXPECT_EQ(exit_counters(s), want);
  // Nothing happened yet: the totals are there, at zero, and no reason is.
  const std::vector<std::pair<std::string, std::uint64_t>> none{{"exits", 0}, {"pio_unclaimed", 0}, {"mmio_unclaimed", 0}};
  EXPECT_EQ(exit_counters(ExitStats{}), none);
}

TEST(VmSmoke, LongModeStubEntersThroughTheBootProtocolState) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  Guest g(small());
  ASSERT_TRUE(write_long_mode_tables(g.vm.memory()));
  // mov dx,0x3f8; mov al,'L'; out dx,al; mov al,[rsi] (zero page byte 0 = 0x5a); out dx,al;
  // then i8042 reset: mov al,0xfe; out 0x64,al
  const std::uint8_t code[] = {0x66, 0xba, 0xf8, 0x03, 0xb0, 'L', 0xee, 0x8a, 0x06, 0xee, 0xb0, 0xfe, 0xe6, 0x64, 0xf4};
  auto m = g.vm.memory().translate(0x100000, sizeof code);
  ASSERT_TRUE(m);
  std::memcpy(m->data(), code, sizeof code);
  (*g.vm.memory().translate(kBootParamsGpa, 1))[0] = 'Z';
  LinuxBootEntry e;
  e.rip = 0x100000;
  g.vm.boot_cpu_long_mode(e);
  EXPECT_EQ(g.run(), StopReason::reboot) << g.vm.stop_message();
  EXPECT_EQ(g.out, "LZ");
}

TEST(VmSmoke, ProtectedModeStubRunsFlat32BitWithPagingOff) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  Guest g(small());
  // 32-bit only: 0x48 is `dec eax` (in long mode it would be a REX prefix), `a0 moffs32` reads a
  // flat physical address with paging off.
  //   mov dx,0x3f8; mov eax,'R'; dec eax; out dx,al; mov al,[0x1800000]; out dx,al;
  //   mov al,0xfe; out 0x64,al (reset: stop)
  const std::uint8_t code[] = {0x66, 0xba, 0xf8, 0x03, 0xb8, 'R', 0, 0, 0, 0x48, 0xee, 0xa0, 0x00,
                               0x00, 0x80, 0x01, 0xee, 0xb0, 0xfe, 0xe6, 0x64, 0xf4};
  auto m = g.vm.memory().translate(0x100000, sizeof code);
  ASSERT_TRUE(m);
  std::memcpy(m->data(), code, sizeof code);
  (*g.vm.memory().translate(0x1800000, 1))[0] = 'P';
  g.vm.boot_cpu_protected_mode(0x100000);
  EXPECT_EQ(g.run(), StopReason::reboot) << g.vm.stop_message();
  EXPECT_EQ(g.out, "QP");
}

// True when the CPU has hardware virtualization (svm/vmx), i.e. KVM is the real thing: inside the
// testbed, or on an ordinary host. This machine's software KVM reports an emulation failure
// (KVM_EXIT_INTERNAL_ERROR) where hardware reports a shutdown.
bool hardware_kvm() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) == 0) return line.find(" svm") != std::string::npos || line.find(" vmx") != std::string::npos;
  }
  return false;
}

TEST(VmSmoke, TripleFaultStopsCleanly) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  if (!hardware_kvm()) GTEST_SKIP() << "no svm/vmx: this software KVM does not report triple faults (runs in the testbed label)";
  Guest g(small());
  // Real mode, IDT limit 0 → int3 cannot be delivered → triple fault (shutdown).
  const std::uint8_t code[] = {0x0f, 0x01, 0x1e, 0x00, 0x02, 0xcc};  // lidt [0x200]; int3
  auto m = g.vm.memory().translate(0x1000, sizeof code);
  ASSERT_TRUE(m);
  std::memcpy(m->data(), code, sizeof code);
  std::memset(g.vm.memory().translate(0x1200, 6)->data(), 0, 6);
  g.vm.boot_cpu_real_mode(0x100, 0);
  EXPECT_EQ(g.run(), StopReason::triple_fault) << g.vm.stop_message();
  // The report carries the vCPU's state (on AMD already reset by KVM, but present).
  EXPECT_NE(g.vm.stop_message().find(" cr0="), std::string::npos) << g.vm.stop_message();
}

TEST(VmSmoke, APausedVmRunsNoGuestCodeUntilResumedAndStillStops) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  Guest g(small(2));  // the AP, never started, waits inside KVM_RUN: it must stop too
  std::uint32_t* counter = load_counting_guest(g);
  ASSERT_NE(counter, nullptr);
  const auto count = [&] { return __atomic_load_n(counter, __ATOMIC_RELAXED); };
  // Waits (bounded: 30 s) until the count is past `than`.
  const auto counts_past = [&](std::uint32_t than) {
    for (int i = 0; i < 3000 && count() == than && g.vm.stop_reason() == StopReason::none; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return count() != than;
  };
  g.vm.boot_cpu_protected_mode(0x100000);
  StopReason stopped = StopReason::none;
  std::thread runner([&] { stopped = g.run(); });
  EXPECT_TRUE(counts_past(0)) << "the guest never ran: " << g.vm.stop_message();

  auto p = g.vm.pause();
  EXPECT_TRUE(p) << (p ? "" : p.error().message);
  EXPECT_TRUE(g.vm.paused());
  // (EXPECTs only until the runner is joined: an ASSERT's return would destroy it joinable.)
  auto again = g.vm.pause();
  EXPECT_FALSE(again);
  if (!again) {
    EXPECT_EQ(again.error().message, "the VM is paused already");
  }
  const std::uint32_t at_pause = count();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(count(), at_pause) << "no guest instruction runs while paused";

  auto r = g.vm.resume();
  EXPECT_TRUE(r) << (r ? "" : r.error().message);
  EXPECT_FALSE(g.vm.paused());
  auto r2 = g.vm.resume();
  EXPECT_FALSE(r2);
  if (!r2) {
    EXPECT_EQ(r2.error().message, "the VM is not paused");
  }
  EXPECT_TRUE(counts_past(at_pause)) << "the guest runs on after resume";

  // A stop while paused ends the run (the parked vCPUs leave), as `xl destroy` of a paused domain.
  p = g.vm.pause();
  EXPECT_TRUE(p) << (p ? "" : p.error().message);
  g.vm.request_stop(StopReason::poweroff, "destroyed while paused");
  runner.join();
  EXPECT_EQ(stopped, StopReason::poweroff) << g.vm.stop_message();
  EXPECT_EQ(g.vm.stop_message(), "destroyed while paused");
}

// Waits (bounded) until the guest's UART output is `want`; false after `limit`.
bool wait_output(Guest& g, const std::string& want, std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end && g.vm.stop_reason() == StopReason::none) {
    {
      std::lock_guard lk(g.mu);
      if (g.out == want) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard lk(g.mu);
  return g.out == want;
}

// A 32-bit guest whose handler for vector 0xf3 counts, prints 'I' and returns WITHOUT an EOI (as
// Linux's handler of Xen's global callback vector does). Main code: own GDT (CS 0x10 flat, as the
// boot state's selector) and IDT, LAPIC software-enabled, prints 'R', then sti; hlt until the
// count reaches 2, then prints 'D' and halts with interrupts off (a poweroff).
void load_eoi_less_guest(Guest& g) {
  const std::uint8_t code[] = {
      0xbc, 0x00, 0x80, 0x00, 0x00,                                // mov esp, 0x8000
      0x0f, 0x01, 0x15, 0x00, 0x20, 0x00, 0x00,                    // lgdt [0x2000]
      0x0f, 0x01, 0x1d, 0x10, 0x20, 0x00, 0x00,                    // lidt [0x2010]
      0xc7, 0x05, 0xf0, 0x00, 0xe0, 0xfe, 0xff, 0x01, 0x00, 0x00,  // mov dword [0xfee000f0], 0x1ff
      0x66, 0xba, 0xf8, 0x03,                                      // mov dx, 0x3f8
      0xb0, 'R', 0xee,                                             // mov al, 'R'; out dx, al
      0xfb,                                                        // sti
      0xf4,                                                        // 1: hlt
      0x83, 0x3d, 0x00, 0x40, 0x00, 0x00, 0x02,                    //    cmp dword [0x4000], 2
      0x72, 0xf6,                                                  //    jb 1b
      0xfa, 0xb0, 'D', 0xee, 0xf4};                                // cli; mov al,'D'; out dx,al; hlt
  const std::uint8_t handler[] = {
      0x50, 0x52,                                // push eax; push edx
      0xff, 0x05, 0x00, 0x40, 0x00, 0x00,        // inc dword [0x4000]
      0x66, 0xba, 0xf8, 0x03, 0xb0, 'I', 0xee,   // mov dx, 0x3f8; mov al, 'I'; out dx, al
      0x5a, 0x58, 0xcf};                         // pop edx; pop eax; iretd (no EOI)
  auto put = [&](std::uint64_t gpa, const void* p, std::size_t n) {
    auto m = g.vm.memory().translate(gpa, n);
    ASSERT_TRUE(m);
    std::memcpy(m->data(), p, n);
  };
  put(0x100000, code, sizeof code);
  put(0x100100, handler, sizeof handler);
  const std::uint64_t gdt[] = {0, 0, 0x00cf9a000000ffffull, 0x00cf92000000ffffull};  // 0x10 code, 0x18 data
  put(0x2100, gdt, sizeof gdt);
  const std::uint8_t gdtr[] = {sizeof gdt - 1, 0, 0x00, 0x21, 0, 0};
  put(0x2000, gdtr, sizeof gdtr);
  const std::uint8_t idtr[] = {0x9f, 0x07, 0x00, 0x30, 0, 0};  // limit 0xf3 * 8 + 7, base 0x3000
  put(0x2010, idtr, sizeof idtr);
  const std::uint8_t gate[] = {0x00, 0x01, 0x10, 0x00, 0x00, 0x8e, 0x10, 0x00};  // 0x10:0x100100, int gate
  put(0x3000 + 0xf3 * 8, gate, sizeof gate);
  g.vm.boot_cpu_protected_mode(0x100000);
}

TEST(VmSmoke, AnAutoEoiVectorIsDeliveredAgainWithoutAnEoi) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  Guest g(small());
  if (!g.vm.can_auto_eoi()) GTEST_SKIP() << "this KVM has no Hyper-V SynIC (KVM_CAP_HYPERV_SYNIC); runs in the testbed label";
  load_eoi_less_guest(g);
  std::string host_error;
  std::thread host([&] {
    if (!wait_output(g, "R")) return;
    // From a thread that is not a vCPU's: the vCPU is kicked and takes it before it runs again.
    if (auto r = g.vm.set_auto_eoi_vector(0xf3); !r) {
      host_error = r.error().message;
      return;
    }
    g.vm.signal_msi(0, 0xf3);
    if (!wait_output(g, "RI")) return;
    g.vm.signal_msi(0, 0xf3);  // through the LAPIC again: no in-service bit blocks it
  });
  EXPECT_EQ(g.run(), StopReason::poweroff) << g.vm.stop_message();
  host.join();
  EXPECT_EQ(host_error, "");
  EXPECT_EQ(g.out, "RIID");
}

TEST(VmSmoke, WithoutAutoEoiTheSecondDeliveryWaitsForAnEoiThatNeverComes) {
  // The control for the test above: the same guest with an ordinary vector takes it once.
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  Guest g(small());
  if (!g.vm.can_auto_eoi()) GTEST_SKIP() << "runs with the test above (testbed label)";
  load_eoi_less_guest(g);
  std::thread host([&] {
    if (wait_output(g, "R")) {
      g.vm.signal_msi(0, 0xf3);
      if (wait_output(g, "RI")) {
        g.vm.signal_msi(0, 0xf3);
        // Blocked for good by the first one's in-service bit: give it a moment, then stop.
        std::this_thread::sleep_for(std::chrono::seconds(2));
      }
    }
    g.vm.request_stop(StopReason::reboot, "control done");
  });
  EXPECT_EQ(g.run(), StopReason::reboot) << g.vm.stop_message();
  host.join();
  EXPECT_EQ(g.out, "RI");
}

TEST(VmSmoke, AutoEoiVectorsAreRefusedWithTheReason) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  Vm vm(small());
  EXPECT_TRUE(vm.set_auto_eoi_vector(0));  // nothing set, nothing to undo: fine on any KVM
  const auto low = vm.set_auto_eoi_vector(0x0e);
  ASSERT_FALSE(low);
  EXPECT_NE(low.error().message.find("0x10..0xff"), std::string::npos) << low.error().message;
  const auto r = vm.set_auto_eoi_vector(0xf3);
  if (vm.can_auto_eoi()) {
    EXPECT_TRUE(r) << r.error().message;  // no vCPU runs yet: each takes it when it starts
  } else {
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("KVM_CAP_HYPERV_SYNIC"), std::string::npos) << r.error().message;
  }
}

// xl's `cpus`: each vCPU's thread is placed before it first enters the guest, and its id is what
// vcpu_threads() gives (what `xpv vcpu-list` and `vcpu-pin` act on); a thread that has ended has 0.
TEST(VmSmoke, EachVcpuThreadRunsOnTheCpusItWasGiven) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  const auto allowed = cpus_of_thread(0);
  ASSERT_TRUE(allowed);
  std::vector<std::size_t> mine;
  for (std::size_t c = 0; c < kMaxCpus; ++c) {
    if (allowed->cpus.test(c)) mine.push_back(c);
  }
  if (mine.size() < 2) GTEST_SKIP() << "one CPU allowed here: a placement could not be told from none";
  VmConfig cfg = small(2);
  cfg.affinity.resize(2);
  cfg.affinity[0].cpus.set(mine.back());   // the BSP on the last CPU this process may use
  cfg.affinity[1].cpus.set(mine.front());  // the AP (never started: it waits in KVM_RUN) on the first
  Guest g(cfg);
  std::uint32_t* counter = load_counting_guest(g);
  ASSERT_NE(counter, nullptr);
  EXPECT_EQ(g.vm.vcpu_threads(), (std::vector<pid_t>{0, 0})) << "no thread before run()";
  g.vm.boot_cpu_protected_mode(0x100000);
  StopReason stopped = StopReason::none;
  std::thread runner([&] { stopped = g.run(); });
  for (int i = 0; i < 3000 && __atomic_load_n(counter, __ATOMIC_RELAXED) == 0 && g.vm.stop_reason() == StopReason::none; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(__atomic_load_n(counter, __ATOMIC_RELAXED), 0u) << "the guest never ran: " << g.vm.stop_message();
  std::vector<pid_t> tids;
  for (int i = 0; i < 500; ++i) {  // the AP's thread sets its id as it begins (bounded: 5 s)
    tids = g.vm.vcpu_threads();
    if (tids.size() == 2 && tids[0] != 0 && tids[1] != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(tids.size(), 2u);
  for (std::size_t v = 0; v < tids.size() && v < 2; ++v) {
    EXPECT_NE(tids[v], 0) << "vCPU " << v;
    if (tids[v] == 0) continue;
    const auto placed = cpus_of_thread(tids[v]);
    EXPECT_TRUE(placed) << "vCPU " << v;
    if (placed) {
      EXPECT_EQ(format_cpu_list(*placed), format_cpu_list(cfg.affinity[v])) << "vCPU " << v;
    }
  }
  EXPECT_NE(tids[0], ::gettid());
  EXPECT_EQ(format_cpu_list(*cpus_of_thread(0)), format_cpu_list(*allowed)) << "the caller stays where it was";
  // `xpv vcpu-pin` while it runs: both moved to the BSP's CPU, then a set the kernel refuses for
  // them (CPU 1023) changes neither; a vCPU the VM does not have is named.
  CpuList first;
  first.cpus.set(mine.front());
  auto moved = g.vm.set_vcpu_affinity({0, 1}, first);
  EXPECT_TRUE(moved) << (moved ? "" : moved.error().message);
  for (std::size_t v = 0; v < tids.size() && v < 2 && tids[v] != 0; ++v) {
    EXPECT_EQ(format_cpu_list(*cpus_of_thread(tids[v])), format_cpu_list(first)) << "vCPU " << v;
  }
  if (!allowed->cpus.test(kMaxCpus - 1)) {
    CpuList absent;
    absent.cpus.set(kMaxCpus - 1);
    auto refused = g.vm.set_vcpu_affinity({0, 1}, absent);
    EXPECT_FALSE(refused);
    if (!refused) {
      EXPECT_EQ(refused.error().message, std::string("vCPU 0: cannot be placed on CPUs 1023: ") + std::strerror(EINVAL));
    }
    for (std::size_t v = 0; v < tids.size() && v < 2 && tids[v] != 0; ++v) {
      EXPECT_EQ(format_cpu_list(*cpus_of_thread(tids[v])), format_cpu_list(first)) << "vCPU " << v << " moved";
    }
  }
  auto bad = g.vm.set_vcpu_affinity({2}, first);
  EXPECT_FALSE(bad);
  if (!bad) {
    EXPECT_EQ(bad.error().message, "there is no vCPU 2 (the VM has 2)");
  }
  g.vm.request_stop(StopReason::poweroff, "done");
  runner.join();
  EXPECT_EQ(stopped, StopReason::poweroff) << g.vm.stop_message();
  EXPECT_EQ(g.vm.vcpu_threads(), (std::vector<pid_t>{0, 0})) << "ended threads have no id";
}

// A placement asked for before the vCPU's thread begins (a domain created paused, then `xpv
// vcpu-pin`, then unpaused) is the one it takes as it begins.
TEST(VmSmoke, APlacementAskedForBeforeTheVcpuStartsIsTakenAsItStarts) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  const auto allowed = cpus_of_thread(0);
  ASSERT_TRUE(allowed);
  if (allowed->cpus.count() < 2) GTEST_SKIP() << "one CPU allowed here: a placement could not be told from none";
  std::size_t last = 0;
  for (std::size_t c = 0; c < kMaxCpus; ++c) {
    if (allowed->cpus.test(c)) last = c;
  }
  Guest g(small(1));
  CpuList one;
  one.cpus.set(last);
  auto r = g.vm.set_vcpu_affinity({0}, one);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_NE(load_counting_guest(g), nullptr);
  g.vm.boot_cpu_protected_mode(0x100000);
  StopReason stopped = StopReason::none;
  std::thread runner([&] { stopped = g.run(); });
  pid_t tid = 0;
  for (int i = 0; i < 500 && tid == 0; ++i) {  // bounded: 5 s
    tid = g.vm.vcpu_threads().at(0);
    if (tid == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(tid, 0);
  if (tid != 0) {
    const auto placed = cpus_of_thread(tid);
    EXPECT_TRUE(placed);
    if (placed) {
      EXPECT_EQ(format_cpu_list(*placed), format_cpu_list(one));
    }
  }
  g.vm.request_stop(StopReason::poweroff, "done");
  runner.join();
  EXPECT_EQ(stopped, StopReason::poweroff) << g.vm.stop_message();
}

// A set the kernel refuses stops the VM with the vCPU named, before the guest runs.
TEST(VmSmoke, AVcpuThatCannotBePlacedStopsTheVmWithItsName) {
  std::string why;
  if (!kvm_usable(why)) GTEST_SKIP() << why;
  const auto allowed = cpus_of_thread(0);
  ASSERT_TRUE(allowed);
  if (allowed->cpus.test(kMaxCpus - 1)) GTEST_SKIP() << "CPU 1023 exists here";
  VmConfig cfg = small(1);
  cfg.affinity.resize(1);
  cfg.affinity[0].cpus.set(kMaxCpus - 1);
  Guest g(cfg);
  // hlt with interrupts off would be a poweroff: the error must come first.
  const std::uint8_t code[] = {0xfa, 0xf4};
  auto m = g.vm.memory().translate(0x1000, sizeof code);
  ASSERT_TRUE(m);
  std::memcpy(m->data(), code, sizeof code);
  g.vm.boot_cpu_real_mode(0x100, 0);
  EXPECT_EQ(g.run(), StopReason::error);
  EXPECT_EQ(g.vm.stop_message(), std::string("vCPU 0: cannot be placed on CPUs 1023: ") + std::strerror(EINVAL));
  EXPECT_EQ(g.vm.stats().by_reason[KVM_EXIT_HLT], 0u) << "the guest ran";
}

TEST(VmSmoke, BadConfigIsRefusedWithAClearError) {
  VmConfig c = small();
  c.vcpus = 0;
  try {
    Vm vm(c);
    FAIL() << "vcpus = 0 accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("vcpus"), std::string::npos);
  }
  c = small();
  c.memory_bytes = 1 << 20;
  EXPECT_THROW(Vm{c}, std::runtime_error);
}

}  // namespace
}  // namespace xpv::kvm
