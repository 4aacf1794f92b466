#include "xpv/kvm/elf_loader.h"

#include <elf.h>
#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <vector>

namespace xpv::kvm {

bool looks_like_elf(std::span<const std::uint8_t> img) noexcept {
  return img.size() >= 4 && std::memcmp(img.data(), ELFMAG, SELFMAG) == 0;
}

namespace {
// The kernel's self-describing tables (LoadedKernel::tables), located through the section headers
// and the loaded segment that holds each. Best effort: anything malformed or missing leaves that
// table absent (size 0).
void find_tables(std::span<const std::uint8_t> img, const Elf64_Ehdr& eh, const std::vector<Elf64_Phdr>& loads,
                 KernelTables& t) noexcept {
  if (eh.e_shoff == 0 || eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shstrndx >= eh.e_shnum) return;
  const std::uint64_t sh_bytes = std::uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr);
  if (eh.e_shoff > img.size() || sh_bytes > img.size() - eh.e_shoff) return;
  auto shdr = [&](unsigned i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, img.data() + eh.e_shoff + std::uint64_t{i} * sizeof(Elf64_Shdr), sizeof sh);
    return sh;
  };
  const Elf64_Shdr strtab = shdr(eh.e_shstrndx);
  if (strtab.sh_offset > img.size() || strtab.sh_size > img.size() - strtab.sh_offset) return;
  const std::pair<std::string_view, KernelSection*> wanted[] = {
      {".return_sites", &t.return_sites}, {".orc_unwind_ip", &t.orc_unwind_ip}, {".orc_unwind", &t.orc_unwind}};
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr sh = shdr(i);
    if (sh.sh_type != SHT_PROGBITS || (sh.sh_flags & SHF_ALLOC) == 0 || sh.sh_name >= strtab.sh_size) continue;
    const char* name = reinterpret_cast<const char*>(img.data() + strtab.sh_offset + sh.sh_name);
    const std::size_t room = strtab.sh_size - sh.sh_name;
    for (const auto& [want, out] : wanted) {
      if (room < want.size() + 1 || std::memcmp(name, want.data(), want.size()) != 0 || name[want.size()] != '\0') continue;
      for (const auto& ph : loads) {
        if (sh.sh_addr >= ph.p_vaddr && sh.sh_size <= ph.p_filesz && sh.sh_addr - ph.p_vaddr <= ph.p_filesz - sh.sh_size) {
          *out = KernelSection{ph.p_paddr + (sh.sh_addr - ph.p_vaddr), sh.sh_size};
          break;
        }
      }
    }
  }
}
}  // namespace

Result<LoadedKernel> load_elf(std::span<const std::uint8_t> img, const GuestMemory& mem,
                              std::uint64_t window_lo, std::uint64_t window_hi) noexcept {
  if (!looks_like_elf(img)) return err("ELF: bad magic");
  if (img.size() < sizeof(Elf64_Ehdr)) return err("ELF: file shorter than the ELF header");
  Elf64_Ehdr eh;
  std::memcpy(&eh, img.data(), sizeof eh);
  if (eh.e_ident[EI_CLASS] != ELFCLASS64) return err("ELF: not a 64-bit image");
  if (eh.e_ident[EI_DATA] != ELFDATA2LSB) return err("ELF: not little-endian");
  if (eh.e_machine != EM_X86_64) return err(fmt::format("ELF: machine {} is not x86-64", eh.e_machine));
  if (eh.e_type != ET_EXEC) return err(fmt::format("ELF: type {} is not an executable", eh.e_type));
  if (eh.e_phentsize != sizeof(Elf64_Phdr)) return err(fmt::format("ELF: program header size {} is not {}", eh.e_phentsize, sizeof(Elf64_Phdr)));
  if (eh.e_phnum == 0 || eh.e_phnum > 256) return err(fmt::format("ELF: {} program headers", eh.e_phnum));
  const std::uint64_t ph_bytes = std::uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr);
  if (eh.e_phoff > img.size() || ph_bytes > img.size() - eh.e_phoff) {
    return err("ELF: program headers lie outside the file");
  }
  std::vector<Elf64_Phdr> loads;
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, img.data() + eh.e_phoff + i * sizeof(Elf64_Phdr), sizeof ph);
    if (ph.p_type != PT_LOAD || ph.p_memsz == 0) continue;
    if (ph.p_filesz > ph.p_memsz) return err(fmt::format("ELF: segment {} has filesz {:#x} > memsz {:#x}", i, ph.p_filesz, ph.p_memsz));
    if (ph.p_offset > img.size() || ph.p_filesz > img.size() - ph.p_offset) {
      return err(fmt::format("ELF: segment {} file range [{:#x}, +{:#x}) lies outside the {}-byte file", i, ph.p_offset, ph.p_filesz, img.size()));
    }
    if (ph.p_paddr + ph.p_memsz < ph.p_paddr || ph.p_paddr < window_lo || ph.p_paddr + ph.p_memsz > window_hi) {
      return err(fmt::format("ELF: segment {} at [{:#x}, +{:#x}) lies outside the kernel window [{:#x}, {:#x})", i,
                             ph.p_paddr, ph.p_memsz, window_lo, window_hi));
    }
    if (!mem.translate(ph.p_paddr, ph.p_memsz)) {
      return err(fmt::format("ELF: segment {} at [{:#x}, +{:#x}) does not fit in guest RAM", i, ph.p_paddr, ph.p_memsz));
    }
    loads.push_back(ph);
  }
  if (loads.empty()) return err("ELF: no loadable segment");
  std::sort(loads.begin(), loads.end(), [](const Elf64_Phdr& a, const Elf64_Phdr& b) { return a.p_paddr < b.p_paddr; });
  for (std::size_t i = 1; i < loads.size(); ++i) {
    if (loads[i].p_paddr < loads[i - 1].p_paddr + loads[i - 1].p_memsz) {
      return err(fmt::format("ELF: segments at {:#x} and {:#x} overlap", loads[i - 1].p_paddr, loads[i].p_paddr));
    }
  }
  bool entry_ok = false;
  for (const auto& ph : loads) {
    if (eh.e_entry >= ph.p_paddr && eh.e_entry - ph.p_paddr < ph.p_memsz) entry_ok = true;
  }
  if (!entry_ok) return err(fmt::format("ELF: entry point {:#x} is outside every loaded segment", eh.e_entry));

  LoadedKernel k{eh.e_entry, loads.front().p_paddr, 0, {}};
  find_tables(img, eh, loads, k.tables);
  for (const auto& ph : loads) {
    auto dst = mem.translate(ph.p_paddr, ph.p_memsz);  // checked above
    if (!dst) return err("ELF: guest memory translation failed");
    std::memcpy(dst->data(), img.data() + ph.p_offset, ph.p_filesz);
    std::memset(dst->data() + ph.p_filesz, 0, ph.p_memsz - ph.p_filesz);
    k.highest = std::max(k.highest, ph.p_paddr + ph.p_memsz);
  }
  return k;
}

}  // namespace xpv::kvm
