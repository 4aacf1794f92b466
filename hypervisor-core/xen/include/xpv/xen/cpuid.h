// Xen's CPUID leaves (public/arch-x86/cpuid.h) for an HVM guest, installed into the entries the
// VMM hands to KVM_SET_CPUID2 (called from the Vm's CPUID hook on the main thread, per vCPU).
//
//   leaf          eax                         ebx              ecx          edx
//   0x40000000    0x40000005 (last leaf)      "XenV"           "MMXe"       "nVMM"
//   0x40000001    major << 16 | minor         0                0            0
//   0x40000002    1 (hypercall pages)         0x40000000 (MSR) 0            0
//   0x40000003    0 (TSC leaf; subleaves 0..2, all zero: no TSC/pvclock information offered)
//   0x40000004    VCPU_ID_PRESENT | DOMID_PRESENT [| UPCALL_VECTOR]   ebx = vCPU  ecx = domid
//   0x40000005    0 (all registers)
//
// Every other entry in [0x40000000, 0x40010000) is removed first: Linux walks that range in
// 0x100 steps and takes the hypervisor whose detect() reports the highest priority/base, so
// KVM's leaves (which the VMM moved to 0x40000100) would win over Xen's. CPUID.1 ecx bit 31
// (hypervisor present) is set. UPCALL_VECTOR is set only when the platform offers per-vCPU
// upcall vectors (UpcallMode::vcpu_vector).
#pragma once

#include <linux/kvm.h>

#include <vector>

#include "xpv/xen/config.h"

namespace xpv::xen {

inline constexpr std::uint32_t kCpuidBase = 0x4000'0000;
inline constexpr std::uint32_t kHypercallPageMsr = 0x4000'0000;  // reported in leaf base+2 ebx

// XEN_HVM_CPUID_* bits of leaf base+4 eax.
inline constexpr std::uint32_t kHvmCpuidVcpuIdPresent = 1u << 3;
inline constexpr std::uint32_t kHvmCpuidDomidPresent = 1u << 4;
inline constexpr std::uint32_t kHvmCpuidUpcallVector = 1u << 6;

void install_xen_cpuid(const PlatformConfig& cfg, unsigned vcpu,
                       std::vector<kvm_cpuid_entry2>& entries);

}  // namespace xpv::xen
