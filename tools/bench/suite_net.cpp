// `xpv bench net` — TCP throughput through the whole PV network path against a veth pair.
//
// Two network namespaces are created for the run: H ("host side") and D ("domain side").
//   xpv:       H: vif TAP ── NetbackQueue ═ netif rings + grants + event channels ═ Netfront ── D: TAP eth0
//              (a process Domain, GuestEvents, ForeignDomain, GrantMapper: the same pieces as
//              tests/integration/net-path; both TAPs live in the namespaces, nothing in the host's)
//   reference: H: veth ─── D: veth (the kernel's own pair between the same two namespaces)
// iperf3 (Debian's) runs its server in D and its client in H: one stream host->domain, one
// domain->host (-R), then --bidir. Metrics (Gbit/s, as received): `tcp host->domain`,
// `tcp domain->host`, `bidir host->domain`, `bidir domain->host`, and `bidir min/max` (the smaller
// direction over the larger under --bidir, for xpv and for veth). A PNG of the per-second
// throughput of each direction under --bidir is written with gnuplot (if installed) next to
// the JSON (FILE-bidir-timeline.png; see bench.h plot_path). Duration: 5 s per run, times --quick's scale (min 1 s).
// Needs root, /dev/net/tun, iproute2 and iperf3; without them the results say why.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "xpv/domain/domain.h"
#include "xpv/domain/foreign_domain.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/frontends/netfront.h"
#include "xpv/netback/queue.h"
#include "xpv/netback/tap.h"

namespace {

using xpv::bench::Result;
namespace asio = boost::asio;
using namespace xpv;

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

std::string capture(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

// The namespaces of one run; removed (with every interface in them) on destruction.
struct Namespaces {
  std::string h, d;
  bool made = false;
  explicit Namespaces(int pid) : h("xpv-bh-" + std::to_string(pid)), d("xpv-bd-" + std::to_string(pid)) {
    made = sh("ip netns add " + h) == 0 && sh("ip netns add " + d) == 0;
    if (made) made = sh("ip -n " + h + " link set lo up") == 0 && sh("ip -n " + d + " link set lo up") == 0;
  }
  ~Namespaces() {
    (void)sh("ip netns del " + h);
    (void)sh("ip netns del " + d);
  }
};

// The xpv path between the two namespaces, alive while this object lives.
class XpvPath {
 public:
  XpvPath(const Namespaces& ns, std::uint16_t domid, const std::string& run_dir) {
    domain::DomainConfig cfg;
    cfg.domid = domid;
    cfg.name = "bench-net";
    cfg.memory_bytes = 64 << 20;
    cfg.run_dir = run_dir;
    domain_ = std::make_unique<domain::Domain>(io_, cfg, sink_);
    events_ = std::make_unique<frontends::GuestEvents>(domain_->pages(domain::Domain::kSharedInfoGfn, 1));
    sink_.target = events_.get();
    io_thread_ = std::thread([this] { io_.run(); });
    events_thread_ = std::thread([this] { events_->run(); });
    guest_tap_ = netback::Tap::create({"eth0", "/run/netns/" + ns.d, 1, {true, true, true}});
    guest_tap_.set_link({1500, netback::parse_mac("00:16:3e:00:00:02"), true});
    front_ = std::make_unique<frontends::Netfront>(*domain_, *events_, guest_tap_.fd(), frontends::NetfrontConfig{});
    const std::string vif = "vif" + std::to_string(domid) + ".0";
    host_tap_ = netback::Tap::create({vif, "/run/netns/" + ns.h, 1, {true, true, true}});
    host_tap_.set_link({1500, std::nullopt, true});
    foreign_ = std::make_unique<domain::ForeignDomain>(domain::ForeignDomain::connect(domid, "netback", run_dir));
    mapper_ = foreign_->make_mapper();
    auto txm = mapper_->map(front_->tx_ring_ref(), false);
    auto rxm = mapper_->map(front_->rx_ring_ref(), false);
    if (!txm || !rxm) throw std::runtime_error("cannot map the rings");
    auto tx = ring::NetifTxBackRing::attach(txm->writable());
    auto rx = ring::NetifRxBackRing::attach(rxm->writable());
    if (!tx || !rx) throw std::runtime_error("cannot attach the rings");
    netback::NetbackConfig bcfg;
    bcfg.rx_gso = {true, true};
    queue_ = std::make_unique<netback::NetbackQueue>(vif + "-q0", *mapper_, std::move(*tx), std::move(*rx),
                                                     foreign_->bind(front_->tx_port()),
                                                     foreign_->bind(front_->rx_port()), host_tap_.fd(), bcfg);
    queue_thread_ = std::thread([this] { queue_->run(); });
    front_->start();
    vif_ = vif;
  }
  ~XpvPath() {
    if (queue_) queue_->stop();
    if (queue_thread_.joinable()) queue_thread_.join();
    queue_.reset();
    mapper_.reset();
    foreign_.reset();
    front_.reset();
    if (events_) events_->stop();
    if (events_thread_.joinable()) events_thread_.join();
    if (domain_) {
      std::promise<void> done;
      asio::post(io_, [&] {
        domain_.reset();
        done.set_value();
      });
      done.get_future().wait();
    }
    work_.reset();
    io_.stop();
    if (io_thread_.joinable()) io_thread_.join();
  }
  const std::string& vif() const { return vif_; }
  const netback::NetbackCounters& counters() const { return queue_->counters(); }

 private:
  struct ForwardingSink : domain::UpcallSink {
    void upcall(unsigned v) noexcept override {
      if (target) target->upcall(v);
    }
    frontends::GuestEvents* target = nullptr;
  };
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  ForwardingSink sink_;
  std::unique_ptr<domain::Domain> domain_;
  std::unique_ptr<frontends::GuestEvents> events_;
  netback::Tap guest_tap_, host_tap_;
  std::unique_ptr<frontends::Netfront> front_;
  std::unique_ptr<domain::ForeignDomain> foreign_;
  std::unique_ptr<gnttab::GrantMapper> mapper_;
  std::unique_ptr<netback::NetbackQueue> queue_;
  std::thread io_thread_, events_thread_, queue_thread_;
  std::string vif_;
};

struct Series {
  std::vector<double> fwd, rev;  // Gbit/s per second: host->domain, domain->host
};

struct Run {
  double fwd = 0, rev = 0;  // Gbit/s as received
  Series series;
  bool ok = false;
};

// One iperf3 run: server (one-off) in D on `ip`, client in H.
Run iperf(const Namespaces& ns, const std::string& ip, int port, int seconds, const std::string& mode) {
  Run run;
  const pid_t server = ::fork();
  if (server == 0) {
    if (FILE* devnull = std::fopen("/dev/null", "w")) {
      ::dup2(fileno(devnull), 1);
      ::dup2(fileno(devnull), 2);
    }
    const std::string p = std::to_string(port);
    ::execlp("ip", "ip", "netns", "exec", ns.d.c_str(), "iperf3", "-s", "-1", "-B", ip.c_str(), "-p", p.c_str(),
             static_cast<char*>(nullptr));
    ::_exit(127);
  }
  if (server < 0) return run;
  std::string out;
  for (int attempt = 0; attempt < 20; ++attempt) {  // until the server listens (bounded: ~4 s)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    out = capture("ip netns exec " + ns.h + " iperf3 -J -c " + ip + " -p " + std::to_string(port) + " -t " +
                  std::to_string(seconds) + " " + mode + " 2>/dev/null");
    if (out.find("\"end\"") != std::string::npos && out.find("\"error\"") == std::string::npos) break;
  }
  ::kill(server, SIGTERM);
  ::waitpid(server, nullptr, 0);
  try {
    auto j = nlohmann::json::parse(out);
    const auto& end = j.at("end");
    const double fwd = end.at("sum_received").at("bits_per_second").get<double>() / 1e9;
    for (const auto& iv : j.at("intervals")) {
      const double a = iv.at("sum").at("bits_per_second").get<double>() / 1e9;
      if (mode == "--bidir") {
        run.series.fwd.push_back(a);
        run.series.rev.push_back(iv.at("sum_bidir_reverse").at("bits_per_second").get<double>() / 1e9);
      }
    }
    if (mode == "--bidir") {
      run.fwd = fwd;
      run.rev = end.at("sum_received_bidir_reverse").at("bits_per_second").get<double>() / 1e9;
    } else if (mode == "-R") {
      run.rev = fwd;
    } else {
      run.fwd = fwd;
    }
    run.ok = true;
  } catch (...) {
  }
  return run;
}

struct Figures {
  Run up, down, bidir;
  bool ok() const { return up.ok && down.ok && bidir.ok; }
};

Figures measure(const Namespaces& ns, const std::string& ip, int port, int seconds) {
  Figures f;
  f.up = iperf(ns, ip, port, seconds, "");
  f.down = iperf(ns, ip, port, seconds, "-R");
  f.bidir = iperf(ns, ip, port, seconds, "--bidir");
  return f;
}

void plot(const Figures& xpv, const Figures& veth, const std::string& png) {
  if (sh("command -v gnuplot") != 0) return;
  char tmpl[] = "/tmp/xpv-bench-net-XXXXXX";
  if (!::mkdtemp(tmpl)) return;
  const std::string dir = tmpl;
  {
    std::ofstream d(dir + "/data");
    const auto& a = xpv.bidir.series;
    const auto& b = veth.bidir.series;
    const std::size_t n = std::max(a.fwd.size(), b.fwd.size());
    auto at = [](const std::vector<double>& v, std::size_t i) { return i < v.size() ? std::to_string(v[i]) : "NaN"; };
    for (std::size_t i = 0; i < n; ++i) {
      d << (i + 1) << ' ' << at(a.fwd, i) << ' ' << at(a.rev, i) << ' ' << at(b.fwd, i) << ' ' << at(b.rev, i) << '\n';
    }
    std::ofstream g(dir + "/plot.gp");
    g << "set terminal png size 900,500\nset output '" << png << "'\n"
      << "set title 'iperf3 --bidir, per-second throughput of each direction'\n"
      << "set xlabel 'second'\nset ylabel 'Gbit/s'\nset yrange [0:*]\nset key outside right\n"
      << "plot '" << dir << "/data' using 1:2 with linespoints title 'xpv host->domain', "
      << "'' using 1:3 with linespoints title 'xpv domain->host', "
      << "'' using 1:4 with lines dt 2 title 'veth host->domain', "
      << "'' using 1:5 with lines dt 2 title 'veth domain->host'\n";
  }
  if (sh("gnuplot " + dir + "/plot.gp") == 0) std::printf("net: plot written to %s\n", png.c_str());
  (void)sh("rm -rf " + dir);
}

std::vector<Result> run_net(const xpv::bench::Options& opt) {
  const int seconds = std::max(1, static_cast<int>(std::lround(5 * opt.scale)));
  std::vector<Result> rs;
  auto unavailable = [&](const std::string& why) {
    for (const char* m : {"tcp host->domain", "tcp domain->host", "bidir host->domain", "bidir domain->host"}) {
      rs.push_back({m, "Gbit/s", 0, std::nullopt, why});
    }
    rs.push_back({"bidir min/max", "ratio", 0, std::nullopt, why});
    return rs;
  };
  if (::geteuid() != 0 || ::access("/dev/net/tun", R_OK | W_OK) != 0) return unavailable("needs root and /dev/net/tun");
  if (sh("command -v ip") != 0 || sh("command -v iperf3") != 0) return unavailable("needs iproute2 and iperf3");
  const int pid = static_cast<int>(::getpid());
  Namespaces ns(pid);
  if (!ns.made) return unavailable("cannot create network namespaces");
  const std::string xh = "10.253.1.1", xd = "10.253.1.2", vh = "10.253.2.1", vd = "10.253.2.2";
  char tmpl[] = "/tmp/xpv-bench-run-XXXXXX";
  if (!::mkdtemp(tmpl)) return unavailable("mkdtemp failed");
  const std::string run_dir = tmpl;
  Figures x, v;
  std::string note;
  try {
    XpvPath path(ns, static_cast<std::uint16_t>(2000 + pid % 20000), run_dir);
    if (sh("ip -n " + ns.h + " addr add " + xh + "/30 dev " + path.vif()) != 0 ||
        sh("ip -n " + ns.d + " addr add " + xd + "/30 dev eth0") != 0) {
      throw std::runtime_error("cannot add addresses");
    }
    x = measure(ns, xd, 5301, seconds);
    const auto& c = path.counters();
    note = "xpv counters: tx " + std::to_string(c.tx_packets.load()) + " pkts, rx " +
           std::to_string(c.rx_packets.load()) + " pkts, rx_dropped " + std::to_string(c.rx_dropped.load()) +
           ", notifications " + std::to_string(c.notifications.load());
  } catch (const std::exception& e) {
    (void)sh("rm -rf " + run_dir);
    return unavailable(std::string("xpv path setup failed: ") + e.what());
  }
  (void)sh("rm -rf " + run_dir);
  if (sh("ip link add xpvb-h" + std::to_string(pid % 10000) + " netns " + ns.h + " type veth peer name xpvb-d" +
         std::to_string(pid % 10000) + " netns " + ns.d) != 0) {
    return unavailable("cannot create the veth pair");
  }
  const std::string vh_if = "xpvb-h" + std::to_string(pid % 10000), vd_if = "xpvb-d" + std::to_string(pid % 10000);
  (void)sh("ip -n " + ns.h + " addr add " + vh + "/30 dev " + vh_if);
  (void)sh("ip -n " + ns.d + " addr add " + vd + "/30 dev " + vd_if);
  (void)sh("ip -n " + ns.h + " link set " + vh_if + " up");
  (void)sh("ip -n " + ns.d + " link set " + vd_if + " up");
  v = measure(ns, vd, 5302, seconds);
  if (!x.ok() || !v.ok()) return unavailable("an iperf3 run failed");
  plot(x, v, xpv::bench::plot_path(opt, "net", "bidir-timeline"));
  auto minmax = [](double a, double b) { return std::max(a, b) > 0 ? std::min(a, b) / std::max(a, b) : 0.0; };
  const std::string ref = "reference: veth pair between the same two namespaces; " + std::to_string(seconds) + " s per run";
  rs.push_back({"tcp host->domain", "Gbit/s", x.up.fwd, v.up.fwd, ref + "; " + note});
  rs.push_back({"tcp domain->host", "Gbit/s", x.down.rev, v.down.rev, ref});
  rs.push_back({"bidir host->domain", "Gbit/s", x.bidir.fwd, v.bidir.fwd, ref});
  rs.push_back({"bidir domain->host", "Gbit/s", x.bidir.rev, v.bidir.rev, ref});
  rs.push_back({"bidir min/max", "ratio", minmax(x.bidir.fwd, x.bidir.rev), minmax(v.bidir.fwd, v.bidir.rev),
                "smaller direction / larger under iperf3 --bidir; bidir sum xpv " +
                    std::to_string(x.bidir.fwd + x.bidir.rev) + " vs veth " +
                    std::to_string(v.bidir.fwd + v.bidir.rev) + " Gbit/s"});
  return rs;
}

}  // namespace

XPV_BENCH_SUITE("net", "iperf3 through netfront/netback (TAPs in namespaces) vs a veth pair", run_net);
