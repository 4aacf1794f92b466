// queue_layout: where a multi-queue frontend's nodes are, by Linux's backends' rule.
#include "xpv/xenbus/peer_value.h"
#include "xpv/xenbus/queue_layout.h"

#include <gtest/gtest.h>

namespace xpv::xenbus {
namespace {

const std::string kFe = "/local/domain/3/device/vif/0";

TEST(QueueLayout, NoKeyOrOneMeansOneQueueInTheFrontendDirectory) {
  for (const auto& v : {std::optional<std::string>{}, std::optional<std::string>{"1"}}) {
    auto l = queue_layout(v, 4);
    ASSERT_TRUE(l);
    EXPECT_EQ(l->queues, 1u);
    EXPECT_FALSE(l->per_queue_dirs);
    EXPECT_EQ(l->dir(kFe, 0), kFe) << "Linux's netfront writes the key = 1 with flat nodes";
  }
}

TEST(QueueLayout, SeveralQueuesHaveTheirOwnDirectories) {
  auto l = queue_layout("3", 4);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->queues, 3u);
  EXPECT_EQ(l->dir(kFe, 0), kFe + "/queue-0");
  EXPECT_EQ(l->dir(kFe, 2), kFe + "/queue-2");
}

TEST(QueueLayout, BadCountsAreRefusedWithTheValue) {
  for (const char* v : {"0", "5", "", "2x", "-1", "99999999999", " 2"}) {
    auto l = queue_layout(std::string(v), 4);
    ASSERT_FALSE(l) << v;
    EXPECT_EQ(l.error(), "\"" + std::string(v) + "\": expected 1..4");
  }
}

// A frontend's value in a message is quoted and escaped, and cut after kShownBytes bytes: a
// newline cannot start a forged log line, 4 KiB of garbage does not fill the log or the error node.
TEST(PeerValue, IsQuotedEscapedAndCut) {
  EXPECT_EQ(shown("x86_64-abi"), "\"x86_64-abi\"");
  EXPECT_EQ(shown("2\n[info] forged"), "\"2\\n[info] forged\"");
  EXPECT_EQ(shown(std::string("a\0\x7f\xff\"b", 6)), "\"a\\x00\\x7f\\xff\\\"b\"");
  const std::string big(4096, 'z');
  EXPECT_EQ(shown(big), "\"" + std::string(kShownBytes, 'z') + "\"... (4096 bytes)");
  EXPECT_EQ(shown(std::string(kShownBytes, 'y')), "\"" + std::string(kShownBytes, 'y') + "\"");
  EXPECT_EQ(shown("abcdef", 3), "\"abc\"... (6 bytes)");
  const auto l = queue_layout(std::string("1\n") + big, 4);
  ASSERT_FALSE(l);
  EXPECT_LT(l.error().size(), 120u);
  EXPECT_EQ(l.error().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace xpv::xenbus
