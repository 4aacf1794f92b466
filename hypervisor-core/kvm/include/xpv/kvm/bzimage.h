// bzImage parsing (Linux x86 boot protocol, Documentation/x86/boot.rst, protocol ≥ 2.08):
// validates the real-mode header and locates the compressed vmlinux payload through
// payload_offset/payload_length, so the VMM can decompress it itself (no in-guest decompressor).
//
// Offsets into the image (= into boot_params for the copied setup header):
//   0x1f1 u8 setup_sects (0 means 4)   0x1fe u16 boot_flag 0xAA55   0x201 u8 jump offset → header end
//   0x202 u32 "HdrS"    0x206 u16 version    0x211 u8 loadflags    0x22c u32 initrd_addr_max
//   0x236 u16 xloadflags   0x238 u32 cmdline_size   0x248 u32 payload_offset   0x24c u32 payload_length
//   0x258 u64 pref_address   0x260 u32 init_size
// Guest-facing parser (the image is user input): noexcept, every length checked against the file.
#pragma once

#include <cstdint>
#include <span>

#include "xpv/kvm/error.h"

namespace xpv::kvm {

struct BzImage {
  std::uint16_t version = 0;
  std::uint32_t setup_size = 0;         // (setup_sects + 1) * 512: where protected-mode code starts
  std::span<const std::uint8_t> setup_header;  // image[0x1f1, header end): copied into boot_params
  std::span<const std::uint8_t> payload;  // the compressed vmlinux, inside the image
  std::uint32_t initrd_addr_max = 0;
  std::uint32_t cmdline_size = 0;
  std::uint16_t xloadflags = 0;
  std::uint32_t init_size = 0;
};

inline constexpr std::uint32_t kSetupHeaderOffset = 0x1f1;

// True when the image carries the bzImage magic (0xAA55 at 0x1fe and "HdrS" at 0x202).
bool looks_like_bzimage(std::span<const std::uint8_t> image) noexcept;

Result<BzImage> parse_bzimage(std::span<const std::uint8_t> image) noexcept;

}  // namespace xpv::kvm
