// PciHost — PCI configuration mechanism #1 (PCI Local Bus spec 3.0 §3.2.2.3.2): address register
// at port 0xcf8 (32-bit: enable bit 31, bus 23:16, device 15:11, function 10:8, register 7:2),
// data window at 0xcfc..0xcff. One bus (0); device 0 is the host bridge; other slots are empty
// (reads all-ones) until a device plugs in (platform-pci will: plug(slot, fn)).
//
// Thread-safety: one mutex around the address latch and the config access, since the latch is
// shared state between two port accesses (Linux serialises them with pci_config_lock anyway).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include "xpv/kvm/error.h"
#include "xpv/kvm/io_bus.h"

namespace xpv::kvm {

// A PCI function's configuration space (256 bytes, type 0 header).
class PciFunction {
 public:
  virtual ~PciFunction() = default;
  // offset is 0..255 and the access (1, 2 or 4 bytes) never crosses a dword.
  virtual std::uint32_t config_read(unsigned offset, unsigned size) noexcept = 0;
  virtual void config_write(unsigned offset, unsigned size, std::uint32_t value) noexcept = 0;
};

// The host bridge at 00:00.0: read-only IDs, class 06/00/00.
class PciHostBridge final : public PciFunction {
 public:
  std::uint32_t config_read(unsigned offset, unsigned size) noexcept override;
  void config_write(unsigned, unsigned, std::uint32_t) noexcept override {}
};

class PciHost final : public BusDevice {
 public:
  static constexpr std::uint16_t kAddressPort = 0xcf8;
  static constexpr std::uint16_t kDataPort = 0xcfc;
  static constexpr unsigned kSlots = 32;

  PciHost();
  // Plugs fn (not owned) at 00:slot.0. Slot 0 is the host bridge; a taken slot → error.
  Result<void> plug(unsigned slot, PciFunction* fn);

  void read(std::uint64_t base, std::uint64_t offset, std::span<std::uint8_t> data) noexcept override;
  void write(std::uint64_t base, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept override;

 private:
  PciFunction* target(unsigned& reg) noexcept;

  std::mutex mu_;
  std::uint32_t address_ = 0;
  PciHostBridge bridge_;
  std::array<PciFunction*, kSlots> slots_{};
};

}  // namespace xpv::kvm
