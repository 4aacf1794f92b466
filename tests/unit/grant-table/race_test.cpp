// The shared-entry protocol under a peer that writes concurrently: the bounded compare-and-swap
// loop, and end_access never succeeding while the page is mapped. Every loop is bounded by count.
#include <atomic>
#include <thread>

#include "fixture.h"

namespace xpv::gnttab::test {
namespace {

using RaceTest = GrantFixture;

// Two threads meet before racing, so the race really overlaps. Bounded: gives up (returns false)
// after max_spins yields, and the caller's test then fails instead of hanging.
bool meet(std::atomic<int>& arrived, int parties, long max_spins = 50'000'000) {
  arrived.fetch_add(1);
  for (long i = 0; i < max_spins; ++i) {
    if (arrived.load() >= parties) return true;
    std::this_thread::yield();
  }
  return false;
}

// A guest that rewrites an irrelevant flag bit (GTF_PWT) between our read and our CAS, `budget`
// times: each rewrite makes exactly one compare-and-swap fail.
struct Flipper {
  int budget = 0;
  int calls = 0;
  static void hook(void* ctx, std::uint8_t* entry) noexcept {
    auto* self = static_cast<Flipper*>(ctx);
    ++self->calls;
    if (self->budget > 0) {
      --self->budget;
      std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(entry))
          .fetch_xor(gtf::pwt);
    }
  }
};

TEST_F(RaceTest, AnEntryThatNeverHoldsStillGivesUpAfterExactlyFiveAttempts) {
  const GrantRef ref = grant(1, false);
  Flipper f{1000, 0};
  mapper_.set_cas_hook_for_testing(&Flipper::hook, &f);
  auto m = mapper_.map(ref, false);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error(), Status::general_error);
  EXPECT_EQ(f.calls, GrantMapper::kMaxCasAttempts);
  EXPECT_EQ(f.calls, 5);
  // Our bits were never set; only the guest's flipping shows.
  EXPECT_EQ(flags_of(table_, ref) & (gtf::reading | gtf::writing), 0);
  EXPECT_EQ(mapper_.pins(ref).writers, 0u);
  EXPECT_EQ(mapper_.mapped(), 0u);
}

TEST_F(RaceTest, AnEntryThatSettlesBeforeTheLastAttemptIsMapped) {
  const GrantRef ref = grant(1, false);
  Flipper f{GrantMapper::kMaxCasAttempts - 1, 0};
  mapper_.set_cas_hook_for_testing(&Flipper::hook, &f);
  auto m = mapper_.map(ref, false);
  ASSERT_TRUE(m);
  EXPECT_EQ(f.calls, GrantMapper::kMaxCasAttempts);
  // Four flips of PWT leave it clear; our bits were set on top of the guest's last value.
  EXPECT_EQ(flags_of(table_, ref), gtf::permit_access | gtf::reading | gtf::writing);
  // Copies go through the same bounded loop.
  Flipper g{1000, 0};
  mapper_.set_cas_hook_for_testing(&Flipper::hook, &g);
  const GrantRef other = grant(2, true);
  std::array<std::uint8_t, 8> buf{};
  auto c = mapper_.copy_from(other, 0, buf);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error(), Status::general_error);
  EXPECT_EQ(g.calls, GrantMapper::kMaxCasAttempts);
  mapper_.set_cas_hook_for_testing(nullptr, nullptr);
  ASSERT_TRUE(mapper_.unmap(*m));
}

TEST_F(RaceTest, AGuestThreadFlippingFlagsCannotLivelockMap) {
  const GrantRef ref = grant(3, false);
  std::atomic<bool> stop{false};
  std::atomic<long> flips{0};
  std::atomic<int> arrived{0};
  std::thread guest([&] {
    if (!meet(arrived, 2)) return;
    auto* w = reinterpret_cast<std::uint32_t*>(table_.data() + ref * sizeof(GrantEntryV1));
    std::atomic_ref<std::uint32_t> word(*w);
    // Bounded: stops when told, and in any case after 50 million flips.
    for (long i = 0; i < 50'000'000 && !stop.load(std::memory_order_relaxed); ++i) {
      word.fetch_xor(gtf::pcd);
      flips.fetch_add(1, std::memory_order_relaxed);
    }
  });
  constexpr int kTries = 2000;
  int mapped = 0, unstable = 0, other = 0;
  ASSERT_TRUE(meet(arrived, 2)) << "the guest thread never started";
  for (int i = 0; i < kTries; ++i) {
    auto m = mapper_.map(ref, false);
    if (m) {
      ++mapped;
      EXPECT_TRUE(mapper_.unmap(*m));
    } else if (m.error() == Status::general_error) {
      ++unstable;
    } else {
      ++other;
    }
  }
  stop.store(true);
  guest.join();
  // Every attempt ended with one of the two outcomes the bounded loop allows.
  EXPECT_EQ(mapped + unstable, kTries);
  EXPECT_EQ(other, 0);
  // And nothing of ours is left in the entry.
  EXPECT_EQ(flags_of(table_, ref) & (gtf::reading | gtf::writing), 0);
  EXPECT_EQ(mapper_.mapped(), 0u);
  EXPECT_TRUE(granter_.end_access(ref));
  RecordProperty("mapped", mapped);
  RecordProperty("unstable", unstable);
  RecordProperty("flips", static_cast<int>(flips.load()));
}

TEST_F(RaceTest, EndAccessNeverSucceedsWhileTheBackendHoldsTheMapping) {
  const GrantRef ref = grant(5, false);
  std::atomic<bool> holding{false};
  std::atomic<bool> done{false};
  constexpr int kRounds = 20000;
  int maps_ok = 0;
  std::atomic<int> arrived{0};
  std::thread backend([&] {
    if (!meet(arrived, 2)) {
      done.store(true);
      return;
    }
    for (int i = 0; i < kRounds; ++i) {
      auto m = mapper_.map(ref, (i & 1) != 0);
      if (!m) continue;  // revoked at the moment: the frontend re-grants it
      ++maps_ok;
      holding.store(true, std::memory_order_seq_cst);
      if (!m->readonly()) m->writable()[0] = static_cast<std::uint8_t>(i);  // use the page
      holding.store(false, std::memory_order_seq_cst);
      (void)mapper_.unmap(*m);
    }
    done.store(true);
  });
  long revoked = 0, refused = 0, violations = 0;
  EXPECT_TRUE(meet(arrived, 2));
  for (long i = 0; i < 5'000'000 && !done.load(); ++i) {
    auto r = granter_.end_access(ref);
    if (!r) {
      ASSERT_EQ(r.error(), Status::eagain);
      ++refused;
      continue;
    }
    ++revoked;
    // Revoked: the backend cannot be inside its map..unmap window now, nor enter it until the
    // re-grant below (a map of a revoked entry fails).
    if (holding.load(std::memory_order_seq_cst)) ++violations;
    ASSERT_TRUE(granter_.grant_access_ref(ref, kBack, 5, false));
  }
  backend.join();
  EXPECT_EQ(violations, 0);
  // The backend is gone and unmapped everything: revocation must succeed now.
  EXPECT_EQ(mapper_.mapped(), 0u);
  EXPECT_TRUE(granter_.end_access(ref));
  EXPECT_EQ(flags_of(table_, ref), 0);
  // Informational: how often each side won.
  RecordProperty("maps_ok", maps_ok);
  RecordProperty("revoked", static_cast<int>(revoked));
  RecordProperty("refused", static_cast<int>(refused));
}

}  // namespace
}  // namespace xpv::gnttab::test
