// The Linux x86 "zero page" (struct boot_params, 4096 bytes) and its e820 map, built as bytes at
// the documented offsets (Documentation/x86/zero-page.rst, boot.rst) rather than as a C struct:
// the setup header starts at the odd offset 0x1f1, so a standard-layout struct cannot express it.
//
//   0x0c0 u32 ext_ramdisk_image   0x0c4 u32 ext_ramdisk_size   0x0c8 u32 ext_cmd_line_ptr
//   0x1e8 u8  e820_entries        0x1f1 ..  setup_header (copied from the bzImage, or built)
//   0x1fa u16 vid_mode            0x1fe u16 boot_flag   0x202 u32 header "HdrS"   0x206 u16 version
//   0x210 u8  type_of_loader      0x211 u8  loadflags   0x218 u32 ramdisk_image   0x21c u32 ramdisk_size
//   0x224 u16 heap_end_ptr        0x228 u32 cmd_line_ptr  0x22c u32 initrd_addr_max
//   0x230 u32 kernel_alignment    0x238 u32 cmdline_size  0x2d0 e820_table[128] of {u64 addr, u64 size, u32 type}
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "xpv/kvm/error.h"

namespace xpv::kvm {

inline constexpr std::size_t kZeroPageSize = 4096;
inline constexpr std::size_t kE820Max = 128;
inline constexpr std::uint32_t kE820Ram = 1, kE820Reserved = 2;

struct E820Entry {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint32_t type = 0;
  bool operator==(const E820Entry&) const = default;
};

// The PC map for RAM [0, low_end) ∪ [4 GiB, 4 GiB + high_size): low RAM up to the EBDA, the
// EBDA/VGA/BIOS area reserved (it holds the MP table), RAM from 1 MiB, RAM above 4 GiB.
std::vector<E820Entry> build_e820(std::uint64_t low_end, std::uint64_t high_size);

struct BootParamsInput {
  std::span<const std::uint8_t> setup_header;  // from the bzImage; empty → a minimal one is built
  std::uint64_t cmdline_gpa = 0;
  std::uint32_t cmdline_size = 0;  // bytes incl. NUL
  std::uint64_t initrd_gpa = 0;
  std::uint64_t initrd_size = 0;
  std::vector<E820Entry> e820;
};

// Fills zero_page (exactly kZeroPageSize bytes). Errors: wrong page size, too many e820 entries,
// a setup header that does not fit.
Result<void> build_boot_params(std::span<std::uint8_t> zero_page, const BootParamsInput& in) noexcept;

}  // namespace xpv::kvm
