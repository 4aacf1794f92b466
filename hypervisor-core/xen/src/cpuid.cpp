// Xen CPUID leaves: see cpuid.h for the table.
#include "xpv/xen/cpuid.h"

#include <algorithm>
#include <cstring>

namespace xpv::xen {

namespace {

constexpr std::uint32_t kRangeEnd = 0x4001'0000;  // Linux scans 0x40000000..0x4000ff00
constexpr std::uint32_t kLastLeaf = kCpuidBase + 5;

std::uint32_t sig(const char* four) noexcept {
  std::uint32_t v = 0;
  std::memcpy(&v, four, 4);
  return v;
}

kvm_cpuid_entry2 leaf(std::uint32_t function, std::uint32_t eax = 0, std::uint32_t ebx = 0,
                      std::uint32_t ecx = 0, std::uint32_t edx = 0) noexcept {
  kvm_cpuid_entry2 e{};
  e.function = function;
  e.eax = eax;
  e.ebx = ebx;
  e.ecx = ecx;
  e.edx = edx;
  return e;
}

}  // namespace

void install_xen_cpuid(const PlatformConfig& cfg, unsigned vcpu,
                       std::vector<kvm_cpuid_entry2>& entries) {
  std::erase_if(entries, [](const kvm_cpuid_entry2& e) {
    return e.function >= kCpuidBase && e.function < kRangeEnd;
  });
  for (auto& e : entries)
    if (e.function == 1) e.ecx |= 1u << 31;  // hypervisor present

  entries.push_back(leaf(kCpuidBase, kLastLeaf, sig("XenV"), sig("MMXe"), sig("nVMM")));
  entries.push_back(leaf(kCpuidBase + 1,
                         static_cast<std::uint32_t>(cfg.version_major) << 16 | cfg.version_minor));
  entries.push_back(leaf(kCpuidBase + 2, 1, kHypercallPageMsr));
  for (std::uint32_t sub = 0; sub < 3; ++sub) {  // TSC leaf: nothing offered
    kvm_cpuid_entry2 e = leaf(kCpuidBase + 3);
    e.index = sub;
    e.flags = KVM_CPUID_FLAG_SIGNIFCANT_INDEX;
    entries.push_back(e);
  }
  std::uint32_t flags = kHvmCpuidVcpuIdPresent | kHvmCpuidDomidPresent;
  if (cfg.upcall == UpcallMode::vcpu_vector) flags |= kHvmCpuidUpcallVector;
  entries.push_back(leaf(kCpuidBase + 4, flags, vcpu, cfg.domid));
  entries.push_back(leaf(kCpuidBase + 5));
}

}  // namespace xpv::xen
