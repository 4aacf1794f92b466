// CpioWriter: exact newc records, parents added, bad paths refused.
#include <gtest/gtest.h>

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "xpv/image/cpio.h"

namespace {

struct Entry {
  unsigned ino, mode, uid, gid, nlink, mtime, size, rmajor, rminor;
  std::string name, data;
};

unsigned hex(const std::string& s, size_t off) { return static_cast<unsigned>(std::stoul(s.substr(off, 8), nullptr, 16)); }

// A strict newc reader for the test: checks magic and 4-byte alignment of names and data.
std::vector<Entry> parse(const std::string& a) {
  std::vector<Entry> out;
  size_t off = 0;
  for (;;) {
    EXPECT_EQ(off % 4, 0u);
    if (off + 110 > a.size()) throw std::runtime_error("truncated header");
    if (a.compare(off, 6, "070701") != 0) throw std::runtime_error("bad magic");
    Entry e{};
    e.ino = hex(a, off + 6);
    e.mode = hex(a, off + 14);
    e.uid = hex(a, off + 22);
    e.gid = hex(a, off + 30);
    e.nlink = hex(a, off + 38);
    e.mtime = hex(a, off + 46);
    e.size = hex(a, off + 54);
    e.rmajor = hex(a, off + 78);
    e.rminor = hex(a, off + 86);
    const unsigned namesize = hex(a, off + 94);
    e.name = a.substr(off + 110, namesize - 1);
    EXPECT_EQ(a[off + 110 + namesize - 1], '\0');
    off = (off + 110 + namesize + 3) & ~size_t{3};
    e.data = a.substr(off, e.size);
    off = (off + e.size + 3) & ~size_t{3};
    if (e.name == "TRAILER!!!") {
      EXPECT_EQ(off, a.size());
      return out;
    }
    out.push_back(e);
  }
}

TEST(Cpio, WritesNewcRecordsWithParentsFirst) {
  std::ostringstream s;
  xpv::image::CpioWriter w(s);
  w.file("/bin/busybox", "abcde", 0755);
  w.char_dev("dev/console", 0600, 5, 1);
  w.symlink("bin/sh", "busybox");
  w.dir("lib/modules/6.1/kernel");
  w.file("lib/modules/6.1/kernel/x.ko", "");
  w.finish();
  const auto e = parse(s.str());
  ASSERT_EQ(e.size(), 10u);
  const std::vector<std::string> names = {"bin", "bin/busybox", "dev", "dev/console", "bin/sh", "lib",
                                          "lib/modules", "lib/modules/6.1", "lib/modules/6.1/kernel",
                                          "lib/modules/6.1/kernel/x.ko"};
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(e[i].name, names[i]) << i;
  EXPECT_EQ(e[0].mode, 040755u);
  EXPECT_EQ(e[0].nlink, 2u);
  EXPECT_EQ(e[1].mode, 0100755u);
  EXPECT_EQ(e[1].data, "abcde");
  EXPECT_EQ(e[1].uid, 0u);
  EXPECT_EQ(e[1].mtime, 0u);
  EXPECT_EQ(e[3].mode, 020600u);
  EXPECT_EQ(e[3].rmajor, 5u);
  EXPECT_EQ(e[3].rminor, 1u);
  EXPECT_EQ(e[4].mode, 0120777u);
  EXPECT_EQ(e[4].data, "busybox");
  EXPECT_EQ(e[9].mode, 0100644u);
  EXPECT_EQ(e[9].size, 0u);
  for (size_t i = 0; i < e.size(); ++i) EXPECT_EQ(e[i].ino, i + 1);
}

TEST(Cpio, EmptyFileAndTrailerOnly) {
  std::ostringstream s;
  xpv::image::CpioWriter w(s);
  w.finish();
  EXPECT_TRUE(parse(s.str()).empty());
  EXPECT_EQ(s.str().size(), 124u);  // 110 + "TRAILER!!!\0" (11) padded to 124
}

TEST(Cpio, RefusesBadPaths) {
  std::ostringstream s;
  xpv::image::CpioWriter w(s);
  EXPECT_THROW(w.file("", "x"), std::invalid_argument);
  EXPECT_THROW(w.file("/", "x"), std::invalid_argument);
  EXPECT_THROW(w.file("../etc/passwd", "x"), std::invalid_argument);
  EXPECT_THROW(w.file("a/../../b", "x"), std::invalid_argument);
  EXPECT_THROW(w.file("a/..", "x"), std::invalid_argument);
  EXPECT_THROW(w.symlink("a", ""), std::invalid_argument);
  w.file("init", "x");
  EXPECT_THROW(w.file("/init", "y"), std::invalid_argument);
  EXPECT_THROW(w.dir("init"), std::invalid_argument);
  w.finish();
  EXPECT_THROW(w.file("late", "x"), std::logic_error);
}

}  // namespace
