// modules.dep parsing and load order (xpv::testbed, shared by `xpv testbed` and `xpv image`).
#include <gtest/gtest.h>

#include <stdexcept>

#include "xpv/testbed/kernel.h"

namespace {

using namespace xpv::testbed;

const char* const kDep =
    "kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko\n"
    "kernel/lib/crc16.ko:\n"
    "kernel/fs/mbcache.ko:\n"
    "kernel/fs/jbd2/jbd2.ko:\n"
    "kernel/drivers/block/xen-blkfront.ko:\n"
    "kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n"
    "kernel/drivers/virtio/virtio_ring.ko:\n"
    "kernel/drivers/virtio/virtio.ko:\n"
    "kernel/a.ko: kernel/b.ko\n"
    "kernel/b.ko: kernel/a.ko\n"
    "kernel/needs-ghost.ko: kernel/ghost.ko\n"
    "garbage line without colon\n";

TEST(Modules, NamesNormaliseDashes) {
  EXPECT_EQ(module_name("kernel/drivers/block/xen-blkfront.ko"), "xen_blkfront");
  EXPECT_EQ(module_name("kernel/fs/ext4/ext4.ko"), "ext4");
  EXPECT_EQ(module_name("x.ko.xz"), "x");
}

TEST(Modules, DependenciesFirstEachOnce) {
  const auto dep = parse_modules_dep(kDep);
  EXPECT_EQ(dep.at("ext4").deps.size(), 3u);
  EXPECT_EQ(dep.count("garbage line without colon"), 0u);
  const auto order = order_modules(dep, {"xen-blkfront", "virtio_blk", "ext4", "virtio"});
  const std::vector<std::string> want = {
      "kernel/drivers/block/xen-blkfront.ko", "kernel/drivers/virtio/virtio.ko",
      "kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/block/virtio_blk.ko",
      "kernel/lib/crc16.ko", "kernel/fs/mbcache.ko", "kernel/fs/jbd2/jbd2.ko", "kernel/fs/ext4/ext4.ko"};
  EXPECT_EQ(order, want);
}

TEST(Modules, UnknownModuleIsNamedWithItsRequester) {
  const auto dep = parse_modules_dep(kDep);
  try {
    order_modules(dep, {"needs_ghost"});
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("module ghost is not in"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("needed by needs_ghost"), std::string::npos) << e.what();
  }
  EXPECT_THROW(order_modules(dep, {"no_such"}), std::runtime_error);
}

TEST(Modules, LoopIsAnError) {
  EXPECT_THROW(order_modules(parse_modules_dep(kDep), {"a"}), std::runtime_error);
}

}  // namespace
