#include "xpv/platform_pci/platform_device.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <stdexcept>


namespace xpv::platform_pci {
namespace {

// Type 0 header offsets (PCI 3.0 §6.1).
constexpr unsigned kVendor = 0x00, kDevice = 0x02, kCommand = 0x04, kRevisionId = 0x08, kProgIfOff = 0x09,
                   kSubclassOff = 0x0a, kClassOff = 0x0b, kHeaderType = 0x0e, kBar0 = 0x10, kBar1 = 0x14,
                   kSubVendor = 0x2c, kSubDevice = 0x2e, kIntLine = 0x3c, kIntPin = 0x3d;

constexpr std::uint32_t kIoBarType = 0x1;    // bit 0: I/O space
constexpr std::uint32_t kMemBarType = 0x8;   // bit 3 prefetchable, bits 2:1 = 00 (32-bit), bit 0 = 0
constexpr std::uint32_t kIoBarAddrMask = 0x0000'ffffu & ~(kIoBarSize - 1);  // 0x0000ff00
constexpr std::uint32_t kMemBarAddrMask = ~(kMmioBarSize - 1);              // 0xff000000
constexpr std::uint16_t kCommandWritable = 0x0003;                         // I/O + memory space enable

constexpr std::uint32_t kBarAddrMask[2] = {kIoBarAddrMask, kMemBarAddrMask};

void put16(std::array<std::uint8_t, 256>& a, unsigned off, std::uint16_t v) {
  a[off] = static_cast<std::uint8_t>(v);
  a[off + 1] = static_cast<std::uint8_t>(v >> 8);
}
void put32(std::array<std::uint8_t, 256>& a, unsigned off, std::uint32_t v) {
  for (unsigned i = 0; i < 4; ++i) a[off + i] = static_cast<std::uint8_t>(v >> (8 * i));
}

bool valid_access(unsigned offset, unsigned size) noexcept {
  if (size != 1 && size != 2 && size != 4) return false;
  if (offset >= XenPlatformDevice::kConfigSize) return false;
  return (offset & 3u) + size <= 4;  // never crosses a dword (the PciFunction contract)
}

}  // namespace

XenPlatformDevice::XenPlatformDevice(PlatformDeviceConfig config)
    : gsi_(config.gsi), on_bar_moved_(std::move(config.on_bar_moved)) {
  if (config.io_base == 0 || (config.io_base & (kIoBarSize - 1)) != 0 ||
      std::uint32_t{config.io_base} + kIoBarSize > 0x1'0000) {
    throw std::invalid_argument(fmt::format("xen-platform: BAR0 I/O base {:#x} must be nonzero, {:#x}-aligned "
                                            "and end at or below 0x10000",
                                            config.io_base, kIoBarSize));
  }
  if (config.mmio_base == 0 || (config.mmio_base & (kMmioBarSize - 1)) != 0) {
    throw std::invalid_argument(fmt::format("xen-platform: BAR1 MMIO base {:#x} must be nonzero and {:#x}-aligned",
                                            config.mmio_base, kMmioBarSize));
  }
  if (config.gsi == 0xff) throw std::invalid_argument("xen-platform: GSI 255 means 'no connection' in PCI");

  put16(cfg_, kVendor, kVendorId);
  put16(cfg_, kDevice, kDeviceId);
  put16(cfg_, kCommand, kCommandWritable);  // decoding on: there is no firmware to enable it
  cfg_[kRevisionId] = kRevision;
  cfg_[kProgIfOff] = kProgIf;
  cfg_[kSubclassOff] = kSubclass;
  cfg_[kClassOff] = kClassCode;
  cfg_[kHeaderType] = 0x00;  // type 0, single function
  put32(cfg_, kBar0, config.io_base | kIoBarType);
  put32(cfg_, kBar1, config.mmio_base | kMemBarType);
  put16(cfg_, kSubVendor, kVendorId);
  put16(cfg_, kSubDevice, kDeviceId);
  cfg_[kIntLine] = config.gsi;
  cfg_[kIntPin] = kInterruptPinIntA;

  put16(wmask_, kCommand, kCommandWritable);
  put32(wmask_, kBar0, kIoBarAddrMask);
  put32(wmask_, kBar1, kMemBarAddrMask);
  wmask_[kIntLine] = 0xff;

  assigned_ = {config.io_base, config.mmio_base};
}

std::uint32_t XenPlatformDevice::load32(unsigned off) const noexcept {
  std::uint32_t v = 0;
  for (unsigned i = 0; i < 4; ++i) v |= std::uint32_t{cfg_[off + i]} << (8 * i);
  return v;
}

std::uint32_t XenPlatformDevice::config_read(unsigned offset, unsigned size) noexcept {
  std::lock_guard lk(mu_);
  if (!valid_access(offset, size)) {
    ++bad_accesses_;
    return 0xffff'ffffu;
  }
  std::uint32_t v = 0;
  for (unsigned i = 0; i < size; ++i) v |= std::uint32_t{cfg_[offset + i]} << (8 * i);
  return v;
}

void XenPlatformDevice::config_write(unsigned offset, unsigned size, std::uint32_t value) noexcept {
  // A move to report, collected under the lock and reported after it (the callback may log or
  // take the VMM's own locks).
  int moved_bar = -1;
  std::uint32_t moved_to = 0;
  std::uint64_t suppressed = 0;
  bool log_it = false;
  {
    std::lock_guard lk(mu_);
    if (!valid_access(offset, size)) {
      ++bad_accesses_;
      return;
    }
    for (unsigned i = 0; i < size; ++i) {
      const unsigned o = offset + i;
      const auto b = static_cast<std::uint8_t>(value >> (8 * i));
      cfg_[o] = static_cast<std::uint8_t>((cfg_[o] & ~wmask_[o]) | (b & wmask_[o]));
    }
    const unsigned dword = offset & ~3u;
    if (dword == kBar0 || dword == kBar1) {
      const unsigned bar = dword == kBar0 ? 0 : 1;
      const std::uint32_t base = load32(dword) & kBarAddrMask[bar];
      const bool sizing = base == kBarAddrMask[bar];
      if (!sizing && base != assigned_[bar]) {
        assigned_[bar] = base;
        ++bar_moves_;
        moved_bar = static_cast<int>(bar);
        moved_to = base;
        log_it = log_limit_.allow();
        if (log_it) suppressed = log_limit_.take_suppressed();
      }
    }
  }
  if (moved_bar < 0) return;
  if (log_it) {
    spdlog::info("xen-platform: guest moved BAR{} to {:#x}{}", moved_bar, moved_to,
                 suppressed ? fmt::format(" ({} similar lines suppressed)", suppressed) : std::string());
  }
  if (on_bar_moved_) on_bar_moved_(static_cast<unsigned>(moved_bar), moved_to);
}

std::uint16_t XenPlatformDevice::command() const noexcept {
  std::lock_guard lk(mu_);
  return static_cast<std::uint16_t>(cfg_[kCommand] | (cfg_[kCommand + 1] << 8));
}

std::uint32_t XenPlatformDevice::bar_base(unsigned bar) const noexcept {
  std::lock_guard lk(mu_);
  return bar < 2 ? assigned_[bar] : 0;
}

std::uint8_t XenPlatformDevice::interrupt_line() const noexcept {
  std::lock_guard lk(mu_);
  return cfg_[kIntLine];
}

std::uint64_t XenPlatformDevice::bar_moves() const noexcept {
  std::lock_guard lk(mu_);
  return bar_moves_;
}

std::uint64_t XenPlatformDevice::bad_accesses() const noexcept {
  std::lock_guard lk(mu_);
  return bad_accesses_;
}

}  // namespace xpv::platform_pci
