// The crash-restart rig of the xenstore ring tests (ring_crash_test.cpp, tests/fuzz/xenstore's
// ring_crash_fuzz_test.cpp): the test plays domain 1 on an in-memory page (ring_client.h) and the
// daemon is built as xpv-xenstored builds it — a Store with a Journal on a file, one
// RingConnection, on their own io thread. crash() drops them without a clean stop (nothing more
// reaches the journal or the page); recover() is main.cpp's recovery (Store::recover,
// Journal::Contents::ring_states, RingConnection::recover, a new Journal, serve, the watches fired
// once).
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <thread>

#include "ring_client.h"
#include "ring_domain.h"
#include "xpv/test/io_thread.h"
#include "xpv/xenbus/daemon/journal.h"
#include "xpv/xenbus/daemon/ring_connection.h"

namespace xpv::test {

namespace daemon = xenbus::daemon;
namespace wire = xenbus::wire;
using xenbus::ConnId;
using xenbus::DomId;
using xenbus::Sink;
using xenbus::Store;
using wire::MsgType;

inline std::string z(std::string_view v) { return std::string(v) + std::string(1, '\0'); }
inline constexpr DomId kDom = 1;

inline std::uint32_t load(std::uint32_t& v) { return std::atomic_ref<std::uint32_t>(v).load(std::memory_order_acquire); }

// dom0's requests, made directly on the Store; their replies are dropped.
struct NullSink : Sink {
  void deliver(const wire::Header&, std::string_view) override {}
};

class RingCrashRig {
 public:
  RingCrashRig() {
    char tmpl[] = "/tmp/xpv-ringcrash-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp");
    dir_ = tmpl;
    on_io([&] {
      store_ = std::make_unique<Store>();
      journal_ = make_journal();
      if (!store_->introduce(kDom, 0x1000, 3)) throw std::runtime_error("introduce");
      dom0_ = store_->connect(0, null_);
      dom0(MsgType::mkdir, z("/local/domain/1"));
      dom0(MsgType::set_perms, z("/local/domain/1") + z("n1"));
      conn_ = make_conn();
      conn_->start();
    });
    guest_ = std::make_unique<xpv::test::RingClient>(dom_.intf(), dom_.kick_in.get(), dom_.kick_out.get());
  }
  ~RingCrashRig() {
    on_io([&] {
      if (conn_) conn_->close();
      conn_.reset();
      journal_.reset();
      store_.reset();
    });
    io_.stop();
    std::filesystem::remove_all(dir_);
  }

  template <class F>
  auto on_io(F f) -> decltype(f()) {
    return io_.run(std::move(f));
  }
  void dom0(MsgType t, const std::string& payload) {
    store_->handle(dom0_, {static_cast<std::uint32_t>(t), 1, 0, static_cast<std::uint32_t>(payload.size())}, payload);
  }
  std::unique_ptr<daemon::Journal> make_journal() {
    return std::make_unique<daemon::Journal>(io_.io(), *store_, dir_ + "/journal", [this] {
      nlohmann::json rings = nlohmann::json::array();
      if (conn_) {
        auto j = conn_->journal_state().to_json();
        j["domid"] = kDom;
        rings.push_back(std::move(j));
      }
      return rings;
    });
  }
  std::shared_ptr<daemon::RingConnection> make_conn() {
    return std::make_shared<daemon::RingConnection>(io_.io(), *store_, std::span<std::uint8_t>(dom_.page),
                                                    ::dup(dom_.kick_in.get()), ::dup(dom_.kick_out.get()), kDom);
  }

  // The daemon dies: nothing more reaches the journal or the page.
  void crash() {
    on_io([&] {
      journal_.reset();
      conn_->close();
      conn_.reset();
      store_.reset();
    });
  }
  // A daemon started on the journal the dead one left (main.cpp's order).
  void recover() {
    on_io([&] {
      auto contents = daemon::Journal::read(dir_ + "/journal");
      store_ = std::make_unique<Store>();
      const auto rec = store_->recover(contents.snapshot, contents.changes);
      if (rec.size() != 1) throw std::runtime_error("the journal does not have the domain");
      const auto rings = contents.ring_states();
      ring_journaled_ = rings.count(kDom) == 1;
      dom0_ = store_->connect(0, null_);
      conn_ = make_conn();
      // Without a record of the ring (nothing happened on it since its domain was introduced):
      // served from the page's indexes, as Domains::recover does.
      conn_->recover(rec[0].conn, ring_journaled_ ? rings.at(kDom) : daemon::RingJournalState{});
      journal_ = make_journal();  // its snapshot has the ring as recovered
      recovered_conn_ = rec[0].conn;
    });
    on_io([&] {
      conn_->serve();
      store_->refire_watches(recovered_conn_);
    });
  }
  // `times` crashes in a row (a second one before the domain read anything: the first
  // recovery's snapshot must carry the ring's state on).
  void crash_and_recover(int times) {
    for (int i = 0; i < times; ++i) {
      crash();
      recover();
    }
  }
  bool send(MsgType t, std::uint32_t req_id, const std::string& payload) {
    return guest_->send_raw(wire::encode(t, req_id, 0, payload));
  }
  template <class P>
  static bool eventually(P p) {
    for (int i = 0; i < 500; ++i) {
      if (p()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return p();
  }
  // The response ring is full and every request taken: what the daemon holds now is queued.
  bool ring_full_and_requests_taken() {
    auto* i = dom_.intf();
    return eventually([&] {
      return load(i->rsp_prod) - i->rsp_cons == xpv::ring::kXenstoreRingSize && load(i->req_cons) == i->req_prod;
    });
  }

  std::string dir_;
  xpv::test::IoThread io_;  // before what lives on it
  NullSink null_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<daemon::Journal> journal_;
  ConnId dom0_ = 0, recovered_conn_ = 0;
  bool ring_journaled_ = false;  // the last recovery found the ring's state in the journal
  xpv::test::RingDomain dom_;
  std::shared_ptr<daemon::RingConnection> conn_;
  std::unique_ptr<xpv::test::RingClient> guest_;
};

}  // namespace xpv::test
