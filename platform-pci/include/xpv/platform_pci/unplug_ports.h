// UnplugPorts — the Xen HVM "emulated device unplug" protocol on the fixed I/O ports 0x10..0x1f
// (Xen docs/misc/hvm-emulated-unplug.pandoc; XEN-GUEST-ABI.md "Platform PCI device and unplug").
// A stock Linux guest runs it early in boot (arch/x86/xen/platform-pci-unplug.c); if the magic
// is wrong it refuses PV disks and NICs.
//
// The guest's sequence and what this device does (offsets from port 0x10):
//
//   inw  0x10 ──► 0x49d2 (0xd249 once blacklisted)        wrong magic: the guest gives up
//   inb  0x12 ──► 1 (protocol version)                     version 0: the guest skips to the mask
//   outw 0x12 ◄── product number (Linux: 3)                recorded
//   outl 0x10 ◄── build number (Linux: 1)                  recorded; (product, build) checked
//                                                          against the configured blacklist
//   inw  0x10 ──► magic again: 0xd249 = "blacklisted, do not load"
//   outw 0x10 ◄── unplug mask (bit 0 IDE/SCSI disks, 1 NICs, 2 aux IDE, 3 NVMe)
//                 recorded (OR-ed into unplugged_mask()), logged, on_unplug called;
//                 ignored (and logged) while blacklisted: a blacklisted driver will not load,
//                 so its emulated devices must stay
//
// Also, as QEMU's xen-platform has them: the platform-flags byte at 0x10 (read/write, only bit 0
// "ROM lock" kept: xpv has no option ROM area, the bit is just stored) and a guest log byte port
// at 0x12 (8-bit writes; a line ends at '\n' or after kLogLineMax bytes and goes to
// on_guest_log or, without one, to spdlog, rate-limited). Any other access (other sizes or
// offsets) reads all-ones and is dropped, counted in stats().ignored.
//
// xpv emulates no IDE/SCSI/NVMe disks and no NICs, so nothing needs unplugging: the mask is
// recorded for the toolstack and tests, and the callback lets the VMM act if it ever grows
// emulated devices.
//
// Threading: read/write run on vCPU threads, concurrently; one mutex guards the state.
// Callbacks run on the calling vCPU thread after that mutex is dropped: they may call this
// object's getters, must not block for long, and must not throw.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "xpv/kvm/io_bus.h"
#include "xpv/log_rate_limit.h"
#include "xpv/platform_pci/ids.h"

namespace xpv::platform_pci {

// A driver the host refuses: this product, and this build (or every build when unset).
struct BlacklistEntry {
  std::uint16_t product = 0;
  std::optional<std::uint32_t> build;
};

struct UnplugConfig {
  std::vector<BlacklistEntry> blacklist;
  // The mask the guest wrote (not the accumulated one).
  std::function<void(std::uint16_t mask)> on_unplug;
  // One line of guest log text, without the '\n', non-printable bytes replaced by '.'. When
  // unset, lines go to spdlog (info, "xen-platform: guest: ..."), at most 10 per second.
  std::function<void(std::string_view line)> on_guest_log;
};

struct UnplugStats {
  std::uint64_t magic_reads = 0;
  std::uint64_t unplug_writes = 0;     // recorded mask writes
  std::uint64_t refused_unplugs = 0;   // mask writes while blacklisted
  std::uint64_t log_lines = 0;
  std::uint64_t ignored = 0;           // accesses of a size/offset the protocol does not define
};

// "IDE/SCSI disks, NICs" for 0x3; "nothing" for 0; unknown bits as "unknown bits 0x30".
std::string describe_unplug_mask(std::uint16_t mask);

class UnplugPorts final : public kvm::BusDevice {
 public:
  static constexpr std::uint16_t kBase = kFixedPortBase;  // 0x10
  static constexpr std::uint16_t kLength = 0x10;          // 0x10..0x1f, as QEMU claims them
  static constexpr std::size_t kLogLineMax = 256;

  explicit UnplugPorts(UnplugConfig config = {});

  // BusDevice (offset from kBase; data 1/2/4/8 bytes).
  void read(std::uint64_t base, std::uint64_t offset, std::span<std::uint8_t> data) noexcept override;
  void write(std::uint64_t base, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept override;

  // The platform-flags byte and the log byte, shared with BAR0 (PlatformIoBar).
  std::uint8_t platform_flags() const noexcept;
  void set_platform_flags(std::uint8_t v) noexcept;
  void log_byte(std::uint8_t c) noexcept;

  // OR of every recorded unplug mask since construction.
  std::uint16_t unplugged_mask() const noexcept;
  std::optional<std::uint16_t> product() const noexcept;
  std::optional<std::uint32_t> build() const noexcept;
  bool blacklisted() const noexcept;
  UnplugStats stats() const noexcept;

 private:
  struct Line {
    std::array<char, kLogLineMax> text{};
    std::size_t len = 0;
  };

  const std::vector<BlacklistEntry> blacklist_;
  const std::function<void(std::uint16_t)> on_unplug_;
  const std::function<void(std::string_view)> on_guest_log_;

  mutable std::mutex mu_;
  std::optional<std::uint16_t> product_;  // guarded by mu_
  std::optional<std::uint32_t> build_;    // guarded by mu_
  bool blacklisted_ = false;              // guarded by mu_
  std::uint16_t unplugged_ = 0;           // guarded by mu_
  std::uint8_t flags_ = 0;                // guarded by mu_
  Line line_;                             // guarded by mu_
  UnplugStats stats_;                     // guarded by mu_
  xpv::LogRateLimit unplug_log_limit_; // guarded by mu_
  xpv::LogRateLimit guest_log_limit_;  // guarded by mu_
};

}  // namespace xpv::platform_pci
