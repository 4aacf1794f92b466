// The pure store core driven message by message, as a transport would, through fake sinks.
#include <gtest/gtest.h>

#include <algorithm>

#include <string>
#include <vector>

#include "fake_conn.h"
#include "xpv/xenbus/store.h"

using namespace xpv::xenbus;
using wire::MsgType;
using xpv::xenbus::test::FakeConn;
using xpv::xenbus::test::kOK;
using xpv::xenbus::test::z;

namespace {

std::string s(std::string_view v) { return std::string(v); }

class StoreTest : public ::testing::Test {
 protected:
  StoreTest() : store_(make_quotas()) {
    c0_ = store_.connect(0, d0_);
    EXPECT_TRUE(store_.introduce(1, 100, 1));
    EXPECT_TRUE(store_.introduce(2, 200, 2));
    c1_ = store_.connect(1, d1_);
    c2_ = store_.connect(2, d2_);
    d0_.events.clear();
  }
  static Quotas make_quotas() {
    Quotas q;
    q.nodes = 20;
    q.node_size = 64;
    q.watches = 4;
    q.transactions = 2;
    q.perms = 3;
    q.path_max = 64;
    return q;
  }
  std::string req(ConnId c, FakeConn& f, MsgType t, std::string payload, std::uint32_t tx = 0) {
    wire::Header h{static_cast<std::uint32_t>(t), ++req_id_, tx,
                   static_cast<std::uint32_t>(payload.size())};
    std::size_t before = f.replies.size();
    store_.handle(c, h, payload);
    EXPECT_EQ(f.replies.size(), before + 1) << "exactly one reply";
    if (f.replies.size() != before + 1) return "<no reply>";
    return f.replies.back();
  }
  // Convenience wrappers for dom0 (c0) and any connection.
  std::string write(ConnId c, FakeConn& f, std::string_view p, std::string_view v,
                    std::uint32_t tx = 0) {
    return req(c, f, MsgType::write, z(p) + s(v), tx);
  }
  std::string read(ConnId c, FakeConn& f, std::string_view p, std::uint32_t tx = 0) {
    return req(c, f, MsgType::read, z(p), tx);
  }
  std::string dir(ConnId c, FakeConn& f, std::string_view p, std::uint32_t tx = 0) {
    return req(c, f, MsgType::directory, z(p), tx);
  }
  std::string rm(ConnId c, FakeConn& f, std::string_view p, std::uint32_t tx = 0) {
    return req(c, f, MsgType::rm, z(p), tx);
  }
  std::string perms(ConnId c, FakeConn& f, std::string_view p) {
    return req(c, f, MsgType::get_perms, z(p));
  }
  std::string setperms(ConnId c, FakeConn& f, std::string_view p,
                       std::initializer_list<std::string_view> ps, std::uint32_t tx = 0) {
    std::string pl = z(p);
    for (auto x : ps) pl += z(x);
    return req(c, f, MsgType::set_perms, pl, tx);
  }
  std::string watch(ConnId c, FakeConn& f, std::string_view p, std::string_view tok) {
    return req(c, f, MsgType::watch, z(p) + z(tok));
  }
  std::uint32_t start(ConnId c, FakeConn& f) {
    std::string r = req(c, f, MsgType::transaction_start, z(""));
    return static_cast<std::uint32_t>(std::stoul(r));
  }
  std::string end(ConnId c, FakeConn& f, std::uint32_t tx, bool commit) {
    return req(c, f, MsgType::transaction_end, z(commit ? "T" : "F"), tx);
  }

  Store store_;
  FakeConn d0_, d1_, d2_;
  ConnId c0_ = 0, c1_ = 0, c2_ = 0;
  std::uint32_t req_id_ = 0;
};

}  // namespace

TEST_F(StoreTest, InitialTree) {
  EXPECT_EQ(dir(c0_, d0_, "/"), z("tool"));
  EXPECT_EQ(dir(c0_, d0_, "/tool"), z("xenstored"));
  EXPECT_EQ(read(c0_, d0_, "/tool/xenstored"), "");
  EXPECT_EQ(perms(c0_, d0_, "/"), z("n0"));
  EXPECT_EQ(store_.node_count(), 3u);
}

TEST_F(StoreTest, ReplyEchoesHeader) {
  wire::Header h{static_cast<std::uint32_t>(MsgType::read), 4242, 0, 3};
  store_.handle(c0_, h, z("/a"));
  ASSERT_EQ(d0_.headers.size(), 1u);
  EXPECT_EQ(d0_.headers[0].type, static_cast<std::uint32_t>(MsgType::error));
  EXPECT_EQ(d0_.headers[0].req_id, 4242u);
  EXPECT_EQ(d0_.headers[0].len, 7u);  // "ENOENT\0"
}

TEST_F(StoreTest, WriteReadRoundTripWithImplicitParents) {
  EXPECT_EQ(write(c0_, d0_, "/a/b/c", "v1"), kOK);
  EXPECT_EQ(read(c0_, d0_, "/a/b/c"), "v1");
  EXPECT_EQ(read(c0_, d0_, "/a/b"), "");
  EXPECT_EQ(dir(c0_, d0_, "/"), z("tool") + z("a"));
  EXPECT_EQ(dir(c0_, d0_, "/a"), z("b"));
  EXPECT_EQ(write(c0_, d0_, "/a/b/c", std::string("bin\0ary", 7)), kOK);
  EXPECT_EQ(read(c0_, d0_, "/a/b/c"), std::string("bin\0ary", 7));
  EXPECT_EQ(write(c0_, d0_, "/a/b/d", ""), kOK);
  EXPECT_EQ(dir(c0_, d0_, "/a/b"), z("c") + z("d")) << "creation order";
  EXPECT_EQ(store_.node_count(), 7u);
}

TEST_F(StoreTest, ErrorsForBadPathsAndMissingNodes) {
  EXPECT_EQ(read(c0_, d0_, "/nope"), "!ENOENT");
  EXPECT_EQ(read(c0_, d0_, "/a//b"), "!EINVAL");
  EXPECT_EQ(read(c0_, d0_, "/a/"), "!EINVAL");
  EXPECT_EQ(write(c0_, d0_, "/a b", "x"), "!EINVAL");
  EXPECT_EQ(write(c0_, d0_, "@releaseDomain", "x"), "!EINVAL");
  EXPECT_EQ(dir(c0_, d0_, "/nope"), "!ENOENT");
  EXPECT_EQ(perms(c0_, d0_, "/nope"), "!ENOENT");
  EXPECT_EQ(req(c0_, d0_, MsgType::read, "/a"), "!EINVAL") << "missing NUL";
  EXPECT_EQ(req(c0_, d0_, MsgType::watch_event, z("/a") + z("t")), "!ENOSYS");
  EXPECT_EQ(req(c0_, d0_, static_cast<MsgType>(99), z("/a")), "!ENOSYS");
  EXPECT_EQ(read(c0_, d0_, "/a", 77), "!ENOENT") << "unknown transaction";
}

TEST_F(StoreTest, RelativePathsResolveUnderDomainHome) {
  EXPECT_EQ(req(c0_, d0_, MsgType::mkdir, z("/local/domain/1")), kOK);
  EXPECT_EQ(setperms(c0_, d0_, "/local/domain/1", {"n1"}), kOK);
  EXPECT_EQ(write(c1_, d1_, "data/x", "42"), kOK);
  EXPECT_EQ(read(c0_, d0_, "/local/domain/1/data/x"), "42");
  EXPECT_EQ(read(c1_, d1_, "data/x"), "42");
  EXPECT_EQ(perms(c0_, d0_, "/local/domain/1/data/x"), z("n1")) << "domain owns what it creates";
}

TEST_F(StoreTest, MkdirIsIdempotentAndRmSemantics) {
  EXPECT_EQ(req(c0_, d0_, MsgType::mkdir, z("/m/n")), kOK);
  EXPECT_EQ(write(c0_, d0_, "/m/n", "keep"), kOK);
  EXPECT_EQ(req(c0_, d0_, MsgType::mkdir, z("/m/n")), kOK);
  EXPECT_EQ(read(c0_, d0_, "/m/n"), "keep") << "mkdir on an existing node changes nothing";
  EXPECT_EQ(rm(c0_, d0_, "/m/x"), kOK) << "absent node with existing parent";
  EXPECT_EQ(rm(c0_, d0_, "/q/x"), "!ENOENT") << "absent parent";
  EXPECT_EQ(rm(c0_, d0_, "/"), "!EINVAL");
  EXPECT_EQ(rm(c0_, d0_, "/m"), kOK);
  EXPECT_EQ(read(c0_, d0_, "/m/n"), "!ENOENT");
  EXPECT_EQ(dir(c0_, d0_, "/"), z("tool"));
  EXPECT_EQ(store_.node_count(), 3u);
}

TEST_F(StoreTest, PermissionsBetweenDomains) {
  EXPECT_EQ(write(c0_, d0_, "/local/domain/1/secret", "s1"), kOK);
  EXPECT_EQ(setperms(c0_, d0_, "/local/domain/1/secret", {"n1"}), kOK);
  EXPECT_EQ(write(c0_, d0_, "/local/domain/2/x", "s2"), kOK);
  EXPECT_EQ(setperms(c0_, d0_, "/local/domain/2/x", {"n2", "r1"}), kOK);
  // Owner reads and writes; dom2 cannot; dom0 always can.
  EXPECT_EQ(read(c1_, d1_, "/local/domain/1/secret"), "s1");
  EXPECT_EQ(read(c2_, d2_, "/local/domain/1/secret"), "!EACCES");
  EXPECT_EQ(write(c2_, d2_, "/local/domain/1/secret", "x"), "!EACCES");
  EXPECT_EQ(rm(c2_, d2_, "/local/domain/1/secret"), "!EACCES");
  EXPECT_EQ(perms(c2_, d2_, "/local/domain/1/secret"), "!EACCES");
  // An explicit r1 entry lets dom1 read dom2's node but not write it.
  EXPECT_EQ(read(c1_, d1_, "/local/domain/2/x"), "s2");
  EXPECT_EQ(write(c1_, d1_, "/local/domain/2/x", "y"), "!EACCES");
  // Missing node below an unreadable parent: EACCES, not ENOENT.
  EXPECT_EQ(read(c2_, d2_, "/local/domain/1/secret/none"), "!EACCES");
  EXPECT_EQ(read(c1_, d1_, "/local/domain/1/secret/none"), "!ENOENT");
  // Creating below a node one may not write.
  EXPECT_EQ(write(c2_, d2_, "/local/domain/1/secret/sub", "x"), "!EACCES");
  EXPECT_EQ(read(c0_, d0_, "/local/domain/1/secret"), "s1");
}

TEST_F(StoreTest, SetPermsRules) {
  EXPECT_EQ(write(c0_, d0_, "/local/domain/1/n", "v"), kOK);
  EXPECT_EQ(setperms(c0_, d0_, "/local/domain/1/n", {"b1"}), kOK);
  EXPECT_EQ(perms(c0_, d0_, "/local/domain/1/n"), z("b1"));
  EXPECT_EQ(setperms(c1_, d1_, "/local/domain/1/n", {"r1", "w2"}), kOK) << "owner may";
  EXPECT_EQ(perms(c1_, d1_, "/local/domain/1/n"), z("r1") + z("w2"));
  EXPECT_EQ(setperms(c2_, d2_, "/local/domain/1/n", {"n2"}), "!EACCES") << "non-owner";
  EXPECT_EQ(setperms(c1_, d1_, "/local/domain/1/n", {"n2"}), "!EPERM") << "give away";
  EXPECT_EQ(setperms(c1_, d1_, "/local/domain/1/n", {"n1", "r2", "r3", "r4"}), "!ENOSPC")
      << "perms quota 3";
  EXPECT_EQ(setperms(c0_, d0_, "/local/domain/1/n", {"x1"}), "!EINVAL");
  EXPECT_EQ(setperms(c0_, d0_, "/local/domain/1/none", {"n0"}), "!ENOENT");
  EXPECT_EQ(req(c0_, d0_, MsgType::set_perms, z("/local/domain/1/n")), "!EINVAL") << "no perms";
}

TEST_F(StoreTest, QuotasForDomains) {
  EXPECT_EQ(req(c0_, d0_, MsgType::mkdir, z("/local/domain/1")), kOK);
  EXPECT_EQ(setperms(c0_, d0_, "/local/domain/1", {"n1"}), kOK);
  EXPECT_EQ(write(c1_, d1_, "big", std::string(64, 'x')), kOK);
  EXPECT_EQ(write(c1_, d1_, "big", std::string(65, 'x')), "!ENOSPC") << "node-size 64";
  EXPECT_EQ(write(c0_, d0_, "/dom0big", std::string(4000, 'x')), kOK) << "dom0 exempt";
  EXPECT_EQ(read(c1_, d1_, std::string(49, 'p')), "!ENOENT") << "path-max 64 below home";
  EXPECT_EQ(read(c1_, d1_, std::string(65, 'p')), "!EINVAL");
  // nodes quota 20: dom1 owns /local/domain/1 and big already.
  std::uint32_t owned = store_.owned_nodes(1);
  EXPECT_EQ(owned, 2u);
  for (std::uint32_t i = owned; i < 20; ++i)
    ASSERT_EQ(write(c1_, d1_, "n" + std::to_string(i), "v"), kOK) << i;
  EXPECT_EQ(write(c1_, d1_, "one-too-many", "v"), "!ENOSPC");
  EXPECT_EQ(rm(c1_, d1_, "n19"), kOK);
  EXPECT_EQ(write(c1_, d1_, "one-more", "v"), kOK);
  EXPECT_EQ(store_.owned_nodes(1), 20u);
}

TEST_F(StoreTest, WatchesFireOnRegistrationAndOnChanges) {
  EXPECT_EQ(watch(c0_, d0_, "/w", "tok"), kOK);
  ASSERT_EQ(d0_.events, std::vector<std::string>{"/w|tok"}) << "fires once on registration";
  // Event comes after the OK reply.
  ASSERT_GE(d0_.headers.size(), 2u);
  EXPECT_EQ(d0_.headers[d0_.headers.size() - 2].type,
            static_cast<std::uint32_t>(MsgType::watch));
  d0_.events.clear();
  EXPECT_EQ(write(c0_, d0_, "/w/a/b", "1"), kOK);
  EXPECT_EQ(write(c0_, d0_, "/other", "1"), kOK);
  EXPECT_EQ(write(c0_, d0_, "/wx", "1"), kOK) << "sibling with common prefix";
  EXPECT_EQ(write(c0_, d0_, "/w", "2"), kOK);
  EXPECT_EQ(d0_.events, (std::vector<std::string>{"/w/a/b|tok", "/w|tok"}));
  EXPECT_EQ(watch(c0_, d0_, "/w", "tok"), "!EEXIST");
  EXPECT_EQ(req(c0_, d0_, MsgType::unwatch, z("/w") + z("tok")), kOK);
  EXPECT_EQ(req(c0_, d0_, MsgType::unwatch, z("/w") + z("tok")), "!ENOENT");
  d0_.events.clear();
  EXPECT_EQ(write(c0_, d0_, "/w", "3"), kOK);
  EXPECT_TRUE(d0_.events.empty());
}

TEST_F(StoreTest, RemovalFiresAncestorsAndWatchesInsideSubtree) {
  EXPECT_EQ(write(c0_, d0_, "/r/a/b", "1"), kOK);
  EXPECT_EQ(watch(c0_, d0_, "/r", "top"), kOK);
  EXPECT_EQ(watch(c0_, d0_, "/r/a/b", "leaf"), kOK);
  EXPECT_EQ(watch(c0_, d0_, "/r/a/zz", "ghost"), kOK);
  d0_.events.clear();
  EXPECT_EQ(rm(c0_, d0_, "/r/a"), kOK);
  EXPECT_EQ(d0_.events, (std::vector<std::string>{"/r/a|top", "/r/a/b|leaf"}));
}

TEST_F(StoreTest, RelativeWatchReportsRelativePaths) {
  EXPECT_EQ(req(c0_, d0_, MsgType::mkdir, z("/local/domain/1")), kOK);
  EXPECT_EQ(setperms(c0_, d0_, "/local/domain/1", {"n1"}), kOK);
  EXPECT_EQ(watch(c1_, d1_, "device", "t"), kOK);
  EXPECT_EQ(write(c0_, d0_, "/local/domain/1/device/vbd/0", "x"), kOK);
  EXPECT_EQ(d1_.events, (std::vector<std::string>{"device|t", "device/vbd/0|t"}));
}

TEST_F(StoreTest, WatchersOnlySeeWhatTheyMayRead) {
  EXPECT_EQ(watch(c2_, d2_, "/", "all"), kOK);
  d2_.events.clear();
  EXPECT_EQ(write(c0_, d0_, "/private", "x"), kOK);  // inherits n0 from "/"
  EXPECT_TRUE(d2_.events.empty());
  EXPECT_EQ(setperms(c0_, d0_, "/private", {"n0", "r2"}), kOK);
  EXPECT_EQ(d2_.events, std::vector<std::string>{"/private|all"});
}

TEST_F(StoreTest, WatchQuotaAndSpecialWatches) {
  for (int i = 0; i < 4; ++i) EXPECT_EQ(watch(c1_, d1_, "/q" + std::to_string(i), "t"), kOK);
  EXPECT_EQ(watch(c1_, d1_, "/q9", "t"), "!E2BIG") << "watches quota 4";
  EXPECT_EQ(watch(c0_, d0_, "@introduceDomain", "i"), kOK);
  EXPECT_EQ(watch(c0_, d0_, "@releaseDomain", "r"), kOK);
  EXPECT_EQ(d0_.events, (std::vector<std::string>{"@introduceDomain|i", "@releaseDomain|r"}));
  d0_.events.clear();
  EXPECT_EQ(req(c0_, d0_, MsgType::introduce, z("7") + z("1234") + z("5")), kOK);
  EXPECT_EQ(d0_.events, std::vector<std::string>{"@introduceDomain|i"});
  EXPECT_EQ(req(c0_, d0_, MsgType::is_domain_introduced, z("7")), z("T"));
  EXPECT_EQ(req(c0_, d0_, MsgType::release, z("7")), kOK);
  EXPECT_EQ(d0_.events, (std::vector<std::string>{"@introduceDomain|i", "@releaseDomain|r"}));
  EXPECT_EQ(req(c0_, d0_, MsgType::is_domain_introduced, z("7")), z("F"));
  EXPECT_EQ(req(c0_, d0_, MsgType::release, z("7")), "!ENOENT");
}

TEST_F(StoreTest, ReleaseDropsWatchesAndTransactionsButKeepsNodes) {
  EXPECT_EQ(write(c0_, d0_, "/local/domain/2/keep", "v"), kOK);
  EXPECT_EQ(watch(c2_, d2_, "/local/domain/2", "t"), kOK);
  start(c2_, d2_);
  EXPECT_EQ(store_.watch_count(c2_), 1u);
  EXPECT_EQ(store_.transaction_count(c2_), 1u);
  EXPECT_EQ(req(c0_, d0_, MsgType::release, z("2")), kOK);
  EXPECT_EQ(store_.watch_count(c2_), 0u);
  EXPECT_EQ(store_.transaction_count(c2_), 0u);
  EXPECT_EQ(read(c0_, d0_, "/local/domain/2/keep"), "v");
}

TEST_F(StoreTest, DomainOpsNeedPrivilegeAndValidArgs) {
  EXPECT_EQ(req(c1_, d1_, MsgType::introduce, z("9") + z("1") + z("1")), "!EACCES");
  EXPECT_EQ(req(c1_, d1_, MsgType::release, z("2")), "!EACCES");
  EXPECT_EQ(req(c1_, d1_, MsgType::set_target, z("1") + z("2")), "!EACCES");
  EXPECT_EQ(req(c1_, d1_, MsgType::control, z("print") + z("x")), "!EACCES");
  EXPECT_EQ(req(c0_, d0_, MsgType::introduce, z("0") + z("1") + z("1")), "!EINVAL");
  EXPECT_EQ(req(c0_, d0_, MsgType::introduce, z("x") + z("1") + z("1")), "!EINVAL");
  EXPECT_EQ(req(c0_, d0_, MsgType::introduce, z("32752") + z("1") + z("1")), "!EINVAL");
  EXPECT_EQ(req(c0_, d0_, MsgType::introduce, z("1") + z("100") + z("9")), kOK) << "same page";
  EXPECT_EQ(req(c0_, d0_, MsgType::introduce, z("1") + z("101") + z("9")), "!EEXIST");
  EXPECT_EQ(req(c0_, d0_, MsgType::get_domain_path, z("5")), z("/local/domain/5"));
  EXPECT_EQ(req(c1_, d1_, MsgType::get_domain_path, z("5")), z("/local/domain/5"));
  EXPECT_EQ(req(c0_, d0_, MsgType::get_domain_path, z("-5")), "!EINVAL");
  EXPECT_EQ(req(c0_, d0_, MsgType::is_domain_introduced, z("0")), z("T"));
  EXPECT_EQ(req(c0_, d0_, MsgType::resume, z("1")), kOK);
  EXPECT_EQ(req(c0_, d0_, MsgType::resume, z("9")), "!ENOENT");
}

TEST_F(StoreTest, SetTargetGivesPrivilegeOverTarget) {
  EXPECT_EQ(write(c0_, d0_, "/local/domain/2/t", "v"), kOK);
  EXPECT_EQ(setperms(c0_, d0_, "/local/domain/2/t", {"n2"}), kOK);
  EXPECT_EQ(read(c1_, d1_, "/local/domain/2/t"), "!EACCES");
  EXPECT_EQ(req(c0_, d0_, MsgType::set_target, z("1") + z("2")), kOK);
  EXPECT_EQ(read(c1_, d1_, "/local/domain/2/t"), "v");
  EXPECT_EQ(write(c1_, d1_, "/local/domain/2/t", "w"), kOK);
  EXPECT_EQ(req(c0_, d0_, MsgType::set_target, z("1") + z("9")), "!ENOENT");
}

TEST_F(StoreTest, TransactionCommitAbortAndConflict) {
  EXPECT_EQ(write(c0_, d0_, "/t/x", "0"), kOK);
  std::uint32_t tx = start(c0_, d0_);
  EXPECT_NE(tx, 0u);
  EXPECT_EQ(write(c0_, d0_, "/t/x", "1", tx), kOK);
  EXPECT_EQ(write(c0_, d0_, "/t/new/deep", "n", tx), kOK);
  EXPECT_EQ(read(c0_, d0_, "/t/x", tx), "1") << "the transaction sees its own writes";
  EXPECT_EQ(read(c0_, d0_, "/t/x"), "0") << "others do not, yet";
  EXPECT_EQ(read(c0_, d0_, "/t/new/deep"), "!ENOENT");
  EXPECT_EQ(dir(c0_, d0_, "/t", tx), z("x") + z("new"));
  EXPECT_EQ(end(c0_, d0_, tx, true), kOK);
  EXPECT_EQ(read(c0_, d0_, "/t/x"), "1");
  EXPECT_EQ(read(c0_, d0_, "/t/new/deep"), "n");
  EXPECT_EQ(end(c0_, d0_, tx, true), "!ENOENT") << "gone after commit";

  std::uint32_t ab = start(c0_, d0_);
  EXPECT_EQ(rm(c0_, d0_, "/t", ab), kOK);
  EXPECT_EQ(end(c0_, d0_, ab, false), kOK);
  EXPECT_EQ(read(c0_, d0_, "/t/x"), "1") << "abort discards";

  // Conflict: the transaction read /t/x, somebody else wrote it → EAGAIN, nothing applied.
  std::uint32_t c = start(c0_, d0_);
  EXPECT_EQ(read(c0_, d0_, "/t/x", c), "1");
  EXPECT_EQ(write(c0_, d0_, "/t/y", "from-tx", c), kOK);
  EXPECT_EQ(write(c1_, d1_, "/t/x", "dom1"), "!EACCES");
  EXPECT_EQ(write(c0_, d0_, "/t/x", "outside"), kOK);
  EXPECT_EQ(end(c0_, d0_, c, true), "!EAGAIN");
  EXPECT_EQ(read(c0_, d0_, "/t/y"), "!ENOENT");
  // The retry succeeds.
  std::uint32_t r = start(c0_, d0_);
  EXPECT_EQ(read(c0_, d0_, "/t/x", r), "outside");
  EXPECT_EQ(write(c0_, d0_, "/t/y", "from-tx", r), kOK);
  EXPECT_EQ(end(c0_, d0_, r, true), kOK);
  EXPECT_EQ(read(c0_, d0_, "/t/y"), "from-tx");
}

// A transaction sees a node as it first saw it: a change made outside it meanwhile is not seen
// (nor a node created or removed outside it), and its commit is EAGAIN — Xen's xenstored copies
// a node into the transaction at its first access; its own test-xenstore checks this ("ta err").
TEST_F(StoreTest, ATransactionReadsWhatItFirstSaw) {
  EXPECT_EQ(write(c0_, d0_, "/s/x", "a"), kOK);
  EXPECT_EQ(write(c0_, d0_, "/s/gone", "g"), kOK);
  std::uint32_t tx = start(c0_, d0_);
  EXPECT_EQ(read(c0_, d0_, "/s/x", tx), "a");
  EXPECT_EQ(dir(c0_, d0_, "/s", tx), z("x") + z("gone"));
  EXPECT_EQ(read(c0_, d0_, "/s/new", tx), "!ENOENT");
  EXPECT_EQ(read(c0_, d0_, "/s/gone", tx), "g");
  EXPECT_EQ(write(c0_, d0_, "/s/x", "b"), kOK);
  EXPECT_EQ(write(c0_, d0_, "/s/new", "n"), kOK);
  EXPECT_EQ(rm(c0_, d0_, "/s/gone"), kOK);
  EXPECT_EQ(read(c0_, d0_, "/s/x", tx), "a") << "the value at its first read";
  EXPECT_EQ(dir(c0_, d0_, "/s", tx), z("x") + z("gone"));
  EXPECT_EQ(read(c0_, d0_, "/s/new", tx), "!ENOENT");
  EXPECT_EQ(read(c0_, d0_, "/s/gone", tx), "g");
  EXPECT_EQ(write(c0_, d0_, "/s/x", "c", tx), kOK);
  EXPECT_EQ(read(c0_, d0_, "/s/x", tx), "c") << "then its own write";
  EXPECT_EQ(end(c0_, d0_, tx, true), "!EAGAIN");
  EXPECT_EQ(read(c0_, d0_, "/s/x"), "b");
  EXPECT_EQ(read(c0_, d0_, "/s/gone"), "!ENOENT");
  // What a transaction only read is not written back by its commit: no generation moves, no
  // watch fires.
  EXPECT_EQ(watch(c0_, d0_, "/s", "w"), kOK);
  d0_.events.clear();
  const std::uint64_t gen = store_.find("/s/x")->gen;
  std::uint32_t ro = start(c0_, d0_);
  EXPECT_EQ(read(c0_, d0_, "/s/x", ro), "b");
  EXPECT_EQ(dir(c0_, d0_, "/s", ro), z("x") + z("new"));
  EXPECT_EQ(end(c0_, d0_, ro, true), kOK);
  EXPECT_EQ(store_.find("/s/x")->gen, gen);
  EXPECT_TRUE(d0_.events.empty());
}

// A guest's RM in a transaction of a node its transaction saw, whose parent was removed outside
// it and looked at in it only now: the parent is missing from the transaction's view. This
// dereferenced the missing parent (xpv-xenstored died, found by a review); now the RM is answered
// and the commit is EAGAIN, the node having changed since the transaction saw it.
TEST_F(StoreTest, ATransactionRemovesANodeWhoseParentWentOutsideIt) {
  EXPECT_EQ(req(c0_, d0_, MsgType::mkdir, z("/local/domain/1")), kOK);
  EXPECT_EQ(setperms(c0_, d0_, "/local/domain/1", {"n1"}), kOK);
  EXPECT_EQ(write(c1_, d1_, "a/b", "v"), kOK);
  std::uint32_t tx = start(c1_, d1_);
  EXPECT_EQ(read(c1_, d1_, "a/b", tx), "v");  // a/b is in the transaction; its parent is not
  EXPECT_EQ(rm(c1_, d1_, "a"), kOK);          // outside it: a and a/b go
  EXPECT_EQ(rm(c1_, d1_, "a/b", tx), kOK) << "the transaction still sees a/b";
  EXPECT_EQ(read(c1_, d1_, "a/b", tx), "!ENOENT");
  EXPECT_EQ(end(c1_, d1_, tx, true), "!EAGAIN");
  EXPECT_EQ(read(c1_, d1_, "a"), "!ENOENT");
  // The second way there: the transaction's stale view of a's children lets it remove a alone.
  EXPECT_EQ(write(c1_, d1_, "p", ""), kOK);
  tx = start(c1_, d1_);
  EXPECT_EQ(dir(c1_, d1_, "p", tx), "");
  EXPECT_EQ(write(c1_, d1_, "p/q", "w"), kOK);  // outside it
  EXPECT_EQ(rm(c1_, d1_, "p", tx), kOK);
  EXPECT_EQ(read(c1_, d1_, "p/q", tx), "w");  // first seen now, as the main tree has it
  EXPECT_EQ(rm(c1_, d1_, "p/q", tx), kOK) << "its parent is removed in the transaction";
  EXPECT_EQ(end(c1_, d1_, tx, true), "!EAGAIN");
  EXPECT_EQ(read(c1_, d1_, "p/q"), "w");
}

// A transaction that writes one node many times fires one event for it at the commit (as Xen's
// xenstored), and keeps one: its pending events are bounded by the nodes it touched.
TEST_F(StoreTest, ATransactionFiresOneEventPerNodeItChanged) {
  EXPECT_EQ(write(c0_, d0_, "/e", ""), kOK);
  EXPECT_EQ(watch(c0_, d0_, "/e", "w"), kOK);
  d0_.events.clear();
  std::uint32_t tx = start(c0_, d0_);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(write(c0_, d0_, "/e/x", std::to_string(i), tx), kOK);
  EXPECT_EQ(write(c0_, d0_, "/e/y", "1", tx), kOK);
  EXPECT_EQ(write(c0_, d0_, "/e/x", "last", tx), kOK);
  EXPECT_TRUE(d0_.events.empty()) << "nothing before the commit";
  EXPECT_EQ(end(c0_, d0_, tx, true), kOK);
  EXPECT_EQ(d0_.events, (std::vector<std::string>{"/e/x|w", "/e/y|w"}));
  EXPECT_EQ(read(c0_, d0_, "/e/x"), "last");
  // A node written, then removed with its parent: one event for it (the write's, which reaches
  // the watchers above it too), not a second for the removal.
  EXPECT_EQ(watch(c0_, d0_, "/e/q/r", "r"), kOK);
  d0_.events.clear();
  tx = start(c0_, d0_);
  EXPECT_EQ(write(c0_, d0_, "/e/q/r", "1", tx), kOK);
  EXPECT_EQ(rm(c0_, d0_, "/e/q", tx), kOK);
  EXPECT_EQ(end(c0_, d0_, tx, true), kOK);
  EXPECT_EQ(std::count(d0_.events.begin(), d0_.events.end(), "/e/q/r|r"), 1) << ::testing::PrintToString(d0_.events);
  EXPECT_EQ(std::count(d0_.events.begin(), d0_.events.end(), "/e/q/r|w"), 1) << ::testing::PrintToString(d0_.events);
  EXPECT_EQ(std::count(d0_.events.begin(), d0_.events.end(), "/e/q|w"), 1) << ::testing::PrintToString(d0_.events);
}

// A node a watcher could read when the transaction first changed it and cannot after (its
// permissions changed in the same transaction): the merged event still reaches that watcher, as
// the write's own event did before events were merged.
TEST_F(StoreTest, AMergedEventReachesWhoCouldReadTheNodeFirstOrLast) {
  EXPECT_EQ(write(c0_, d0_, "/pp", ""), kOK);
  EXPECT_EQ(setperms(c0_, d0_, "/pp", {"n0", "r1"}), kOK);
  EXPECT_EQ(watch(c1_, d1_, "/pp", "t"), kOK);
  d1_.events.clear();
  std::uint32_t tx = start(c0_, d0_);
  EXPECT_EQ(write(c0_, d0_, "/pp/x", "v", tx), kOK);  // inherits n0 r1: dom1 may read it
  EXPECT_EQ(setperms(c0_, d0_, "/pp/x", {"n0"}, tx), kOK);
  EXPECT_EQ(end(c0_, d0_, tx, true), kOK);
  EXPECT_EQ(d1_.events, std::vector<std::string>{"/pp/x|t"});
  // Outside a transaction nothing is merged: a change dom1 may not read is not shown to it.
  d1_.events.clear();
  EXPECT_EQ(write(c0_, d0_, "/pp/x", "w"), kOK);
  EXPECT_TRUE(d1_.events.empty());
}

// An event longer than a message may be (path + token + their NULs > 4096) is not sent: its
// reader would take it for a protocol error. A watch with such a token is still registered.
TEST_F(StoreTest, AnEventTooLongForAMessageIsNotSent) {
  const std::string token(4096 - 2 - 2, 't');  // "/l" + NUL + token + NUL = 4096 at registration
  EXPECT_EQ(write(c0_, d0_, "/l", ""), kOK);
  EXPECT_EQ(watch(c0_, d0_, "/l", token), kOK);
  ASSERT_EQ(d0_.events.size(), 1u) << "the registration's event fits";
  d0_.events.clear();
  EXPECT_EQ(write(c0_, d0_, "/l/x", "1"), kOK);  // "/l/x" + token: two bytes over
  EXPECT_TRUE(d0_.events.empty());
  EXPECT_EQ(watch(c0_, d0_, "/l", "short"), kOK);
  d0_.events.clear();
  EXPECT_EQ(write(c0_, d0_, "/l/x", "2"), kOK);
  EXPECT_EQ(d0_.events, std::vector<std::string>{"/l/x|short"}) << "other watches on the path still fire";
}

// A domain's transaction may access `transaction-nodes` nodes (it keeps a copy of each): past
// that its requests are ENOSPC, its end still answered; dom0's transactions have no such limit.
TEST(StoreTransactionNodes, ADomainsTransactionMayAccessSoManyNodes) {
  Quotas q;
  q.transaction_nodes = 5;
  Store store(q);
  FakeConn d0, d1;
  const ConnId c0 = store.connect(0, d0);
  ASSERT_TRUE(store.introduce(1, 100, 1));
  const ConnId c1 = store.connect(1, d1);
  std::uint32_t id = 0;
  auto req = [&](ConnId c, FakeConn& f, MsgType t, const std::string& payload, std::uint32_t tx = 0) {
    store.handle(c, {static_cast<std::uint32_t>(t), ++id, tx, static_cast<std::uint32_t>(payload.size())}, payload);
    return f.replies.back();
  };
  ASSERT_EQ(req(c0, d0, MsgType::mkdir, z("/local/domain/1")), kOK);
  ASSERT_EQ(req(c0, d0, MsgType::set_perms, z("/local/domain/1") + z("n1")), kOK);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(req(c0, d0, MsgType::write, z("/local/domain/1/k" + std::to_string(i)) + "v"), kOK);
  const auto tx = static_cast<std::uint32_t>(std::stoul(req(c1, d1, MsgType::transaction_start, z(""))));
  int answered = 0;
  for (int i = 0; i < 10; ++i) {
    if (req(c1, d1, MsgType::read, z("/local/domain/1/k" + std::to_string(i)), tx) == "!ENOSPC") break;
    ++answered;
  }
  EXPECT_EQ(answered, 5) << "five nodes accessed, then ENOSPC";
  EXPECT_EQ(req(c1, d1, MsgType::transaction_end, z("F"), tx), kOK);
  const auto t0 = static_cast<std::uint32_t>(std::stoul(req(c0, d0, MsgType::transaction_start, z(""))));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(req(c0, d0, MsgType::read, z("/d0/k" + std::to_string(i)), t0), "!ENOENT");
  EXPECT_EQ(req(c0, d0, MsgType::transaction_end, z("T"), t0), kOK);
  Quotas parsed;
  EXPECT_TRUE(set_quota(parsed, "transaction-nodes", 7));
  EXPECT_EQ(parsed.transaction_nodes, 7u);
  EXPECT_NE(format_quotas(parsed).find("transaction-nodes 7\n"), std::string::npos);
}

TEST_F(StoreTest, UnrelatedChangesDoNotConflict) {
  EXPECT_EQ(write(c0_, d0_, "/u/a", "0"), kOK);
  EXPECT_EQ(write(c0_, d0_, "/v/b", "0"), kOK);
  std::uint32_t tx = start(c0_, d0_);
  EXPECT_EQ(write(c0_, d0_, "/u/a", "1", tx), kOK);
  EXPECT_EQ(write(c0_, d0_, "/v/b", "outside"), kOK);
  EXPECT_EQ(end(c0_, d0_, tx, true), kOK);
  EXPECT_EQ(read(c0_, d0_, "/u/a"), "1");
}

TEST_F(StoreTest, TransactionRulesAndQuota) {
  std::uint32_t a = start(c1_, d1_);
  std::uint32_t b = start(c1_, d1_);
  EXPECT_NE(a, b);
  EXPECT_EQ(req(c1_, d1_, MsgType::transaction_start, z("")), "!ENOSPC") << "quota 2";
  EXPECT_EQ(req(c1_, d1_, MsgType::transaction_start, z(""), a), "!EBUSY") << "nested";
  EXPECT_EQ(req(c1_, d1_, MsgType::transaction_end, z("X"), a), "!EINVAL");
  EXPECT_EQ(req(c1_, d1_, MsgType::transaction_end, z("T")), "!ENOENT") << "no tx id";
  EXPECT_EQ(req(c2_, d2_, MsgType::transaction_end, z("T"), a), "!ENOENT") << "another's id";
  EXPECT_EQ(end(c1_, d1_, a, false), kOK);
  EXPECT_EQ(end(c1_, d1_, b, false), kOK);
  EXPECT_EQ(store_.transaction_count(c1_), 0u);
}

TEST_F(StoreTest, WatchesFireAtCommitNotBefore) {
  EXPECT_EQ(watch(c0_, d0_, "/tw", "t"), kOK);
  d0_.events.clear();
  std::uint32_t tx = start(c0_, d0_);
  EXPECT_EQ(write(c0_, d0_, "/tw/a", "1", tx), kOK);
  EXPECT_TRUE(d0_.events.empty());
  EXPECT_EQ(end(c0_, d0_, tx, true), kOK);
  EXPECT_EQ(d0_.events, std::vector<std::string>{"/tw/a|t"});
}

TEST_F(StoreTest, DirectoryPartPagesWithGeneration) {
  std::string expect;
  for (int i = 0; i < 300; ++i) {
    std::string name = "child-number-" + std::to_string(i);
    ASSERT_EQ(write(c0_, d0_, "/big/" + name, ""), kOK);
    expect += z(name);
  }
  EXPECT_EQ(dir(c0_, d0_, "/big"), "!E2BIG") << "list longer than 4096";
  std::string all, gen;
  std::uint32_t off = 0;
  for (int page = 0; page < 10; ++page) {
    std::string r = req(c0_, d0_, MsgType::directory_part, z("/big") + z(std::to_string(off)));
    ASSERT_FALSE(r.starts_with("!")) << r;
    ASSERT_LE(r.size(), 4096u);
    auto nul = r.find('\0');
    std::string g = r.substr(0, nul);
    if (gen.empty()) gen = g;
    EXPECT_EQ(g, gen) << "generation stable while unchanged";
    std::string body = r.substr(nul + 1);
    bool last = body.size() >= 1 && (body.size() == 1 || body.ends_with(std::string(2, '\0')));
    if (last) body.pop_back();
    all += body;
    off += static_cast<std::uint32_t>(body.size());
    if (last) break;
  }
  EXPECT_EQ(all, expect);
  std::string past = req(c0_, d0_, MsgType::directory_part, z("/big") + z("999999"));
  EXPECT_EQ(past, z(gen) + std::string(1, '\0'));
  ASSERT_EQ(write(c0_, d0_, "/big/one-more", ""), kOK);
  std::string after = req(c0_, d0_, MsgType::directory_part, z("/big") + z("0"));
  EXPECT_NE(after.substr(0, after.find('\0')), gen) << "generation changes with children";
}

TEST_F(StoreTest, ResetWatchesAndControl) {
  EXPECT_EQ(watch(c0_, d0_, "/a", "1"), kOK);
  start(c0_, d0_);
  EXPECT_EQ(req(c0_, d0_, MsgType::reset_watches, ""), kOK);
  EXPECT_EQ(store_.watch_count(c0_), 0u);
  EXPECT_EQ(store_.transaction_count(c0_), 0u);
  EXPECT_EQ(req(c0_, d0_, MsgType::control, z("print") + z("hello")), kOK);
  EXPECT_EQ(req(c0_, d0_, MsgType::control, z("bogus")), "!EINVAL");
  EXPECT_EQ(req(c0_, d0_, MsgType::control, z("log-level") + z("debug")), "!EINVAL")
      << "no hook installed";
  std::string q = req(c0_, d0_, MsgType::control, z("quota"));
  EXPECT_TRUE(q.starts_with("nodes 20\nnode-size 64\n")) << q;
}

TEST_F(StoreTest, DisconnectDropsEverything) {
  EXPECT_EQ(watch(c2_, d2_, "/x", "t"), kOK);
  store_.disconnect(c2_);
  EXPECT_EQ(store_.watch_count(c2_), 0u);
  d2_.events.clear();
  EXPECT_EQ(write(c0_, d0_, "/x", "v"), kOK);
  EXPECT_TRUE(d2_.events.empty());
  std::size_t before = d2_.replies.size();
  store_.handle(c2_, wire::Header{2, 1, 0, 3}, z("/x"));  // stale id: ignored
  EXPECT_EQ(d2_.replies.size(), before);
}

TEST(XenstoreQuotas, SetQuotaKeys) {
  Quotas q;
  EXPECT_TRUE(set_quota(q, "nodes", 5));
  EXPECT_TRUE(set_quota(q, "node-size", 6));
  EXPECT_TRUE(set_quota(q, "watches", 7));
  EXPECT_TRUE(set_quota(q, "transactions", 8));
  EXPECT_TRUE(set_quota(q, "outstanding", 9));
  EXPECT_TRUE(set_quota(q, "path-max", 10));
  EXPECT_TRUE(set_quota(q, "perms", 11));
  EXPECT_EQ(q.nodes, 5u);
  EXPECT_EQ(q.perms, 11u);
  EXPECT_FALSE(set_quota(q, "bogus", 1));
  EXPECT_FALSE(set_quota(q, "nodes", 0));
}
