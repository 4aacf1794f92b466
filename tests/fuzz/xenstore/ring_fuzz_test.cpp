// xpv-xenstored's ring transport and store against hostile domains: seeded, bounded fuzzing of
// everything a guest controls on its xenstore page — request bytes, header fields (a length that
// lies, any type, any transaction id), paths, values, permissions, watch tokens, privileged
// requests, and the page's indexes and fields, including the ones only xenstored should write
// (req_cons, rsp_prod) — while the daemon serves the page on its own thread, as it does in
// xpv-xenstored. Two hostile domains (7 and 8) do this at once next to two well-behaved ones:
// dom0 (privileged) and dom5 (a guest with its own home). For 1000 steps the hostile domains send
// everything but what ends a ring (so that a long stretch of hostile requests is served), then for
// 500 more also that: lengths over the limit, cut messages, random bytes, wild indexes.
//
// Invariants (each one fails for a real bug):
//   - the well-behaved domains keep being served throughout (a round trip every 100 steps, each
//     bounded at 5 s: a daemon that a guest can wedge or starve fails here);
//   - what the hostile domains may not touch stays as it was: dom0's /secret (no access for
//     anyone), dom5's /local/domain/5/data (dom5's own), and both nodes' permissions;
//   - the quotas hold: each hostile domain owns at most `nodes` nodes (deliberately few here, so
//     that the fuzzer reaches the limit) and the tree grows by no more than their quotas;
//   - a ring xenstored gave up on (protocol error) is left alone: nothing more is written to it
//     whatever the domain does (rsp_prod keeps a value the test put there);
//   - the crash-restart journal (store.h ChangeLog) is exact: a Store recovered from the snapshot
//     taken before the first request and every change recorded after it has the live store's
//     nodes — values, permissions, child order, generations — and per-domain node counts; the
//     rings' own records in it (daemon/ring_connection.h) fold, whatever a domain did to its page.
// Each run prints what the fuzzer got through. A failure prints its seed (SCOPED_TRACE):
// XPV_FUZZ_SEED=N replays it, XPV_FUZZ_LOG=1 shows the daemon's log; XPV_FUZZ_ITERATIONS=N runs
// N seeds (default 30).
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ring_client.h"
#include "ring_domain.h"
#include "xpv/test/fuzz_seeds.h"
#include "xpv/xenbus/daemon/journal.h"
#include "xpv/xenbus/daemon/ring_connection.h"

namespace xpv::xenbus {
namespace {

using wire::MsgType;
using xpv::test::RingClient;

using xpv::test::env_number;

std::string z(std::string_view v) { return std::string(v) + std::string(1, '\0'); }
const std::string kOK("OK\0", 3);

using Domain = xpv::test::RingDomain;

// The journal's side of the store, kept in memory: every change record as its text.
struct TextLog : ChangeLog {
  std::vector<std::string> lines;
  void record(std::string_view change) override { lines.emplace_back(change); }
  void commit() noexcept override {}
  void lost(std::string_view what) noexcept override { ADD_FAILURE() << "a change was lost: " << what; }
};

std::vector<std::string> node_dumps(const Store& s) {
  std::vector<std::string> out;
  const nlohmann::json saved = s.save();
  for (const auto& n : saved.at("nodes")) out.push_back(n.dump());
  std::sort(out.begin(), out.end());
  return out;
}

// The daemon's complaints about the hostile domains are the point here, not worth printing.
const bool kQuiet = [] {
  spdlog::set_level(env_number("XPV_FUZZ_LOG", 0) ? spdlog::level::info : spdlog::level::critical);
  return true;
}();

Quotas small_quotas() {
  Quotas q;
  q.nodes = 12;
  q.node_size = 256;
  q.watches = 8;
  q.transactions = 3;
  q.outstanding = 8;
  q.path_max = 200;
  q.perms = 3;
  q.pending_events = 64;
  q.transaction_nodes = 16;
  return q;
}

class World {
 public:
  explicit World(std::uint64_t seed) : rng_(seed), store_(small_quotas()) {}

  template <class F>
  void on_io(F fn) {
    daemon_.on_io(fn);
  }
  Domain& attach(DomId domid) { return daemon_.attach(domid); }

  std::mt19937_64& rng() { return rng_; }
  Store& store() { return store_; }

  // ---- what a hostile domain writes ----------------------------------------------------------

  // Half of them in the domain's own home (absolute or relative), where it may create nodes and
  // so reach its quotas; the rest anywhere.
  std::string path(DomId self) {
    if (rng_() % 2 == 0) {
      std::string p = rng_() % 2 ? "/local/domain/" + std::to_string(self) + "/" : "";
      return p + "k" + std::to_string(rng_() % 60) + (rng_() % 3 == 0 ? "/s" + std::to_string(rng_() % 5) : "");
    }
    static const char* const kPaths[] = {
        "/secret", "/secret/child", "/local/domain/5/data", "/local/domain/5", "/local/domain/5/new",
        "/local/domain/7/x", "/local/domain/8/y/z", "/local/domain/7", "/local", "/", "",
        "data", "x/y", "@introduceDomain", "@releaseDomain", "/local/domain/0/backend/vbd/7/51712",
        "/tool/xenstored", "//double", "/trailing/", "/local/domain/7/a b",
    };
    std::string p = kPaths[rng_() % std::size(kPaths)];
    switch (rng_() % 8) {
      case 0: p += "/" + std::to_string(rng_() % 50); break;
      case 1: p += std::string(rng_() % 400, 'a'); break;
      case 2:
        for (int i = 0, n = static_cast<int>(rng_() % 12); i < n; ++i) p += static_cast<char>(rng_());
        break;
      default: break;
    }
    return p;
  }
  std::string value() {
    std::string v(rng_() % 4 == 0 ? rng_() % 3000 : rng_() % 40, '\0');
    for (auto& c : v) c = static_cast<char>(rng_() % 3 == 0 ? rng_() : 'a' + rng_() % 26);
    return v;
  }
  std::string perms() {
    static const char* const kPerms[] = {"n7", "b7", "r5", "w0", "n0", "b8", "x9", "n", "b4294967295", "r7"};
    std::string s;
    for (int i = 0, n = static_cast<int>(rng_() % 5); i < n; ++i) s += z(kPerms[rng_() % std::size(kPerms)]);
    return s;
  }
  std::string payload(std::uint32_t type, DomId self) {
    switch (static_cast<MsgType>(type)) {
      case MsgType::write: return z(path(self)) + value();
      case MsgType::set_perms: return z(path(self)) + perms();
      case MsgType::watch:
      case MsgType::unwatch: return z(path(self)) + z("tok" + std::to_string(rng_() % 12));
      case MsgType::transaction_start: return z("");
      case MsgType::transaction_end: return z(rng_() % 2 ? "T" : rng_() % 2 ? "F" : "X");
      case MsgType::introduce: return z(std::to_string(rng_() % 10)) + z(std::to_string(rng_())) + z("4");
      case MsgType::release:
      case MsgType::get_domain_path:
      case MsgType::is_domain_introduced:
      case MsgType::resume: return z(std::to_string(rng_() % 10));
      case MsgType::set_target: return z(std::to_string(rng_() % 10)) + z(std::to_string(rng_() % 10));
      case MsgType::control: return z(rng_() % 2 ? "quota" : "log") + z("nodes") + z("100000");
      default:
        if (rng_() % 3 == 0) return value();
        return rng_() % 4 == 0 ? path(self) : z(path(self));  // sometimes without its NUL
    }
  }

  // Writes `bytes` into d's request ring at req_prod and kicks. A message that does not fit is
  // dropped whole — a cut one misframes every later message, which usually ends the ring —
  // except now and then with `cut`, when what fits goes.
  void put(Domain& d, const std::string& bytes, bool cut) {
    auto* p = d.intf();
    std::atomic_ref<std::uint32_t> cons(p->req_cons), prod(p->req_prod);
    std::uint32_t at = prod.load();
    const std::uint32_t space = ring::kXenstoreRingSize - std::min<std::uint32_t>(at - cons.load(), ring::kXenstoreRingSize);
    if (space < bytes.size() && !(cut && rng_() % 16 == 0)) {
      d.kick();
      return;
    }
    const std::size_t n = std::min<std::size_t>(space, bytes.size());
    for (std::size_t i = 0; i < n; ++i) p->req[ring::xenstore_mask(at + static_cast<std::uint32_t>(i))] = bytes[i];
    prod.store(at + static_cast<std::uint32_t>(n));
    d.kick();
  }

  void message(Domain& d, bool killers) {
    std::uint32_t type = static_cast<std::uint32_t>(rng_() % 10 == 0 ? rng_() % 64 : rng_() % 23);
    if (rng_() % 50 == 0) type = static_cast<std::uint32_t>(rng_());
    const std::string body = payload(type, d.domid);
    wire::Header h{type, static_cast<std::uint32_t>(rng_()),
                   static_cast<std::uint32_t>(rng_() % 3 == 0 ? rng_() % 6 : rng_() % 10 == 0 ? rng_() : 0),
                   static_cast<std::uint32_t>(body.size())};
    if (killers && rng_() % 50 == 0) h.len = static_cast<std::uint32_t>(rng_() % 2 ? rng_() : body.size() + rng_() % 100);
    std::string raw(sizeof h, '\0');
    std::memcpy(raw.data(), &h, sizeof h);
    put(d, raw + body, killers);
    ++sent_;
  }

  void garbage(Domain& d) {
    std::string b(1 + rng_() % 64, '\0');
    for (auto& c : b) c = static_cast<char>(rng_());
    put(d, b, true);
  }

  void consume(Domain& d) {
    auto* p = d.intf();
    std::atomic_ref<std::uint32_t>(p->rsp_cons).store(std::atomic_ref<std::uint32_t>(p->rsp_prod).load());
    d.kick();
  }

  // The fields of the page a well-behaved domain never writes, and indexes moved anywhere.
  void wild(Domain& d) {
    auto* p = d.intf();
    std::uint32_t* fields[] = {&p->req_cons, &p->req_prod, &p->rsp_cons, &p->rsp_prod,
                               &p->server_features, &p->connection, &p->error};
    std::uint32_t& f = *fields[rng_() % std::size(fields)];
    std::atomic_ref<std::uint32_t> a(f);
    a.store(static_cast<std::uint32_t>(rng_() % 2 ? rng_() : a.load() + rng_() % 4000 - 2000));
    d.kick();
  }

  // With `killers`, also what ends a ring (a length over the limit, random bytes, wild
  // indexes); without, everything else, so that a long stretch of hostile requests is served.
  void hostile_step(Domain& d, bool killers) {
    switch (rng_() % 20) {
      case 0:
        if (killers && rng_() % 4 == 0) garbage(d);
        break;
      case 1:
      case 2: consume(d); break;
      case 3:
        if (killers && rng_() % 4 == 0) wild(d);
        break;
      default: message(d, killers); break;
    }
  }

  std::uint64_t sent() const { return sent_; }

 private:
  std::mt19937_64 rng_;
  Store store_;
  xpv::test::RingDaemon daemon_{store_};
  std::uint64_t sent_ = 0;
};

TEST(XenstoreRingFuzz, HostileDomainsNeitherStopOthersNorReachWhatIsNotTheirs) {
  const std::uint64_t n = env_number("XPV_FUZZ_ITERATIONS", 30);
  const std::uint64_t only = env_number("XPV_FUZZ_SEED", 0);
  std::uint64_t total_sent = 0, failed_rings = 0, quota_hits = 0, journaled = 0, ring_states = 0;
  for (std::uint64_t seed = 1; seed <= n; ++seed) {
    if (only != 0 && seed != only) continue;
    SCOPED_TRACE("seed " + std::to_string(seed));
    World w(seed);
    TextLog log;
    nlohmann::json snapshot;
    w.on_io([&] {
      snapshot = w.store().save();
      w.store().set_change_log(&log);
    });
    Domain& d0 = w.attach(0);
    Domain& d5 = w.attach(5);
    // dom0 sets the scene as a toolstack would: homes owned by their domains, a private node.
    for (const char* home : {"/local/domain/5", "/local/domain/7", "/local/domain/8"}) {
      ASSERT_EQ(d0.client->request(MsgType::write, z(home)), kOK);
      ASSERT_EQ(d0.client->request(MsgType::set_perms, z(home) + z(std::string("n") + (home + 14))), kOK);
    }
    ASSERT_EQ(d0.client->request(MsgType::write, z("/secret") + "s"), kOK);
    ASSERT_EQ(d0.client->request(MsgType::set_perms, z("/secret") + z("n0")), kOK);
    ASSERT_EQ(d5.client->request(MsgType::write, z("/local/domain/5/data") + "mine"), kOK);
    const std::string secret_perms = d0.client->request(MsgType::get_perms, z("/secret"));
    const std::string data_perms = d0.client->request(MsgType::get_perms, z("/local/domain/5/data"));
    ASSERT_EQ(secret_perms, z("n0"));
    ASSERT_EQ(data_perms, z("n5"));
    std::size_t base_nodes = 0;
    w.on_io([&] { base_nodes = w.store().node_count(); });
    Domain* hostile[2] = {&w.attach(7), &w.attach(8)};

    auto check_others = [&](int round) {
      SCOPED_TRACE("round " + std::to_string(round));
      const std::string v = "v" + std::to_string(round);
      ASSERT_EQ(d5.client->request(MsgType::write, z("/local/domain/5/count") + v), kOK) << "dom5 not served";
      ASSERT_EQ(d5.client->request(MsgType::read, z("/local/domain/5/count")), v);
      ASSERT_EQ(d5.client->request(MsgType::read, z("/local/domain/5/data")), "mine");
      ASSERT_EQ(d0.client->request(MsgType::read, z("/secret")), "s") << "dom0 not served, or /secret changed";
      EXPECT_EQ(d0.client->request(MsgType::get_perms, z("/secret")), secret_perms);
      EXPECT_EQ(d0.client->request(MsgType::get_perms, z("/local/domain/5/data")), data_perms);
    };

    for (int s = 0; s < 1500; ++s) {
      w.hostile_step(*hostile[w.rng()() % 2], /*killers=*/s >= 1000);
      if (s % 100 == 99) {
        check_others(s / 100);
        if (testing::Test::HasFatalFailure()) return;
      }
    }
    check_others(1000);
    if (testing::Test::HasFatalFailure()) return;

    // Quotas, read on the daemon's thread.
    const Quotas q = small_quotas();
    w.on_io([&] {
      for (DomId d : {7u, 8u}) {
        EXPECT_LE(w.store().owned_nodes(d), q.nodes) << "dom" << d << " owns more nodes than its quota";
        quota_hits += w.store().owned_nodes(d) == q.nodes ? 1 : 0;
      }
      EXPECT_LE(w.store().node_count(), base_nodes + 2 * q.nodes + 2) << "the tree grew past the quotas";
    });

    // The journal replays to the live tree.
    w.on_io([&] {
      w.store().set_change_log(nullptr);
      journaled += log.lines.size();
      std::vector<nlohmann::json> changes;
      for (const auto& l : log.lines) changes.push_back(nlohmann::json::parse(l));
      Store again(small_quotas());
      try {
        again.recover(snapshot, changes);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "the journal does not replay: " << e.what();
        return;
      }
      EXPECT_EQ(node_dumps(again), node_dumps(w.store())) << "the journal replays to another tree";
      for (DomId d : {0u, 5u, 7u, 8u}) EXPECT_EQ(again.owned_nodes(d), w.store().owned_nodes(d)) << "dom" << d;
      // The rings' own records, whatever the hostile domains did to their pages, fold.
      daemon::Journal::Contents contents;
      contents.snapshot = snapshot;
      contents.changes = std::move(changes);
      try {
        ring_states += contents.ring_states().size();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "the rings' records do not fold: " << e.what();
      }
    });

    // A ring given up on stays given up on.
    for (Domain* d : hostile) {
      bool failed = false;
      w.on_io([&] { failed = d->conn->failed(); });
      if (!failed) continue;
      ++failed_rings;
      std::atomic_ref<std::uint32_t> rsp_prod(d->intf()->rsp_prod);
      rsp_prod.store(0xfeedf00d);
      d->intf()->rsp_cons = 0xfeedf00d;
      for (int i = 0; i < 20; ++i) w.message(*d, false);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      w.on_io([] {});
      EXPECT_EQ(rsp_prod.load(), 0xfeedf00du) << "xenstored wrote to a ring it had given up on";
    }
    total_sent += w.sent();
  }
  std::printf("xenstore ring: %llu hostile messages, %llu rings given up on, %llu quotas reached, %llu changes "
              "journaled and replayed, %llu ring states folded\n",
              static_cast<unsigned long long>(total_sent), static_cast<unsigned long long>(failed_rings),
              static_cast<unsigned long long>(quota_hits), static_cast<unsigned long long>(journaled),
              static_cast<unsigned long long>(ring_states));
  EXPECT_GT(journaled, n == 0 || only != 0 ? 0u : 100 * n) << "the hostile domains changed next to nothing";
  EXPECT_GT(ring_states, 0u) << "no ring journaled its state";
}

}  // namespace
}  // namespace xpv::xenbus
