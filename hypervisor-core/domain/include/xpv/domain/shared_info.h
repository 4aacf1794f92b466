// shared_info and vcpu_info — the x86_64 layout of Xen's shared info page (public/xen.h,
// public/arch-x86/xen.h, public/arch-x86/xen-x86_64.h), as a 64-bit guest sees it.
//
// The page lives in guest memory and the guest changes it concurrently (it clears pending bits,
// sets mask bits, clears evtchn_upcall_pending): xpv never reads or writes these structs by value.
// EventChannels addresses the fields by offset and operates on them with std::atomic_ref. The
// structs are here for the offsets and for the ABI test (tests/unit/evtchn/abi_test.cpp compares
// every offset and size with the official header).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace xpv::domain {

// XEN_LEGACY_MAX_VCPUS (x86): vCPUs whose vcpu_info has a slot in shared_info. Others have none
// until the guest registers one (VCPUOP_register_vcpu_info).
inline constexpr unsigned kLegacyMaxVcpus = 32;
// Bits per evtchn_pending / evtchn_mask word: xen_ulong_t is 64 bits on x86_64.
inline constexpr unsigned kEvtchnWordBits = 64;
// EVTCHN_2L_NR_CHANNELS on a 64-bit guest: 64 words of 64 bits; one pending_sel bit per word.
inline constexpr unsigned kEvtchn2lNrChannels = kEvtchnWordBits * kEvtchnWordBits;  // 4096
inline constexpr std::size_t kSharedInfoPageBytes = 4096;

// struct vcpu_time_info (32 bytes). Interface version > 0x040600: flags + pad1[2].
struct VcpuTimeInfo {
  std::uint32_t version;            // 0x00
  std::uint32_t pad0;               // 0x04
  std::uint64_t tsc_timestamp;      // 0x08
  std::uint64_t system_time;        // 0x10
  std::uint32_t tsc_to_system_mul;  // 0x18
  std::int8_t tsc_shift;            // 0x1c
  std::uint8_t flags;               // 0x1d  XEN_PVCLOCK_*
  std::uint8_t pad1[2];             // 0x1e
};
static_assert(std::is_standard_layout_v<VcpuTimeInfo> && sizeof(VcpuTimeInfo) == 32);
static_assert(offsetof(VcpuTimeInfo, tsc_timestamp) == 0x08);
static_assert(offsetof(VcpuTimeInfo, system_time) == 0x10);
static_assert(offsetof(VcpuTimeInfo, tsc_to_system_mul) == 0x18);
static_assert(offsetof(VcpuTimeInfo, tsc_shift) == 0x1c);
static_assert(offsetof(VcpuTimeInfo, flags) == 0x1d);

// struct arch_vcpu_info (x86_64, 16 bytes).
struct ArchVcpuInfo {
  std::uint64_t cr2;  // 0x00
  std::uint64_t pad;  // 0x08
};
static_assert(std::is_standard_layout_v<ArchVcpuInfo> && sizeof(ArchVcpuInfo) == 16);

// struct vcpu_info (64 bytes on x86). XEN_HAVE_PV_UPCALL_MASK is defined on x86, so byte 1 is
// evtchn_upcall_mask.
struct VcpuInfo {
  std::uint8_t evtchn_upcall_pending;  // 0x00  set by the hypervisor, cleared by the guest
  std::uint8_t evtchn_upcall_mask;     // 0x01  guest-owned; see EventChannels on how it is used
  std::uint8_t pad0[6];                // 0x02  implicit padding in the C struct
  std::uint64_t evtchn_pending_sel;    // 0x08  one bit per evtchn_pending word
  ArchVcpuInfo arch;                   // 0x10
  VcpuTimeInfo time;                   // 0x20
};
static_assert(std::is_standard_layout_v<VcpuInfo> && sizeof(VcpuInfo) == 64);
static_assert(offsetof(VcpuInfo, evtchn_upcall_pending) == 0x00);
static_assert(offsetof(VcpuInfo, evtchn_upcall_mask) == 0x01);
static_assert(offsetof(VcpuInfo, evtchn_pending_sel) == 0x08);
static_assert(offsetof(VcpuInfo, arch) == 0x10);
static_assert(offsetof(VcpuInfo, time) == 0x20);

// struct arch_shared_info (x86_64, 48 bytes).
struct ArchSharedInfo {
  std::uint64_t max_pfn;                     // 0x00
  std::uint64_t pfn_to_mfn_frame_list_list;  // 0x08
  std::uint64_t nmi_reason;                  // 0x10
  std::uint64_t p2m_cr3;                     // 0x18
  std::uint64_t p2m_vaddr;                   // 0x20
  std::uint64_t p2m_generation;              // 0x28
};
static_assert(std::is_standard_layout_v<ArchSharedInfo> && sizeof(ArchSharedInfo) == 48);

// struct shared_info (x86_64, 3136 bytes; the rest of the 4 KiB page is unused).
struct SharedInfo {
  VcpuInfo vcpu_info[kLegacyMaxVcpus];              // 0x000
  std::uint64_t evtchn_pending[kEvtchnWordBits];    // 0x800  bit per port, hypervisor sets
  std::uint64_t evtchn_mask[kEvtchnWordBits];       // 0xa00  bit per port, guest-owned
  std::uint32_t wc_version;                         // 0xc00
  std::uint32_t wc_sec;                             // 0xc04
  std::uint32_t wc_nsec;                            // 0xc08
  std::uint32_t wc_sec_hi;                          // 0xc0c  (not i386)
  ArchSharedInfo arch;                              // 0xc10
};
static_assert(std::is_standard_layout_v<SharedInfo> && sizeof(SharedInfo) == 3136);
static_assert(offsetof(SharedInfo, evtchn_pending) == 0x800);
static_assert(offsetof(SharedInfo, evtchn_mask) == 0xa00);
static_assert(offsetof(SharedInfo, wc_version) == 0xc00);
static_assert(offsetof(SharedInfo, wc_sec) == 0xc04);
static_assert(offsetof(SharedInfo, wc_nsec) == 0xc08);
static_assert(offsetof(SharedInfo, wc_sec_hi) == 0xc0c);
static_assert(offsetof(SharedInfo, arch) == 0xc10);
static_assert(sizeof(SharedInfo) <= kSharedInfoPageBytes);

}  // namespace xpv::domain
