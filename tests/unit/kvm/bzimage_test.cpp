#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "image_builder.h"
#include "xpv/kvm/boot_params.h"
#include "xpv/kvm/bzimage.h"
#include "xpv/kvm/decompress.h"
#include "xpv/kvm/le.h"
#include "xpv/kvm/linux_boot.h"
#include "xpv/kvm/mptable.h"

namespace xpv::kvm {
namespace {

using test::make_bzimage;
using test::make_elf;

std::vector<std::uint8_t> tiny_kernel() {
  return make_elf({{0x1000000, {0x90, 0x90, 0xf4}, 0x10000}}, 0x1000000);
}

std::string why(const Result<BzImage>& r) { return r ? std::string("parsed") : r.error().message; }

TEST(BzImage, ParsesHeaderAndFindsPayload) {
  const auto payload = test::gzip(tiny_kernel());
  const auto img = make_bzimage(payload);
  auto r = parse_bzimage(img);
  ASSERT_TRUE(r) << why(r);
  EXPECT_EQ(r->version, 0x020f);
  EXPECT_EQ(r->setup_size, 5u * 512);
  EXPECT_EQ(r->setup_header.size(), 0x26cu - 0x1f1u);
  EXPECT_EQ(r->payload.size(), payload.size() + 4);
  EXPECT_EQ(std::memcmp(r->payload.data(), payload.data(), payload.size()), 0);
  EXPECT_EQ(r->initrd_addr_max, 0x7fffffffu);
  EXPECT_EQ(detect_compression(r->payload), Compression::gzip);
}

TEST(BzImage, RefusesMaliciousHeaders) {
  const auto good = make_bzimage(test::gzip(tiny_kernel()));
  auto bad = good;
  bad[0x1fe] = 0;
  EXPECT_NE(why(parse_bzimage(bad)).find("magic"), std::string::npos);
  bad = good;
  bad[0x206] = 0x00;  // protocol 2.00
  EXPECT_NE(why(parse_bzimage(bad)).find("too old"), std::string::npos);
  bad = good;
  bad[0x201] = 0xff;  // header end beyond the boot_params hole
  EXPECT_NE(why(parse_bzimage(bad)).find("header length"), std::string::npos);
  bad = good;
  bad[0x1f1] = 0xff;  // setup sectors past the end of the file
  EXPECT_NE(why(parse_bzimage(bad)).find("past the end"), std::string::npos);
  bad = good;
  std::uint32_t off = 0xffff'ff00;
  std::memcpy(bad.data() + 0x248, &off, 4);
  EXPECT_NE(why(parse_bzimage(bad)).find("outside"), std::string::npos);
  bad = good;
  std::uint32_t len = static_cast<std::uint32_t>(good.size());
  std::memcpy(bad.data() + 0x24c, &len, 4);
  EXPECT_NE(why(parse_bzimage(bad)).find("outside"), std::string::npos);
  bad = good;
  bad[0x236] = 0;  // no 64-bit entry
  EXPECT_NE(why(parse_bzimage(bad)).find("64-bit"), std::string::npos);
  bad = good;
  bad.resize(0x300);  // truncated
  EXPECT_NE(why(parse_bzimage(bad)).find("too small"), std::string::npos);
  std::vector<std::uint8_t> empty;
  EXPECT_FALSE(parse_bzimage(empty));
}

TEST(Decompress, RoundTripsGzipAndXz) {
  const auto k = tiny_kernel();
  for (const auto& packed : {test::gzip(k), test::xz(k)}) {
    auto r = decompress(packed, 1 << 20);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(*r, k);
  }
}

TEST(Decompress, RefusesBombsTruncationAndUnknownFormats) {
  const std::vector<std::uint8_t> zeros(8 << 20, 0);
  for (const auto& packed : {test::gzip(zeros), test::xz(zeros)}) {
    ASSERT_LT(packed.size(), 100000u);
    auto r = decompress(packed, 1 << 20);  // 8 MiB out of a few KiB, limit 1 MiB
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("exceeds"), std::string::npos) << r.error().message;
  }
  auto packed = test::xz(tiny_kernel());
  packed.resize(packed.size() / 2);
  auto r = decompress(packed, 1 << 20);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("truncated"), std::string::npos) << r.error().message;
  auto gz = test::gzip(tiny_kernel());
  gz.resize(gz.size() / 2);
  EXPECT_FALSE(decompress(gz, 1 << 20));
  auto corrupt = test::gzip(tiny_kernel());
  for (std::size_t i = 12; i < corrupt.size(); ++i) corrupt[i] ^= 0x5a;
  EXPECT_FALSE(decompress(corrupt, 1 << 20));
  const std::vector<std::uint8_t> bz2 = {'B', 'Z', 'h', '9', 0, 0, 0, 0};
  r = decompress(bz2, 1 << 20);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("not supported"), std::string::npos);
}

class LinuxBootTest : public ::testing::Test {
 protected:
  static constexpr std::uint64_t kRam = 64ull << 20;
  std::vector<std::uint8_t> ram_ = std::vector<std::uint8_t>(kRam, 0);
  GuestMemory mem_{{{0, kRam, ram_.data()}}};
  LinuxBootInput input(std::span<const std::uint8_t> kernel) {
    LinuxBootInput in;
    in.kernel = kernel;
    in.cmdline = "console=ttyS0";
    in.vcpus = 2;
    in.low_end = kRam;
    return in;
  }
};

TEST_F(LinuxBootTest, BootsABzImageThroughItsDecompressedVmlinux) {
  const auto img = make_bzimage(test::xz(tiny_kernel()));
  const std::vector<std::uint8_t> initrd(10000, 0x42);
  auto in = input(img);
  in.initrd = initrd;
  auto r = setup_linux_boot(mem_, in);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(r->from_bzimage);
  EXPECT_EQ(r->rip, 0x1000000u);
  EXPECT_EQ(ram_[0x1000002], 0xf4);
  EXPECT_EQ(r->initrd_gpa % kPageSize, 0u);
  EXPECT_GE(r->initrd_gpa, r->kernel_end);
  EXPECT_LE(r->initrd_gpa + initrd.size(), kRam);
  EXPECT_EQ(ram_[r->initrd_gpa], 0x42);
  std::span<const std::uint8_t> zp(ram_.data() + kBootParamsGpa, kZeroPageSize);
  EXPECT_EQ(le::load<std::uint16_t>(zp, 0x206), 0x020f);  // the image's own header
  EXPECT_EQ(le::load<std::uint32_t>(zp, 0x218), r->initrd_gpa);
  EXPECT_EQ(le::load<std::uint32_t>(zp, 0x21c), initrd.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(ram_.data() + kCmdlineGpa)), "console=ttyS0");
  EXPECT_EQ(std::memcmp(ram_.data() + kMpTableGpa, "_MP_", 4), 0);
  // Identity map: PML4[0] → PDPT, PD entry 8 maps 16 MiB with a 2 MiB page.
  EXPECT_EQ(le::load<std::uint64_t>(std::span<const std::uint8_t>(ram_), kPml4Gpa) & ~0xfffull, kPml4Gpa + 0x1000);
  EXPECT_EQ(le::load<std::uint64_t>(std::span<const std::uint8_t>(ram_), kPml4Gpa + 0x2000 + 8 * 8), 0x1000000u | 0x83);
}

TEST_F(LinuxBootTest, BootsABareVmlinux) {
  const auto k = tiny_kernel();
  auto r = setup_linux_boot(mem_, input(k));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_FALSE(r->from_bzimage);
  EXPECT_EQ(le::load<std::uint32_t>(std::span<const std::uint8_t>(ram_), kBootParamsGpa + 0x202), 0x53726448u);
}

TEST_F(LinuxBootTest, RefusesWhatDoesNotFit) {
  const auto k = tiny_kernel();
  auto in = input(k);
  in.cmdline = std::string(5000, 'x');
  auto r = setup_linux_boot(mem_, in);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("command line"), std::string::npos);
  const std::vector<std::uint8_t> huge(kRam, 1);
  in = input(k);
  in.initrd = huge;
  r = setup_linux_boot(mem_, in);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("initrd"), std::string::npos);
  const std::vector<std::uint8_t> junk(0x3000, 0x11);
  r = setup_linux_boot(mem_, input(junk));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("bad magic"), std::string::npos);
  // A bzImage whose payload decompresses to more than the guest's memory.
  const auto bomb = make_bzimage(test::xz(std::vector<std::uint8_t>(kRam + (1 << 20), 0)));
  r = setup_linux_boot(mem_, input(bomb));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("exceeds"), std::string::npos) << r.error().message;
  // A bzImage whose payload is not a kernel.
  r = setup_linux_boot(mem_, input(make_bzimage(test::gzip(junk))));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("not an ELF"), std::string::npos);
}

}  // namespace
}  // namespace xpv::kvm
