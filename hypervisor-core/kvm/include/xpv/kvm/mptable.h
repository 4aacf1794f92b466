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
//     (KVM's default GSI routing is the identity), then one per routed PCI INTx (below);
//     local interrupt (type 4, 8 B): ExtINT → LINT0 of the BSP, NMI → LINT1 of every LAPIC.
//
// PCI INTx routing (MP spec 1.4 §4.3.4 and appendix D.3): an I/O interrupt entry with source bus
// = the PCI bus id (0), source bus IRQ = (device << 2) | (pin - 1) (INTA = 0 .. INTD = 3), flags
// po = 3 (active low), el = 3 (level) as PCI INTx is, destination = the IOAPIC pin. With acpi=off
// Linux routes a PCI device's interrupt from these entries (IO_APIC_get_PCI_irq_vector); the
// Linux IRQ number is then the IOAPIC pin (GSI). Pins 16..23 only: pins 0..15 carry the ISA IRQs
// (edge, active high) and sharing one with a level/low PCI line would program it wrongly. KVM's
// in-kernel IOAPIC has 24 pins; the VMM raises the line with set_irq(gsi, true) and lowers it
// with set_irq(gsi, false) (KVM models the polarity, the VMM always passes "asserted").
// Both checksums make their structure's bytes sum to 0 (mod 256).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "xpv/kvm/error.h"

namespace xpv::kvm {

inline constexpr std::uint32_t kIoapicAddress = 0xfec0'0000;
inline constexpr std::uint32_t kLapicAddress = 0xfee0'0000;
inline constexpr std::uint8_t kMpBusPci = 0, kMpBusIsa = 1;
inline constexpr unsigned kMaxVcpus = 64;
inline constexpr unsigned kIoapicPins = 24;       // KVM's in-kernel IOAPIC
inline constexpr unsigned kFirstPciIoapicPin = 16;  // pins 0..15 are the ISA IRQs
inline constexpr std::size_t kMaxPciIrqs = 32 * 4;  // every slot, every pin of bus 0

// One PCI interrupt line on bus 0: device `slot` (0..31), `pin` 1..4 (INTA..INTD, the value of
// the function's interrupt-pin register), wired to IOAPIC pin `ioapic_pin` (16..23).
struct MpPciIrq {
  std::uint8_t slot = 0;
  std::uint8_t pin = 1;
  std::uint8_t ioapic_pin = kFirstPciIoapicPin;
};

struct MpTableInput {
  unsigned vcpus = 1;
  std::uint8_t ioapic_id = 0;  // after the LAPIC ids 0..vcpus-1 unless given
  std::uint32_t cpu_signature = 0x600;  // family/model/stepping from CPUID.1 eax
  std::uint32_t cpu_features = 0x201;   // CPUID.1 edx (FPU, APIC)
  std::vector<MpPciIrq> pci_irqs;       // in this order after the ISA entries
};

// Size in bytes of the table for n vCPUs and pci_irqs PCI interrupt entries.
std::size_t mptable_size(unsigned vcpus, std::size_t pci_irqs = 0) noexcept;
// The same for a whole input.
inline std::size_t mptable_size(const MpTableInput& in) noexcept { return mptable_size(in.vcpus, in.pci_irqs.size()); }

// Writes the floating pointer and the config table at area (whose guest-physical address is
// area_gpa). Errors: 0 or too many vCPUs, area too small, table beyond 4 GiB, a PCI entry with a
// slot > 31, a pin outside 1..4, an IOAPIC pin outside 16..23, the same (slot, pin) twice, or
// more than kMaxPciIrqs entries.
Result<std::size_t> build_mptable(std::span<std::uint8_t> area, std::uint64_t area_gpa,
                                  const MpTableInput& in) noexcept;

// The byte sum (mod 256) of s: 0 for a valid structure.
std::uint8_t mp_checksum(std::span<const std::uint8_t> s) noexcept;

}  // namespace xpv::kvm
