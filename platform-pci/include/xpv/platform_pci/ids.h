// The Xen platform PCI device's identity and the fixed I/O port protocol's constants — facts of
// the ABI that stock guests depend on (Xen docs/misc/hvm-emulated-unplug.pandoc; Linux
// include/xen/platform_pci.h uses the same numbers). See docs/XEN-GUEST-ABI.md, "Platform PCI
// device and unplug".
#pragma once

#include <cstdint>

namespace xpv::platform_pci {

// PCI identity: vendor "XenSource" 0x5853, device "platform" 0x0001 (the subsystem IDs are the
// same), revision 1, class 0xff/0x80/0x00 ("other", unassigned), INTA.
inline constexpr std::uint16_t kVendorId = 0x5853;
inline constexpr std::uint16_t kDeviceId = 0x0001;
inline constexpr std::uint8_t kRevision = 1;
inline constexpr std::uint8_t kClassCode = 0xff, kSubclass = 0x80, kProgIf = 0x00;
inline constexpr std::uint8_t kInterruptPinIntA = 1;

// BAR0: 256 bytes of I/O space; BAR1: 16 MiB of prefetchable 32-bit memory (the guest places its
// grant-table frames and other Xen-mapped pages there).
inline constexpr std::uint32_t kIoBarSize = 0x100;
inline constexpr std::uint32_t kMmioBarSize = 0x0100'0000;

// The fixed I/O ports (outside any BAR). Offsets are relative to kFixedPortBase.
//   0x10  read  16 bits: magic (0x49d2, or 0xd249 when the driver is blacklisted)
//         write 16 bits: unplug mask;  write 32 bits: driver build number
//         read/write 8 bits: platform flags (bit 0: ROM lock)
//   0x12  read  8 bits: protocol version;  write 16 bits: product number
//         write 8 bits: one byte of guest log text
inline constexpr std::uint16_t kFixedPortBase = 0x10;
inline constexpr std::uint16_t kMagic = 0x49d2;
inline constexpr std::uint16_t kMagicBlacklisted = 0xd249;
inline constexpr std::uint8_t kProtocolVersion = 1;

// Product numbers a guest writes to port 0x12 (Linux writes 3 and build number 1).
inline constexpr std::uint16_t kProductCitrixWindows = 0x0001;
inline constexpr std::uint16_t kProductLinux = 0x0003;

// Unplug mask bits (16-bit write to port 0x10).
inline constexpr std::uint16_t kUnplugIdeScsiDisks = 1u << 0;  // all emulated IDE/SCSI disks (not CD-ROMs)
inline constexpr std::uint16_t kUnplugNics = 1u << 1;          // all emulated NICs
inline constexpr std::uint16_t kUnplugAuxIde = 1u << 2;        // IDE disks except the primary master
inline constexpr std::uint16_t kUnplugNvme = 1u << 3;          // all emulated NVMe disks
inline constexpr std::uint16_t kUnplugKnownBits = 0x000f;

// Platform flags (byte at port 0x10, or BAR0 offset 0).
inline constexpr std::uint8_t kFlagRomLock = 1u << 0;

}  // namespace xpv::platform_pci
