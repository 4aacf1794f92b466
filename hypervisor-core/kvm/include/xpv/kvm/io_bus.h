// IoBus — the exit dispatch table for port I/O and MMIO: devices register address ranges; a
// vCPU thread that takes a KVM_EXIT_IO / KVM_EXIT_MMIO looks the address up and calls the device.
//
// Registration happens at setup, before any vCPU runs (add() is not thread-safe); dispatch is
// const and lock-free, so any vCPU thread may dispatch concurrently. Devices do their own locking.
// An access nobody claims reads as all-ones and is dropped on write (what an empty ISA/PCI bus
// does); it is counted (unclaimed()).
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "xpv/kvm/error.h"

namespace xpv::kvm {

// A device on a bus. `offset` is relative to the base of the range it was registered at, `data`
// is 1, 2, 4 or 8 bytes, little-endian. Called on vCPU threads: must not block for long and
// must be noexcept (a guest access is never allowed to unwind through the vCPU loop).
class BusDevice {
 public:
  virtual ~BusDevice() = default;
  virtual void read(std::uint64_t base, std::uint64_t offset, std::span<std::uint8_t> data) noexcept = 0;
  virtual void write(std::uint64_t base, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept = 0;
};

class IoBus {
 public:
  explicit IoBus(std::string name) : name_(std::move(name)) {}

  // Claims [base, base+len) for dev (not owned). Overlap with an existing range or len 0 →
  // error naming both.
  Result<void> add(std::uint64_t base, std::uint64_t len, BusDevice* dev, std::string what);

  // true when a device handled it; false → unclaimed (read data was filled with 0xff).
  bool read(std::uint64_t addr, std::span<std::uint8_t> data) const noexcept;
  bool write(std::uint64_t addr, std::span<const std::uint8_t> data) const noexcept;

  std::uint64_t unclaimed() const noexcept { return unclaimed_.load(std::memory_order_relaxed); }
  const std::string& name() const noexcept { return name_; }

 private:
  struct Range {
    std::uint64_t base;
    std::uint64_t len;
    BusDevice* dev;
    std::string what;
  };
  const Range* find(std::uint64_t addr, std::uint64_t len) const noexcept;

  std::string name_;
  std::vector<Range> ranges_;  // sorted by base, disjoint
  mutable std::atomic<std::uint64_t> unclaimed_{0};
};

}  // namespace xpv::kvm
