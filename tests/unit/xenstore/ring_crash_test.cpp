// Crash restart of xpv-xenstored at the ring (daemon/ring_connection.h, "RingJournalState"): the
// daemon dies while something is between a domain's ring and the store — replies queued behind a
// full response ring, a reply half on it, a request taken off in part, a request journaled whose
// index was not yet published — and the daemon that recovers from the journal answers every
// request exactly once, in order, on a well-formed ring. The test plays the domain on an
// in-memory page (ring_client.h) and the daemon as xpv-xenstored builds it: a Store with a
// Journal on a file, one RingConnection, on their own io thread; a crash drops them without a
// clean stop, the recovery is main.cpp's (Store::recover, Journal::Contents::ring_states,
// RingConnection::recover, a new Journal, serve, the watches fired once).
#include <gtest/gtest.h>

#include <set>

#include "ring_crash_rig.h"
#include "xpv/xenbus/hex.h"

using namespace xpv::xenbus;
using namespace std::chrono_literals;
using wire::MsgType;
using xpv::test::load;
using xpv::test::z;

namespace {

const std::string kOK("OK\0", 3);

class RingCrash : public ::testing::TestWithParam<int>, public xpv::test::RingCrashRig {
 protected:
  void crash_and_recover() {
    RingCrashRig::crash_and_recover(GetParam());
    EXPECT_TRUE(ring_journaled_) << "the ring journaled its state";
  }
  void send(MsgType t, std::uint32_t req_id, const std::string& payload) {
    ASSERT_TRUE(RingCrashRig::send(t, req_id, payload));
  }
};

// Eight reads of a 400-byte value while the domain reads no reply: two replies fill the ring, a
// third is half on it, five wait in the daemon. After the crash each arrives once, in order,
// whole.
TEST_P(RingCrash, RepliesQueuedOrHalfWrittenArriveOnceAfterTheCrash) {
  const std::string value(400, 'v');
  on_io([&] { dom0(MsgType::write, z("/local/domain/1/v") + value); });
  for (std::uint32_t id = 1; id <= 8; ++id) send(MsgType::read, id, z("v"));
  ASSERT_TRUE(ring_full_and_requests_taken());

  crash_and_recover();
  for (std::uint32_t id = 1; id <= 8; ++id) {
    auto m = guest_->next();
    ASSERT_TRUE(m) << "reply " << id;
    EXPECT_EQ(m->first.req_id, id);
    EXPECT_EQ(m->first.type, static_cast<std::uint32_t>(MsgType::read));
    EXPECT_EQ(m->second, value) << "reply " << id;
  }
  EXPECT_FALSE(guest_->next(200)) << "a request answered twice";
  EXPECT_EQ(guest_->buffered(), 0u);
  EXPECT_EQ(guest_->request(MsgType::read, z("v")), value);
}

// A request larger than the ring, taken off in part before the crash: the recovered daemon has its
// first bytes from the journal and takes the rest from the ring.
TEST_P(RingCrash, ARequestTakenOffInPartIsCompletedAfterTheCrash) {
  const std::string big(2000, 'b');
  const std::string msg = wire::encode(MsgType::write, 1, 0, z("big") + big);
  ASSERT_TRUE(guest_->send_raw(msg.substr(0, 600)));
  ASSERT_TRUE(eventually([&] { return load(dom_.intf()->req_cons) == 600; }));

  crash_and_recover();
  ASSERT_TRUE(guest_->send_raw(msg.substr(600)));
  auto m = guest_->next();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first.req_id, 1u);
  EXPECT_EQ(m->second, kOK);
  EXPECT_EQ(guest_->request(MsgType::read, z("big")), big);
}

// The dead daemon had journaled a request with its reply but neither published the request index
// nor written the reply (the page is put back that way): the request is not taken again — a
// TRANSACTION_START taken again would answer another transaction id —, its reply is written once.
TEST_P(RingCrash, ARequestJournaledButNotYetPublishedIsNotTakenAgain) {
  auto* i = dom_.intf();
  const std::uint32_t cons0 = load(i->req_cons), rsp0 = load(i->rsp_prod);
  send(MsgType::transaction_start, 1, z(""));
  ASSERT_TRUE(eventually([&] { return load(i->rsp_prod) - rsp0 > wire::kHeaderSize; }));
  const std::uint32_t len = load(i->rsp_prod) - rsp0;
  std::string first(len, '\0');
  for (std::uint32_t k = 0; k < len; ++k) first[k] = static_cast<char>(i->rsp[xpv::ring::xenstore_mask(rsp0 + k)]);

  crash();
  i->req_cons = cons0;
  i->rsp_prod = rsp0;
  for (int n = 1; n < GetParam(); ++n) {
    recover();
    crash();
  }
  recover();
  auto m = guest_->next();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first.req_id, 1u);
  EXPECT_EQ(wire::encode(MsgType::transaction_start, 1, 0, m->second), first) << "the request was taken again";
  EXPECT_FALSE(guest_->next(200)) << "the request was answered twice";
  EXPECT_EQ(load(i->req_cons), i->req_prod);
  EXPECT_EQ(guest_->request(MsgType::write, z("x") + "1"), kOK);
}

// Watch events written whole before the crash are not journaled; replies queued behind them
// still land exactly once, and an event that was still queued is made up for by the watch firing
// once at the recovery.
TEST_P(RingCrash, EventsAndRepliesInterleavedStayWellFormed) {
  ASSERT_EQ(guest_->request(MsgType::watch, z("data") + z("tok")), kOK);
  ASSERT_TRUE(guest_->wait_events(1));
  guest_->events.clear();
  const std::string value(400, 'v');
  on_io([&] {
    dom0(MsgType::write, z("/local/domain/1/v") + value);
    for (char c = 'a'; c <= 'e'; ++c) dom0(MsgType::write, z(std::string("/local/domain/1/data/") + c) + "1");
  });
  for (std::uint32_t id = 1; id <= 6; ++id) send(MsgType::read, id, z("v"));
  ASSERT_TRUE(ring_full_and_requests_taken());
  on_io([&] { dom0(MsgType::write, z("/local/domain/1/data/f") + "1"); });  // queued behind the replies

  crash_and_recover();
  std::vector<std::uint32_t> replies;
  std::multiset<std::string> events;
  while (auto m = guest_->next(300)) {
    if (m->first.type == static_cast<std::uint32_t>(MsgType::watch_event)) {
      events.insert(m->second.substr(0, m->second.find('\0')));
    } else {
      EXPECT_EQ(m->second, value);
      replies.push_back(m->first.req_id);
    }
  }
  EXPECT_EQ(guest_->buffered(), 0u) << "a message cut short";
  EXPECT_EQ(replies, (std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6}));
  // data/f's event was lost with the process; "data" is the watch firing at the recovery.
  EXPECT_EQ(events, (std::multiset<std::string>{"data/a", "data/b", "data/c", "data/d", "data/e", "data"}));
}

// A watch event queued behind a reply half on the ring is journaled only when it is left half on
// the ring in turn — after the reply to a later request, queued behind it, was journaled. The
// recovery still writes them in the ring's order: the rest of the event, then that reply.
TEST_P(RingCrash, AnEventJournaledAfterALaterReplyKeepsItsPlace) {
  ASSERT_EQ(guest_->request(MsgType::watch, z("data") + z("tok")), kOK);
  ASSERT_TRUE(guest_->wait_events(1));
  guest_->events.clear();
  const std::string value(400, 'v');
  const std::string leaf = "data/" + std::string(200, 'e');  // an event of 226 bytes
  on_io([&] { dom0(MsgType::write, z("/local/domain/1/v") + value); });
  for (std::uint32_t id = 1; id <= 3; ++id) send(MsgType::read, id, z("v"));
  ASSERT_TRUE(ring_full_and_requests_taken());  // 416 + 416 + 192 of the third reply
  on_io([&] { dom0(MsgType::write, z("/local/domain/1/" + leaf) + "1"); });  // the event, queued
  send(MsgType::read, 4, z("v"));  // its reply journaled behind the event
  auto* i = dom_.intf();
  ASSERT_TRUE(eventually([&] { return load(i->req_cons) == i->req_prod; }));
  // Room for the rest of the third reply (224 bytes) and 76 bytes of the event.
  guest_->take_bytes(300);
  ASSERT_TRUE(eventually([&] { return load(i->rsp_prod) - i->rsp_cons == xpv::ring::kXenstoreRingSize; }));

  crash_and_recover();
  std::vector<std::string> seen;
  while (auto m = guest_->next(300)) {
    if (m->first.type == static_cast<std::uint32_t>(MsgType::watch_event)) {
      seen.push_back("event " + m->second.substr(0, m->second.find('\0')));
    } else {
      EXPECT_EQ(m->second, value);
      seen.push_back("reply " + std::to_string(m->first.req_id));
    }
  }
  EXPECT_EQ(guest_->buffered(), 0u) << "a message cut short";
  EXPECT_EQ(seen, (std::vector<std::string>{"reply 1", "reply 2", "reply 3", "event " + leaf, "reply 4", "event data"}));
}

// The journal given up while things are between the ring and the store — its records dropped
// meanwhile, the connection counting them as journaled — and written again from a snapshot once
// it can be: a crash after that still answers every request once, in order, whole, and completes
// the request taken off in part.
TEST_P(RingCrash, AJournalWrittenAgainFromASnapshotCarriesTheRingOn) {
  const std::string value(400, 'v');
  const std::string blocker = dir_ + "/journal.tmp";  // where a snapshot is written first
  on_io([&] {
    dom0(MsgType::write, z("/local/domain/1/v") + value);
    std::filesystem::create_directory(blocker);  // so it cannot be written again for now
    journal_->lost("a test's lost change");
  });
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/journal"));
  for (std::uint32_t id = 1; id <= 8; ++id) send(MsgType::read, id, z("v"));
  const std::string big(1500, 'b');
  const std::string msg = wire::encode(MsgType::write, 9, 0, z("big") + big);
  ASSERT_TRUE(guest_->send_raw(msg.substr(0, 300)));
  ASSERT_TRUE(ring_full_and_requests_taken());
  EXPECT_TRUE(on_io([&] { return journal_->failed(); }));
  std::filesystem::remove(blocker);
  bool again = false;
  for (int i = 0; i < 400 && !again; ++i) {  // tried again 1, 2, 4 … s apart
    again = on_io([&] { return !journal_->failed(); });
    if (!again) std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(again) << "the journal was not written again within 40 s";

  crash_and_recover();
  ASSERT_TRUE(guest_->send_raw(msg.substr(300)));
  for (std::uint32_t id = 1; id <= 8; ++id) {
    auto m = guest_->next();
    ASSERT_TRUE(m) << "reply " << id;
    EXPECT_EQ(m->first.req_id, id);
    EXPECT_EQ(m->second, value) << "reply " << id;
  }
  auto w = guest_->next();
  ASSERT_TRUE(w);
  EXPECT_EQ(w->first.req_id, 9u);
  EXPECT_EQ(w->second, kOK);
  EXPECT_FALSE(guest_->next(200)) << "a request answered twice";
  EXPECT_EQ(guest_->request(MsgType::read, z("big")), big);
}

INSTANTIATE_TEST_SUITE_P(Crashes, RingCrash, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& i) { return i.param == 1 ? "Once" : "Twice"; });

// What the journal's ring records fold to (RingJournalState::apply), and what it refuses.
TEST(RingJournalState, FoldsRecordsAndDropsWhatIsWritten) {
  daemon::RingJournalState st;
  const std::string m1 = wire::encode(MsgType::read, 1, 0, "abc"), m2 = wire::encode(MsgType::read, 2, 0, "de");
  st.apply({{"cons", 30}, {"in", ""}, {"rsp", 100}, {"at", 100}, {"msg", hex(m1)}});
  st.apply({{"cons", 50}, {"in", "0102"}, {"rsp", 110}, {"at", 100 + m1.size()}, {"msg", hex(m2)}});
  EXPECT_TRUE(st.has_cons);
  EXPECT_EQ(st.cons, 50u);
  EXPECT_EQ(st.in, std::string("\x01\x02"));
  ASSERT_EQ(st.out.size(), 2u);
  st.apply({{"rsp", 100 + m1.size()}});  // m1 wholly written
  ASSERT_EQ(st.out.size(), 1u);
  EXPECT_EQ(st.out[0].second, m2);
  // The same message journaled again (left half on the ring) is kept once.
  st.apply({{"rsp", 100 + m1.size() + 4}, {"at", 100 + m1.size()}, {"msg", hex(m2)}});
  EXPECT_EQ(st.out.size(), 1u);
  // The bytes of a request taken in part come in pieces ("in_more"), a whole request at most.
  st.apply({{"cons", 52}, {"in_more", "0304"}});
  EXPECT_EQ(st.in, std::string("\x01\x02\x03\x04"));
  EXPECT_EQ(st.cons, 52u);
  daemon::RingJournalState big;
  big.apply({{"cons", 1}, {"in", hex(std::string(4000, 'x'))}});
  EXPECT_THROW(big.apply({{"cons", 2}, {"in_more", hex(std::string(200, 'x'))}}), std::runtime_error);
  // Positions wrap around 2^32.
  daemon::RingJournalState w;
  w.apply({{"rsp", 0xfffffff0u}, {"at", 0xfffffff0u}, {"msg", hex(m1)}});
  w.apply({{"rsp", 0xfffffff0u + m1.size() - 0x100000000ull}});
  EXPECT_TRUE(w.out.empty());
  // to_json() round trip.
  daemon::RingJournalState again;
  again.apply(st.to_json());
  EXPECT_EQ(again.cons, st.cons);
  EXPECT_EQ(again.in, st.in);
  EXPECT_EQ(again.rsp, st.rsp);
  EXPECT_EQ(again.out, st.out);
  // Refused: what is not a ring index, not hex, not a message.
  for (const nlohmann::json& bad : {nlohmann::json{{"cons", -1}}, nlohmann::json{{"cons", 1ull << 32}},
                                    nlohmann::json{{"cons", 1}, {"in", "xyz"}}, nlohmann::json{{"at", 1}, {"msg", "00"}},
                                    nlohmann::json{{"msg", hex(m1)}}, nlohmann::json{{"failed", 1}},
                                    nlohmann::json{{"out", 1}}}) {
    daemon::RingJournalState s;
    EXPECT_THROW(s.apply(bad), std::runtime_error) << bad.dump();
  }
}

// A journal whose ring record is wrong is refused naming the change; a domain introduced again
// starts without the old ring's state.
TEST(RingJournalState, AJournalsRingsAreFoldedPerDomain) {
  daemon::Journal::Contents c;
  c.rings = nlohmann::json::array({{{"domid", 1}, {"cons", 5}, {"in", ""}, {"rsp", 0}, {"out", nlohmann::json::array()}}});
  c.changes = {{{"op", "ring"}, {"domid", 1}, {"cons", 9}, {"in", ""}},
               {{"op", "ring"}, {"domid", 2}, {"cons", 4}, {"in", ""}},
               {{"op", "release"}, {"domid", 2}},
               {{"op", "introduce"}, {"domid", 2}, {"mfn", 1}, {"port", 1}}};
  auto st = c.ring_states();
  ASSERT_EQ(st.count(1), 1u);
  EXPECT_EQ(st.at(1).cons, 9u);
  EXPECT_EQ(st.count(2), 0u);
  c.changes.push_back({{"op", "ring"}, {"domid", 1}, {"cons", "nine"}});
  try {
    (void)c.ring_states();
    ADD_FAILURE() << "accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("change 5 of the journal: 'cons' is not a ring index"), std::string::npos)
        << e.what();
  }
}

}  // namespace
