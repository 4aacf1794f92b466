#include "image_builder.h"

#include <elf.h>
#include <lzma.h>
#include <zlib.h>

#include <cstring>
#include <stdexcept>

namespace xpv::kvm::test {

std::vector<std::uint8_t> make_elf(const std::vector<Segment>& segs, std::uint64_t entry) {
  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_type = ET_EXEC;
  eh.e_machine = EM_X86_64;
  eh.e_version = EV_CURRENT;
  eh.e_entry = entry;
  eh.e_phoff = sizeof(Elf64_Ehdr);
  eh.e_ehsize = sizeof(Elf64_Ehdr);
  eh.e_phentsize = sizeof(Elf64_Phdr);
  eh.e_phnum = static_cast<Elf64_Half>(segs.size());
  std::vector<std::uint8_t> out(sizeof eh + segs.size() * sizeof(Elf64_Phdr));
  std::memcpy(out.data(), &eh, sizeof eh);
  for (std::size_t i = 0; i < segs.size(); ++i) {
    Elf64_Phdr ph{};
    ph.p_type = PT_LOAD;
    ph.p_flags = PF_R | PF_X;
    ph.p_offset = out.size();
    ph.p_vaddr = 0xffffffff80000000ull + segs[i].paddr;
    ph.p_paddr = segs[i].paddr;
    ph.p_filesz = segs[i].data.size();
    ph.p_memsz = segs[i].memsz;
    ph.p_align = 0x1000;
    std::memcpy(out.data() + sizeof eh + i * sizeof ph, &ph, sizeof ph);
    out.insert(out.end(), segs[i].data.begin(), segs[i].data.end());
  }
  return out;
}

std::vector<std::uint8_t> gzip(const std::vector<std::uint8_t>& in) {
  z_stream zs{};
  if (deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) throw std::runtime_error("deflateInit2");
  std::vector<std::uint8_t> out(deflateBound(&zs, in.size()) + 64);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  if (deflate(&zs, Z_FINISH) != Z_STREAM_END) throw std::runtime_error("deflate");
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::vector<std::uint8_t> xz(const std::vector<std::uint8_t>& in) {
  std::vector<std::uint8_t> out(lzma_stream_buffer_bound(in.size()));
  std::size_t pos = 0;
  if (lzma_easy_buffer_encode(1, LZMA_CHECK_CRC32, nullptr, in.data(), in.size(), out.data(), &pos, out.size()) != LZMA_OK) {
    throw std::runtime_error("lzma_easy_buffer_encode");
  }
  out.resize(pos);
  return out;
}

std::vector<std::uint8_t> make_bzimage(const std::vector<std::uint8_t>& payload) {
  constexpr std::size_t kSetupSects = 4, kSetup = (kSetupSects + 1) * 512, kPayloadOff = 0x100;
  std::vector<std::uint8_t> img(kSetup + kPayloadOff, 0);
  auto put16 = [&](std::size_t o, std::uint16_t v) { std::memcpy(img.data() + o, &v, 2); };
  auto put32 = [&](std::size_t o, std::uint32_t v) { std::memcpy(img.data() + o, &v, 4); };
  img[0x1f1] = kSetupSects;
  put16(0x1fe, 0xaa55);
  img[0x200] = 0xeb;
  img[0x201] = 0x6a;  // header ends at 0x26c
  put32(0x202, 0x53726448);
  put16(0x206, 0x020f);
  img[0x211] = 0x01;  // LOADED_HIGH
  put32(0x22c, 0x7fffffff);
  put16(0x236, 0x7f);  // XLF_KERNEL_64 and friends
  put32(0x238, 2047);
  put32(0x248, kPayloadOff);
  put32(0x24c, static_cast<std::uint32_t>(payload.size() + 4));
  put32(0x260, 0x400000);
  img.insert(img.end(), payload.begin(), payload.end());
  img.resize(img.size() + 4, 0);
  // Pad to a realistic minimum size.
  if (img.size() < 0x2000) img.resize(0x2000, 0);
  return img;
}

}  // namespace xpv::kvm::test
