#include <elf.h>
#include <gtest/gtest.h>

#include <cstring>
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

}  // namespace
}  // namespace xpv::kvm
