#include <elf.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "image_builder.h"
#include "xpv/kvm/elf_loader.h"

namespace xpv::kvm {
namespace {

using test::make_elf;
using test::Segment;

constexpr std::uint64_t kRam = 64ull << 20;

class ElfLoaderTest : public ::testing::Test {
 protected:
  std::vector<std::uint8_t> ram_ = std::vector<std::uint8_t>(kRam, 0xaa);
  GuestMemory mem_{{{0, kRam, ram_.data()}}};

  Result<LoadedKernel> load(const std::vector<std::uint8_t>& img) { return load_elf(img, mem_, 0x100000, kRam); }
  static std::string why(const Result<LoadedKernel>& r) { return r ? std::string("loaded") : r.error().message; }
};

TEST_F(ElfLoaderTest, LoadsSegmentsAndZeroesBss) {
  const auto img = make_elf({{0x1000000, {1, 2, 3, 4}, 0x2000}, {0x1100000, {9}, 1}}, 0x1000002);
  auto r = load(img);
  ASSERT_TRUE(r) << why(r);
  EXPECT_EQ(r->entry, 0x1000002u);
  EXPECT_EQ(r->lowest, 0x1000000u);
  EXPECT_EQ(r->highest, 0x1100001u);
  EXPECT_EQ(ram_[0x1000000], 1);
  EXPECT_EQ(ram_[0x1000003], 4);
  EXPECT_EQ(ram_[0x1000004], 0);       // bss zeroed
  EXPECT_EQ(ram_[0x1001fff], 0);
  EXPECT_EQ(ram_[0x1002000], 0xaa);    // untouched past memsz
  EXPECT_EQ(ram_[0x1100000], 9);
}

TEST_F(ElfLoaderTest, RefusesBadHeaders) {
  auto good = make_elf({{0x1000000, {1}, 1}}, 0x1000000);
  auto bad = good;
  bad[0] = 'X';
  EXPECT_NE(why(load(bad)).find("magic"), std::string::npos);
  bad = good;
  bad[EI_CLASS] = ELFCLASS32;
  EXPECT_NE(why(load(bad)).find("64-bit"), std::string::npos);
  bad = good;
  bad[EI_DATA] = ELFDATA2MSB;
  EXPECT_NE(why(load(bad)).find("little-endian"), std::string::npos);
  bad = good;
  bad[offsetof(Elf64_Ehdr, e_machine)] = EM_386;
  EXPECT_NE(why(load(bad)).find("x86-64"), std::string::npos);
  bad = good;
  bad.resize(40);  // truncated inside the ELF header
  EXPECT_NE(why(load(bad)).find("shorter"), std::string::npos);
  bad = good;
  bad.resize(sizeof(Elf64_Ehdr) + 10);  // truncated program headers
  EXPECT_NE(why(load(bad)).find("program headers"), std::string::npos);
  bad = good;
  bad[offsetof(Elf64_Ehdr, e_phentsize)] = 32;
  EXPECT_NE(why(load(bad)).find("program header size"), std::string::npos);
  bad = good;
  std::uint64_t far = 1ull << 62;
  std::memcpy(bad.data() + offsetof(Elf64_Ehdr, e_phoff), &far, 8);
  EXPECT_NE(why(load(bad)).find("outside the file"), std::string::npos);
  bad = good;
  bad[offsetof(Elf64_Ehdr, e_phnum)] = 0;
  EXPECT_FALSE(load(bad));
}

TEST_F(ElfLoaderTest, RefusesMaliciousSegments) {
  // File range beyond the end of the file.
  auto img = make_elf({{0x1000000, {1, 2, 3}, 3}}, 0x1000000);
  Elf64_Phdr ph;
  std::memcpy(&ph, img.data() + sizeof(Elf64_Ehdr), sizeof ph);
  ph.p_filesz = 0x100000;
  ph.p_memsz = 0x100000;
  std::memcpy(img.data() + sizeof(Elf64_Ehdr), &ph, sizeof ph);
  EXPECT_NE(why(load(img)).find("outside the"), std::string::npos);
  // filesz > memsz.
  EXPECT_NE(why(load(make_elf({{0x1000000, {1, 2, 3}, 2}}, 0x1000000))).find("filesz"), std::string::npos);
  // Below the kernel window (would overwrite the zero page / page tables).
  EXPECT_NE(why(load(make_elf({{0x7000, {1}, 1}}, 0x7000))).find("kernel window"), std::string::npos);
  // Beyond guest RAM, and an address that wraps around.
  EXPECT_NE(why(load(make_elf({{kRam - 0x10, {1}, 0x20}}, kRam - 0x10))).find("kernel window"), std::string::npos);
  EXPECT_FALSE(load(make_elf({{~0ull - 0x10, {1}, 0x20}}, ~0ull - 0x10)));
  // Overlapping segments.
  EXPECT_NE(why(load(make_elf({{0x1000000, {1}, 0x2000}, {0x1001000, {2}, 1}}, 0x1000000))).find("overlap"),
            std::string::npos);
  // Entry point outside every segment.
  EXPECT_NE(why(load(make_elf({{0x1000000, {1}, 0x10}}, 0x2000000))).find("entry"), std::string::npos);
  // Oversized: memsz larger than RAM.
  EXPECT_FALSE(load(make_elf({{0x1000000, {1}, 1ull << 40}}, 0x1000000)));
  // Guest memory untouched by every refused image.
  EXPECT_EQ(ram_[0x1000000], 0xaa);
  EXPECT_EQ(ram_[0x7000], 0xaa);
}

// ---- section headers: the kernel's own tables (KernelTables) ----

struct Section {
  std::string name;
  std::uint64_t vaddr;  // in make_elf's mapping: 0xffffffff80000000 + paddr
  std::uint64_t size;
  std::uint32_t type = SHT_PROGBITS;
  std::uint64_t flags = SHF_ALLOC;
};

constexpr std::uint64_t kVbase = 0xffffffff80000000ull;

// make_elf's image with a section name table and section headers appended (index 0 the null
// section, the names table last).
struct SectionedElf {
  std::vector<std::uint8_t> img;
  std::uint64_t shoff = 0, strtab_off = 0;
};
SectionedElf with_sections(std::vector<std::uint8_t> img, const std::vector<Section>& secs) {
  std::string names(1, '\0');
  std::vector<std::uint32_t> name_at;
  for (const auto& s : secs) {
    name_at.push_back(static_cast<std::uint32_t>(names.size()));
    names += s.name;
    names += '\0';
  }
  const auto strtab_name = static_cast<std::uint32_t>(names.size());
  names += ".shstrtab";
  names += '\0';
  SectionedElf out;
  out.strtab_off = img.size();
  img.insert(img.end(), names.begin(), names.end());
  while (img.size() % 8) img.push_back(0);
  out.shoff = img.size();
  std::vector<Elf64_Shdr> sh(1);
  for (std::size_t i = 0; i < secs.size(); ++i) {
    Elf64_Shdr h{};
    h.sh_name = name_at[i];
    h.sh_type = secs[i].type;
    h.sh_flags = secs[i].flags;
    h.sh_addr = secs[i].vaddr;
    h.sh_size = secs[i].size;
    sh.push_back(h);
  }
  Elf64_Shdr st{};
  st.sh_name = strtab_name;
  st.sh_type = SHT_STRTAB;
  st.sh_offset = out.strtab_off;
  st.sh_size = names.size();
  sh.push_back(st);
  for (const auto& h : sh) {
    const auto* b = reinterpret_cast<const std::uint8_t*>(&h);
    img.insert(img.end(), b, b + sizeof h);
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, img.data(), sizeof eh);
  eh.e_shoff = out.shoff;
  eh.e_shentsize = sizeof(Elf64_Shdr);
  eh.e_shnum = static_cast<Elf64_Half>(sh.size());
  eh.e_shstrndx = static_cast<Elf64_Half>(sh.size() - 1);
  std::memcpy(img.data(), &eh, sizeof eh);
  out.img = std::move(img);
  return out;
}

template <class T>
void put(std::vector<std::uint8_t>& img, std::uint64_t off, T v) {
  std::memcpy(img.data() + off, &v, sizeof v);
}

TEST_F(ElfLoaderTest, FindsTheKernelsTablesThroughItsSectionHeaders) {
  const auto base = make_elf({{0x1000000, std::vector<std::uint8_t>(0x100, 1), 0x200}}, 0x1000000);
  auto e = with_sections(base, {{".text", kVbase + 0x1000000, 0x40},
                                {".return_sites", kVbase + 0x1000040, 0x10},
                                {".orc_unwind_ip", kVbase + 0x1000050, 0x20},
                                {".orc_unwind", kVbase + 0x1000070, 0x30}});
  auto r = load(e.img);
  ASSERT_TRUE(r) << why(r);
  EXPECT_EQ(r->tables.return_sites.gpa, 0x1000040u);
  EXPECT_EQ(r->tables.return_sites.size, 0x10u);
  EXPECT_EQ(r->tables.orc_unwind_ip.gpa, 0x1000050u);
  EXPECT_EQ(r->tables.orc_unwind_ip.size, 0x20u);
  EXPECT_EQ(r->tables.orc_unwind.gpa, 0x1000070u);
  EXPECT_EQ(r->tables.orc_unwind.size, 0x30u);
  // No section headers at all (make_elf's image): loaded, no tables.
  r = load(base);
  ASSERT_TRUE(r) << why(r);
  EXPECT_EQ(r->tables.return_sites.size, 0u);
  EXPECT_EQ(r->tables.orc_unwind.size, 0u);
}

// Malformed section headers are not the loader's business to refuse (the segments decide
// whether the kernel loads): each leaves the table it spoils absent, and nothing is read outside
// the image (ASan runs this test too).
TEST_F(ElfLoaderTest, MalformedSectionHeadersLeaveTheirTablesAbsent) {
  const auto base = make_elf({{0x1000000, std::vector<std::uint8_t>(0x100, 1), 0x200}}, 0x1000000);
  const std::vector<Section> good = {{".return_sites", kVbase + 0x1000040, 0x10}};
  const auto e = with_sections(base, good);
  ASSERT_EQ(load(e.img)->tables.return_sites.size, 0x10u);
  const std::uint64_t sh1 = e.shoff + sizeof(Elf64_Shdr);  // the .return_sites header
  const std::uint64_t strtab_hdr = e.shoff + 2 * sizeof(Elf64_Shdr);
  struct Case {
    const char* what;
    std::function<void(std::vector<std::uint8_t>&)> spoil;
  };
  const std::vector<Case> cases = {
      {"section headers past the end", [&](auto& img) { put<std::uint64_t>(img, offsetof(Elf64_Ehdr, e_shoff), img.size() - 8); }},
      {"section header offset that wraps", [&](auto& img) { put<std::uint64_t>(img, offsetof(Elf64_Ehdr, e_shoff), ~0ull - 16); }},
      {"another header size", [&](auto& img) { put<Elf64_Half>(img, offsetof(Elf64_Ehdr, e_shentsize), 32); }},
      {"names table index out of range", [&](auto& img) { put<Elf64_Half>(img, offsetof(Elf64_Ehdr, e_shstrndx), 3); }},
      {"names table past the end",
       [&](auto& img) { put<std::uint64_t>(img, strtab_hdr + offsetof(Elf64_Shdr, sh_offset), img.size()); }},
      {"names table size that wraps",
       [&](auto& img) { put<std::uint64_t>(img, strtab_hdr + offsetof(Elf64_Shdr, sh_size), ~0ull); }},
      {"name offset past the names table",
       [&](auto& img) { put<std::uint32_t>(img, sh1 + offsetof(Elf64_Shdr, sh_name), 0x7fffffff); }},
      {"name cut off by the end of the names table",
       [&](auto& img) { put<std::uint64_t>(img, strtab_hdr + offsetof(Elf64_Shdr, sh_size), 1 + 12); }},
      {"not PROGBITS", [&](auto& img) { put<std::uint32_t>(img, sh1 + offsetof(Elf64_Shdr, sh_type), SHT_NOBITS); }},
      {"not allocated", [&](auto& img) { put<std::uint64_t>(img, sh1 + offsetof(Elf64_Shdr, sh_flags), 0); }},
      {"outside every segment",
       [&](auto& img) { put<std::uint64_t>(img, sh1 + offsetof(Elf64_Shdr, sh_addr), kVbase + 0x2000000); }},
      {"past the segment's file bytes (in its bss)",
       [&](auto& img) { put<std::uint64_t>(img, sh1 + offsetof(Elf64_Shdr, sh_addr), kVbase + 0x10000f8); }},
      {"a size that wraps", [&](auto& img) { put<std::uint64_t>(img, sh1 + offsetof(Elf64_Shdr, sh_size), ~0ull - 0x20); }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto img = e.img;
    c.spoil(img);
    auto r = load(img);
    ASSERT_TRUE(r) << why(r);
    EXPECT_EQ(r->tables.return_sites.size, 0u);
    EXPECT_EQ(r->tables.return_sites.gpa, 0u);
  }
}

}  // namespace
}  // namespace xpv::kvm
