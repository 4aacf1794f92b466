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

// Where one loaded section lies in guest-physical memory (size 0: absent).
struct KernelSection {
  std::uint64_t gpa = 0;
  std::uint64_t size = 0;
};
struct KernelTables {
  KernelSection return_sites, orc_unwind_ip, orc_unwind;
};

struct LoadedKernel {
  std::uint64_t entry = 0;
  std::uint64_t lowest = 0;   // lowest loaded physical address
  std::uint64_t highest = 0;  // end of the highest segment (p_paddr + p_memsz)
  // Tables of the kernel that describe its own code, found through the section headers (each 0
  // when the image has no such section or no section headers); whoever rewrites the code they
  // describe must keep them true (xen/stubs.h):
  //  .return_sites   its `jmp __x86_return_thunk` instructions, each an int32 offset relative to
  //                  the entry, which the kernel rewrites at boot (CONFIG_RETHUNK);
  //  .orc_unwind_ip  the ORC unwinder's instruction addresses (int32, relative to the entry) and
  //  .orc_unwind     the unwind state from each of them on (6 bytes each, same order).
  KernelTables tables;
};

bool looks_like_elf(std::span<const std::uint8_t> image) noexcept;

// Validates everything before writing a byte of guest memory.
Result<LoadedKernel> load_elf(std::span<const std::uint8_t> image, const GuestMemory& mem,
                              std::uint64_t window_lo, std::uint64_t window_hi) noexcept;

}  // namespace xpv::kvm
