// Test helpers: synthetic vmlinux ELF images and bzImages (valid, then broken on purpose).
#pragma once

#include <cstdint>
#include <vector>

namespace xpv::kvm::test {

struct Segment {
  std::uint64_t paddr;
  std::vector<std::uint8_t> data;  // file bytes
  std::uint64_t memsz;             // >= data.size() normally
};

// An ELF64 x86-64 EXEC with the given PT_LOAD segments; e_entry = entry.
std::vector<std::uint8_t> make_elf(const std::vector<Segment>& segs, std::uint64_t entry);

std::vector<std::uint8_t> gzip(const std::vector<std::uint8_t>& in);
std::vector<std::uint8_t> xz(const std::vector<std::uint8_t>& in);

// A bzImage (protocol 2.15) whose payload is `payload` followed by its 4-byte size, as the kernel
// build lays it out. setup_sects = 4.
std::vector<std::uint8_t> make_bzimage(const std::vector<std::uint8_t>& payload);

}  // namespace xpv::kvm::test
