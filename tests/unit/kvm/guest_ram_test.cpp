#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "xpv/kvm/guest_ram.h"

namespace xpv::kvm {
namespace {

TEST(GuestRam, SmallGuestIsOneRegionAtZero) {
  GuestRam ram(64ull << 20);
  ASSERT_EQ(ram.regions().size(), 1u);
  EXPECT_EQ(ram.regions()[0].gpa, 0u);
  EXPECT_EQ(ram.regions()[0].size, 64ull << 20);
  EXPECT_EQ(ram.low_end(), 64ull << 20);
  struct stat st {};
  ASSERT_EQ(fstat(ram.fd(), &st), 0);  // the memfd dom0 services will map
  EXPECT_EQ(static_cast<std::uint64_t>(st.st_size), 64ull << 20);
  auto s = ram.memory().translate((64ull << 20) - 8, 8);
  ASSERT_TRUE(s);
  (*s)[7] = 0x5a;
  EXPECT_FALSE(ram.memory().translate((64ull << 20) - 8, 9));
}

TEST(GuestRam, LargeGuestSkipsThePciHole) {
  GuestRam ram(kLowRamMax + (512ull << 20));  // sparse memfd: nothing is touched
  ASSERT_EQ(ram.regions().size(), 2u);
  EXPECT_EQ(ram.low_end(), kLowRamMax);
  const auto& hi = ram.regions()[1];
  EXPECT_EQ(hi.gpa, kHighRamBase);
  EXPECT_EQ(hi.size, 512ull << 20);
  EXPECT_EQ(hi.fd_offset, kLowRamMax);
  EXPECT_FALSE(ram.memory().translate(kLowRamMax, 1));  // the hole
  EXPECT_TRUE(ram.memory().translate(kHighRamBase, 4096));
  EXPECT_FALSE(ram.memory().translate(kLowRamMax - 4, 8));  // straddles the hole
}

TEST(GuestRam, DeviceMemoryFollowsRamInTheMemfd) {
  GuestRam ram(64ull << 20, {{0xf000'0000, 0x4000}, {0xfeff'0000, 0x2000}});
  EXPECT_EQ(ram.size(), 64ull << 20);
  EXPECT_EQ(ram.file_size(), (64ull << 20) + 0x6000);
  ASSERT_EQ(ram.regions().size(), 3u);
  EXPECT_EQ(ram.regions()[1].gpa, 0xf000'0000u);
  EXPECT_EQ(ram.regions()[1].fd_offset, 64ull << 20);
  EXPECT_EQ(ram.regions()[2].fd_offset, (64ull << 20) + 0x4000);
  auto page = ram.memory().translate(0xfeff'1000, 4096);
  ASSERT_TRUE(page);
  (*page)[0] = 0x5a;
  EXPECT_EQ(ram.regions()[2].host[0x1000], 0x5a);
  EXPECT_FALSE(ram.memory().translate(0xf000'4000, 1));  // past the grant frames
}

// Ballooning's host side: a page the guest gave back stops using host memory and reads as zeros.
TEST(GuestRam, DiscardFreesRamAndLeavesZeros) {
  GuestRam ram(64ull << 20, {{0xf000'0000, 0x4000}});
  const auto allocated = [&] {
    struct stat st {};
    EXPECT_EQ(fstat(ram.fd(), &st), 0);
    return static_cast<std::uint64_t>(st.st_blocks) * 512;
  };
  const std::uint64_t before = allocated();
  auto span = ram.memory().translate(16ull << 20, 8ull << 20);
  ASSERT_TRUE(span);
  std::memset(span->data(), 0xa5, span->size());
  const std::uint64_t written = allocated();
  EXPECT_GE(written, before + (8ull << 20));
  ASSERT_EQ(ram.discard(16ull << 20, 8ull << 20), 0);
  EXPECT_LE(allocated(), written - (8ull << 20));
  EXPECT_EQ((*span)[0], 0);
  EXPECT_EQ((*span)[span->size() - 1], 0);
  // One 4 KiB page inside what is left written (a huge page is split or zeroed: either way it reads 0).
  auto page = ram.memory().translate(40ull << 20, 3 * 4096);
  ASSERT_TRUE(page);
  std::memset(page->data(), 0x11, page->size());
  ASSERT_EQ(ram.discard((40ull << 20) + 4096, 4096), 0);
  EXPECT_EQ((*page)[4095], 0x11);
  EXPECT_EQ((*page)[4096], 0);
  EXPECT_EQ((*page)[8191], 0);
  EXPECT_EQ((*page)[8192], 0x11);
  // RAM only, page-aligned: not device memory, not past the end, not a partial page.
  EXPECT_EQ(ram.discard(0xf000'0000, 4096), EINVAL);
  EXPECT_EQ(ram.discard((64ull << 20) - 4096, 8192), EINVAL);
  EXPECT_EQ(ram.discard(4096, 100), EINVAL);
  EXPECT_EQ(ram.discard(100, 4096), EINVAL);
  EXPECT_EQ(ram.ram_offset(0xf000'0000, 1), std::nullopt);
  EXPECT_EQ(ram.ram_offset(8192, 4096), std::optional<std::uint64_t>{8192});
}

TEST(GuestRam, RefusesBadDeviceMemory) {
  EXPECT_THROW(GuestRam(64ull << 20, {{0x100'0000, 0x1000}}), std::runtime_error);        // inside RAM
  EXPECT_THROW(GuestRam(64ull << 20, {{0xf000'0800, 0x1000}}), std::runtime_error);       // unaligned
  EXPECT_THROW(GuestRam(64ull << 20, {{0xffff'f000, 0x2000}}), std::runtime_error);       // past 4 GiB
  EXPECT_THROW(GuestRam(64ull << 20, {{0xf000'0000, 0x2000}, {0xf000'1000, 0x1000}}), std::runtime_error);
  EXPECT_THROW(GuestRam(64ull << 20, {{0xf000'0000, 0}}), std::runtime_error);
}

TEST(GuestRam, RefusesBadSizes) {
  EXPECT_THROW(GuestRam(0), std::runtime_error);
  EXPECT_THROW(GuestRam(4097), std::runtime_error);
}

// The smaps field `key` of the mapping that contains addr, or -1.
long smaps_field(const void* addr, const std::string& key) {
  std::ifstream in("/proc/self/smaps");
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = a >= lo && a < hi;
    } else if (inside && line.rfind(key + ":", 0) == 0) {
      return std::stol(line.substr(key.size() + 1));
    }
  }
  return -1;
}

TEST(GuestRam, RamIsEligibleForHugePagesWhereTheHostHasThem) {
  std::ifstream knob("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::stringstream setting;
  setting << knob.rdbuf();
  if (!knob || setting.str().find("[deny]") != std::string::npos) GTEST_SKIP() << "no shmem THP on this host";
  if (geteuid() != 0) GTEST_SKIP() << "a tmpfs of its own needs CAP_SYS_ADMIN";
  GuestRam ram(64ull << 20);
  EXPECT_EQ(ram.backing(), "tmpfs huge=within_size");
  struct statfs fs {};
  ASSERT_EQ(fstatfs(ram.fd(), &fs), 0);
  EXPECT_EQ(fs.f_type, static_cast<decltype(fs.f_type)>(TMPFS_MAGIC));
  const std::uint8_t* host = ram.regions()[0].host;
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(host) % (2u << 20), 0u) << "KVM maps 2 MiB only for an aligned mapping";
  // Whatever the host's shmem_enabled (Debian: never, which leaves a memfd on 4 KiB pages).
  EXPECT_EQ(smaps_field(host, "THPeligible"), 1) << setting.str();
  // Dom0 services map the same fd and see the guest's bytes.
  auto page = ram.memory().translate(0x20'0000, 4096);
  ASSERT_TRUE(page);
  (*page)[5] = 0xa5;
  void* other = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, ram.fd(), 0x20'0000);
  ASSERT_NE(other, MAP_FAILED);
  EXPECT_EQ(static_cast<const std::uint8_t*>(other)[5], 0xa5);
  munmap(other, 4096);
}

}  // namespace
}  // namespace xpv::kvm
