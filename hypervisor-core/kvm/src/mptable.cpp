#include "xpv/kvm/mptable.h"

#include <fmt/core.h>

#include <cstring>

#include "xpv/kvm/le.h"

namespace xpv::kvm {
namespace {
constexpr std::size_t kFloatSize = 16, kHeaderSize = 44, kCpuSize = 20, kEntrySize = 8;
constexpr unsigned kIsaIrqs = 16;
// Buses (2) + IOAPIC (1) + ISA interrupts (16) + local interrupts (2).
constexpr std::size_t kFixedEntries = 2 + 1 + kIsaIrqs + 2;
}  // namespace

std::size_t mptable_size(unsigned vcpus) noexcept {
  return kFloatSize + kHeaderSize + vcpus * kCpuSize + kFixedEntries * kEntrySize;
}

std::uint8_t mp_checksum(std::span<const std::uint8_t> s) noexcept {
  std::uint8_t sum = 0;
  for (auto b : s) sum = static_cast<std::uint8_t>(sum + b);
  return sum;
}

Result<std::size_t> build_mptable(std::span<std::uint8_t> area, std::uint64_t area_gpa,
                                  const MpTableInput& in) noexcept {
  if (in.vcpus == 0 || in.vcpus > kMaxVcpus) return err(fmt::format("MP table: {} vCPUs (1..{})", in.vcpus, kMaxVcpus));
  const std::size_t total = mptable_size(in.vcpus);
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
  le::store<std::uint16_t>(tbl, 34, static_cast<std::uint16_t>(in.vcpus + kFixedEntries));
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
