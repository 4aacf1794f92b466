// The netback rig shared by the daemon's integration test and its xenbus fuzz: every component
// real and run as the user runs them — `xpv up` (the real xpv-xenstored, the supervisor,
// xpv-blkback and xpv-netback), `xpv create` with a vif (the real xpv-front) — inside a network
// namespace the rig makes (`hostns`): every `xpv` command runs in it (nsenter), so the daemons,
// the host TAPs vif<N>.<devid> and their addresses live there and nowhere else; the domains'
// namespaces are made by the toolstack under the rig's temporary directory (--netns-dir).
// Teardown: `xpv down --force`, SIGKILL of anything still naming the directory, every mount under
// it detached, the host namespace removed — also when a test fails. Every wait is bounded.
#pragma once

#include <fmt/core.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include "../toolstack/harness.h"
#include "xpv/domain/domain.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/frontends/netfront.h"
#include "xpv/netback/netns.h"
#include "xpv/netback/tap.h"
#include "xpv/toolstack/process.h"
#include "xpv/xenbus/client/sync_client.h"

namespace xpv::test::netrig {

namespace fs = std::filesystem;
namespace asio = boost::asio;
using namespace std::chrono_literals;
using test::run_command;
using test::RunResult;
using test::slurp;

inline const std::string kBin = XPV_BIN_DIR;

inline int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

inline bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds limit = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return cond();
}

class NetbackRig {
 public:
  NetbackRig() = default;
  NetbackRig(const NetbackRig&) = delete;
  NetbackRig& operator=(const NetbackRig&) = delete;
  ~NetbackRig() { teardown(false); }

  // Why this machine cannot run the rig (root, /dev/net/tun, nsenter, ping), or "" when it can.
  static std::string missing() {
    if (::geteuid() != 0 || ::access("/dev/net/tun", R_OK | W_OK) != 0 || sh("command -v nsenter") != 0 ||
        sh("command -v ping") != 0) {
      return "needs root, /dev/net/tun, nsenter and ping";
    }
    return "";
  }
  // The temporary directory, the host namespace and the test's /24; fails the test (ASSERT) when a
  // program is not built.
  void setup() {
    for (const char* p : {"xpv", "xpv-xenstored", "xpv-front", "xpv-netback"}) {
      ASSERT_EQ(::access((kBin + "/" + p).c_str(), X_OK), 0) << kBin << "/" << p << " is not built";
    }
    std::string t = (fs::temp_directory_path() / "xpv-netbackd-XXXXXX").string();
    ASSERT_NE(::mkdtemp(t.data()), nullptr);
    dir_ = t;
    hostns_ = dir_ + "/hostns";
    netback::create_netns(hostns_);
    // A /24 of 10.x.y.0 the test alone uses (inside its own namespaces anyway).
    const int pid = static_cast<int>(::getpid());
    net_ = fmt::format("10.{}.{}", 100 + pid % 100, (pid / 100) % 200);
  }

  // Everything the rig made goes, also after a failure; `print_logs`: the daemons' logs on stderr
  // first.
  void teardown(bool print_logs) {
    if (dir_.empty()) return;
    if (print_logs) {
      for (const char* l : {"xpv-netback.log", "xpv-front-web1.log", "xpv-supervise.log"}) {
        std::cerr << "---- " << l << " ----\n" << slurp(dir_ + "/log/" + l) << "----\n";
      }
    }
    guest_.reset();
    (void)xpv({"down", "--force"});
    for (int round = 0; round < 3; ++round) {
      auto left = test::processes_mentioning(dir_);
      if (left.empty()) break;
      for (pid_t p : left) ::kill(p, SIGKILL);
      std::this_thread::sleep_for(100ms);
    }
    toolstack::unmount_under(dir_);  // the namespaces' bind mounts (hostns, netns/xpv-dom<N>)
    std::error_code ec;
    fs::remove_all(dir_, ec);
    dir_.clear();
  }

  // `xpv ARGS` run inside the test's host namespace with the test's directories.
  RunResult xpv(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {"/usr/bin/nsenter", "--net=" + hostns_, kBin + "/xpv", "--run-dir", dir_ + "/run",
                                     "--log-dir", dir_ + "/log", "--xenstore", dir_ + "/xs.sock", "--bin-dir", kBin,
                                     "--netns-dir", dir_ + "/netns"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, {}, 60s);
  }
  // `CMD` (a shell line) inside network namespace `ns`.
  int in(const std::string& ns, const std::string& cmd) const {
    return sh("nsenter --net=" + ns + " " + cmd);
  }
  std::string domns(int domid) const { return fmt::format("{}/netns/xpv-dom{}", dir_, domid); }
  std::string log(const std::string& name) const { return slurp(dir_ + "/log/" + name); }

  void up() {
    auto r = xpv({"up"});
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    ASSERT_NE(r.out.find("xpv-netback: running"), std::string::npos) << r.out;
  }
  // Creates web1 (domid 1) with one vif; returns `xpv create`'s output.
  std::string create(const std::string& vif_spec, unsigned vcpus = 1) {
    const std::string cfg = dir_ + "/web1.cfg";
    std::ofstream(cfg) << fmt::format("name = \"web1\"\ntype = \"process\"\nmemory = 64\nvcpus = {}\nvif = [ '{}' ]\n",
                                      vcpus, vif_spec);
    auto r = xpv({"create", cfg});
    EXPECT_EQ(r.rc, 0) << r.out << r.err << log("xpv-front-web1.log") << log("xpv-netback.log");
    return r.out;
  }
  std::optional<std::string> node(const std::string& path) {
    xenbus::client::SyncClient c(dir_ + "/xs.sock");
    auto v = c.read(path);
    if (!v) return std::nullopt;
    return *v;
  }
  std::optional<pid_t> netback_pid() {
    return toolstack::running_pid(dir_ + "/run/xpv-netback.pid", "xpv-netback");
  }
  bool ping(const std::string& from_ns, const std::string& to, unsigned size = 56) const {
    return in(from_ns, fmt::format("ping -c 3 -i 0.2 -W 3 -M do -s {} {}", size, to)) == 0;
  }

  // An in-process frontend domain (what xpv-front is made of), for the hostile-guest tests.
  struct Guest {
    struct Sink : domain::UpcallSink {
      void upcall(unsigned v) noexcept override {
        if (target) target->upcall(v);
      }
      frontends::GuestEvents* target = nullptr;
    };
    asio::io_context io;
    asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
    Sink sink;
    std::unique_ptr<domain::Domain> dom;
    std::unique_ptr<frontends::GuestEvents> events;
    netback::Tap tap;
    std::unique_ptr<frontends::Netfront> front;
    std::thread io_thread, events_thread;
    ~Guest() {
      front.reset();
      if (events) events->stop();
      if (events_thread.joinable()) events_thread.join();
      if (dom) {
        std::packaged_task<void()> t([this] { dom.reset(); });
        auto f = t.get_future();
        asio::post(io, [&t] { t(); });
        f.wait();
      }
      work.reset();
      io.stop();
      if (io_thread.joinable()) io_thread.join();
    }
  };

  // guest_ becomes domain `domid` (memory, control socket in the run dir, events running).
  void make_guest(std::uint16_t domid, const std::string& name) {
    guest_ = std::make_unique<Guest>();
    domain::DomainConfig cfg;
    cfg.domid = domid;
    cfg.name = name;
    cfg.memory_bytes = 32 << 20;
    cfg.run_dir = dir_ + "/run";
    guest_->dom = std::make_unique<domain::Domain>(guest_->io, cfg, guest_->sink);
    guest_->events = std::make_unique<frontends::GuestEvents>(guest_->dom->pages(domain::Domain::kSharedInfoGfn, 1));
    guest_->sink.target = guest_->events.get();
    guest_->io_thread = std::thread([g = guest_.get()] { g->io.run(); });
    guest_->events_thread = std::thread([g = guest_.get()] { g->events->run(); });
  }

  std::string dir_, hostns_, net_;
  std::unique_ptr<Guest> guest_;
};

}  // namespace xpv::test::netrig
