// The domain control socket end to end: a ControlServer on a real SOCK_SEQPACKET socket in a
// temporary directory, driven by ControlClient and by raw datagrams.
#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <string_view>
#include <thread>

#include "xpv/domain/control.h"
#include "xpv/domain/seqpacket.h"
#include "xpv/test/sanitizers.h"
#include "xpv/test/run_on.h"

namespace xpv::domain {
namespace {

namespace asio = boost::asio;
using namespace control;

// The domain side: memory with a known byte pattern, two grant frames, ports 5 and 6 unbound for
// dom0, everything else refused.
class FakeDomain : public ControlHandler {
 public:
  FakeDomain() : mem_(DomainMemory::create("fake", {{0, 0x10000}})) {
    auto p = mem_.view().translate(0x2000, 4);
    std::memcpy(p->data(), "XPV!", 4);
  }
  DomainInfo info() override { return {7, 2, DomainKind::process, "guest-a"}; }
  const DomainMemory& memory() override { return mem_; }
  GrantTableInfo grant_table() override { return {{0xe, 0xf}, 64}; }
  Expected<Dom0Binding, int> bind_interdomain(std::uint32_t remote_port) override {
    bind_calls.push_back(remote_port);
    if (before_bind) before_bind();
    if (remote_port != 5 && remote_port != 6) return fail(EINVAL);
    if (bound_.count(remote_port)) return fail(EBUSY);
    Dom0Binding b;
    b.port = remote_port + 100;
    b.to_dom0 = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    b.from_dom0 = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    kick_[b.port] = UniqueFd(::dup(b.from_dom0.get()));
    notify_[b.port] = UniqueFd(::dup(b.to_dom0.get()));
    bound_.insert(remote_port);
    return b;
  }
  Expected<void, int> unbind(std::uint32_t port) override {
    unbound.push_back(port);
    bound_.erase(port - 100);
    return {};
  }
  Expected<XenstoreInfo, int> xenstore() override { return XenstoreInfo{0xfeffc, 1}; }

  std::map<std::uint32_t, UniqueFd> kick_;    // the domain's view of from_dom0
  std::map<std::uint32_t, UniqueFd> notify_;  // the domain's view of to_dom0
  std::vector<std::uint32_t> unbound;
  std::vector<std::uint32_t> bind_calls;
  std::function<void()> before_bind;  // on the io thread, before each bind (may throw, may wait)

 private:
  DomainMemory mem_;
  std::set<std::uint32_t> bound_;
};

// Runs the server on its own io_context thread; every access to handler state from the test
// goes through on_io() so that it happens on that thread too.
class ControlSocketTest : public ::testing::Test {
 protected:
  template <class F>
  auto on_io(F f) -> decltype(f()) {
    return xpv::test::run_on(io_, std::move(f));
  }
  void SetUp() override {
    char tmpl[] = "/tmp/xpv-ctl-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = socket_path(7, dir_);
    server_ = std::make_unique<ControlServer>(io_, path_, domain_);
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    on_io([this] { server_.reset(); });
    work_.reset();
    io_.stop();
    thread_.join();
    std::filesystem::remove_all(dir_);
  }
  // Waits (bounded) until the server has seen `n` connections close or open.
  void wait_for_connections(std::size_t n) {
    for (int i = 0; i < 500 && on_io([this] { return server_->connections(); }) != n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_EQ(on_io([this] { return server_->connections(); }), n);
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  FakeDomain domain_;
  std::string dir_, path_;
  std::unique_ptr<ControlServer> server_;
  std::thread thread_;
};

TEST_F(ControlSocketTest, HelloReportsTheDomain) {
  auto c = ControlClient::connect(path_, "test");
  EXPECT_EQ(c.domain().domid, 7);
  EXPECT_EQ(c.domain().nr_vcpus, 2);
  EXPECT_EQ(c.domain().kind, DomainKind::process);
  EXPECT_EQ(c.domain().name, "guest-a");
}

TEST_F(ControlSocketTest, SocketFileIsRootOnly) {
  auto st = std::filesystem::status(path_);
  EXPECT_EQ(st.permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

TEST_F(ControlSocketTest, MemoryIsSharedWithTheService) {
  auto c = ControlClient::connect(path_, "test");
  DomainMemory m = c.map_memory();
  auto p = m.view().translate(0x2000, 4);
  ASSERT_TRUE(p);
  EXPECT_EQ(std::memcmp(p->data(), "XPV!", 4), 0);
  // A write by the service is seen by the domain: it is the same memory.
  std::memcpy(p->data(), "back", 4);
  auto mine = on_io([this] { return domain_.memory().view().translate(0x2000, 4); });
  EXPECT_EQ(std::memcmp(mine->data(), "back", 4), 0);
}

TEST_F(ControlSocketTest, GrantTableAndXenstore) {
  auto c = ControlClient::connect(path_, "test");
  auto g = c.grant_table();
  EXPECT_EQ(g.gfns, (std::vector<std::uint64_t>{0xe, 0xf}));
  EXPECT_EQ(g.max_frames, 64u);
  auto x = c.xenstore();
  EXPECT_EQ(x.gfn, 0xfeffcu);
  EXPECT_EQ(x.port, 1u);
}

TEST_F(ControlSocketTest, BindReturnsWorkingEventfds) {
  auto c = ControlClient::connect(path_, "test");
  Dom0Binding b = c.bind_interdomain(5);
  EXPECT_EQ(b.port, 105u);
  // dom0 kicks the guest: the domain's end of from_dom0 counts it.
  std::uint64_t one = 1;
  ASSERT_EQ(::write(b.from_dom0.get(), &one, sizeof one), 8);
  std::uint64_t got = 0;
  int kick = on_io([this] { return domain_.kick_.at(105).get(); });
  ASSERT_EQ(::read(kick, &got, sizeof got), 8);
  EXPECT_EQ(got, 1u);
  // The guest notifies dom0: to_dom0 becomes readable.
  int notify = on_io([this] { return domain_.notify_.at(105).get(); });
  std::uint64_t two = 2;
  ASSERT_EQ(::write(notify, &two, sizeof two), 8);
  ASSERT_EQ(::read(b.to_dom0.get(), &got, sizeof got), 8);
  EXPECT_EQ(got, 2u);
}

TEST_F(ControlSocketTest, HandlerErrorsReachTheClientWithTheirErrno) {
  auto c = ControlClient::connect(path_, "test");
  try {
    c.bind_interdomain(9);
    FAIL() << "bind of a port that is not unbound for dom0 succeeded";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.error(), EINVAL);
  }
  c.bind_interdomain(6);
  try {
    c.bind_interdomain(6);
    FAIL() << "double bind succeeded";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.error(), EBUSY);
  }
}

// A bind whose answer comes after the client gave up: the client drops that late answer (it no
// longer takes it for the answer to its next call) and undoes the bind before its next request,
// so the connection goes on working and the guest port can be bound again.
TEST_F(ControlSocketTest, ALateBindAnswerIsDroppedAndItsBindUndone) {
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  on_io([&] {
    domain_.before_bind = [open] { (void)open.wait_for(std::chrono::seconds(10)); };  // bounded
  });
  auto c = ControlClient::connect(path_, "slow-domain", /*timeout_ms=*/1000);
  try {
    c.bind_interdomain(5);
    FAIL() << "the bind answered although the domain was held";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.error(), ETIMEDOUT);
  }
  gate.set_value();  // the domain now binds port 5 and answers, late
  on_io([&] { domain_.before_bind = nullptr; });
  Dom0Binding b = c.bind_interdomain(6);
  EXPECT_EQ(b.port, 106u) << "the answer to this call, not the late one";
  EXPECT_EQ(on_io([this] { return domain_.unbound; }), std::vector<std::uint32_t>{105})
      << "the late bind was undone";
  EXPECT_EQ(c.bind_interdomain(5).port, 105u) << "and port 5 binds again";
  EXPECT_EQ(c.grant_table().max_frames, 64u);
}

// A handler that throws (no memory, no descriptors) ends that client's connection and releases
// what it bound; the domain's loop and the other clients go on.
TEST_F(ControlSocketTest, AHandlerThatThrowsEndsOnlyThatConnection) {
  auto other = ControlClient::connect(path_, "other");
  auto c = ControlClient::connect(path_, "unlucky", /*timeout_ms=*/2000);
  wait_for_connections(2);
  Dom0Binding held = c.bind_interdomain(5);
  on_io([&] { domain_.before_bind = [] { throw std::bad_alloc(); }; });
  try {
    c.bind_interdomain(6);
    FAIL() << "a bind whose handler threw succeeded";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.error(), ECONNRESET) << e.what();
  }
  wait_for_connections(1);
  EXPECT_EQ(on_io([this] { return domain_.unbound; }), std::vector<std::uint32_t>{105})
      << "what the closed connection bound is released";
  on_io([&] { domain_.before_bind = nullptr; });
  EXPECT_EQ(other.bind_interdomain(6).port, 106u) << "the server still answers";
  EXPECT_EQ(other.bind_interdomain(5).port, 105u);
  (void)held;
}

TEST_F(ControlSocketTest, UnbindOnlyWhatThisConnectionBound) {
  auto a = ControlClient::connect(path_, "a");
  auto b = ControlClient::connect(path_, "b");
  Dom0Binding bound = a.bind_interdomain(5);
  try {
    b.unbind(bound.port);
    FAIL() << "a connection unbound another connection's port";
  } catch (const ControlError& e) {
    EXPECT_EQ(e.error(), ENOENT);
  }
  a.unbind(bound.port);
  EXPECT_EQ(on_io([this] { return domain_.unbound; }), std::vector<std::uint32_t>{105});
}

TEST_F(ControlSocketTest, AServiceThatGoesAwayLeavesItsPortsUnbound) {
  {
    auto c = ControlClient::connect(path_, "crashing-backend");
    c.bind_interdomain(5);
    c.bind_interdomain(6);
    wait_for_connections(1);
  }  // the client's socket closes, as when a backend is killed
  wait_for_connections(0);
  auto unbound = on_io([this] { return domain_.unbound; });
  std::sort(unbound.begin(), unbound.end());
  EXPECT_EQ(unbound, (std::vector<std::uint32_t>{105, 106}));
  // A restarted service binds the same guest ports again.
  auto again = ControlClient::connect(path_, "restarted-backend");
  EXPECT_EQ(again.bind_interdomain(5).port, 105u);
}

TEST_F(ControlSocketTest, RequestsBeforeHelloAreRefused) {
  UniqueFd s = connect_seqpacket(path_);
  auto req = encode(static_cast<std::uint16_t>(MsgType::get_xenstore), 1, {});
  ASSERT_TRUE(send_datagram(s.get(), req));
  ASSERT_TRUE(*wait_readable(s.get(), 5000));
  auto d = recv_datagram(s.get(), kMaxMessage, kMaxFds);
  ASSERT_TRUE(d);
  auto m = parse(d->bytes);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->header.type, kErrorType);
  auto e = decode_fixed<ErrorPayload>(m->payload);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->error, EPROTO);
}

// A request that does not parse closes the connection before hello as after it: the hello rule
// answers only well-formed requests.
TEST_F(ControlSocketTest, AMalformedRequestBeforeHelloClosesTheConnection) {
  UniqueFd s = connect_seqpacket(path_);
  const std::uint8_t extra[1] = {0};
  ASSERT_TRUE(send_datagram(s.get(), encode(static_cast<std::uint16_t>(MsgType::get_xenstore), 1, extra)));
  ASSERT_TRUE(*wait_readable(s.get(), 5000));
  auto d = recv_datagram(s.get(), kMaxMessage, kMaxFds);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->bytes.empty()) << "the server should have closed the connection";
}

TEST_F(ControlSocketTest, NonZeroPaddingClosesTheConnection) {
  auto good = ControlClient::connect(path_, "good");
  UniqueFd s = connect_seqpacket(path_);
  HelloRequest h{};
  copy_string(h.client_name, "padder");
  ASSERT_TRUE(send_datagram(s.get(), encode(static_cast<std::uint16_t>(MsgType::hello), 1, bytes_of(h))));
  ASSERT_TRUE(*wait_readable(s.get(), 5000));
  auto hello = recv_datagram(s.get(), kMaxMessage, kMaxFds);
  ASSERT_TRUE(hello);
  ASSERT_TRUE(parse(hello->bytes));
  ASSERT_EQ(parse(hello->bytes)->header.type, static_cast<std::uint16_t>(MsgType::hello) | kResponseBit);
  BindRequest b{5, 0xdead};
  ASSERT_TRUE(send_datagram(s.get(), encode(static_cast<std::uint16_t>(MsgType::bind_interdomain), 2, bytes_of(b))));
  ASSERT_TRUE(*wait_readable(s.get(), 5000));
  auto d = recv_datagram(s.get(), kMaxMessage, kMaxFds);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->bytes.empty()) << "a bind with padding set must close the connection";
  EXPECT_TRUE(on_io([this] { return domain_.bind_calls.empty(); })) << "and bind nothing";
  EXPECT_EQ(good.bind_interdomain(5).port, 105u);
}

TEST_F(ControlSocketTest, OnlyDom0MayConnect) {
  UniqueFd s = connect_seqpacket(path_);
  HelloRequest h{};
  h.client_domid = 3;
  copy_string(h.client_name, "domU");
  ASSERT_TRUE(send_datagram(s.get(), encode(static_cast<std::uint16_t>(MsgType::hello), 1, bytes_of(h))));
  ASSERT_TRUE(*wait_readable(s.get(), 5000));
  auto d = recv_datagram(s.get(), kMaxMessage, kMaxFds);
  auto m = parse(d->bytes);
  ASSERT_TRUE(m);
  ASSERT_EQ(m->header.type, kErrorType);
  EXPECT_EQ(decode_fixed<ErrorPayload>(m->payload)->error, EPERM);
}

TEST_F(ControlSocketTest, GarbageClosesThatConnectionOnly) {
  auto good = ControlClient::connect(path_, "good");
  UniqueFd bad = connect_seqpacket(path_);
  const std::uint8_t junk[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
  ASSERT_TRUE(send_datagram(bad.get(), junk));
  ASSERT_TRUE(*wait_readable(bad.get(), 5000));
  auto d = recv_datagram(bad.get(), kMaxMessage, kMaxFds);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->bytes.empty()) << "the server should have closed the connection";
  // The other client is still served.
  EXPECT_EQ(good.xenstore().port, 1u);
}

TEST_F(ControlSocketTest, FdsSentToTheServerAreRefused) {
  UniqueFd s = connect_seqpacket(path_);
  HelloRequest h{};
  copy_string(h.client_name, "fd-smuggler");
  UniqueFd extra(::eventfd(0, EFD_CLOEXEC));
  const int fds[1] = {extra.get()};
  ASSERT_TRUE(send_datagram(s.get(), encode(static_cast<std::uint16_t>(MsgType::hello), 1, bytes_of(h)), fds));
  ASSERT_TRUE(*wait_readable(s.get(), 5000));
  auto d = recv_datagram(s.get(), kMaxMessage, kMaxFds);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->bytes.empty()) << "a request carrying fds must close the connection";
}

TEST_F(ControlSocketTest, ConnectingToAMissingDomainFailsClearly) {
  EXPECT_THROW(ControlClient::connect(dir_ + "/dom99.sock", "test"), std::system_error);
}

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

using xpv::test::kSanitized;  // exhausting fds does not work under the sanitizers

// Found while fuzzing the control socket (tests/fuzz/control) with many connections: out of fds,
// accept() fails with EMFILE and leaves the connection in the backlog, so the listener stays
// readable; the server must not wait for it again at once (a spinning control thread and an
// error line each turn), and must serve the connection once fds are back.
TEST_F(ControlSocketTest, AFullFdTableDoesNotSpinTheAcceptLoop) {
  if (kSanitized) GTEST_SKIP() << "exhausts the process's fds, which the sanitizers' checks need";
  struct AcceptLines : spdlog::sinks::base_sink<std::mutex> {
    std::atomic<long> lines{0};
    void sink_it_(const spdlog::details::log_msg& m) override {
      if (std::string_view(m.payload.data(), m.payload.size()).find("accept") != std::string_view::npos) ++lines;
    }
    void flush_() override {}
  };
  static const auto counter = std::make_shared<AcceptLines>();  // outlives any line the io thread logs
  static const auto logger = std::make_shared<spdlog::logger>("accept-lines", counter);
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  counter->lines = 0;
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  std::vector<UniqueFd> filler;
  UniqueFd client;
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, open_fds() + 16);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  for (UniqueFd f(::eventfd(0, EFD_CLOEXEC)); f; f = UniqueFd(::eventfd(0, EFD_CLOEXEC))) filler.push_back(std::move(f));
  filler.pop_back();  // room for the client's socket, none for the server's end
  client = connect_seqpacket(path_);
  for (int i = 0; i < 500 && counter->lines.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const long first = counter->lines.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a spinning loop fails thousands of times
  const long more = counter->lines.load() - first;
  filler.clear();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  spdlog::set_default_logger(previous);
  EXPECT_GE(first, 1) << "accept() did not fail: the fd table was not full";
  EXPECT_LE(more, 10) << "accept() failed " << more << " more times in 300 ms: the accept loop spins";
  // Fds are back: the connection that waited in the backlog is served.
  HelloRequest h{};
  copy_string(h.client_name, "patient");
  ASSERT_TRUE(send_datagram(client.get(), encode(static_cast<std::uint16_t>(MsgType::hello), 1, bytes_of(h))));
  ASSERT_TRUE(*wait_readable(client.get(), 5000));
  auto d = recv_datagram(client.get(), kMaxMessage, kMaxFds);
  ASSERT_TRUE(d);
  auto m = parse(d->bytes);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->header.type, static_cast<std::uint16_t>(MsgType::hello) | kResponseBit);
}

TEST(Seqpacket, TooManyFdsAreAnErrorAndNoneLeak) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  UniqueFd e1(::eventfd(0, EFD_CLOEXEC)), e2(::eventfd(0, EFD_CLOEXEC)), e3(::eventfd(0, EFD_CLOEXEC));
  const int fds[3] = {e1.get(), e2.get(), e3.get()};
  const std::uint8_t byte = 1;
  ASSERT_TRUE(send_datagram(a.get(), std::span(&byte, 1), fds));
  const auto before = open_fds();
  {
    auto d = recv_datagram(b.get(), 16, 2);
    ASSERT_FALSE(d);
    EXPECT_EQ(d.error().value(), EMSGSIZE);
  }
  EXPECT_EQ(open_fds(), before) << "fds received with a refused datagram must be closed";
}

TEST(Seqpacket, OversizedDatagramIsAnError) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  std::vector<std::uint8_t> big(100, 7);
  ASSERT_TRUE(send_datagram(a.get(), big));
  auto d = recv_datagram(b.get(), 64, 0);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().value(), EMSGSIZE);
}

}  // namespace
}  // namespace xpv::domain
