// `xpv bench net` — iperf3 through the PV network path as a user runs it, against a veth pair.
//
// The run gets a private "host": a temporary directory W (run/, log/, netns/, the xenstore
// socket) and a network namespace W/hostns in which every `xpv` command runs (nsenter), so the
// daemons it starts, the host TAP and its address live there and nowhere else:
//   xpv:       `xpv up` (xpv-xenstored, xpv-netback, xpv-blkback, the supervisor), then `xpv create`
//              of a process domain with one vif:
//              hostns: vif<N>.0 (TAP) ── xpv-netback ═ netif rings, grants, event channels ═
//              xpv-front's Netfront ── eth0 (TAP) in the domain's namespace W/netns/xpv-dom<N>
//   reference: a veth pair between the same two namespaces
// iperf3 (Debian's) runs its server in the domain's namespace and its client in hostns: one
// stream host->domain, one domain->host (-R), then --bidir. Metrics (Gbit/s, as received):
// `tcp host->domain`, `tcp domain->host`, `bidir host->domain`, `bidir domain->host`, and
// `bidir min/max` (the smaller direction over the larger under --bidir, for xpv and for veth). A
// PNG of the per-second throughput of each direction under --bidir is written with gnuplot (if
// installed) next to the JSON (FILE-bidir-timeline.png; see bench.h plot_path). Duration: 5 s per
// run, times --quick's scale (min 1 s).
// Two vifs at once (fairness between vifs, not only between directions): a second process domain
// with its own vif, and one host->domain stream to each domain at the same time; `vifs min/max`
// is the smaller of the two received rates over the larger (reference: two veth pairs, the same
// two streams), `vifs sum` their total (Gbit/s). Then the first domain's stream again while the
// second domain floods the host with 64-byte UDP datagrams: `tcp beside a 64-byte flood`.
// Teardown, also after a failure: `xpv down --force`, SIGKILL of anything still naming W, every
// mount under W detached (the namespaces go with their mounts), W removed.
// Needs root, /dev/net/tun, nsenter, iproute2, iperf3 and the daemons next to `xpv`; without them
// the results say why.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "xpv/netback/netns.h"
#include "xpv/toolstack/host_cleanup.h"

namespace {

using xpv::bench::Result;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

using xpv::bench::Captured;
// A shell line's stdout and stderr together, and its exit status.
Captured capture(const std::string& cmd) { return xpv::bench::shell_capture(cmd + " 2>&1"); }

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const auto nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// The run's private host (see the top of the file); everything goes in the destructor.
class PrivateHost {
 public:
  PrivateHost() {
    std::string t = (fs::temp_directory_path() / "xpv-bench-net-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = t;
    hostns_ = dir_ + "/hostns";
    xpv::netback::create_netns(hostns_);
    self_ = fs::read_symlink("/proc/self/exe").string();
  }
  ~PrivateHost() {
    (void)xpv("down --force");
    for (int round = 0; round < 3; ++round) {
      const auto left = xpv::toolstack::processes_mentioning(dir_);
      if (left.empty()) break;
      for (pid_t p : left) ::kill(p, SIGKILL);
      std::this_thread::sleep_for(100ms);
    }
    (void)xpv::toolstack::unmount_under(dir_);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  PrivateHost(const PrivateHost&) = delete;
  PrivateHost& operator=(const PrivateHost&) = delete;

  // `xpv ARGS` in hostns with the run's directories (bounded: 120 s).
  Captured xpv(const std::string& args) const {
    return capture("timeout 120 nsenter --net=" + hostns_ + " " + self_ + " --run-dir " + dir_ + "/run --log-dir " +
                   dir_ + "/log --xenstore " + dir_ + "/xs.sock --bin-dir " + fs::path(self_).parent_path().string() +
                   " --netns-dir " + dir_ + "/netns " + args);
  }
  const std::string& dir() const { return dir_; }
  const std::string& hostns() const { return hostns_; }

 private:
  std::string dir_, hostns_, self_;
};

struct Series {
  std::vector<double> fwd, rev;  // Gbit/s per second: host->domain, domain->host
};

struct Run {
  double fwd = 0, rev = 0;  // Gbit/s as received
  Series series;
  bool ok = false;
};

// The two ends of a measurement: namespace files (nsenter --net=).
struct Ends {
  std::string host_ns, domain_ns;
};

// One iperf3 run: server (one-off) in the domain's namespace on `ip`, client in the host's.
Run iperf(const Ends& ns, const std::string& ip, int port, int seconds, const std::string& mode) {
  Run run;
  const pid_t server = ::fork();
  if (server == 0) {
    if (FILE* devnull = std::fopen("/dev/null", "w")) {
      ::dup2(fileno(devnull), 1);
      ::dup2(fileno(devnull), 2);
    }
    const std::string p = std::to_string(port), net = "--net=" + ns.domain_ns;
    ::execlp("nsenter", "nsenter", net.c_str(), "iperf3", "-s", "-1", "-B", ip.c_str(), "-p", p.c_str(),
             static_cast<char*>(nullptr));
    ::_exit(127);
  }
  if (server < 0) return run;
  std::string out;
  for (int attempt = 0; attempt < 20; ++attempt) {  // until the server listens (bounded: ~4 s)
    std::this_thread::sleep_for(200ms);
    out = capture("timeout " + std::to_string(seconds + 30) + " nsenter --net=" + ns.host_ns + " iperf3 -J -c " + ip +
                  " -p " + std::to_string(port) + " -t " + std::to_string(seconds) + " " + mode)
              .out;
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

Figures measure(const Ends& ns, const std::string& ip, int port, int seconds) {
  Figures f;
  f.up = iperf(ns, ip, port, seconds, "");
  f.down = iperf(ns, ip, port, seconds, "-R");
  f.bidir = iperf(ns, ip, port, seconds, "--bidir");
  return f;
}

// One host->domain stream to each of two domains at once: their received rates (Gbit/s).
// `mode_b`: iperf3 options of the second stream (default: the same TCP stream as the first).
std::pair<Run, Run> concurrent(const Ends& a, const std::string& ip_a, const Ends& b, const std::string& ip_b,
                               int port, int seconds, const std::string& mode_b = "") {
  auto fa = std::async(std::launch::async, [&] { return iperf(a, ip_a, port, seconds, ""); });
  auto fb = std::async(std::launch::async, [&] { return iperf(b, ip_b, port + 1, seconds, mode_b); });
  return {fa.get(), fb.get()};
}

// The second stream of the flood row: the domain sends UDP datagrams of 64 bytes (106-byte
// frames) as fast as iperf3 can — a vif that costs its backend per packet far more than per byte.
// (iperf() files what the host received under `fwd` for any mode but a bare "-R".)
const std::string kFlood = "-u -b 0 -l 64 -R";

bool veth_pair(const std::string& host_ns, const std::string& domain_ns, const std::string& name,
               const std::string& host_ip, const std::string& domain_ip) {
  return sh("nsenter --net=" + host_ns + " ip link add " + name + "-h type veth peer name " + name + "-d netns " +
            domain_ns) == 0 &&
         sh("nsenter --net=" + host_ns + " ip addr add " + host_ip + "/24 dev " + name + "-h") == 0 &&
         sh("nsenter --net=" + domain_ns + " ip addr add " + domain_ip + "/24 dev " + name + "-d") == 0 &&
         sh("nsenter --net=" + host_ns + " ip link set " + name + "-h up") == 0 &&
         sh("nsenter --net=" + domain_ns + " ip link set " + name + "-d up") == 0;
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

// The domain's vCPUs: xpv create gives a process domain one netif queue per vCPU (as Linux's
// netfront does); iperf3's single stream uses one of them.
constexpr unsigned kVcpus = 2;

std::vector<Result> run_net(const xpv::bench::Options& opt) {
  const int seconds = std::max(1, static_cast<int>(std::lround(5 * opt.scale)));
  std::vector<Result> rs;
  auto unavailable = [&](const std::string& why) {
    for (const char* m : {"tcp host->domain", "tcp domain->host", "bidir host->domain", "bidir domain->host"}) {
      rs.push_back({m, "Gbit/s", 0, std::nullopt, why});
    }
    rs.push_back({"bidir min/max", "ratio", 0, std::nullopt, why});
    rs.push_back({"vifs min/max", "ratio", 0, std::nullopt, why});
    rs.push_back({"vifs sum", "Gbit/s", 0, std::nullopt, why});
    rs.push_back({"tcp beside a 64-byte flood", "Gbit/s", 0, std::nullopt, why});
    return rs;
  };
  if (::geteuid() != 0 || ::access("/dev/net/tun", R_OK | W_OK) != 0) return unavailable("needs root and /dev/net/tun");
  if (sh("command -v ip") != 0 || sh("command -v iperf3") != 0 || sh("command -v nsenter") != 0) {
    return unavailable("needs iproute2, iperf3 and nsenter");
  }
  const std::string xh = "10.253.1.1", xd = "10.253.1.2", vh = "10.253.2.1", vd = "10.253.2.2";
  const std::string xd2 = "10.253.3.2", vh2 = "10.253.4.1", vd2 = "10.253.4.2";
  Figures x, v;
  std::pair<Run, Run> x2, v2, xf, vf;
  std::string note;
  try {
    PrivateHost host;
    auto up = host.xpv("up");
    if (up.rc != 0) return unavailable("xpv up failed: " + last_line(up.out));
    const std::string cfg = host.dir() + "/bench-net.cfg";
    std::ofstream(cfg) << "name = \"bench-net\"\ntype = \"process\"\nmemory = 128\nvcpus = " << kVcpus
                       << "\nvif = [ 'mac=00:16:3e:00:fe:02, ip=" << xd << "/24' ]\n";
    auto created = host.xpv("create " + cfg);
    std::smatch m;
    if (created.rc != 0 || !std::regex_search(created.out, m, std::regex("in network namespace (\\S+)"))) {
      return unavailable("xpv create failed: " + last_line(created.out));
    }
    const Ends ends{host.hostns(), m[1].str()};
    x = measure(ends, xd, 5301, seconds);
    // The reference: a veth pair between the same two namespaces.
    if (!veth_pair(ends.host_ns, ends.domain_ns, "xpvb", vh, vd)) return unavailable("cannot create the veth pair");
    v = measure(ends, vd, 5302, seconds);
    // A second domain with its own vif; one stream to each domain at once, then the same over two
    // veth pairs.
    const std::string cfg2 = host.dir() + "/bench-net2.cfg";
    std::ofstream(cfg2) << "name = \"bench-net2\"\ntype = \"process\"\nmemory = 128\nvcpus = " << kVcpus
                        << "\nvif = [ 'mac=00:16:3e:00:fe:03, ip=" << xd2 << "/24' ]\n";
    auto created2 = host.xpv("create " + cfg2);
    if (created2.rc != 0 || !std::regex_search(created2.out, m, std::regex("in network namespace (\\S+)"))) {
      return unavailable("xpv create of the second domain failed: " + last_line(created2.out));
    }
    const Ends ends2{host.hostns(), m[1].str()};
    x2 = concurrent(ends, xd, ends2, xd2, 5311, seconds);
    // The first stream again while the second domain floods the host with small datagrams
    // (fairness between a bulk vif and one that is expensive per byte: backends/README.md
    // "Fairness").
    xf = concurrent(ends, xd, ends2, xd2, 5331, seconds, kFlood);
    if (!veth_pair(ends2.host_ns, ends2.domain_ns, "xpvc", vh2, vd2)) return unavailable("cannot create the second veth pair");
    v2 = concurrent(ends, vd, ends2, vd2, 5321, seconds);
    vf = concurrent(ends, vd, ends2, vd2, 5341, seconds, kFlood);
    note = "xpv: xpv up + a process domain (" + std::to_string(kVcpus) +
           " vCPUs, so 2 netif queues) through xpv-netback and xpv-front";
    if (!x.ok() || !x2.first.ok || !x2.second.ok || !xf.first.ok || !xf.second.ok) {
      std::ifstream f(host.dir() + "/log/xpv-netback.log");
      const std::string log((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      return unavailable("an iperf3 run through xpv failed; xpv-netback's last log line: " + last_line(log));
    }
  } catch (const std::exception& e) {
    return unavailable(std::string("setup failed: ") + e.what());
  }
  if (!v.ok() || !v2.first.ok || !v2.second.ok || !vf.first.ok || !vf.second.ok) {
    return unavailable("an iperf3 run over the veth reference failed");
  }
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
  rs.push_back({"vifs min/max", "ratio", minmax(x2.first.fwd, x2.second.fwd), minmax(v2.first.fwd, v2.second.fwd),
                "two domains' vifs, one host->domain stream each at once: smaller / larger (xpv " +
                    std::to_string(x2.first.fwd) + " and " + std::to_string(x2.second.fwd) + "; veth " +
                    std::to_string(v2.first.fwd) + " and " + std::to_string(v2.second.fwd) + " Gbit/s)"});
  rs.push_back({"vifs sum", "Gbit/s", x2.first.fwd + x2.second.fwd, v2.first.fwd + v2.second.fwd,
                "the two streams' total; reference: two veth pairs"});
  rs.push_back({"tcp beside a 64-byte flood", "Gbit/s", xf.first.fwd, vf.first.fwd,
                "one host->domain TCP stream while the second domain floods the host with iperf3 " + kFlood +
                    " (xpv " + std::to_string(xf.first.fwd) + " beside " + std::to_string(xf.second.fwd * 1000) +
                    " Mbit/s of flood received, " + std::to_string(x.up.fwd) + " alone; veth " +
                    std::to_string(vf.first.fwd) + " beside " + std::to_string(vf.second.fwd * 1000) + ", " +
                    std::to_string(v.up.fwd) + " alone)"});
  return rs;
}

}  // namespace

XPV_BENCH_SUITE("net", "iperf3 through xpv-netback and a process domain (xpv up + xpv create) vs a veth pair", run_net);
