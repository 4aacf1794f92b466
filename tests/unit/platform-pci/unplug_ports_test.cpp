#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "xpv/kvm/io_bus.h"
#include "xpv/platform_pci/unplug_ports.h"

namespace xpv::platform_pci {
namespace {

// The guest's port instructions, through a real PIO bus with the device at 0x10.
class Guest {
 public:
  explicit Guest(UnplugPorts& dev) : bus_("pio") {
    auto r = bus_.add(UnplugPorts::kBase, UnplugPorts::kLength, &dev, "xen-unplug");
    EXPECT_TRUE(r);
  }
  std::uint32_t in(std::uint16_t port, unsigned size) {
    std::uint8_t d[8] = {};
    bus_.read(port, std::span(d, size));
    std::uint32_t v = 0;
    for (unsigned i = 0; i < size && i < 4; ++i) v |= std::uint32_t{d[i]} << (8 * i);
    return v;
  }
  std::uint8_t inb(std::uint16_t p) { return static_cast<std::uint8_t>(in(p, 1)); }
  std::uint16_t inw(std::uint16_t p) { return static_cast<std::uint16_t>(in(p, 2)); }
  void out(std::uint16_t port, unsigned size, std::uint32_t v) {
    std::uint8_t d[8] = {};
    for (unsigned i = 0; i < size && i < 4; ++i) d[i] = static_cast<std::uint8_t>(v >> (8 * i));
    bus_.write(port, std::span<const std::uint8_t>(d, size));
  }
  void outb(std::uint8_t v, std::uint16_t p) { out(p, 1, v); }
  void outw(std::uint16_t v, std::uint16_t p) { out(p, 2, v); }
  void outl(std::uint32_t v, std::uint16_t p) { out(p, 4, v); }

  // arch/x86/xen/platform-pci-unplug.c: check_platform_magic() then the unplug write. Returns
  // false where Linux would give up (wrong magic, unknown version, blacklisted).
  bool linux_unplug(std::uint16_t mask) {
    if (inw(0x10) != kMagic) return false;
    if (inb(0x12) != 1) return false;
    outw(kProductLinux, 0x12);
    outl(1, 0x10);
    if (inw(0x10) != kMagic) return false;
    outw(mask, 0x10);
    return true;
  }
  kvm::IoBus bus_;
};

struct Recorder {
  std::mutex mu;
  std::vector<std::uint16_t> masks;
  std::vector<std::string> lines;
  UnplugConfig config(std::vector<BlacklistEntry> blacklist = {}) {
    UnplugConfig c;
    c.blacklist = std::move(blacklist);
    c.on_unplug = [this](std::uint16_t m) {
      std::lock_guard lk(mu);
      masks.push_back(m);
    };
    c.on_guest_log = [this](std::string_view l) {
      std::lock_guard lk(mu);
      lines.emplace_back(l);
    };
    return c;
  }
};

TEST(UnplugPorts, LinuxSequenceRecordsProductBuildAndMask) {
  Recorder rec;
  UnplugPorts dev(rec.config());
  Guest g(dev);
  EXPECT_EQ(g.inw(0x10), 0x49d2);
  EXPECT_EQ(g.inb(0x12), 1);
  EXPECT_FALSE(dev.product());
  g.outw(0x0003, 0x12);
  EXPECT_EQ(dev.product(), std::optional<std::uint16_t>(3));
  g.outl(0x0001, 0x10);
  EXPECT_EQ(dev.build(), std::optional<std::uint32_t>(1));
  EXPECT_EQ(g.inw(0x10), 0x49d2);
  EXPECT_EQ(dev.unplugged_mask(), 0);
  g.outw(kUnplugIdeScsiDisks | kUnplugNics, 0x10);
  EXPECT_EQ(dev.unplugged_mask(), 0x3);
  EXPECT_FALSE(dev.blacklisted());
  EXPECT_EQ(rec.masks, std::vector<std::uint16_t>{0x3});
  const auto s = dev.stats();
  EXPECT_EQ(s.magic_reads, 2u);
  EXPECT_EQ(s.unplug_writes, 1u);
  EXPECT_EQ(s.refused_unplugs, 0u);
  EXPECT_EQ(s.ignored, 0u);
}

TEST(UnplugPorts, TheHelperRunsTheWholeSequence) {
  Recorder rec;
  UnplugPorts dev(rec.config());
  Guest g(dev);
  EXPECT_TRUE(g.linux_unplug(0x000b));
  EXPECT_EQ(dev.unplugged_mask(), 0x000b);
}

TEST(UnplugPorts, MasksAccumulateAndEachIsReported) {
  Recorder rec;
  UnplugPorts dev(rec.config());
  Guest g(dev);
  g.outw(kUnplugNics, 0x10);  // protocol version 0 style: straight to the mask
  g.outw(kUnplugNvme, 0x10);
  g.outw(0, 0x10);
  EXPECT_EQ(dev.unplugged_mask(), kUnplugNics | kUnplugNvme);
  EXPECT_EQ(rec.masks, (std::vector<std::uint16_t>{kUnplugNics, kUnplugNvme, 0}));
  EXPECT_EQ(dev.stats().unplug_writes, 3u);
}

TEST(UnplugPorts, BlacklistedProductAndBuildFlipsTheMagicAndRefusesTheMask) {
  Recorder rec;
  UnplugPorts dev(rec.config({BlacklistEntry{kProductLinux, 1}}));
  Guest g(dev);
  EXPECT_FALSE(g.linux_unplug(0x3));
  EXPECT_TRUE(dev.blacklisted());
  EXPECT_EQ(g.inw(0x10), 0xd249);
  g.outw(0x3, 0x10);  // a driver that ignores the verdict: not recorded
  EXPECT_EQ(dev.unplugged_mask(), 0);
  EXPECT_TRUE(rec.masks.empty());
  EXPECT_EQ(dev.stats().refused_unplugs, 1u);
  // A later build that is not listed clears the verdict.
  g.outl(2, 0x10);
  EXPECT_FALSE(dev.blacklisted());
  EXPECT_EQ(g.inw(0x10), 0x49d2);
}

TEST(UnplugPorts, BlacklistMatching) {
  {
    UnplugPorts dev(UnplugConfig{{BlacklistEntry{kProductLinux, std::nullopt}}, {}, {}});
    Guest g(dev);
    EXPECT_FALSE(g.linux_unplug(0x3));  // every build of product 3
    EXPECT_EQ(dev.unplugged_mask(), 0);
  }
  {
    UnplugPorts dev(UnplugConfig{{BlacklistEntry{kProductLinux, 2}}, {}, {}});
    Guest g(dev);
    EXPECT_TRUE(g.linux_unplug(0x3));  // Linux writes build 1
    EXPECT_EQ(dev.unplugged_mask(), 0x3);
  }
  {
    UnplugPorts dev(UnplugConfig{{BlacklistEntry{kProductCitrixWindows, std::nullopt}}, {}, {}});
    Guest g(dev);
    EXPECT_TRUE(g.linux_unplug(0x1));
  }
  {
    UnplugPorts dev(UnplugConfig{{BlacklistEntry{0, std::nullopt}}, {}, {}});
    Guest g(dev);
    g.outl(7, 0x10);  // a build number without a product: nothing to match
    EXPECT_FALSE(dev.blacklisted());
    EXPECT_EQ(g.inw(0x10), 0x49d2);
  }
}

TEST(UnplugPorts, DescribesTheMaskBits) {
  EXPECT_EQ(describe_unplug_mask(0), "nothing");
  EXPECT_EQ(describe_unplug_mask(0x3), "IDE/SCSI disks, NICs");
  EXPECT_EQ(describe_unplug_mask(0xf), "IDE/SCSI disks, NICs, aux IDE disks, NVMe disks");
  EXPECT_EQ(describe_unplug_mask(0x8), "NVMe disks");
  EXPECT_EQ(describe_unplug_mask(0x31), "IDE/SCSI disks, unknown bits 0x30");
  EXPECT_EQ(describe_unplug_mask(0x8000), "unknown bits 0x8000");
}

TEST(UnplugPorts, PlatformFlagsByteKeepsTheRomLockBitOnly) {
  UnplugPorts dev;
  Guest g(dev);
  EXPECT_EQ(g.inb(0x10), 0);
  g.outb(0xff, 0x10);
  EXPECT_EQ(g.inb(0x10), kFlagRomLock);
  EXPECT_EQ(dev.platform_flags(), kFlagRomLock);
  EXPECT_EQ(g.inw(0x10), 0x49d2);  // the 16-bit magic is unaffected
  g.outb(0x00, 0x10);
  EXPECT_EQ(dev.platform_flags(), 0);
  EXPECT_EQ(dev.unplugged_mask(), 0);  // a byte write is not an unplug
}

TEST(UnplugPorts, GuestLogLines) {
  Recorder rec;
  UnplugPorts dev(rec.config());
  Guest g(dev);
  for (char c : std::string("hello xpv\n")) g.outb(static_cast<std::uint8_t>(c), 0x12);
  for (std::uint8_t c : {std::uint8_t{'a'}, std::uint8_t{0x07}, std::uint8_t{0xc3}, std::uint8_t{'\r'},
                         std::uint8_t{'\n'}}) {
    g.outb(c, 0x12);
  }
  EXPECT_EQ(rec.lines, (std::vector<std::string>{"hello xpv", "a..."}));
  // A line without '\n' is cut at kLogLineMax bytes.
  for (std::size_t i = 0; i < UnplugPorts::kLogLineMax + 3; ++i) g.outb('x', 0x12);
  ASSERT_EQ(rec.lines.size(), 3u);
  EXPECT_EQ(rec.lines[2], std::string(UnplugPorts::kLogLineMax, 'x'));
  g.outb('\n', 0x12);
  ASSERT_EQ(rec.lines.size(), 4u);
  EXPECT_EQ(rec.lines[3], "xxx");
  EXPECT_EQ(dev.stats().log_lines, 4u);
  EXPECT_EQ(dev.product(), std::nullopt);  // byte writes to 0x12 are not product numbers
}

TEST(UnplugPorts, GuestLogWithoutCallbackGoesToTheLog) {
  UnplugPorts dev;  // spdlog path, rate-limited; must not crash or block
  Guest g(dev);
  for (int i = 0; i < 50; ++i) {
    g.outb('z', 0x12);
    g.outb('\n', 0x12);
  }
  EXPECT_EQ(dev.stats().log_lines, 50u);
}

TEST(UnplugPorts, UndefinedSizesAndOffsetsReadOnesAndChangeNothing) {
  Recorder rec;
  UnplugPorts dev(rec.config());
  Guest g(dev);
  EXPECT_EQ(g.in(0x10, 4), 0xffff'ffffu);
  EXPECT_EQ(g.in(0x12, 2), 0xffffu);
  EXPECT_EQ(g.in(0x11, 1), 0xffu);
  EXPECT_EQ(g.in(0x13, 1), 0xffu);
  EXPECT_EQ(g.in(0x11, 2), 0xffffu);
  EXPECT_EQ(g.in(0x1f, 1), 0xffu);
  EXPECT_EQ(g.in(0x10, 8), 0xffff'ffffu);
  g.out(0x11, 1, 0xff);
  g.out(0x11, 2, 0xffff);
  g.out(0x13, 1, 0xff);
  g.out(0x12, 4, 0xffff'ffffu);
  g.out(0x14, 2, 0xffff);
  g.out(0x10, 8, 0xffff'ffffu);
  EXPECT_EQ(dev.unplugged_mask(), 0);
  EXPECT_EQ(dev.product(), std::nullopt);
  EXPECT_EQ(dev.build(), std::nullopt);
  EXPECT_EQ(dev.platform_flags(), 0);
  EXPECT_TRUE(rec.masks.empty());
  EXPECT_TRUE(rec.lines.empty());
  EXPECT_EQ(dev.stats().ignored, 13u);
  EXPECT_EQ(dev.stats().magic_reads, 0u);
  EXPECT_EQ(g.bus_.unclaimed(), 0u);  // all of 0x10..0x1f is claimed
  EXPECT_EQ(g.in(0x20, 1), 0xffu);     // and nothing past it
  EXPECT_EQ(g.bus_.unclaimed(), 1u);
}

TEST(UnplugPorts, ConcurrentGuestsFromManyVcpus) {
  Recorder rec;
  UnplugPorts dev(rec.config());
  constexpr unsigned kThreads = 4, kIters = 500;
  std::atomic<unsigned> failures{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Guest g(dev);  // a bus per thread, one device: what vCPU threads do
      for (unsigned i = 0; i < kIters; ++i) {
        if (!g.linux_unplug(static_cast<std::uint16_t>(1u << t))) failures.fetch_add(1);
        g.outb('0' + static_cast<std::uint8_t>(t), 0x12);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_EQ(dev.unplugged_mask(), 0xf);
  const auto s = dev.stats();
  EXPECT_EQ(s.magic_reads, 2u * kThreads * kIters);
  EXPECT_EQ(s.unplug_writes, kThreads * kIters);
  EXPECT_EQ(rec.masks.size(), kThreads * kIters);
  // kThreads * kIters log bytes without '\n': full lines of kLogLineMax each.
  EXPECT_EQ(s.log_lines, kThreads * kIters / UnplugPorts::kLogLineMax);
  EXPECT_EQ(dev.product(), std::optional<std::uint16_t>(kProductLinux));
  EXPECT_EQ(dev.build(), std::optional<std::uint32_t>(1));
}

}  // namespace
}  // namespace xpv::platform_pci
