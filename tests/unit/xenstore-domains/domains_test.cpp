// xpv-xenstored's attachment of real domains (daemon::Domains), in one process: a real process
// Domain (memfd memory, event channels, control socket in a temp dir) with GuestEvents and the
// domain's own RingClient, and the daemon side (Store + Domains) on its own io thread — the same
// objects xpv-xenstored and xpv-front are built from.
#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <mutex>
#include <thread>

#include "xpv/domain/domain.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/xenbus/client/ring_client.h"
#include "xpv/xenbus/daemon/domains.h"
#include "xpv/xenbus/daemon/journal.h"

namespace xpv {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using xenbus::wire::Error;
using xenbus::wire::MsgType;

std::string z(std::string_view s) { return std::string(s) + std::string(1, '\0'); }

// A dom0 connection that records watch events.
struct Recorder : xenbus::Sink {
  void deliver(const xenbus::wire::Header& h, std::string_view payload) override {
    if (h.type != static_cast<std::uint32_t>(MsgType::watch_event)) return;
    std::lock_guard l(m);
    events.emplace_back(payload.substr(0, payload.find('\0')));
  }
  std::size_t count(const std::string& path) {
    std::lock_guard l(m);
    return static_cast<std::size_t>(std::count(events.begin(), events.end(), path));
  }
  std::mutex m;
  std::vector<std::string> events;
};

class Domains : public ::testing::Test {
 protected:
  template <class F>
  static auto run_on(asio::io_context& io, F f) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto fut = task.get_future();
    asio::post(io, [&task] { task(); });
    return fut.get();
  }
  template <class F>
  auto on_xs(F f) { return run_on(xs_io_, std::move(f)); }
  template <class F>
  auto on_dom(F f) { return run_on(dom_io_, std::move(f)); }
  Domains() {
    char tmpl[] = "/tmp/xpv-xsdom-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp");
    dir_ = tmpl;
    store_ = std::make_unique<xenbus::Store>(xenbus::Quotas{}, hooks());
    domains_ = std::make_unique<xenbus::daemon::Domains>(xs_io_, *store_, dir_);
    xs_thread_ = std::thread([this] { xs_io_.run(); });
    dom_thread_ = std::thread([this] { dom_io_.run(); });
    on_xs([this] {
      watcher_ = store_->connect(0, recorder_);
      dom0(MsgType::watch, z("@introduceDomain") + z("i"));
      dom0(MsgType::watch, z("@releaseDomain") + z("r"));
      dom0(MsgType::mkdir, z("/local/domain/7"));
      dom0(MsgType::set_perms, z("/local/domain/7") + z("n7"));
      dom0(MsgType::write, z("/local/domain/7/name") + "seven");
      dom0(MsgType::write, z("/local/domain/8/name") + "eight");
    });
  }
  ~Domains() override {
    stop_domain();
    on_xs([this] {
      journal_.reset();
      domains_.reset();
      if (store_) store_->disconnect(watcher_);
    });
    xs_work_.reset();
    dom_work_.reset();
    xs_io_.stop();
    dom_io_.stop();
    xs_thread_.join();
    dom_thread_.join();
    std::filesystem::remove_all(dir_);
  }
  xenbus::Hooks hooks() {
    xenbus::Hooks h;
    h.attach = [this](xenbus::DomId d, std::uint64_t mfn, std::uint32_t port) {
      return domains_->attach(d, mfn, port);
    };
    h.released = [this](xenbus::DomId d) { domains_->released(d); };
    return h;
  }
  // A live update in this process: what the daemon saves, the daemon side torn down (the old
  // binding of the domain's port goes, as when the exec closes the control connection), and what
  // the next binary makes of the state.
  nlohmann::json save_and_stop_daemon() {
    auto state = on_xs([&] { return nlohmann::json{{"store", store_->save()}, {"rings", domains_->save()}}; });
    on_xs([&] { domains_.reset(); });
    return state;
  }
  void restart_daemon(const nlohmann::json& state) {
    on_xs([&] {
      store_ = std::make_unique<xenbus::Store>(xenbus::Quotas{}, hooks());
      store_->restore(state.at("store"));
      store_->attach_sink(watcher_, recorder_);
      domains_ = std::make_unique<xenbus::daemon::Domains>(xs_io_, *store_, dir_);
      domains_->restore(state.at("rings"));
    });
  }
  // A crash of the daemon in this process: the daemon side torn down without a clean stop (the
  // journal file stays, with whatever the daemon had acknowledged), then a new one that recovers
  // from it — what `xpv-xenstored --journal FILE` does when FILE exists at its start.
  void start_journal() {
    on_xs([&] { journal_ = make_journal(); });
  }
  std::unique_ptr<xenbus::daemon::Journal> make_journal() {
    return std::make_unique<xenbus::daemon::Journal>(xs_io_, *store_, dir_ + "/journal",
                                                     [this] { return domains_->journal_state(); });
  }
  void crash_daemon() {
    on_xs([&] {
      journal_.reset();
      domains_.reset();
      store_.reset();
    });
  }
  void recover_daemon() {
    on_xs([&] {
      auto contents = xenbus::daemon::Journal::read(dir_ + "/journal");
      store_ = std::make_unique<xenbus::Store>(xenbus::Quotas{}, hooks());
      const auto rec = store_->recover(contents.snapshot, contents.changes);
      watcher_ = store_->connect(0, recorder_);  // the socket client connects again
      dom0(MsgType::watch, z("@releaseDomain") + z("r"));
      domains_ = std::make_unique<xenbus::daemon::Domains>(xs_io_, *store_, dir_);
      domains_->recover(rec, contents.ring_states());
      journal_ = make_journal();
    });
  }
  // The paths of the watch events a domain's RingClient got.
  struct Seen {
    void add(const std::string& path) {
      std::lock_guard l(m);
      paths.push_back(path);
    }
    std::size_t count(const std::string& path) {
      std::lock_guard l(m);
      return static_cast<std::size_t>(std::count(paths.begin(), paths.end(), path));
    }
    std::mutex m;
    std::vector<std::string> paths;
  };
  // Domain 7 started, introduced and connected, data/x = 1 written, and a watch on "data" whose
  // events go to `seen` (the registration's event already arrived).
  void start_watching_domain(Seen& seen) {
    start_domain();
    ASSERT_TRUE(introduce(7, domain::Domain::kXenstoreGfn, domain_->xenstore_port()));
    ASSERT_TRUE(client_->wait_connected(3000ms));
    ASSERT_TRUE(client_->write("data/x", "1"));
    ASSERT_TRUE(client_->watch("data", "tok", [&seen](const std::string& path, const std::string&) { seen.add(path); }));
    ASSERT_TRUE(eventually([&] { return seen.count("data") == 1; })) << "the registration's event";
  }
  void dom0(MsgType t, const std::string& payload) {
    xenbus::wire::Header h{static_cast<std::uint32_t>(t), 1, 0, static_cast<std::uint32_t>(payload.size())};
    store_->handle(watcher_, h, payload);
  }

  void start_domain(std::uint16_t domid = 7) {
    domain::DomainConfig cfg;
    cfg.domid = domid;
    cfg.name = "xs-test";
    cfg.memory_bytes = 16 << 20;
    cfg.run_dir = dir_;
    sink_ = std::make_unique<Sink>();
    on_dom([&] { domain_ = std::make_unique<domain::Domain>(dom_io_, cfg, *sink_); });
    events_ = std::make_unique<frontends::GuestEvents>(domain_->pages(domain::Domain::kSharedInfoGfn, 1));
    sink_->target = events_.get();
    events_thread_ = std::thread([this] { events_->run(); });
    const auto port = domain_->xenstore_port();
    xenbus::client::RingClient::Options o;
    o.timeout = 3000ms;
    client_ = std::make_unique<xenbus::client::RingClient>(
        domain_->xenstore_page(), [this, port] { (void)domain_->evtchn().send(port); }, o);
    events_->set_handler(port, [c = client_.get()] { c->on_event(); });
  }
  void stop_domain() {
    if (events_) events_->stop();
    if (events_thread_.joinable()) events_thread_.join();
    client_.reset();
    // The domain raises upcalls from its own thread until it is gone: destroy it before its sink.
    if (domain_) on_dom([this] { domain_.reset(); });
    events_.reset();
  }
  Expected<void, Error> introduce(xenbus::DomId d, std::uint64_t mfn, std::uint32_t port) {
    return on_xs([&] { return store_->introduce(d, mfn, port); });
  }
  template <class P>
  bool eventually(P p) {
    for (int i = 0; i < 500; ++i) {
      if (p()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return p();
  }

  struct Sink : domain::UpcallSink {
    void upcall(unsigned v) noexcept override {
      if (target) target->upcall(v);
    }
    frontends::GuestEvents* target = nullptr;
  };

  std::string dir_;
  asio::io_context xs_io_, dom_io_;
  asio::executor_work_guard<asio::io_context::executor_type> xs_work_ = asio::make_work_guard(xs_io_);
  asio::executor_work_guard<asio::io_context::executor_type> dom_work_ = asio::make_work_guard(dom_io_);
  std::unique_ptr<xenbus::Store> store_;
  std::unique_ptr<xenbus::daemon::Domains> domains_;
  std::unique_ptr<xenbus::daemon::Journal> journal_;
  Recorder recorder_;
  xenbus::ConnId watcher_ = 0;
  std::thread xs_thread_, dom_thread_, events_thread_;
  std::unique_ptr<Sink> sink_;
  std::unique_ptr<domain::Domain> domain_;
  std::unique_ptr<frontends::GuestEvents> events_;
  std::unique_ptr<xenbus::client::RingClient> client_;
};

TEST_F(Domains, IntroduceServesTheDomainsRingWithItsPermissions) {
  start_domain();
  // Requests posted before the introduce wait on the ring.
  EXPECT_FALSE(client_->wait_connected(20ms));
  ASSERT_TRUE(introduce(7, domain::Domain::kXenstoreGfn, domain_->xenstore_port()));
  EXPECT_TRUE(eventually([&] { return recorder_.count("@introduceDomain") == 2; }))
      << "once at registration, once for dom7";
  ASSERT_TRUE(client_->wait_connected(3000ms));
  EXPECT_EQ(client_->read("/local/domain/7/name").value(), "seven");
  EXPECT_EQ(client_->read("name").value(), "seven");
  ASSERT_TRUE(client_->write("data/x", "1"));
  EXPECT_EQ(client_->read("/local/domain/8/name").error(), Error::eacces);
  EXPECT_EQ(client_->write("/local/domain/8/name", "x").error(), Error::eacces);
  EXPECT_EQ(on_xs([&] { return domains_->attached(); }), 1u);
}

TEST_F(Domains, DomainDeathReleasesIt) {
  start_domain();
  ASSERT_TRUE(introduce(7, domain::Domain::kXenstoreGfn, domain_->xenstore_port()));
  ASSERT_TRUE(client_->wait_connected(3000ms));
  const auto conns = on_xs([&] { return store_->connection_count(); });
  stop_domain();  // its control socket closes, as when the process dies
  EXPECT_TRUE(eventually([&] { return recorder_.count("@releaseDomain") == 2; }));
  EXPECT_TRUE(eventually([&] { return on_xs([&] { return domains_->attached(); }) == 0u; }));
  EXPECT_FALSE(on_xs([&] { return store_->is_introduced(7); }));
  EXPECT_EQ(on_xs([&] { return store_->connection_count(); }), conns - 1);
  // Its nodes stay (Xen keeps them until the toolstack removes them).
  EXPECT_NE(on_xs([&] { return store_->find("/local/domain/7/name"); }), nullptr);
}

TEST_F(Domains, ReleaseDropsTheRing) {
  start_domain();
  ASSERT_TRUE(introduce(7, domain::Domain::kXenstoreGfn, domain_->xenstore_port()));
  ASSERT_TRUE(client_->wait_connected(3000ms));
  // RELEASE and INTRODUCE back to back (the ring's drop is still queued): the new attach wins.
  ASSERT_TRUE(on_xs([&] {
    auto r = store_->release(7);
    return r && store_->introduce(7, domain::Domain::kXenstoreGfn, domain_->xenstore_port());
  }));
  EXPECT_EQ(client_->read("name").value_or(""), "seven");
  ASSERT_TRUE(on_xs([&] { return store_->release(7); }));
  EXPECT_TRUE(eventually([&] { return on_xs([&] { return domains_->attached(); }) == 0u; }));
  client_->set_timeout(200ms);
  EXPECT_EQ(client_->read("name").error(), Error::eio) << "nobody serves the ring any more";
  // The same domain can be introduced again (its port was unbound for dom0 again).
  ASSERT_TRUE(introduce(7, domain::Domain::kXenstoreGfn, domain_->xenstore_port()));
  client_->set_timeout(3000ms);
  EXPECT_EQ(client_->read("name").value(), "seven");
}

TEST_F(Domains, BadIntroducesCreateNothing) {
  start_domain();
  const auto port = domain_->xenstore_port();
  EXPECT_EQ(introduce(9, 1, 1).error(), Error::einval) << "no dom9.sock";
  EXPECT_EQ(introduce(7, 5, port).error(), Error::einval) << "not its ring's gfn";
  EXPECT_EQ(introduce(7, domain::Domain::kXenstoreGfn, port + 1).error(), Error::einval)
      << "not its xenstore port";
  EXPECT_FALSE(on_xs([&] { return store_->is_introduced(7) || store_->is_introduced(9); }));
  EXPECT_EQ(on_xs([&] { return domains_->attached(); }), 0u);
  EXPECT_EQ(recorder_.count("@introduceDomain"), 1u) << "only the registration firing";
  // Nothing half-created: the port is still free for the real introduce.
  ASSERT_TRUE(introduce(7, domain::Domain::kXenstoreGfn, port));
  ASSERT_TRUE(client_->wait_connected(3000ms));
}

// A live update in one process (save_and_stop_daemon, restart_daemon), while the domain's
// RingClient — the guest — goes on as it was.
TEST_F(Domains, ALiveUpdateHandsTheRingToTheNextDaemon) {
  Seen seen;
  start_watching_domain(seen);
  ASSERT_FALSE(HasFatalFailure());
  auto saw = [&](const std::string& path) { return seen.count(path); };

  const nlohmann::json state = save_and_stop_daemon();  // no daemon serves the ring from here on
  ASSERT_EQ(state["rings"].size(), 1u);
  // The guest asks meanwhile: the request waits on the ring for the next daemon.
  auto pending = std::async(std::launch::async, [&] { return client_->read("name"); });
  EXPECT_EQ(pending.wait_for(100ms), std::future_status::timeout);

  restart_daemon(state);
  ASSERT_EQ(pending.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(pending.get().value_or("(failed)"), "seven");
  EXPECT_TRUE(on_xs([&] { return store_->is_introduced(7) && domains_->attached() == 1; }));
  // The domain's watch, registered with the previous daemon, fires for its own write and dom0's.
  ASSERT_TRUE(client_->write("data/y", "2"));
  EXPECT_TRUE(eventually([&] { return saw("data/y") == 1; }));
  on_xs([&] { dom0(MsgType::write, z("/local/domain/7/data/z") + "3"); });
  EXPECT_TRUE(eventually([&] { return saw("data/z") == 1; }));
  EXPECT_EQ(client_->read("data/x").value_or(""), "1");
  // No special watch fired again: the domain was never released or introduced anew.
  EXPECT_EQ(recorder_.count("@introduceDomain"), 2u);
  EXPECT_EQ(recorder_.count("@releaseDomain"), 1u);
  // Its death is still noticed by the next daemon.
  stop_domain();
  EXPECT_TRUE(eventually([&] { return recorder_.count("@releaseDomain") == 2; }));
}

// A domain that died while no daemon served it is released by the next one, as its death would
// have been.
TEST_F(Domains, ALiveUpdateReleasesADomainThatDiedMeanwhile) {
  start_domain();
  ASSERT_TRUE(introduce(7, domain::Domain::kXenstoreGfn, domain_->xenstore_port()));
  ASSERT_TRUE(client_->wait_connected(3000ms));
  const nlohmann::json state = save_and_stop_daemon();
  stop_domain();
  restart_daemon(state);
  EXPECT_TRUE(eventually([&] { return recorder_.count("@releaseDomain") == 2; }));
  EXPECT_FALSE(on_xs([&] { return store_->is_introduced(7); }));
  EXPECT_EQ(on_xs([&] { return domains_->attached(); }), 0u);
  EXPECT_EQ(on_xs([&] { return store_->connection_count(); }), 1u) << "only dom0's";
}

// A crash restart in one process (start_journal, crash_daemon, recover_daemon): the new daemon
// has every node and the domain's watches, serves the ring from where it is — a request the guest
// made while no daemon ran included —, fires the domain's watches once, and ends the transaction
// the guest had open with EAGAIN.
TEST_F(Domains, ACrashRestartRecoversTheStoreAndTheDomainsRing) {
  start_journal();
  Seen seen;
  start_watching_domain(seen);
  ASSERT_FALSE(HasFatalFailure());
  auto saw = [&](const std::string& path) { return seen.count(path); };
  auto tx = client_->transaction_start();
  ASSERT_TRUE(tx);
  ASSERT_TRUE(client_->write("data/in-tx", "lost", *tx));
  on_xs([&] { dom0(MsgType::write, z("/local/domain/7/data/by-dom0") + "0"); });
  EXPECT_TRUE(eventually([&] { return saw("data/by-dom0") == 1; }));

  crash_daemon();
  auto pending = std::async(std::launch::async, [&] { return client_->read("data/x"); });
  EXPECT_EQ(pending.wait_for(100ms), std::future_status::timeout);
  recover_daemon();
  ASSERT_EQ(pending.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(pending.get().value_or("(failed)"), "1");
  EXPECT_TRUE(on_xs([&] { return store_->is_introduced(7) && domains_->attached() == 1; }));
  EXPECT_EQ(client_->read("name").value_or(""), "seven");
  EXPECT_EQ(client_->read("data/by-dom0").value_or(""), "0");
  // The watch fired once more at the recovery, and fires for new writes.
  EXPECT_TRUE(eventually([&] { return saw("data") == 2; }));
  ASSERT_TRUE(client_->write("data/y", "2"));
  EXPECT_TRUE(eventually([&] { return saw("data/y") == 1; }));
  // The open transaction: EAGAIN (the guest retries it), nothing of it in the store.
  auto end = client_->transaction_end(*tx, true);
  ASSERT_FALSE(end);
  EXPECT_EQ(end.error(), Error::eagain);
  EXPECT_FALSE(client_->read("data/in-tx"));
  // The recovered daemon journals too: a second crash keeps what came after the first.
  crash_daemon();
  recover_daemon();
  EXPECT_EQ(client_->read("data/y").value_or(""), "2");
  EXPECT_TRUE(eventually([&] { return saw("data") == 3; }));
  // The domain's death is noticed by the recovered daemon.
  const auto released = recorder_.count("@releaseDomain");  // each registration fired once
  stop_domain();
  EXPECT_TRUE(eventually([&] { return recorder_.count("@releaseDomain") == released + 1; }));
}

// A Store and a dom0 connection on it whose replies are dropped; put() writes a node through it.
struct Dom0Writer {
  struct : xenbus::Sink {
    void deliver(const xenbus::wire::Header&, std::string_view) override {}
  } sink;
  xenbus::Store store;
  xenbus::ConnId c = store.connect(0, sink);
  void put(const std::string& p, const std::string& v) {
    const std::string payload = z(p) + v;
    store.handle(c, {static_cast<std::uint32_t>(MsgType::write), 1, 0, static_cast<std::uint32_t>(payload.size())},
                 payload);
  }
};

// A journal given up (a change lost, or a file that cannot be written) is removed at once and
// written again from a snapshot — which holds what changed meanwhile — at the io_context's next
// turn, or, while that fails, 1 s later and then at growing intervals. A store carried over (a
// live update, a crash recovery) whose first snapshot cannot be written starts that way instead
// of refusing; a fresh start still refuses.
TEST(Journal, AJournalGivenUpIsWrittenAgainFromASnapshot) {
  char tmpl[] = "/tmp/xpv-journal-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, path = dir + "/j";
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};
  asio::io_context io;
  Dom0Writer w;
  xenbus::Store& store = w.store;
  auto put = [&](const std::string& p, const std::string& v) { w.put(p, v); };
  auto recovered = [&](const std::string& p) -> std::string {
    const auto contents = xenbus::daemon::Journal::read(path);
    xenbus::Store again;
    again.recover(contents.snapshot, contents.changes);
    const auto* n = again.find(p);
    return n ? n->value : "<none>";
  };
  std::unique_ptr<xenbus::daemon::Journal> j;
  auto written_again = [&] {  // bounded: the tries come at once, then 1, 2, 4 … s apart
    for (int i = 0; i < 400 && j->failed(); ++i) {
      io.restart();
      io.run_for(std::chrono::milliseconds(100));
    }
    return !j->failed();
  };
  j = std::make_unique<xenbus::daemon::Journal>(io, store, path);
  put("/a", "1");
  j->lost("a test's lost change");
  EXPECT_TRUE(j->failed());
  EXPECT_FALSE(std::filesystem::exists(path)) << "a journal that misses a change is not kept";
  put("/b", "2");  // not recorded
  io.poll();       // the next turn: written again
  ASSERT_TRUE(written_again());
  EXPECT_EQ(j->failures(), 1u);
  EXPECT_EQ(recovered("/a"), "1");
  EXPECT_EQ(recovered("/b"), "2");
  put("/c", "3");
  EXPECT_EQ(recovered("/c"), "3") << "journaled again after the snapshot";

  // While the file cannot be written the daemon serves on; the next tries follow 1 s, 2 s … apart.
  const std::string blocker = path + ".tmp";  // a directory where the snapshot's file would go
  std::filesystem::create_directory(blocker);
  j->lost("a second one");
  put("/d", "4");
  io.restart();
  io.run_for(std::chrono::milliseconds(300));  // the try at once fails; the next is 1 s later
  EXPECT_TRUE(j->failed()) << "its snapshot cannot be written";
  EXPECT_FALSE(std::filesystem::exists(path));
  std::filesystem::remove(blocker);
  ASSERT_TRUE(written_again()) << "not written again within 40 s of being writable";
  EXPECT_EQ(recovered("/d"), "4");
  EXPECT_EQ(j->failures(), 2u);
  j.reset();

  // The first snapshot: a fresh start refuses; a store carried over starts given up, and keeps
  // the journal it was recovered from (it still holds the store) until the first change.
  std::filesystem::create_directory(blocker);
  EXPECT_THROW((void)xenbus::daemon::Journal(io, store, path), std::runtime_error);
  j = std::make_unique<xenbus::daemon::Journal>(io, store, path, nullptr, true);
  EXPECT_TRUE(j->failed());
  io.restart();
  io.run_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(j->failed());
  EXPECT_EQ(recovered("/d"), "4") << "kept while nothing changed";
  put("/e", "5");
  EXPECT_FALSE(std::filesystem::exists(path)) << "kept past a change it does not hold";
  std::filesystem::remove(blocker);
  ASSERT_TRUE(written_again());
  EXPECT_EQ(recovered("/e"), "5");
  j->remove();
  j.reset();
}

// The journal file itself: a last line cut short is left out (its request was never answered),
// anything else that is not a journal line is refused naming the file and the line; a clean stop
// removes the file; the journal starts a new snapshot once it has grown past its bound.
TEST(Journal, ReadsWhatWasWrittenAndRefusesWhatWasNot) {
  char tmpl[] = "/tmp/xpv-journal-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, path = dir + "/j";
  asio::io_context io;
  Dom0Writer w;
  xenbus::Store& store = w.store;
  auto put = [&](const std::string& p, const std::string& v) { w.put(p, v); };
  auto j = std::make_unique<xenbus::daemon::Journal>(io, store, path);
  put("/a", "1");
  put("/b", std::string(1000, 'b'));
  EXPECT_EQ(j->snapshots(), 1u);
  auto contents = xenbus::daemon::Journal::read(path);
  EXPECT_FALSE(contents.torn_tail);
  EXPECT_EQ(contents.changes.size(), 4u);  // /a, and / with its new child, twice
  {
    xenbus::Store again;
    again.recover(contents.snapshot, contents.changes);
    EXPECT_EQ(again.find("/b")->value, std::string(1000, 'b'));
  }
  // Past its bound (4 MiB) the journal is a new snapshot, posted to the io_context.
  for (int i = 0; i < 5000; ++i) put("/b", std::string(1000, static_cast<char>('a' + i % 26)));
  EXPECT_EQ(j->snapshots(), 1u);
  io.poll();
  EXPECT_EQ(j->snapshots(), 2u);
  EXPECT_LT(j->bytes(), 1u << 20);
  put("/c", "3");
  contents = xenbus::daemon::Journal::read(path);
  {
    xenbus::Store again;
    again.recover(contents.snapshot, contents.changes);
    EXPECT_EQ(again.find("/b")->value, std::string(1000, static_cast<char>('a' + 4999 % 26)));
    EXPECT_EQ(again.find("/c")->value, "3");
  }
  j.reset();  // not a clean stop: the file stays
  ASSERT_TRUE(std::filesystem::exists(path));
  // A last line cut short.
  {
    std::ofstream f(path, std::ios::app);
    f << R"({"op":"put","path":"2f64")";
  }
  contents = xenbus::daemon::Journal::read(path);
  EXPECT_TRUE(contents.torn_tail);
  // A bad line in the middle, and a file that is not a journal.
  {
    std::ofstream f(path, std::ios::app);
    f << "\n{\"op\":\"erase\",\"path\":\"2f63\"}\n";
  }
  try {
    (void)xenbus::daemon::Journal::read(path);
    ADD_FAILURE() << "accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":" + std::to_string(2 + contents.changes.size()) + ": not a JSON object"),
              std::string::npos)
        << e.what();
  }
  {
    std::ofstream f(path, std::ios::trunc);
    f << "{\"something\":1}\n";
  }
  try {
    (void)xenbus::daemon::Journal::read(path);
    ADD_FAILURE() << "accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), path + ":1: not a version 1 xpv-xenstored journal");
  }
  // A clean stop removes the file.
  j = std::make_unique<xenbus::daemon::Journal>(io, store, path);
  ASSERT_TRUE(std::filesystem::exists(path));
  j->remove();
  EXPECT_FALSE(std::filesystem::exists(path));
  put("/d", "4");  // no longer recorded
  EXPECT_FALSE(std::filesystem::exists(path));
  j.reset();
  store.disconnect(w.c);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace xpv
