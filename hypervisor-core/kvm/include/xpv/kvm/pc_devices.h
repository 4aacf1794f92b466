// The small PC devices the VMM emulates in userspace (all on the PIO bus, vCPU threads):
//   ResetPorts  i8042 command port 0x64 (write 0xfe = pulse reset line) with data port 0x60, both
//               reading 0xff (no controller: Linux's probe gives up at once), and the "fast A20
//               / reset" port 0x92 (bit 0 = reset). Linux's reboot=k path uses 0x64.
//   PostPort    port 0x80 (POST / io_delay): writes dropped, reads 0xff — claimed so it costs no log.
//   CmosRtc     ports 0x70/0x71, MC146818: time from the host's clock in BCD, 24h, UIP clear.
//   PmTimer     a 24-bit ACPI PM timer (3.579545 MHz) from the host's steady clock; used by the
//               exit benchmark's guest (the `inl_pmtimer` exit).
// Each is thread-safe (atomics or a mutex) since every vCPU thread may touch it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>

#include "xpv/kvm/io_bus.h"

namespace xpv::kvm {

class ResetPorts final : public BusDevice {
 public:
  explicit ResetPorts(std::function<void()> on_reset) : on_reset_(std::move(on_reset)) {}
  void read(std::uint64_t base, std::uint64_t offset, std::span<std::uint8_t> data) noexcept override;
  void write(std::uint64_t base, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept override;

 private:
  std::function<void()> on_reset_;
  std::atomic<std::uint8_t> port92_{0};
};

class PostPort final : public BusDevice {
 public:
  void read(std::uint64_t, std::uint64_t, std::span<std::uint8_t> data) noexcept override;
  void write(std::uint64_t, std::uint64_t, std::span<const std::uint8_t>) noexcept override {}
};

class CmosRtc final : public BusDevice {
 public:
  void read(std::uint64_t base, std::uint64_t offset, std::span<std::uint8_t> data) noexcept override;
  void write(std::uint64_t base, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept override;

 private:
  std::uint8_t reg(unsigned index) noexcept;
  std::mutex mu_;
  unsigned index_ = 0;
  std::uint8_t ram_[128] = {};
};

class PmTimer final : public BusDevice {
 public:
  void read(std::uint64_t base, std::uint64_t offset, std::span<std::uint8_t> data) noexcept override;
  void write(std::uint64_t, std::uint64_t, std::span<const std::uint8_t>) noexcept override {}
};

}  // namespace xpv::kvm
