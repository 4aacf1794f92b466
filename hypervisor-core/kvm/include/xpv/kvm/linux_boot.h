// Direct Linux boot through the 64-bit boot protocol (Documentation/x86/boot.rst, "64-bit boot
// protocol"): no firmware, no real-mode setup code, no in-guest decompressor.
//
// Guest-physical layout it writes (all below 1 MiB except the kernel and the initrd):
//   0x0500  GDT: 0 null, 1 null, 2 code64 (__BOOT_CS = 0x10), 3 data (__BOOT_DS = 0x18)
//   0x7000  boot_params (zero page)                      rsi at entry
//   0x8ff0  initial stack top
//   0x9000  PML4, 0xa000 PDPT, 0xb000..0xefff four PDs: identity map of 0..4 GiB, 2 MiB pages
//   0x20000 kernel command line (NUL-terminated)
//   0xf0000 MP table (floating pointer + config table; e820-reserved)
//   kernel: vmlinux PT_LOAD segments at their p_paddr (16 MiB for Debian's kernel)
//   initrd: page-aligned, as high as RAM below 3 GiB and initrd_addr_max allow, above the kernel
// A bzImage is parsed (bzimage.h), its payload decompressed here (decompress.h, bounded by the
// guest's memory size), and the resulting vmlinux loaded like a bare one; its setup header is
// copied into boot_params. The entry point is the vmlinux's startup_64 (physical e_entry).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "xpv/guest_memory.h"
#include "xpv/kvm/elf_loader.h"
#include "xpv/kvm/error.h"

#include "xpv/kvm/mptable.h"

namespace xpv::kvm {

inline constexpr std::uint64_t kGdtGpa = 0x500;
inline constexpr std::uint64_t kBootParamsGpa = 0x7000;
inline constexpr std::uint64_t kBootStackGpa = 0x8ff0;
inline constexpr std::uint64_t kPml4Gpa = 0x9000;
inline constexpr std::uint64_t kCmdlineGpa = 0x20000;
inline constexpr std::uint64_t kMpTableGpa = 0xf0000;
inline constexpr std::uint64_t kKernelWindowLo = 0x100000;
inline constexpr std::uint16_t kBootCs = 0x10, kBootDs = 0x18;

struct LinuxBootInput {
  std::span<const std::uint8_t> kernel;  // bzImage or vmlinux ELF
  std::span<const std::uint8_t> initrd;  // may be empty
  std::string cmdline;
  unsigned vcpus = 1;
  std::uint64_t low_end = 0;     // RAM below the 3 GiB hole
  std::uint64_t high_size = 0;   // RAM above 4 GiB
  std::uint32_t cpu_signature = 0x600;  // for the MP table
  std::uint32_t cpu_features = 0x201;
  std::vector<MpPciIrq> pci_irqs;  // PCI INTx routing for the MP table
};

// What the boot vCPU starts with (64-bit mode, paging on, CS = kBootCs).
struct LinuxBootEntry {
  std::uint64_t rip = 0;
  std::uint64_t rsi = kBootParamsGpa;
  std::uint64_t rsp = kBootStackGpa;
  std::uint64_t cr3 = kPml4Gpa;
  std::uint64_t gdt_base = kGdtGpa;
  std::uint16_t gdt_limit = 4 * 8 - 1;
  std::uint64_t kernel_start = 0;  // the loaded vmlinux: [kernel_start, kernel_end)
  std::uint64_t kernel_end = 0;
  KernelTables kernel_tables;       // its self-describing tables (LoadedKernel::tables)
  std::uint64_t initrd_gpa = 0;
  bool from_bzimage = false;
};

// Writes everything into mem. Errors name the image and the reason (bad/truncated/malicious
// kernel, initrd too big for the memory below its limit, command line too long, ...).
Result<LinuxBootEntry> setup_linux_boot(const GuestMemory& mem, const LinuxBootInput& in) noexcept;

// The identity map and GDT alone (also used by the smoke test's 64-bit stub).
Result<void> write_long_mode_tables(const GuestMemory& mem) noexcept;

}  // namespace xpv::kvm
