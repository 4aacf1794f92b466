// Behaviour of FrontRing / BackRing: round trips, index wraparound, the event-index notify rule,
// final checks, full rings, bad peer indexes, copy-out, multi-page rings, span validation.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "test_pages.h"
#include "xpv/ring/blkif.h"
#include "xpv/ring/netif.h"
#include "xpv/ring/shared_ring.h"

namespace xpv::ring {
namespace {

using test::Pages;

BlkifRequest blk_req(std::uint64_t id) {
  BlkifRequest r{};
  r.operation = kBlkifOpRead;
  r.nr_segments = 1;
  r.handle = 51712;
  r.id = id;
  r.sector_number = id * 8;
  r.seg[0] = {static_cast<GrantRef>(id + 100), 0, 7, {}};
  return r;
}

BlkifResponse blk_rsp(std::uint64_t id, std::int16_t status = kBlkifRspOkay) {
  return BlkifResponse{id, kBlkifOpRead, 0, status, {}};
}

SharedRingHeader* header(const Pages& p) { return reinterpret_cast<SharedRingHeader*>(p.data()); }

// A front and a back ring on the same blkif page(s).
struct BlkPair : ::testing::Test {
  Pages page{1};
  BlkifFrontRing front = std::move(*BlkifFrontRing::init(page.span()));
  BlkifBackRing back = std::move(*BlkifBackRing::attach(page.span()));

  // Front produces and pushes ids [first, first + n); returns the notify decision.
  bool send(std::uint64_t first, unsigned n) {
    for (unsigned i = 0; i < n; ++i) EXPECT_TRUE(front.produce_request(blk_req(first + i)));
    return front.push_requests();
  }
  // Back pops n requests, checks their ids, answers them all and pushes; returns notify.
  bool serve(std::uint64_t first, unsigned n) {
    for (unsigned i = 0; i < n; ++i) {
      auto r = back.pop_request();
      EXPECT_TRUE(r);
      if (!r) return false;
      EXPECT_EQ(r->id, first + i);
      EXPECT_TRUE(back.produce_response(blk_rsp(r->id)));
    }
    return back.push_responses();
  }
  void reap(std::uint64_t first, unsigned n) {
    for (unsigned i = 0; i < n; ++i) {
      auto r = front.pop_response();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->id, first + i);
    }
  }
};

// ---- construction ----

TEST(SharedRing, RejectsSpanTooSmallForOneEntry) {
  Pages p(1);
  auto f = BlkifFrontRing::init(p.span().first(64 + 111));
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error(), RingError::too_small);
  EXPECT_EQ(p.data()[0], 0xa5) << "a refused init must not write the header";
  auto b = BlkifBackRing::attach(p.span().first(63));
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error(), RingError::too_small);
  auto e = NetifTxFrontRing::init(std::span<std::uint8_t>{});
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error(), RingError::too_small);
  // Exactly one entry fits: a ring of one.
  auto one = BlkifFrontRing::init(p.span().first(64 + 112));
  ASSERT_TRUE(one);
  EXPECT_EQ(one->size(), 1u);
}

TEST(SharedRing, RejectsMisalignedSpan) {
  Pages p(2);
  auto f = BlkifFrontRing::init(p.span().subspan(4, 4096));  // blkif entries need 8-byte alignment
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error(), RingError::misaligned);
  auto b = NetifTxBackRing::attach(p.span().subspan(2, 4096));  // indexes need 4
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error(), RingError::misaligned);
  EXPECT_EQ(p.data()[4], 0xa5);
  // 4-byte alignment is enough for netif (its entries are 4-aligned).
  auto ok = NetifTxFrontRing::init(p.span().subspan(4, 4096));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->size(), 256u);
  EXPECT_EQ(BlkifFrontRing::kAlignment, 8u);
  EXPECT_EQ(NetifRxFrontRing::kAlignment, 4u);
}

TEST(SharedRing, SizeIsLargestPowerOfTwoThatFits) {
  Pages p(2);
  auto blk = BlkifFrontRing::init(p.span().first(4096 + 100));
  ASSERT_TRUE(blk);
  EXPECT_EQ(blk->size(), 32u);  // (4196 - 64) / 112 = 36 → 32
  EXPECT_EQ(blk->bytes().size(), 64u + 32u * 112u);
  EXPECT_EQ(blk->bytes().data(), p.data());
  auto tx = NetifTxFrontRing::init(p.span().first(4096));
  ASSERT_TRUE(tx);
  EXPECT_EQ(tx->size(), 256u);
  auto rx = NetifRxBackRing::attach(p.span());
  ASSERT_TRUE(rx);
  EXPECT_EQ(rx->size(), 512u);
}

TEST(SharedRing, InitWritesTheSharedHeader) {
  Pages p(1);
  auto f = BlkifFrontRing::init(p.span());
  ASSERT_TRUE(f);
  const SharedRingHeader* h = header(p);
  EXPECT_EQ(h->req_prod, 0u);
  EXPECT_EQ(h->rsp_prod, 0u);
  EXPECT_EQ(h->req_event, 1u);
  EXPECT_EQ(h->rsp_event, 1u);
  for (auto b : h->pvt) EXPECT_EQ(b, 0u);
  for (auto b : h->pad) EXPECT_EQ(b, 0u);
  EXPECT_EQ(p.data()[64], 0xa5) << "entries are not touched by init";
  EXPECT_EQ(f->free_requests(), 32u);
  EXPECT_FALSE(f->full());

  auto g = BlkifFrontRing::init(p.span(), 0xfffffff0u);
  ASSERT_TRUE(g);
  EXPECT_EQ(h->req_prod, 0xfffffff0u);
  EXPECT_EQ(h->rsp_prod, 0xfffffff0u);
  EXPECT_EQ(h->req_event, 0xfffffff1u);
  EXPECT_EQ(g->req_prod_pvt(), 0xfffffff0u);
  EXPECT_EQ(g->rsp_cons(), 0xfffffff0u);
}

TEST(SharedRing, FrontAttachLeavesTheHeaderAlone) {
  Pages p(1);
  header(p)->req_prod = 77;
  auto f = BlkifFrontRing::attach(p.span(), 77);
  ASSERT_TRUE(f);
  EXPECT_EQ(header(p)->req_event, 0xa5a5a5a5u);
  EXPECT_EQ(f->req_prod_pvt(), 77u);
}

TEST(SharedRing, BackAttachResumesAtTheSharedResponseIndex) {
  Pages p(1);
  auto f = BlkifFrontRing::init(p.span(), 1000);
  ASSERT_TRUE(f);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(f->produce_request(blk_req(i)));
  f->push_requests();
  auto b = BlkifBackRing::attach(p.span());
  ASSERT_TRUE(b);
  EXPECT_EQ(b->req_cons(), 1000u);
  EXPECT_EQ(b->rsp_prod_pvt(), 1000u);
  auto n = b->unconsumed_requests();
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 3u);
  auto r = b->pop_request();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->id, 0u);
}

TEST(SharedRing, BackAttachRefusesABadProducerIndex) {
  Pages p(1);
  auto f = BlkifFrontRing::init(p.span());
  ASSERT_TRUE(f);
  header(p)->req_prod = 33;  // 33 requests outstanding on a 32-entry ring
  auto b = BlkifBackRing::attach(p.span());
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error(), RingError::bad_producer_index);
  header(p)->req_prod = 32;  // a full ring is fine
  EXPECT_TRUE(BlkifBackRing::attach(p.span()));
}

// ---- round trips ----

TEST_F(BlkPair, RequestsAndResponsesRoundTrip) {
  EXPECT_TRUE(send(1, 3));
  auto n = back.unconsumed_requests();
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 3u);
  for (std::uint64_t id = 1; id <= 3; ++id) {
    auto r = back.pop_request();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->operation, kBlkifOpRead);
    EXPECT_EQ(r->nr_segments, 1u);
    EXPECT_EQ(r->handle, 51712u);
    EXPECT_EQ(r->id, id);
    EXPECT_EQ(r->sector_number, id * 8);
    EXPECT_EQ(r->seg[0].gref, id + 100);
    EXPECT_EQ(r->seg[0].last_sect, 7u);
    EXPECT_EQ(back.unanswered(), 1u);
    ASSERT_TRUE(back.produce_response(blk_rsp(id, id == 2 ? kBlkifRspError : kBlkifRspOkay)));
  }
  EXPECT_EQ(front.outstanding(), 3u);
  EXPECT_TRUE(back.push_responses());
  auto m = front.unconsumed_responses();
  ASSERT_TRUE(m);
  EXPECT_EQ(*m, 3u);
  for (std::uint64_t id = 1; id <= 3; ++id) {
    auto r = front.pop_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->id, id);
    EXPECT_EQ(r->operation, kBlkifOpRead);
    EXPECT_EQ(r->status, id == 2 ? kBlkifRspError : kBlkifRspOkay);
  }
  EXPECT_EQ(front.outstanding(), 0u);
  EXPECT_EQ(front.free_requests(), 32u);
}

TEST_F(BlkPair, RequestsLandInTheirSlotsInSharedMemory) {
  send(7, 2);
  BlkifRequest in_slot1;
  std::memcpy(&in_slot1, page.data() + 64 + 112, sizeof(in_slot1));
  EXPECT_EQ(in_slot1.id, 8u);
  EXPECT_EQ(header(page)->req_prod, 2u);
  serve(7, 2);
  BlkifResponse rsp_slot0;
  std::memcpy(&rsp_slot0, page.data() + 64, sizeof(rsp_slot0));
  EXPECT_EQ(rsp_slot0.id, 7u);
  EXPECT_EQ(header(page)->rsp_prod, 2u);
}

TEST_F(BlkPair, EmptyRingsReportEmptyNotAProtocolError) {
  auto r = back.pop_request();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), RingError::empty);
  EXPECT_FALSE(is_protocol_error(r.error()));
  auto s = front.pop_response();
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error(), RingError::empty);
  EXPECT_FALSE(back.broken());
  EXPECT_FALSE(front.broken());
  EXPECT_TRUE(is_protocol_error(RingError::bad_producer_index));
  EXPECT_TRUE(is_protocol_error(RingError::bad_consumer_index));
  EXPECT_FALSE(is_protocol_error(RingError::full));
}

TEST_F(BlkPair, ProducedRequestsAreInvisibleUntilPushed) {
  ASSERT_TRUE(front.produce_request(blk_req(1)));
  auto n = back.unconsumed_requests();
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 0u);
  EXPECT_EQ(back.pop_request().error(), RingError::empty);
  front.push_requests();
  n = back.unconsumed_requests();
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 1u);
}

TEST_F(BlkPair, FullRingRefusesAnotherRequest) {
  for (unsigned i = 0; i < 32; ++i) ASSERT_TRUE(front.produce_request(blk_req(i)));
  EXPECT_TRUE(front.full());
  EXPECT_EQ(front.free_requests(), 0u);
  auto r = front.produce_request(blk_req(99));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), RingError::full);
  front.push_requests();
  // Consuming alone frees nothing: the slot is needed for the response.
  ASSERT_TRUE(back.pop_request());
  EXPECT_TRUE(front.full());
  ASSERT_TRUE(back.produce_response(blk_rsp(0)));
  back.push_responses();
  EXPECT_TRUE(front.full());  // not until the front end consumes the response
  ASSERT_TRUE(front.pop_response());
  EXPECT_EQ(front.free_requests(), 1u);
  EXPECT_TRUE(front.produce_request(blk_req(32)));
}

TEST_F(BlkPair, BackCannotAnswerMoreThanItConsumed) {
  auto r = back.produce_response(blk_rsp(1));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), RingError::full);
  send(1, 1);
  ASSERT_TRUE(back.pop_request());
  EXPECT_TRUE(back.produce_response(blk_rsp(1)));
  EXPECT_EQ(back.produce_response(blk_rsp(2)).error(), RingError::full);
}

TEST(SharedRing, FreeRunningIndexesWrapPastUint32Max) {
  Pages p(1);
  const RingIdx start = 0xffffffffu - 40;
  auto front = BlkifFrontRing::init(p.span(), start);
  ASSERT_TRUE(front);
  auto back = BlkifBackRing::attach(p.span());
  ASSERT_TRUE(back);
  ASSERT_EQ(back->req_cons(), start);
  std::uint64_t next = 0, expect_req = 0, expect_rsp = 0;
  for (int round = 0; round < 50; ++round) {  // 50 x 7 = 350 crosses 2^32 and the 32-slot ring
    for (int i = 0; i < 7; ++i) ASSERT_TRUE(front->produce_request(blk_req(next++)));
    front->push_requests();
    auto n = back->unconsumed_requests();
    ASSERT_TRUE(n) << round;
    ASSERT_EQ(*n, 7u);
    for (int i = 0; i < 7; ++i) {
      auto r = back->pop_request();
      ASSERT_TRUE(r);
      ASSERT_EQ(r->id, expect_req++);
      ASSERT_TRUE(back->produce_response(blk_rsp(r->id)));
    }
    back->push_responses();
    for (int i = 0; i < 7; ++i) {
      auto r = front->pop_response();
      ASSERT_TRUE(r) << round;
      ASSERT_EQ(r->id, expect_rsp++);
    }
  }
  EXPECT_EQ(front->rsp_cons(), static_cast<RingIdx>(start + 350));
  EXPECT_LT(front->rsp_cons(), start) << "the index wrapped";
  EXPECT_EQ(header(p)->req_prod, static_cast<RingIdx>(start + 350));
}

TEST(SharedRing, FullRingAcrossTheIndexWrap) {
  Pages p(1);
  auto front = BlkifFrontRing::init(p.span(), 0xfffffff0u);
  auto back = BlkifBackRing::attach(p.span());
  ASSERT_TRUE(front && back);
  for (unsigned i = 0; i < 32; ++i) ASSERT_TRUE(front->produce_request(blk_req(i)));
  EXPECT_TRUE(front->full());
  front->push_requests();
  EXPECT_EQ(header(p)->req_prod, 0x10u);
  auto n = back->unconsumed_requests();
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 32u);
}

// ---- the event-index notify rule ----

TEST_F(BlkPair, FirstPushNotifiesAFreshBackEnd) {
  EXPECT_EQ(header(page)->req_event, 1u);
  EXPECT_TRUE(send(0, 1));
}

TEST_F(BlkPair, SecondPushDoesNotNotifyABackEndThatHasNotLooked) {
  EXPECT_TRUE(send(0, 2));
  EXPECT_FALSE(send(2, 2));  // req_event still 1: the back end knows there is work
  EXPECT_FALSE(send(4, 5));
}

TEST_F(BlkPair, PushOfNothingNeverNotifies) {
  EXPECT_FALSE(front.push_requests());
  EXPECT_FALSE(back.push_responses());
}

TEST_F(BlkPair, FinalCheckReArmsTheEventIndex) {
  send(0, 3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(back.pop_request());
  auto more = back.final_check_for_requests();
  ASSERT_TRUE(more);
  EXPECT_FALSE(*more);
  EXPECT_EQ(header(page)->req_event, 4u);  // req_cons + 1
  EXPECT_TRUE(send(3, 1));   // passes req_event 4
  EXPECT_FALSE(send(4, 1));  // back end has not re-armed
}

TEST_F(BlkPair, FinalCheckWithWorkPendingLeavesTheEventAlone) {
  send(0, 2);
  header(page)->req_event = 1;
  auto more = back.final_check_for_requests();
  ASSERT_TRUE(more);
  EXPECT_TRUE(*more);
  EXPECT_EQ(header(page)->req_event, 1u);
}

TEST_F(BlkPair, FinalCheckSeesWorkThatArrivedBeforeTheReArm) {
  // Back end drained; the front end pushes without a notify (event stale); the back end's final
  // check must then report work instead of letting it sleep.
  send(0, 1);
  ASSERT_TRUE(back.pop_request());
  EXPECT_FALSE(send(1, 1));  // req_event is still 1: no notify
  auto more = back.final_check_for_requests();
  ASSERT_TRUE(more);
  EXPECT_TRUE(*more);
}

TEST_F(BlkPair, PeerEventIndexAheadBatchesNotifications) {
  // A back end that wants one notify per 4 requests sets req_event = req_cons + 4.
  header(page)->req_event = 4;
  EXPECT_FALSE(send(0, 2));  // prod 2
  EXPECT_FALSE(send(2, 1));  // prod 3
  EXPECT_TRUE(send(3, 2));   // prod 5: passes 4
  EXPECT_FALSE(send(5, 1));
}

TEST_F(BlkPair, ResponsesFollowTheSameRule) {
  send(0, 4);
  EXPECT_TRUE(serve(0, 2));   // rsp_event 1 (init) lies in (0, 2]
  EXPECT_FALSE(serve(2, 2));  // the front end has not re-armed
  reap(0, 4);
  auto more = front.final_check_for_responses();
  ASSERT_TRUE(more);
  EXPECT_FALSE(*more);
  EXPECT_EQ(header(page)->rsp_event, 5u);
  send(4, 1);
  EXPECT_TRUE(serve(4, 1));
}

TEST(SharedRing, NotifyRuleAcrossTheIndexWrap) {
  Pages p(1);
  auto front = BlkifFrontRing::init(p.span(), 0xfffffffeu);  // req_event = 0xffffffff
  auto back = BlkifBackRing::attach(p.span());
  ASSERT_TRUE(front && back);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(front->produce_request(blk_req(i)));
  EXPECT_TRUE(front->push_requests());  // 0xfffffffe → 2 passes 0xffffffff
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(back->pop_request());
  auto more = back->final_check_for_requests();
  ASSERT_TRUE(more && !*more);
  EXPECT_EQ(header(p)->req_event, 3u);
  ASSERT_TRUE(front->produce_request(blk_req(4)));
  EXPECT_TRUE(front->push_requests());  // 2 → 3
  // An event index far behind (stale, wrapped) does not notify.
  header(p)->req_event = 0xfffffff0u;
  ASSERT_TRUE(front->produce_request(blk_req(5)));
  EXPECT_FALSE(front->push_requests());
}

// ---- bad peer indexes ----

TEST_F(BlkPair, ProducerIndexBeyondRingSizeIsAProtocolError) {
  send(0, 2);
  std::vector<std::uint8_t> before(page.data(), page.data() + page.size());
  header(page)->req_prod = 33;  // 33 outstanding on a 32-entry ring
  before[0] = 33;               // (the only byte the test itself changed)
  auto n = back.unconsumed_requests();
  ASSERT_FALSE(n);
  EXPECT_EQ(n.error(), RingError::bad_producer_index);
  auto r = back.pop_request();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), RingError::bad_producer_index);
  EXPECT_EQ(back.req_cons(), 0u);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), page.data())) << "shared memory touched";
}

TEST_F(BlkPair, ProtocolErrorIsSticky) {
  header(page)->req_prod = 0x80000000u;
  EXPECT_EQ(back.pop_request().error(), RingError::bad_producer_index);
  EXPECT_TRUE(back.broken());
  header(page)->req_prod = 1;  // "fixed" by the guest: too late
  EXPECT_EQ(back.unconsumed_requests().error(), RingError::bad_producer_index);
  EXPECT_EQ(back.final_check_for_requests().error(), RingError::bad_producer_index);
  EXPECT_EQ(back.produce_response(blk_rsp(0)).error(), RingError::bad_producer_index);
  EXPECT_FALSE(back.push_responses());
  EXPECT_EQ(header(page)->rsp_prod, 0u);
}

TEST_F(BlkPair, ProducerIndexMovingBackwardsIsAProtocolError) {
  send(0, 5);
  ASSERT_TRUE(back.unconsumed_requests());
  ASSERT_TRUE(back.pop_request());
  ASSERT_TRUE(back.pop_request());
  header(page)->req_prod = 3;  // was 5: requests 3 and 4 "withdrawn"
  EXPECT_EQ(back.unconsumed_requests().error(), RingError::bad_producer_index);
  // And below req_cons too.
  BlkifFrontRing f2 = std::move(*BlkifFrontRing::init(page.span()));
  BlkifBackRing b2 = std::move(*BlkifBackRing::attach(page.span()));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(f2.produce_request(blk_req(i)));
  f2.push_requests();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(b2.pop_request());
  header(page)->req_prod = 1;
  EXPECT_EQ(b2.pop_request().error(), RingError::bad_producer_index);
}

TEST_F(BlkPair, UnansweredRequestsCountAgainstTheRingSize) {
  // RING_REQUEST_PROD_OVERFLOW: req_prod - req_cons <= size is not enough; the back end still owes
  // responses to what it consumed, so req_prod - rsp_prod_pvt must stay <= size.
  send(0, 5);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(back.pop_request());
  header(page)->req_prod = 5 + 32;  // 32 new + 5 unanswered > 32
  EXPECT_EQ(back.unconsumed_requests().error(), RingError::bad_producer_index);
}

TEST_F(BlkPair, ExactlyFullIsNotAnError) {
  header(page)->req_prod = 32;
  auto n = back.unconsumed_requests();
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 32u);
}

TEST_F(BlkPair, ResponseProducerBeyondPushedRequestsIsAProtocolError) {
  send(0, 2);
  ASSERT_TRUE(front.produce_request(blk_req(2)));  // produced, not pushed
  header(page)->rsp_prod = 3;  // answers a request the back end cannot have seen
  auto n = front.unconsumed_responses();
  ASSERT_FALSE(n);
  EXPECT_EQ(n.error(), RingError::bad_producer_index);
  EXPECT_TRUE(front.broken());
  EXPECT_EQ(front.pop_response().error(), RingError::bad_producer_index);
  EXPECT_EQ(front.produce_request(blk_req(3)).error(), RingError::bad_producer_index);
  EXPECT_EQ(front.final_check_for_responses().error(), RingError::bad_producer_index);
  EXPECT_FALSE(front.push_requests());
  EXPECT_EQ(header(page)->req_prod, 2u) << "a broken ring publishes nothing";
}

TEST_F(BlkPair, ResponseProducerMovingBackwardsIsAProtocolError) {
  send(0, 4);
  serve(0, 3);
  reap(0, 3);  // responses up to the validated rsp_prod (3) are consumed from that snapshot
  header(page)->rsp_prod = 2;  // withdraws a response already consumed
  EXPECT_EQ(front.pop_response().error(), RingError::bad_producer_index);
  BlkifFrontRing f2 = std::move(*BlkifFrontRing::init(page.span()));
  BlkifBackRing b2 = std::move(*BlkifBackRing::attach(page.span()));
  ASSERT_TRUE(f2.produce_request(blk_req(0)));
  f2.push_requests();
  ASSERT_TRUE(b2.pop_request());
  ASSERT_TRUE(b2.produce_response(blk_rsp(0)));
  b2.push_responses();
  header(page)->rsp_prod = 0xffffffffu;  // behind rsp_cons (0): 2^32 - 1 "responses"
  EXPECT_EQ(f2.unconsumed_responses().error(), RingError::bad_producer_index);
}

TEST(SharedRing, RandomPeerIndexesNeverEscapeTheRing) {
  // A hostile front end writes arbitrary indexes; the back ring either hands out at most `size`
  // requests (all inside the span: ASan would catch a stray read) or reports the protocol error.
  Pages p(1);
  std::mt19937 rng(12345);
  unsigned refused = 0, accepted = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    auto* h = header(p);
    const RingIdx base = rng();
    h->rsp_prod = base;
    // Half near the valid window, half anywhere.
    h->req_prod = (iter % 2) ? base + static_cast<RingIdx>(rng() % 70) : static_cast<RingIdx>(rng());
    auto back = BlkifBackRing::attach(p.span());
    if (!back) {
      EXPECT_EQ(back.error(), RingError::bad_producer_index);
      EXPECT_GT(static_cast<RingIdx>(h->req_prod - base), 32u);
      ++refused;
      continue;
    }
    ++accepted;
    unsigned popped = 0;
    for (int i = 0; i < 40; ++i) {
      if (i == 20) h->req_prod = static_cast<RingIdx>(rng());  // changes its mind mid-batch
      auto r = back->pop_request();
      if (!r) {
        EXPECT_TRUE(r.error() == RingError::empty || r.error() == RingError::bad_producer_index);
        break;
      }
      ++popped;
    }
    EXPECT_LE(popped, 32u);
    EXPECT_LE(back->unanswered(), back->size());
  }
  EXPECT_GT(refused, 0u);
  EXPECT_GT(accepted, 0u);
}

TEST(SharedRing, ReattachedBackEndRedeliversUnansweredRequests) {
  // A back end that consumed requests and died before answering: its successor attaches at the
  // shared rsp_prod and sees those requests again (nothing acknowledged is lost).
  Pages p(1);
  auto front = BlkifFrontRing::init(p.span());
  ASSERT_TRUE(front);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(front->produce_request(blk_req(i)));
  front->push_requests();
  {
    auto old_back = BlkifBackRing::attach(p.span());
    ASSERT_TRUE(old_back);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(old_back->pop_request());
    ASSERT_TRUE(old_back->produce_response(blk_rsp(0)));
    ASSERT_TRUE(old_back->produce_response(blk_rsp(1)));
    old_back->push_responses();  // answered 0 and 1; 2 and 3 consumed, never answered
  }
  auto back = BlkifBackRing::attach(p.span());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->req_cons(), 2u);
  auto n = back->unconsumed_requests();
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 4u);
  for (std::uint64_t id = 2; id < 6; ++id) {
    auto r = back->pop_request();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->id, id);
  }
}

TEST(SharedRing, AReattachedBackEndSeesWhetherTheFrontEndWaitsForAPublishedResponse) {
  // The notification a dead back end may have owed: the front end armed rsp_event and went to
  // sleep; the back end published a response and died before notifying.
  Pages p(1);
  auto front = BlkifFrontRing::init(p.span(), 0xfffffffeu);  // across the index wrap
  ASSERT_TRUE(front);
  EXPECT_FALSE(BlkifBackRing::attach(p.span())->response_event_passed()) << "a fresh ring owes nothing";
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(front->produce_request(blk_req(i)));
  front->push_requests();
  auto fc = front->final_check_for_responses();  // asleep: rsp_event = rsp_cons + 1
  ASSERT_TRUE(fc);
  ASSERT_FALSE(*fc);
  {
    auto dead = BlkifBackRing::attach(p.span());
    ASSERT_TRUE(dead);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(dead->pop_request());
      ASSERT_TRUE(dead->produce_response(blk_rsp(i)));
    }
    EXPECT_FALSE(dead->response_event_passed()) << "produced, not published";
    ASSERT_TRUE(dead->push_responses());  // ... and died before the notification
  }
  EXPECT_EQ(header(p)->rsp_prod, 0u) << "published across the wrap";
  EXPECT_EQ(header(p)->rsp_event, 0xffffffffu);
  auto back = BlkifBackRing::attach(p.span());
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->response_event_passed());
  // A front end that consumed the responses and slept again is owed nothing.
  ASSERT_TRUE(front->pop_response());
  ASSERT_TRUE(front->pop_response());
  fc = front->final_check_for_responses();
  ASSERT_TRUE(fc);
  ASSERT_FALSE(*fc);
  EXPECT_FALSE(back->response_event_passed());
  // Nor is one that asked to be told later (an event index ahead of rsp_prod), nor an index a
  // ring or more behind, which no consuming front end leaves there.
  header(p)->rsp_event = header(p)->rsp_prod + 2;
  EXPECT_FALSE(back->response_event_passed());
  header(p)->rsp_event = header(p)->rsp_prod - back->size();
  EXPECT_FALSE(back->response_event_passed());
  header(p)->rsp_event = header(p)->rsp_prod - back->size() + 1;
  EXPECT_TRUE(back->response_event_passed());
}

// ---- copy-out semantics ----

TEST_F(BlkPair, PoppedRequestIsACopy) {
  send(5, 1);
  auto r = back.pop_request();
  ASSERT_TRUE(r);
  const BlkifRequest copy = *r;
  // The guest rewrites the slot after the back end validated it.
  BlkifRequest evil = blk_req(666);
  evil.nr_segments = 200;
  std::memcpy(page.data() + 64, &evil, sizeof(evil));
  EXPECT_EQ(r->id, 5u);
  EXPECT_EQ(r->nr_segments, 1u);
  EXPECT_EQ(std::memcmp(&copy, &*r, sizeof(copy)), 0);
}

TEST_F(BlkPair, PoppedResponseIsACopy) {
  send(9, 1);
  serve(9, 1);
  auto r = front.pop_response();
  ASSERT_TRUE(r);
  BlkifResponse evil = blk_rsp(1234, kBlkifRspError);
  std::memcpy(page.data() + 64, &evil, sizeof(evil));
  EXPECT_EQ(r->id, 9u);
  EXPECT_EQ(r->status, kBlkifRspOkay);
}

// ---- multi-page rings and other ring types ----

TEST(SharedRing, MultiPageBlkifRingsUseEverySlot) {
  for (unsigned order = 0; order <= 8; ++order) {
    Pages p(std::size_t{1} << order);
    auto front = BlkifFrontRing::init(p.span());
    auto back = BlkifBackRing::attach(p.span());
    ASSERT_TRUE(front && back) << order;
    const RingIdx n = RingIdx{32} << order;
    ASSERT_EQ(front->size(), n) << order;
    ASSERT_EQ(back->size(), n) << order;
    for (int round = 0; round < 2; ++round) {  // the second round reuses every slot
      for (RingIdx i = 0; i < n; ++i) ASSERT_TRUE(front->produce_request(blk_req(round * n + i)));
      EXPECT_TRUE(front->full());
      front->push_requests();
      for (RingIdx i = 0; i < n; ++i) {
        auto r = back->pop_request();
        ASSERT_TRUE(r) << order;
        ASSERT_EQ(r->id, round * n + i);
        ASSERT_TRUE(back->produce_response(blk_rsp(r->id)));
      }
      back->push_responses();
      for (RingIdx i = 0; i < n; ++i) {
        auto r = front->pop_response();
        ASSERT_TRUE(r);
        ASSERT_EQ(r->id, round * n + i);
      }
    }
  }
}

TEST(SharedRing, NetifRxRingRoundTrip) {
  Pages p(1);
  auto front = NetifRxFrontRing::init(p.span());
  auto back = NetifRxBackRing::attach(p.span());
  ASSERT_TRUE(front && back);
  ASSERT_EQ(front->size(), 256u);
  for (std::uint16_t i = 0; i < 256; ++i) ASSERT_TRUE(front->produce_request({i, 0, 500u + i}));
  EXPECT_TRUE(front->push_requests());
  for (std::uint16_t i = 0; i < 256; ++i) {
    auto r = back->pop_request();
    ASSERT_TRUE(r);
    ASSERT_EQ(r->gref, 500u + i);
    ASSERT_TRUE(back->produce_response({r->id, 0, kNetrxfDataValidated, 1514}));
  }
  EXPECT_TRUE(back->push_responses());
  for (std::uint16_t i = 0; i < 256; ++i) {
    auto r = front->pop_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->id, i);
    EXPECT_EQ(r->status, 1514);
  }
}

TEST(SharedRing, NetifExtraInfoTravelsInATxRequestSlot) {
  Pages p(1);
  auto front = NetifTxFrontRing::init(p.span());
  auto back = NetifTxBackRing::attach(p.span());
  ASSERT_TRUE(front && back);
  ASSERT_TRUE(front->produce_request({11, 0, kNettxfExtraInfo | kNettxfCsumBlank, 1, 9000}));
  NetifExtraInfo gso{};
  gso.type = kXenNetifExtraTypeGso;
  gso.u.gso.size = 1448;
  gso.u.gso.type = kXenNetifGsoTypeTcpv4;
  ASSERT_TRUE(front->produce_request(netif_extra_to_tx(gso)));
  front->push_requests();
  auto first = back->pop_request();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->flags, kNettxfExtraInfo | kNettxfCsumBlank);
  auto slot = back->pop_request();
  ASSERT_TRUE(slot);
  NetifExtraInfo e = netif_extra_from_tx(*slot);
  EXPECT_EQ(e.type, kXenNetifExtraTypeGso);
  EXPECT_EQ(e.flags, 0u);
  EXPECT_EQ(e.u.gso.size, 1448u);
  EXPECT_EQ(e.u.gso.type, kXenNetifGsoTypeTcpv4);
  // And through an rx response slot.
  NetifRxResponse rs = netif_extra_to_rx(gso);
  EXPECT_EQ(netif_extra_from_rx(rs).u.gso.size, 1448u);
}

TEST(SharedRing, BlkifLayoutsTravelInARequestSlot) {
  Pages p(1);
  auto front = BlkifFrontRing::init(p.span());
  auto back = BlkifBackRing::attach(p.span());
  ASSERT_TRUE(front && back);
  BlkifRequestDiscard d{};
  d.operation = kBlkifOpDiscard;
  d.flag = kBlkifDiscardSecure;
  d.id = 42;
  d.sector_number = 2048;
  d.nr_sectors = 4096;
  BlkifRequestIndirect ind{};
  ind.operation = kBlkifOpIndirect;
  ind.indirect_op = kBlkifOpWrite;
  ind.nr_segments = 600;
  ind.id = 43;
  ind.handle = 5;
  ind.indirect_grefs[0] = 70;
  ind.indirect_grefs[1] = 71;
  BlkifRequestOther o{};
  o.operation = kBlkifOpFlushDiskcache;
  o.id = 44;
  ASSERT_TRUE(front->produce_request(blkif_pack(d)));
  ASSERT_TRUE(front->produce_request(blkif_pack(ind)));
  ASSERT_TRUE(front->produce_request(blkif_pack(o)));
  front->push_requests();

  auto r1 = back->pop_request();
  ASSERT_TRUE(r1);
  ASSERT_EQ(r1->operation, kBlkifOpDiscard);
  auto d2 = blkif_view<BlkifRequestDiscard>(*r1);
  EXPECT_EQ(d2.flag, kBlkifDiscardSecure);
  EXPECT_EQ(d2.id, 42u);
  EXPECT_EQ(d2.sector_number, 2048u);
  EXPECT_EQ(d2.nr_sectors, 4096u);
  auto r2 = back->pop_request();
  ASSERT_TRUE(r2);
  ASSERT_EQ(r2->operation, kBlkifOpIndirect);
  auto i2 = blkif_view<BlkifRequestIndirect>(*r2);
  EXPECT_EQ(i2.indirect_op, kBlkifOpWrite);
  EXPECT_EQ(i2.nr_segments, 600u);
  EXPECT_EQ(blkif_indirect_pages(i2.nr_segments), 2u);
  EXPECT_EQ(i2.handle, 5u);
  EXPECT_EQ(i2.indirect_grefs[1], 71u);
  auto r3 = back->pop_request();
  ASSERT_TRUE(r3);
  EXPECT_EQ(blkif_view<BlkifRequestOther>(*r3).id, 44u);
  EXPECT_EQ(r3->id, 44u) << "id is at the same offset in every layout";
}

TEST(SharedRing, MovedRingKeepsItsState) {
  Pages p(1);
  auto front = BlkifFrontRing::init(p.span());
  auto back = BlkifBackRing::attach(p.span());
  ASSERT_TRUE(front && back);
  ASSERT_TRUE(front->produce_request(blk_req(1)));
  BlkifFrontRing moved = std::move(*front);
  EXPECT_EQ(moved.req_prod_pvt(), 1u);
  EXPECT_TRUE(moved.push_requests());
  BlkifBackRing bmoved = std::move(*back);
  auto r = bmoved.pop_request();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->id, 1u);
}

TEST(SharedRing, ErrorNamesAreDistinct) {
  const RingError all[] = {RingError::too_small, RingError::misaligned, RingError::bad_size,
                           RingError::bad_producer_index, RingError::bad_consumer_index,
                           RingError::full, RingError::empty};
  for (RingError a : all) {
    EXPECT_STRNE(to_string(a), "unknown ring error");
    for (RingError b : all) {
      if (a != b) {
        EXPECT_STRNE(to_string(a), to_string(b));
      }
    }
  }
}

}  // namespace
}  // namespace xpv::ring
