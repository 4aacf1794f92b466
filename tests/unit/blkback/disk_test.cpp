#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <stdexcept>

#include "xpv/test/temp_dir.h"
#include "xpv/blkback/disk.h"

namespace xpv::blkback {
namespace {

void make_file(const std::string& path, off_t size) {
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, size), 0);
  ::close(fd);
}

std::string open_error(const std::string& path, bool readonly) {
  try {
    Disk::open(path, readonly);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Disk, RawImageGeometry) {
  test::TempDir dir;
  make_file(dir.file("a.img"), 8 << 20);
  Disk d = Disk::open(dir.file("a.img"), false);
  EXPECT_EQ(d.info().sectors, (8u << 20) / 512);
  EXPECT_FALSE(d.info().readonly);
  EXPECT_FALSE(d.info().block_device);
  EXPECT_TRUE(d.info().discard);
  EXPECT_EQ(d.info().logical_block_size, 512u);
  EXPECT_GE(d.fd(), 0);
}

TEST(Disk, ReadOnlyOpenRefusesWritesAndOffersNoDiscard) {
  test::TempDir dir;
  make_file(dir.file("a.img"), 1 << 20);
  Disk d = Disk::open(dir.file("a.img"), true);
  EXPECT_TRUE(d.info().readonly);
  EXPECT_FALSE(d.info().discard);
  char buf[512] = {};
  EXPECT_LT(::pwrite(d.fd(), buf, sizeof buf, 0), 0);
}

TEST(Disk, MissingImageNamesThePath) {
  test::TempDir dir;
  std::string msg = open_error(dir.file("nope.img"), false);
  EXPECT_NE(msg.find("nope.img"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
}

TEST(Disk, SizeMustBeAMultipleOf512) {
  test::TempDir dir;
  make_file(dir.file("odd.img"), 1000);
  EXPECT_NE(open_error(dir.file("odd.img"), false).find("multiple of 512"), std::string::npos);
  make_file(dir.file("empty.img"), 0);
  EXPECT_NE(open_error(dir.file("empty.img"), false).find("multiple of 512"), std::string::npos);
}

TEST(Disk, DirectoryIsRefused) {
  test::TempDir dir;
  EXPECT_FALSE(open_error(dir.path().string(), true).empty());
}

}  // namespace
}  // namespace xpv::blkback
