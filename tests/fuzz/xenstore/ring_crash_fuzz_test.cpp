// Crash restart of xpv-xenstored under a domain's xenstore traffic, checked against a daemon that
// never dies. Seeded, bounded: a domain (ring_crash_rig.h: the test on an in-memory page, the
// daemon as xpv-xenstored builds it, with its journal) sends random requests — writes of up to
// 2000 bytes (so requests and replies cross the 1 KiB rings in pieces), reads, mkdir, rm,
// directories, permissions, watches, transactions —, sometimes only the first part of one, and
// reads its replies only now and then, sometimes a part of one, so that replies pile up behind a
// full ring; dom0 writes the domain's nodes too (its watches fire between its replies); between
// steps the daemon is killed (once, or twice in a row) and recovered from its journal. The same
// requests, in the same order, go to a reference Store that never dies.
//
// Invariant: the domain gets exactly the reference's replies — each request answered once, in
// order, byte for byte (watch events aside: those not yet on the ring when the daemon died are
// lost, and the recovery fires every watch once). A crash is made only when every request sent
// whole has been taken off the ring, and never inside a transaction (one open across a crash ends
// with EAGAIN by design: xenbus/README.md "Crash restart").
//
// Each run prints how many crashes found replies waiting and a request taken off in part. A
// failure prints its seed: XPV_FUZZ_SEED=N replays it; XPV_FUZZ_ITERATIONS=N runs N seeds
// (default 80).
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ring_crash_rig.h"
#include "xpv/test/fuzz_seeds.h"
#include "xpv/xenbus/hex.h"

namespace {

using xpv::test::kDom;
using xpv::test::load;
using xpv::test::MsgType;
using xpv::test::z;
namespace wire = xpv::xenbus::wire;

const bool kQuiet = [] {
  spdlog::set_level(xpv::test::env_number("XPV_FUZZ_LOG", 0) ? spdlog::level::info : spdlog::level::critical);
  return true;
}();

// One reply as the domain sees it: type, request id, transaction id, payload.
std::string reply_key(const wire::Header& h, std::string_view payload) {
  return std::to_string(h.type) + ":" + std::to_string(h.req_id) + ":" + std::to_string(h.tx_id) + ":" +
         xpv::xenbus::hex(payload);
}

struct ReferenceReplies : xpv::xenbus::Sink {
  std::vector<std::string> got;
  void deliver(const wire::Header& h, std::string_view payload) override {
    if (h.type != static_cast<std::uint32_t>(MsgType::watch_event)) got.push_back(reply_key(h, payload));
  }
};

class Domain : public xpv::test::RingCrashRig {
 public:
  explicit Domain(std::uint64_t seed) : rng_(seed) {
    if (!ref_.introduce(kDom, 0x1000, 3)) throw std::runtime_error("introduce");
    // The scene the rig's dom0 sets: the domain's home, owned by it.
    ref_dom0_ = ref_.connect(0, null_);
    auto dom0 = [&](MsgType t, const std::string& p) {
      ref_.handle(ref_dom0_, {static_cast<std::uint32_t>(t), 1, 0, static_cast<std::uint32_t>(p.size())}, p);
    };
    dom0(MsgType::mkdir, z("/local/domain/1"));
    dom0(MsgType::set_perms, z("/local/domain/1") + z("n1"));
    ref_conn_ = ref_.connect(kDom, ref_replies_);
  }

  std::mt19937_64& rng() { return rng_; }

  // A request of the domain's: to the reference at once, onto the ring whole or (the first part
  // of a large one, sometimes) in part — the rest goes first at the next send.
  void send(MsgType t, const std::string& payload, std::uint32_t tx = 0, bool may_split = true) {
    finish_partial();
    const std::uint32_t id = ++req_id_;
    const wire::Header h{static_cast<std::uint32_t>(t), id, tx, static_cast<std::uint32_t>(payload.size())};
    ref_.handle(ref_conn_, h, payload);
    const std::string msg = wire::encode(t, id, tx, payload);
    std::size_t cut = msg.size();
    if (may_split && msg.size() > 64 && rng_() % 4 == 0) cut = 1 + rng_() % (msg.size() - 1);
    if (!guest_->send_raw(msg.substr(0, cut))) throw std::runtime_error("the request ring stayed full");
    rest_ = msg.substr(cut);
  }
  void finish_partial() {
    if (rest_.empty()) return;
    if (!guest_->send_raw(rest_)) throw std::runtime_error("the request ring stayed full");
    rest_.clear();
  }
  bool partial() const { return !rest_.empty(); }

  // Takes up to `n` messages off the response ring (waiting up to `ms` for each); replies are
  // kept in order, events dropped. The reply to `want` (a request id) is returned if it came;
  // `count`, if given, gets how many messages were taken.
  std::optional<std::string> take(int n, int ms, std::uint32_t want = 0, int* count = nullptr) {
    std::optional<std::string> wanted;
    for (int i = 0; i < n; ++i) {
      auto m = guest_->next(ms);
      if (!m) break;
      if (count) ++*count;
      if (m->first.type == static_cast<std::uint32_t>(MsgType::watch_event)) continue;
      got_.push_back(reply_key(m->first, m->second));
      if (want != 0 && m->first.req_id == want) {
        wanted = m->second;
        break;
      }
    }
    return wanted;
  }

  // The domain reads part of what is on the response ring (the rest of a message waits).
  void take_bytes(std::size_t n) { guest_->take_bytes(n); }
  // dom0 writes one of the domain's nodes, on both stores: the domain's watches fire from another
  // connection, between its own replies. Only once the daemon has taken every request the
  // reference has seen (else the two would apply them in another order).
  void dom0_write() {
    if (partial() || !all_taken()) return;
    const std::string p = z("/local/domain/1/" + key()) + value();
    on_io([&] { dom0(MsgType::write, p); });
    ref_.handle(ref_dom0_, {static_cast<std::uint32_t>(MsgType::write), 1, 0, static_cast<std::uint32_t>(p.size())}, p);
  }

  std::string key() { return "k" + std::to_string(rng_() % 6) + (rng_() % 3 == 0 ? "/s" : ""); }
  std::string value() {
    const std::size_t n = rng_() % 4 == 0 ? 1000 + rng_() % 1000 : rng_() % 40;
    return std::string(n, static_cast<char>('a' + rng_() % 26));
  }

  // One random request, not in a transaction.
  void request() {
    switch (rng_() % 8) {
      case 0: case 1: send(MsgType::write, z(key()) + value()); break;
      case 2: send(MsgType::read, z(key())); break;
      case 3: send(MsgType::mkdir, z(key())); break;
      case 4: send(MsgType::rm, z(key())); break;
      case 5: send(MsgType::directory, z(rng_() % 2 ? "k1" : "k2")); break;
      case 6: send(MsgType::get_perms, z(key())); break;
      default: send(rng_() % 3 ? MsgType::watch : MsgType::unwatch, z(key()) + z("t" + std::to_string(rng_() % 2))); break;
    }
  }

  // A whole transaction: its id from the reply to TRANSACTION_START, one to three requests in it,
  // its end (commit or abort).
  void transaction() {
    send(MsgType::transaction_start, z(""), 0, false);
    const std::uint32_t start_id = req_id_;
    std::optional<std::string> id;
    for (int i = 0; i < 100 && !id; ++i) id = take(64, 50, start_id);
    if (!id) throw std::runtime_error("no reply to TRANSACTION_START within 5 s");
    const auto tx = static_cast<std::uint32_t>(std::stoul(*id));
    for (int i = 0, n = 1 + static_cast<int>(rng_() % 3); i < n; ++i) {
      if (rng_() % 2) {
        send(MsgType::write, z(key()) + value(), tx);
      } else {
        send(MsgType::read, z(key()), tx);
      }
    }
    send(MsgType::transaction_end, z(rng_() % 4 ? "T" : "F"), tx);
  }

  // A crash (and perhaps a second one right after the recovery) once every request sent whole has
  // been taken off the ring. Returns false if that did not happen in time (the daemon stops
  // taking requests while 20 replies wait: the quota).
  bool crash_when_taken(int times, bool& replies_waiting) {
    if (!all_taken()) return false;
    auto* i = dom_.intf();
    const bool ring_has_unread = load(i->rsp_prod) != i->rsp_cons;
    bool queued = false;
    on_io([&] { queued = conn_->journal_state().out.size() > 0; });
    replies_waiting = ring_has_unread || queued;
    crash_and_recover(times);
    return true;
  }

  // Every byte sent is taken off the ring, within 300 ms.
  bool all_taken() {
    auto* i = dom_.intf();
    for (int k = 0; k < 30 && load(i->req_cons) != i->req_prod; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return load(i->req_cons) == i->req_prod;
  }

  std::uint32_t sent() const { return req_id_; }
  const std::vector<std::string>& got() const { return got_; }
  const std::vector<std::string>& expected() const { return ref_replies_.got; }

 private:
  std::mt19937_64 rng_;
  xpv::xenbus::Store ref_;
  xpv::test::NullSink null_;
  ReferenceReplies ref_replies_;
  xpv::xenbus::ConnId ref_conn_ = 0, ref_dom0_ = 0;
  std::uint32_t req_id_ = 0;
  std::string rest_;
  std::vector<std::string> got_;
};

TEST(XenstoreRingCrashFuzz, EveryRequestIsAnsweredOnceAsIfTheDaemonHadNeverDied) {
  const auto [first, last] = xpv::test::fuzz_seeds(80);
  std::uint64_t requests = 0, crashes = 0, with_replies = 0, with_partial = 0, skipped = 0;
  for (std::uint64_t seed = first; seed <= last; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    try {
      Domain r(seed);
      for (int step = 0; step < 150; ++step) {
        // A request left in part is often the moment of a crash.
        const auto what = r.partial() && r.rng()() % 2 ? 99 : r.rng()() % 100;
        if (what < 55) {
          r.request();
        } else if (what < 65) {
          r.take(static_cast<int>(r.rng()() % 6), 0);
        } else if (what < 70) {
          r.take_bytes(r.rng()() % 600);
        } else if (what < 75) {
          r.dom0_write();
        } else if (what < 85) {
          r.transaction();
        } else {
          bool waiting = false;
          const bool partial = r.partial();
          if (!r.crash_when_taken(r.rng()() % 4 == 0 ? 2 : 1, waiting)) {
            ++skipped;
            r.take(8, 50);
            continue;
          }
          ++crashes;
          with_replies += waiting ? 1 : 0;
          with_partial += partial ? 1 : 0;
        }
      }
      r.finish_partial();
      // Every reply (each within 5 s), then nothing more.
      for (int taken = 1; taken > 0 && r.got().size() < r.expected().size();) {
        taken = 0;
        r.take(1, 5000, 0, &taken);
      }
      r.take(64, 100);
      requests += r.sent();
      ASSERT_EQ(r.expected().size(), r.sent()) << "the reference answers every request";
      ASSERT_EQ(r.got().size(), r.expected().size()) << "replies missing or answered twice";
      for (std::size_t i = 0; i < r.got().size(); ++i) {
        ASSERT_EQ(r.got()[i], r.expected()[i]) << "reply " << i + 1 << " (type:req_id:tx:payload)";
      }
    } catch (const std::exception& e) {
      FAIL() << e.what();
    }
  }
  std::printf("xenstore ring crash: %llu requests, %llu crashes (%llu with replies waiting, %llu with a request "
              "taken off in part), %llu not made (the ring was not drained in time)\n",
              static_cast<unsigned long long>(requests), static_cast<unsigned long long>(crashes),
              static_cast<unsigned long long>(with_replies), static_cast<unsigned long long>(with_partial),
              static_cast<unsigned long long>(skipped));
  if (last - first + 1 >= 10) {
    EXPECT_GT(with_replies, 0u) << "no crash found replies waiting";
    EXPECT_GT(with_partial, 0u) << "no crash found a request taken off in part";
  }
}

}  // namespace
