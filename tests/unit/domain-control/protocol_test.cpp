#include <gtest/gtest.h>

#include "xpv/domain/control_protocol.h"

namespace xpv::domain::control {
namespace {

std::vector<std::uint8_t> hello_datagram() {
  HelloRequest r{};
  copy_string(r.client_name, "blkback");
  return encode(static_cast<std::uint16_t>(MsgType::hello), 7, bytes_of(r));
}

TEST(ControlProtocol, RoundTripsAFixedPayload) {
  auto d = hello_datagram();
  auto m = parse(d);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->header.seq, 7u);
  EXPECT_EQ(m->header.type, static_cast<std::uint16_t>(MsgType::hello));
  auto r = decode_fixed<HelloRequest>(m->payload);
  ASSERT_TRUE(r);
  EXPECT_STREQ(r->client_name, "blkback");
}

TEST(ControlProtocol, RefusesTruncatedHeader) {
  auto d = hello_datagram();
  auto m = parse(std::span(d).first(15));
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error(), ProtoError::truncated);
}

TEST(ControlProtocol, RefusesBadMagicVersionLengthAndType) {
  auto d = hello_datagram();
  auto bad = d;
  bad[0] ^= 1;
  EXPECT_EQ(parse(bad).error(), ProtoError::bad_magic);
  bad = d;
  bad[4] = 2;
  EXPECT_EQ(parse(bad).error(), ProtoError::bad_version);
  bad = d;
  bad.push_back(0);  // one byte more than the header says
  EXPECT_EQ(parse(bad).error(), ProtoError::bad_length);
  bad = d;
  bad[6] = 99;
  EXPECT_EQ(parse(bad).error(), ProtoError::unknown_type);
}

TEST(ControlProtocol, AcceptsResponseAndErrorTypes) {
  auto r = encode(static_cast<std::uint16_t>(MsgType::unbind) | kResponseBit, 1, {});
  EXPECT_TRUE(parse(r));
  ErrorPayload e{};
  e.error = 22;
  auto err = encode(kErrorType, 1, bytes_of(e));
  EXPECT_TRUE(parse(err));
  auto unknown_rsp = encode(0x8000 | 42, 1, {});
  EXPECT_EQ(parse(unknown_rsp).error(), ProtoError::unknown_type);
}

TEST(ControlProtocol, FixedPayloadMustHaveExactSize) {
  std::vector<std::uint8_t> p(sizeof(BindRequest) + 1);
  EXPECT_EQ(decode_fixed<BindRequest>(p).error(), ProtoError::bad_payload);
  p.resize(sizeof(BindRequest) - 1);
  EXPECT_EQ(decode_fixed<BindRequest>(p).error(), ProtoError::bad_payload);
}

TEST(ControlProtocol, MemoryMapRoundTripsAndCountsAreChecked) {
  std::vector<RegionWire> regions = {{0, 0x100000, 0}, {0x100000000, 0x200000, 0x100000}};
  auto p = encode_memory(regions);
  auto back = decode_memory(p);
  ASSERT_TRUE(back);
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].gpa, 0x100000000u);
  EXPECT_EQ((*back)[1].offset, 0x100000u);

  auto trailing = p;
  trailing.push_back(0);
  EXPECT_FALSE(decode_memory(trailing));
  auto short_by_one = p;
  short_by_one.pop_back();
  EXPECT_FALSE(decode_memory(short_by_one));
  EXPECT_FALSE(decode_memory(encode_memory({})));  // a domain has memory
  std::vector<RegionWire> too_many(kMaxRegions + 1, RegionWire{0, 4096, 0});
  EXPECT_FALSE(decode_memory(encode_memory(too_many)));
}

TEST(ControlProtocol, GrantTableCountsAreChecked) {
  std::vector<std::uint64_t> gfns;
  auto p = encode_grant_table(64, {0xf0000, 0xf0001});
  auto head = decode_grant_table(p, gfns);
  ASSERT_TRUE(head);
  EXPECT_EQ(head->max_frames, 64u);
  EXPECT_EQ(gfns, (std::vector<std::uint64_t>{0xf0000, 0xf0001}));
  // More frames than the maximum it claims.
  EXPECT_FALSE(decode_grant_table(encode_grant_table(1, {1, 2}), gfns));
  EXPECT_FALSE(decode_grant_table(encode_grant_table(kMaxGrantFrames + 1, {}), gfns));
}

TEST(ControlProtocol, FdCountsPerType) {
  EXPECT_EQ(fds_for(static_cast<std::uint16_t>(MsgType::get_memory) | kResponseBit), 1u);
  EXPECT_EQ(fds_for(static_cast<std::uint16_t>(MsgType::bind_interdomain) | kResponseBit), 2u);
  EXPECT_EQ(fds_for(static_cast<std::uint16_t>(MsgType::bind_interdomain)), 0u);
  EXPECT_EQ(fds_for(kErrorType), 0u);
}

TEST(ControlProtocol, SocketPathNamesTheDomain) {
  EXPECT_EQ(socket_path(3), "/run/xpv/dom3.sock");
  EXPECT_EQ(socket_path(12, "/tmp/x"), "/tmp/x/dom12.sock");
}

}  // namespace
}  // namespace xpv::domain::control
