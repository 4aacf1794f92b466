// The blkback rig shared by the daemon's integration test and its xenbus fuzz: a real
// xpv-xenstored on a temporary socket and a real xpv-blkback on a temporary run dir, the test
// process playing the toolstack (it writes the vbd nodes of docs/PROCESS-DOMAINS.md through
// SyncClient as dom0) and the domains: a process Domain with GuestEvents and xpv's Blkfront,
// whose xenbus steps are done here by hand, or a raw frontend that builds its rings itself.
// Every wait is bounded; processes, temp dirs and domains are cleaned up also on failure.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "xpv/domain/domain.h"
#include "xpv/frontends/blkfront.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/ring/blkif.h"
#include "xpv/xenbus/client/sync_client.h"

extern char** environ;

namespace xpv::test::blkrig {

using namespace std::chrono_literals;

// A child process with stdout+stderr appended to a log file; killed and reaped on destruction.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& log) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  pid_t pid() const { return pid_; }
  // Only while the child is ours: after wait() pid_ is -1, and kill(-1, sig) would signal every
  // process this (root) test may signal.
  void kill(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // Exit code (or 128+signal); SIGKILL after the timeout.
  int wait(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return -1;  // already waited for (never waitpid(-1) / kill(-1))
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int st = 0;
    while (true) {
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

 private:
  pid_t pid_ = -1;
};

// A process domain as xpv-front builds one: memory, grants, event channels, control socket in
// the run dir, and the guest-side event dispatch.
class Guest {
 public:
  Guest(std::uint16_t domid, const std::string& run_dir) {
    domain::DomainConfig cfg;
    cfg.domid = domid;
    cfg.name = "guest" + std::to_string(domid);
    cfg.memory_bytes = 96 << 20;
    cfg.run_dir = run_dir;
    dom = std::make_unique<domain::Domain>(io_, cfg, sink_);
    events = std::make_unique<frontends::GuestEvents>(dom->pages(domain::Domain::kSharedInfoGfn, 1));
    events->enable_direct_upcalls(*dom);  // xpv-front does: the daemon raises the upcall itself
    sink_.target = events.get();
    io_thread_ = std::thread([this] { io_.run(); });
    events_thread_ = std::thread([this] { events->run(); });
  }
  ~Guest() {
    front.reset();
    events->stop();
    events_thread_.join();
    std::packaged_task<void()> t([this] { dom.reset(); });
    auto f = t.get_future();
    boost::asio::post(io_, [&t] { t(); });
    f.wait();
    work_.reset();
    io_.stop();
    io_thread_.join();
  }
  std::uint16_t domid() const { return dom->config().domid; }

  std::unique_ptr<domain::Domain> dom;
  std::unique_ptr<frontends::GuestEvents> events;
  std::unique_ptr<frontends::Blkfront> front;

 private:
  struct Sink : domain::UpcallSink {
    void upcall(unsigned v) noexcept override {
      if (target) target->upcall(v);
    }
    frontends::GuestEvents* target = nullptr;
  };
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_ = boost::asio::make_work_guard(io_);
  Sink sink_;
  std::thread io_thread_, events_thread_;
};

// A frontend that builds its rings by hand: `queues` rings of 2^order pages each, the pages of a
// ring deliberately not consecutive in guest memory, one data page per queue. Requests are
// answered by polling (bounded), so no event handler is needed.
class RawFront {
 public:
  RawFront(domain::Domain& dom, unsigned queues, unsigned order) : dom_(dom) {
    for (unsigned q = 0; q < queues; ++q) {
      Queue r;
      std::vector<std::uint64_t> gfns;
      for (unsigned i = 0; i < (1u << order); ++i) {
        gfns.push_back(dom_.alloc_pages(1).value());
        (void)dom_.alloc_pages(1).value();  // a hole: the ring's frames are scattered
      }
      r.map = dom_.mem().map_contiguous(gfns);
      r.ring.emplace(ring::BlkifFrontRing::init(r.map.bytes()).value());
      for (auto g : gfns) r.refs.push_back(dom_.grants().grant_access(0, g, false).value());
      r.data_gfn = dom_.alloc_pages(1).value();
      r.data_ref = dom_.grants().grant_access(0, r.data_gfn, false).value();
      r.port = dom_.evtchn().alloc_unbound(0).value();
      queues_.push_back(std::move(r));
    }
  }
  unsigned queues() const { return static_cast<unsigned>(queues_.size()); }
  const std::vector<gnttab::GrantRef>& refs(unsigned q) const { return queues_[q].refs; }
  domain::Port port(unsigned q) const { return queues_[q].port; }
  std::span<std::uint8_t> data(unsigned q) { return dom_.pages(queues_[q].data_gfn, 1); }
  std::span<std::uint8_t> ring_bytes(unsigned q) { return queues_[q].map.bytes(); }

  // One 4 KiB read or write through queue q; returns the response status (or nullopt when no
  // response came within 5 s).
  std::optional<std::int16_t> io(unsigned q, bool write, std::uint64_t sector) {
    const auto id = submit(q, write, sector);
    if (!id) return std::nullopt;
    return collect(q, *id, 5s);
  }
  // The two halves of io(): a request published and notified (its id, nullopt with the ring
  // full), and its response awaited — the next one on the ring must be it — for at most `limit`.
  std::optional<std::uint64_t> submit(unsigned q, bool write, std::uint64_t sector) {
    Queue& r = queues_[q];
    ring::BlkifRequest req{};
    req.operation = write ? ring::kBlkifOpWrite : ring::kBlkifOpRead;
    req.nr_segments = 1;
    req.id = ++r.next_id;
    req.sector_number = sector;
    req.seg[0] = {r.data_ref, 0, 7, {0, 0}};
    if (!r.ring->produce_request(req)) return std::nullopt;
    if (r.ring->push_requests()) (void)dom_.evtchn().send(r.port);
    return req.id;
  }
  std::optional<std::int16_t> collect(unsigned q, std::uint64_t id, std::chrono::milliseconds limit) {
    Queue& r = queues_[q];
    for (auto waited = 0ms; waited < limit; waited += 1ms) {
      if (auto rsp = r.ring->pop_response()) {
        if (rsp->id != id) return std::nullopt;
        return rsp->status;
      }
      std::this_thread::sleep_for(1ms);
    }
    return std::nullopt;
  }

 private:
  struct Queue {
    domain::ContiguousMapping map;
    std::optional<ring::BlkifFrontRing> ring;
    std::vector<gnttab::GrantRef> refs;
    std::uint64_t data_gfn = 0;
    gnttab::GrantRef data_ref = 0;
    domain::Port port = 0;
    std::uint64_t next_id = 0;
  };
  domain::Domain& dom_;
  std::vector<Queue> queues_;
};

class BlkbackRig {
 public:
  using NodeList = std::vector<std::pair<std::string, std::string>>;
  BlkbackRig() = default;
  BlkbackRig(const BlkbackRig&) = delete;
  BlkbackRig& operator=(const BlkbackRig&) = delete;
  ~BlkbackRig() { stop(); }

  // xpv-xenstored and xpv-blkback started (root only: the caller checks); fails the test with
  // ASSERT when xenstored does not answer.
  void start() {
    char tmpl[] = "/tmp/xpv-blkbackd-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    run_ = dir_ + "/run";
    std::filesystem::create_directories(run_);
    xs_sock_ = dir_ + "/xenstored.sock";
    xenstored_ = std::make_unique<Child>(
        std::vector<std::string>{XPV_XENSTORED_BIN, "--socket", xs_sock_, "--foreground", "--log-level", "warn"},
        dir_ + "/xenstored.log");
    for (int i = 0; i < 1000 && !xs_; ++i) {
      try {
        xs_ = std::make_unique<xenbus::client::SyncClient>(xs_sock_, 5s);
      } catch (const std::exception&) {
        std::this_thread::sleep_for(10ms);
      }
    }
    ASSERT_TRUE(xs_) << "xpv-xenstored did not come up";
    start_blkback();
  }
  // Everything stopped and removed; with `print_log`, xpv-blkback's log on stderr first.
  void stop(bool print_log = false) {
    // The backend first, so that it lets go of the guests' grants before they are torn down.
    if (blkback_) {
      blkback_->kill(SIGTERM);
      blkback_->wait(10s);
      blkback_.reset();
    }
    guests_.clear();
    xs_.reset();
    xenstored_.reset();
    if (print_log && !dir_.empty()) std::cerr << "---- xpv-blkback log ----\n" << log() << "----\n";
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    dir_.clear();
  }

  void start_blkback(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{XPV_BLKBACK_BIN, "--xenstore", xs_sock_, "--run-dir", run_, "--foreground",
                                  "--log-level", "debug", "--max-queues", "4"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    blkback_ = std::make_unique<Child>(argv, dir_ + "/blkback.log");
  }
  std::string log() const {
    std::ifstream f(dir_ + "/blkback.log");
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

  std::string image(const std::string& name, off_t size = 64 << 20) {
    const std::string p = dir_ + "/" + name;
    { std::ofstream f(p); }
    std::filesystem::resize_file(p, size);
    return p;
  }
  std::string image_bytes(const std::string& path, off_t off, std::size_t n) {
    std::string s(n, '\0');
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_EQ(::pread(fd, s.data(), n, off), static_cast<ssize_t>(n));
    ::close(fd);
    return s;
  }

  Guest& guest(std::uint16_t domid) {
    guests_.push_back(std::make_unique<Guest>(domid, run_));
    return *guests_.back();
  }
  // Guest `domid` with a new 64 MiB image `name` as its disk `devid`, read-write (added, not
  // connected).
  Guest& guest_with_disk(std::uint16_t domid, std::uint32_t devid, const std::string& name) {
    Guest& g = guest(domid);
    add_vbd(domid, devid, image(name), "w");
    return g;
  }

  static std::string be(std::uint16_t domid, std::uint32_t devid) {
    return "/local/domain/0/backend/vbd/" + std::to_string(domid) + "/" + std::to_string(devid);
  }
  static std::string fe(std::uint16_t domid, std::uint32_t devid) {
    return "/local/domain/" + std::to_string(domid) + "/device/vbd/" + std::to_string(devid);
  }

  // The toolstack's part (docs/PROCESS-DOMAINS.md): both directories in one transaction.
  void add_vbd(std::uint16_t domid, std::uint32_t devid, const std::string& params, const std::string& mode) {
    const std::string b = be(domid, devid), f = fe(domid, devid), n = std::to_string(domid);
    auto r = xs_->transaction([&](xenbus::client::TxId tx) -> xenbus::client::Result<void> {
      const std::pair<std::string, std::string> nodes[] = {
          {b + "/frontend", f}, {b + "/frontend-id", n}, {b + "/online", "1"}, {b + "/removable", "0"},
          {b + "/bootable", "1"}, {b + "/dev", "xvda"}, {b + "/type", "xpv"}, {b + "/mode", mode},
          {b + "/device-type", "disk"}, {b + "/params", params}, {b + "/discard-enable", "1"},
          {f + "/backend", b}, {f + "/backend-id", "0"}, {f + "/virtual-device", std::to_string(devid)},
          {f + "/device-type", "disk"}, {f + "/state", "1"}, {b + "/state", "1"}};
      for (const auto& [k, v] : nodes) {
        if (auto w = xs_->write(k, v, tx); !w) return w;
      }
      return {};
    });
    ASSERT_TRUE(r);
  }

  // Bounded wait on a watch until `path` reads `want` (10 s); returns what it read last.
  std::string wait_value(const std::string& path, const std::string& want, std::chrono::seconds limit = 10s) {
    std::mutex m;
    std::condition_variable cv;
    int events = 0;
    const std::string token = "wait" + std::to_string(++tokens_);
    EXPECT_TRUE(xs_->watch(path, token, [&](const std::string&, const std::string&) {
      std::lock_guard l(m);
      ++events;
      cv.notify_all();
    }));
    std::string last;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (true) {
      last = xs_->read(path).value_or("<absent>");
      if (last == want || std::chrono::steady_clock::now() > deadline) break;
      std::unique_lock l(m);
      const int seen = events;
      cv.wait_for(l, 200ms, [&] { return events != seen; });
    }
    (void)xs_->unwatch(path, token);
    return last;
  }

  // The frontend's xenbus steps for a Blkfront, by hand: InitWait → publish → Initialised →
  // Connected → geometry → Connected.
  void connect_blkfront(Guest& g, std::uint32_t devid, frontends::BlkfrontConfig cfg = {}, bool lie_rw = false) {
    const std::string b = be(g.domid(), devid), f = fe(g.domid(), devid);
    ASSERT_EQ(wait_value(b + "/state", "2"), "2");
    EXPECT_EQ(xs_->read(b + "/feature-flush-cache").value_or(""), "1");
    EXPECT_EQ(xs_->read(b + "/multi-queue-max-queues").value_or(""), "4");
    g.front = std::make_unique<frontends::Blkfront>(*g.dom, *g.events, cfg);
    NodeList nodes;
    // Flat layout for one queue, queue-<q>/ for several (blkif.h); multi-queue-num-queues even
    // for one (Linux's netfront writes it so; connect_raw below leaves it out).
    const bool mq = g.front->queues() > 1;
    nodes.emplace_back(f + "/multi-queue-num-queues", std::to_string(g.front->queues()));
    if (cfg.ring_page_order != 0) nodes.emplace_back(f + "/ring-page-order", std::to_string(cfg.ring_page_order));
    for (std::uint32_t q = 0; q < g.front->queues(); ++q) {
      const std::string d = mq ? f + "/queue-" + std::to_string(q) : f;
      const auto& refs = g.front->ring_refs(q);
      if (cfg.ring_page_order == 0) {
        nodes.emplace_back(d + "/ring-ref", std::to_string(refs[0]));
      } else {
        for (std::size_t i = 0; i < refs.size(); ++i) nodes.emplace_back(d + "/ring-ref" + std::to_string(i), std::to_string(refs[i]));
      }
      nodes.emplace_back(d + "/event-channel", std::to_string(g.front->event_channel(q)));
    }
    nodes.emplace_back(f + "/protocol", "x86_64-abi");
    nodes.emplace_back(f + "/feature-persistent", "0");
    nodes.emplace_back(f + "/state", "3");
    publish(nodes);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    ASSERT_EQ(wait_value(b + "/state", "4"), "4");
    frontends::BlkfrontGeometry geo;
    geo.sectors = std::stoull(xs_->read(b + "/sectors").value());
    geo.readonly = !lie_rw && (std::stoul(xs_->read(b + "/info").value()) & 4) != 0;
    geo.flush = xs_->read(b + "/feature-flush-cache").value_or("0") == "1";
    geo.discard = xs_->read(b + "/feature-discard").value_or("0") == "1";
    g.front->connect(geo);
    ASSERT_TRUE(xs_->write(f + "/state", "4"));
  }

  // What a frontend publishes for `raw` in frontend directory `f` (multi-queue layout when it has
  // more than one queue; `mq_node` writes multi-queue-num-queues for one queue too), state aside.
  static NodeList raw_nodes(const std::string& f, const RawFront& raw, unsigned order, bool mq_node = false) {
    NodeList nodes;
    const bool mq = raw.queues() > 1;
    if (mq || mq_node) nodes.emplace_back(f + "/multi-queue-num-queues", std::to_string(raw.queues()));
    nodes.emplace_back(f + "/ring-page-order", std::to_string(order));
    for (unsigned q = 0; q < raw.queues(); ++q) {
      const std::string d = mq ? f + "/queue-" + std::to_string(q) : f;
      for (std::size_t i = 0; i < raw.refs(q).size(); ++i) {
        nodes.emplace_back(d + "/ring-ref" + std::to_string(i), std::to_string(raw.refs(q)[i]));
      }
      nodes.emplace_back(d + "/event-channel", std::to_string(raw.port(q)));
    }
    nodes.emplace_back(f + "/protocol", "x86_64-abi");
    return nodes;
  }
  // Writes `nodes` in one transaction, as a frontend does.
  void publish(const NodeList& nodes) {
    auto r = xs_->transaction([&](xenbus::client::TxId tx) -> xenbus::client::Result<void> {
      for (const auto& [k, v] : nodes) {
        if (auto w = xs_->write(k, v, tx); !w) return w;
      }
      return {};
    });
    ASSERT_TRUE(r);
  }

  // A raw frontend's publish (raw_nodes), then Initialised → Connected.
  void connect_raw(Guest& g, std::uint32_t devid, RawFront& raw, unsigned order) {
    const std::string b = be(g.domid(), devid), f = fe(g.domid(), devid);
    ASSERT_EQ(wait_value(b + "/state", "2"), "2");
    NodeList nodes = raw_nodes(f, raw, order);
    nodes.emplace_back(f + "/state", "3");
    publish(nodes);
    ASSERT_EQ(wait_value(b + "/state", "4"), "4");
    ASSERT_TRUE(xs_->write(f + "/state", "4"));
  }

  std::string dir_, run_, xs_sock_;
  std::unique_ptr<Child> xenstored_, blkback_;
  std::unique_ptr<xenbus::client::SyncClient> xs_;
  std::vector<std::unique_ptr<Guest>> guests_;
  int tokens_ = 0;
};


}  // namespace xpv::test::blkrig
