// ELF64 kernel loader (vmlinux): copies each PT_LOAD segment to its physical address (p_paddr)
// and zero-fills p_memsz beyond p_filesz. Refused, with a clear line, never a crash: bad magic,
// not ELF64/little-endian/x86-64/EXEC, program headers outside the file, a segment's file range
// outside the file, filesz > memsz, a segment outside [window_lo, window_hi) or outside guest
// RAM, overlapping segments, no PT_LOAD, or an entry point outside every loaded segment.
//
// On x86-64 Linux, vmlinux's e_entry is the *physical* address of startup_64 (the linker script
// says ENTRY(phys_startup_64)), which is where the 64-bit boot protocol enters.
#pragma once

#include <cstdint>
#include <span>

#include "xpv/guest_memory.h"
#include "xpv/kvm/error.h"

namespace xpv::kvm {

struct LoadedKernel {
  std::uint64_t entry = 0;
  std::uint64_t lowest = 0;   // lowest loaded physical address
  std::uint64_t highest = 0;  // end of the highest segment (p_paddr + p_memsz)
  // Where the loaded `.return_sites` section is (physical; size 0 when the image has none or no
  // section headers): Linux's list of its `jmp __x86_return_thunk` instructions, each a 32-bit
  // offset relative to the entry, which the kernel rewrites at boot (CONFIG_RETHUNK). Whoever
  // rewrites a listed instruction must move its entry along (xen/stubs.h).
  std::uint64_t return_sites = 0;
  std::uint64_t return_sites_size = 0;
};

bool looks_like_elf(std::span<const std::uint8_t> image) noexcept;

// Validates everything before writing a byte of guest memory.
Result<LoadedKernel> load_elf(std::span<const std::uint8_t> image, const GuestMemory& mem,
                              std::uint64_t window_lo, std::uint64_t window_hi) noexcept;

}  // namespace xpv::kvm
