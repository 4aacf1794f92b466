// xpv-netback's control plane against hostile frontends: seeded, bounded fuzzing of what a guest
// writes into its vif's frontend directory when it connects — tx-ring-ref, rx-ring-ref,
// event-channel / event-channel-tx / -rx, request-rx-copy, feature-rx-notify, feature-sg,
// multi-queue-num-queues, state — with every component real and run as the user runs them
// (`xpv up`; the rig of tests/integration/netback). Each seed is one vif of the hostile domain
// 200, an in-process Netfront with its own TAP: the toolstack writes the backend's nodes, the
// guest publishes what a correct netfront would, then 0–3 of its nodes are mutated (removed, or
// given a hostile value: empty, negative, past 2^32, hex, padded, 0 where 1 is required, the
// other ring's reference, another of its ports, a reference never granted), its state may first
// be garbage; then the vif is closed and removed as the toolstack does. Next to it, web1 — a real
// xpv-front made by `xpv create` — is pinged from the host.
//
// Invariants (each fails for a real bug):
//   - xpv-netback never dies (the supervisor never restarts it), whatever the guest wrote;
//   - each hostile vif ends, within 5 s, Connected (4), or refused: Closing (5) or Closed (6)
//     with an `error` node "<errno> <what>";
//   - a vif whose nodes were not mutated connects and its host TAP vif200.<devid> exists;
//   - web1 answers pings from the host every 5 seeds and at the end;
//   - once a hostile vif is closed and removed, none of domain 200's grants is mapped and its
//     TAP vif200.<devid> is gone;
//   - the fuzzer reached both outcomes.
// A failure prints its seed: XPV_FUZZ_SEED=N replays it; XPV_FUZZ_ITERATIONS=N runs N seeds
// (default 24).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "netback_rig.h"
#include "xpv/test/fuzz_seeds.h"

namespace xpv {
namespace {

using namespace std::chrono_literals;
using test::netrig::eventually;

constexpr std::uint16_t kBad = 200;

const std::vector<std::string>& nasty() {
  static const std::vector<std::string> v = {"",    "-1", "4294967296", "18446744073709551616", "0x10", " 1", "1 ",
                                             "abc", "\xff\xfe", std::string(3000, '7'), "0", "2", "4294967295"};
  return v;
}

class NetbackXenbusFuzz : public ::testing::Test, protected test::netrig::NetbackRig {
 protected:
  void SetUp() override {
    if (const std::string why = missing(); !why.empty()) GTEST_SKIP() << why;
    setup();
  }
  void TearDown() override {
    fronts_.clear();  // before the guest whose grants they hold
    taps_.clear();
    teardown(HasFailure());
  }
  std::size_t mapped_refs() const {
    std::size_t n = 0;
    for (gnttab::GrantRef ref = 0; ref < guest_->dom->grants().capacity(); ++ref) n += guest_->dom->grants().is_mapped(ref);
    return n;
  }
  std::vector<std::unique_ptr<frontends::Netfront>> fronts_;  // the current vif's (one at a time)
  std::vector<netback::Tap> taps_;
};

TEST_F(NetbackXenbusFuzz, HostileFrontendNodesNeverHurtTheDaemonOrAnotherDomain) {
  auto r = xpv({"up"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  r = xpv({"create", [&] {
             const std::string cfg = dir_ + "/web1.cfg";
             std::ofstream(cfg) << fmt::format(
                 "name = \"web1\"\ntype = \"process\"\nmemory = 64\nvif = [ 'mac=00:16:3e:00:50:01, ip={}.2/24' ]\n", net_);
             return cfg;
           }()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  auto web1_pings = [&] { return in(hostns_, fmt::format("ping -c 2 -i 0.2 -W 3 {}.2", net_)) == 0; };
  ASSERT_TRUE(web1_pings());
  const auto netback = toolstack::running_pid(dir_ + "/run/xpv-netback.pid", "xpv-netback");
  ASSERT_TRUE(netback.has_value());

  make_guest(kBad, "hostile");
  const std::string badns = dir_ + "/badns";
  netback::create_netns(badns);
  xenbus::client::SyncClient xs(dir_ + "/xs.sock");
  unsigned connected = 0, refused = 0, clean_connected = 0;
  const auto [first, last] = test::fuzz_seeds(24);
  for (std::uint64_t seed = first; seed <= last; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const std::uint32_t devid = static_cast<std::uint32_t>(seed);
    taps_.push_back(netback::Tap::create({"e" + std::to_string(seed), badns, 1, {true, true, true}}));
    frontends::NetfrontConfig cfg;
    cfg.split_event_channels = rng() % 2 == 0;
    fronts_.push_back(std::make_unique<frontends::Netfront>(*guest_->dom, *guest_->events, taps_.back().fd(), cfg));
    auto& f = *fronts_.back();
    const std::string be = fmt::format("/local/domain/0/backend/vif/{}/{}", kBad, devid);
    const std::string fe = fmt::format("/local/domain/{}/device/vif/{}", kBad, devid);
    const std::string mac = fmt::format("00:16:3e:00:60:{:02x}", seed % 256);
    // The toolstack's part, then the backend offers the vif (InitWait).
    for (const auto& [p, v] : std::vector<std::pair<std::string, std::string>>{
             {fe + "/backend", be}, {fe + "/backend-id", "0"}, {fe + "/handle", std::to_string(devid)}, {fe + "/mac", mac},
             {be + "/frontend", fe}, {be + "/frontend-id", std::to_string(kBad)}, {be + "/online", "1"},
             {be + "/handle", std::to_string(devid)}, {be + "/mac", mac}, {fe + "/state", "1"}, {be + "/state", "1"}}) {
      ASSERT_TRUE(xs.write(p, v)) << p;
    }
    ASSERT_TRUE(eventually([&] { return xs.read(be + "/state").value_or("") == "2"; })) << log("xpv-netback.log");

    // What a correct netfront publishes, then the guest's mischief.
    std::vector<std::pair<std::string, std::string>> nodes = {
        {fe + "/tx-ring-ref", std::to_string(f.tx_ring_ref())}, {fe + "/rx-ring-ref", std::to_string(f.rx_ring_ref())},
        {fe + "/request-rx-copy", "1"}, {fe + "/feature-rx-notify", "1"}, {fe + "/feature-sg", "1"}};
    if (cfg.split_event_channels) {
      nodes.emplace_back(fe + "/event-channel-tx", std::to_string(f.tx_port()));
      nodes.emplace_back(fe + "/event-channel-rx", std::to_string(f.rx_port()));
    } else {
      nodes.emplace_back(fe + "/event-channel", std::to_string(f.tx_port()));
    }
    if (rng() % 2) nodes.emplace_back(fe + "/multi-queue-num-queues", "1");
    const unsigned mutations = rng() % 2 ? 0 : 1 + static_cast<unsigned>(rng() % 3);
    const bool clean = mutations == 0;
    std::vector<std::string> removed;
    for (unsigned m = 0; m < mutations; ++m) {
      auto& [k, v] = nodes[rng() % nodes.size()];
      switch (rng() % 6) {
        case 0: removed.push_back(k); break;
        case 1: case 2: v = nasty()[rng() % nasty().size()]; break;
        case 3: v = std::to_string(rng() % 2 ? f.tx_ring_ref() : f.rx_ring_ref()); break;  // the other ring's ref
        case 4: v = std::to_string(1 + rng() % 8); break;  // another of its ports (its xenstore channel among them)
        case 5: v = std::to_string(3000 + rng() % 5000); break;                              // never granted
      }
    }
    std::vector<std::pair<std::string, std::string>> publishing;
    if (rng() % 4 == 0) publishing.emplace_back(fe + "/state", nasty()[rng() % nasty().size()]);
    for (const auto& kv : nodes) {
      if (std::find(removed.begin(), removed.end(), kv.first) == removed.end()) publishing.push_back(kv);
    }
    publishing.emplace_back(fe + "/state", "3");
    auto t = xs.transaction([&](xenbus::client::TxId tx) -> xenbus::client::Result<void> {
      for (const auto& [k, v] : publishing) {
        if (auto w = xs.write(k, v, tx); !w) return w;
      }
      return {};
    });
    ASSERT_TRUE(t);
    std::string st;
    eventually([&] {
      st = xs.read(be + "/state").value_or("<absent>");
      return st == "4" || st == "5" || st == "6";
    }, 5s);
    ASSERT_EQ(toolstack::running_pid(dir_ + "/run/xpv-netback.pid", "xpv-netback"), netback) << "xpv-netback died";
    const std::string tap = fmt::format("vif{}.{}", kBad, devid);
    if (st == "4") {
      ++connected;
      EXPECT_FALSE(xs.read(be + "/error")) << "connected with an error node";
      if (clean) {
        ++clean_connected;
        EXPECT_EQ(in(hostns_, "ip link show " + tap), 0) << "a connected vif without its host TAP";
      }
    } else {
      ASSERT_TRUE(st == "5" || st == "6") << "neither connected nor refused within 5 s: state " << st;
      ++refused;
      const std::string err = xs.read(be + "/error").value_or("");
      EXPECT_FALSE(clean) << "a correct frontend refused: " << err;
      EXPECT_TRUE(!err.empty() && std::isdigit(static_cast<unsigned char>(err[0])) && err.find(' ') != std::string::npos)
          << "refused without an error node \"<errno> <what>\": '" << err << "'";
    }
    // Closed and removed as the toolstack does.
    ASSERT_TRUE(xs.write(fe + "/state", "6"));
    EXPECT_TRUE(eventually([&] { return xs.read(be + "/state").value_or("") == "6"; }, 5s)) << log("xpv-netback.log");
    ASSERT_TRUE(xs.rm(be));
    ASSERT_TRUE(xs.rm(fe));
    EXPECT_TRUE(eventually([&] { return in(hostns_, "ip link show " + tap) != 0; }, 5s)) << tap << " left behind";
    // Every earlier vif is gone too: nothing of domain 200 may stay mapped. Then the guest drops
    // this netfront (its pages and grants back to the domain).
    EXPECT_TRUE(eventually([&] { return mapped_refs() == 0; }, 5s)) << mapped_refs() << " grants still mapped";
    fronts_.clear();
    taps_.clear();
    if (seed % 5 == 0) {
      ASSERT_TRUE(web1_pings()) << "web1 no longer answers";
    }
  }
  EXPECT_TRUE(web1_pings()) << "web1 no longer answers";
  EXPECT_EQ(toolstack::running_pid(dir_ + "/run/xpv-netback.pid", "xpv-netback"), netback) << "xpv-netback died";
  EXPECT_EQ(log("xpv-supervise.log").find("xpv-netback (pid"), std::string::npos) << "xpv-netback was restarted";
  std::printf("netback xenbus: %u vifs connected (%u with correct nodes), %u refused\n", connected, clean_connected,
              refused);
  if (last - first >= 9) {
    EXPECT_GT(connected, 0u);
    EXPECT_GT(refused, 0u);
    EXPECT_GT(clean_connected, 0u);
  }
  fronts_.clear();
  taps_.clear();
  netback::remove_netns(badns);
}

}  // namespace
}  // namespace xpv
