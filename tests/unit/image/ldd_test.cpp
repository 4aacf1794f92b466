// parse_ldd: libraries with paths, ld-linux, vdso skipped, "not found" reported.
#include <gtest/gtest.h>

#include "xpv/image/ldd.h"

namespace {

using xpv::image::parse_ldd;

TEST(Ldd, ParsesPathsInOrderOnce) {
  const auto r = parse_ldd(
      "\tlinux-vdso.so.1 (0x00007ffd)\n"
      "\tlibiperf.so.0 => /lib/x86_64-linux-gnu/libiperf.so.0 (0x00007f01)\n"
      "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f02)\n"
      "\tlibceph-common.so.2 => /usr/lib/x86_64-linux-gnu/ceph/libceph-common.so.2 (0x1)\n"
      "\t/lib64/ld-linux-x86-64.so.2 (0x00007f03)\n"
      "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f02)\n");
  const std::vector<std::string> want = {"/lib/x86_64-linux-gnu/libiperf.so.0",
                                         "/lib/x86_64-linux-gnu/libc.so.6",
                                         "/usr/lib/x86_64-linux-gnu/ceph/libceph-common.so.2",
                                         "/lib64/ld-linux-x86-64.so.2"};
  EXPECT_EQ(r.paths, want);
  EXPECT_TRUE(r.missing.empty());
}

TEST(Ldd, ReportsMissingAndIgnoresStatic) {
  const auto r = parse_ldd("\tlibgone.so.1 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n");
  EXPECT_EQ(r.missing, std::vector<std::string>{"libgone.so.1"});
  EXPECT_EQ(r.paths, std::vector<std::string>{"/lib/libc.so.6"});
  EXPECT_TRUE(parse_ldd("\tstatically linked\n").paths.empty());
  EXPECT_TRUE(parse_ldd("\tnot a dynamic executable\n").paths.empty());
  EXPECT_TRUE(parse_ldd("").paths.empty());
}

}  // namespace
