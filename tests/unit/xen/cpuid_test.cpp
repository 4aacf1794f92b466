// Xen CPUID leaves: exact values per upcall mode, KVM's leaves removed, the hypervisor bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "fakes.h"
#include "xpv/xen/cpuid.h"

namespace xpv::xen::test {
namespace {

kvm_cpuid_entry2 entry(std::uint32_t fn, std::uint32_t eax = 0, std::uint32_t ecx = 0) {
  kvm_cpuid_entry2 e{};
  e.function = fn;
  e.eax = eax;
  e.ecx = ecx;
  return e;
}

// What Vm::setup_cpuid hands the hook: KVM's leaves moved to 0x40000100, plus ordinary leaves.
std::vector<kvm_cpuid_entry2> kvm_like() {
  return {entry(0, 0xd), entry(1, 0x806f8, 0x7ed8320b), entry(7), entry(0x4000'0100, 0x4000'0101),
          entry(0x4000'0101, 0x1234), entry(0x4000'0000, 0x4000'0001) /* a stale one */,
          entry(0x4000'ff00), entry(0x4001'0000, 7), entry(0x8000'0000, 0x8000'0008)};
}

const kvm_cpuid_entry2* find(const std::vector<kvm_cpuid_entry2>& es, std::uint32_t fn,
                             std::uint32_t index = 0) {
  auto it = std::find_if(es.begin(), es.end(), [&](const kvm_cpuid_entry2& e) {
    return e.function == fn && e.index == index;
  });
  return it == es.end() ? nullptr : &*it;
}

std::size_t count(const std::vector<kvm_cpuid_entry2>& es, std::uint32_t fn) {
  return static_cast<std::size_t>(std::count_if(
      es.begin(), es.end(), [&](const kvm_cpuid_entry2& e) { return e.function == fn; }));
}

TEST(XenCpuid, LeavesHaveXensValuesAndKvmsAreGone) {
  auto es = kvm_like();
  install_xen_cpuid(test_config(), 2, es);

  const auto* sig = find(es, 0x4000'0000);
  ASSERT_NE(sig, nullptr);
  EXPECT_EQ(count(es, 0x4000'0000), 1u);
  EXPECT_EQ(sig->eax, 0x4000'0005u);
  char s[13] = {};
  std::memcpy(s, &sig->ebx, 4);
  std::memcpy(s + 4, &sig->ecx, 4);
  std::memcpy(s + 8, &sig->edx, 4);
  EXPECT_STREQ(s, "XenVMMXenVMM");

  EXPECT_EQ(find(es, 0x4000'0001)->eax, (4u << 16) | 17u);
  EXPECT_EQ(count(es, 0x4000'0001), 1u);  // KVM's 0x40000101 is gone, not renamed
  const auto* hc = find(es, 0x4000'0002);
  EXPECT_EQ(hc->eax, 1u);
  EXPECT_EQ(hc->ebx, 0x4000'0000u);
  EXPECT_EQ(hc->ecx, 0u);
  EXPECT_EQ(hc->edx, 0u);
  for (std::uint32_t sub = 0; sub < 3; ++sub) {
    const auto* t = find(es, 0x4000'0003, sub);
    ASSERT_NE(t, nullptr) << sub;
    EXPECT_EQ(t->flags, std::uint32_t{KVM_CPUID_FLAG_SIGNIFCANT_INDEX});
    EXPECT_EQ(t->eax | t->ebx | t->ecx | t->edx, 0u);
  }
  const auto* hvm = find(es, 0x4000'0004);
  EXPECT_EQ(hvm->eax, (1u << 3) | (1u << 4) | (1u << 6));
  EXPECT_EQ(hvm->ebx, 2u);  // vCPU id
  EXPECT_EQ(hvm->ecx, 5u);  // domid
  EXPECT_EQ(hvm->edx, 0u);
  const auto* last = find(es, 0x4000'0005);
  EXPECT_EQ(last->eax | last->ebx | last->ecx | last->edx, 0u);

  // Nothing else in [0x40000000, 0x40010000); outside that range untouched.
  for (const auto& e : es) {
    if (e.function >= 0x4000'0000 && e.function < 0x4001'0000) {
      EXPECT_LE(e.function, 0x4000'0005u);
    }
  }
  EXPECT_EQ(count(es, 0x4001'0000), 1u);
  EXPECT_EQ(find(es, 0x8000'0000)->eax, 0x8000'0008u);
  EXPECT_EQ(find(es, 0)->eax, 0xdu);
  EXPECT_EQ(es.size(), 4u /*0,1,7,0x80000000*/ + 1u /*0x40010000*/ + 8u /*Xen leaves*/);
}

TEST(XenCpuid, HypervisorBitSetAndOtherCpuid1BitsKept) {
  auto es = kvm_like();
  install_xen_cpuid(test_config(), 0, es);
  EXPECT_EQ(find(es, 1)->ecx, 0x7ed8320bu | 0x8000'0000u);
  EXPECT_EQ(find(es, 1)->eax, 0x806f8u);
}

TEST(XenCpuid, UpcallVectorFlagOnlyInVcpuVectorMode) {
  for (auto mode : {UpcallMode::callback_vector, UpcallMode::intx}) {
    auto es = kvm_like();
    install_xen_cpuid(test_config(mode), 1, es);
    EXPECT_EQ(find(es, 0x4000'0004)->eax, (1u << 3) | (1u << 4)) << static_cast<int>(mode);
    EXPECT_EQ(find(es, 0x4000'0004)->ebx, 1u);
  }
}

TEST(XenCpuid, VersionAndDomidFromConfigAndPlatformCpuidIsTheSame) {
  PlatformConfig c = test_config();
  c.version_major = 4;
  c.version_minor = 13;
  c.domid = 300;
  std::vector<kvm_cpuid_entry2> a, b;
  install_xen_cpuid(c, 3, a);
  FakeHost host;
  Platform(c, host).cpuid(3, b);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof a[0]), 0);
  EXPECT_EQ(find(a, 0x4000'0001)->eax, 0x4000du);
  EXPECT_EQ(find(a, 0x4000'0004)->ecx, 300u);
  EXPECT_EQ(find(a, 0x4000'0004)->ebx, 3u);
}

TEST(XenCpuid, ReinstallingIsIdempotent) {
  auto es = kvm_like();
  install_xen_cpuid(test_config(), 0, es);
  auto again = es;
  install_xen_cpuid(test_config(), 0, again);
  ASSERT_EQ(again.size(), es.size());
  EXPECT_EQ(std::memcmp(again.data(), es.data(), es.size() * sizeof es[0]), 0);
}

}  // namespace
}  // namespace xpv::xen::test
