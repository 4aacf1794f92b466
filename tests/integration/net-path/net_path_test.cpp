// The whole PV network path in one test process, with every real component: a process Domain
// (memfd memory, grant table, event channels, control socket) with xpv's Netfront in it, whose
// "NIC" is a TAP inside a network namespace the test creates, and the backend side exactly as
// xpv-netback builds it — ForeignDomain over the control socket, a GrantMapper, NetbackQueue on
// the host TAP vif<N>.0. Addresses come from a private /30 on these two interfaces only; the
// namespace and both TAPs are removed in TearDown (the TAPs vanish with their fds).
//
// Needs root, /dev/net/tun, iproute2's `ip` (for addresses and the namespace) and nsenter (to
// run a command in the namespace); skips otherwise.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <random>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "xpv/domain/domain.h"
#include "xpv/domain/foreign_domain.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/frontends/netfront.h"
#include "xpv/netback/bridge.h"
#include "xpv/netback/queue.h"
#include "xpv/netback/tap.h"
#include "xpv/test/run_on.h"

namespace xpv {
namespace {

namespace asio = boost::asio;

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// Root, /dev/net/tun, iproute2's `ip` and nsenter: what every test here needs.
bool can_make_taps() {
  return ::geteuid() == 0 && ::access("/dev/net/tun", R_OK | W_OK) == 0 && sh("command -v ip") == 0 &&
         sh("command -v nsenter") == 0;
}

// The prefix that runs a command in the network namespace `ns` (/run/netns/<ns>): nsenter --net,
// which only joins the network namespace. Not `ip -n <ns>` or `ip netns exec <ns>`: iproute2
// enters a namespace with unshare(CLONE_NEWNS) (to mount that namespace's own /sys), a private
// copy of the host's whole mount table that holds every mount in it until the command exits. A
// test running beside this one (ctest -j2) that unmounts meanwhile gets 0 from umount while its
// file system stays mounted in that copy: BlkPath's ext4 over FUSE, unmounted but still not
// written back, made the image's read-only mount that follows fail ("recovery required on
// readonly filesystem").
std::string netns_cmd(const std::string& ns) { return "nsenter --net=/run/netns/" + ns + " "; }

// A network namespace made with `ip netns add` for one test, deleted with this object.
struct ScratchNetns {
  explicit ScratchNetns(std::string n) : name(std::move(n)), made(sh("ip netns add " + name) == 0) {}
  ~ScratchNetns() {
    if (made) (void)sh("ip netns del " + name);
  }
  ScratchNetns(const ScratchNetns&) = delete;
  ScratchNetns& operator=(const ScratchNetns&) = delete;
  std::string name;
  bool made;
};

// FNV-1a over a byte stream: the payload checksum both ends compute.
struct Fnv {
  std::uint64_t h = 1469598103934665603ull;
  void add(const std::uint8_t* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
};

UniqueFd tcp_socket(const std::string& netns) {
  UniqueFd fd;
  netback::in_netns(netns, [&] { fd = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)); });
  timeval tv{20, 0};  // every blocking call below is bounded in time
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

sockaddr_in addr(const std::string& ip, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

struct TransferResult {
  std::uint64_t sent = 0, received = 0, sent_hash = 0, received_hash = 0;
  bool ok = false;
};

// Sends `bytes` of seeded pseudo-random data from a socket in client_ns to a server listening in
// server_ns on server_ip; both ends hash the stream.
TransferResult tcp_transfer(const std::string& server_ns, const std::string& server_ip,
                            const std::string& client_ns, std::uint64_t bytes, std::uint32_t seed) {
  TransferResult res;
  UniqueFd ls = tcp_socket(server_ns);
  int one = 1;
  ::setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = addr(server_ip, 0);
  if (::bind(ls.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls.get(), 1) != 0) return res;
  socklen_t alen = sizeof a;
  ::getsockname(ls.get(), reinterpret_cast<sockaddr*>(&a), &alen);
  auto server = std::async(std::launch::async, [&] {
    pollfd p{ls.get(), POLLIN, 0};
    if (::poll(&p, 1, 20000) != 1) return false;
    UniqueFd c(::accept4(ls.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c) return false;
    timeval tv{20, 0};
    ::setsockopt(c.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    Fnv f;
    std::vector<std::uint8_t> buf(1 << 16);
    for (;;) {
      const ssize_t n = ::read(c.get(), buf.data(), buf.size());
      if (n < 0) return false;
      if (n == 0) break;
      f.add(buf.data(), static_cast<std::size_t>(n));
      res.received += static_cast<std::uint64_t>(n);
    }
    res.received_hash = f.h;
    return true;
  });
  UniqueFd c = tcp_socket(client_ns);
  bool sent_ok = ::connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
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

class NetPath : public ::testing::TestWithParam<unsigned> {
 protected:
  template <class F>
  auto on_io(F f) -> decltype(f()) {
    return xpv::test::run_on(io_, std::move(f));
  }

  void SetUp() override {
    if (!can_make_taps()) {
      GTEST_SKIP() << "needs root, /dev/net/tun, iproute2 and nsenter";
    }
    const int pid = static_cast<int>(::getpid());
    domid_ = static_cast<std::uint16_t>(1000 + pid % 30000);
    ns_ = "xpv-test-" + std::to_string(pid);
    netns_path_ = "/run/netns/" + ns_;
    const int net = 16 + (pid % 200);
    host_ip_ = "10.254." + std::to_string(net) + ".1";
    dom_ip_ = "10.254." + std::to_string(net) + ".2";
    vif_ = "vif" + std::to_string(domid_) + ".0";
    char tmpl[] = "/tmp/xpv-netpath-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(sh("ip netns add " + ns_), 0);
    ns_created_ = true;
  }

  void TearDown() override {
    stop_backend();
    if (front_) front_->stop();
    front_.reset();
    if (events_) events_->stop();
    if (events_thread_.joinable()) events_thread_.join();
    if (domain_) on_io([this] { domain_.reset(); });
    work_.reset();
    io_.stop();
    if (io_thread_.joinable()) io_thread_.join();
    guest_tap_ = {};
    host_tap_ = {};
    if (ns_created_) (void)sh("ip netns del " + ns_);
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  void start(unsigned mtu, netback::NetbackConfig bcfg = {}) {
    domain::DomainConfig cfg;
    cfg.domid = domid_;
    cfg.name = "pv-net-test";
    cfg.memory_bytes = 64 << 20;
    cfg.run_dir = dir_ + "/run";
    sink_ = std::make_unique<ForwardingSink>();
    domain_ = std::make_unique<domain::Domain>(io_, cfg, *sink_);
    events_ = std::make_unique<frontends::GuestEvents>(domain_->pages(domain::Domain::kSharedInfoGfn, 1));
    sink_->target = events_.get();
    io_thread_ = std::thread([this] { io_.run(); });
    events_thread_ = std::thread([this] { events_->run(); });

    // The domain's NIC: a TAP in its namespace. It may hand netfront what the backend accepts.
    guest_tap_ = netback::Tap::create({"eth0", netns_path_, 1, {true, true, true}});
    guest_tap_.set_link({mtu, netback::parse_mac("00:16:3e:00:00:02"), true});
    front_ = std::make_unique<frontends::Netfront>(*domain_, *events_, guest_tap_.fd(), frontends::NetfrontConfig{});

    // The host side: vif<N>.0, offloads as the frontend negotiated (sg, gso-tcpv4/6).
    bcfg.rx_gso = {true, true};
    host_tap_ = netback::Tap::create({vif_, "", 1, {true, true, true}});
    host_tap_.set_link({mtu, std::nullopt, true});
    foreign_ = std::make_unique<domain::ForeignDomain>(domain::ForeignDomain::connect(domid_, "netback", cfg.run_dir));
    mapper_ = foreign_->make_mapper();
    auto txm = mapper_->map(front_->tx_ring_ref(), false);
    auto rxm = mapper_->map(front_->rx_ring_ref(), false);
    ASSERT_TRUE(txm && rxm);
    auto tx = ring::NetifTxBackRing::attach(txm->writable());
    auto rx = ring::NetifRxBackRing::attach(rxm->writable());
    ASSERT_TRUE(tx && rx);
    queue_ = std::make_unique<netback::NetbackQueue>(vif_ + "-q0", *mapper_, std::move(*tx), std::move(*rx),
                                                     foreign_->bind(front_->tx_port()),
                                                     foreign_->bind(front_->rx_port()), host_tap_.fd(), bcfg);
    queue_thread_ = std::thread([this] { queue_->run(); });
    front_->start();

    ASSERT_EQ(sh("ip addr add " + host_ip_ + "/30 dev " + vif_), 0);
    ASSERT_EQ(sh(netns_cmd(ns_) + "ip addr add " + dom_ip_ + "/30 dev eth0"), 0);
    ASSERT_EQ(sh(netns_cmd(ns_) + "ip link set lo up"), 0);
  }

  void stop_backend() {
    if (queue_) queue_->stop();
    if (queue_thread_.joinable()) queue_thread_.join();
    queue_.reset();
    mapper_.reset();
    foreign_.reset();
  }

  struct ForwardingSink : domain::UpcallSink {
    void upcall(unsigned v) noexcept override {
      if (target) target->upcall(v);
    }
    frontends::GuestEvents* target = nullptr;
  };

  std::uint16_t domid_ = 0;
  std::string ns_, netns_path_, host_ip_, dom_ip_, vif_, dir_;
  bool ns_created_ = false;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::unique_ptr<ForwardingSink> sink_;
  std::unique_ptr<domain::Domain> domain_;
  std::unique_ptr<frontends::GuestEvents> events_;
  netback::Tap guest_tap_, host_tap_;
  std::unique_ptr<frontends::Netfront> front_;
  std::unique_ptr<domain::ForeignDomain> foreign_;
  std::unique_ptr<gnttab::GrantMapper> mapper_;
  std::unique_ptr<netback::NetbackQueue> queue_;
  std::thread io_thread_, events_thread_, queue_thread_;
};

TEST_P(NetPath, PingBothWays) {
  if (sh("command -v ping") != 0) GTEST_SKIP() << "needs ping (iputils-ping)";
  start(GetParam());
  const std::string size = std::to_string(GetParam() - 28);  // a full-MTU echo, unfragmented
  EXPECT_EQ(sh("ping -c 3 -i 0.2 -W 3 -M do -s " + size + " " + dom_ip_), 0);
  EXPECT_EQ(sh(netns_cmd(ns_) + "ping -c 3 -i 0.2 -W 3 -M do -s " + size + " " + host_ip_), 0);
  EXPECT_GE(queue_->counters().tx_packets.load(), 6u);  // echo replies + requests from the domain
  EXPECT_GE(queue_->counters().rx_packets.load(), 6u);
  EXPECT_FALSE(queue_->disabled());
  EXPECT_FALSE(front_->broken());
}

TEST_P(NetPath, TcpTransferIsIntactBothWays) {
  start(GetParam());
  const std::uint64_t bytes = 64ull << 20;
  auto to_dom = tcp_transfer(netns_path_, dom_ip_, "", bytes, 1);
  ASSERT_TRUE(to_dom.ok);
  EXPECT_EQ(to_dom.received, bytes);
  EXPECT_EQ(to_dom.received_hash, to_dom.sent_hash);
  auto to_host = tcp_transfer("", host_ip_, netns_path_, bytes, 2);
  ASSERT_TRUE(to_host.ok);
  EXPECT_EQ(to_host.received, bytes);
  EXPECT_EQ(to_host.received_hash, to_host.sent_hash);
  const auto& c = queue_->counters();
  EXPECT_GE(c.rx_bytes.load(), bytes);
  EXPECT_GE(c.tx_bytes.load(), bytes);
  EXPECT_EQ(c.tx_errors.load(), 0u);
  EXPECT_EQ(front_->stats().tx_errors.load(), 0u);
  EXPECT_FALSE(queue_->disabled());
}

TEST_P(NetPath, BothDirectionsAtOnce) {
  start(GetParam());
  const std::uint64_t bytes = 32ull << 20;
  auto a = std::async(std::launch::async, [&] { return tcp_transfer(netns_path_, dom_ip_, "", bytes, 3); });
  auto b = tcp_transfer("", host_ip_, netns_path_, bytes, 4);
  auto r = a.get();
  ASSERT_TRUE(r.ok && b.ok);
  EXPECT_EQ(r.received_hash, r.sent_hash);
  EXPECT_EQ(b.received_hash, b.sent_hash);
  EXPECT_EQ(r.received, bytes);
  EXPECT_EQ(b.received, bytes);
  EXPECT_GT(queue_->counters().tx_turns.load(), 0u);
  EXPECT_GT(queue_->counters().rx_turns.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Mtu, NetPath, ::testing::Values(1500u, 9000u));

class NetPathFault : public NetPath {};

TEST_F(NetPathFault, GarbageInTheTxRingDisablesTheVif) {
  start(1500);
  // The guest turns hostile: its driver stops, and it publishes a producer index far beyond the
  // ring, then kicks the backend.
  front_->stop();
  const auto tx_before = queue_->counters().tx_packets.load();
  auto page = front_->tx_ring_page_for_testing();
  std::atomic_ref<std::uint32_t> req_prod(*reinterpret_cast<std::uint32_t*>(page.data()));
  req_prod.store(req_prod.load() + 5000, std::memory_order_release);
  ASSERT_TRUE(domain_->evtchn().send(front_->tx_port()));
  for (int i = 0; i < 500 && !queue_->disabled(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(queue_->disabled());
  if (queue_thread_.joinable()) queue_thread_.join();  // run() returned by itself
  EXPECT_EQ(queue_->counters().tx_packets.load(), tx_before);
  // Sticky: a later kick does not revive it.
  ASSERT_TRUE(domain_->evtchn().send(front_->tx_port()));
  EXPECT_FALSE(queue_->poll_once());
}

TEST_F(NetPathFault, OtherVifsKeepWorkingWhenOneIsDisabled) {
  if (sh("command -v ping") != 0) GTEST_SKIP() << "needs ping (iputils-ping)";
  start(1500);
  // A second vif of the same domain: its own rings, grants, event channels, TAPs, mapper, queue.
  auto guest_tap = netback::Tap::create({"eth1", netns_path_, 1, {true, true, true}});
  guest_tap.set_link({1500, netback::parse_mac("00:16:3e:00:01:02"), true});
  frontends::Netfront front(*domain_, *events_, guest_tap.fd(), frontends::NetfrontConfig{});
  const std::string vif1 = "vif" + std::to_string(domid_) + ".1";
  auto host_tap = netback::Tap::create({vif1, "", 1, {true, true, true}});
  host_tap.set_link({1500, std::nullopt, true});
  auto mapper = foreign_->make_mapper();
  auto txm = mapper->map(front.tx_ring_ref(), false);
  auto rxm = mapper->map(front.rx_ring_ref(), false);
  ASSERT_TRUE(txm && rxm);
  auto tx = ring::NetifTxBackRing::attach(txm->writable());
  auto rx = ring::NetifRxBackRing::attach(rxm->writable());
  ASSERT_TRUE(tx && rx);
  netback::NetbackConfig bcfg;
  bcfg.rx_gso = {true, true};
  netback::NetbackQueue queue(vif1 + "-q0", *mapper, std::move(*tx), std::move(*rx), foreign_->bind(front.tx_port()),
                              foreign_->bind(front.rx_port()), host_tap.fd(), bcfg);
  std::thread thread([&] { queue.run(); });
  struct Join {
    netback::NetbackQueue& q;
    std::thread& t;
    ~Join() {
      q.stop();
      if (t.joinable()) t.join();
    }
  } join{queue, thread};
  front.start();
  const std::string net = host_ip_.substr(0, host_ip_.rfind('.'));
  const std::string host1 = net + ".5", dom1 = net + ".6";
  ASSERT_EQ(sh("ip addr add " + host1 + "/30 dev " + vif1), 0);
  ASSERT_EQ(sh(netns_cmd(ns_) + "ip addr add " + dom1 + "/30 dev eth1"), 0);

  // vif 0 turns hostile and is disabled...
  front_->stop();
  auto page = front_->tx_ring_page_for_testing();
  std::atomic_ref<std::uint32_t> req_prod(*reinterpret_cast<std::uint32_t*>(page.data()));
  req_prod.store(req_prod.load() + 5000, std::memory_order_release);
  ASSERT_TRUE(domain_->evtchn().send(front_->tx_port()));
  for (int i = 0; i < 500 && !queue_->disabled(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(queue_->disabled());
  // ...while vif 1 carries traffic both ways.
  EXPECT_EQ(sh("ping -c 3 -i 0.2 -W 3 " + dom1), 0);
  auto r = tcp_transfer("", host1, netns_path_, 8 << 20, 5);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.received_hash, r.sent_hash);
  EXPECT_FALSE(queue.disabled());
  front.stop();
}

TEST(Tap, MultiQueueInsideANamespace) {
  if (!can_make_taps()) {
    GTEST_SKIP() << "needs root, /dev/net/tun, iproute2 and nsenter";
  }
  const ScratchNetns scratch("xpv-tap-" + std::to_string(::getpid()));
  ASSERT_TRUE(scratch.made);
  const std::string& ns = scratch.name;
  const std::string name = "xpvq" + std::to_string(::getpid() % 100000);
  {
    auto tap = netback::Tap::create({name, "/run/netns/" + ns, 2, {true, true, false}});
    EXPECT_EQ(tap.queues(), 2u);
    EXPECT_NE(tap.fd(0), tap.fd(1));
    tap.set_link({9000, netback::parse_mac("00:16:3e:0a:0b:0c"), true});
    EXPECT_GT(tap.ifindex(), 0);
    EXPECT_EQ(sh(netns_cmd(ns) + "ip link show " + name + " | grep -q 'mtu 9000'"), 0);
    EXPECT_EQ(sh(netns_cmd(ns) + "ip link show " + name + " | grep -q '00:16:3e:0a:0b:0c'"), 0);
    EXPECT_NE(sh("ip link show " + name), 0) << "the caller's namespace is untouched";
  }
  EXPECT_NE(sh(netns_cmd(ns) + "ip link show " + name), 0) << "gone with its fds";
}

// Bridge mode's two pieces (tap.h): bridge_problem says what cannot take a vif, join_bridge makes
// a TAP a port of a bridge, in the TAP's namespace; the port goes with the TAP.
TEST(Tap, JoinsABridgeAndSaysWhatIsNotOne) {
  if (!can_make_taps()) {
    GTEST_SKIP() << "needs root, /dev/net/tun, iproute2 and nsenter";
  }
  const ScratchNetns scratch("xpv-br-" + std::to_string(::getpid()));
  ASSERT_TRUE(scratch.made);
  const std::string& ns = scratch.name;
  const std::string netns = "/run/netns/" + ns;
  if (sh(netns_cmd(ns) + "ip link add xbr0 type bridge") != 0) GTEST_SKIP() << "no bridge support in this kernel";
  ASSERT_EQ(sh(netns_cmd(ns) + "ip tuntap add dev xtun0 mode tap"), 0);
  auto problem = [&](const std::string& name) {
    std::string why;
    netback::in_netns(netns, [&] { why = netback::bridge_problem(name); });
    return why;
  };
  EXPECT_EQ(problem("xbr0"), "");
  EXPECT_EQ(problem("xtun0"), "'xtun0' is not a bridge (its driver is tun)");
  EXPECT_EQ(problem("xnone0"), "bridge 'xnone0' does not exist (make it first, e.g. ip link add xnone0 type bridge)");
  EXPECT_EQ(problem("a/b"), "bridge 'a/b' is not an interface name (1..15 characters, no '/', ':' or white space)");
  EXPECT_NE(problem("sixteen-chars-xx"), "");
  // The MTU the toolstack gives a bridged vif without one: the bridge's.
  ASSERT_EQ(sh(netns_cmd(ns) + "ip link set xbr0 mtu 4000"), 0);
  std::optional<unsigned> mtu, none;
  netback::in_netns(netns, [&] {
    mtu = netback::interface_mtu("xbr0");
    none = netback::interface_mtu("xnone0");
  });
  EXPECT_EQ(mtu, 4000u);
  EXPECT_FALSE(none.has_value());
  EXPECT_NE(problem("lo").find("'lo' is not a bridge"), std::string::npos) << problem("lo");
  const std::string name = "xpvb" + std::to_string(::getpid() % 100000);
  {
    auto tap = netback::Tap::create({name, netns, 2, {}});
    tap.set_link({1500, std::nullopt, true});
    EXPECT_THROW(tap.join_bridge("xtun0"), std::runtime_error);
    EXPECT_THROW(tap.join_bridge("xnone0"), std::runtime_error);
    EXPECT_NE(sh(netns_cmd(ns) + "ip -o link show " + name + " | grep -q ' master '"), 0) << "a refused join makes no port";
    tap.join_bridge("xbr0");
    EXPECT_EQ(sh(netns_cmd(ns) + "ip -o link show " + name + " | grep -q ' master xbr0 '"), 0);
  }
  ASSERT_EQ(sh(netns_cmd(ns) + "ip link show xbr0"), 0) << "the bridge stays";
  EXPECT_NE(sh(netns_cmd(ns) + "ip -o link show master xbr0 | grep -q ."), 0) << "the port went with the TAP";
}

// What netback's flow steering relies on (flow_steering.h): a multi-queue TAP sends a flow's
// packets to the queue on which that flow's packets were last written. A "guest" behind a 2-queue
// TAP in a namespace the test makes asks a UDP socket there through queue 0, 1, then 0 again;
// each answer must come back on the queue its question went out on.
TEST(Tap, AFlowsAnswersComeBackOnTheQueueItWasLastWrittenOn) {
  if (!can_make_taps()) {
    GTEST_SKIP() << "needs root, /dev/net/tun, iproute2 and nsenter";
  }
  const ScratchNetns scratch("xpv-steer-" + std::to_string(::getpid()));
  ASSERT_TRUE(scratch.made);
  const std::string& ns = scratch.name;
  const std::string name = "xpvs" + std::to_string(::getpid() % 100000);
  const std::array<std::uint8_t, 6> host_mac{0x02, 0, 0, 0, 0, 1}, guest_mac{0x02, 0, 0, 0, 0, 2};
  auto tap = netback::Tap::create({name, "/run/netns/" + ns, 2, {}});
  tap.set_link({1500, host_mac, true, netback::Ipv4Address{0x0a4d0001, 24}});  // 10.77.0.1/24
  ASSERT_EQ(sh(netns_cmd(ns) + "ip neigh replace 10.77.0.2 lladdr 02:00:00:00:00:02 dev " + name + " nud permanent"), 0);
  UniqueFd sock;
  netback::in_netns("/run/netns/" + ns, [&] { sock = UniqueFd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)); });
  ASSERT_TRUE(sock);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(7777);
  at.sin_addr.s_addr = htonl(0x0a4d0001);
  ASSERT_EQ(::bind(sock.get(), reinterpret_cast<sockaddr*>(&at), sizeof at), 0) << std::strerror(errno);

  // The guest's question: Ethernet, IPv4 10.77.0.2 -> 10.77.0.1, UDP 40000 -> 7777, 4 bytes.
  auto question = [&](std::uint8_t round) {
    std::vector<std::uint8_t> f(14 + 20 + 8 + 4, 0);
    std::memcpy(&f[0], host_mac.data(), 6);
    std::memcpy(&f[6], guest_mac.data(), 6);
    f[12] = 0x08;
    const std::uint8_t ip[20] = {0x45, 0, 0, 32, 0, round, 0x40, 0, 64, 17, 0, 0, 10, 77, 0, 2, 10, 77, 0, 1};
    std::memcpy(&f[14], ip, sizeof ip);
    std::uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2) sum += static_cast<std::uint32_t>(f[14 + i] << 8 | f[15 + i]);
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    f[24] = static_cast<std::uint8_t>(~sum >> 8);
    f[25] = static_cast<std::uint8_t>(~sum);
    const std::uint8_t udp[12] = {0x9c, 0x40, 0x1e, 0x61, 0, 12, 0, 0, 'q', 'q', 'q', round};  // no checksum
    std::memcpy(&f[34], udp, sizeof udp);
    return f;
  };
  // Which TAP queue the answer to `round` arrives on (-1: none within 2 s). Other frames the
  // namespace sends (IPv6 neighbour discovery) are skipped; bounded in count and time.
  auto answer_queue = [&](std::uint8_t round) {
    for (int i = 0; i < 200; ++i) {
      pollfd p[2] = {{tap.fd(0), POLLIN, 0}, {tap.fd(1), POLLIN, 0}};
      if (::poll(p, 2, 2000) <= 0) return -1;
      for (int q = 0; q < 2; ++q) {
        if (!(p[q].revents & POLLIN)) continue;
        std::uint8_t buf[2048];
        const ssize_t n = ::read(tap.fd(static_cast<unsigned>(q)), buf, sizeof buf);
        const std::size_t v = sizeof(netback::VnetHdr);
        if (n >= static_cast<ssize_t>(v + 14 + 20 + 8 + 4) && buf[v + 12] == 0x08 && buf[v + 13] == 0 &&
            buf[v + 23] == 17 && buf[v + 34] == 0x1e && buf[v + 35] == 0x61 && buf[v + 45] == round) {
          return q;
        }
      }
    }
    return -1;
  };
  const unsigned rounds[3] = {0, 1, 0};
  for (std::uint8_t r = 0; r < 3; ++r) {
    const auto f = question(r);
    netback::VnetHdr h{};
    iovec iov[2] = {{&h, sizeof h}, {const_cast<std::uint8_t*>(f.data()), f.size()}};
    ASSERT_EQ(::writev(tap.fd(rounds[r]), iov, 2), static_cast<ssize_t>(sizeof h + f.size()));
    pollfd p{sock.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 2000), 1) << "round " << int{r} << ": the question did not arrive";
    std::uint8_t got[16];
    sockaddr_in from{};
    socklen_t len = sizeof from;
    ASSERT_EQ(::recvfrom(sock.get(), got, sizeof got, 0, reinterpret_cast<sockaddr*>(&from), &len), 4);
    EXPECT_EQ(ntohs(from.sin_port), 40000);
    ASSERT_EQ(::sendto(sock.get(), got, 4, 0, reinterpret_cast<sockaddr*>(&from), len), 4);
    EXPECT_EQ(answer_queue(r), static_cast<int>(rounds[r])) << "round " << int{r};
  }
}

TEST(Tap, BadArgumentsAreRefused) {
  EXPECT_THROW(netback::Tap::create({"", "", 1, {}}), std::invalid_argument);
  EXPECT_THROW(netback::Tap::create({"sixteen-chars-xx", "", 1, {}}), std::invalid_argument);
  EXPECT_THROW(netback::Tap::create({"xpvbad0", "", 0, {}}), std::invalid_argument);
  EXPECT_THROW(netback::Tap::create({"xpvbad0", "/nonexistent/netns", 1, {}}), std::system_error);
  EXPECT_FALSE(netback::parse_mac("00:16:3e:0a:0b"));
  EXPECT_FALSE(netback::parse_mac("00:16:3e:0a:0b:0g"));
  EXPECT_FALSE(netback::parse_mac("00-16-3e-0a-0b-0c"));
  auto m = netback::parse_mac("00:16:3E:0a:0b:FF");
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)[2], 0x3e);
  EXPECT_EQ((*m)[5], 0xff);
}

}  // namespace
}  // namespace xpv
