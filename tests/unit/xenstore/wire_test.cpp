// Wire framing and argument rules, checked against the official io/xs_wire.h.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>

extern "C" {
#include <xen/io/xs_wire.h>
}

#include "xpv/xenbus/wire.h"

namespace wire = xpv::xenbus::wire;
using wire::Error;
using wire::MsgType;

TEST(XenstoreWire, HeaderMatchesOfficialLayout) {
  EXPECT_EQ(sizeof(wire::Header), sizeof(struct xsd_sockmsg));
  EXPECT_EQ(offsetof(wire::Header, type), offsetof(struct xsd_sockmsg, type));
  EXPECT_EQ(offsetof(wire::Header, req_id), offsetof(struct xsd_sockmsg, req_id));
  EXPECT_EQ(offsetof(wire::Header, tx_id), offsetof(struct xsd_sockmsg, tx_id));
  EXPECT_EQ(offsetof(wire::Header, len), offsetof(struct xsd_sockmsg, len));
  EXPECT_EQ(wire::kPayloadMax, XENSTORE_PAYLOAD_MAX);
  EXPECT_EQ(wire::kAbsPathMax, XENSTORE_ABS_PATH_MAX);
  EXPECT_EQ(wire::kRelPathMax, XENSTORE_REL_PATH_MAX);
}

TEST(XenstoreWire, MessageTypesMatchOfficialNumbers) {
  EXPECT_EQ(static_cast<unsigned>(MsgType::control), XS_CONTROL);
  EXPECT_EQ(static_cast<unsigned>(MsgType::directory), XS_DIRECTORY);
  EXPECT_EQ(static_cast<unsigned>(MsgType::read), XS_READ);
  EXPECT_EQ(static_cast<unsigned>(MsgType::get_perms), XS_GET_PERMS);
  EXPECT_EQ(static_cast<unsigned>(MsgType::watch), XS_WATCH);
  EXPECT_EQ(static_cast<unsigned>(MsgType::unwatch), XS_UNWATCH);
  EXPECT_EQ(static_cast<unsigned>(MsgType::transaction_start), XS_TRANSACTION_START);
  EXPECT_EQ(static_cast<unsigned>(MsgType::transaction_end), XS_TRANSACTION_END);
  EXPECT_EQ(static_cast<unsigned>(MsgType::introduce), XS_INTRODUCE);
  EXPECT_EQ(static_cast<unsigned>(MsgType::release), XS_RELEASE);
  EXPECT_EQ(static_cast<unsigned>(MsgType::get_domain_path), XS_GET_DOMAIN_PATH);
  EXPECT_EQ(static_cast<unsigned>(MsgType::write), XS_WRITE);
  EXPECT_EQ(static_cast<unsigned>(MsgType::mkdir), XS_MKDIR);
  EXPECT_EQ(static_cast<unsigned>(MsgType::rm), XS_RM);
  EXPECT_EQ(static_cast<unsigned>(MsgType::set_perms), XS_SET_PERMS);
  EXPECT_EQ(static_cast<unsigned>(MsgType::watch_event), XS_WATCH_EVENT);
  EXPECT_EQ(static_cast<unsigned>(MsgType::error), XS_ERROR);
  EXPECT_EQ(static_cast<unsigned>(MsgType::is_domain_introduced), XS_IS_DOMAIN_INTRODUCED);
  EXPECT_EQ(static_cast<unsigned>(MsgType::resume), XS_RESUME);
  EXPECT_EQ(static_cast<unsigned>(MsgType::set_target), XS_SET_TARGET);
  EXPECT_EQ(static_cast<unsigned>(MsgType::reset_watches), XS_RESET_WATCHES);
  EXPECT_EQ(static_cast<unsigned>(MsgType::directory_part), XS_DIRECTORY_PART);
  EXPECT_EQ(static_cast<unsigned>(MsgType::type_count), XS_TYPE_COUNT);
  EXPECT_EQ(static_cast<unsigned>(MsgType::invalid), XS_INVALID);
}

TEST(XenstoreWire, ErrorTableMatchesXsdErrors) {
  ASSERT_EQ(sizeof(xsd_errors) / sizeof(xsd_errors[0]), wire::kErrorCount);
  for (std::size_t i = 0; i < wire::kErrorCount; ++i) {
    auto e = static_cast<Error>(i);
    EXPECT_EQ(wire::error_name(e), xsd_errors[i].errstring) << i;
    EXPECT_EQ(wire::error_errno(e), xsd_errors[i].errnum) << i;
    auto back = wire::error_from_name(xsd_errors[i].errstring);
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, e);
  }
  EXPECT_FALSE(wire::error_from_name("EQUOTA"));
  EXPECT_FALSE(wire::error_from_name(""));
}

TEST(XenstoreWire, EncodeDecodeRoundTrip) {
  std::string m = wire::encode(MsgType::write, 7, 3, std::string("/a\0v", 4));
  ASSERT_EQ(m.size(), 20u);
  auto h = wire::decode_header(std::span<const std::uint8_t, 16>(
      reinterpret_cast<const std::uint8_t*>(m.data()), 16));
  EXPECT_EQ(h.type, XS_WRITE);
  EXPECT_EQ(h.req_id, 7u);
  EXPECT_EQ(h.tx_id, 3u);
  EXPECT_EQ(h.len, 4u);
  EXPECT_TRUE(wire::check_header(h));
  h.len = 4097;
  EXPECT_FALSE(wire::check_header(h));
  h.len = 4096;
  EXPECT_TRUE(wire::check_header(h));
}

namespace {
std::vector<std::string> args_of(MsgType t, std::string_view payload) {
  auto a = wire::split_args(static_cast<std::uint32_t>(t), payload);
  if (!a) return {"!" + std::string(wire::error_name(a.error()))};
  std::vector<std::string> out;
  for (auto s : a->v) out.emplace_back(s);
  return out;
}
using V = std::vector<std::string>;
}  // namespace

TEST(XenstoreWire, OneArgumentTypes) {
  for (auto t : {MsgType::read, MsgType::directory, MsgType::get_perms, MsgType::mkdir,
                 MsgType::rm, MsgType::get_domain_path, MsgType::release, MsgType::resume,
                 MsgType::is_domain_introduced, MsgType::transaction_start,
                 MsgType::transaction_end}) {
    EXPECT_EQ(args_of(t, std::string_view("/a\0", 3)), V{"/a"});
    EXPECT_EQ(args_of(t, std::string_view("\0", 1)), V{""});
    EXPECT_EQ(args_of(t, "/a"), V{"!EINVAL"}) << "missing NUL";
    EXPECT_EQ(args_of(t, ""), V{"!EINVAL"}) << "empty payload";
    EXPECT_EQ(args_of(t, std::string_view("/a\0b\0", 5)), V{"!EINVAL"}) << "two args";
  }
}

TEST(XenstoreWire, TwoAndThreeArgumentTypes) {
  EXPECT_EQ(args_of(MsgType::watch, std::string_view("/a\0tok\0", 7)), (V{"/a", "tok"}));
  EXPECT_EQ(args_of(MsgType::watch, std::string_view("/a\0tok", 6)), V{"!EINVAL"});
  EXPECT_EQ(args_of(MsgType::unwatch, std::string_view("/a\0", 3)), V{"!EINVAL"});
  EXPECT_EQ(args_of(MsgType::introduce, std::string_view("1\0002\0003\0", 6)),
            (V{"1", "2", "3"}));
  EXPECT_EQ(args_of(MsgType::introduce, std::string_view("1\0002\0", 4)), V{"!EINVAL"});
  EXPECT_EQ(args_of(MsgType::directory_part, std::string_view("/\0000\0", 4)), (V{"/", "0"}));
}

TEST(XenstoreWire, WriteKeepsRawValue) {
  EXPECT_EQ(args_of(MsgType::write, std::string_view("/a\0v\0w", 6)),
            (V{"/a", std::string("v\0w", 3)}));
  EXPECT_EQ(args_of(MsgType::write, std::string_view("/a\0", 3)), (V{"/a", ""}));
  EXPECT_EQ(args_of(MsgType::write, "/a"), V{"!EINVAL"});
}

TEST(XenstoreWire, SetPermsAndControl) {
  EXPECT_EQ(args_of(MsgType::set_perms, std::string_view("/a\0n0\0r1\0", 9)),
            (V{"/a", "n0", "r1"}));
  EXPECT_EQ(args_of(MsgType::set_perms, std::string_view("/a\0", 3)), V{"!EINVAL"});
  EXPECT_EQ(args_of(MsgType::control, std::string_view("print\0hi\0", 9)), (V{"print", "hi"}));
}

TEST(XenstoreWire, UnknownAndServerOnlyTypes) {
  EXPECT_EQ(args_of(MsgType::watch_event, std::string_view("/a\0t\0", 5)), V{"!ENOSYS"});
  EXPECT_EQ(args_of(MsgType::error, std::string_view("E\0", 2)), V{"!ENOSYS"});
  EXPECT_EQ(args_of(static_cast<MsgType>(20), std::string_view("/\0", 2)), V{"!ENOSYS"});
  EXPECT_EQ(args_of(static_cast<MsgType>(23), std::string_view("/\0", 2)), V{"!ENOSYS"});
  EXPECT_EQ(args_of(static_cast<MsgType>(0xffffffff), ""), V{"!ENOSYS"});
}

TEST(XenstoreWire, FramerReassemblesFragments) {
  std::string m1 = wire::encode(MsgType::read, 1, 0, std::string("/a\0", 3));
  std::string m2 = wire::encode(MsgType::read, 2, 0, std::string("/bb\0", 4));
  std::string stream = m1 + m2;
  wire::Framer f;
  std::vector<std::pair<std::uint32_t, std::string>> got;
  // Feed one byte at a time: worst-case fragmentation.
  std::size_t pos = 0;
  for (int guard = 0; pos < stream.size() && guard < 1000; ++guard) {
    pos += f.feed(std::span<const std::uint8_t>(
        reinterpret_cast<const std::uint8_t*>(stream.data()) + pos, 1));
    if (f.ready()) {
      got.emplace_back(f.header().req_id, std::string(f.payload()));
      f.consume();
    }
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], std::make_pair(1u, std::string("/a\0", 3)));
  EXPECT_EQ(got[1], std::make_pair(2u, std::string("/bb\0", 4)));
}

TEST(XenstoreWire, FramerStopsAfterOneMessageAndFlagsOversize) {
  std::string m = wire::encode(MsgType::read, 1, 0, std::string("/a\0", 3));
  std::string two = m + m;
  wire::Framer f;
  auto used = f.feed(std::span<const std::uint8_t>(
      reinterpret_cast<const std::uint8_t*>(two.data()), two.size()));
  EXPECT_EQ(used, m.size());
  EXPECT_TRUE(f.ready());
  EXPECT_EQ(f.feed(std::span<const std::uint8_t>(
                reinterpret_cast<const std::uint8_t*>(two.data()), two.size())),
            0u);
  f.consume();
  wire::Header big{2, 1, 0, 5000};
  std::array<std::uint8_t, 16> hb;
  wire::encode_header(big, hb);
  wire::Framer g;
  EXPECT_EQ(g.feed(hb), 16u);
  EXPECT_TRUE(g.violated());
  EXPECT_FALSE(g.ready());
}
