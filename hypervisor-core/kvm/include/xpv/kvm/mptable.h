// MP table (Intel MultiProcessor Specification 1.4, ch. 4) — how a firmware-less PC tells Linux
// about its CPUs and its IOAPIC without ACPI.
//
//   floating pointer (16 B, "_MP_"): u32 physptr @4, u8 length=1 @8, u8 spec_rev=4 @9,
//                                    u8 checksum @10, u8 features[5] @11 (0: a config table follows)
//   config table header (44 B, "PCMP"): u16 base length @4, u8 spec_rev @6, u8 checksum @7,
//     char oem[8] @8, char product[12] @16, u32 oem_ptr @28, u16 oem_size @32, u16 entry count @34,
//     u32 lapic address @36, u16 ext length @40, u8 ext checksum @42, u8 reserved @43
//   entries: processor (type 0, 20 B) per vCPU; bus (type 1, 8 B): 0 "PCI", 1 "ISA";
//     IOAPIC (type 2, 8 B); I/O interrupt (type 3, 8 B): ISA IRQ n → IOAPIC pin n for n < 16
//     (KVM's default GSI routing is the identity); local interrupt (type 4, 8 B): ExtINT → LINT0
//     of the BSP, NMI → LINT1 of every LAPIC.
// Both checksums make their structure's bytes sum to 0 (mod 256).
#pragma once

#include <cstdint>
#include <span>

#include "xpv/kvm/error.h"

namespace xpv::kvm {

inline constexpr std::uint32_t kIoapicAddress = 0xfec0'0000;
inline constexpr std::uint32_t kLapicAddress = 0xfee0'0000;
inline constexpr std::uint8_t kMpBusPci = 0, kMpBusIsa = 1;
inline constexpr unsigned kMaxVcpus = 64;

struct MpTableInput {
  unsigned vcpus = 1;
  std::uint8_t ioapic_id = 0;  // after the LAPIC ids 0..vcpus-1 unless given
  std::uint32_t cpu_signature = 0x600;  // family/model/stepping from CPUID.1 eax
  std::uint32_t cpu_features = 0x201;   // CPUID.1 edx (FPU, APIC)
};

// Size in bytes of the table for n vCPUs.
std::size_t mptable_size(unsigned vcpus) noexcept;

// Writes the floating pointer and the config table at area (whose guest-physical address is
// area_gpa). Errors: 0 or too many vCPUs, area too small, table beyond 4 GiB.
Result<std::size_t> build_mptable(std::span<std::uint8_t> area, std::uint64_t area_gpa,
                                  const MpTableInput& in) noexcept;

// The byte sum (mod 256) of s: 0 for a valid structure.
std::uint8_t mp_checksum(std::span<const std::uint8_t> s) noexcept;

}  // namespace xpv::kvm
