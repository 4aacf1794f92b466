// cpu_list.h: xl's CPU-LIST syntax, its shortest form, xpv-vmm's --vcpu-affinity values, and
// placing a real thread (sched_setaffinity on this host).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "xpv/kvm/cpu_list.h"

namespace xpv::kvm {
namespace {

std::string canon(std::string_view text) {
  auto l = parse_cpu_list(text);
  return l ? format_cpu_list(*l) : "error: " + l.error().message;
}

CpuList cpus(std::initializer_list<unsigned> l) {
  CpuList r;
  for (unsigned c : l) r.cpus.set(c);
  return r;
}

TEST(CpuList, ParsesXlsForms) {
  EXPECT_EQ(canon("3"), "3");
  EXPECT_EQ(canon("2-5"), "2-5");
  EXPECT_EQ(canon("0-3,5,^1"), "0,2,3,5");      // xl.cfg's example
  // Left to right, as xl reads it: an exclusion takes away what is there when it comes.
  EXPECT_EQ(canon("^1,0-3,5"), "0-3,5");
  EXPECT_EQ(canon("0-3,^1,1"), "0-3");
  EXPECT_EQ(canon("2-6,^4"), "2,3,5,6");
  EXPECT_EQ(canon("0-7\n"), "0-7") << "as /sys/devices/system/cpu/online has it";
  EXPECT_EQ(canon(" 1 , 7 "), "1,7");
  EXPECT_EQ(canon("4,4,3"), "3,4");
  EXPECT_EQ(canon("all,^0-1022"), "1023");
  auto all = parse_cpu_list("all");
  ASSERT_TRUE(all);
  EXPECT_EQ(all->cpus.count(), kMaxCpus);
  EXPECT_EQ(format_cpu_list(*all), "0-1023");
  EXPECT_EQ(format_cpu_list(CpuList{}), "none");
}

TEST(CpuList, RefusesWithTheItem) {
  EXPECT_EQ(canon(""), "error: an empty CPU list");
  EXPECT_EQ(canon("  "), "error: an empty CPU list");
  EXPECT_EQ(canon("1,,2"), "error: '1,,2': an empty item (two commas in a row, or one at an end)");
  EXPECT_EQ(canon("1,"), "error: '1,': an empty item (two commas in a row, or one at an end)");
  EXPECT_EQ(canon("3-1"), "error: '3-1': a range must not run downward");
  EXPECT_EQ(canon("1,x"), "error: 'x': expected a CPU number, a range N-M, ^ to leave CPUs out, or all");
  EXPECT_EQ(canon("-1"), "error: '-1': expected a CPU number, a range N-M, ^ to leave CPUs out, or all");
  EXPECT_EQ(canon("1-"), "error: '1-': expected a CPU number, a range N-M, ^ to leave CPUs out, or all");
  EXPECT_EQ(canon("+2"), "error: '+2': expected a CPU number, a range N-M, ^ to leave CPUs out, or all");
  EXPECT_EQ(canon("1024"), "error: '1024': CPU numbers go up to 1023");
  EXPECT_EQ(canon("0-99999999999999999999"), "error: '0-99999999999999999999': expected a CPU number, a range N-M, ^ to leave CPUs out, or all");
  EXPECT_EQ(canon("nodes:0-1"), "error: 'nodes:0-1': NUMA node lists are not supported by xpv; name the CPUs");
  EXPECT_EQ(canon("0,node:1"), "error: 'node:1': NUMA node lists are not supported by xpv; name the CPUs");
  EXPECT_EQ(canon("^node:1"), "error: '^node:1': NUMA node lists are not supported by xpv; name the CPUs");
  EXPECT_EQ(canon("0-3,^all"), "error: '^all': ^ and all do not combine (as in xl)");
  EXPECT_EQ(canon("2,^2"), "error: '2,^2' leaves no CPU");
  EXPECT_EQ(canon("^3"), "error: '^3' leaves no CPU");
}

TEST(CpuList, FormatsRangesShortest) {
  EXPECT_EQ(format_cpu_list(cpus({0, 1})), "0,1");
  EXPECT_EQ(format_cpu_list(cpus({0, 1, 2})), "0-2");
  EXPECT_EQ(format_cpu_list(cpus({5, 7, 8, 9, 11, 12})), "5,7-9,11,12");
  EXPECT_EQ(format_cpu_list(cpus({1023})), "1023");
  for (const char* s : {"5,7-9,11,12", "0", "0-1023", "1,3,5"}) EXPECT_EQ(canon(canon(s)), canon(s)) << s;
}

TEST(CpuList, VcpuAffinityValues) {
  const CpuList allowed = cpus({0, 1, 2, 3});
  auto r = parse_vcpu_affinity({"1:2-3", "0:0"}, 3, allowed);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0], cpus({0}));
  EXPECT_EQ((*r)[1], cpus({2, 3}));
  EXPECT_TRUE((*r)[2].empty()) << "a vCPU not named is not placed";
  auto error = [&](std::vector<std::string> specs) {
    auto e = parse_vcpu_affinity(specs, 2, allowed);
    return e ? std::string("accepted") : e.error().message;
  };
  EXPECT_EQ(error({"2:0"}), "'2:0': vCPU 2 is not one of the 2 vCPUs");
  EXPECT_EQ(error({"0:0", "0:1"}), "'0:1': vCPU 0 is placed twice");
  EXPECT_EQ(error({"0"}), "'0': expected VCPU:CPU-LIST");
  EXPECT_EQ(error({"a:0"}), "'a:0': expected VCPU:CPU-LIST");
  EXPECT_EQ(error({"0:5-3"}), "'0:5-3': '5-3': a range must not run downward");
  EXPECT_EQ(error({"1:4-7"}), "'1:4-7': none of CPUs 4-7 may be used by this process (it may use 0-3)");
  EXPECT_EQ(error({"1:3-7"}), "accepted") << "a set sharing one CPU with the allowed ones is placed";
  const auto none = parse_vcpu_affinity({}, 0, allowed);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().message, "0 vCPUs: expected 1..4096");
  EXPECT_FALSE(parse_vcpu_affinity({}, kMaxPlacedVcpus + 1, allowed)) << "refused before anything is allocated";
}

// A real thread, placed and read back through the kernel.
TEST(CpuList, PlacesAThreadAndReadsItBack) {
  const auto allowed = cpus_of_thread(0);
  ASSERT_TRUE(allowed) << allowed.error().message;
  if (allowed->cpus.count() < 2) GTEST_SKIP() << "one CPU allowed here: a placement could not be told from none";
  std::size_t last = 0;
  for (std::size_t c = 0; c < kMaxCpus; ++c) {
    if (allowed->cpus.test(c)) last = c;
  }
  std::atomic<pid_t> tid{0};
  std::atomic<bool> stop{false};
  std::thread t([&] {
    tid.store(::gettid());
    for (int i = 0; i < 60000 && !stop.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  // Joined whatever the checks below find (an ASSERT's return would leave it joinable).
  struct Join {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Join() {
      stop.store(true);
      t.join();
    }
  } join{stop, t};
  for (int i = 0; i < 5000 && tid.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_NE(tid.load(), 0);
  CpuList one;
  one.cpus.set(last);
  const auto r = place_thread(tid.load(), one);
  EXPECT_TRUE(r) << r.error().message;
  const auto back = cpus_of_thread(tid.load());
  ASSERT_TRUE(back);
  EXPECT_EQ(format_cpu_list(*back), format_cpu_list(one));
  // The calling thread is left as it was.
  EXPECT_EQ(format_cpu_list(*cpus_of_thread(0)), format_cpu_list(*allowed));
  // A set the kernel cannot honour (CPU 1023: not on this host) is refused with errno's words.
  CpuList absent;
  absent.cpus.set(kMaxCpus - 1);
  if (!allowed->cpus.test(kMaxCpus - 1)) {
    const auto e = place_thread(tid.load(), absent);
    ASSERT_FALSE(e);
    EXPECT_EQ(e.error().message, std::strerror(EINVAL));
    EXPECT_EQ(format_cpu_list(*cpus_of_thread(tid.load())), format_cpu_list(one)) << "a refused placement changes nothing";
  }
}

}  // namespace
}  // namespace xpv::kvm
