// xpv-netback end to end, every component real and run as the user runs them: `xpv up` (the real
// xpv-xenstored, the supervisor, xpv-blkback and xpv-netback), `xpv create` with a vif (the real
// xpv-front with its VifDriver, the namespace xpv-dom<N>), network-attach/detach, destroy, down.
//
// Isolation: the whole "host" is a network namespace the test makes (`hostns`): every `xpv`
// command runs in it (nsenter), so the daemons it starts, the host TAPs vif<N>.<devid> and their
// addresses live there and nowhere else; the domains' namespaces are made by the toolstack under
// the test's temporary directory (--netns-dir). Teardown: `xpv down --force`, SIGKILL of anything
// still naming the directory, every mount under it detached, the host namespace removed — also
// when a test fails. Every wait and transfer is bounded in time.
//
// Needs root, /dev/net/tun, nsenter and ping; skips otherwise.
#include <arpa/inet.h>
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "../toolstack/harness.h"
#include "xpv/domain/domain.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/frontends/netfront.h"
#include "xpv/netback/netns.h"
#include "xpv/netback/queue.h"
#include "xpv/netback/tap.h"
#include "xpv/ring/netif.h"
#include "xpv/ring/shared_ring.h"
#include "xpv/toolstack/process.h"
#include "xpv/xenbus/client/sync_client.h"
#include "netback_rig.h"

namespace xpv {
namespace {

using namespace test::netrig;  // fs, asio, kBin, sh, eventually, run_command, slurp, the rig
using ring::NetifExtraInfo;
using ring::NetifRxResponse;
using ring::RingIdx;
using RxShadowFile = netback::RxShadow;

// FNV-1a over a byte stream: the payload checksum both ends compute.
struct Fnv {
  std::uint64_t h = 1469598103934665603ull;
  void add(const std::uint8_t* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
};

sockaddr_in addr(const std::string& ip, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

UniqueFd tcp_socket(const std::string& netns) {
  UniqueFd fd;
  netback::in_netns(netns, [&] { fd = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)); });
  timeval tv{0, 200'000};  // every blocking call returns within 200 ms: loops check their deadline
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

struct TransferResult {
  std::uint64_t sent = 0, received = 0, sent_hash = 0, received_hash = 0;
  bool ok = false;
};

// Sends `bytes` of seeded pseudo-random data from a socket in client_ns to a server listening in
// server_ns on server_ip; both ends hash the stream. Gives up at `limit` or when `abort` is set.
TransferResult tcp_transfer(const std::string& server_ns, const std::string& server_ip, const std::string& client_ns,
                            std::uint64_t bytes, std::uint32_t seed, std::chrono::seconds limit = 30s,
                            const std::atomic<bool>* abort = nullptr) {
  TransferResult res;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto give_up = [&] { return std::chrono::steady_clock::now() > deadline || (abort && abort->load()); };
  UniqueFd ls = tcp_socket(server_ns);
  int one = 1;
  ::setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = addr(server_ip, 0);
  if (::bind(ls.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls.get(), 1) != 0) return res;
  socklen_t alen = sizeof a;
  ::getsockname(ls.get(), reinterpret_cast<sockaddr*>(&a), &alen);
  auto server = std::async(std::launch::async, [&] {
    UniqueFd c;
    while (!c && !give_up()) {
      pollfd p{ls.get(), POLLIN, 0};
      if (::poll(&p, 1, 200) == 1) c = UniqueFd(::accept4(ls.get(), nullptr, nullptr, SOCK_CLOEXEC));
    }
    if (!c) return false;
    timeval tv{0, 200'000};
    ::setsockopt(c.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    Fnv f;
    std::vector<std::uint8_t> buf(1 << 16);
    for (;;) {
      const ssize_t n = ::read(c.get(), buf.data(), buf.size());
      if (n < 0) {
        if ((errno == EAGAIN || errno == EINTR) && !give_up()) continue;
        return false;
      }
      if (n == 0) break;
      f.add(buf.data(), static_cast<std::size_t>(n));
      res.received += static_cast<std::uint64_t>(n);
    }
    res.received_hash = f.h;
    return true;
  });
  UniqueFd c = tcp_socket(client_ns);
  bool sent_ok = false;
  for (int i = 0; i < 50 && !sent_ok && !give_up(); ++i) {
    // A connect that timed out (SO_SNDTIMEO) goes on in the background: EALREADY, then EISCONN.
    sent_ok = ::connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 || errno == EISCONN;
    if (!sent_ok && errno != EINPROGRESS && errno != EALREADY && errno != EAGAIN) break;
    if (!sent_ok) std::this_thread::sleep_for(20ms);
  }
  Fnv f;
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> buf(1 << 16);
  while (sent_ok && res.sent < bytes) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), bytes - res.sent));
    for (std::size_t i = 0; i < n; ++i) buf[i] = static_cast<std::uint8_t>(rng());
    std::size_t off = 0;
    while (off < n) {
      // A reset connection (the receiver gave up) is EPIPE, never a SIGPIPE that kills the test.
      const ssize_t w = ::send(c.get(), buf.data() + off, n - off, MSG_NOSIGNAL);
      if (w <= 0) {
        if (w < 0 && (errno == EAGAIN || errno == EINTR) && !give_up()) continue;
        sent_ok = false;
        break;
      }
      off += static_cast<std::size_t>(w);
    }
    f.add(buf.data(), off);
    res.sent += off;
  }
  res.sent_hash = f.h;
  ::shutdown(c.get(), SHUT_WR);
  const bool recv_ok = server.get();
  res.ok = sent_ok && recv_ok;
  return res;
}

class NetbackDaemon : public ::testing::Test, protected test::netrig::NetbackRig {
 protected:
  void SetUp() override {
    if (const std::string why = missing(); !why.empty()) GTEST_SKIP() << why;
    setup();
  }
  void TearDown() override { teardown(HasFailure()); }

  // SIGSTOP, and wait until the process is stopped (state T): it then sees nothing that follows.
  void stop_process(pid_t pid) {
    ASSERT_EQ(::kill(pid, SIGSTOP), 0);
    const auto stopped = [&] {
      const std::string stat = slurp(fmt::format("/proc/{}/stat", pid));
      const auto paren = stat.rfind(')');
      return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
    };
    ASSERT_TRUE(eventually(stopped, 5s)) << "process " << pid << " did not stop";
  }

  using Nodes = std::vector<std::pair<std::string, std::string>>;
  // guest_ becomes domain `domid` with one in-process netfront (split channels) whose NIC is eth0
  // in the namespace file returned (dir_/<name>ns).
  std::string make_netfront_guest(std::uint16_t domid, const std::string& name) {
    make_guest(domid, name);
    const std::string ns = dir_ + "/" + name + "ns";
    netback::create_netns(ns);
    guest_->tap = netback::Tap::create({"eth0", ns, 1, {true, true, true}});
    guest_->front = std::make_unique<frontends::Netfront>(*guest_->dom, *guest_->events, guest_->tap.fd(),
                                                          frontends::NetfrontConfig{});
    return ns;
  }
  // The nodes of vif <domid>/0 for that netfront, both ends, without either `state`: what the
  // test writes as its toolstack and as the guest's xenbus driver.
  Nodes netfront_vif_nodes(std::uint16_t domid, const std::string& mac) const {
    const std::string be = fmt::format("/local/domain/0/backend/vif/{}/0", domid);
    const std::string fe = fmt::format("/local/domain/{}/device/vif/0", domid);
    const auto& f = *guest_->front;
    return {{fe + "/backend", be}, {fe + "/backend-id", "0"}, {fe + "/handle", "0"}, {fe + "/mac", mac},
            {fe + "/tx-ring-ref", std::to_string(f.tx_ring_ref())}, {fe + "/rx-ring-ref", std::to_string(f.rx_ring_ref())},
            {fe + "/event-channel-tx", std::to_string(f.tx_port())}, {fe + "/event-channel-rx", std::to_string(f.rx_port())},
            {fe + "/request-rx-copy", "1"}, {fe + "/feature-rx-notify", "1"}, {fe + "/feature-sg", "1"},
            {be + "/frontend", fe}, {be + "/frontend-id", std::to_string(domid)}, {be + "/online", "1"},
            {be + "/handle", "0"}, {be + "/mac", mac}};
  }
  // Writes those nodes and then `extra` (the states, the nodes a test varies), in that order.
  void write_netfront_vif(xenbus::client::SyncClient& xs, std::uint16_t domid, const std::string& mac,
                          const Nodes& extra) const {
    Nodes nodes = netfront_vif_nodes(domid, mac);
    nodes.insert(nodes.end(), extra.begin(), extra.end());
    for (const auto& [p, v] : nodes) ASSERT_TRUE(xs.write(p, v)) << p;
  }
};

// ---- the data path through the daemon ---------------------------------------------------------

class NetbackPath : public NetbackDaemon, public ::testing::WithParamInterface<unsigned> {};

TEST_P(NetbackPath, PingAndChecksummedTcpBothWays) {
  const unsigned mtu = GetParam();
  ASSERT_NO_FATAL_FAILURE(up());
  // MTU 9000 with 2 vcpus: two netif queues (one thread each on both sides).
  const unsigned vcpus = mtu == 9000 ? 2 : 1;
  const std::string out = create(fmt::format("mac=00:16:3e:00:10:01, ip={}.2/24, mtu={}", net_, mtu), vcpus);
  ASSERT_FALSE(HasFailure());
  EXPECT_NE(out.find(fmt::format("vif 0: host side vif1.0 {}.1/24, domain {}.2/24 in network namespace {}", net_, net_,
                                 domns(1))),
            std::string::npos)
      << out;
  EXPECT_EQ(node("/local/domain/0/backend/vif/1/0/state"), "4");
  EXPECT_EQ(node("/local/domain/1/device/vif/0/state"), "4");
  EXPECT_EQ(node("/local/domain/1/device/vif/0/request-rx-copy"), "1");
  EXPECT_EQ(node("/local/domain/0/backend/vif/1/0/feature-rx-copy"), "1");
  if (vcpus == 2) {
    EXPECT_EQ(node("/local/domain/1/device/vif/0/multi-queue-num-queues"), "2");
    EXPECT_TRUE(node("/local/domain/1/device/vif/0/queue-1/tx-ring-ref").has_value());
  }
  // The domain's NIC: eth0 with the vif's MAC, MTU and address, in xpv-dom1.
  EXPECT_EQ(in(domns(1), fmt::format("ip link show eth0 | grep -q 'mtu {} '", mtu)), 0);
  EXPECT_EQ(in(domns(1), "ip link show eth0 | grep -q 00:16:3e:00:10:01"), 0);
  EXPECT_EQ(in(domns(1), fmt::format("ip -4 addr show eth0 | grep -q '{}.2/24'", net_)), 0);
  EXPECT_EQ(in(hostns_, fmt::format("ip -4 addr show vif1.0 | grep -q '{}.1/24'", net_)), 0);

  const unsigned size = mtu - 28;  // a full-MTU echo, unfragmented
  EXPECT_TRUE(ping(hostns_, net_ + ".2", size));
  EXPECT_TRUE(ping(domns(1), net_ + ".1", size));
  const std::uint64_t bytes = 32ull << 20;
  auto to_dom = tcp_transfer(domns(1), net_ + ".2", hostns_, bytes, 1);
  ASSERT_TRUE(to_dom.ok);
  EXPECT_EQ(to_dom.received, bytes);
  EXPECT_EQ(to_dom.received_hash, to_dom.sent_hash);
  auto to_host = tcp_transfer(hostns_, net_ + ".1", domns(1), bytes, 2);
  ASSERT_TRUE(to_host.ok);
  EXPECT_EQ(to_host.received, bytes);
  EXPECT_EQ(to_host.received_hash, to_host.sent_hash);

  // `xpv top`: the vif's counters as xpv-netback publishes them (RUN/stats/vif1.0, rewritten every
  // second), from the guest's side: it received one transfer and sent the other.
  nlohmann::json vif;
  for (int i = 0; i < 40; ++i) {  // bounded: 40 × (0.2 s + the command)
    auto t = xpv({"top", "--json", "-i", "1", "-d", "0.2"});
    ASSERT_EQ(t.rc, 0) << t.err;
    const auto j = nlohmann::json::parse(t.out);
    ASSERT_EQ(j.at("domains").size(), 1u) << t.out;
    ASSERT_EQ(j.at("domains").at(0).at("vifs").size(), 1u) << t.out;
    vif = j.at("domains").at(0).at("vifs").at(0);
    const auto& c = vif.at("counters");
    if (c.value("tx_bytes", 0ull) >= bytes && c.value("rx_bytes", 0ull) >= bytes) break;
  }
  EXPECT_EQ(vif.value("name", ""), "vif1.0");
  EXPECT_TRUE(vif.value("published", false)) << vif.dump();
  const auto& vc = vif.at("counters");
  EXPECT_GE(vc.value("tx_bytes", 0ull), bytes) << vif.dump();
  EXPECT_GE(vc.value("rx_bytes", 0ull), bytes) << vif.dump();
  EXPECT_EQ(vc.value("queues", 0ull), vcpus) << vif.dump();
  EXPECT_EQ(vc.value("tx_errors", 1ull), 0u) << vif.dump();
  EXPECT_EQ(vc.value("rx_errors", 1ull), 0u) << vif.dump();
  // The table: one vif, its KiB both ways.
  auto table = xpv({"top", "-b", "-i", "1", "-d", "0.2"});
  ASSERT_EQ(table.rc, 0) << table.err;
  EXPECT_NE(table.out.find("NETTX(k)"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("dom0 services: xpv-blkback "), std::string::npos) << table.out;

  auto r = xpv({"destroy", "web1"});
  ASSERT_EQ(r.rc, 0) << r.err;
  // The vif's statistics file goes with its connection (at the daemon's next second).
  const fs::path stats = dir_ + "/run/stats/vif1.0";
  for (int i = 0; i < 30 && fs::exists(stats); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(fs::exists(stats));
  EXPECT_FALSE(fs::exists(domns(1))) << "the namespace goes with the domain";
  EXPECT_NE(in(hostns_, "ip link show vif1.0"), 0) << "the host TAP goes with the vif";
  EXPECT_FALSE(node("/local/domain/0/backend/vif/1").has_value());
}

INSTANTIATE_TEST_SUITE_P(Mtu, NetbackPath, ::testing::Values(1500u, 9000u));

// A vif's `queues=N` (the backend's `queues` node) caps what xpv-netback offers that vif: a
// 2-vCPU domain, which takes two queues from a daemon on two or more CPUs (NetbackPath above),
// connects one and moves data both ways through it.
TEST_F(NetbackDaemon, AVifsQueuesSettingCapsTheQueuesOfferedToIt) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "the daemon offers one queue on one CPU anyway";
  ASSERT_NO_FATAL_FAILURE(up());
  create(fmt::format("mac=00:16:3e:00:10:07, ip={}.2/24, queues=1", net_), 2);
  ASSERT_FALSE(HasFailure());
  const std::string be = "/local/domain/0/backend/vif/1/0", fe = "/local/domain/1/device/vif/0";
  EXPECT_EQ(node(be + "/queues"), "1");
  EXPECT_EQ(node(be + "/multi-queue-max-queues"), "1");
  EXPECT_EQ(node(be + "/state"), "4");
  EXPECT_TRUE(node(fe + "/tx-ring-ref").has_value()) << "one queue: its rings at the frontend's root";
  EXPECT_FALSE(node(fe + "/queue-1/tx-ring-ref").has_value());
  EXPECT_NE(log("xpv-netback.log").find("vif1.0: 1 queue(s)"), std::string::npos) << log("xpv-netback.log");
  EXPECT_NE(log("xpv-netback.log").find("up to 1 queue(s)"), std::string::npos) << log("xpv-netback.log");
  EXPECT_TRUE(ping(hostns_, net_ + ".2"));
  const std::uint64_t bytes = 8ull << 20;
  auto to_dom = tcp_transfer(domns(1), net_ + ".2", hostns_, bytes, 1);
  ASSERT_TRUE(to_dom.ok);
  EXPECT_EQ(to_dom.received_hash, to_dom.sent_hash);
  auto to_host = tcp_transfer(hostns_, net_ + ".1", domns(1), bytes, 2);
  ASSERT_TRUE(to_host.ok);
  EXPECT_EQ(to_host.received_hash, to_host.sent_hash);
  auto r = xpv({"destroy", "web1"});
  EXPECT_EQ(r.rc, 0) << r.err;
}

// A restarted daemon resumes a vif with the queues its frontend was offered, whatever its own
// limits say now: here a `queues` node written after the offer, as a daemon that did not know
// the node leaves it (the toolstack wrote it, that daemon offered two queues anyway).
TEST_F(NetbackDaemon, ARestartedDaemonKeepsTheQueuesItsPredecessorOffered) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "two queues need two CPUs";
  ASSERT_NO_FATAL_FAILURE(up());
  create(fmt::format("mac=00:16:3e:00:10:09, ip={}.2/24", net_), 2);
  ASSERT_FALSE(HasFailure());
  const std::string be = "/local/domain/0/backend/vif/1/0", fe = "/local/domain/1/device/vif/0";
  ASSERT_EQ(node(fe + "/multi-queue-num-queues"), "2");
  {
    xenbus::client::SyncClient xs(dir_ + "/xs.sock");
    ASSERT_TRUE(xs.write(be + "/queues", "1"));
  }
  const auto old = netback_pid();
  ASSERT_TRUE(old);
  ASSERT_EQ(::kill(*old, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] {
    auto p = netback_pid();
    return p && *p != *old;
  }, 15s)) << "the supervisor did not restart xpv-netback";
  ASSERT_TRUE(eventually([&] { return log("xpv-netback.log").find("vif1.0: reconnected to 2 queue(s)") != std::string::npos; },
                         15s))
      << log("xpv-netback.log");
  EXPECT_EQ(node(be + "/state"), "4");
  EXPECT_FALSE(node(be + "/error").has_value()) << *node(be + "/error");
  EXPECT_TRUE(ping(hostns_, net_ + ".2"));
  auto r = xpv({"destroy", "web1"});
  EXPECT_EQ(r.rc, 0) << r.err;
}

// A vif with `ip` lets its domain send only from that address (tx_source.h, as Xen's vif scripts'
// iptables rules): the domain takes a second address on its NIC; a ping from the vif's address
// is answered, one from the other never reaches the host, and the vif counts what it dropped.
TEST_F(NetbackDaemon, ADomainCannotSendFromAnAddressItsVifWasNotGiven) {
  ASSERT_NO_FATAL_FAILURE(up());
  create(fmt::format("mac=00:16:3e:00:10:08, ip={}.2/24", net_));
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(in(domns(1), fmt::format("ping -c 2 -i 0.2 -W 3 -I {}.2 {}.1", net_, net_)), 0);
  ASSERT_EQ(in(domns(1), fmt::format("ip addr add {}.9/24 dev eth0", net_)), 0);
  EXPECT_NE(in(domns(1), fmt::format("ping -c 2 -i 0.2 -W 1 -I {}.9 {}.1", net_, net_)), 0)
      << "the host answered a ping from an address the vif was not given";
  EXPECT_EQ(in(domns(1), fmt::format("ping -c 2 -i 0.2 -W 3 -I {}.2 {}.1", net_, net_)), 0) << "the vif still serves";
  std::uint64_t spoofed = 0;
  for (int i = 0; i < 40 && spoofed == 0; ++i) {  // bounded: 40 × (0.2 s + the command)
    auto t = xpv({"top", "--json", "-i", "1", "-d", "0.2"});
    ASSERT_EQ(t.rc, 0) << t.err;
    const auto j = nlohmann::json::parse(t.out);
    ASSERT_EQ(j.at("domains").size(), 1u) << t.out;
    spoofed = j.at("domains").at(0).at("vifs").at(0).at("counters").value("tx_spoofed", 0ull);
  }
  EXPECT_GE(spoofed, 1u);
  EXPECT_NE(log("xpv-netback.log").find("dropped: an IPv4 source other than the vif's address"), std::string::npos)
      << log("xpv-netback.log");
  auto r = xpv({"destroy", "web1"});
  EXPECT_EQ(r.rc, 0) << r.err;
}

// A `queues` node that is not 1..64 (a toolstack's, not xpv's: its config parser refuses such a
// spec) closes that vif with the reason, as a bad mtu does; nothing is made on the host.
TEST_F(NetbackDaemon, ABadQueuesNodeClosesTheVifWithTheReason) {
  ASSERT_NO_FATAL_FAILURE(up());
  constexpr std::uint16_t kDom = 202;
  const std::string gns = make_netfront_guest(kDom, "queues");
  const std::string be = "/local/domain/0/backend/vif/202/0", fe = "/local/domain/202/device/vif/0";
  xenbus::client::SyncClient xs(dir_ + "/xs.sock");
  ASSERT_NO_FATAL_FAILURE(write_netfront_vif(xs, kDom, "00:16:3e:00:60:02",
                                             {{be + "/ip", net_ + ".2/24"}, {be + "/queues", "0"}, {fe + "/state", "1"}, {be + "/state", "1"}}));
  ASSERT_TRUE(eventually([&] { return node(be + "/state") == "6"; })) << log("xpv-netback.log");
  EXPECT_EQ(node(be + "/error"), "22 queues '0': expected 1..64");
  EXPECT_FALSE(node(be + "/multi-queue-max-queues").has_value()) << "nothing offered";
  EXPECT_NE(in(hostns_, "ip link show vif202.0"), 0);
  ASSERT_TRUE(xs.rm(be));
  ASSERT_TRUE(xs.rm(fe));
  EXPECT_TRUE(eventually([&] { return log("xpv-netback.log").find("vif202.0: backend directory removed") != std::string::npos; }));
  guest_.reset();
  netback::remove_netns(gns);
}

TEST_F(NetbackDaemon, DetachAndReattachWhileIdle) {
  ASSERT_NO_FATAL_FAILURE(up());
  create(fmt::format("mac=00:16:3e:00:20:01, ip={}.2/24", net_));
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(ping(hostns_, net_ + ".2"));

  auto r = xpv({"network-detach", "web1", "0"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(r.out, "vif 0 detached from web1 (id 1)\n");
  EXPECT_TRUE(r.err.empty()) << r.err;  // closed in time, no grant left mapped
  EXPECT_FALSE(node("/local/domain/0/backend/vif/1/0").has_value());
  EXPECT_FALSE(node("/local/domain/1/device/vif/0").has_value());
  EXPECT_TRUE(eventually([&] { return in(domns(1), "ip link show eth0") != 0; })) << "eth0 left the namespace";
  EXPECT_TRUE(eventually([&] { return in(hostns_, "ip link show vif1.0") != 0; })) << "vif1.0 is gone";
  EXPECT_EQ(log("xpv-front-web1.log").find("leaked"), std::string::npos) << "every grant was ended";

  r = xpv({"network-attach", "web1", fmt::format("mac=00:16:3e:00:20:01, ip={}.2/24", net_)});
  ASSERT_EQ(r.rc, 0) << r.out << r.err << log("xpv-netback.log");
  EXPECT_EQ(r.out, fmt::format("vif 0: mac 00:16:3e:00:20:01, host side vif1.0 {}.1/24, domain eth0 {}.2/24 in {}\n",
                               net_, net_, domns(1)));
  EXPECT_EQ(node("/local/domain/1/device/vif/0/state"), "4");
  EXPECT_TRUE(ping(hostns_, net_ + ".2"));
  auto t = tcp_transfer(domns(1), net_ + ".2", hostns_, 4 << 20, 3);
  ASSERT_TRUE(t.ok);
  EXPECT_EQ(t.received_hash, t.sent_hash);
}

// ---- bridge mode ----------------------------------------------------------------------------------

// `bridge=NAME`, as Xen's vif-bridge: the host side is a port of an existing bridge with no address
// of its own, so domains on one bridge meet each other and the host's address on the bridge.
TEST_F(NetbackDaemon, BridgedVifsArePortsOfTheirBridgeAndMeetThere) {
  ASSERT_NO_FATAL_FAILURE(up());
  if (in(hostns_, "ip link add xpvbr0 type bridge") != 0) GTEST_SKIP() << "no bridge support in this kernel";
  ASSERT_EQ(in(hostns_, fmt::format("ip addr add {}.1/24 dev xpvbr0", net_)), 0);
  ASSERT_EQ(in(hostns_, "ip link set xpvbr0 mtu 9000 up"), 0);
  auto create_named = [&](const std::string& name, const std::string& vif) {
    const std::string cfg = dir_ + "/" + name + ".cfg";
    std::ofstream(cfg) << fmt::format("name = \"{}\"\ntype = \"process\"\nmemory = 64\nvif = [ '{}' ]\n", name, vif);
    return xpv({"create", cfg});
  };

  // A bridge that is not there, or not a bridge, is refused before anything is made.
  ASSERT_EQ(in(hostns_, "ip tuntap add dev xpvtun0 mode tap"), 0);
  for (const char* bad : {"nosuchbr", "xpvtun0"}) {
    auto r = create_named("bad", fmt::format("bridge={}, ip={}.9/24", bad, net_));
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(r.err.find("bad.cfg: vif 0: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(bad), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(domns(1))) << r.err;
    EXPECT_FALSE(node("/local/domain/1").has_value());
  }

  auto r = create_named("web1", fmt::format("mac=00:16:3e:00:40:01, bridge=xpvbr0, ip={}.2/24", net_));
  ASSERT_EQ(r.rc, 0) << r.out << r.err << log("xpv-netback.log");
  EXPECT_NE(r.out.find(fmt::format("vif 0: host side vif1.0 in bridge xpvbr0, domain {}.2/24 in network namespace {}",
                                   net_, domns(1))),
            std::string::npos)
      << r.out;
  EXPECT_EQ(node("/local/domain/0/backend/vif/1/0/bridge"), "xpvbr0");
  // No mtu given: the bridge's, as Xen's vif-bridge (a 1500 port would pull the bridge down).
  EXPECT_EQ(node("/local/domain/0/backend/vif/1/0/mtu"), "9000");
  EXPECT_EQ(in(hostns_, "ip -o link show vif1.0 | grep -q ' mtu 9000 '"), 0);
  EXPECT_EQ(in(domns(1), "ip -o link show eth0 | grep -q ' mtu 9000 '"), 0);
  EXPECT_EQ(node("/local/domain/0/backend/vif/1/0/state"), "4");
  const std::string port1 = "ip -o link show vif1.0 | grep -q ' master xpvbr0 .*link/ether fe:ff:ff:ff:ff:ff '";
  EXPECT_EQ(in(hostns_, port1), 0);
  EXPECT_NE(in(hostns_, "ip -4 -o addr show dev vif1.0 | grep -q inet"), 0) << "a bridge port has no address";
  EXPECT_TRUE(ping(hostns_, net_ + ".2"));
  EXPECT_TRUE(ping(domns(1), net_ + ".1"));

  // A second domain on the same bridge: the two meet directly, host not routing.
  // xl's script=vif-bridge names the same mode.
  r = create_named("web2", fmt::format("mac=00:16:3e:00:40:02, script=vif-bridge, bridge=xpvbr0, ip={}.3/24", net_));
  ASSERT_EQ(r.rc, 0) << r.out << r.err << log("xpv-netback.log");
  r = xpv({"network-list", "web2"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find(fmt::format(" vif2.0     xpvbr0          {}.3/24\n", net_)), std::string::npos) << r.out;
  EXPECT_TRUE(ping(domns(1), net_ + ".3"));
  auto across = tcp_transfer(domns(2), net_ + ".3", domns(1), 16 << 20, 7);
  ASSERT_TRUE(across.ok);
  EXPECT_EQ(across.received, 16u << 20);
  EXPECT_EQ(across.received_hash, across.sent_hash);
  // An address a bridged vif already has is refused, and so is a routed subnet holding it.
  r = xpv({"network-attach", "web2", fmt::format("bridge=xpvbr0, ip={}.2/24", net_)});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find(fmt::format("address {}.2/24 is already web1 (id 1) vif 0's", net_)), std::string::npos) << r.err;
  EXPECT_FALSE(node("/local/domain/0/backend/vif/2/1").has_value());

  // xpv-netback killed: the new one makes both TAPs ports of the bridge again.
  const auto old = netback_pid();
  ASSERT_TRUE(old);
  ASSERT_EQ(::kill(*old, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] {
    const std::string l = log("xpv-netback.log");
    return l.find("vif1.0: reconnected") != std::string::npos && l.find("vif2.0: reconnected") != std::string::npos;
  }, 20s)) << log("xpv-netback.log");
  EXPECT_EQ(in(hostns_, port1), 0);
  EXPECT_EQ(in(hostns_, "ip -o link show vif2.0 | grep -q ' master xpvbr0 '"), 0);
  EXPECT_TRUE(ping(domns(1), net_ + ".3"));
  EXPECT_TRUE(ping(hostns_, net_ + ".2"));

  // Nodes that name a bridge that is not there, written past the toolstack: xpv-netback says so in
  // the vif's error node and closes it, as for any bad node.
  {
    const std::string be = "/local/domain/0/backend/vif/2/9";
    xenbus::client::SyncClient xs(dir_ + "/xs.sock");
    for (auto [p, v] : std::vector<std::pair<std::string, std::string>>{
             {be + "/frontend", "/local/domain/2/device/vif/9"}, {be + "/frontend-id", "2"}, {be + "/online", "1"},
             {be + "/handle", "9"}, {be + "/mac", "00:16:3e:00:40:09"}, {be + "/bridge", "nosuchbr"},
             {be + "/state", "1"}}) {
      ASSERT_TRUE(xs.write(p, v)) << p;
    }
    ASSERT_TRUE(eventually([&] { return node(be + "/state") == "6"; })) << log("xpv-netback.log");
    EXPECT_EQ(node(be + "/error"), "19 bridge 'nosuchbr' does not exist (make it first, e.g. ip link add nosuchbr type bridge)");
    ASSERT_TRUE(xs.rm(be));
    // libxl writes a bridge beside script vif-route too: that vif is routed, the bridge not looked for.
    const std::string routed = "/local/domain/0/backend/vif/2/8";
    for (auto [p, v] : std::vector<std::pair<std::string, std::string>>{
             {routed + "/frontend", "/local/domain/2/device/vif/8"}, {routed + "/frontend-id", "2"},
             {routed + "/online", "1"}, {routed + "/handle", "8"}, {routed + "/mac", "00:16:3e:00:40:08"},
             {routed + "/bridge", "nosuchbr"}, {routed + "/script", "/etc/xen/scripts/vif-route"}, {routed + "/state", "1"}}) {
      ASSERT_TRUE(xs.write(p, v)) << p;
    }
    // (Offered, InitWait; with no frontend there it is closed again, with no error.)
    ASSERT_TRUE(eventually([&] { return log("xpv-netback.log").find("vif2.8: backend state InitWait") != std::string::npos; }))
        << log("xpv-netback.log");
    EXPECT_FALSE(node(routed + "/error").has_value());
    ASSERT_TRUE(xs.rm(routed));
  }

  // Destroying a domain takes its port away and leaves the bridge and the other domain.
  r = xpv({"destroy", "web1"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(in(hostns_, "ip link show vif1.0"), 0);
  EXPECT_EQ(in(hostns_, "ip link show xpvbr0"), 0);
  EXPECT_TRUE(ping(hostns_, net_ + ".3"));
}

// ---- restart ------------------------------------------------------------------------------------

TEST_F(NetbackDaemon, KillNineDuringATransferThenTheVifReconnects) {
  ASSERT_NO_FATAL_FAILURE(up());
  create(fmt::format("mac=00:16:3e:00:30:01, ip={}.2/24", net_));
  ASSERT_FALSE(HasFailure());
  const auto front_pid = toolstack::read_pid_file(dir_ + "/run/dom1/pid");
  ASSERT_TRUE(front_pid);
  const auto old = netback_pid();
  ASSERT_TRUE(old);

  // Every write to the backend's `state` fires this watch (plus once at registration).
  xenbus::client::SyncClient watcher(dir_ + "/xs.sock");
  std::atomic<int> state_events{0};
  ASSERT_TRUE(watcher.watch("/local/domain/0/backend/vif/1/0/state", "st",
                            [&](const std::string&, const std::string&) { ++state_events; }));
  ASSERT_TRUE(eventually([&] { return state_events.load() == 1; }));

  // A transfer host → domain in flight...
  std::atomic<bool> abort{false};
  std::atomic<std::uint64_t> moved{0};
  auto running = std::async(std::launch::async, [&] {
    return tcp_transfer(domns(1), net_ + ".2", hostns_, 1ull << 40, 4, 60s, &abort);
  });
  // The host side's MAC is the vif's own, not the TAP's of the moment (connection.h).
  const std::string same_mac = "ip -o link show vif1.0 | grep -q 'link/ether fe:ff:00:01:00:00 '";
  EXPECT_EQ(in(hostns_, same_mac), 0);
  const std::string counters = fmt::format("ip -s link show vif1.0 | awk 'NR==6{{exit !($1 > 8000000)}}'");
  ASSERT_TRUE(eventually([&] { return in(hostns_, counters) == 0; }, 20s)) << "no traffic through vif1.0";
  // ...when xpv-netback is killed. The supervisor starts a new one.
  ASSERT_EQ(::kill(*old, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] {
    auto p = netback_pid();
    return p && *p != *old;
  }, 15s)) << "the supervisor did not restart xpv-netback";
  ASSERT_TRUE(eventually([&] { return log("xpv-netback.log").find("vif1.0: reconnected") != std::string::npos; }, 15s))
      << log("xpv-netback.log");
  abort = true;
  (void)running.get();  // it may or may not have survived; only what follows is asserted
  (void)moved;

  // The domain was not recreated, neither end's state moved, and the vif carries traffic again.
  EXPECT_TRUE(toolstack::process_is(*front_pid, "xpv-front"));
  EXPECT_EQ(node("/local/domain/0/backend/vif/1/0/state"), "4");
  EXPECT_EQ(node("/local/domain/1/device/vif/0/state"), "4");
  EXPECT_EQ(state_events.load(), 1) << "the backend's state was written during the restart";
  // The new TAP has the old one's MAC: the domain's neighbour entry for the host stays true.
  EXPECT_EQ(in(hostns_, same_mac), 0);
  EXPECT_TRUE(ping(domns(1), net_ + ".1"));
  const bool pinged = ping(hostns_, net_ + ".2");
  EXPECT_TRUE(pinged);
  if (!pinged) {
    // For whoever reads a failed run: the vif's counters as netback publishes them, and both
    // ends' links and neighbours.
    for (const auto& e : fs::directory_iterator(dir_ + "/run/stats")) {
      std::cerr << "---- " << e.path().string() << " ----\n" << slurp(e.path().string()) << "\n";
    }
    for (const auto& [ns, link] : {std::pair{hostns_, "vif1.0"}, std::pair{domns(1), "eth0"}}) {
      // Not in(): it sends the command's output to /dev/null.
      (void)std::system(fmt::format("nsenter --net={} sh -c 'ip -s link show {}; ip neigh' >&2", ns, link).c_str());
    }
  }
  auto t = tcp_transfer(domns(1), net_ + ".2", hostns_, 16 << 20, 5);
  ASSERT_TRUE(t.ok);
  EXPECT_EQ(t.received, 16u << 20);
  EXPECT_EQ(t.received_hash, t.sent_hash);
  auto back = tcp_transfer(hostns_, net_ + ".1", domns(1), 16 << 20, 6);
  ASSERT_TRUE(back.ok);
  EXPECT_EQ(back.received_hash, back.sent_hash);
}

// A kill -9 in the middle of an rx turn leaves the responses it wrote in their slots, unpublished
// (the test plays that part, with the daemon stopped, then kills it):
// for a GSO packet, the data response at its first slot (it repeats the request's id) and the
// extra-info response after it (it has no id: its type and flags are where the request's id was).
// The restarted daemon gives every buffer back with an error and the frontend's id, taken from the
// rx shadow its predecessor kept (run/netback/vif<N>.<devid>-q<k>.rxids). Where the shadow has no
// copy (a predecessor without one), the torn slot's id is not the frontend's: the frontend posts
// that buffer again all the same (it finds buffers by ring position, as Linux's netfront). Found as
// a rare failure of the test above: xpv-front disabled its netfront at such an id, and the vif was
// dead after the reconnect.
TEST_F(NetbackDaemon, ARestartedDaemonGivesBackBuffersWhoseSlotsItsPredecessorTore) {
  ASSERT_NO_FATAL_FAILURE(up());
  constexpr std::uint16_t kDom = 202;
  const std::string gns = make_netfront_guest(kDom, "torn");
  const std::string be = "/local/domain/0/backend/vif/202/0", fe = "/local/domain/202/device/vif/0";
  {
    xenbus::client::SyncClient xs(dir_ + "/xs.sock");
    ASSERT_NO_FATAL_FAILURE(write_netfront_vif(xs, kDom, "00:16:3e:00:70:01",
                                               {{be + "/ip", net_ + ".2/24"}, {fe + "/state", "3"}, {be + "/state", "1"}}));
  }
  ASSERT_TRUE(eventually([&] { return node(be + "/state") == "4"; })) << log("xpv-netback.log");
  guest_->front->start();
  ASSERT_EQ(in(gns, fmt::format("ip addr add {}.2/24 dev eth0", net_)), 0);
  ASSERT_EQ(in(gns, "ip link set eth0 address 00:16:3e:00:70:01 up"), 0);
  ASSERT_TRUE(ping(hostns_, net_ + ".2"));
  const std::string shadow_path = dir_ + "/run/netback/vif202.0-q0.rxids";
  ASSERT_TRUE(fs::exists(shadow_path));

  // The daemon is stopped (SIGSTOP: what it took stays as it is, and its supervisor waits)...
  const auto old = netback_pid();
  ASSERT_TRUE(old);
  ASSERT_NO_FATAL_FAILURE(stop_process(*old));
  // ...with the rx ring full of posted buffers (the frontend posts again what the last responses
  // gave back), some of them taken: it holds buffers ahead of packets.
  auto page = guest_->front->rx_ring_page_for_testing();
  const auto ring_index = [&](std::size_t at) {
    return std::atomic_ref<RingIdx>(*reinterpret_cast<RingIdx*>(page.data() + at)).load();
  };
  ASSERT_TRUE(eventually([&] { return ring_index(0) - ring_index(8) == 256u; }, 5s))
      << "the rx ring is not full of posted buffers: req_prod " << ring_index(0) << ", rsp_prod " << ring_index(8);
  const RingIdx rsp_prod = ring_index(8);
  auto slot = [&](RingIdx i) { return page.data() + ring::kRingEntriesOffset + (i & 255) * sizeof(NetifRxResponse); };
  {
    auto shadow = RxShadowFile::open(shadow_path, 256);
    ASSERT_TRUE(shadow.reused());
    for (RingIdx i = rsp_prod; i < rsp_prod + 2; ++i) {
      ring::NetifRxRequest posted{};
      std::memcpy(&posted, slot(i), sizeof posted);
      const auto taken = shadow.get(i);
      ASSERT_TRUE(taken.has_value()) << "the stopped daemon kept no copy of the buffer it took at " << i;
      EXPECT_EQ(taken->id, posted.id);
      EXPECT_EQ(taken->gref, posted.gref);
    }
    EXPECT_FALSE(shadow.get(rsp_prod + 200).has_value());
  }
  NetifExtraInfo gso{};
  gso.type = ring::kXenNetifExtraTypeGso;
  gso.u.gso.size = 1448;
  gso.u.gso.type = ring::kXenNetifGsoTypeTcpv4;
  const NetifRxResponse extra = ring::netif_extra_to_rx(gso);
  for (RingIdx at : {rsp_prod, rsp_prod + 200}) {
    NetifRxResponse first{};
    first.id = static_cast<std::uint16_t>(at & 255);
    first.flags = ring::kNetrxfExtraInfo | ring::kNetrxfMoreData | ring::kNetrxfCsumBlank;
    first.status = 4096;
    std::memcpy(slot(at), &first, sizeof first);
    std::memcpy(slot(at + 1), &extra, sizeof extra);
    ASSERT_NE(extra.id, static_cast<std::uint16_t>((at + 1) & 255)) << "the torn slot would keep the id";
  }
  // Then it dies, and its supervisor starts another.
  ASSERT_EQ(::kill(*old, SIGKILL), 0);

  ASSERT_TRUE(eventually([&] { return log("xpv-netback.log").find("vif202.0: reconnected") != std::string::npos; }, 15s))
      << log("xpv-netback.log");
  EXPECT_NE(log("xpv-netback.log").find("256 unanswered; their ids from the rx shadow"), std::string::npos)
      << log("xpv-netback.log");
  // Every buffer came back and was posted again: the host reaches the guest, the guest the host.
  EXPECT_TRUE(ping(hostns_, net_ + ".2"));
  EXPECT_TRUE(ping(gns, net_ + ".1"));
  EXPECT_FALSE(guest_->front->broken());
  EXPECT_GE(guest_->front->stats().rx_errors.load(), 256u) << "the buffers came back as errors";
  EXPECT_EQ(guest_->front->stats().rx_foreign_ids.load(), 1u)
      << "only the second packet's extra-info slot, of which the shadow had no copy, lost its id";

  // The vif closes for good: its shadow goes.
  xenbus::client::SyncClient xs(dir_ + "/xs.sock");
  ASSERT_TRUE(xs.rm(be));
  ASSERT_TRUE(xs.rm(fe));
  EXPECT_TRUE(eventually([&] { return log("xpv-netback.log").find("vif202.0: backend directory removed") != std::string::npos; }));
  EXPECT_TRUE(eventually([&] { return !fs::exists(shadow_path); })) << shadow_path;
  guest_.reset();
  netback::remove_netns(gns);
}

// Rx shadow files of vifs that went while no xpv-netback ran (their domain destroyed meanwhile)
// are removed by the next daemon once it has listed the vifs xenstore has; a vif that is there
// keeps its shadow over a restart, and files that are no rx shadow stay.
TEST_F(NetbackDaemon, AStartingDaemonRemovesTheRxShadowsOfVifsNoLongerInXenstore) {
  const std::string shadows = dir_ + "/run/netback";
  fs::create_directories(shadows);
  for (const char* f : {"/vif77.0-q0.rxids", "/vif77.0-q1.rxids", "/notes"}) std::ofstream(shadows + f) << "x";
  ASSERT_NO_FATAL_FAILURE(up());
  EXPECT_TRUE(eventually([&] { return !fs::exists(shadows + "/vif77.0-q0.rxids") && !fs::exists(shadows + "/vif77.0-q1.rxids"); }))
      << log("xpv-netback.log");
  EXPECT_NE(log("xpv-netback.log").find("netback: removed vif77.0-q0.rxids: its device is not in xenstore"), std::string::npos)
      << log("xpv-netback.log");
  EXPECT_TRUE(fs::exists(shadows + "/notes"));

  create(fmt::format("mac=00:16:3e:00:90:01, ip={}.2/24", net_));
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(fs::exists(shadows + "/vif1.0-q0.rxids"));
  const auto old = netback_pid();
  ASSERT_TRUE(old);
  ASSERT_EQ(::kill(*old, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return log("xpv-netback.log").find("vif1.0: reconnected") != std::string::npos; }, 15s))
      << log("xpv-netback.log");
  EXPECT_TRUE(fs::exists(shadows + "/vif1.0-q0.rxids")) << log("xpv-netback.log");
  EXPECT_TRUE(ping(hostns_, net_ + ".2"));
}

// A guest whose netfront starts over while xpv-netback is down (a kdump or kexec kernel resets the
// frontends it inherits: Closing, Closed, Initialising, each waited for 5 s at most, then new
// rings) leaves the restarted daemon a backend still Connected, over rings that are gone. Linux's
// netfront waits at Initialising for InitWait and would wait for ever; the daemon offers the vif
// again and connects the new rings.
TEST_F(NetbackDaemon, AFrontendThatStartedOverWhileTheDaemonWasDownIsOfferedTheVifAgain) {
  ASSERT_NO_FATAL_FAILURE(up());
  constexpr std::uint16_t kDom = 203;
  const std::string mac = "00:16:3e:00:80:01";
  const std::string gns = make_netfront_guest(kDom, "again");
  const std::string be = "/local/domain/0/backend/vif/203/0", fe = "/local/domain/203/device/vif/0";
  xenbus::client::SyncClient xs(dir_ + "/xs.sock");
  ASSERT_NO_FATAL_FAILURE(write_netfront_vif(xs, kDom, mac,
                                             {{be + "/ip", net_ + ".2/24"}, {fe + "/state", "3"}, {be + "/state", "1"}}));
  ASSERT_TRUE(eventually([&] { return node(be + "/state") == "4"; })) << log("xpv-netback.log");
  ASSERT_TRUE(xs.write(fe + "/state", "4"));
  guest_->front->start();
  ASSERT_EQ(in(gns, fmt::format("ip addr add {}.2/24 dev eth0", net_)), 0);
  ASSERT_EQ(in(gns, fmt::format("ip link set eth0 address {} up", mac)), 0);
  ASSERT_TRUE(ping(hostns_, net_ + ".2"));

  // xpv-netback stops (SIGSTOP: it sees none of what follows)...
  const auto old = netback_pid();
  ASSERT_TRUE(old);
  ASSERT_NO_FATAL_FAILURE(stop_process(*old));
  // ...and the guest's frontend is reset and probed again, with new rings.
  ASSERT_TRUE(xs.write(fe + "/state", "5"));
  ASSERT_TRUE(xs.write(fe + "/state", "6"));
  guest_->front.reset();  // its grants end
  guest_->front = std::make_unique<frontends::Netfront>(*guest_->dom, *guest_->events, guest_->tap.fd(),
                                                        frontends::NetfrontConfig{});
  for (const auto& [p, v] : netfront_vif_nodes(kDom, mac)) {
    if (p.starts_with(fe + "/")) {
      ASSERT_TRUE(xs.write(p, v)) << p;
    }
  }
  ASSERT_TRUE(xs.write(fe + "/state", "1"));
  // Then the daemon dies, and its supervisor starts another.
  ASSERT_EQ(::kill(*old, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] {
    auto p = netback_pid();
    return p && *p != *old;
  }, 15s)) << "the supervisor did not restart xpv-netback";

  ASSERT_TRUE(eventually([&] { return node(be + "/state") == "2"; }, 15s))
      << "state " << node(be + "/state").value_or("(none)") << "\n" << log("xpv-netback.log");
  EXPECT_NE(log("xpv-netback.log").find("vif203.0: the frontend started over (Initialising) while the vif was Connected"),
            std::string::npos);
  ASSERT_TRUE(xs.write(fe + "/state", "3"));
  ASSERT_TRUE(eventually([&] { return node(be + "/state") == "4"; })) << log("xpv-netback.log");
  ASSERT_TRUE(xs.write(fe + "/state", "4"));
  guest_->front->start();
  EXPECT_TRUE(ping(hostns_, net_ + ".2"));
  EXPECT_TRUE(ping(gns, net_ + ".1"));
  EXPECT_FALSE(guest_->front->broken());

  ASSERT_TRUE(xs.rm(be));
  ASSERT_TRUE(xs.rm(fe));
  EXPECT_TRUE(eventually([&] { return log("xpv-netback.log").find("vif203.0: backend directory removed") != std::string::npos; }));
  guest_.reset();
  netback::remove_netns(gns);
}

// ---- a hostile frontend -------------------------------------------------------------------------

TEST_F(NetbackDaemon, AGarbageWritingFrontendGetsOnlyItsVifDisabled) {
  ASSERT_NO_FATAL_FAILURE(up());
  create(fmt::format("mac=00:16:3e:00:40:01, ip={}.2/24", net_));
  ASSERT_FALSE(HasFailure());

  // Domain 200: a frontend in this process. The test is its toolstack and its xenbus driver.
  constexpr std::uint16_t kBad = 200;
  const std::string badns = make_netfront_guest(kBad, "hostile");
  const std::string be = "/local/domain/0/backend/vif/200/0", fe = "/local/domain/200/device/vif/0";
  {
    xenbus::client::SyncClient xs(dir_ + "/xs.sock");
    // One queue announced as Linux's netfront does: the key = 1 and the flat layout.
    ASSERT_NO_FATAL_FAILURE(write_netfront_vif(xs, kBad, "00:16:3e:00:40:02",
                                               {{fe + "/multi-queue-num-queues", "1"}, {fe + "/state", "3"}, {be + "/state", "1"}}));
  }
  ASSERT_TRUE(eventually([&] { return node(be + "/state") == "4"; })) << log("xpv-netback.log");
  guest_->front->start();
  EXPECT_EQ(in(hostns_, "ip link show vif200.0"), 0);

  // The guest turns hostile: its driver stops, it publishes a tx producer index far beyond the
  // ring and kicks the backend.
  guest_->front->stop();
  auto page = guest_->front->tx_ring_page_for_testing();
  std::atomic_ref<std::uint32_t> req_prod(*reinterpret_cast<std::uint32_t*>(page.data()));
  req_prod.store(req_prod.load() + 5000, std::memory_order_release);
  ASSERT_TRUE(guest_->dom->evtchn().send(guest_->front->tx_port()));

  // Its vif is disabled, said so in xenstore, its TAP gone...
  ASSERT_TRUE(eventually([&] { return node(be + "/state") == "5"; })) << log("xpv-netback.log");
  const auto err = node(be + "/error");
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->find("ring protocol violation; vif disabled"), std::string::npos) << *err;
  EXPECT_TRUE(eventually([&] { return in(hostns_, "ip link show vif200.0") != 0; }));
  // ...while web1's vif carries traffic both ways, and the daemon is the same process.
  EXPECT_EQ(node("/local/domain/0/backend/vif/1/0/state"), "4");
  EXPECT_TRUE(ping(hostns_, net_ + ".2"));
  auto t = tcp_transfer(hostns_, net_ + ".1", domns(1), 8 << 20, 7);
  ASSERT_TRUE(t.ok);
  EXPECT_EQ(t.received_hash, t.sent_hash);
  EXPECT_NE(log("xpv-supervise.log").find("xpv-netback started"), std::string::npos);
  EXPECT_EQ(log("xpv-supervise.log").find("died"), std::string::npos);

  // The hostile domain's nodes go (as destroy would do) before the guest does.
  xenbus::client::SyncClient xs(dir_ + "/xs.sock");
  ASSERT_TRUE(xs.rm(be));
  ASSERT_TRUE(xs.rm(fe));
  EXPECT_TRUE(eventually([&] { return log("xpv-netback.log").find("vif200.0: backend directory removed") != std::string::npos; }));
  guest_.reset();
  netback::remove_netns(badns);
}

// ---- a vif in error (ErrorHold, device_state.h) ------------------------------------------------------

// A vif whose nodes are bad (here the toolstack's `mtu`) gets the error node and Closed, and is
// held there — no new attempt while its frontend starts over without closing — until the
// frontend has closed; then, with the node mended, it is offered again and served on the same
// daemon.
TEST_F(NetbackDaemon, AVifInErrorIsHeldUntilItsFrontendClosesThenServedAgain) {
  ASSERT_NO_FATAL_FAILURE(up());
  constexpr std::uint16_t kDom = 201;
  const std::string gns = make_netfront_guest(kDom, "mended");
  const std::string be = "/local/domain/0/backend/vif/201/0", fe = "/local/domain/201/device/vif/0";
  xenbus::client::SyncClient xs(dir_ + "/xs.sock");
  // The frontend's state before the backend's: the daemon adopts the vif at its `state`.
  ASSERT_NO_FATAL_FAILURE(write_netfront_vif(xs, kDom, "00:16:3e:00:60:01",
                                             {{be + "/ip", net_ + ".2/24"}, {be + "/mtu", "12"}, {fe + "/state", "1"}, {be + "/state", "1"}}));
  // Refused, said so, Closed; nothing made on the host.
  ASSERT_TRUE(eventually([&] { return node(be + "/state") == "6"; })) << log("xpv-netback.log");
  EXPECT_EQ(node(be + "/error"), "22 mtu '12': expected 68..65535");
  EXPECT_NE(in(hostns_, "ip link show vif201.0"), 0);
  const auto refusals = [&] {
    const std::string l = log("xpv-netback.log");
    std::size_t n = 0;
    for (auto at = l.find("vif201.0: mtu '12'"); at != std::string::npos; at = l.find("vif201.0: mtu '12'", at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(refusals(), 1u) << log("xpv-netback.log");

  // The frontend starts over without closing (Initialising, Initialised): held, not probed again.
  ASSERT_TRUE(xs.write(fe + "/state", "3"));
  ASSERT_TRUE(xs.write(fe + "/state", "1"));
  // (The watch events reach the daemon within milliseconds; a bounded look of 1 s for a change.)
  EXPECT_FALSE(eventually([&] { return node(be + "/state") != "6" || refusals() != 1; }, 1s)) << log("xpv-netback.log");

  // The toolstack mends the node; the frontend closes (acknowledging the error) and starts over:
  // offered again without the old error, then connected.
  ASSERT_TRUE(xs.write(be + "/mtu", "1500"));
  ASSERT_TRUE(xs.write(fe + "/state", "5"));
  ASSERT_TRUE(xs.write(fe + "/state", "6"));
  // (Once the daemon has seen it: a close it never saw, between two of its reads, is no close.)
  ASSERT_TRUE(eventually([&] { return log("xpv-netback.log").find("vif201.0: the error is over") != std::string::npos; }))
      << log("xpv-netback.log");
  ASSERT_TRUE(xs.write(fe + "/state", "1"));
  ASSERT_TRUE(eventually([&] { return node(be + "/state") == "2"; })) << log("xpv-netback.log");
  EXPECT_FALSE(node(be + "/error").has_value()) << "the old error goes when the vif is offered again";
  ASSERT_TRUE(xs.write(fe + "/state", "3"));
  ASSERT_TRUE(eventually([&] { return node(be + "/state") == "4"; })) << log("xpv-netback.log");
  ASSERT_TRUE(xs.write(fe + "/state", "4"));
  guest_->front->start();
  // The guest's NIC takes the vif's address; the host pings it through the vif.
  ASSERT_EQ(in(gns, fmt::format("ip addr add {}.2/24 dev eth0", net_)), 0);
  ASSERT_EQ(in(gns, "ip link set eth0 address 00:16:3e:00:60:01 up"), 0);
  EXPECT_TRUE(ping(hostns_, net_ + ".2"));
  EXPECT_EQ(refusals(), 1u);

  ASSERT_TRUE(xs.rm(be));
  ASSERT_TRUE(xs.rm(fe));
  EXPECT_TRUE(eventually([&] { return log("xpv-netback.log").find("vif201.0: backend directory removed") != std::string::npos; }));
  guest_.reset();
  netback::remove_netns(gns);
}

// ---- the toolstack's errors ---------------------------------------------------------------------

TEST_F(NetbackDaemon, ToolstackRefusesBadMacsClashesAndAMissingNamespace) {
  ASSERT_NO_FATAL_FAILURE(up());
  create(fmt::format("mac=00:16:3e:00:50:01, ip={}.2/24", net_));
  ASSERT_FALSE(HasFailure());

  auto r = xpv({"network-attach", "web1", "mac=01:16:3e:00:50:02"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv network-attach: vif spec 'mac=01:16:3e:00:50:02': '01:16:3e:00:50:02' is not a unicast MAC "
                   "address (aa:bb:cc:dd:ee:ff)\n");
  r = xpv({"network-attach", "web1", "mac=00:16:3e:00:50:01"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv network-attach: vif: MAC 00:16:3e:00:50:01 is already used by web1 (id 1) vif 0\n");
  r = xpv({"network-attach", "web1", fmt::format("ip={}.77/16", net_)});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv network-attach: vif: address {}.77/16 clashes with web1 (id 1) vif 0 ({}.2/24): each "
                               "vif needs a subnet of its own\n",
                               net_, net_));
  // An address on one of the host's own interfaces.
  ASSERT_EQ(in(hostns_, "ip tuntap add dev xpvdummy0 mode tap"), 0);
  ASSERT_EQ(in(hostns_, "ip addr add 192.168.77.1/24 dev xpvdummy0"), 0);
  r = xpv({"network-attach", "web1", "ip=192.168.77.9/24"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv network-attach: vif: address 192.168.77.9/24 clashes with 192.168.77.1/24 on the host's "
                   "interface xpvdummy0\n");
  r = xpv({"network-attach", "web1", "bridge=xenbr0"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv network-attach: vif: bridge 'xenbr0' does not exist (make it first, e.g. ip link add xenbr0 "
                   "type bridge)\n");
  // The domain's namespace vanished behind the toolstack's back.
  ASSERT_TRUE(netback::remove_netns(domns(1)));
  r = xpv({"network-attach", "web1", "ip=172.31.5.2/24"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv network-attach: the network namespace {} of web1 (id 1) is missing (`xpv create` "
                               "makes it, destroy removes it); recreate the domain\n",
                               domns(1)));
  // Nothing was added by the refused commands.
  EXPECT_FALSE(node("/local/domain/0/backend/vif/1/1").has_value());
}

}  // namespace
}  // namespace xpv
