// Store::save / Store::restore (live update) and the CONTROL live-update hook: the restored store
// must behave exactly as the saved one would have — same nodes, permissions, generations, domain
// table, connections with their watches and transaction numbering — and a bad state is refused
// with a message naming what is wrong.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fake_conn.h"
#include "xpv/xenbus/hex.h"
#include "xpv/xenbus/store.h"

using namespace xpv::xenbus;
using wire::MsgType;
using xpv::xenbus::test::FakeConn;
using xpv::xenbus::test::kOK;
using xpv::xenbus::test::req;
using xpv::xenbus::test::z;

namespace {

TEST(StorePersist, ARestoredStoreIsTheSavedOne) {
  Store a;
  FakeConn p0, p3;
  const ConnId c0 = a.connect(0, p0);
  ASSERT_TRUE(a.introduce(3, 0xfeffc, 7));
  ASSERT_TRUE(a.introduce(4, 0xfeffd, 8));
  ASSERT_EQ(req(a, c0, p0, MsgType::set_target, z("3") + z("4")), kOK);  // dom3 serves dom4
  ASSERT_EQ(req(a, c0, p0, MsgType::write, z("/local/domain/4/dm") + "d"), kOK);
  ASSERT_EQ(req(a, c0, p0, MsgType::set_perms, z("/local/domain/4/dm") + z("n4")), kOK);
  const ConnId c3 = a.connect(3, p3);
  const std::string binary("v\xff\0w", 4);
  ASSERT_EQ(req(a, c0, p0, MsgType::write, z("/local/domain/3/bin") + binary), kOK);
  ASSERT_EQ(req(a, c0, p0, MsgType::write, z("/local/domain/3/b") + "2"), kOK);
  ASSERT_EQ(req(a, c0, p0, MsgType::write, z("/local/domain/3/a") + "1"), kOK);  // children in creation order
  ASSERT_EQ(req(a, c0, p0, MsgType::set_perms, z("/local/domain/3") + z("n3") + z("r0")), kOK);
  ASSERT_EQ(req(a, c0, p0, MsgType::write, z("/secret") + "s"), kOK);
  ASSERT_EQ(req(a, c3, p3, MsgType::watch, z("data") + z("rel\xfetok")), kOK);  // relative; a token byte that is not UTF-8
  ASSERT_EQ(req(a, c0, p0, MsgType::watch, z("@releaseDomain") + z("r")), kOK);
  const std::string tx = req(a, c3, p3, MsgType::transaction_start, z(""));
  ASSERT_NE(tx[0], '!');
  const auto gen_before = a.find("/local/domain/3/a")->gen;

  const nlohmann::json state = a.save();
  const std::string text = state.dump();  // JSON text: must be valid UTF-8 whatever the bytes
  Store b;
  b.restore(nlohmann::json::parse(text));
  FakeConn q0, q3;
  b.attach_sink(c0, q0);
  b.attach_sink(c3, q3);
  EXPECT_EQ(b.connection_ids(), (std::vector<ConnId>{c0, c3}));
  EXPECT_EQ(b.node_count(), a.node_count());
  EXPECT_EQ(b.owned_nodes(3), a.owned_nodes(3));
  EXPECT_EQ(b.find("/local/domain/3/a")->gen, gen_before);
  EXPECT_TRUE(b.is_introduced(3));
  EXPECT_EQ(req(b, c0, q0, MsgType::read, z("/local/domain/3/bin")), binary);
  EXPECT_EQ(req(b, c0, q0, MsgType::directory, z("/local/domain/3")), z("bin") + z("b") + z("a"));
  EXPECT_EQ(req(b, c3, q3, MsgType::get_perms, z("/local/domain/3")), z("n3") + z("r0"));
  EXPECT_EQ(req(b, c3, q3, MsgType::read, z("/secret")), "!EACCES") << "dom3 is still dom3";
  EXPECT_EQ(req(b, c3, q3, MsgType::read, z("/local/domain/4/dm")), "d") << "and still dom4's target";
  // The relative watch fires with its relative path and its token.
  ASSERT_EQ(req(b, c0, q0, MsgType::write, z("/local/domain/3/data/x") + "y"), kOK);
  EXPECT_EQ(q3.events, (std::vector<std::string>{"data/x|rel\xfetok"}));
  // The transaction open at the save was ended: EAGAIN inside it and at its end, as a conflict.
  const std::string tid = tx.substr(0, tx.size() - 1);
  EXPECT_EQ(req(b, c3, q3, MsgType::read, z("data/x"), static_cast<std::uint32_t>(std::stoul(tid))), "!EAGAIN");
  EXPECT_EQ(req(b, c3, q3, MsgType::transaction_end, z("T"), static_cast<std::uint32_t>(std::stoul(tid))), "!EAGAIN");
  EXPECT_EQ(req(b, c3, q3, MsgType::transaction_end, z("T"), static_cast<std::uint32_t>(std::stoul(tid))), "!ENOENT");
  // Numbering goes on: a new transaction gets the next id, a new connection the next number.
  EXPECT_EQ(req(b, c3, q3, MsgType::transaction_start, z("")), z(std::to_string(std::stoul(tid) + 1)));
  FakeConn q9;
  EXPECT_GT(b.connect(0, q9), c3);
  // The domain table: RELEASE fires the special watch registered before the save.
  ASSERT_TRUE(b.release(3));
  EXPECT_EQ(q0.events, (std::vector<std::string>{"@releaseDomain|r"}));
}

TEST(StorePersist, ForcedAbortEndsOpenTransactionsWithEagain) {
  Store st;
  FakeConn p;
  const ConnId c = st.connect(0, p);
  const std::string t1 = req(st, c, p, MsgType::transaction_start, z(""));
  ASSERT_EQ(req(st, c, p, MsgType::write, z("/x") + "1", static_cast<std::uint32_t>(std::stoul(t1))), kOK);
  EXPECT_EQ(st.open_transactions(), 1u);
  st.abort_transactions();
  EXPECT_EQ(st.open_transactions(), 0u);
  EXPECT_EQ(req(st, c, p, MsgType::transaction_end, z("T"), static_cast<std::uint32_t>(std::stoul(t1))), "!EAGAIN");
  EXPECT_EQ(req(st, c, p, MsgType::read, z("/x")), "!ENOENT") << "its write never happened";
}

TEST(StorePersist, BadStatesAreRefusedWithWhatIsWrong) {
  Store a;
  FakeConn p;
  a.connect(0, p);
  const nlohmann::json good = a.save();
  auto refused = [](nlohmann::json st, const std::string& what) {
    Store b;
    try {
      b.restore(st);
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_EQ(b.connection_count(), 0u) << "nothing restored";
      return;
    }
    ADD_FAILURE() << "accepted; expected: " << what;
  };
  auto st = good;
  st["version"] = 99;
  refused(st, "version");
  st = good;
  st["nodes"][0]["value"] = "zz";
  refused(st, "node value");
  st = good;
  st["nodes"][0]["perms"] = nlohmann::json::array({"q0"});
  refused(st, "permission");
  st = good;
  for (auto& n : st["nodes"]) {
    if (n["path"] == hex("/")) n["children"].push_back(hex("missing"));
  }
  refused(st, "does not have");
  st = good;
  st["conns"][0]["id"] = 1000;
  refused(st, "out of range");
  st = good;
  st["conns"][0].erase("next_tx");
  refused(st, "next_tx");
}

TEST(StorePersist, ControlLiveUpdateIsTheHooksAndMayBeAnsweredLater) {
  FakeConn p;
  {
    Store plain;
    const ConnId c = plain.connect(0, p);
    EXPECT_EQ(req(plain, c, p, MsgType::control, z("live-update") + z("-s")), "!EINVAL") << "no hook";
  }
  Hooks hooks;
  std::vector<std::string> got;
  std::optional<wire::Header> held;
  hooks.live_update = [&](ConnId, const wire::Header& h, const std::vector<std::string>& args)
      -> std::optional<xpv::Expected<std::string, wire::Error>> {
    got = args;
    if (args.at(0) == "-s") {
      held = h;
      return std::nullopt;  // answered later
    }
    return std::string("OK", 3);
  };
  Store st({}, hooks);
  FakeConn q;
  const ConnId c = st.connect(0, q);
  EXPECT_EQ(req(st, c, q, MsgType::control, z("live-update") + z("-f") + z("/bin/x")), kOK);
  EXPECT_EQ(got, (std::vector<std::string>{"-f", "/bin/x"}));
  EXPECT_EQ(req(st, c, q, MsgType::control, z("live-update") + z("-s")), "<no reply>");
  ASSERT_TRUE(held);
  st.answer(c, *held, kOK);
  EXPECT_EQ(q.replies.back(), kOK);
  FakeConn r;
  const ConnId dom = st.connect(5, r);
  EXPECT_EQ(req(st, dom, r, MsgType::control, z("live-update") + z("-s")), "!EACCES") << "privileged only";
}

}  // namespace
