// XenPlatformDevice — the configuration space of the Xen platform PCI device (5853:0001), the
// device whose presence makes a stock Linux HVM guest load xen-platform-pci (and then grant
// tables, xenbus, blkfront, netfront).
//
// There is no firmware: the VMM pre-assigns both BARs (PlatformDeviceConfig) and leaves I/O and
// memory decoding enabled, so Linux's resource survey claims them as they are. Type 0 header
// (PCI Local Bus spec 3.0 §6.1), what is writable:
//
//   0x04 command     bits 0 (I/O space) and 1 (memory space); everything else reads 0
//   0x06 status      read-only 0 (no capabilities, no errors to clear)
//   0x10 BAR0        I/O, 256 bytes: bits 15:8 writable, bit 0 = 1, bits 31:16 hardwired to 0
//                    (x86 port space is 64 KiB; §6.2.5.1 allows a 16-bit decoder this)
//   0x14 BAR1        memory, 32-bit, prefetchable, 16 MiB: bits 31:24 writable, bits 3:0 = 1000b
//   0x18..0x27       BAR2..5 unimplemented (read 0, a sizing write reads back 0)
//   0x30 ROM BAR     unimplemented (read 0)
//   0x3c int. line   read/write scratch byte for software (§6.2.4), initially the GSI
//   0x3d int. pin    1 (INTA), read-only
//   every other byte read-only (IDs, class, header type 0, subsystem IDs, capabilities pointer 0)
//
// BAR sizing (§6.2.5.1): software writes all-ones and reads back the size mask with the type
// bits: BAR0 → 0x0000ff01, BAR1 → 0xff000008; it then writes the address back. A write that
// leaves every writable address bit set is taken as sizing and not reported; any other write
// that changes the base is accepted (the register holds it, as hardware would) and reported
// through on_bar_moved(bar, new_base). Consequence: a real assignment of BAR0 to port 0xff00 or
// of BAR1 to 0xff000000 is indistinguishable from sizing and is never reported.
//
// Policy for a moved BAR (explicit): accept and report, nothing else. The device itself decodes
// nothing: BAR0's ports are served by PlatformIoBar at the address the VMM registered on its PIO
// bus, and the frames a guest maps into BAR1 (grant table, shared info) are placed by the Xen
// layer at the GPAs the guest names in XENMEM_add_to_physmap, not at "BAR1 base + n". So a move
// does not break grant frames already mapped; the VMM's callback decides whether to follow
// (re-register BAR0) or just log. Linux keeps pre-assigned BARs unless they conflict with
// another resource, so with sane bases (see README) no move happens.
//
// Threading: config_read/config_write come from vCPU threads through PciHost, which holds its own
// mutex around every config access; this class has its own mutex too, so the getters may be
// called from any thread. Lock order: PciHost::mu_ → XenPlatformDevice::mu_. on_bar_moved runs on
// the vCPU thread after this device's lock is dropped but with PciHost's lock held: it must not
// touch PCI configuration space, and must not block for long.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <mutex>

#include "xpv/kvm/pci_host.h"
#include "xpv/log_rate_limit.h"
#include "xpv/platform_pci/ids.h"

namespace xpv::platform_pci {

struct PlatformDeviceConfig {
  std::uint16_t io_base = 0xc000;       // BAR0: 256-byte aligned, nonzero, io_base + 0x100 <= 0x10000
  std::uint32_t mmio_base = 0xf000'0000;  // BAR1: 16 MiB aligned, nonzero, ends at or below 4 GiB
  std::uint8_t gsi = 16;                // the IOAPIC pin INTA is wired to (0..254; 255 = "unknown" in PCI)
  // bar is 0 or 1; new_base is the address part of the register (type bits masked off).
  std::function<void(unsigned bar, std::uint32_t new_base)> on_bar_moved;
};

class XenPlatformDevice final : public kvm::PciFunction {
 public:
  static constexpr unsigned kConfigSize = 256;

  // Throws std::invalid_argument when a base is misaligned, zero or out of range, or gsi is 255.
  explicit XenPlatformDevice(PlatformDeviceConfig config);

  // PciFunction: offset 0..255, size 1/2/4, never crossing a dword. Anything else reads all-ones
  // and is dropped on write (counted in bad_accesses()).
  std::uint32_t config_read(unsigned offset, unsigned size) noexcept override;
  void config_write(unsigned offset, unsigned size, std::uint32_t value) noexcept override;

  // The command register (bits 0/1 only).
  std::uint16_t command() const noexcept;
  bool io_decode() const noexcept { return (command() & 0x1) != 0; }
  bool mmio_decode() const noexcept { return (command() & 0x2) != 0; }
  // The BAR's assigned base: the construction value, or the last reported move; a sizing
  // pattern in the register does not change it. bar > 1 → 0.
  std::uint32_t bar_base(unsigned bar) const noexcept;
  std::uint8_t interrupt_line() const noexcept;
  std::uint8_t gsi() const noexcept { return gsi_; }
  std::uint64_t bar_moves() const noexcept;
  std::uint64_t bad_accesses() const noexcept;

 private:
  std::uint32_t load32(unsigned dword_offset) const noexcept;

  const std::uint8_t gsi_;
  const std::function<void(unsigned, std::uint32_t)> on_bar_moved_;
  mutable std::mutex mu_;
  std::array<std::uint8_t, kConfigSize> cfg_{};    // guarded by mu_
  std::array<std::uint8_t, kConfigSize> wmask_{};  // writable bits per byte; const after construction
  std::array<std::uint32_t, 2> assigned_{};       // guarded by mu_
  std::uint64_t bar_moves_ = 0;                   // guarded by mu_
  std::uint64_t bad_accesses_ = 0;                // guarded by mu_
  xpv::LogRateLimit log_limit_;                // guarded by mu_
};

}  // namespace xpv::platform_pci
