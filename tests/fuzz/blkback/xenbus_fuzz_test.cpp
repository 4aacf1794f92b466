// xpv-blkback's control plane against hostile frontends: seeded, bounded fuzzing of what a guest
// writes into its vbd's frontend directory when it connects — ring-ref / ring-ref<i>,
// ring-page-order, event-channel, multi-queue-num-queues and queue-<i>/, protocol, state — with
// the real xpv-xenstored and xpv-blkback as processes (the rig of tests/integration/blkback). Each
// seed is one device of the hostile domain 4: a raw frontend with 1–4 queues of 2^0–2^2-page
// rings publishes the nodes a correct frontend would, then 0–3 of them are mutated (removed, or
// given a hostile value: empty, negative, past 2^32, hex, padded, a number past the limits, a
// reference or port of another queue, one that was never granted or allocated, a read-only
// grant), an extra node may be added, the frontend state may first be garbage; then the device
// is closed and removed as the toolstack does.
//
// Invariants (each fails for a real bug):
//   - xpv-blkback never dies, whatever the guest wrote;
//   - each hostile device ends, within 5 s, Connected (4) or refused: Closing (5) with an `error`
//     node "<errno> <what>" naming it — never left half-connected without a word;
//   - a device whose nodes were not mutated connects, and its first queue answers a read;
//   - domain 3's well-behaved device keeps working throughout (a checksummed write and read
//     every 5 seeds and at the end);
//   - once every hostile device is closed and removed, none of domain 4's grants is mapped;
//   - the fuzzer reached both outcomes (some devices connected, some refused).
// A failure prints its seed: XPV_FUZZ_SEED=N replays it; XPV_FUZZ_ITERATIONS=N runs N seeds
// (default 40).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <string>
#include <vector>

#include "blkback_rig.h"
#include "xpv/test/fuzz_seeds.h"

namespace xpv {
namespace {

using namespace std::chrono_literals;
using test::blkrig::BlkbackRig;
using test::blkrig::Guest;
using test::blkrig::RawFront;

constexpr std::uint32_t kXvda = 51712;

// Xen's extended vbd numbering (1 << 28 | disk << 8): one fresh device per seed.
std::uint32_t devid_of(std::uint64_t seed) { return (1u << 28) | static_cast<std::uint32_t>(seed << 8); }

// Values a guest may write where a number is expected.
const std::vector<std::string>& nasty() {
  static const std::vector<std::string> v = {"",  "-1", "4294967296", "18446744073709551616", "0x10", " 1", "1 ", "abc",
                                             "\xff\xfe", std::string(3000, '7'), "3", "8", "17", "65", "4294967295", "0"};
  return v;
}

struct Nodes {
  BlkbackRig::NodeList kv;
  void set(const std::string& k, const std::string& v) {
    for (auto& [kk, vv] : kv)
      if (kk == k) {
        vv = v;
        return;
      }
    kv.emplace_back(k, v);
  }
};

class BlkbackXenbusFuzz : public ::testing::Test, protected BlkbackRig {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (domain control sockets, io_uring on images)";
    start();
  }
  void TearDown() override { stop(HasFailure()); }

  bool blkback_alive() {
    int st = 0;
    return blkback_ && ::waitpid(blkback_->pid(), &st, WNOHANG) == 0;
  }
  // Polls (bounded) until `path` holds one of `want`; returns what it held last.
  std::string wait_for_one_of(const std::string& path, const std::vector<std::string>& want,
                              std::chrono::milliseconds limit = 5000ms) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::string v;
    while (true) {
      v = xs_->read(path).value_or("<absent>");
      if (std::find(want.begin(), want.end(), v) != want.end() || std::chrono::steady_clock::now() > deadline) return v;
      std::this_thread::sleep_for(20ms);
    }
  }
  // A checksummed round trip through domain 3's Blkfront.
  void check_well_behaved(Guest& g, unsigned round) {
    std::vector<std::uint8_t> data(64 << 10), back(data.size());
    std::mt19937 r(round);
    for (auto& b : data) b = static_cast<std::uint8_t>(r());
    const std::uint64_t off = static_cast<std::uint64_t>(round % 64) << 20;
    ASSERT_EQ(g.front->write(off, data), static_cast<long>(data.size())) << "domain 3's write, round " << round;
    ASSERT_EQ(g.front->read(off, back), static_cast<long>(back.size())) << "domain 3's read, round " << round;
    ASSERT_EQ(back, data) << "domain 3's data, round " << round;
  }
};

TEST_F(BlkbackXenbusFuzz, HostileFrontendNodesNeverHurtTheDaemonOrAnotherDomain) {
  Guest& good = guest(3);
  add_vbd(3, kXvda, image("good.img"), "w");
  connect_blkfront(good, kXvda);
  ASSERT_FALSE(HasFatalFailure());
  check_well_behaved(good, 0);
  ASSERT_FALSE(HasFatalFailure());

  Guest& bad = guest(4);
  const std::string bad_img = image("bad.img", 16 << 20);
  std::vector<std::unique_ptr<RawFront>> fronts;  // kept until the end: their grants are checked then
  unsigned connected = 0, refused = 0, clean_connected = 0;
  const auto [first, last] = test::fuzz_seeds(40);
  for (std::uint64_t seed = first; seed <= last; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const unsigned queues = 1 + static_cast<unsigned>(rng() % 4), order = static_cast<unsigned>(rng() % 3);
    fronts.push_back(std::make_unique<RawFront>(*bad.dom, queues, order));
    RawFront& raw = *fronts.back();
    const std::uint32_t devid = devid_of(seed);
    const std::string b = be(4, devid), f = fe(4, devid);
    add_vbd(4, devid, bad_img, rng() % 4 == 0 ? "r" : "w");
    ASSERT_EQ(wait_value(b + "/state", "2"), "2");

    // What a correct frontend publishes (the rig's raw_nodes), then the guest's mischief.
    Nodes n{raw_nodes(f, raw, order, rng() % 2 == 0)};
    std::vector<std::string> ring_nodes;  // ring-ref<i> and event-channel of every queue
    for (const auto& [k, v] : n.kv) {
      if (k.find("/ring-ref") != std::string::npos || k.ends_with("/event-channel")) ring_nodes.push_back(k);
    }
    // About half the devices are left as a correct frontend publishes them.
    const unsigned mutations = rng() % 2 ? 0 : 1 + static_cast<unsigned>(rng() % 3);
    bool clean = mutations == 0;
    std::vector<std::string> removed;
    for (unsigned m = 0; m < mutations; ++m) {
      auto& [k, v] = n.kv[rng() % n.kv.size()];
      switch (rng() % 6) {
        case 0: removed.push_back(k); break;
        case 1: case 2: v = nasty()[rng() % nasty().size()]; break;
        case 3: v = std::to_string(raw.refs(static_cast<unsigned>(rng() % queues)).front()); break;  // another queue's ref
        case 4: v = std::to_string(raw.port(static_cast<unsigned>(rng() % queues))); break;          // another queue's port
        case 5: v = std::to_string(4000 + rng() % 4000); break;  // never granted, never allocated
      }
    }
    if (!clean && rng() % 3 == 0) {
      // A ring page the guest granted read-only.
      const auto gfn = bad.dom->alloc_pages(1).value();
      n.set(ring_nodes.front(), std::to_string(bad.dom->grants().grant_access(0, gfn, true).value()));
    }
    if (!clean && rng() % 3 == 0) n.set(f + "/protocol", rng() % 2 ? "x86_32-abi" : nasty()[rng() % nasty().size()]);
    // A node of a queue past the ones used changes nothing (Linux's blkback reads only its own).
    if (rng() % 5 == 0) n.set(f + "/queue-" + std::to_string(4 + rng() % 20) + "/ring-ref", "1");
    NodeList publishing;
    if (rng() % 4 == 0) publishing.emplace_back(f + "/state", nasty()[rng() % nasty().size()]);  // overwritten below
    for (const auto& kv : n.kv) {
      if (std::find(removed.begin(), removed.end(), kv.first) == removed.end()) publishing.push_back(kv);
    }
    publishing.emplace_back(f + "/state", "3");
    publish(publishing);
    ASSERT_FALSE(HasFatalFailure());
    const std::string st = wait_for_one_of(b + "/state", {"4", "5"});
    ASSERT_TRUE(blkback_alive()) << "xpv-blkback died";
    if (st == "4") {
      ++connected;
      EXPECT_FALSE(xs_->read(b + "/error")) << "connected with an error node";
      if (clean) {
        ++clean_connected;
        EXPECT_EQ(raw.io(0, false, 0), std::optional<std::int16_t>(0)) << "a correct frontend's read";
      }
    } else {
      ASSERT_EQ(st, "5") << "neither connected nor refused within 5 s";
      ++refused;
      EXPECT_FALSE(clean) << "a correct frontend refused: " << xs_->read(b + "/error").value_or("(no error node)");
      const std::string err = xs_->read(b + "/error").value_or("");
      EXPECT_TRUE(!err.empty() && std::isdigit(static_cast<unsigned char>(err[0])) && err.find(' ') != std::string::npos)
          << "refused without an error node \"<errno> <what>\": '" << err << "'";
    }
    // Closed and removed as the toolstack does (the frontend acknowledges with Closed first).
    ASSERT_TRUE(xs_->write(f + "/state", "6"));
    EXPECT_EQ(wait_for_one_of(b + "/state", {"6"}), "6");
    ASSERT_TRUE(xs_->rm(b));
    ASSERT_TRUE(xs_->rm(f));
    ASSERT_TRUE(blkback_alive()) << "xpv-blkback died";
    if (seed % 5 == 0) {
      check_well_behaved(good, static_cast<unsigned>(seed));
      ASSERT_FALSE(HasFatalFailure());
    }
  }
  check_well_behaved(good, 999);
  // Nothing of domain 4 stays mapped (the backend lets go of a removed device's rings).
  std::size_t mapped = 0;
  for (int i = 0; i < 250; ++i) {
    mapped = 0;
    for (gnttab::GrantRef ref = 0; ref < bad.dom->grants().capacity(); ++ref) mapped += bad.dom->grants().is_mapped(ref);
    if (mapped == 0) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(mapped, 0u) << "grants of removed devices still mapped";
  std::printf("blkback xenbus: %u devices connected (%u with correct nodes), %u refused\n", connected, clean_connected,
              refused);
  if (last - first >= 9) {
    EXPECT_GT(connected, 0u) << "the fuzzer never let a device connect";
    EXPECT_GT(refused, 0u) << "the fuzzer never made the backend refuse";
    EXPECT_GT(clean_connected, 0u);
  }
}

}  // namespace
}  // namespace xpv
