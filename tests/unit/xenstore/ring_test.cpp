// The domain-ring transport over an in-memory page and two eventfds per domain. Test threads
// play the domains; the daemon side runs on its own io_context thread.
#include <gtest/gtest.h>
#include <sys/eventfd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <future>
#include <memory>
#include <thread>

#include "ring_client.h"
#include "ring_domain.h"
#include "xpv/xenbus/daemon/ring_connection.h"

using namespace xpv::xenbus;
using wire::MsgType;
using xpv::test::RingClient;

namespace {

std::string z(std::string_view v) { return std::string(v) + std::string(1, '\0'); }
const std::string kOK("OK\0", 3);

using Domain = xpv::test::RingDomain;

class RingTest : public ::testing::Test {
 protected:
  template <class F>
  void on_io(F fn) {
    daemon_.on_io(fn);
  }
  Domain& attach(DomId domid) { return daemon_.attach(domid); }

  Store store_;
  xpv::test::RingDaemon daemon_{store_};
};

}  // namespace

TEST_F(RingTest, AdvertisesFeaturesAndConnection) {
  Domain& d = attach(1);
  EXPECT_EQ(d.intf()->server_features, xpv::ring::kXenstoreServerFeatureError);
  EXPECT_EQ(d.intf()->connection, xpv::ring::kXenstoreConnected);
  EXPECT_EQ(d.intf()->error, xpv::ring::kXenstoreErrorNone);
}

TEST_F(RingTest, DomainCannotTouchAnotherDomainsNodesButDom0Can) {
  Domain& d0 = attach(0);
  Domain& d1 = attach(1);
  Domain& d2 = attach(2);
  for (DomId id : {1, 2}) {
    std::string home = "/local/domain/" + std::to_string(id);
    ASSERT_EQ(d0.client->request(MsgType::mkdir, z(home)), kOK);
    ASSERT_EQ(d0.client->request(MsgType::set_perms, z(home) + z("n" + std::to_string(id))), kOK);
  }
  EXPECT_EQ(d1.client->request(MsgType::write, z("data/key") + "one"), kOK);
  EXPECT_EQ(d2.client->request(MsgType::write, z("data/key") + "two"), kOK);
  EXPECT_EQ(d1.client->request(MsgType::read, z("data/key")), "one");
  // dom1 → dom2's nodes: no read, no write, no listing, no removal, no perms.
  EXPECT_EQ(d1.client->request(MsgType::read, z("/local/domain/2/data/key")), "!EACCES");
  EXPECT_EQ(d1.client->request(MsgType::write, z("/local/domain/2/data/key") + "x"), "!EACCES");
  EXPECT_EQ(d1.client->request(MsgType::write, z("/local/domain/2/new") + "x"), "!EACCES");
  EXPECT_EQ(d1.client->request(MsgType::directory, z("/local/domain/2")), "!EACCES");
  EXPECT_EQ(d1.client->request(MsgType::rm, z("/local/domain/2/data")), "!EACCES");
  EXPECT_EQ(d1.client->request(MsgType::get_perms, z("/local/domain/2/data")), "!EACCES");
  EXPECT_EQ(d1.client->request(MsgType::set_perms, z("/local/domain/2/data") + z("b1")),
            "!EACCES");
  EXPECT_EQ(d2.client->request(MsgType::read, z("/local/domain/1/data/key")), "!EACCES");
  // Nor dom0's tree, nor privileged operations.
  EXPECT_EQ(d1.client->request(MsgType::write, z("/tool/x") + "x"), "!EACCES");
  EXPECT_EQ(d1.client->request(MsgType::introduce, z("9") + z("1") + z("1")), "!EACCES");
  // dom0 can do all of it.
  EXPECT_EQ(d0.client->request(MsgType::read, z("/local/domain/2/data/key")), "two");
  EXPECT_EQ(d0.client->request(MsgType::write, z("/local/domain/2/data/key") + "zero"), kOK);
  EXPECT_EQ(d2.client->request(MsgType::read, z("data/key")), "zero");
  EXPECT_EQ(d0.client->request(MsgType::rm, z("/local/domain/1/data")), kOK);
  EXPECT_EQ(d1.client->request(MsgType::read, z("data/key")), "!ENOENT");
  // Granting access opens exactly what was granted.
  EXPECT_EQ(d0.client->request(MsgType::set_perms, z("/local/domain/2/data/key") + z("n2") +
                                                       z("r1")),
            kOK);
  EXPECT_EQ(d1.client->request(MsgType::read, z("/local/domain/2/data/key")), "zero");
  EXPECT_EQ(d1.client->request(MsgType::write, z("/local/domain/2/data/key") + "x"), "!EACCES");
}

TEST_F(RingTest, MessagesLargerThanTheRingFlowThrough) {
  Domain& d0 = attach(0);
  std::string big(3000, 'v');
  for (int i = 0; i < 3; ++i) {  // several laps around the 1 KiB rings
    EXPECT_EQ(d0.client->request(MsgType::write, z("/big") + big), kOK);
    EXPECT_EQ(d0.client->request(MsgType::read, z("/big")), big);
  }
  EXPECT_EQ(d0.client->request(MsgType::read, z("/nope")), "!ENOENT");
}

TEST_F(RingTest, WatchEventsReachTheDomain) {
  Domain& d0 = attach(0);
  Domain& d1 = attach(1);
  ASSERT_EQ(d0.client->request(MsgType::mkdir, z("/local/domain/1")), kOK);
  ASSERT_EQ(d0.client->request(MsgType::set_perms, z("/local/domain/1") + z("n1")), kOK);
  EXPECT_EQ(d1.client->request(MsgType::watch, z("device") + z("tok")), kOK);
  ASSERT_TRUE(d1.client->wait_events(1));
  EXPECT_EQ(d0.client->request(MsgType::write, z("/local/domain/1/device/vif") + "x"), kOK);
  ASSERT_TRUE(d1.client->wait_events(2));
  EXPECT_EQ(d1.client->events, (std::vector<std::string>{"device|tok", "device/vif|tok"}));
}

TEST_F(RingTest, BadIndexDisablesOnlyThatRing) {
  Domain& d0 = attach(0);
  Domain& d1 = attach(1);
  d1.intf()->req_prod = d1.intf()->req_cons + 2000;  // more than a ring's worth
  d1.client->kick();
  for (int i = 0; i < 500 && d1.intf()->error == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(d1.intf()->error, xpv::ring::kXenstoreErrorRingIdx);
  EXPECT_EQ(d0.client->request(MsgType::write, z("/still") + "ok"), kOK);
  EXPECT_EQ(d0.client->request(MsgType::read, z("/still")), "ok");
  bool failed = false;
  on_io([&] { failed = d1.conn->failed(); });
  EXPECT_TRUE(failed);
}

TEST_F(RingTest, OversizeMessageIsAProtocolError) {
  Domain& d0 = attach(0);
  Domain& d1 = attach(1);
  wire::Header h{static_cast<std::uint32_t>(MsgType::write), 1, 0, 5000};
  std::string raw(16, '\0');
  std::memcpy(raw.data(), &h, 16);
  ASSERT_TRUE(d1.client->send_raw(raw));
  for (int i = 0; i < 500 && d1.intf()->error == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(d1.intf()->error, xpv::ring::kXenstoreErrorProto);
  EXPECT_EQ(d0.client->request(MsgType::read, z("/tool/xenstored")), "");
}

TEST_F(RingTest, MalformedMessagesGetErrorReplies) {
  Domain& d1 = attach(1);
  EXPECT_EQ(d1.client->request(MsgType::read, "no-nul"), "!EINVAL");
  EXPECT_EQ(d1.client->request(static_cast<MsgType>(77), z("/x")), "!ENOSYS");
  EXPECT_EQ(d1.client->request(MsgType::read, z("/x"), 1234), "!ENOENT") << "unknown tx";
  EXPECT_EQ(d1.client->request(MsgType::get_domain_path, z("1")), z("/local/domain/1"));
}

TEST(RingConnectionSetup, RejectsSmallPageAndBadFds) {
  boost::asio::io_context io;
  Store store;
  std::array<std::uint8_t, 64> small{};
  EXPECT_THROW(daemon::RingConnection(io, store, std::span<std::uint8_t>(small),
                                      ::eventfd(0, EFD_CLOEXEC), ::eventfd(0, EFD_CLOEXEC), 1),
               std::invalid_argument);
  alignas(4096) std::array<std::uint8_t, 4096> page{};
  EXPECT_THROW(daemon::RingConnection(io, store, std::span<std::uint8_t>(page), -1,
                                      ::eventfd(0, EFD_CLOEXEC), 1),
               std::invalid_argument);
}
