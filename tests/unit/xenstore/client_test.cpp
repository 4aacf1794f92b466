// The async client (through its blocking wrapper and directly) against an in-process daemon:
// Store + SocketServer on their own io_context thread, on a socket in a temporary directory.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "xpv/xenbus/client/sync_client.h"
#include "xpv/xenbus/client/xenstored_probe.h"
#include "xpv/xenbus/daemon/socket_server.h"

using namespace std::chrono_literals;
using namespace xpv::xenbus;
using client::SyncClient;
using wire::Error;

namespace {

class InProcessDaemon {
 public:
  InProcessDaemon() : work_(boost::asio::make_work_guard(io_)) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "xpv-xsc-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp");
    dir_ = tmpl;
    server_ = std::make_unique<daemon::SocketServer>(io_, store_, dir_ + "/socket");
    thread_ = std::thread([this] { io_.run(); });
  }
  ~InProcessDaemon() {
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      server_.reset();
      done.set_value();
    });
    done.get_future().wait();
    work_.reset();
    io_.stop();
    thread_.join();
    std::filesystem::remove_all(dir_);
  }
  std::string socket() const { return dir_ + "/socket"; }

 private:
  boost::asio::io_context io_;
  Store store_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::string dir_;
  std::unique_ptr<daemon::SocketServer> server_;
  std::thread thread_;
};

// Collects watch events from the client's thread; waits are bounded.
class Events {
 public:
  client::WatchCallback callback() {
    return [this](const std::string& path, const std::string& token) {
      std::lock_guard<std::mutex> l(m_);
      got_.push_back(path + "|" + token);
      cv_.notify_all();
    };
  }
  std::vector<std::string> wait_for(std::size_t n) {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait_for(l, 5s, [&] { return got_.size() >= n; });
    return got_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::string> got_;
};

}  // namespace

TEST(XenstoreClient, BasicOperationsRoundTrip) {
  InProcessDaemon d;
  SyncClient c(d.socket());
  ASSERT_TRUE(c.write("/a/b", "hello"));
  EXPECT_EQ(*c.read("/a/b"), "hello");
  ASSERT_TRUE(c.mkdir("/a/c"));
  EXPECT_EQ(*c.directory("/a"), (std::vector<std::string>{"b", "c"}));
  ASSERT_TRUE(c.set_perms("/a/b", {{3, kPermRead}, {4, kPermWrite}}));
  EXPECT_EQ(*c.get_perms("/a/b"), (PermList{{3, kPermRead}, {4, kPermWrite}}));
  ASSERT_TRUE(c.rm("/a"));
  auto r = c.read("/a/b");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), Error::enoent);
  auto bad = c.write("/bad path", "x");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error(), Error::einval);
  EXPECT_EQ(*c.directory("/"), (std::vector<std::string>{"tool"}));
}

TEST(XenstoreClient, WatchCallbackFiresOnRegistrationAndChange) {
  InProcessDaemon d;
  SyncClient watcher(d.socket()), writer(d.socket());
  Events ev;
  ASSERT_TRUE(watcher.watch("/w", "tok", ev.callback()));
  EXPECT_EQ(ev.wait_for(1), std::vector<std::string>{"/w|tok"});
  ASSERT_TRUE(writer.write("/w/x", "1"));
  EXPECT_EQ(ev.wait_for(2), (std::vector<std::string>{"/w|tok", "/w/x|tok"}));
  ASSERT_TRUE(watcher.unwatch("/w", "tok"));
  auto again = watcher.unwatch("/w", "tok");
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error(), Error::enoent);
}

// A watch callback that throws is logged; the client goes on reading (before, the exception
// ended its io thread and every later call timed out).
TEST(XenstoreClient, AWatchCallbackThatThrowsDoesNotStopTheClient) {
  InProcessDaemon d;
  SyncClient c(d.socket(), 2s), writer(d.socket());
  Events ev;
  std::atomic<int> thrown{0};
  auto inner = ev.callback();
  ASSERT_TRUE(c.watch("/thrower", "tok", [&](const std::string& path, const std::string& token) {
    inner(path, token);
    ++thrown;
    throw std::runtime_error("a watch callback failed");
  }));
  EXPECT_EQ(ev.wait_for(1).size(), 1u);  // the registration's event, which threw
  ASSERT_TRUE(writer.write("/thrower/x", "1"));
  EXPECT_EQ(ev.wait_for(2).size(), 2u) << "the next event still arrives";
  ASSERT_TRUE(c.write("/after", "ok"));
  auto v = c.read("/after");
  ASSERT_TRUE(v) << "calls are answered";
  EXPECT_EQ(*v, "ok");
  EXPECT_EQ(thrown, 2);
}

TEST(XenstoreClient, SyncTransactionRetriesOnConflict) {
  InProcessDaemon d;
  SyncClient c(d.socket()), other(d.socket());
  ASSERT_TRUE(c.write("/counter", "0"));
  int attempts = 0;
  auto r = c.transaction([&](client::TxId tx) -> client::Result<void> {
    ++attempts;
    auto v = c.read("/counter", tx);
    if (!v) return xpv::fail(v.error());
    if (attempts == 1) {
      auto w = other.write("/counter", "10");  // conflicting write between read and commit
      if (!w) return xpv::fail(w.error());
    }
    return c.write("/counter", std::to_string(std::stoi(*v) + 1), tx);
  });
  ASSERT_TRUE(r);
  EXPECT_EQ(attempts, 2);
  EXPECT_EQ(c.retries(), 1u);
  EXPECT_EQ(*c.read("/counter"), "11");
}

TEST(XenstoreClient, SyncTransactionGivesUpAfterMaxRetries) {
  InProcessDaemon d;
  SyncClient c(d.socket()), other(d.socket());
  ASSERT_TRUE(c.write("/x", "0"));
  int attempts = 0;
  auto r = c.transaction(
      [&](client::TxId tx) -> client::Result<void> {
        ++attempts;
        (void)c.read("/x", tx);
        (void)other.write("/x", std::to_string(attempts));  // always conflicts
        return c.write("/y", "z", tx);
      },
      2);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), Error::eagain);
  EXPECT_EQ(attempts, 3);
  EXPECT_EQ(c.read("/y").error(), Error::enoent);
}

// xenstored answers EAGAIN to any request of a transaction it ended under the client (`xpv
// live-update -F`, a journal replayed after a crash), not only to the commit: a body that meets
// it starts again like a conflict at commit, within the same bound; its writes are not kept.
TEST(XenstoreClient, SyncTransactionRetriesABodyThatMeetsEagain) {
  InProcessDaemon d;
  SyncClient c(d.socket());
  int attempts = 0;
  auto r = c.transaction([&](client::TxId tx) -> client::Result<void> {
    ++attempts;
    if (auto w = c.write("/body", std::to_string(attempts), tx); !w) return w;
    if (attempts == 1) return xpv::fail(Error::eagain);
    return {};
  });
  ASSERT_TRUE(r);
  EXPECT_EQ(attempts, 2);
  EXPECT_EQ(c.retries(), 1u);
  EXPECT_EQ(*c.read("/body"), "2");
  attempts = 0;
  auto never = c.transaction(
      [&](client::TxId) -> client::Result<void> {
        ++attempts;
        return xpv::fail(Error::eagain);
      },
      2);
  ASSERT_FALSE(never);
  EXPECT_EQ(never.error(), Error::eagain);
  EXPECT_EQ(attempts, 3);
  auto other_error = c.transaction([&](client::TxId) -> client::Result<void> { return xpv::fail(Error::eperm); });
  ASSERT_FALSE(other_error);
  EXPECT_EQ(other_error.error(), Error::eperm) << "any other error ends the transaction at once";
}

TEST(XenstoreClient, AsyncTransactionRetriesABodyThatMeetsEagain) {
  InProcessDaemon d;
  SyncClient other(d.socket());
  boost::asio::io_context io;
  auto c = client::Client::create(io);
  int attempts = 0;
  client::Result<void> result = xpv::fail(Error::eio);
  c->connect(d.socket(), [&](client::Result<void> r) {
    ASSERT_TRUE(r);
    c->transaction(
        [&](client::TxId tx, client::Finish finish) {
          ++attempts;
          c->write("/async-body", std::to_string(attempts), [&, finish](client::Result<void> w) {
            if (!w) return finish(w);
            finish(attempts == 1 ? client::Result<void>(xpv::fail(Error::eagain)) : client::Result<void>());
          }, tx);
        },
        [&](client::Result<void> r2) {
          result = r2;
          c->close();
        });
  });
  io.run_for(10s);
  ASSERT_TRUE(result);
  EXPECT_EQ(attempts, 2);
  EXPECT_EQ(c->retries(), 1u);
  EXPECT_EQ(*other.read("/async-body"), "2");
}

TEST(XenstoreClient, AsyncTransactionRetriesAndBodyErrorAborts) {
  InProcessDaemon d;
  SyncClient other(d.socket());
  ASSERT_TRUE(other.write("/t", "0"));
  boost::asio::io_context io;
  auto c = client::Client::create(io);
  int attempts = 0;
  client::Result<void> result = xpv::fail(Error::eio);
  client::Result<void> aborted = xpv::fail(Error::eio);
  c->connect(d.socket(), [&](client::Result<void> r) {
    ASSERT_TRUE(r);
    c->transaction(
        [&](client::TxId tx, client::Finish finish) {
          ++attempts;
          c->read("/t", [&, tx, finish](client::Result<std::string> v) {
            if (!v) return finish(xpv::fail(v.error()));
            if (attempts == 1) (void)other.write("/t", "5");  // blocking: other's own thread
            c->write("/t", std::to_string(std::stoi(*v) + 1), finish, tx);
          }, tx);
        },
        [&](client::Result<void> r2) {
          result = r2;
          c->transaction(
              [&](client::TxId tx, client::Finish finish) {
                c->write("/never", "x", [finish](client::Result<void>) {
                  finish(xpv::fail(Error::eperm));
                }, tx);
              },
              [&](client::Result<void> r3) {
                aborted = r3;
                c->close();
              });
        });
  });
  io.run_for(10s);
  ASSERT_TRUE(result);
  EXPECT_EQ(attempts, 2);
  EXPECT_EQ(c->retries(), 1u);
  EXPECT_EQ(*other.read("/t"), "6");
  ASSERT_FALSE(aborted);
  EXPECT_EQ(aborted.error(), Error::eperm);
  EXPECT_EQ(other.read("/never").error(), Error::enoent);
}

TEST(XenstoreClient, ConnectFailureAndBrokenConnection) {
  EXPECT_THROW(SyncClient("/nonexistent/xpv/socket", 2s), std::runtime_error);
  std::optional<SyncClient> c;
  {
    InProcessDaemon d;
    c.emplace(d.socket());
    ASSERT_TRUE(c->write("/x", "1"));
  }  // daemon gone
  auto r = c->read("/x");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), Error::eio);
}

// A connection the daemon ends is reported once, on the client's thread, without a call having to
// fail first; one that learns of the hook only after the break hears of it at once.
TEST(XenstoreClient, ABrokenConnectionIsReportedOnce) {
  std::promise<void> lost;
  std::atomic<int> lost_calls{0};
  std::optional<SyncClient> c;
  {
    InProcessDaemon d;
    c.emplace(d.socket(), 2s);
    c->on_lost([&] {
      if (lost_calls.fetch_add(1) == 0) lost.set_value();
    });
    ASSERT_TRUE(c->write("/x", "1"));
  }  // the daemon gone: a break
  ASSERT_EQ(lost.get_future().wait_for(10s), std::future_status::ready) << "the break was not reported";
  std::promise<void> late;
  c->on_lost([&] { late.set_value(); });
  EXPECT_EQ(late.get_future().wait_for(10s), std::future_status::ready) << "a hook set after the break runs at once";
  EXPECT_FALSE(c->read("/x"));
  c.reset();
  EXPECT_EQ(lost_calls.load(), 1);
}

// The client's own close() is no break, also with a read pending (aborted by it) and with the
// daemon's end of the socket closing afterwards.
TEST(XenstoreClient, ClosingTheConnectionIsNotReportedAsABreak) {
  InProcessDaemon d;
  boost::asio::io_context io;
  auto c = client::Client::create(io);
  bool connected = false, broken = false;
  c->connect(d.socket(), [&](client::Result<void> r) { connected = r.has_value(); });
  for (int i = 0; i < 500 && !connected; ++i) io.run_for(10ms);
  ASSERT_TRUE(connected);
  c->on_broken([&] { broken = true; });
  bool answered = false;
  c->read("/", [&](client::Result<std::string>) { answered = true; });
  c->close();  // the read's answer may or may not have come; the header read is aborted
  io.restart();
  io.run_for(200ms);
  EXPECT_FALSE(broken);
  EXPECT_TRUE(answered) << "the pending call got its EIO (or its answer)";
  EXPECT_FALSE(c->connected());
}

// The probe a backend runs while its xenstored is gone: no answer, looks again; a daemon at the
// socket, calls back once and stops looking; cancelled, never calls back.
TEST(XenstoredProbe, CallsBackOnceWhenADaemonAnswersAtTheSocket) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "xpv-xsprobe-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  EXPECT_FALSE(client::xenstored_answers(dir + "/nothing", 200ms));
  boost::asio::io_context io;
  client::XenstoredProbe probe(io);
  int answered = 0;
  std::optional<InProcessDaemon> d;
  probe.start(dir + "/nothing", 50ms, [&] { ++answered; });
  // Looks until a daemon answers; `io` runs here, bounded.
  for (int i = 0; i < 500 && probe.looks() < 3; ++i) io.run_for(10ms);
  EXPECT_GE(probe.looks(), 3u);
  EXPECT_EQ(answered, 0);
  EXPECT_TRUE(probe.running());
  d.emplace();
  EXPECT_TRUE(client::xenstored_answers(d->socket(), 2s));
  probe.start(d->socket(), 500ms, [&] { ++answered; });  // 500 ms to connect and answer
  for (int i = 0; i < 1000 && answered == 0; ++i) io.run_for(10ms);
  EXPECT_EQ(answered, 1);
  EXPECT_FALSE(probe.running());
  // With the answer the probe armed nothing more, so io ran out of work and stopped: restart it
  // for each of the checks below, or they would run nothing and prove nothing.
  const auto looks = probe.looks();
  io.restart();
  io.run_for(100ms);
  EXPECT_EQ(probe.looks(), looks) << "it stopped looking";
  probe.start(d->socket(), 20ms, [&] { ++answered; });
  probe.cancel();
  io.restart();
  io.run_for(100ms);
  EXPECT_EQ(answered, 1) << "a cancelled probe calls nobody";
  EXPECT_EQ(probe.looks(), looks) << "nor looks";
  d.reset();
  std::filesystem::remove_all(dir);
}
