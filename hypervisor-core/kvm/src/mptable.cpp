#include "xpv/kvm/mptable.h"

#include <fmt/core.h>

#include <cstring>

#include "xpv/kvm/le.h"

namespace xpv::kvm {
namespace {
constexpr std::size_t kFloatSize = 16, kHeaderSize = 44, kCpuSize = 20, kEntrySize = 8;
constexpr unsigned kIsaIrqs = 16;
// I/O interrupt entry flags (MP spec 1.4 table 4-17): bits 1:0 polarity (3 = active low),
// bits 3:2 trigger mode (3 = level).
constexpr std::uint16_t kPciIntxFlags = 0x3 | (0x3 << 2);
// Buses (2) + IOAPIC (1) + ISA interrupts (16) + local interrupts (2).
constexpr std::size_t kFixedEntries = 2 + 1 + kIsaIrqs + 2;
}  // namespace

std::size_t mptable_size(unsigned vcpus, std::size_t pci_irqs) noexcept {
  return kFloatSize + kHeaderSize + vcpus * kCpuSize + (kFixedEntries + pci_irqs) * kEntrySize;
}

std::uint8_t mp_checksum(std::span<const std::uint8_t> s) noexcept {
  std::uint8_t sum = 0;
  for (auto b : s) sum = static_cast<std::uint8_t>(sum + b);
  return sum;
}

Result<std::size_t> build_mptable(std::span<std::uint8_t> area, std::uint64_t area_gpa,
                                  const MpTableInput& in) noexcept {
  if (in.vcpus == 0 || in.vcpus > kMaxVcpus) return err(fmt::format("MP table: {} vCPUs (1..{})", in.vcpus, kMaxVcpus));
  if (in.pci_irqs.size() > kMaxPciIrqs) {
    return err(fmt::format("MP table: {} PCI interrupt entries (at most {})", in.pci_irqs.size(), kMaxPciIrqs));
  }
  for (std::size_t i = 0; i < in.pci_irqs.size(); ++i) {
    const MpPciIrq& p = in.pci_irqs[i];
    if (p.slot >= 32 || p.pin < 1 || p.pin > 4 || p.ioapic_pin < kFirstPciIoapicPin || p.ioapic_pin >= kIoapicPins) {
      return err(fmt::format("MP table: PCI interrupt 00:{:02x} pin {} → IOAPIC pin {}: slot 0..31, pin 1..4 "
                             "(INTA..INTD), IOAPIC pin {}..{}",
                             p.slot, p.pin, p.ioapic_pin, kFirstPciIoapicPin, kIoapicPins - 1));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (in.pci_irqs[j].slot == p.slot && in.pci_irqs[j].pin == p.pin) {
        return err(fmt::format("MP table: PCI interrupt 00:{:02x} pin {} is routed twice", p.slot, p.pin));
      }
    }
  }
  const std::size_t total = mptable_size(in);
  if (area.size() < total) return err(fmt::format("MP table: needs {} bytes, area has {}", total, area.size()));
  if (area_gpa + total > 0x1'0000'0000) return err("MP table: must lie below 4 GiB");
  const std::uint8_t ioapic_id = in.ioapic_id != 0 ? in.ioapic_id : static_cast<std::uint8_t>(in.vcpus);
  std::memset(area.data(), 0, total);

  auto fp = area.subspan(0, kFloatSize);
  std::memcpy(fp.data(), "_MP_", 4);
  le::store<std::uint32_t>(fp, 4, static_cast<std::uint32_t>(area_gpa + kFloatSize));
  fp[8] = 1;  // length in 16-byte units
  fp[9] = 4;  // spec 1.4

  auto tbl = area.subspan(kFloatSize, total - kFloatSize);
  std::memcpy(tbl.data(), "PCMP", 4);
  le::store<std::uint16_t>(tbl, 4, static_cast<std::uint16_t>(tbl.size()));
  tbl[6] = 4;
  std::memcpy(tbl.data() + 8, "XPV     ", 8);
  std::memcpy(tbl.data() + 16, "XPV-VMM     ", 12);
  le::store<std::uint16_t>(tbl, 34, static_cast<std::uint16_t>(in.vcpus + kFixedEntries + in.pci_irqs.size()));
  le::store<std::uint32_t>(tbl, 36, kLapicAddress);

  std::size_t off = kHeaderSize;
  for (unsigned cpu = 0; cpu < in.vcpus; ++cpu) {
    tbl[off + 0] = 0;                          // processor
    tbl[off + 1] = static_cast<std::uint8_t>(cpu);  // LAPIC id
    tbl[off + 2] = 0x14;                       // LAPIC version (integrated)
    tbl[off + 3] = static_cast<std::uint8_t>(0x01 | (cpu == 0 ? 0x02 : 0));  // enabled | BSP
    le::store<std::uint32_t>(tbl, off + 4, in.cpu_signature);
    le::store<std::uint32_t>(tbl, off + 8, in.cpu_features);
    off += kCpuSize;
  }
  auto bus = [&](std::uint8_t id, const char* type6) {
    tbl[off] = 1;
    tbl[off + 1] = id;
    std::memcpy(tbl.data() + off + 2, type6, 6);
    off += kEntrySize;
  };
  bus(kMpBusPci, "PCI   ");
  bus(kMpBusIsa, "ISA   ");
  tbl[off] = 2;  // IOAPIC
  tbl[off + 1] = ioapic_id;
  tbl[off + 2] = 0x11;  // version
  tbl[off + 3] = 0x01;  // enabled
  le::store<std::uint32_t>(tbl, off + 4, kIoapicAddress);
  off += kEntrySize;
  for (unsigned irq = 0; irq < kIsaIrqs; ++irq) {
    tbl[off] = 3;      // I/O interrupt assignment
    tbl[off + 1] = 0;  // INT (vectored)
    le::store<std::uint16_t>(tbl, off + 2, 0);  // conforms to the bus: ISA = edge, active high
    tbl[off + 4] = kMpBusIsa;
    tbl[off + 5] = static_cast<std::uint8_t>(irq);
    tbl[off + 6] = ioapic_id;
    tbl[off + 7] = static_cast<std::uint8_t>(irq);
    off += kEntrySize;
  }
  for (const MpPciIrq& p : in.pci_irqs) {
    tbl[off] = 3;      // I/O interrupt assignment
    tbl[off + 1] = 0;  // INT (vectored)
    le::store<std::uint16_t>(tbl, off + 2, kPciIntxFlags);
    tbl[off + 4] = kMpBusPci;
    tbl[off + 5] = static_cast<std::uint8_t>((p.slot << 2) | (p.pin - 1));
    tbl[off + 6] = ioapic_id;
    tbl[off + 7] = p.ioapic_pin;
    off += kEntrySize;
  }
  auto local = [&](std::uint8_t type, std::uint8_t dst_apic, std::uint8_t lint) {
    tbl[off] = 4;
    tbl[off + 1] = type;
    tbl[off + 4] = kMpBusIsa;
    tbl[off + 6] = dst_apic;
    tbl[off + 7] = lint;
    off += kEntrySize;
  };
  local(3, 0, 0);     // ExtINT → BSP LINT0 (the 8259 behind it)
  local(1, 0xff, 1);  // NMI → every LAPIC's LINT1
  tbl[7] = static_cast<std::uint8_t>(0 - mp_checksum(tbl));
  fp[10] = static_cast<std::uint8_t>(0 - mp_checksum(fp));
  return total;
}

}  // namespace xpv::kvm
