// What sits behind the platform device's BARs, as bus devices the VMM registers at the bases it
// gave XenPlatformDevice:
//
//   BAR0 (I/O, 256 bytes) → PlatformIoBar on the PIO bus:
//     offset 0, 8 bits   read/write: the platform-flags byte (the same one as port 0x10)
//     offset 8, 8 bits   write: one byte of guest log text (the same stream as port 0x12)
//     anything else      reads 0, writes dropped
//   Linux's xen-platform-pci only reserves BAR0 (request_region) and never touches it; the two
//   bytes above are what QEMU's xen-platform implements there (QEMU reads all-ones elsewhere; we
//   read 0 — no guest depends on either).
//
//   BAR1 (memory, 16 MiB) → PlatformMmioBar on the MMIO bus (optional): reads 0, writes dropped,
//   counted. The guest uses BAR1 only as a hole in its physical address space where it asks Xen
//   to place pages (grant-table frames via XENMEM_add_to_physmap, shared info); those become KVM
//   memory slots, which take precedence over the MMIO bus, so this device only answers accesses
//   to the unmapped rest of the hole (QEMU's xen-platform does the same: reads 0).
//
// Threading: vCPU threads, concurrently; PlatformIoBar forwards to UnplugPorts (its lock);
// PlatformMmioBar only touches an atomic counter.
#pragma once

#include <atomic>
#include <cstdint>

#include "xpv/kvm/io_bus.h"
#include "xpv/platform_pci/ids.h"
#include "xpv/platform_pci/unplug_ports.h"

namespace xpv::platform_pci {

class PlatformIoBar final : public kvm::BusDevice {
 public:
  static constexpr std::uint32_t kLength = kIoBarSize;
  static constexpr std::uint64_t kFlagsOffset = 0, kLogOffset = 8;

  // ports is not owned and must outlive this object.
  explicit PlatformIoBar(UnplugPorts& ports) : ports_(ports) {}

  void read(std::uint64_t base, std::uint64_t offset, std::span<std::uint8_t> data) noexcept override;
  void write(std::uint64_t base, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept override;

 private:
  UnplugPorts& ports_;
};

class PlatformMmioBar final : public kvm::BusDevice {
 public:
  static constexpr std::uint32_t kLength = kMmioBarSize;

  void read(std::uint64_t base, std::uint64_t offset, std::span<std::uint8_t> data) noexcept override;
  void write(std::uint64_t base, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept override;
  std::uint64_t accesses() const noexcept { return accesses_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> accesses_{0};
};

}  // namespace xpv::platform_pci
