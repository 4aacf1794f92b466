// Crash restart, the Store's side (store.h ChangeLog, Store::recover): a Store rebuilt from the
// snapshot a journal starts with plus the changes recorded after it is the store that recorded
// them — every node with its value, permissions, child order and generation, the domain table,
// each domain's watches and transaction counter — while socket clients' state is dropped; every
// change is recorded before the reply that acknowledges it; a record that cannot be applied is
// refused naming it.
#include <gtest/gtest.h>

#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fake_conn.h"
#include "xpv/xenbus/store.h"

using namespace xpv::xenbus;
using wire::MsgType;
using xpv::xenbus::test::FakeConn;
using xpv::xenbus::test::kOK;
using xpv::xenbus::test::req;
using xpv::xenbus::test::z;

namespace {

// Keeps every record; counts what was recorded but not yet committed.
struct FakeLog : ChangeLog {
  std::vector<nlohmann::json> changes;
  std::size_t uncommitted = 0;
  std::size_t commits = 0;
  void record(std::string_view c) override {
    changes.push_back(nlohmann::json::parse(c));
    ++uncommitted;
  }
  void commit() noexcept override {
    uncommitted = 0;
    ++commits;
  }
  std::vector<std::string> lost_changes;
  void lost(std::string_view what) noexcept override { lost_changes.emplace_back(what); }
};

// A Sink that checks, at each reply, that the journal holds everything recorded so far.
struct CheckingConn : FakeConn {
  const FakeLog* log = nullptr;
  std::size_t replies_with_uncommitted_changes = 0;
  void deliver(const wire::Header& h, std::string_view payload) override {
    if (log && log->uncommitted != 0) ++replies_with_uncommitted_changes;
    FakeConn::deliver(h, payload);
  }
};

std::uint32_t tx_id(const std::string& reply) { return static_cast<std::uint32_t>(std::stoul(reply)); }

// The parts of save() a crash restart must reproduce: nodes (order-free) and domains.
nlohmann::json tree_and_domains(const Store& s) {
  nlohmann::json j = s.save();
  std::vector<std::string> nodes;
  for (const auto& n : j.at("nodes")) nodes.push_back(n.dump());
  std::sort(nodes.begin(), nodes.end());
  return {{"nodes", nodes}, {"domains", j.at("domains")}};
}

TEST(StoreJournal, ARecoveredStoreIsTheOneThatRecorded) {
  Store a;
  FakeLog log;
  const nlohmann::json snapshot = a.save();
  a.set_change_log(&log);
  CheckingConn p0, p3, p5;
  p0.log = p3.log = p5.log = &log;
  const ConnId c0 = a.connect(0, p0);
  ASSERT_TRUE(a.introduce(3, 0xfeffc, 7));
  ASSERT_TRUE(a.introduce(5, 0xfeffd, 9));
  ASSERT_TRUE(a.introduce(6, 0xfeffe, 10));
  const ConnId c3 = a.connect(3, p3);
  const ConnId c5 = a.connect(5, p5);
  ASSERT_EQ(req(a, c0, p0, MsgType::set_target, z("5") + z("3")), kOK);
  const std::string binary("v\xff\0w", 4);
  ASSERT_EQ(req(a, c0, p0, MsgType::write, z("/local/domain/3/bin") + binary), kOK);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(req(a, c0, p0, MsgType::write, z("/local/domain/3/dir/k" + std::to_string(i)) + "x"), kOK);
  }
  ASSERT_EQ(req(a, c0, p0, MsgType::rm, z("/local/domain/3/dir/k7")), kOK);   // a child out of the middle
  ASSERT_EQ(req(a, c0, p0, MsgType::write, z("/local/domain/3/dir/k7") + "again"), kOK);  // now last
  ASSERT_EQ(req(a, c0, p0, MsgType::set_perms, z("/local/domain/3/dir") + z("n3") + z("r0")), kOK);
  ASSERT_EQ(req(a, c0, p0, MsgType::mkdir, z("/local/domain/3/empty")), kOK);
  ASSERT_EQ(req(a, c0, p0, MsgType::set_perms, z("/local/domain/3") + z("n3") + z("r0")), kOK);
  ASSERT_EQ(req(a, c3, p3, MsgType::write, z("data/mine") + "3"), kOK);  // owned by dom3
  ASSERT_EQ(req(a, c3, p3, MsgType::watch, z("data") + z("rel\xfetok")), kOK);
  ASSERT_EQ(req(a, c3, p3, MsgType::watch, z("/local/domain/3/bin") + z("gone")), kOK);
  ASSERT_EQ(req(a, c3, p3, MsgType::unwatch, z("/local/domain/3/bin") + z("gone")), kOK);
  // A transaction committed (its nodes recorded at commit), one left open, one aborted.
  const auto t1 = tx_id(req(a, c3, p3, MsgType::transaction_start, z("")));
  ASSERT_EQ(req(a, c3, p3, MsgType::write, z("data/tx") + "committed", t1), kOK);
  ASSERT_EQ(req(a, c3, p3, MsgType::transaction_end, z("T"), t1), kOK);
  const auto t2 = tx_id(req(a, c3, p3, MsgType::transaction_start, z("")));
  ASSERT_EQ(req(a, c3, p3, MsgType::write, z("data/open") + "never", t2), kOK);
  ASSERT_EQ(req(a, c5, p5, MsgType::watch, z("@releaseDomain") + z("x")), kOK);  // not privileged: never fires
  ASSERT_EQ(req(a, c0, p0, MsgType::watch, z("/local") + z("dom0's")), kOK);     // a socket client's
  ASSERT_TRUE(a.release(6));
  ASSERT_EQ(p0.replies_with_uncommitted_changes + p3.replies_with_uncommitted_changes +
                p5.replies_with_uncommitted_changes,
            0u);
  EXPECT_EQ(log.uncommitted, 0u);  // release() outside a request committed too
  // Reads record nothing.
  const auto before = log.changes.size();
  ASSERT_EQ(req(a, c3, p3, MsgType::read, z("data/mine")), "3");
  ASSERT_EQ(req(a, c0, p0, MsgType::directory, z("/local/domain/3/dir")).substr(0, 3), z("k0"));
  EXPECT_EQ(log.changes.size(), before);
  // The big directory's children went as single additions and removals, not whole lists.
  std::size_t adds = 0, removes = 0;
  for (const auto& c : log.changes) {
    adds += c.contains("add");
    removes += c.contains("remove");
  }
  EXPECT_GE(adds, 21u);
  EXPECT_EQ(removes, 1u);

  // Through JSON text, as the journal file holds it.
  std::vector<nlohmann::json> changes;
  for (const auto& c : log.changes) changes.push_back(nlohmann::json::parse(c.dump()));
  Store b;
  const auto rec = b.recover(nlohmann::json::parse(snapshot.dump()), changes);
  EXPECT_EQ(tree_and_domains(b), tree_and_domains(a));
  EXPECT_EQ(b.owned_nodes(3), a.owned_nodes(3));
  ASSERT_EQ(rec.size(), 2u);  // dom3 and dom5; dom6 was released
  EXPECT_EQ(rec[0].domid, 3);
  EXPECT_EQ(rec[0].mfn, 0xfeffcu);
  EXPECT_EQ(rec[0].port, 7u);
  EXPECT_EQ(rec[1].domid, 5);
  EXPECT_EQ(b.connection_count(), 2u);  // the socket client's connection is gone
  EXPECT_EQ(b.watch_count(rec[0].conn), 1u);
  EXPECT_EQ(b.find("/local/domain/3/data/tx")->value, "committed");
  EXPECT_EQ(b.find("/local/domain/3/data/open"), nullptr);
  EXPECT_EQ(b.find("/local/domain/3/dir")->children.back(), "k7");

  // The recovered dom3: its watch fires again, with its relative path; a write fires it as before.
  FakeConn q3;
  b.attach_sink(rec[0].conn, q3);
  b.refire_watches(rec[0].conn);
  ASSERT_EQ(q3.events, (std::vector<std::string>{"data|rel\xfetok"}));
  FakeConn q0;
  const ConnId d0 = b.connect(0, q0);
  ASSERT_EQ(req(b, d0, q0, MsgType::write, z("/local/domain/3/data/new") + "1"), kOK);
  EXPECT_EQ(q3.events.back(), "data/new|rel\xfetok");
  // Its transactions: the open one and the committed one answer EAGAIN (retry), an id it was
  // never given ENOENT, and the next one is new.
  EXPECT_EQ(req(b, rec[0].conn, q3, MsgType::write, z("data/open") + "x", t2), "!EAGAIN");
  EXPECT_EQ(req(b, rec[0].conn, q3, MsgType::transaction_end, z("T"), t2), "!EAGAIN");
  EXPECT_EQ(req(b, rec[0].conn, q3, MsgType::transaction_end, z("T"), t1), "!EAGAIN");
  EXPECT_EQ(req(b, rec[0].conn, q3, MsgType::read, z("data/mine"), t2 + 100), "!ENOENT");
  const auto t3 = tx_id(req(b, rec[0].conn, q3, MsgType::transaction_start, z("")));
  EXPECT_GT(t3, t2);
  ASSERT_EQ(req(b, rec[0].conn, q3, MsgType::write, z("data/open") + "now", t3), kOK);
  ASSERT_EQ(req(b, rec[0].conn, q3, MsgType::transaction_end, z("T"), t3), kOK);
  EXPECT_EQ(b.find("/local/domain/3/data/open")->value, "now");
  // The target relation survived: dom5 acts for dom3.
  FakeConn q5;
  b.attach_sink(rec[1].conn, q5);
  EXPECT_EQ(req(b, rec[1].conn, q5, MsgType::write, z("/local/domain/3/data/by5") + "5"), kOK);
  // And the recovered store records its own changes from here on.
  FakeLog log_b;
  b.set_change_log(&log_b);
  ASSERT_EQ(req(b, d0, q0, MsgType::write, z("/x") + "1"), kOK);
  EXPECT_FALSE(log_b.changes.empty());
}

TEST(StoreJournal, ARecordThatCannotBeAppliedIsNamed) {
  Store a;
  const nlohmann::json snapshot = a.save();
  const std::vector<std::pair<nlohmann::json, std::string>> bad = {
      {{{"op", "erase"}, {"path", "2f6e6f"}}, "change 2 of the journal: no node /no to remove"},
      {{{"op", "fly"}}, "change 2 of the journal: unknown change 'fly'"},
      {{{"op", "put"}, {"path", "2f78"}, {"value", "zz"}, {"perms", {"n0"}}, {"gen", 9}, {"children", nlohmann::json::array()}},
       "change 2 of the journal: not a hex digit in a hex string"},
      {{{"op", "put"}, {"path", "2f78"}, {"value", ""}, {"perms", {"q0"}}, {"gen", 9}, {"children", nlohmann::json::array()}},
       "change 2 of the journal: bad permission 'q0'"},
      {{{"op", "put"}, {"path", "2f78"}, {"value", ""}, {"perms", {"n0"}}, {"gen", 9}}, "change 2 of the journal: node /x changed before it was created"},
      {{{"op", "introduce"}, {"domid", -1}, {"mfn", 1}, {"port", 1}}, "change 2 of the journal: 'domid' is missing or not an unsigned number"},
      {{{"op", "unwatch"}, {"domid", 3}, {"abs", "2f"}, {"token", "74"}}, "change 2 of the journal: no such watch to remove"},
  };
  for (const auto& [change, message] : bad) {
    SCOPED_TRACE(change.dump());
    Store b;
    const nlohmann::json good = {{"op", "introduce"}, {"domid", 3}, {"mfn", 1}, {"port", 2}};
    try {
      b.recover(snapshot, {good, change});
      ADD_FAILURE() << "accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
}

// A reply whose ring record cannot be made (out of memory in the transport's journal_reply): the
// request's changes are committed without the record that says the request was handled, so the
// log must be given up rather than recovered from (after a crash the request would be taken off
// the ring and handled a second time). The reply still goes out.
TEST(StoreJournal, AReplyThatCannotBeJournaledGivesTheLogUp) {
  struct NoMemoryForTheRecord : CheckingConn {
    void journal_reply(ChangeLog&, const wire::Header&, std::string_view) override { throw std::bad_alloc(); }
  };
  Store a;
  FakeLog log;
  a.set_change_log(&log);
  NoMemoryForTheRecord p0;
  p0.log = &log;
  const ConnId c0 = a.connect(0, p0);
  ASSERT_EQ(req(a, c0, p0, MsgType::write, z("/x") + "1"), kOK);
  ASSERT_EQ(log.lost_changes, std::vector<std::string>{"out of memory while journaling a reply"});
  EXPECT_EQ(p0.replies_with_uncommitted_changes, 0u);
  EXPECT_EQ(a.find("/x")->value, "1");

  // A reply the transport could journal loses nothing.
  CheckingConn p1;
  const ConnId c1 = a.connect(0, p1);
  ASSERT_EQ(req(a, c1, p1, MsgType::write, z("/y") + "2"), kOK);
  EXPECT_EQ(log.lost_changes.size(), 1u);
}

}  // namespace
