// Two threads on one ring, as a frontend and a backend run in different processes: sequence
// numbers must arrive in order, none lost or duplicated, and with event-driven sleeping no wake-up
// may be lost. Every loop is bounded in count and by a deadline (a stuck exchange fails the test
// instead of hanging it); nothing asserts on speed.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <semaphore>
#include <string>
#include <thread>

#include "test_pages.h"
#include "xpv/ring/blkif.h"
#include "xpv/ring/netif.h"
#include "xpv/ring/xenstore.h"

namespace xpv::ring {
namespace {

using test::Pages;
using Clock = std::chrono::steady_clock;
// Far beyond what the exchange needs even under ASan on a loaded machine: only a hang reaches it.
constexpr auto kDeadline = std::chrono::seconds(120);
constexpr auto kWakeupTimeout = std::chrono::seconds(20);

// Collected by a worker thread, asserted by the test thread.
struct Outcome {
  std::atomic<bool> failed{false};
  std::string what;  // written only by the thread that set `failed` first
  void fail(std::string w) {
    bool expected = false;
    if (failed.compare_exchange_strong(expected, true)) what = std::move(w);
  }
};

TEST(RingThreads, SpinPollingExchanges200kRequestsInOrder) {
  constexpr std::uint64_t kN = 200'000;
  Pages page(1);
  auto f = BlkifFrontRing::init(page.span());
  auto b = BlkifBackRing::attach(page.span());
  ASSERT_TRUE(f && b);
  BlkifFrontRing front = std::move(*f);
  BlkifBackRing back = std::move(*b);
  Outcome out;
  const auto deadline = Clock::now() + kDeadline;
  std::uint64_t front_received = 0, back_served = 0;

  std::thread backend([&] {
    while (back_served < kN && !out.failed) {
      unsigned batch = 0;
      for (;;) {
        auto r = back.pop_request();
        if (!r) {
          if (r.error() != RingError::empty) out.fail(std::string("back: ") + to_string(r.error()));
          break;
        }
        if (r->id != back_served || r->sector_number != r->id * 8 || r->seg[0].gref != (r->id & 0xffff)) {
          out.fail("back: request out of order or corrupted at " + std::to_string(back_served));
          return;
        }
        ++back_served;
        if (!back.produce_response({r->id, r->operation, 0, static_cast<std::int16_t>(r->id % 3), {}})) {
          out.fail("back: no response slot");
          return;
        }
        ++batch;
      }
      if (batch > 0) {
        back.push_responses();
      } else {
        if (Clock::now() > deadline) return out.fail("back: deadline");
        std::this_thread::yield();
      }
    }
  });

  std::uint64_t sent = 0;
  while (front_received < kN && !out.failed) {
    bool progress = false;
    while (sent < kN && !front.full()) {
      BlkifRequest r{};
      r.operation = kBlkifOpWrite;
      r.nr_segments = 1;
      r.id = sent;
      r.sector_number = sent * 8;
      r.seg[0].gref = static_cast<GrantRef>(sent & 0xffff);
      if (!front.produce_request(r)) break;
      ++sent;
      progress = true;
    }
    if (progress) front.push_requests();
    for (;;) {
      auto rsp = front.pop_response();
      if (!rsp) {
        if (rsp.error() != RingError::empty) out.fail(std::string("front: ") + to_string(rsp.error()));
        break;
      }
      if (rsp->id != front_received || rsp->status != static_cast<std::int16_t>(rsp->id % 3)) {
        out.fail("front: response out of order at " + std::to_string(front_received));
        break;
      }
      ++front_received;
      progress = true;
    }
    if (!progress) {
      if (Clock::now() > deadline) out.fail("front: deadline");
      std::this_thread::yield();
    }
  }
  backend.join();
  ASSERT_FALSE(out.failed) << out.what;
  EXPECT_EQ(back_served, kN);
  EXPECT_EQ(front_received, kN);
  EXPECT_EQ(front.outstanding(), 0u);
  EXPECT_EQ(front.rsp_cons(), static_cast<RingIdx>(kN));
}

// Both sides sleep on a semaphore (standing in for an event channel) whenever the final check
// says there is nothing to do, and are woken only when the peer's push says "notify". A wrong
// event-index rule or a missing fence shows up as a lost wake-up (a timed-out wait).
TEST(RingThreads, EventDrivenExchangeLosesNoWakeups) {
  constexpr std::uint32_t kN = 100'000;
  Pages page(1);
  auto f = NetifTxFrontRing::init(page.span());
  auto b = NetifTxBackRing::attach(page.span());
  ASSERT_TRUE(f && b);
  NetifTxFrontRing front = std::move(*f);
  NetifTxBackRing back = std::move(*b);
  std::counting_semaphore<1 << 30> to_back{0}, to_front{0};
  std::atomic<bool> done{false};
  Outcome out;
  std::uint64_t back_pushes = 0, back_notifies = 0, front_pushes = 0, front_notifies = 0;
  std::uint32_t served = 0;

  std::thread backend([&] {
    while (served < kN && !out.failed) {
      unsigned batch = 0;
      const unsigned max_batch = 1 + served % 23;
      while (batch < max_batch) {
        auto r = back.pop_request();
        if (!r) {
          if (r.error() != RingError::empty) return out.fail("back: protocol error");
          break;
        }
        if (r->id != static_cast<std::uint16_t>(served) || r->size != 60 + served % 1400) {
          return out.fail("back: request out of order at " + std::to_string(served));
        }
        ++served;
        if (!back.produce_response({r->id, kNetifRspOkay})) return out.fail("back: no slot");
        ++batch;
      }
      if (batch > 0) {
        ++back_pushes;
        if (back.push_responses()) {
          ++back_notifies;
          to_front.release();
        }
        continue;
      }
      auto more = back.final_check_for_requests();
      if (!more) return out.fail("back: final check failed");
      if (*more) continue;
      if (!to_back.try_acquire_for(kWakeupTimeout)) return out.fail("back: lost wake-up");
    }
  });

  std::uint32_t sent = 0, received = 0;
  while (received < kN && !out.failed) {
    bool produced = false;
    // Pushes of 1..37 requests (and answers in batches of 1..23 below) vary how the two sides'
    // pushes and final checks interleave.
    const std::uint32_t batch_end = sent + 1 + sent % 37;
    while (sent < kN && sent < batch_end && !front.full()) {
      NetifTxRequest r{};
      r.gref = sent;
      r.id = static_cast<std::uint16_t>(sent);
      r.size = static_cast<std::uint16_t>(60 + sent % 1400);
      if (!front.produce_request(r)) break;
      ++sent;
      produced = true;
    }
    if (produced) {
      ++front_pushes;
      if (front.push_requests()) {
        ++front_notifies;
        to_back.release();
      }
    }
    bool consumed = false;
    for (;;) {
      auto rsp = front.pop_response();
      if (!rsp) {
        if (rsp.error() != RingError::empty) out.fail("front: protocol error");
        break;
      }
      if (rsp->id != static_cast<std::uint16_t>(received) || rsp->status != kNetifRspOkay) {
        out.fail("front: response out of order at " + std::to_string(received));
        break;
      }
      ++received;
      consumed = true;
    }
    if (consumed || out.failed || received == kN) continue;
    if (sent < kN && !front.full()) continue;  // more to send: no reason to sleep
    auto more = front.final_check_for_responses();
    if (!more) {
      out.fail("front: final check failed");
      break;
    }
    if (*more) continue;
    if (!to_front.try_acquire_for(kWakeupTimeout)) out.fail("front: lost wake-up");
  }
  done = true;
  to_back.release();  // in case the backend sleeps after a failure on this side
  backend.join();
  ASSERT_FALSE(out.failed) << out.what;
  EXPECT_EQ(served, kN);
  EXPECT_EQ(received, kN);
  // Every notify came from a push, and at least the first push of each side notified.
  EXPECT_GE(front_notifies, 1u);
  EXPECT_LE(front_notifies, front_pushes);
  EXPECT_GE(back_notifies, 1u);
  EXPECT_LE(back_notifies, back_pushes);
}

TEST(RingThreads, ByteRingStreamsMegabytesInOrder) {
  constexpr std::size_t kBytes = 4u << 20;
  Pages page(1, 0);
  XenstoreDomainInterface* xs = *xenstore_interface(page.span());
  auto w = xenstore_req_ring(*xs);
  auto r = xenstore_req_ring(*xs);
  ASSERT_TRUE(w && r);
  ByteRing writer = std::move(*w);
  ByteRing reader = std::move(*r);
  auto byte_at = [](std::size_t i) { return static_cast<char>((i * 31) % 251); };
  Outcome out;
  const auto deadline = Clock::now() + kDeadline;

  std::thread producer([&] {
    std::size_t pos = 0;
    char chunk[700];
    while (pos < kBytes && !out.failed) {
      const std::size_t len = std::min<std::size_t>(1 + pos % 700, kBytes - pos);
      for (std::size_t i = 0; i < len; ++i) chunk[i] = byte_at(pos + i);
      auto n = writer.write(std::span<const char>(chunk, len));
      if (!n) return out.fail("writer: protocol error");
      pos += *n;
      if (*n == 0) {
        if (Clock::now() > deadline) return out.fail("writer: deadline");
        std::this_thread::yield();
      }
    }
  });

  std::size_t got = 0;
  char buf[333];
  while (got < kBytes && !out.failed) {
    auto n = reader.read(buf);
    if (!n) {
      out.fail("reader: protocol error");
      break;
    }
    for (std::size_t i = 0; i < *n; ++i) {
      if (buf[i] != byte_at(got + i)) {
        out.fail("reader: wrong byte at " + std::to_string(got + i));
        break;
      }
    }
    got += *n;
    if (*n == 0) {
      if (Clock::now() > deadline) out.fail("reader: deadline");
      std::this_thread::yield();
    }
  }
  producer.join();
  ASSERT_FALSE(out.failed) << out.what;
  EXPECT_EQ(got, kBytes);
  EXPECT_EQ(xs->req_cons, static_cast<std::uint32_t>(kBytes));
}

}  // namespace
}  // namespace xpv::ring
