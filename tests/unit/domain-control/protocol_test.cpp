#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <variant>

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

TEST(ControlProtocol, PaddingMustBeZeroAndStringsTerminated) {
  BindRequest b{5, 0};
  EXPECT_TRUE(decode_fixed<BindRequest>(bytes_of(b)));
  b.pad = 1;
  EXPECT_EQ(decode_fixed<BindRequest>(bytes_of(b)).error(), ProtoError::bad_payload);
  HelloRequest h{};
  copy_string(h.client_name, "netback");
  h.pad0 = 0x100;
  EXPECT_EQ(decode_fixed<HelloRequest>(bytes_of(h)).error(), ProtoError::bad_payload);
  h.pad0 = 0;
  h.pad1 = 0x80000000u;
  EXPECT_EQ(decode_fixed<HelloRequest>(bytes_of(h)).error(), ProtoError::bad_payload);
  h.pad1 = 0;
  std::memset(h.client_name, 'x', sizeof h.client_name);
  EXPECT_EQ(decode_fixed<HelloRequest>(bytes_of(h)).error(), ProtoError::bad_payload);
  ErrorPayload e{};
  e.error = EIO;
  EXPECT_TRUE(decode_fixed<ErrorPayload>(bytes_of(e)));
  e.error = 0;  // an error answer names an errno
  EXPECT_FALSE(decode_fixed<ErrorPayload>(bytes_of(e)));
  e.error = EIO;
  e.pad = 2;
  EXPECT_FALSE(decode_fixed<ErrorPayload>(bytes_of(e)));
  EXPECT_FALSE(decode_fixed<XenstoreResponse>(bytes_of(XenstoreResponse{1, 2, 3})));
  EXPECT_FALSE(decode_fixed<DirectUpcallRequest>(bytes_of(DirectUpcallRequest{0, 9})));
  auto mem = encode_memory({{0, 4096, 0}});
  mem[4] = 1;  // MemoryResponse::pad
  EXPECT_FALSE(decode_memory(mem));
}

TEST(ControlProtocol, DecodeRequestChecksThePayloadOfEveryType) {
  auto request = [](MsgType t, std::span<const std::uint8_t> payload) {
    auto m = parse(encode(static_cast<std::uint16_t>(t), 3, payload));
    EXPECT_TRUE(m);
    return decode_request(*m);
  };
  auto r = request(MsgType::unbind, bytes_of(UnbindRequest{7, 0}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->type, MsgType::unbind);
  EXPECT_EQ(r->seq, 3u);
  EXPECT_EQ(std::get<UnbindRequest>(r->body).port, 7u);
  EXPECT_EQ(request(MsgType::unbind, bytes_of(UnbindRequest{7, 1})).error(), ProtoError::bad_payload);
  EXPECT_EQ(request(MsgType::get_direct_upcall, bytes_of(BindRequest{0, 0}))->type, MsgType::get_direct_upcall);
  VcpuAffinityRequest aff{kAllVcpus, 0, {}};
  aff.cpus[15] = 1ull << 63;
  auto ar = request(MsgType::set_vcpu_affinity, bytes_of(aff));
  ASSERT_TRUE(ar);
  EXPECT_EQ(std::get<VcpuAffinityRequest>(ar->body).vcpu, kAllVcpus);
  EXPECT_EQ(std::get<VcpuAffinityRequest>(ar->body).cpus[15], 1ull << 63);
  aff.pad = 1;
  EXPECT_EQ(request(MsgType::set_vcpu_affinity, bytes_of(aff)).error(), ProtoError::bad_payload);
  EXPECT_EQ(request(MsgType::set_vcpu_affinity, bytes_of(BindRequest{0, 0})).error(), ProtoError::bad_payload);
  const std::uint8_t one[1] = {0};
  for (MsgType t : {MsgType::get_memory, MsgType::get_grant_table, MsgType::get_xenstore, MsgType::unpause,
                    MsgType::pause, MsgType::get_vcpu_threads}) {
    EXPECT_TRUE(request(t, {})) << static_cast<int>(t);
    EXPECT_EQ(request(t, one).error(), ProtoError::bad_payload) << static_cast<int>(t);
  }
  for (MsgType t : {MsgType::hello, MsgType::bind_interdomain, MsgType::unbind, MsgType::get_direct_upcall,
                    MsgType::set_vcpu_affinity}) {
    EXPECT_EQ(request(t, {}).error(), ProtoError::bad_payload) << static_cast<int>(t);
  }
  // A response or an error is no request.
  auto rsp = parse(encode(static_cast<std::uint16_t>(MsgType::unpause) | kResponseBit, 1, {}));
  ASSERT_TRUE(rsp);
  EXPECT_EQ(decode_request(*rsp).error(), ProtoError::unknown_type);
  ErrorPayload e{};
  e.error = EIO;
  auto err = parse(encode(kErrorType, 1, bytes_of(e)));
  ASSERT_TRUE(err);
  EXPECT_EQ(decode_request(*err).error(), ProtoError::unknown_type);
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

TEST(ControlProtocol, VcpuThreadsRoundTripAndCountsAreChecked) {
  auto p = encode_vcpu_threads({1234, 0, 99});
  auto back = decode_vcpu_threads(p);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, (std::vector<std::uint32_t>{1234, 0, 99}));
  auto trailing = p;
  trailing.push_back(0);
  EXPECT_FALSE(decode_vcpu_threads(trailing));
  auto short_by_one = p;
  short_by_one.pop_back();
  EXPECT_FALSE(decode_vcpu_threads(short_by_one));
  EXPECT_FALSE(decode_vcpu_threads(encode_vcpu_threads({})));  // an HVM domain has a vCPU
  EXPECT_FALSE(decode_vcpu_threads(encode_vcpu_threads(std::vector<std::uint32_t>(kMaxVcpuThreads + 1, 1))));
  auto padded = p;
  padded[4] = 1;  // VcpuThreadsResponse::pad
  EXPECT_FALSE(decode_vcpu_threads(padded));
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
