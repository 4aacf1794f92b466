// ByteRing over the console and xenstore pages: round trips, wrap of the array and of the 32-bit
// indexes, partial writes, and bad index pairs refused before any byte moves.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <string>
#include <string_view>

#include "test_pages.h"
#include "xpv/ring/byte_ring.h"
#include "xpv/ring/console.h"
#include "xpv/ring/xenstore.h"

namespace xpv::ring {
namespace {

using test::Pages;

struct Console : ::testing::Test {
  Pages page{1, 0};
  XenconsInterface* intf = *console_interface(page.span());
  ByteRing in = std::move(*console_in_ring(*intf));
  ByteRing out = std::move(*console_out_ring(*intf));
};

std::string read_all(ByteRing& r, std::size_t max = 4096) {
  std::string s(max, '\0');
  auto n = r.read(s);
  EXPECT_TRUE(n);
  s.resize(n ? *n : 0);
  return s;
}

TEST_F(Console, WriteThenReadRoundTrips) {
  EXPECT_EQ(in.size(), 1024u);
  EXPECT_EQ(out.size(), 2048u);
  auto w = out.write(std::string_view("login: "));
  ASSERT_TRUE(w);
  EXPECT_EQ(*w, 7u);
  EXPECT_EQ(intf->out_prod, 7u);
  EXPECT_EQ(intf->out_cons, 0u);
  EXPECT_EQ(std::string_view(intf->out, 7), "login: ");
  EXPECT_EQ(*out.readable(), 7u);
  EXPECT_EQ(read_all(out), "login: ");
  EXPECT_EQ(intf->out_cons, 7u);
  EXPECT_EQ(*out.readable(), 0u);
  EXPECT_EQ(read_all(out), "");
  // The in ring is separate.
  EXPECT_EQ(*in.readable(), 0u);
  ASSERT_TRUE(in.write(std::string_view("root\n")));
  EXPECT_EQ(intf->in_prod, 5u);
  EXPECT_EQ(read_all(in), "root\n");
}

TEST_F(Console, WrapsAroundTheArrayAndTheIndexes) {
  intf->in_cons = intf->in_prod = 0xffffffffu - 9;  // 10 bytes before the 2^32 wrap, near array end
  std::string data;
  for (int i = 0; i < 300; ++i) data.push_back(static_cast<char>('a' + i % 26));
  for (int round = 0; round < 10; ++round) {  // 3000 bytes through a 1024-byte ring
    auto w = in.write(data);
    ASSERT_TRUE(w);
    ASSERT_EQ(*w, 300u);
    if (round == 0) {  // index 0xfffffff6 is array offset 1014: bytes 10.. sit at the array start
      EXPECT_EQ(intf->in[1014], data[0]);
      EXPECT_EQ(intf->in[1023], data[9]);
      EXPECT_EQ(intf->in[0], data[10]);
    }
    ASSERT_EQ(read_all(in), data) << round;
  }
  EXPECT_EQ(intf->in_prod, static_cast<std::uint32_t>(0xffffffffu - 9 + 3000));
  EXPECT_EQ(intf->in_cons, intf->in_prod);
}

TEST_F(Console, PartialWriteWhenNearlyFull) {
  std::string big(1000, 'x');
  ASSERT_EQ(*in.write(big), 1000u);
  EXPECT_EQ(*in.writable(), 24u);
  auto w = in.write(std::string(100, 'y'));
  ASSERT_TRUE(w);
  EXPECT_EQ(*w, 24u);
  EXPECT_EQ(*in.writable(), 0u);
  EXPECT_EQ(*in.write(std::string_view("z")), 0u);
  EXPECT_EQ(*in.readable(), 1024u) << "prod - cons == size is a full ring, not an error";
  std::string first(10, '\0');
  EXPECT_EQ(*in.read(first), 10u);
  EXPECT_EQ(first, std::string(10, 'x'));
  EXPECT_EQ(*in.writable(), 10u);
}

TEST_F(Console, ReadIntoAnEmptyBufferMovesNothing) {
  ASSERT_TRUE(out.write(std::string_view("abc")));
  auto n = out.read(std::span<char>{});
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 0u);
  EXPECT_EQ(intf->out_cons, 0u);
  EXPECT_EQ(*out.write(std::span<const char>{}), 0u);
  EXPECT_EQ(intf->out_prod, 3u);
}

TEST_F(Console, BadProducerIndexIsRefusedBeforeReading) {
  intf->out_cons = 100;
  intf->out_prod = 100 + 2049;  // more than the 2048-byte ring holds
  std::string buf(16, '#');
  auto n = out.read(buf);
  ASSERT_FALSE(n);
  EXPECT_EQ(n.error(), RingError::bad_producer_index);
  EXPECT_EQ(buf, std::string(16, '#')) << "no byte copied";
  EXPECT_EQ(intf->out_cons, 100u) << "cons not moved";
  EXPECT_EQ(out.readable().error(), RingError::bad_producer_index);
  intf->out_prod = 99;  // behind cons: 2^32 - 1 bytes "available"
  EXPECT_EQ(out.read(buf).error(), RingError::bad_producer_index);
}

TEST_F(Console, BadConsumerIndexIsRefusedBeforeWriting) {
  intf->in_prod = 10;
  intf->in_cons = 11;  // the guest claims to have read a byte never written
  auto w = in.write(std::string_view("hello"));
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error(), RingError::bad_consumer_index);
  EXPECT_EQ(intf->in_prod, 10u);
  EXPECT_EQ(intf->in[10], 0);
  EXPECT_EQ(in.writable().error(), RingError::bad_consumer_index);
  EXPECT_TRUE(is_protocol_error(w.error()));
}

TEST(ByteRing, MakeRejectsBadGeometry) {
  alignas(8) std::array<char, 24> data{};
  alignas(8) std::uint32_t idx[3] = {0, 0, 0};
  auto r = ByteRing::make(std::span(data), idx[0], idx[1]);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), RingError::bad_size);
  auto e = ByteRing::make(std::span<char>{}, idx[0], idx[1]);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error(), RingError::bad_size);
  auto ok = ByteRing::make(std::span(data).first(16), idx[0], idx[1]);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->size(), 16u);
}

TEST(ByteRing, InterfaceViewsRejectShortOrMisalignedPages) {
  Pages p(1, 0);
  EXPECT_EQ(console_interface(p.span().first(sizeof(XenconsInterface) - 1)).error(),
            RingError::too_small);
  EXPECT_EQ(console_interface(p.span().subspan(2)).error(), RingError::misaligned);
  EXPECT_TRUE(console_interface(p.span().first(sizeof(XenconsInterface))));
  EXPECT_EQ(xenstore_interface(p.span().first(100)).error(), RingError::too_small);
  EXPECT_EQ(xenstore_interface(p.span().subspan(1)).error(), RingError::misaligned);
  auto xs = xenstore_interface(p.span());
  ASSERT_TRUE(xs);
  EXPECT_EQ(reinterpret_cast<std::uint8_t*>(*xs), p.data());
}

TEST(ByteRing, XenstoreRequestAndReplyRings) {
  Pages p(1, 0);
  XenstoreDomainInterface* xs = *xenstore_interface(p.span());
  auto req = xenstore_req_ring(*xs);
  auto rsp = xenstore_rsp_ring(*xs);
  ASSERT_TRUE(req && rsp);
  // A 16-byte xsd_sockmsg header (type XS_READ = 2, req_id 7, tx_id 0, len 6) and its payload.
  const std::uint32_t hdr[4] = {2, 7, 0, 6};
  std::string msg(reinterpret_cast<const char*>(hdr), sizeof(hdr));
  msg += std::string_view("name\0", 5);
  msg.push_back('\0');
  ASSERT_EQ(*req->write(msg), msg.size());
  EXPECT_EQ(xs->req_prod, msg.size());
  EXPECT_EQ(*rsp->readable(), 0u);
  std::string got(64, '\0');
  auto n = req->read(got);
  ASSERT_TRUE(n);
  got.resize(*n);
  EXPECT_EQ(got, msg);
  EXPECT_EQ(xs->req_cons, msg.size());
  ASSERT_EQ(*rsp->write(std::string_view("Domain-0")), 8u);
  EXPECT_EQ(xs->rsp_prod, 8u);
  EXPECT_EQ(std::string_view(xs->rsp, 8), "Domain-0");
}

TEST(ByteRing, XenstoreBadIndexesAreProtocolErrors) {
  Pages p(1, 0);
  XenstoreDomainInterface* xs = *xenstore_interface(p.span());
  auto req = xenstore_req_ring(*xs);
  ASSERT_TRUE(req);
  xs->req_cons = 0;
  xs->req_prod = kXenstoreRingSize + 1;
  std::string buf(8, '\0');
  EXPECT_EQ(req->read(buf).error(), RingError::bad_producer_index);
  EXPECT_EQ(xs->req_cons, 0u);
  xs->req_prod = 0xfffffff0u;
  xs->req_cons = 0xfffffff0u + 1;
  EXPECT_EQ(req->write(std::string_view("x")).error(), RingError::bad_consumer_index);
  EXPECT_EQ(xs->req_prod, 0xfffffff0u);
  // Indexes straddling 2^32 with a legitimate distance are fine.
  xs->req_prod = 5;
  xs->req_cons = 0xfffffffbu;  // 10 bytes pending
  EXPECT_EQ(*req->readable(), 10u);
}

}  // namespace
}  // namespace xpv::ring
