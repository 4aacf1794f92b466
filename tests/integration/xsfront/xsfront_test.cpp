// The domain side of xenbus, with real processes: xpv-xenstored (on a temp socket, with a temp run
// dir) attaches domains it is introduced to through their control sockets; xpv-front (a process
// domain, fork/exec'd) runs its blkfront xenbus driver over its own xenstore ring. The test plays
// the toolstack (libxenstore / SyncClient as dom0) and, for the block device, the backend —
// exactly as PROCESS-DOMAINS.md lays out the nodes — with xpv's real backend pieces
// (ForeignDomain, GrantMapper, BlkifBackRing, BlkifQueue on io_uring over an image file).
//
// Needs root and /dev/fuse (FUSE mounts); skipped otherwise. Every process, mount and temp dir
// is cleaned up by RAII, also when an assertion fails.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
extern "C" {
#include <xenstore.h>
}

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <atomic>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "process.h"
#include "xpv/blkback/disk.h"
#include "xpv/blkback/queue.h"
#include "xpv/domain/domain.h"
#include "xpv/domain/foreign_domain.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/xenbus/client/ring_client.h"
#include "xpv/xenbus/client/sync_client.h"
#include "xpv/test/thread_names.h"

namespace xpv {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using xenbus::client::SyncClient;
using xenbus::wire::Error;

template <class P>
bool eventually(P p, std::chrono::milliseconds bound = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < deadline) {
    if (p()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return p();
}

bool mounted(const std::string& path) {
  std::ifstream m("/proc/mounts");
  std::string line;
  while (std::getline(m, line)) {
    if (line.find(" " + path + " ") != std::string::npos) return true;
  }
  return false;
}

// The toolstack's INTRODUCE, through Debian's libxenstore.
bool introduce(const std::string& socket, unsigned domid, std::uint64_t mfn, unsigned port) {
  ::setenv("XENSTORED_PATH", socket.c_str(), 1);
  xs_handle* h = xs_open(0);
  if (!h) return false;
  bool ok = xs_introduce_domain(h, domid, mfn, port);
  xs_close(h);
  return ok;
}
bool is_introduced(const std::string& socket, unsigned domid) {
  ::setenv("XENSTORED_PATH", socket.c_str(), 1);
  xs_handle* h = xs_open(0);
  if (!h) return false;
  bool ok = xs_is_domain_introduced(h, domid);
  xs_close(h);
  return ok;
}

// A domain in the test's own process — memfd memory, event channels, its control socket in
// `run_dir` — with its own xenstore RingClient: xpv-front without its drivers. go_away() (or the
// destructor) stops its event thread, drops the client and destroys the domain on its io thread,
// as a domain process that exits.
class InProcessDomain {
 public:
  InProcessDomain(unsigned domid, const std::string& name, const std::string& run_dir) {
    domain::DomainConfig cfg;
    cfg.domid = static_cast<std::uint16_t>(domid);
    cfg.name = name;
    cfg.memory_bytes = 16 << 20;
    cfg.run_dir = run_dir;
    dom_ = std::make_unique<domain::Domain>(io_, cfg, sink_);
    events_ = std::make_unique<frontends::GuestEvents>(dom_->pages(domain::Domain::kSharedInfoGfn, 1));
    sink_.target = events_.get();
    io_thread_ = std::thread([this] { io_.run(); });
    ev_thread_ = std::thread([this] { events_->run(); });
    port_ = dom_->xenstore_port();
    xs_ = std::make_unique<xenbus::client::RingClient>(dom_->xenstore_page(), [this] { (void)dom_->evtchn().send(port_); });
    events_->set_handler(port_, [c = xs_.get()] { c->on_event(); });
  }
  ~InProcessDomain() { go_away(); }
  InProcessDomain(const InProcessDomain&) = delete;
  InProcessDomain& operator=(const InProcessDomain&) = delete;

  xenbus::client::RingClient& xs() { return *xs_; }
  std::uint32_t xenstore_port() const { return port_; }
  void go_away() {
    if (!dom_) return;
    events_->stop();
    ev_thread_.join();
    xs_.reset();
    std::promise<void> gone;
    asio::post(io_, [&] {
      dom_.reset();
      gone.set_value();
    });
    gone.get_future().wait();
    work_.reset();
    io_thread_.join();
  }

 private:
  struct Sink : domain::UpcallSink {
    void upcall(unsigned v) noexcept override {
      if (auto* t = target.load()) t->upcall(v);
    }
    std::atomic<frontends::GuestEvents*> target{nullptr};
  };
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  Sink sink_;
  std::unique_ptr<domain::Domain> dom_;
  std::unique_ptr<frontends::GuestEvents> events_;
  std::thread io_thread_, ev_thread_;
  std::uint32_t port_ = 0;
  std::unique_ptr<xenbus::client::RingClient> xs_;
};

class XsFront : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0 || ::access("/dev/fuse", R_OK | W_OK) != 0) {
      GTEST_SKIP() << "needs root and /dev/fuse (FUSE mounts of the PV disk)";
    }
    run_ = dir_.path() + "/run";
    std::filesystem::create_directories(run_);
    xsd_.emplace(XPV_XENSTORED_BIN, std::vector<std::string>{"--run-dir", run_});
    dom0_ = std::make_unique<SyncClient>(xsd_->socket(), 5s);
    ASSERT_TRUE(dom0_->watch("@introduceDomain", "i", [this](const std::string&, const std::string&) {
      std::lock_guard l(m_);
      ++introduced_;
    }));
    ASSERT_TRUE(dom0_->watch("@releaseDomain", "r", [this](const std::string&, const std::string&) {
      std::lock_guard l(m_);
      ++released_;
    }));
    ASSERT_TRUE(eventually([&] { return counts() == std::pair(1, 1); })) << "registration firings";
  }
  void TearDown() override {
    stop_backend();
    front_.reset();  // SIGKILL if still running
    dom0_.reset();
    xsd_.reset();
    // Nothing of ours may stay mounted, whatever happened (a killed xpv-front leaves its FUSE
    // mounts behind): every mount under our run dir goes.
    if (!run_.empty()) {
      std::ifstream m("/proc/mounts");
      std::string dev, where, rest;
      std::vector<std::string> ours;
      while (m >> dev >> where && std::getline(m, rest)) {
        if (where.rfind(run_ + "/", 0) == 0) ours.push_back(where);
      }
      for (const auto& p : ours) (void)!std::system(("umount -l " + p).c_str());
    }
  }
  std::pair<int, int> counts() {
    std::lock_guard l(m_);
    return {introduced_, released_};
  }

  // Toolstack: the domain's own nodes (one transaction), as PROCESS-DOMAINS.md step 2.
  void write_domain_nodes(unsigned d) {
    const std::string home = "/local/domain/" + std::to_string(d);
    // The directory and its perms first: nodes created below inherit them (as libxl does).
    ASSERT_TRUE(dom0_->transaction([&](xenbus::client::TxId tx) -> xenbus::client::Result<void> {
      if (auto r = dom0_->mkdir(home, tx); !r) return r;
      if (auto r = dom0_->set_perms(home, {{static_cast<xenbus::DomId>(d), xenbus::kPermNone}}, tx); !r) return r;
      for (auto [k, v] : {std::pair<std::string, std::string>{"name", "xsfront-" + std::to_string(d)},
                          {"domid", std::to_string(d)},
                          {"memory/target", "131072"}}) {
        if (auto r = dom0_->write(home + "/" + k, v, tx); !r) return r;
      }
      return {};
    }));
  }
  void start_front(unsigned d, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{XPV_FRONT_BIN, "--domid", std::to_string(d), "--name",
                                  "xsfront-" + std::to_string(d), "--memory", "128",
                                  "--run-dir", run_, "--foreground", "--log-level", "warn",
                                  "--xenstore-timeout", "20"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    front_.emplace(argv, std::vector<std::string>{});
    auto line = front_->read_line(10s);
    ASSERT_TRUE(line.has_value()) << "xpv-front printed nothing";
    ASSERT_EQ(*line, "ready");
  }
  void introduce_front(unsigned d) {
    auto fd = domain::ForeignDomain::connect(static_cast<std::uint16_t>(d), "toolstack", run_);
    auto xs = fd.xenstore();
    ASSERT_TRUE(introduce(xsd_->socket(), d, xs.gfn, xs.port));
  }

  // ---- the backend, played by the test ----
  std::string be_path(unsigned d, const std::string& dev) {
    return "/local/domain/0/backend/vbd/" + std::to_string(d) + "/" + dev;
  }
  std::string fe_path(unsigned d, const std::string& dev) {
    return "/local/domain/" + std::to_string(d) + "/device/vbd/" + dev;
  }
  // Toolstack: both directories of a vbd, one transaction (PROCESS-DOMAINS.md).
  void add_vbd(unsigned d, const std::string& dev, const std::string& image, bool ro,
               const std::string& backend_override = "") {
    const std::string be = backend_override.empty() ? be_path(d, dev) : backend_override;
    const std::string fe = fe_path(d, dev);
    const auto dd = static_cast<xenbus::DomId>(d);
    ASSERT_TRUE(dom0_->transaction([&](xenbus::client::TxId tx) -> xenbus::client::Result<void> {
      // Each directory with its perms first; the nodes below inherit them.
      if (auto r = dom0_->mkdir(be, tx); !r) return r;
      if (backend_override.empty()) {
        if (auto r = dom0_->set_perms(be, {{0, xenbus::kPermNone}, {dd, xenbus::kPermRead}}, tx); !r) return r;
      }
      if (auto r = dom0_->mkdir(fe, tx); !r) return r;
      if (auto r = dom0_->set_perms(fe, {{dd, xenbus::kPermNone}, {0, xenbus::kPermRead}}, tx); !r) return r;
      for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
               {"frontend", fe}, {"frontend-id", std::to_string(d)}, {"online", "1"},
               {"removable", "0"}, {"bootable", "1"}, {"state", "1"}, {"dev", "xvda"},
               {"type", "xpv"}, {"mode", ro ? "r" : "w"}, {"device-type", "disk"},
               {"params", image}, {"discard-enable", "1"}}) {
        if (auto r = dom0_->write(be + "/" + k, v, tx); !r) return r;
      }
      for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
               {"backend", be}, {"backend-id", "0"}, {"state", "1"},
               {"virtual-device", dev}, {"device-type", "disk"}}) {
        if (auto r = dom0_->write(fe + "/" + k, v, tx); !r) return r;
      }
      return {};
    }));
  }
  std::string front_state(unsigned d, const std::string& dev) {
    return dom0_->read(fe_path(d, dev) + "/state").value_or("?");
  }
  // Backend: features, then InitWait.
  // max_queues: the backend's multi-queue-max-queues, or no such node (nullopt).
  void offer(unsigned d, const std::string& dev, std::uint32_t indirect = 256,
             std::uint32_t max_order = 0, std::optional<unsigned> max_queues = 1) {
    const std::string be = be_path(d, dev);
    std::vector<std::pair<std::string, std::string>> nodes{
        {"feature-flush-cache", "1"}, {"feature-discard", "1"}, {"discard-granularity", "4096"},
        {"discard-alignment", "0"}, {"discard-secure", "0"},
        {"feature-max-indirect-segments", std::to_string(indirect)},
        {"max-ring-page-order", std::to_string(max_order)}, {"feature-persistent", "0"}};
    if (max_queues) nodes.emplace_back("multi-queue-max-queues", std::to_string(*max_queues));
    nodes.emplace_back("state", "2");
    for (const auto& [k, v] : nodes) ASSERT_TRUE(dom0_->write(be + "/" + k, v));
  }
  // Backend: the frontend is Initialised — map its ring, bind its port, serve, say Connected.
  void connect_backend(unsigned d, const std::string& dev, const std::string& image, bool ro,
                       std::uint32_t indirect = 256) {
    const std::string fe = fe_path(d, dev);
    // One ring (flat layout) or multi-queue-num-queues rings under queue-<i>/ (single-page rings
    // in these tests), each served by its own BlkifQueue and thread, as xpv-blkback does.
    unsigned nq = 1;
    std::string prefix = fe + "/";
    if (auto n = dom0_->read(fe + "/multi-queue-num-queues")) {
      nq = static_cast<unsigned>(std::stoul(*n));
      ASSERT_GE(nq, 2u) << "one queue is published in the flat layout";
    }
    EXPECT_EQ(dom0_->read(fe + "/protocol").value_or(""), "x86_64-abi");
    disk_ = std::make_unique<blkback::Disk>(blkback::Disk::open(image, ro));
    foreign_ = std::make_unique<domain::ForeignDomain>(
        domain::ForeignDomain::connect(static_cast<std::uint16_t>(d), "blkback", run_));
    for (unsigned q = 0; q < nq; ++q) {
      const std::string dir = nq > 1 ? fe + "/queue-" + std::to_string(q) + "/" : fe + "/";
      auto ref = dom0_->read(dir + "ring-ref");
      auto port = dom0_->read(dir + "event-channel");
      ASSERT_TRUE(ref && port) << "the frontend published no " << dir << "ring-ref / event-channel";
      // One GrantMapper per data-plane thread (mapper.h: a mapper has no lock), as
      // xpv-blkback has one per queue.
      mappers_.push_back(foreign_->make_mapper());
      auto ring_map = mappers_.back()->map(static_cast<gnttab::GrantRef>(std::stoul(*ref)), false);
      ASSERT_TRUE(ring_map);
      auto back = ring::BlkifBackRing::attach(ring_map->writable());
      ASSERT_TRUE(back);
      blkback::QueueConfig qc;
      qc.max_indirect_segments = indirect;
      queues_.push_back(std::make_unique<blkback::BlkifQueue>(
          "vbd" + std::to_string(d) + "." + dev + "." + std::to_string(q), *disk_, *mappers_.back(),
          std::move(*back), foreign_->bind(static_cast<std::uint32_t>(std::stoul(*port))), qc));
      // The queue itself, not queues_[q]: the next push_back may move the vector's storage
      // while this thread is still reading its element (a segfault in run() with `this` garbage).
      queue_threads_.emplace_back([queue = queues_.back().get()] { queue->run(); });
    }
    const std::string be = be_path(d, dev);
    ASSERT_TRUE(dom0_->write(be + "/sectors", std::to_string(disk_->info().sectors)));
    ASSERT_TRUE(dom0_->write(be + "/info", ro ? "4" : "0"));
    ASSERT_TRUE(dom0_->write(be + "/sector-size", "512"));
    ASSERT_TRUE(dom0_->write(be + "/physical-sector-size", "512"));
    ASSERT_TRUE(dom0_->write(be + "/state", "4"));
  }
  void stop_backend() {
    for (auto& q : queues_) q->stop();
    for (auto& t : queue_threads_) t.join();
    queue_threads_.clear();
    queues_.clear();
    mappers_.clear();  // unmaps the rings
    foreign_.reset();
    disk_.reset();
  }
  std::string make_image(std::uint64_t bytes) {
    std::string image = dir_.path() + "/disk.img";
    { std::ofstream f(image); }
    std::filesystem::resize_file(image, bytes);
    return image;
  }
  std::string disk_file(unsigned d, const std::string& dev) {
    const std::string mnt = run_ + "/dom" + std::to_string(d) + "/vbd/" + dev;
    return mnt + "/disk";
  }
  std::string image_bytes(const std::string& image, off_t off, std::size_t n) {
    std::string s(n, '\0');
    int fd = ::open(image.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_EQ(::pread(fd, s.data(), n, off), static_cast<ssize_t>(n));
    ::close(fd);
    return s;
  }
  // A device up to Connected with its disk mounted.
  void bring_up(unsigned d, const std::string& image, bool ro = false) {
    write_domain_nodes(d);
    ASSERT_NO_FATAL_FAILURE(start_front(d));
    ASSERT_NO_FATAL_FAILURE(introduce_front(d));
    ASSERT_NO_FATAL_FAILURE(add_vbd(d, "51712", image, ro));
    ASSERT_NO_FATAL_FAILURE(offer(d, "51712"));
    ASSERT_TRUE(eventually([&] { return front_state(d, "51712") == "3"; }))
        << "frontend state " << front_state(d, "51712");
    ASSERT_NO_FATAL_FAILURE(connect_backend(d, "51712", image, ro));
    ASSERT_TRUE(eventually([&] { return front_state(d, "51712") == "4"; }))
        << "frontend state " << front_state(d, "51712");
  }

  test::TempDir dir_;
  std::string run_;
  std::optional<test::Daemon> xsd_;
  std::unique_ptr<SyncClient> dom0_;
  // The test plays the backend of domain 5's vbd 51712 over `queues` rings, then `threads` write
  // through the FUSE file and the image must hold it all.
  void serve_and_write(const std::string& image, std::size_t queues, int threads);

  std::optional<test::Proc> front_;
  std::mutex m_;
  int introduced_ = 0, released_ = 0;
  std::unique_ptr<blkback::Disk> disk_;
  std::unique_ptr<domain::ForeignDomain> foreign_;
  std::vector<std::unique_ptr<gnttab::GrantMapper>> mappers_;  // one per queue
  std::vector<std::unique_ptr<blkback::BlkifQueue>> queues_;
  std::vector<std::thread> queue_threads_;
};

// A domain in this process (what xpv-front is made of) with its own RingClient, served by the real
// xpv-xenstored through the domain's control socket: permissions are the domain's.
TEST_F(XsFront, DomainRingHasTheDomainsPermissions) {
  write_domain_nodes(6);
  write_domain_nodes(7);
  ASSERT_TRUE(dom0_->write("/local/domain/7/secret", "x"));
  InProcessDomain dom(6, "ring-perms", run_);
  auto& xs = dom.xs();
  ASSERT_TRUE(introduce(xsd_->socket(), 6, domain::Domain::kXenstoreGfn, dom.xenstore_port()));
  EXPECT_TRUE(eventually([&] { return counts().first == 2; }));
  ASSERT_TRUE(xs.wait_connected(5s));
  EXPECT_EQ(xs.read("/local/domain/6/name").value_or(""), "xsfront-6");
  EXPECT_EQ(xs.read("domid").value_or(""), "6");
  EXPECT_TRUE(xs.write("data/hello", "world"));
  EXPECT_EQ(dom0_->read("/local/domain/6/data/hello").value_or(""), "world");
  EXPECT_EQ(xs.read("/local/domain/7/secret").error(), Error::eacces);
  EXPECT_EQ(xs.write("/local/domain/7/secret", "y").error(), Error::eacces);
  EXPECT_EQ(xs.write("/tool/x", "y").error(), Error::eacces);
  // The domain goes away: xenstored releases it.
  dom.go_away();
  EXPECT_TRUE(eventually([&] { return counts().second == 2; }));
  EXPECT_FALSE(is_introduced(xsd_->socket(), 6));
}

// xpv-xenstored killed (SIGKILL) and started again from its journal, eight times, while a domain
// keeps writing and reading back over its ring: every call the domain makes is answered, with the
// right value — a request the dead daemon had taken off the ring, or answered only in the journal,
// is answered by the next daemon exactly once (daemon/ring_connection.h, RingJournalState).
TEST_F(XsFront, AGuestsRequestsAreAnsweredAcrossKillsOfXenstored) {
  dom0_.reset();
  xsd_.reset();
  xsd_.emplace(XPV_XENSTORED_BIN, std::vector<std::string>{"--run-dir", run_, "--journal", dir_.path() + "/journal"});
  dom0_ = std::make_unique<SyncClient>(xsd_->socket(), 5s);
  write_domain_nodes(6);
  InProcessDomain dom(6, "ring-crash", run_);
  auto& xs = dom.xs();
  ASSERT_TRUE(introduce(xsd_->socket(), 6, domain::Domain::kXenstoreGfn, dom.xenstore_port()));
  ASSERT_TRUE(xs.wait_connected(5s));
  std::atomic<int> done_ops{0};
  std::atomic<bool> stop{false};
  std::mutex fm;
  std::string first_failure;
  // Four threads, each writing and reading back values larger than the ring (2 KiB: a node's
  // quota): requests and replies cross the 1 KiB rings in pieces, so a kill often finds one
  // half-way.
  auto guest = [&](int t) {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (int i = 0; i < 100000 && !stop && std::chrono::steady_clock::now() < deadline; ++i) {
      const std::string key = fmt::format("data/t{}", t);
      const std::string value = std::string(2000, static_cast<char>('a' + i % 26)) + std::to_string(i);
      auto w = xs.write(key, value);
      auto r = xs.read(key);
      if (!w || !r || *r != value) {
        std::lock_guard l(fm);
        if (first_failure.empty())
          first_failure = fmt::format("thread {} op {}: write {}, read {}", t, i,
                                      w ? "ok" : std::string(xenbus::wire::error_name(w.error())),
                                      r ? r->substr(r->size() > 8 ? r->size() - 8 : 0)
                                        : std::string(xenbus::wire::error_name(r.error())));
        return;
      }
      ++done_ops;
    }
  };
  std::vector<std::thread> guests;
  for (int t = 0; t < 4; ++t) guests.emplace_back(guest, t);
  for (int kill = 0; kill < 8; ++kill) {
    const int before = done_ops;
    EXPECT_TRUE(eventually([&] { return done_ops >= before + 50 || !first_failure.empty(); })) << "the guest stalled";
    xsd_->crash();
    xsd_->start();
  }
  const int after = done_ops;
  EXPECT_TRUE(eventually([&] { return done_ops >= after + 50 || !first_failure.empty(); }));
  stop = true;
  for (auto& g : guests) g.join();
  EXPECT_EQ(first_failure, "");
  // The store has what each thread wrote last (and read back).
  SyncClient c(xsd_->socket(), 5s);
  for (int t = 0; t < 4; ++t) EXPECT_GT(c.read(fmt::format("/local/domain/6/data/t{}", t)).value_or("").size(), 2000u);
}

TEST_F(XsFront, IntroduceOfAMissingDomainFails) {
  EXPECT_FALSE(introduce(xsd_->socket(), 9, 1, 1));
  EXPECT_EQ(errno, EINVAL);
  EXPECT_FALSE(is_introduced(xsd_->socket(), 9));
  EXPECT_EQ(counts().first, 1) << "no @introduceDomain for it";
}

TEST_F(XsFront, XpvFrontIsIntroducedAndReleasedWhenItDies) {
  write_domain_nodes(5);
  ASSERT_NO_FATAL_FAILURE(start_front(5));
  EXPECT_TRUE(std::filesystem::exists(run_ + "/dom5.sock"));
  ASSERT_NO_FATAL_FAILURE(introduce_front(5));
  EXPECT_TRUE(eventually([&] { return counts().first == 2; }));
  EXPECT_TRUE(is_introduced(xsd_->socket(), 5));
  ::kill(front_->pid(), SIGKILL);
  EXPECT_TRUE(eventually([&] { return counts().second == 2; })) << "@releaseDomain";
  EXPECT_FALSE(is_introduced(xsd_->socket(), 5));
}

TEST_F(XsFront, XpvFrontGivesUpWhenNeverIntroduced) {
  test::RunResult r = test::run({XPV_FRONT_BIN, "--domid", "4", "--name", "lonely", "--memory", "16",
                                 "--run-dir", run_, "--foreground", "--log-level", "off",
                                 "--xenstore-timeout", "1"},
                                {});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.out, "ready\n");
  EXPECT_NE(r.err.find("xenstored did not serve the xenstore ring within 1 s"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(run_ + "/dom4.sock"));
}

TEST_F(XsFront, BadOptionsAreOneLine) {
  for (auto args : std::vector<std::vector<std::string>>{
           {"--domid", "0", "--name", "x", "--memory", "16"},
           {"--domid", "40000", "--name", "x", "--memory", "16"},
           {"--domid", "3", "--name", "x"},
           {"--domid", "3", "--name", "x", "--memory", "0"},
           {"--domid", "3", "--name", "x", "--memory", "16", "--log-level", "loud"},
           {"--domid", "3", "--name", "x", "--memory", "16", "--bogus"},
           {"--domid", "3", "--name", "x", "--memory", "16", "--blk-queues", "0"},
           {"--domid", "3", "--name", "x", "--memory", "16", "--blk-queues", "17"},
           {"--domid", "3", "--name", "x", "--memory", "16", "--blk-queues", "x"}}) {
    args.insert(args.begin(), XPV_FRONT_BIN);
    auto r = test::run(args, {});
    EXPECT_EQ(r.rc, 2) << args[2] << " " << args.back();
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("xpv-front: ", 0), 0u) << r.err;
  }
}

TEST_F(XsFront, BlockDeviceThroughXenbusFuseAndBackendClose) {
  const std::string image = make_image(64 << 20);
  ASSERT_NO_FATAL_FAILURE(bring_up(5, image));
  const std::string file = disk_file(5, "51712");
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(file); }));
  EXPECT_EQ(std::filesystem::file_size(file), 64u << 20);
  // Data written to the PV disk lands in the image.
  std::vector<char> data(256 * 1024);
  std::mt19937 rng(5);
  for (auto& c : data) c = static_cast<char>(rng());
  {
    int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(::pwrite(fd, data.data(), data.size(), 1 << 20), static_cast<ssize_t>(data.size()));
    EXPECT_EQ(::fsync(fd), 0);
    std::vector<char> back(data.size());
    EXPECT_EQ(::pread(fd, back.data(), back.size(), 1 << 20), static_cast<ssize_t>(back.size()));
    EXPECT_EQ(back, data);
    ::close(fd);
  }
  EXPECT_EQ(image_bytes(image, 1 << 20, data.size()), std::string(data.data(), data.size()));
  EXPECT_GE(queues_.at(0)->counters().flushes.load(), 1u);
  // The backend closes (toolstack detach): it lets go of the ring, says Closing; the frontend
  // unmounts, ends its grants and says Closed.
  stop_backend();
  ASSERT_TRUE(dom0_->write(be_path(5, "51712") + "/state", "5"));
  EXPECT_TRUE(eventually([&] { return front_state(5, "51712") == "6"; }))
      << "frontend state " << front_state(5, "51712");
  EXPECT_TRUE(eventually([&] { return !mounted(run_ + "/dom5/vbd/51712"); }));
  EXPECT_FALSE(std::filesystem::exists(file));
  ASSERT_TRUE(dom0_->write(be_path(5, "51712") + "/state", "6"));
  // The toolstack removes the device; the domain shuts down cleanly.
  ASSERT_TRUE(dom0_->rm(fe_path(5, "51712")));
  ::kill(front_->pid(), SIGTERM);
  EXPECT_EQ(front_->wait(20s), 0) << front_->err();
  EXPECT_FALSE(std::filesystem::exists(run_ + "/dom5"));
  EXPECT_FALSE(std::filesystem::exists(run_ + "/dom5.sock"));
}

TEST_F(XsFront, SigtermClosesAConnectedDeviceWithTheBackend) {
  const std::string image = make_image(16 << 20);
  ASSERT_NO_FATAL_FAILURE(bring_up(5, image));
  const std::string file = disk_file(5, "51712");
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(file); }));
  // The backend's side of a frontend-initiated close: on Closing, disconnect and say Closing;
  // on Closed, say Closed.
  std::thread backend([&] {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    bool closing = false;
    // Runs until it saw Closed (the frontend may be gone by then) or the deadline.
    while (std::chrono::steady_clock::now() < deadline) {
      auto s = front_state(5, "51712");
      if (!closing && s == "5") {
        stop_backend();
        (void)dom0_->write(be_path(5, "51712") + "/state", "5");
        closing = true;
      } else if (closing && s == "6") {
        (void)dom0_->write(be_path(5, "51712") + "/state", "6");
        return;
      }
      std::this_thread::sleep_for(10ms);
    }
  });
  ::kill(front_->pid(), SIGTERM);
  const int rc = front_->wait(30s);
  backend.join();
  EXPECT_EQ(rc, 0) << front_->err();
  EXPECT_EQ(front_state(5, "51712"), "6");
  EXPECT_EQ(dom0_->read(be_path(5, "51712") + "/state").value_or(""), "6");
  EXPECT_FALSE(mounted(run_ + "/dom5/vbd/51712"));
  EXPECT_EQ(front_->err().find("leaked"), std::string::npos) << "every grant was ended: " << front_->err();
  EXPECT_TRUE(eventually([&] { return counts().second == 2; })) << "@releaseDomain";
}

TEST_F(XsFront, ReadOnlyDiskRefusesWrites) {
  const std::string image = make_image(16 << 20);
  ASSERT_NO_FATAL_FAILURE(bring_up(5, image, true));
  const std::string file = disk_file(5, "51712");
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(file); }));
  int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
  EXPECT_LT(fd, 0);
  if (fd >= 0) ::close(fd);
  fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  char b[512];
  EXPECT_EQ(::pread(fd, b, sizeof b, 0), 512);
  ::close(fd);
}

TEST_F(XsFront, ABackendTheDomainMayNotReadIsNeverUsed) {
  // A vbd whose backend directory the domain cannot read (no rN): the domain's ring refuses it
  // (EACCES), so the device is never set up, while a proper device next to it works.
  const std::string image = make_image(16 << 20);
  write_domain_nodes(5);
  ASSERT_NO_FATAL_FAILURE(start_front(5));
  ASSERT_NO_FATAL_FAILURE(introduce_front(5));
  const std::string hidden = "/local/domain/0/backend/vbd/5/51728";
  ASSERT_NO_FATAL_FAILURE(add_vbd(5, "51728", image, false, hidden));
  ASSERT_TRUE(dom0_->write(hidden + "/state", "2"));
  ASSERT_NO_FATAL_FAILURE(add_vbd(5, "51712", image, false));
  ASSERT_NO_FATAL_FAILURE(offer(5, "51712"));
  ASSERT_TRUE(eventually([&] { return front_state(5, "51712") == "3"; }));
  EXPECT_EQ(front_state(5, "51728"), "1");
  EXPECT_FALSE(dom0_->read(fe_path(5, "51728") + "/ring-ref"));
}

TEST_F(XsFront, MultiPageRingAndIndirectSegmentsAreNegotiated) {
  // The backend offers order 2 and 64 indirect segments; xpv-front may use up to order 1: it
  // publishes ring-page-order = 1 with ring-ref0/1 (no ring-ref), as blkif.h describes.
  const std::string image = make_image(16 << 20);
  write_domain_nodes(5);
  ASSERT_NO_FATAL_FAILURE(start_front(5, {"--max-ring-page-order", "1"}));
  ASSERT_NO_FATAL_FAILURE(introduce_front(5));
  ASSERT_NO_FATAL_FAILURE(add_vbd(5, "51712", image, false));
  ASSERT_NO_FATAL_FAILURE(offer(5, "51712", 64, 2));
  ASSERT_TRUE(eventually([&] { return front_state(5, "51712") == "3"; }));
  const std::string fe = fe_path(5, "51712");
  EXPECT_EQ(dom0_->read(fe + "/ring-page-order").value_or(""), "1");
  EXPECT_TRUE(dom0_->read(fe + "/ring-ref0"));
  EXPECT_TRUE(dom0_->read(fe + "/ring-ref1"));
  EXPECT_FALSE(dom0_->read(fe + "/ring-ref2"));
  EXPECT_FALSE(dom0_->read(fe + "/ring-ref"));
  EXPECT_EQ(dom0_->read(fe + "/feature-persistent").value_or(""), "0");
  EXPECT_TRUE(dom0_->read(fe + "/event-channel"));
}

// Several threads write their own regions of the FUSE file at once, then each reads its region
// back and fsyncs; then the image, read on the host, holds every byte.
void write_from_threads(const std::string& file, const std::string& image, int threads) {
  constexpr std::size_t kRegion = 512 * 1024, kIo = 64 * 1024;
  auto byte = [](int t, std::size_t k) { return static_cast<char>(t * 37 + k * 11 + (k >> 12)); };
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) {
        ++failures;
        return;
      }
      std::vector<char> buf(kIo), back(kIo);
      const off_t base = static_cast<off_t>((t + 1) * kRegion);
      for (std::size_t o = 0; o < kRegion; o += kIo) {
        for (std::size_t k = 0; k < kIo; ++k) buf[k] = byte(t, o + k);
        if (::pwrite(fd, buf.data(), kIo, base + static_cast<off_t>(o)) != static_cast<ssize_t>(kIo)) ++failures;
      }
      for (std::size_t o = 0; o < kRegion; o += kIo) {
        for (std::size_t k = 0; k < kIo; ++k) buf[k] = byte(t, o + k);
        if (::pread(fd, back.data(), kIo, base + static_cast<off_t>(o)) != static_cast<ssize_t>(kIo) || back != buf) {
          ++failures;
        }
      }
      if (::fsync(fd) != 0) ++failures;
      ::close(fd);
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_EQ(failures.load(), 0);
  // What the image holds, read on the host.
  int fd = ::open(image.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::vector<char> got(kRegion), want(kRegion);
  for (int t = 0; t < threads; ++t) {
    for (std::size_t k = 0; k < kRegion; ++k) want[k] = byte(t, k);
    EXPECT_EQ(::pread(fd, got.data(), kRegion, static_cast<off_t>((t + 1) * kRegion)), static_cast<ssize_t>(kRegion));
    EXPECT_EQ(got, want) << "thread " << t << "'s region";
  }
  ::close(fd);
}

void XsFront::serve_and_write(const std::string& image, std::size_t queues, int threads) {
  ASSERT_NO_FATAL_FAILURE(connect_backend(5, "51712", image, false));
  ASSERT_EQ(queues_.size(), queues);
  ASSERT_TRUE(eventually([&] { return front_state(5, "51712") == "4"; }));
  const std::string file = disk_file(5, "51712");
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(file); }));
  ASSERT_NO_FATAL_FAILURE(write_from_threads(file, image, threads));
}

TEST_F(XsFront, MultiQueueIsNegotiatedAndCarriesData) {
  // The backend offers 4 queues; xpv-front asks for at most 2: multi-queue-num-queues = 2 and
  // queue-0/, queue-1/ with ring-ref and event-channel each, no flat ring-ref (blkif.h).
  const std::string image = make_image(16 << 20);
  write_domain_nodes(5);
  ASSERT_NO_FATAL_FAILURE(start_front(5, {"--blk-queues", "2"}));
  ASSERT_NO_FATAL_FAILURE(introduce_front(5));
  ASSERT_NO_FATAL_FAILURE(add_vbd(5, "51712", image, false));
  ASSERT_NO_FATAL_FAILURE(offer(5, "51712", 256, 0, 4));
  ASSERT_TRUE(eventually([&] { return front_state(5, "51712") == "3"; }));
  const std::string fe = fe_path(5, "51712");
  EXPECT_EQ(dom0_->read(fe + "/multi-queue-num-queues").value_or(""), "2");
  for (const char* node : {"queue-0/ring-ref", "queue-1/ring-ref", "queue-0/event-channel", "queue-1/event-channel"}) {
    EXPECT_TRUE(dom0_->read(fe + "/" + node)) << node;
  }
  EXPECT_NE(dom0_->read(fe + "/queue-0/event-channel").value_or("a"),
            dom0_->read(fe + "/queue-1/event-channel").value_or("a"));
  for (const char* node : {"ring-ref", "event-channel", "ring-page-order", "queue-2"}) {
    EXPECT_FALSE(dom0_->read(fe + "/" + node)) << node << " must not be there";
  }
  ASSERT_NO_FATAL_FAILURE(serve_and_write(image, 2, 4));
  // Which FUSE worker thread (and so which queue) serves a request is libfuse's choice, so the
  // split is reported, not asserted (blk_path_test asserts that two threads use two queues).
  const auto q0 = queues_[0]->counters().writes.load(), q1 = queues_[1]->counters().writes.load();
  RecordProperty("writes_queue0", std::to_string(q0));
  RecordProperty("writes_queue1", std::to_string(q1));
  EXPECT_GE(q0 + q1, 4u * 8u) << "4 threads x 8 writes of 64 KiB";
  EXPECT_GE(queues_[0]->counters().flushes.load() + queues_[1]->counters().flushes.load(), 1u);
  // Its threads carry names (what top -H and perf show): one completion thread per queue; the
  // /dev/fuse loop's workers, which libfuse starts from it, inherit its name.
  const auto names = test::thread_names(front_->pid());
  for (const char* t : {"dom-control", "evt-dispatch", "xs-ring-io", "xs-watch", "blkfront-c0", "blkfront-c1"}) {
    EXPECT_EQ(names.count(t), 1u) << t;
  }
  EXPECT_GE(names.count("fuse-loop"), 1u);
}

TEST_F(XsFront, WithoutMultiQueueTheFlatLayoutIsUsed) {
  // A backend with no multi-queue-max-queues node serves one ring: xpv-front, though allowed 4
  // queues, publishes ring-ref and event-channel in the device directory and no queue-<i>/.
  const std::string image = make_image(16 << 20);
  write_domain_nodes(5);
  ASSERT_NO_FATAL_FAILURE(start_front(5, {"--blk-queues", "4"}));
  ASSERT_NO_FATAL_FAILURE(introduce_front(5));
  ASSERT_NO_FATAL_FAILURE(add_vbd(5, "51712", image, false));
  ASSERT_NO_FATAL_FAILURE(offer(5, "51712", 256, 0, std::nullopt));
  ASSERT_TRUE(eventually([&] { return front_state(5, "51712") == "3"; }));
  const std::string fe = fe_path(5, "51712");
  EXPECT_TRUE(dom0_->read(fe + "/ring-ref"));
  EXPECT_TRUE(dom0_->read(fe + "/event-channel"));
  for (const char* node : {"multi-queue-num-queues", "queue-0", "queue-0/ring-ref"}) {
    EXPECT_FALSE(dom0_->read(fe + "/" + node)) << node << " must not be there";
  }
  ASSERT_NO_FATAL_FAILURE(serve_and_write(image, 1, 2));
}

TEST_F(XsFront, ASetupAfterACloseLeavesNoNodesOfTheEarlierLayout) {
  // Set up with 2 queues; the backend closes and offers the device again without multi-queue
  // (say, restarted with other options): the new setup is flat, and neither
  // multi-queue-num-queues nor queue-<i>/ of the first one is left for the backend to misread.
  const std::string image = make_image(16 << 20);
  write_domain_nodes(5);
  ASSERT_NO_FATAL_FAILURE(start_front(5, {"--blk-queues", "2"}));
  ASSERT_NO_FATAL_FAILURE(introduce_front(5));
  ASSERT_NO_FATAL_FAILURE(add_vbd(5, "51712", image, false));
  ASSERT_NO_FATAL_FAILURE(offer(5, "51712", 256, 0, 2));
  ASSERT_TRUE(eventually([&] { return front_state(5, "51712") == "3"; }));
  const std::string fe = fe_path(5, "51712"), be = be_path(5, "51712");
  ASSERT_EQ(dom0_->read(fe + "/multi-queue-num-queues").value_or(""), "2");
  ASSERT_TRUE(dom0_->write(be + "/state", "5"));
  ASSERT_TRUE(eventually([&] { return front_state(5, "51712") == "6"; })) << front_state(5, "51712");
  ASSERT_TRUE(dom0_->write(be + "/state", "6"));
  ASSERT_TRUE(dom0_->rm(be + "/multi-queue-max-queues"));
  ASSERT_TRUE(dom0_->write(be + "/state", "2"));
  ASSERT_TRUE(eventually([&] { return front_state(5, "51712") == "3"; })) << front_state(5, "51712");
  EXPECT_TRUE(dom0_->read(fe + "/ring-ref"));
  EXPECT_TRUE(dom0_->read(fe + "/event-channel"));
  for (const char* node : {"multi-queue-num-queues", "queue-0", "queue-1"}) {
    EXPECT_FALSE(dom0_->read(fe + "/" + node)) << node << " must not be left";
  }
  // And it works: the backend serves the one ring.
  ASSERT_NO_FATAL_FAILURE(serve_and_write(image, 1, 2));
}

}  // namespace
}  // namespace xpv
