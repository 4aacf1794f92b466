// `xpv bench xenstore`: xpv-xenstored driven by Debian's libxenstore — write, read and
// directory throughput with 1 and 8 concurrent clients, and watch-fire latency (write on one
// client → xs_read_watch returns on the watchers) with 1 and 8 watching clients; plus pipelined
// writes through xpv's own async client, and the pause a live update of the daemon's binary
// causes (10 000 nodes, 8 watching clients). The suite starts its own daemon (the xpv-xenstored next
// to this xpv binary) on a temporary socket, with its crash-restart journal as `xpv up` runs it,
// and stops it afterwards. What the journal costs: the write rows again from a daemon without one;
// what a crash costs: the time a daemon killed with SIGKILL takes to serve again from its journal
// (10 000 nodes).
//
// Reference: none. Debian's C xenstored (xen-utils-4.17, started with --no-domain-init) crashes
// on its first socket request without a hypervisor, and oxenstored needs Xen (xenctrl); there is
// no other xenstore daemon on Debian that runs on a host without Xen.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <boost/asio/io_context.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include <xenstore.h>
}

#include "bench/bench.h"
#include "xpv/xenbus/client/client.h"

extern char** environ;

namespace {

using xpv::bench::Clock;
using xpv::bench::Result;

constexpr const char* kNoReference =
    "no reference: Debian's xenstored/oxenstored do not run without Xen";

// The daemon under test, on a socket in a private temporary directory. SIGTERM on destruction.
class BenchDaemon {
 public:
  // `journal`: with --journal <dir>/journal, as `xpv up` runs it.
  explicit BenchDaemon(bool journal) : journal_(journal) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "xpv-bench-xs-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    socket_ = dir_ + "/socket";
    bin_ = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "xpv-xenstored").string();
    if (!std::filesystem::exists(bin_)) {
      std::filesystem::remove_all(dir_);
      throw std::runtime_error("xenstore bench: " + bin_ + " not built");
    }
    try {
      start();
    } catch (...) {
      stop();
      throw;
    }
  }
  ~BenchDaemon() { stop(); }
  const std::string& socket() const { return socket_; }
  // (Again) on the same socket and journal; returns once it accepts connections (at most 5 s).
  void start() {
    std::vector<std::string> args{bin_, "--foreground", "--socket", socket_, "--log-level", "error", "--quota",
                                  "watches=1024", "--quota", "outstanding=1024"};
    if (journal_) args.insert(args.end(), {"--journal", dir_ + "/journal"});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
      throw std::runtime_error("xenstore bench: cannot start " + bin_);
    }
    for (int i = 0; i < 50000 && !connectable(); ++i) ::usleep(100);
    if (!connectable()) throw std::runtime_error("xenstore bench: xpv-xenstored did not come up");
  }
  // SIGKILL, as a crash.
  void crash() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  bool connectable() const {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, socket_.c_str(), sizeof sa.sun_path - 1);
    bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    ::close(fd);
    return ok;
  }
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  bool journal_;
  pid_t pid_ = -1;
  std::string dir_;
  std::string socket_;
  std::string bin_;
};

struct XsHandle {
  XsHandle() : h(xs_open(0)) {
    if (!h) throw std::runtime_error("xenstore bench: xs_open failed");
  }
  ~XsHandle() { xs_close(h); }
  XsHandle(const XsHandle&) = delete;
  XsHandle& operator=(const XsHandle&) = delete;
  xs_handle* h;
};

enum class Op { write, read, directory };

// ops/s over `clients` threads, each with its own connection doing `per_client` operations.
double throughput(Op op, int clients, int per_client) {
  std::vector<std::unique_ptr<XsHandle>> hs;
  for (int c = 0; c < clients; ++c) hs.push_back(std::make_unique<XsHandle>());
  // Setup: each client's own subtree with 32 keys.
  for (int c = 0; c < clients; ++c)
    for (int k = 0; k < 32; ++k) {
      std::string p = "/bench/c" + std::to_string(c) + "/k" + std::to_string(k);
      xs_write(hs[c]->h, XBT_NULL, p.c_str(), "value", 5);
    }
  std::atomic<int> failures{0};
  std::barrier start(clients + 1);
  std::vector<std::thread> ts;
  for (int c = 0; c < clients; ++c) {
    ts.emplace_back([&, c] {
      xs_handle* h = hs[c]->h;
      std::string base = "/bench/c" + std::to_string(c);
      start.arrive_and_wait();
      for (int i = 0; i < per_client; ++i) {
        std::string p = base + "/k" + std::to_string(i % 32);
        unsigned int len = 0;
        bool ok = true;
        switch (op) {
          case Op::write: ok = xs_write(h, XBT_NULL, p.c_str(), "value-42", 8); break;
          case Op::read: {
            void* v = xs_read(h, XBT_NULL, p.c_str(), &len);
            ok = v != nullptr;
            std::free(v);
            break;
          }
          case Op::directory: {
            char** d = xs_directory(h, XBT_NULL, base.c_str(), &len);
            ok = d != nullptr && len == 32;
            std::free(d);
            break;
          }
        }
        if (!ok) failures.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  start.arrive_and_wait();
  auto t0 = Clock::now();
  for (auto& t : ts) t.join();
  double secs = xpv::bench::seconds_since(t0);
  if (failures.load() != 0) throw std::runtime_error("xenstore bench: operations failed");
  return static_cast<double>(clients) * per_client / secs;
}

// Median microseconds from the start of xs_write on a separate client until the last of
// `watchers` clients has read the event.
double watch_latency_us(int watchers, int iterations) {
  XsHandle writer;
  std::vector<std::unique_ptr<XsHandle>> ws;
  for (int i = 0; i < watchers; ++i) {
    ws.push_back(std::make_unique<XsHandle>());
    if (!xs_watch(ws.back()->h, "/bench/w", "t"))
      throw std::runtime_error("xenstore bench: xs_watch failed");
  }
  auto read_one = [](xs_handle* h) {
    pollfd p{xs_fileno(h), POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) throw std::runtime_error("xenstore bench: watch event lost");
    unsigned int n = 0;
    std::free(xs_read_watch(h, &n));
  };
  for (auto& w : ws) read_one(w->h);  // the registration event
  std::vector<double> lat;
  lat.reserve(static_cast<std::size_t>(iterations));
  for (int i = 0; i < iterations; ++i) {
    auto t0 = Clock::now();
    if (!xs_write(writer.h, XBT_NULL, "/bench/w/x", "1", 1))
      throw std::runtime_error("xenstore bench: write failed");
    for (auto& w : ws) read_one(w->h);
    lat.push_back(xpv::bench::seconds_since(t0) * 1e6);
  }
  std::nth_element(lat.begin(), lat.begin() + lat.size() / 2, lat.end());
  return lat[lat.size() / 2];
}

// Pipelined writes through xpv's async client: `depth` requests in flight.
double async_client_writes(const std::string& socket, int total, int depth) {
  boost::asio::io_context io;
  auto c = xpv::xenbus::client::Client::create(io);
  int issued = 0, done = 0, failed = 0;
  Clock::time_point t0;
  std::function<void()> issue = [&] {
    int i = issued++;
    c->write("/bench/async/k" + std::to_string(i % 64), "value-42",
             [&](xpv::xenbus::client::Result<void> r) {
               if (!r) ++failed;
               if (++done == total) return c->close();
               if (issued < total) issue();
             });
  };
  c->connect(socket, [&](xpv::xenbus::client::Result<void> r) {
    if (!r) return;
    t0 = Clock::now();
    for (int i = 0; i < depth && issued < total; ++i) issue();
  });
  io.run();
  double secs = xpv::bench::seconds_since(t0);
  if (done != total || failed != 0) throw std::runtime_error("xenstore bench: async writes failed");
  return total / secs;
}

// The pause of a live update (xenbus/README.md, "Live update"): `nodes` nodes in the tree and
// `watchers` socket clients each holding a watch; per round, the time from sending
// `live-update -s` to the new binary's OK (the state saved, the exec, the state read back), then a
// write that every watcher must see through the new binary. Median of `rounds`, in ms.
double live_update_pause_ms(int nodes, int watchers, int rounds) {
  XsHandle ctl;
  for (int i = 0; i < nodes; ++i) {
    const std::string p = "/bench/lu/d" + std::to_string(i / 100) + "/k" + std::to_string(i % 100);
    if (!xs_write(ctl.h, XBT_NULL, p.c_str(), "value-of-a-node", 15)) throw std::runtime_error("xenstore bench: setup write failed");
  }
  std::vector<std::unique_ptr<XsHandle>> ws;
  for (int w = 0; w < watchers; ++w) {
    ws.push_back(std::make_unique<XsHandle>());
    if (!xs_watch(ws.back()->h, "/bench/lu/fire", "t")) throw std::runtime_error("xenstore bench: watch failed");
  }
  auto next_event = [](xs_handle* h) {
    pollfd p{xs_fileno(h), POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) throw std::runtime_error("xenstore bench: a watcher saw no event within 5 s");
    unsigned n = 0;
    free(xs_read_watch(h, &n));
  };
  for (auto& w : ws) next_event(w->h);  // the registration's event
  const std::string bin = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "xpv-xenstored").string();
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r) {
    std::string f = std::string("-f") + '\0' + bin + '\0';
    char* ok = xs_control_command(ctl.h, "live-update", f.data(), static_cast<unsigned>(f.size()));
    const bool f_ok = ok && std::strcmp(ok, "OK") == 0;
    std::free(ok);
    if (!f_ok) throw std::runtime_error("xenstore bench: live-update -f refused");
    const auto t0 = Clock::now();
    ok = xs_control_command(ctl.h, "live-update", const_cast<char*>("-s"), 3);
    ms.push_back(xpv::bench::seconds_since(t0) * 1e3);
    const bool s_ok = ok && std::strcmp(ok, "OK") == 0;
    std::free(ok);
    if (!s_ok) throw std::runtime_error("xenstore bench: live-update -s did not answer OK");
    if (!xs_write(ctl.h, XBT_NULL, "/bench/lu/fire", "1", 1)) throw std::runtime_error("xenstore bench: write after the update failed");
    for (auto& w : ws) next_event(w->h);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Writes `nodes` nodes, kills the daemon (SIGKILL) and times, on the host's clock, how long the
// next one takes to accept connections with the store recovered from its journal; checks that
// the last node written is there. Median of `rounds`.
double crash_recovery_ms(BenchDaemon& d, int nodes, int rounds) {
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r) {
    {
      XsHandle c;
      for (int i = 0; i < nodes; ++i) {
        const std::string p = "/bench/crash/n" + std::to_string(i);
        if (!xs_write(c.h, XBT_NULL, p.c_str(), "v", 1)) throw std::runtime_error("xenstore bench: write failed");
      }
    }
    d.crash();
    const auto t0 = Clock::now();
    d.start();
    ms.push_back(xpv::bench::seconds_since(t0) * 1e3);
    XsHandle c;
    unsigned len = 0;
    const std::string last = "/bench/crash/n" + std::to_string(nodes - 1);
    void* v = xs_read(c.h, XBT_NULL, last.c_str(), &len);
    const bool kept = v != nullptr;
    std::free(v);
    if (!kept) throw std::runtime_error("xenstore bench: the restarted daemon lost " + last);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::vector<Result> run_xenstore(const xpv::bench::Options& opts) {
  auto n = [&](int base) { return std::max(50, static_cast<int>(base * opts.scale)); };
  std::vector<Result> rs;
  // Without the journal first (its own daemon), for what the journal costs.
  std::vector<std::pair<std::string, double>> plain;
  {
    BenchDaemon bare(false);
    ::setenv("XENSTORED_PATH", bare.socket().c_str(), 1);
    for (int clients : {1, 8}) {
      plain.emplace_back(clients == 1 ? "write (1 client), without the journal" : "write (8 clients), without the journal",
                         throughput(Op::write, clients, n(clients == 1 ? 20000 : 5000)));
    }
  }
  BenchDaemon daemon(true);
  ::setenv("XENSTORED_PATH", daemon.socket().c_str(), 1);
  auto add = [&](std::string metric, std::string unit, double v, bool lower = false) {
    Result r;
    r.metric = std::move(metric);
    r.unit = std::move(unit);
    r.xpv = v;
    r.note = kNoReference;
    r.lower_is_better = lower;
    rs.push_back(std::move(r));
  };
  for (int clients : {1, 8}) {
    int per = n(clients == 1 ? 20000 : 5000);
    std::string sfx = clients == 1 ? " (1 client)" : " (8 clients)";
    add("write" + sfx, "ops/s", throughput(Op::write, clients, per));
    add("read" + sfx, "ops/s", throughput(Op::read, clients, per));
    add("directory 32 entries" + sfx, "ops/s", throughput(Op::directory, clients, per));
  }
  add("watch fire latency, median (1 watcher)", "us", watch_latency_us(1, n(2000)), true);
  add("watch fire latency, median (8 watchers)", "us", watch_latency_us(8, n(1000)), true);
  add("write, xpv async client, 64 in flight", "ops/s",
      async_client_writes(daemon.socket(), n(50000), 64));
  const int lu_nodes = n(10000);
  add("live update pause (" + std::to_string(lu_nodes) + " nodes, 8 watching clients), median of 5", "ms",
      live_update_pause_ms(lu_nodes, 8, 5), true);
  for (const auto& [metric, v] : plain) add(metric, "ops/s", v);
  {
    BenchDaemon crashing(true);  // a store of just these nodes
    ::setenv("XENSTORED_PATH", crashing.socket().c_str(), 1);
    add("crash restart: SIGKILL to serving again from the journal (" + std::to_string(lu_nodes) +
            " nodes), median of 3",
        "ms", crash_recovery_ms(crashing, lu_nodes, 3), true);
  }
  ::unsetenv("XENSTORED_PATH");
  return rs;
}

}  // namespace

XPV_BENCH_SUITE("xenstore",
                "xpv-xenstored via libxenstore: write/read/directory ops/s (1 and 8 clients), "
                "watch-fire latency, the pause of a live update, the journal's cost and a crash restart",
                run_xenstore);
