// Path canonicalisation and validation, permission parsing and access rules.
#include <gtest/gtest.h>

#include <string>

#include "xpv/xenbus/path.h"
#include "xpv/xenbus/perms.h"

using namespace xpv::xenbus;
using wire::Error;

namespace {
std::string canon(DomId d, std::string_view p, bool special = false, std::size_t max = 0) {
  auto r = canonicalize(d, p, special, max);
  return r ? *r : "!" + std::string(wire::error_name(r.error()));
}
}  // namespace

TEST(XenstorePath, AbsoluteAndRelative) {
  EXPECT_EQ(canon(0, "/"), "/");
  EXPECT_EQ(canon(0, "/a/b-c_D9"), "/a/b-c_D9");
  EXPECT_EQ(canon(3, "device/vbd"), "/local/domain/3/device/vbd");
  EXPECT_EQ(canon(0, "x"), "/local/domain/0/x");
}

TEST(XenstorePath, Rejections) {
  EXPECT_EQ(canon(0, ""), "!EINVAL");
  EXPECT_EQ(canon(0, "/a/"), "!EINVAL");
  EXPECT_EQ(canon(0, "/a//b"), "!EINVAL");
  EXPECT_EQ(canon(0, "/a b"), "!EINVAL");
  EXPECT_EQ(canon(0, "/a.b"), "!EINVAL");
  EXPECT_EQ(canon(0, "/a\nb"), "!EINVAL");
  EXPECT_EQ(canon(0, "/a@b"), "!EINVAL");
  EXPECT_EQ(canon(0, "@releaseDomain"), "!EINVAL") << "special paths are for watches only";
  EXPECT_EQ(canon(0, "@releaseDomain", true), "@releaseDomain");
  EXPECT_EQ(canon(0, "@bad name", true), "!EINVAL");
}

TEST(XenstorePath, LengthLimits) {
  std::string ok = "/" + std::string(3071, 'a');
  EXPECT_EQ(canon(0, ok), ok);
  EXPECT_EQ(canon(0, ok + "a"), "!EINVAL");
  // The path quota counts only the part below the domain's home.
  std::string rel(2048, 'b');
  EXPECT_EQ(canon(5, rel, false, 2048), "/local/domain/5/" + rel);
  EXPECT_EQ(canon(5, rel + "b", false, 2048), "!EINVAL");
  EXPECT_EQ(canon(5, "/x/" + std::string(2046, 'c'), false, 2048), "!EINVAL");
  EXPECT_EQ(canon(5, "/x/" + std::string(2045, 'c'), false, 2048), "/x/" + std::string(2045, 'c'));
}

TEST(XenstorePath, ParentBaseChild) {
  EXPECT_EQ(parent_path("/a/b"), "/a");
  EXPECT_EQ(parent_path("/a"), "/");
  EXPECT_EQ(parent_path("/"), "/");
  EXPECT_EQ(base_name("/a/b"), "b");
  EXPECT_EQ(base_name("/"), "");
  EXPECT_EQ(child_path("/", "a"), "/a");
  EXPECT_EQ(child_path("/a", "b"), "/a/b");
  EXPECT_TRUE(is_same_or_below("/a/b", "/a"));
  EXPECT_TRUE(is_same_or_below("/a", "/a"));
  EXPECT_TRUE(is_same_or_below("/a", "/"));
  EXPECT_FALSE(is_same_or_below("/ab", "/a"));
  EXPECT_FALSE(is_same_or_below("/a", "/a/b"));
  EXPECT_FALSE(is_same_or_below("@releaseDomain", "/"));
}

TEST(XenstorePath, ParseUint) {
  EXPECT_EQ(*parse_uint("0"), 0u);
  EXPECT_EQ(*parse_uint("4294967295"), 4294967295u);
  EXPECT_FALSE(parse_uint("4294967296"));
  EXPECT_FALSE(parse_uint(""));
  EXPECT_FALSE(parse_uint("-1"));
  EXPECT_FALSE(parse_uint("1a"));
  EXPECT_FALSE(parse_uint(" 1"));
}

TEST(XenstorePerms, ParseFormatRoundTrip) {
  for (std::string s : {"n0", "r1", "w2", "b32751"}) {
    auto p = parse_perm(s);
    ASSERT_TRUE(p) << s;
    EXPECT_EQ(format_perm(*p), s);
  }
  EXPECT_EQ(parse_perm("b7")->bits, kPermRead | kPermWrite);
  EXPECT_FALSE(parse_perm("x1"));
  EXPECT_FALSE(parse_perm("r"));
  EXPECT_FALSE(parse_perm("r-1"));
  EXPECT_FALSE(parse_perm("r32752")) << "DOMID_FIRST_RESERVED";
  EXPECT_FALSE(parse_perm(""));
}

TEST(XenstorePerms, AccessRules) {
  PermList perms{{5, kPermRead}, {7, kPermWrite}, {9, kPermNone}};
  EXPECT_EQ(access_for({0, true, {}}, perms), kPermRead | kPermWrite) << "dom0";
  EXPECT_EQ(access_for({5, false, {}}, perms), kPermRead | kPermWrite) << "owner";
  EXPECT_EQ(access_for({7, false, {}}, perms), kPermWrite) << "own entry";
  EXPECT_EQ(access_for({9, false, {}}, perms), kPermNone) << "own entry beats default";
  EXPECT_EQ(access_for({8, false, {}}, perms), kPermRead) << "default";
  EXPECT_EQ(access_for({8, false, 5}, perms), kPermRead | kPermWrite) << "target owns";
  EXPECT_EQ(access_for({8, false, 7}, perms), kPermWrite) << "target's entry";
}
