// client::RingClient (a domain's own xenstore client) against the daemon's RingConnection over an
// in-memory page and two eventfds: the daemon runs on an io_context thread, a "vcpu" thread turns
// the daemon's kicks into on_event() as a guest's event-channel handler would.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "xpv/xenbus/client/ring_client.h"
#include "xpv/xenbus/daemon/ring_connection.h"
#include "xpv/test/run_on.h"

using namespace xpv::xenbus;
using client::RingClient;
using namespace std::chrono_literals;

namespace {

class RingClientTest : public ::testing::Test {
 protected:
  RingClientTest() : work_(boost::asio::make_work_guard(io_)) {
    thread_ = std::thread([this] { io_.run(); });
  }
  ~RingClientTest() override {
    stop_ = true;
    if (vcpu_.joinable()) vcpu_.join();
    client_.reset();
    on_io([this] {
      if (conn_) conn_->close();
    });
    work_.reset();
    io_.stop();
    thread_.join();
    ::close(kick_in_);
    ::close(kick_out_);
  }
  template <class F>
  auto on_io(F f) -> decltype(f()) {
    return xpv::test::run_on(io_, std::move(f));
  }
  // The client first, as a domain starts before xenstored serves it.
  void make_client(std::chrono::milliseconds timeout = 5000ms) {
    RingClient::Options o;
    o.timeout = timeout;
    client_ = std::make_unique<RingClient>(std::span<std::uint8_t>(page_), [this] {
      std::uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(kick_in_, &one, sizeof one);
    }, o);
    vcpu_ = std::thread([this] {
      pollfd p{kick_out_, POLLIN, 0};
      while (!stop_) {
        if (::poll(&p, 1, 20) == 1) {
          std::uint64_t v;
          [[maybe_unused]] auto n = ::read(kick_out_, &v, sizeof v);
          client_->on_event();
        }
      }
    });
  }
  void serve(DomId domid) {
    on_io([&] {
      conn_ = std::make_shared<daemon::RingConnection>(io_, store_, std::span<std::uint8_t>(page_),
                                                       ::dup(kick_in_), ::dup(kick_out_), domid);
      conn_->start();
    });
  }
  // dom0 work done straight on the store (a socket client would do the same).
  void as_dom0(const std::function<void(Store&, ConnId)>& fn) {
    on_io([&] {
      ConnId id = store_.connect(0, dom0_sink_);
      fn(store_, id);
      store_.disconnect(id);
    });
  }
  static std::string z(std::string_view s) { return std::string(s) + std::string(1, '\0'); }
  void dom0_req(wire::MsgType t, const std::string& payload) {
    as_dom0([&](Store& s, ConnId id) {
      wire::Header h{static_cast<std::uint32_t>(t), 1, 0, static_cast<std::uint32_t>(payload.size())};
      s.handle(id, h, payload);
    });
  }
  void give_home(DomId d) {
    std::string home = "/local/domain/" + std::to_string(d);
    dom0_req(wire::MsgType::mkdir, z(home));
    dom0_req(wire::MsgType::set_perms, z(home) + z("n" + std::to_string(d)));
  }

  struct NullSink : Sink {
    void deliver(const wire::Header&, std::string_view) override {}
  } dom0_sink_;
  alignas(4096) std::array<std::uint8_t, 4096> page_{};
  int kick_in_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  int kick_out_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  boost::asio::io_context io_;
  Store store_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
  std::shared_ptr<daemon::RingConnection> conn_;
  std::unique_ptr<RingClient> client_;
  std::atomic<bool> stop_{false};
  std::thread vcpu_;
};

TEST_F(RingClientTest, WaitsForXenstoredThenWorks) {
  make_client();
  EXPECT_FALSE(client_->wait_connected(50ms)) << "nobody serves the ring yet";
  give_home(5);
  serve(5);
  ASSERT_TRUE(client_->wait_connected(5000ms));
  ASSERT_TRUE(client_->write("data/a", "one"));
  EXPECT_EQ(client_->read("data/a").value(), "one");
  EXPECT_EQ(client_->read("/local/domain/5/data/a").value(), "one");
  ASSERT_TRUE(client_->mkdir("data/b"));
  EXPECT_EQ(client_->directory("data").value(), (std::vector<std::string>{"a", "b"}));
  auto perms = client_->get_perms("data/a");
  ASSERT_TRUE(perms);
  EXPECT_EQ(perms->at(0), (Perm{5, kPermNone}));
  ASSERT_TRUE(client_->set_perms("data/a", {{5, kPermNone}, {0, kPermRead}}));
  ASSERT_TRUE(client_->rm("data"));
  EXPECT_EQ(client_->read("data/a").error(), wire::Error::enoent);
}

TEST_F(RingClientTest, PermissionsAreTheDomainsOwn) {
  make_client();
  give_home(5);
  give_home(6);
  dom0_req(wire::MsgType::write, z("/local/domain/6/secret") + "x");
  serve(5);
  EXPECT_EQ(client_->read("/local/domain/6/secret").error(), wire::Error::eacces);
  EXPECT_EQ(client_->write("/local/domain/6/secret", "y").error(), wire::Error::eacces);
  EXPECT_EQ(client_->write("/tool/x", "y").error(), wire::Error::eacces);
  EXPECT_EQ(client_->request(wire::MsgType::introduce, z("9") + z("1") + z("1")).error(),
            wire::Error::eacces);
}

TEST_F(RingClientTest, WatchEventsReachCallbacksWhichMayCallBack) {
  make_client();
  give_home(5);
  serve(5);
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::string> seen;
  ASSERT_TRUE(client_->watch("data", "tok", [&](const std::string& path, const std::string& token) {
    // A callback may use the client: it runs on the watch thread, not the io thread.
    auto v = client_->read(path);
    std::lock_guard l(m);
    seen.push_back(path + "|" + token + "|" + (v ? *v : "-"));
    cv.notify_all();
  }));
  ASSERT_TRUE(client_->write("data/x", "1"));
  std::unique_lock l(m);
  ASSERT_TRUE(cv.wait_for(l, 5s, [&] { return seen.size() >= 2; }));
  EXPECT_EQ(seen[0].substr(0, 9), "data|tok|") << "the initial firing";
  EXPECT_EQ(seen[1].substr(0, 11), "data/x|tok|");
  l.unlock();
  ASSERT_TRUE(client_->unwatch("data", "tok"));
  EXPECT_EQ(client_->unwatch("data", "tok").error(), wire::Error::enoent);
}

// unwatch() returns only after a firing of that watch that is running now has returned, so the
// caller may free what the callback uses; from inside the callback it does not wait for itself.
TEST_F(RingClientTest, UnwatchReturnsOnlyAfterTheCallbackRunningNow) {
  make_client();
  give_home(5);
  serve(5);
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> calls{0};
  std::atomic<bool> inside{false};
  ASSERT_TRUE(client_->watch("data", "tok", [&, released](const std::string&, const std::string&) {
    if (calls.fetch_add(1) != 0) return;
    inside = true;  // the initial firing: held until the test lets it go (bounded)
    entered.set_value();
    (void)released.wait_for(10s);
    inside = false;
  }));
  ASSERT_EQ(entered.get_future().wait_for(5s), std::future_status::ready);
  auto unwatching = std::async(std::launch::async, [&] {
    auto r = client_->unwatch("data", "tok");
    EXPECT_FALSE(inside.load()) << "unwatch returned while the callback still ran";
    return r.has_value();
  });
  // Its reply comes at once from the store; the wait is for the callback held above.
  EXPECT_EQ(unwatching.wait_for(300ms), std::future_status::timeout) << "unwatch did not wait";
  release.set_value();
  ASSERT_EQ(unwatching.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(unwatching.get());
  ASSERT_TRUE(client_->write("data/y", "1"));
  std::promise<void> flushed;
  client_->post([&] { flushed.set_value(); });  // after anything the write could have queued
  ASSERT_EQ(flushed.get_future().wait_for(5s), std::future_status::ready);
  EXPECT_EQ(calls.load(), 1) << "it fired after unwatch";

  std::promise<bool> self;
  ASSERT_TRUE(client_->watch("data", "own", [&](const std::string&, const std::string&) {
    self.set_value(client_->unwatch("data", "own").has_value());
  }));
  auto f = self.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready) << "a callback that unwatches itself waited for itself";
  EXPECT_TRUE(f.get());
}

TEST_F(RingClientTest, TransactionsRetryOnConflict) {
  make_client();
  give_home(5);
  serve(5);
  ASSERT_TRUE(client_->write("n", "0"));
  int runs = 0;
  auto r = client_->transaction([&](client::TxId tx) -> client::Result<void> {
    ++runs;
    auto v = client_->read("n", tx);
    if (!v) return xpv::fail(v.error());
    // The first run conflicts with a write from outside the transaction.
    if (runs == 1) dom0_req(wire::MsgType::write, z("/local/domain/5/n") + "100");
    return client_->write("n", std::to_string(std::stoi(*v) + 1), tx);
  });
  ASSERT_TRUE(r);
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(client_->read("n").value(), "101");
  // Bounded: a body that always conflicts gives up with EAGAIN.
  int always = 0;
  auto r2 = client_->transaction([&](client::TxId tx) -> client::Result<void> {
    ++always;
    (void)client_->read("n", tx);
    dom0_req(wire::MsgType::write, z("/local/domain/5/n") + std::to_string(always));
    return client_->write("n", "x", tx);
  }, 3);
  EXPECT_EQ(r2.error(), wire::Error::eagain);
  EXPECT_EQ(always, 4);
  // A failing body aborts with its error.
  auto r3 = client_->transaction([&](client::TxId) -> client::Result<void> {
    return xpv::fail(wire::Error::einval);
  });
  EXPECT_EQ(r3.error(), wire::Error::einval);
  // EAGAIN inside the body (a transaction xenstored ended under it) starts again, within the bound.
  int body_eagain = 0;
  auto r4 = client_->transaction([&](client::TxId tx) -> client::Result<void> {
    ++body_eagain;
    if (auto w = client_->write("n", std::to_string(body_eagain), tx); !w) return w;
    if (body_eagain == 1) return xpv::fail(wire::Error::eagain);
    return {};
  });
  ASSERT_TRUE(r4);
  EXPECT_EQ(body_eagain, 2);
  EXPECT_EQ(client_->read("n").value(), "2");
}

TEST_F(RingClientTest, LargeValuesCrossTheRingInPieces) {
  make_client();
  give_home(5);
  serve(5);
  std::string big(2000, 'v');
  ASSERT_TRUE(client_->write("big", big));
  EXPECT_EQ(client_->read("big").value(), big);
}

TEST_F(RingClientTest, ConcurrentCallers) {
  make_client();
  give_home(5);
  serve(5);
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        std::string k = "t" + std::to_string(t) + "/" + std::to_string(i);
        if (client_->write(k, k) && client_->read(k).value_or("") == k) ++ok;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 100);
}

TEST_F(RingClientTest, NoReplyIsABoundedEio) {
  make_client(100ms);
  EXPECT_EQ(client_->read("x").error(), wire::Error::eio);
  EXPECT_EQ(client_->stats().timeouts, 1u);
}

// A request longer than the 1 KiB request ring, and nobody serving it: the io thread puts what
// fits on the ring and then waits for xenstored's kick (or its 200 ms poll) — it used to look at
// the full ring again at once, over and over, at 100 % of a CPU until the caller gave up.
TEST_F(RingClientTest, AFullRequestRingIsWaitedOnNotSpunOn) {
  make_client(1000ms);
  EXPECT_EQ(client_->write("a", std::string(3000, 'x')).error(), wire::Error::eio);
  const auto s = client_->stats();
  EXPECT_EQ(s.timeouts, 1u);
  // About one look per 200 ms poll over the 1 s the call waited; spinning made millions.
  EXPECT_LE(s.pumps, 20u) << "the io thread kept looking at a full ring";
}

TEST_F(RingClientTest, ABrokenRingFailsEveryCall) {
  make_client(2000ms);
  give_home(5);
  serve(5);
  ASSERT_TRUE(client_->write("a", "1"));
  // A message longer than 4096 bytes is a protocol violation: xenstored marks the page.
  std::string huge(5000, 'x');
  EXPECT_EQ(client_->write("a", huge).error(), wire::Error::eio);
  EXPECT_TRUE(client_->broken());
  EXPECT_EQ(client_->read("a").error(), wire::Error::eio);
}

TEST_F(RingClientTest, PostRunsOnTheWatchThreadInOrder) {
  make_client();
  std::promise<std::vector<int>> p;
  auto order = std::make_shared<std::vector<int>>();
  client_->post([order] { order->push_back(1); });
  client_->post([order] { order->push_back(2); });
  client_->post([order, &p] { p.set_value(*order); });
  auto f = p.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(f.get(), (std::vector<int>{1, 2}));
}

TEST(RingClientArgs, RefusesASmallPage) {
  std::array<std::uint8_t, 64> small{};
  EXPECT_THROW(RingClient(std::span<std::uint8_t>(small), [] {}), std::invalid_argument);
}

}  // namespace
