// RxFlowQueue alone: frames go in through the iovecs a readv would fill and come out in flow
// order, byte for byte; overflow drops from the fattest flow.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "xpv/netback/rx_flow_queue.h"

namespace xpv::netback {
namespace {

constexpr std::size_t kMax = 17 * 4096;

// An IPv4/TCP frame of `len` bytes from source port `sport`; byte i of the payload is (i + tag).
std::vector<std::uint8_t> frame(std::uint16_t sport, std::size_t len, std::uint8_t tag = 0) {
  std::vector<std::uint8_t> f(len);
  for (std::size_t i = 0; i < len; ++i) f[i] = static_cast<std::uint8_t>(i + tag);
  f[12] = 0x08, f[13] = 0x00;                  // IPv4
  f[14] = 0x45, f[20] = 0, f[21] = 0;          // ihl 5, not a fragment
  f[23] = 6;                                   // TCP
  f[26] = 10, f[27] = 0, f[28] = 0, f[29] = 1; // 10.0.0.1 → 10.0.0.2
  f[30] = 10, f[31] = 0, f[32] = 0, f[33] = 2;
  f[34] = static_cast<std::uint8_t>(sport >> 8), f[35] = static_cast<std::uint8_t>(sport);
  f[36] = 0x14, f[37] = 0x51;                  // 5201
  return f;
}

// What a readv of `f` (with vnet header `h`) into the queue's iovecs does.
void push(RxFlowQueue& q, const std::vector<std::uint8_t>& f, VnetHdr h = {}) {
  q.make_room();
  const auto iov = q.ingress_iov();
  std::size_t left = sizeof h + f.size(), done = 0;
  const auto* src = reinterpret_cast<const std::uint8_t*>(&h);
  for (const iovec& v : iov) {
    const std::size_t n = std::min(v.iov_len, left);
    for (std::size_t i = 0; i < n; ++i, ++done) {
      static_cast<std::uint8_t*>(v.iov_base)[i] = done < sizeof h ? src[done] : f[done - sizeof h];
    }
    left -= n;
    if (left == 0) break;
  }
  ASSERT_EQ(left, 0u) << "the iovecs hold a largest frame";
  q.commit(sizeof h + f.size());
}

// The source port of the packet front() names, and pop() it.
std::uint16_t pop_port(RxFlowQueue& q) {
  const auto* p = q.front();
  if (p == nullptr) return 0;
  std::uint8_t hdr[36];
  q.copy(*p, 0, hdr);
  q.pop();
  return static_cast<std::uint16_t>(hdr[34] << 8 | hdr[35]);
}

RxFlowConfig small_pool(std::size_t bytes) {
  RxFlowConfig c;
  c.pool_bytes = bytes;
  c.seed = 12345;
  return c;
}

TEST(RxFlowQueue, AFrameComesOutByteForByteAcrossChunks) {
  RxFlowQueue q({}, kMax);
  VnetHdr h{};
  h.gso_type = kVnetGsoTcpv4;
  h.gso_size = 1448;
  const auto f = frame(1000, 9000, 3);
  push(q, f, h);
  EXPECT_EQ(q.packets(), 1u);
  EXPECT_EQ(q.bytes(), 9000u);
  const auto* p = q.front();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->len, 9000u);
  EXPECT_EQ(p->vnet.gso_type, kVnetGsoTcpv4);
  EXPECT_EQ(p->vnet.gso_size, 1448);
  std::vector<std::uint8_t> out(9000);
  q.copy(*p, 0, out);  // whole
  EXPECT_EQ(out, f);
  std::vector<std::uint8_t> page(4096);
  q.copy(*p, 4096, page);  // from the middle of a chunk chain, as rx pages are filled
  EXPECT_EQ(std::memcmp(page.data(), f.data() + 4096, 4096), 0);
  std::vector<std::uint8_t> tail(9000 - 8192 - 100);
  q.copy(*p, 8192 + 100, tail);  // an offset inside a chunk
  EXPECT_EQ(std::memcmp(tail.data(), f.data() + 8292, tail.size()), 0);
  q.pop();
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.front(), nullptr);
}

TEST(RxFlowQueue, OneFlowKeepsItsOrder) {
  RxFlowQueue q(small_pool(1 << 20), kMax);
  for (std::uint8_t i = 0; i < 20; ++i) push(q, frame(1000, 1500, i));
  for (std::uint8_t i = 0; i < 20; ++i) {
    const auto* p = q.front();
    ASSERT_NE(p, nullptr);
    std::uint8_t b[100];
    q.copy(*p, 0, b);
    EXPECT_EQ(b[99], static_cast<std::uint8_t>(99 + i)) << "packet " << int{i};
    q.pop();
  }
  EXPECT_TRUE(q.empty());
}

// The case the queue exists for: a sparse flow (ACKs) that arrives behind a backlog of a bulk
// flow goes out next, not after the backlog.
TEST(RxFlowQueue, ASparseFlowOvertakesABulkBacklog) {
  RxFlowQueue q(small_pool(2 << 20), kMax);
  for (int i = 0; i < 20; ++i) push(q, frame(1000, 64000));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(pop_port(q), 1000);
  push(q, frame(2000, 66));
  EXPECT_EQ(pop_port(q), 2000) << "a flow that just became active goes first";
  push(q, frame(2000, 66));
  push(q, frame(2000, 66));
  int before = 0;
  for (std::uint16_t port = pop_port(q); port == 1000; port = pop_port(q)) ++before;
  EXPECT_LE(before, 1) << "the ACK flow waited behind " << before << " bulk packets";
}

// Two backlogged flows of very different packet sizes move about the same bytes.
TEST(RxFlowQueue, BackloggedFlowsShareBytesNotPackets) {
  RxFlowQueue q(small_pool(4 << 20), kMax);
  for (int i = 0; i < 24; ++i) push(q, frame(1000, 64000));
  for (int i = 0; i < 1000; ++i) push(q, frame(2000, 1500));
  std::map<std::uint16_t, std::size_t> bytes;
  while (bytes[1000] + bytes[2000] < 1'000'000) {
    const auto* p = q.front();
    ASSERT_NE(p, nullptr);
    const std::size_t len = p->len;
    bytes[pop_port(q)] += len;
  }
  const double a = static_cast<double>(bytes[1000]), b = static_cast<double>(bytes[2000]);
  EXPECT_GT(a, 0.8 * b);
  EXPECT_GT(b, 0.8 * a);
}

TEST(RxFlowQueue, OverflowDropsFromTheHeadOfTheFattestFlow) {
  // Room for 4 frames of 64 KiB (33 chunks each) and a few small ones.
  RxFlowQueue q(small_pool(4 * 33 * RxFlowQueue::kChunk + 8 * RxFlowQueue::kChunk), kMax);
  for (std::uint8_t i = 0; i < 4; ++i) push(q, frame(1000, 64000, i));
  std::size_t dropped = 0;
  for (std::uint8_t i = 0; i < 6; ++i) {
    dropped += q.make_room();
    push(q, frame(2000, 100, static_cast<std::uint8_t>(100 + i)));
  }
  EXPECT_GT(dropped, 0u);
  // Every small packet is still there; of the bulk flow, the oldest went first.
  std::size_t small = 0, bulk = 0;
  std::uint8_t first_bulk_tag = 0;
  while (const auto* p = q.front()) {
    std::uint8_t b[100];
    q.copy(*p, 0, b);
    const std::uint16_t port = static_cast<std::uint16_t>(b[34] << 8 | b[35]);
    if (port == 1000 && bulk++ == 0) first_bulk_tag = static_cast<std::uint8_t>(b[99] - 99);
    if (port == 2000) ++small;
    q.pop();
  }
  EXPECT_EQ(small, 6u);
  EXPECT_EQ(bulk + dropped, 4u);
  EXPECT_EQ(first_bulk_tag, dropped) << "head drop: the oldest bulk packets are the ones gone";
}

TEST(RxFlowQueue, ClearEmptiesAndThePoolIsWholeAgain) {
  RxFlowQueue q(small_pool(1 << 20), kMax);
  for (int i = 0; i < 15; ++i) push(q, frame(static_cast<std::uint16_t>(1000 + i % 3), 64000));
  EXPECT_EQ(q.clear(), 15u);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.bytes(), 0u);
  EXPECT_EQ(q.front(), nullptr);
  std::size_t dropped = 0;
  for (int i = 0; i < 15; ++i) {
    dropped += q.make_room();
    push(q, frame(1000, 64000));
  }
  EXPECT_EQ(dropped, 0u) << "every chunk came back";
}

TEST(RxFlowQueue, FlowsAreFiveTuples) {
  RxFlowQueue q(small_pool(1 << 20), kMax);
  const auto a = frame(1000, 100), a2 = frame(1000, 1400), b = frame(1001, 100);
  EXPECT_EQ(q.flow_of(a), q.flow_of(a2)) << "length and payload do not matter";
  std::size_t differ = 0;
  for (std::uint16_t port = 1001; port < 1011; ++port) differ += q.flow_of(frame(port, 100)) != q.flow_of(a);
  EXPECT_GE(differ, 9u) << "other source ports are other flows (1024 buckets: rare collisions)";
  // An IPv4 fragment is hashed without ports (they are not in every fragment).
  auto frag = frame(1000, 100), frag2 = frame(1001, 100);
  frag[20] = frag2[20] = 0x20;  // more fragments
  EXPECT_EQ(q.flow_of(frag), q.flow_of(frag2));
  // Truncated or not IP: hashed by what is there, never read past the end.
  EXPECT_LT(q.flow_of(std::span<const std::uint8_t>(a.data(), 20)), 1024u);
  EXPECT_LT(q.flow_of(std::span<const std::uint8_t>(a.data(), 5)), 1024u);
  // An 802.1ad (QinQ service) tag in front: the same flow.
  auto tagged = a;
  tagged.insert(tagged.begin() + 12, {0x88, 0xa8, 0x00, 0x07});
  EXPECT_EQ(q.flow_of(tagged), q.flow_of(a));
  // IPv6 with a hop-by-hop header before TCP: the ports behind it make the flow.
  auto v6 = [](std::uint16_t sport) {
    std::vector<std::uint8_t> f(14 + 40 + 8 + 20, 0);
    f[12] = 0x86, f[13] = 0xdd, f[14] = 0x60;  // next header 0: hop-by-hop
    f[14 + 8] = 0xfd, f[14 + 23] = 1;          // fd00::1 → fd00::2
    f[14 + 24] = 0xfd, f[14 + 39] = 2;
    f[54] = 6;                                 // the extension: next TCP, 8 bytes
    f[62] = static_cast<std::uint8_t>(sport >> 8), f[63] = static_cast<std::uint8_t>(sport);
    f[64] = 0x14, f[65] = 0x51;
    return f;
  };
  differ = 0;
  for (std::uint16_t port = 1001; port < 1011; ++port) differ += q.flow_of(v6(port)) != q.flow_of(v6(1000));
  EXPECT_GE(differ, 9u) << "other source ports behind the extension header are other flows";
}

TEST(RxFlowQueue, APoolSmallerThanOneFrameIsRefused) {
  EXPECT_THROW(RxFlowQueue(small_pool(16 * 1024), kMax), std::invalid_argument);
}

}  // namespace
}  // namespace xpv::netback
