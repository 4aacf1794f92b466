// The domain control socket (hypervisor-core/domain: ControlServer, control_protocol.h) against a
// hostile client: seeded, bounded fuzzing on the real AF_UNIX SOCK_SEQPACKET socket of a server
// running on its own io thread, with a handler that records every call.
//
// Each seed opens and closes connections and sends, one at a time (so that every outcome is
// exact): well-formed requests of every type (hello as dom0 or as another domain, before and
// after hello, ports and vCPUs in and out of range, unbinds of ports this connection, another
// one or nobody bound), then mutated ones — magic, version, type (unknown, a response, the error
// type), seq, length field, payload truncated, extended, replaced by random bytes, oversize (past
// kMaxMessage) and exactly kMaxMessage; empty datagrams; random bytes; 1..6 fds attached by
// SCM_RIGHTS to any of these; a request sent and the connection closed before its answer; bursts
// of up to 48 connections opened and dropped at once; (one seed in 40, not under the sanitizers)
// the process out of fds while clients connect, so that the server's accept() fails with EMFILE.
//
// Invariants (each one breaks on a real bug), per control_protocol.h:
//  - a message that does not parse (short, bad magic/version/length, unknown type, a response or
//    error type from a client, a payload of the wrong size, non-zero padding or an unterminated
//    name, any fd attached, an empty or oversize datagram) closes the connection, before hello as
//    after it: the client reads EOF and no answer, and the server drops it;
//  - a parsed request is answered exactly: the answer type (T | kResponseBit) and seq, the payload
//    byte for byte, and exactly the fds fds_for() gives — or, for an op that fails, kErrorType with
//    the errno the protocol names (EPROTO before hello, EPERM for a hello not as dom0, ENOENT for a
//    port this connection did not bind, the handler's own errno otherwise) and a NUL-terminated
//    message, no fds; the connection stays open;
//  - the handler is called exactly as the model says, only on the io thread, never for a message
//    that closes the connection or before hello, unbind() only for a port it handed out and that is
//    still bound (each port once, when its connection asks or goes away);
//  - every wait is bounded (an answer within 5 s, a dropped connection within 5 s); connections
//    that waited in the backlog while the process was out of fds are served once fds are back;
//  - after each seed: no connection left, no port left bound, /proc/self/fd as before the first
//    seed (received fds are the test's and are closed), and a well-behaved ControlClient on a new
//    connection gets correct answers to every request.
// And the fuzz reached the working paths: answers, error answers and closes of every type, binds
// and fds passed (checked at the end over all seeds).
// A failure prints its seed (SCOPED_TRACE); XPV_FUZZ_ITERATIONS=N runs seeds 1..N (default 300),
// XPV_FUZZ_SEED=S seed S alone.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "xpv/domain/control.h"
#include "xpv/domain/seqpacket.h"
#include "xpv/test/fuzz_seeds.h"
#include "xpv/test/sanitizers.h"
#include "xpv/test/run_on.h"

namespace xpv::domain {
namespace {

namespace asio = boost::asio;
using namespace control;
using Rng = std::mt19937_64;
using Bytes = std::vector<std::uint8_t>;

using xpv::test::kSanitized;  // steps that exhaust fds do not run under the sanitizers

constexpr int kTimeoutMs = 5000;
constexpr std::uint32_t kFirstPort = 5, kLastPort = 12;  // guest ports unbound for dom0
constexpr std::uint32_t kDom0Offset = 100;             // dom0 port = guest port + 100
constexpr std::uint16_t kDomid = 7;
constexpr std::uint16_t kVcpus = 2;
constexpr int kLastType = static_cast<int>(MsgType::set_vcpu_affinity);  // request types are 1..kLastType
const char* const kName = "guest-fuzz";

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

template <class T>
Bytes bytes(const T& v) {
  auto s = bytes_of(v);
  return Bytes(s.begin(), s.end());
}

// A handler call as the handler saw it.
struct Call {
  char op = 0;  // i(nfo) m(emory) g(rant table) b(ind) u(nbind) x(enstore) p (unpause) d(irect upcall) P(ause) t(hreads) a(ffinity)
  std::uint32_t arg = 0;
  bool operator==(const Call&) const = default;
};
std::string show(const std::vector<Call>& cs) {
  std::string s = "[";
  for (const Call& c : cs) s += std::string(" ") + c.op + std::to_string(c.arg);
  return s + " ]";
}

// The domain: two memory regions with a known byte, two grant frames, guest ports 5..12 unbound
// for dom0, two vCPUs with direct upcalls; xenstore, unpause, pause and vCPU threads answer as the test sets them.
class FuzzDomain : public ControlHandler {
 public:
  FuzzDomain() : mem_(DomainMemory::create("control-fuzz", {{0, 0x10000}, {0x100000, 0x4000}})) {
    std::memcpy(mem_.view().translate(0x2000, 4)->data(), "XPV!", 4);
    table_ = UniqueFd(::eventfd(0, EFD_CLOEXEC));
    for (auto& v : vcpu_) v = UniqueFd(::eventfd(0, EFD_CLOEXEC));
  }
  DomainInfo info() override {
    note({'i', 0});
    return {kDomid, kVcpus, DomainKind::process, kName};
  }
  const DomainMemory& memory() override {
    note({'m', 0});
    return mem_;
  }
  GrantTableInfo grant_table() override {
    note({'g', 0});
    return {{0xe, 0xf}, 64};
  }
  Expected<Dom0Binding, int> bind_interdomain(std::uint32_t remote_port) override {
    note({'b', remote_port});
    if (remote_port < kFirstPort || remote_port > kLastPort) return fail(EINVAL);
    if (bound.count(remote_port + kDom0Offset)) return fail(EBUSY);
    Dom0Binding b;
    b.port = remote_port + kDom0Offset;
    b.to_dom0 = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    b.from_dom0 = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    bound.insert(b.port);
    return b;
  }
  Expected<void, int> unbind(std::uint32_t port) override {
    note({'u', port});
    if (bound.erase(port) == 0) violations.push_back("unbind(" + std::to_string(port) + ") of a port not bound");
    return {};
  }
  Expected<XenstoreInfo, int> xenstore() override {
    note({'x', 0});
    if (!xenstore_ok) return fail(ENOENT);
    return XenstoreInfo{0xfeffc, 1};
  }
  Expected<void, int> unpause() override {
    note({'p', 0});
    if (++unpauses % 2 == 0) return fail(EALREADY);
    return {};
  }
  Expected<void, int> pause() override {
    note({'P', 0});
    if (++pauses % 2 == 0) return fail(EALREADY);
    return {};
  }
  Expected<std::vector<std::uint32_t>, int> vcpu_threads() override {
    note({'t', 0});
    if (++thread_asks % 2 == 0) return fail(EOPNOTSUPP);
    return std::vector<std::uint32_t>{4242, 0};
  }
  Expected<void, int> set_vcpu_affinity(std::uint32_t vcpu, const CpuMask& cpus) override {
    note({'a', vcpu});
    if (vcpu >= kVcpus && vcpu != kAllVcpus) return fail(ENOENT);
    if (std::all_of(cpus.begin(), cpus.end(), [](std::uint64_t w) { return w == 0; })) return fail(EINVAL);
    return {};
  }
  Expected<DirectFds, int> direct_upcall(std::uint32_t vcpu) override {
    note({'d', vcpu});
    if (vcpu >= kVcpus) return fail(ENOENT);
    return DirectFds{kVcpus, table_.get(), vcpu_[vcpu].get()};
  }

  // All of these only on the io thread (the test reads them through on_io()).
  std::vector<Call> calls;
  std::vector<std::string> violations;
  std::set<std::uint32_t> bound;  // dom0 ports handed out and not unbound
  bool xenstore_ok = true;
  unsigned unpauses = 0;
  unsigned pauses = 0;
  unsigned thread_asks = 0;
  std::thread::id io_thread;

 private:
  void note(Call c) {
    calls.push_back(c);
    if (std::this_thread::get_id() != io_thread) violations.push_back(std::string("handler called off the io thread: ") + c.op);
  }
  DomainMemory mem_;
  UniqueFd table_;
  UniqueFd vcpu_[kVcpus];
};

// What the server must do with one message.
struct Outcome {
  enum Kind { close, error, answer } kind = close;
  int err = 0;                 // error
  std::uint16_t type = 0;      // answer
  std::uint32_t seq = 0;
  Bytes payload;               // answer
  std::size_t fds = 0;         // answer
  std::vector<Call> calls;     // the handler's, in order
  std::optional<std::uint32_t> new_port;  // a bind that succeeds
};

struct Conn {
  UniqueFd sock;
  bool hello = false;
  std::set<std::uint32_t> bound;  // dom0 ports this connection holds
};

struct Totals {
  std::uint64_t answers[kLastType + 1] = {}, errors[kLastType + 1] = {};  // by request type
  std::uint64_t closes = 0, fd_closes = 0, binds = 0, fds_received = 0,
                mid_message = 0, bursts = 0, well_behaved = 0, starved = 0,
                starved_accepts = 0;
};
Totals totals;

// The server on its own io thread, for the whole test (fd counts are taken against it).
class Server {
 public:
  Server() {
    char tmpl[] = "/tmp/xpv-ctl-fuzz-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp");
    dir_ = tmpl;
    path_ = socket_path(kDomid, dir_);
    server_ = std::make_unique<ControlServer>(io_, path_, domain_);
    thread_ = std::thread([this] { io_.run(); });
    on_io([this] {
      domain_.io_thread = std::this_thread::get_id();
      return 0;
    });
    on_io([this] {
      for (const MemoryRegion& r : domain_.memory().layout()) regions_.push_back({r.gpa, r.size, r.offset});
      domain_.calls.clear();
      return 0;
    });
  }
  ~Server() {
    on_io([this] {
      server_.reset();
      return 0;
    });
    work_.reset();
    io_.stop();
    thread_.join();
    std::filesystem::remove_all(dir_);
  }
  template <class F>
  auto on_io(F f) -> decltype(f()) {
    return xpv::test::run_on(io_, std::move(f), std::chrono::milliseconds(kTimeoutMs));
  }
  // Waits (bounded) for the server to hold `n` connections.
  bool connections_are(std::size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (std::chrono::steady_clock::now() < deadline) {
      if (on_io([this] { return server_->connections(); }) == n) return true;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return false;
  }
  std::size_t connections() {
    return on_io([this] { return server_->connections(); });
  }
  std::vector<Call> take_calls() {
    return on_io([this] { return std::exchange(domain_.calls, {}); });
  }

  const std::string& path() const { return path_; }
  const std::vector<RegionWire>& regions() const { return regions_; }
  FuzzDomain& domain() { return domain_; }  // through on_io() only

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  FuzzDomain domain_;
  std::string dir_, path_;
  std::unique_ptr<ControlServer> server_;
  std::thread thread_;
  std::vector<RegionWire> regions_;
};

class World {
 public:
  World(std::uint64_t seed, Server& server) : rng_(seed), server_(server) {}

  void run(unsigned steps) {
    xenstore_ok_ = !one_in(4);
    server_.on_io([&] { return server_.domain().xenstore_ok = xenstore_ok_; });
    unpauses_ = server_.on_io([&] { return server_.domain().unpauses; });
    pauses_ = server_.on_io([&] { return server_.domain().pauses; });
    thread_asks_ = server_.on_io([&] { return server_.domain().thread_asks; });
    if (one_in(40) && !kSanitized) {
      starve();
      if (::testing::Test::HasFailure()) return;
    }
    for (unsigned s = 0; s < steps; ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      const auto what = below(20);
      if (conns_.empty() || (what == 0 && conns_.size() < 16)) {
        open();
      } else if (what == 1) {
        drop(below(conns_.size()));
      } else if (what == 2) {
        send_and_close();
      } else if (what == 3 && one_in(4)) {
        burst();
      } else {
        send_one(below(conns_.size()));
      }
      if (::testing::Test::HasFailure()) return;
    }
    while (!conns_.empty()) {
      drop(0);
      if (::testing::Test::HasFailure()) return;
    }
    ASSERT_TRUE(server_.connections_are(0)) << "the server kept connections the clients closed";
    EXPECT_EQ(server_.on_io([&] { return server_.domain().bound; }), std::set<std::uint32_t>{}) << "ports left bound";
  }

 private:
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool one_in(std::uint64_t n) { return below(n) == 0; }

  std::size_t live() const { return conns_.size(); }

  void open() {
    Conn c;
    c.sock = connect_seqpacket(server_.path());
    conns_.push_back(std::move(c));
    ASSERT_TRUE(server_.connections_are(live())) << "a new connection was not accepted";
    if (one_in(3)) return;  // no hello yet
    HelloRequest h{};
    copy_string(h.client_name, "fuzz-" + std::to_string(below(1000)));
    exchange(conns_.size() - 1, encode(static_cast<std::uint16_t>(MsgType::hello), next_seq(), bytes_of(h)), 0);
  }

  // The client goes away: the server unbinds what it held, in port order.
  void drop(std::size_t i) {
    std::vector<Call> want;
    for (std::uint32_t p : conns_[i].bound) {
      want.push_back({'u', p});
      bound_.erase(p);
    }
    conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i));
    ASSERT_TRUE(server_.connections_are(live())) << "a closed connection was not dropped";
    expect_calls(want);
  }

  // A request, then the connection closed before its answer: what it asked is done, then undone.
  void send_and_close() {
    ++totals.mid_message;
    const std::size_t i = below(conns_.size());
    Conn& c = conns_[i];
    auto [msg, nfds] = message(c);
    const Outcome o = predict(c, msg, nfds);
    ASSERT_TRUE(send_with_fds(c.sock.get(), msg, nfds));
    std::vector<Call> want = o.calls;
    std::set<std::uint32_t> held = c.bound;
    if (o.new_port) held.insert(*o.new_port);
    for (std::uint32_t p : held) {
      want.push_back({'u', p});
      bound_.erase(p);
    }
    conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i));
    ASSERT_TRUE(server_.connections_are(live())) << "a connection closed mid-request was not dropped";
    expect_calls(want);
  }

  // Many connections at once, some saying hello, all dropped without waiting.
  void burst() {
    ++totals.bursts;
    std::vector<UniqueFd> socks;
    const std::size_t n = 1 + below(48);
    std::size_t hellos = 0;
    for (std::size_t k = 0; k < n; ++k) {
      socks.push_back(connect_seqpacket(server_.path()));
      if (one_in(2)) {
        HelloRequest h{};
        copy_string(h.client_name, "burst");
        ASSERT_TRUE(send_datagram(socks.back().get(), encode(static_cast<std::uint16_t>(MsgType::hello), 1, bytes_of(h))));
        ++hellos;
      }
    }
    socks.clear();
    // A fence: accepted after every connection of the burst (the backlog is in order), and
    // answered; once it is gone too and the count is back, every burst connection was served.
    {
      UniqueFd fence = connect_seqpacket(server_.path());
      HelloRequest h{};
      copy_string(h.client_name, "fence");
      ASSERT_TRUE(send_datagram(fence.get(), encode(static_cast<std::uint16_t>(MsgType::hello), 1, bytes_of(h))));
      auto ready = wait_readable(fence.get(), kTimeoutMs);
      ASSERT_TRUE(ready && *ready) << "no answer within " << kTimeoutMs << " ms after a burst of " << n;
      auto d = recv_datagram(fence.get(), kMaxMessage, kMaxFds);
      ASSERT_TRUE(d && !d->bytes.empty()) << "the server closed a well-formed hello after a burst";
    }
    ASSERT_TRUE(server_.connections_are(live())) << "a burst of " << n << " connections was not dropped";
    // Each hello was answered (info()) or found its client gone (info() all the same, the answer
    // failed); the fence's was answered.
    const auto calls = server_.take_calls();
    EXPECT_EQ(calls.size(), hellos + 1);
    for (const Call& c : calls) EXPECT_EQ(c, (Call{'i', 0}));
  }

  // The process out of fds (RLIMIT_NOFILE just above what is open): clients connect until
  // socket() fails or 10 are waiting (fewer than the backlog: a connect would block), the
  // server's accept() meets EMFILE; once fds are back, each one's hello is answered.
  void starve() {
    ++totals.starved;
    rlimit saved{};
    ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
    rlimit low = saved;
    low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, open_fds() + 4 + below(8));
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    std::vector<UniqueFd> socks;
    // Not connect_seqpacket(): nothing thrown while out of fds.
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, server_.path().c_str(), server_.path().size() + 1);
    for (int k = 0; k < 10; ++k) {
      UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
      if (!s) break;  // this process is out of fds
      ASSERT_EQ(::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
      socks.push_back(std::move(s));
    }
    HelloRequest h{};
    copy_string(h.client_name, "starved");
    for (const UniqueFd& s : socks)
      EXPECT_TRUE(send_datagram(s.get(), encode(static_cast<std::uint16_t>(MsgType::hello), 1, bytes_of(h))));
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + below(150)));
    // Not a check of the server: that some connection is still waiting (accept() met EMFILE).
    if (server_.connections() < live() + socks.size()) ++totals.starved_accepts;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
    for (const UniqueFd& s : socks) {
      auto ready = wait_readable(s.get(), kTimeoutMs);
      ASSERT_TRUE(ready && *ready) << "a connection that waited for fds was not served within " << kTimeoutMs << " ms";
      auto d = recv_datagram(s.get(), kMaxMessage, kMaxFds);
      ASSERT_TRUE(d && d->bytes.size() >= sizeof(Header)) << "a connection that waited for fds was closed";
      Header a;
      std::memcpy(&a, d->bytes.data(), sizeof a);
      EXPECT_EQ(a.type, static_cast<std::uint16_t>(MsgType::hello) | kResponseBit);
    }
    const std::size_t n = socks.size();
    socks.clear();
    ASSERT_TRUE(server_.connections_are(live()));
    EXPECT_EQ(server_.take_calls(), std::vector<Call>(n, Call{'i', 0}));
  }

  std::uint32_t next_seq() { return one_in(8) ? static_cast<std::uint32_t>(rng_()) : ++seq_; }

  // A well-formed request of `type` for connection c, fields in and out of range.
  Bytes request(MsgType type, const Conn& c) {
    const auto t = static_cast<std::uint16_t>(type);
    switch (type) {
      case MsgType::hello: {
        HelloRequest h{};
        h.client_domid = one_in(6) ? static_cast<std::uint16_t>(rng_()) : 0;
        if (one_in(20)) h.pad0 = static_cast<std::uint16_t>(1 + below(0xffff));
        if (one_in(20)) h.pad1 = static_cast<std::uint32_t>(rng_());  // mostly non-zero: padding closes
        if (one_in(8)) {
          std::memset(h.client_name, 'A' + static_cast<int>(below(26)), sizeof h.client_name);  // no NUL
        } else {
          std::string name(below(40), 'n');
          for (char& ch : name) ch = static_cast<char>(1 + below(255));
          copy_string(h.client_name, name);
        }
        return encode(t, next_seq(), bytes_of(h));
      }
      case MsgType::bind_interdomain: {
        BindRequest b{};
        switch (below(4)) {
          case 0: b.remote_port = static_cast<std::uint32_t>(rng_()); break;
          case 1: b.remote_port = std::vector<std::uint32_t>{0, 1, 4, 13, 0xffffffffu, 105}[below(6)]; break;
          default: b.remote_port = kFirstPort + static_cast<std::uint32_t>(below(kLastPort - kFirstPort + 1)); break;
        }
        if (one_in(16)) b.pad = static_cast<std::uint32_t>(rng_());
        return encode(t, next_seq(), bytes_of(b));
      }
      case MsgType::unbind: {
        UnbindRequest u{};
        std::vector<std::uint32_t> candidates(c.bound.begin(), c.bound.end());
        for (const Conn& o : conns_) candidates.insert(candidates.end(), o.bound.begin(), o.bound.end());
        if (!c.bound.empty() && one_in(2)) {
          u.port = *std::next(c.bound.begin(), static_cast<std::ptrdiff_t>(below(c.bound.size())));
        } else if (candidates.empty() || one_in(3)) {
          u.port = one_in(2) ? static_cast<std::uint32_t>(rng_()) : kDom0Offset + static_cast<std::uint32_t>(below(16));
        } else {
          u.port = candidates[below(candidates.size())];
        }
        if (one_in(16)) u.pad = static_cast<std::uint32_t>(rng_());
        return encode(t, next_seq(), bytes_of(u));
      }
      case MsgType::get_direct_upcall: {
        DirectUpcallRequest d{};
        d.vcpu = one_in(3) ? static_cast<std::uint32_t>(rng_()) : static_cast<std::uint32_t>(below(kVcpus + 2));
        if (one_in(16)) d.pad = static_cast<std::uint32_t>(rng_());
        return encode(t, next_seq(), bytes_of(d));
      }
      case MsgType::set_vcpu_affinity: {
        VcpuAffinityRequest a{};
        a.vcpu = one_in(4) ? kAllVcpus : one_in(3) ? static_cast<std::uint32_t>(rng_()) : static_cast<std::uint32_t>(below(kVcpus + 2));
        if (!one_in(6)) a.cpus[below(kCpuMaskWords)] = rng_() | 1;  // else no CPU at all
        if (one_in(16)) a.pad = static_cast<std::uint32_t>(rng_());
        return encode(t, next_seq(), bytes_of(a));
      }
      default: return encode(t, next_seq(), {});
    }
  }

  // A message for connection c (well-formed or mutated) and how many fds ride along.
  std::pair<Bytes, std::size_t> message(const Conn& c) {
    // Binds and unbinds more often than the rest: they are where connections hold state.
    const auto type = one_in(3) ? (one_in(2) ? MsgType::bind_interdomain : MsgType::unbind)
                                : static_cast<MsgType>(1 + below(kLastType));
    Bytes m = request(type, c);
    auto put16 = [&](std::size_t off, std::uint16_t v) { std::memcpy(m.data() + off, &v, 2); };
    auto put32 = [&](std::size_t off, std::uint32_t v) { std::memcpy(m.data() + off, &v, 4); };
    auto fix_length = [&] { put32(12, static_cast<std::uint32_t>(m.size() - sizeof(Header))); };
    switch (below(32)) {  // 12 of 32: mutated
      case 0: put32(0, static_cast<std::uint32_t>(rng_()) | 1u); break;  // bad magic (kMagic is even)
      case 1: put16(4, std::vector<std::uint16_t>{0, 2, 0xffff, static_cast<std::uint16_t>(rng_())}[below(4)]); break;
      case 2: put16(6, std::vector<std::uint16_t>{0, 10, 0x7fff, static_cast<std::uint16_t>(m[6] | 0x8000), kErrorType,
                                                  static_cast<std::uint16_t>(rng_())}[below(6)]);
        break;
      case 3: put32(12, static_cast<std::uint32_t>(m.size() - sizeof(Header)) + (one_in(2) ? 1u : -1u)); break;
      case 4: put32(12, static_cast<std::uint32_t>(rng_())); break;
      case 5: m.resize(below(m.size())); break;  // truncated, maybe below a header
      case 6:
        m.resize(m.size() - std::min<std::size_t>(m.size() - sizeof(Header), 1 + below(8)));
        fix_length();  // a payload too short for its type
        break;
      case 7:
        for (std::size_t k = 1 + below(64); k > 0; --k) m.push_back(static_cast<std::uint8_t>(rng_()));
        if (one_in(3)) break;  // and the length field disagrees
        fix_length();
        break;
      case 8: {  // oversize, the header consistent with it
        m.resize(kMaxMessage + 1 + below(256), 0x5a);
        fix_length();
        break;
      }
      case 9: m.resize(kMaxMessage, 0xa5); fix_length(); break;  // exactly the largest, wrong for the type
      case 10: {  // random bytes behind a valid header, or altogether
        const std::size_t n = below(300);
        if (one_in(2)) m.resize(sizeof(Header));
        else m.clear();
        for (std::size_t k = 0; k < n; ++k) m.push_back(static_cast<std::uint8_t>(rng_()));
        if (m.size() >= sizeof(Header) && one_in(2)) {
          put32(0, kMagic);
          put16(4, kVersion);
          fix_length();
        }
        break;
      }
      case 11: m.clear(); break;  // an empty datagram
      default: break;             // well-formed
    }
    const std::size_t nfds = one_in(10) ? 1 + below(6) : 0;
    return {std::move(m), nfds};
  }

  // The server's answer to `msg` on `c`, from control_protocol.h; updates the model.
  Outcome predict(Conn& c, const Bytes& msg, std::size_t nfds) {
    Outcome o;
    if (nfds != 0 || msg.empty() || msg.size() > kMaxMessage || msg.size() < sizeof(Header)) return o;
    Header h;
    std::memcpy(&h, msg.data(), sizeof h);
    const std::size_t len = msg.size() - sizeof h;
    if (h.magic != kMagic || h.version != kVersion || h.length != len) return o;
    if ((h.type & kResponseBit) != 0 || h.type < 1 || h.type > kLastType) return o;
    const std::uint8_t* p = msg.data() + sizeof h;
    o.seq = h.seq;
    o.type = h.type | kResponseBit;
    auto err = [&](int e) {
      o.kind = Outcome::error;
      o.err = e;
      return o;
    };
    auto answer = [&](Bytes payload, std::size_t fds) {
      o.kind = Outcome::answer;
      o.payload = std::move(payload);
      o.fds = fds;
      return o;
    };
    const auto type = static_cast<MsgType>(h.type);
    // First the payload, for its type, before hello as after it: the size, zero padding and a
    // terminated name; one that does not fit closes the connection.
    HelloRequest hello;
    BindRequest bind;
    UnbindRequest unbind;
    DirectUpcallRequest upcall;
    VcpuAffinityRequest affinity;
    switch (type) {
      case MsgType::hello:
        if (len != sizeof hello) return o;
        std::memcpy(&hello, p, sizeof hello);
        if (hello.pad0 != 0 || hello.pad1 != 0) return o;
        if (std::memchr(hello.client_name, 0, sizeof hello.client_name) == nullptr) return o;
        break;
      case MsgType::bind_interdomain:
        if (len != sizeof bind) return o;
        std::memcpy(&bind, p, sizeof bind);
        if (bind.pad != 0) return o;
        break;
      case MsgType::unbind:
        if (len != sizeof unbind) return o;
        std::memcpy(&unbind, p, sizeof unbind);
        if (unbind.pad != 0) return o;
        break;
      case MsgType::get_direct_upcall:
        if (len != sizeof upcall) return o;
        std::memcpy(&upcall, p, sizeof upcall);
        if (upcall.pad != 0) return o;
        break;
      case MsgType::set_vcpu_affinity:
        if (len != sizeof affinity) return o;
        std::memcpy(&affinity, p, sizeof affinity);
        if (affinity.pad != 0) return o;
        break;
      case MsgType::get_memory:
      case MsgType::get_grant_table:
      case MsgType::get_xenstore:
      case MsgType::unpause:
      case MsgType::pause:
      case MsgType::get_vcpu_threads:
        if (len != 0) return o;
        break;
    }
    if (type == MsgType::hello) {
      if (hello.client_domid != 0) return err(EPERM);
      c.hello = true;
      o.calls.push_back({'i', 0});
      HelloResponse a{};
      a.domid = kDomid;
      a.nr_vcpus = kVcpus;
      a.kind = static_cast<std::uint32_t>(DomainKind::process);
      copy_string(a.name, kName);
      return answer(bytes(a), 0);
    }
    if (!c.hello) return err(EPROTO);
    switch (type) {
      case MsgType::get_memory:
        o.calls.push_back({'m', 0});
        return answer(encode_memory(server_.regions()), 1);
      case MsgType::get_grant_table:
        o.calls.push_back({'g', 0});
        return answer(encode_grant_table(64, {0xe, 0xf}), 0);
      case MsgType::bind_interdomain: {
        o.calls.push_back({'b', bind.remote_port});
        if (bind.remote_port < kFirstPort || bind.remote_port > kLastPort) return err(EINVAL);
        const std::uint32_t port = bind.remote_port + kDom0Offset;
        if (bound_.count(port)) return err(EBUSY);
        bound_.insert(port);
        c.bound.insert(port);
        o.new_port = port;
        return answer(bytes(BindResponse{port, 0}), 2);
      }
      case MsgType::unbind:
        if (c.bound.count(unbind.port) == 0) return err(ENOENT);
        c.bound.erase(unbind.port);
        bound_.erase(unbind.port);
        o.calls.push_back({'u', unbind.port});
        return answer({}, 0);
      case MsgType::get_xenstore:
        o.calls.push_back({'x', 0});
        if (!xenstore_ok_) return err(ENOENT);
        return answer(bytes(XenstoreResponse{0xfeffc, 1, 0}), 0);
      case MsgType::unpause:
        o.calls.push_back({'p', 0});
        if (++unpauses_ % 2 == 0) return err(EALREADY);
        return answer({}, 0);
      case MsgType::pause:
        o.calls.push_back({'P', 0});
        if (++pauses_ % 2 == 0) return err(EALREADY);
        return answer({}, 0);
      case MsgType::get_direct_upcall:
        o.calls.push_back({'d', upcall.vcpu});
        if (upcall.vcpu >= kVcpus) return err(ENOENT);
        return answer(bytes(DirectUpcallResponse{kVcpus, 0}), 2);
      case MsgType::set_vcpu_affinity: {
        o.calls.push_back({'a', affinity.vcpu});
        if (affinity.vcpu >= kVcpus && affinity.vcpu != kAllVcpus) return err(ENOENT);
        bool any = false;
        for (const std::uint64_t w : affinity.cpus) any = any || w != 0;
        if (!any) return err(EINVAL);
        return answer({}, 0);
      }
      case MsgType::get_vcpu_threads:
        o.calls.push_back({'t', 0});
        if (++thread_asks_ % 2 == 0) return err(EOPNOTSUPP);
        return answer(encode_vcpu_threads({4242, 0}), 0);
      case MsgType::hello: break;
    }
    return o;
  }

  bool send_with_fds(int sock, const Bytes& msg, std::size_t nfds) {
    std::vector<UniqueFd> own;
    std::vector<int> fds;
    for (std::size_t k = 0; k < nfds; ++k) {
      own.emplace_back(::eventfd(0, EFD_CLOEXEC));
      fds.push_back(own.back().get());
    }
    return static_cast<bool>(send_datagram(sock, msg, fds));
  }

  void send_one(std::size_t i) {
    auto [msg, nfds] = message(conns_[i]);
    exchange(i, std::move(msg), nfds);
  }

  // Sends one message on connection i and checks the server's answer, or that it closed.
  void exchange(std::size_t i, Bytes msg, std::size_t nfds) {
    Conn& c = conns_[i];
    const std::uint16_t req_type = msg.size() >= 8 ? static_cast<std::uint16_t>(msg[6] | (msg[7] << 8)) : 0;
    SCOPED_TRACE("message of " + std::to_string(msg.size()) + " bytes, type " + std::to_string(req_type) + ", " +
                 std::to_string(nfds) + " fds");
    const Outcome o = predict(c, msg, nfds);
    ASSERT_TRUE(send_with_fds(c.sock.get(), msg, nfds));
    auto ready = wait_readable(c.sock.get(), kTimeoutMs);
    ASSERT_TRUE(ready && *ready) << "no answer and no close within " << kTimeoutMs << " ms";
    auto d = recv_datagram(c.sock.get(), kMaxMessage + 1024, kMaxFds + 4);
    ASSERT_TRUE(d) << d.error().message();
    const std::size_t t = o.type & 0xf;
    if (o.kind == Outcome::close) {
      EXPECT_TRUE(d->bytes.empty()) << "a message that does not parse got an answer instead of a close";
      EXPECT_TRUE(d->fds.empty());
      std::vector<Call> want;
      for (std::uint32_t p : c.bound) {
        want.push_back({'u', p});
        bound_.erase(p);
      }
      conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i));
      ++totals.closes;
      if (nfds != 0) ++totals.fd_closes;
      ASSERT_TRUE(server_.connections_are(live())) << "the server kept a connection it closed";
      expect_calls(want);
      return;
    }
    ASSERT_FALSE(d->bytes.empty()) << "the connection was closed; expected "
                                   << (o.kind == Outcome::error ? "error " + std::to_string(o.err) : std::string("an answer"));
    ASSERT_GE(d->bytes.size(), sizeof(Header));
    Header h;
    std::memcpy(&h, d->bytes.data(), sizeof h);
    EXPECT_EQ(h.magic, kMagic);
    EXPECT_EQ(h.version, kVersion);
    EXPECT_EQ(h.seq, o.seq) << "seq not echoed";
    EXPECT_EQ(h.length, d->bytes.size() - sizeof h);
    const Bytes payload(d->bytes.begin() + sizeof h, d->bytes.end());
    if (o.kind == Outcome::error) {
      EXPECT_EQ(h.type, kErrorType) << "expected error " << o.err;
      ASSERT_EQ(payload.size(), sizeof(ErrorPayload));
      ErrorPayload e;
      std::memcpy(&e, payload.data(), sizeof e);
      EXPECT_EQ(e.error, o.err) << e.message;
      EXPECT_TRUE(nul_terminated(e.message));
      EXPECT_TRUE(d->fds.empty()) << "an error answer carries no fds";
      ++totals.errors[t];
    } else {
      EXPECT_EQ(h.type, o.type);
      EXPECT_TRUE(payload == o.payload) << "payload of " << payload.size() << " bytes, expected " << o.payload.size();
      EXPECT_EQ(d->fds.size(), o.fds);
      EXPECT_EQ(o.fds, fds_for(o.type));
      totals.fds_received += d->fds.size();
      if (o.new_port) ++totals.binds;
      ++totals.answers[t];
    }
    expect_calls(o.calls);
  }

  void expect_calls(const std::vector<Call>& want) {
    const auto got = server_.take_calls();
    EXPECT_EQ(show(got), show(want)) << "the handler was called other than the model says";
    const auto v = server_.on_io([&] { return std::exchange(server_.domain().violations, {}); });
    for (const auto& s : v) ADD_FAILURE() << s;
    EXPECT_EQ(server_.on_io([&] { return server_.domain().bound; }), bound_) << "the handler's bound ports";
  }

  Rng rng_;
  Server& server_;
  std::vector<Conn> conns_;
  std::set<std::uint32_t> bound_;  // the model of the handler's
  bool xenstore_ok_ = true;
  unsigned unpauses_ = 0;
  unsigned pauses_ = 0;
  unsigned thread_asks_ = 0;
  std::uint32_t seq_ = 0;
};

// A well-behaved service on a new connection: every request answered as the domain says.
void expect_well_behaved(Server& server) {
  SCOPED_TRACE("the well-behaved ControlClient");
  server.on_io([&] { return server.domain().xenstore_ok = true; });
  try {
    auto c = ControlClient::connect(server.path(), "well-behaved", kTimeoutMs);
    EXPECT_EQ(c.domain().domid, kDomid);
    EXPECT_EQ(c.domain().nr_vcpus, kVcpus);
    EXPECT_EQ(c.domain().name, kName);
    const GrantTableInfo g = c.grant_table();
    EXPECT_EQ(g.gfns, (std::vector<std::uint64_t>{0xe, 0xf}));
    EXPECT_EQ(g.max_frames, 64u);
    const XenstoreInfo x = c.xenstore();
    EXPECT_EQ(x.gfn, 0xfeffcu);
    EXPECT_EQ(x.port, 1u);
    {
      DomainMemory m = c.map_memory();
      auto p = m.view().translate(0x2000, 4);
      ASSERT_TRUE(p);
      EXPECT_EQ(std::memcmp(p->data(), "XPV!", 4), 0);
    }
    Dom0Binding b = c.bind_interdomain(kFirstPort);
    EXPECT_EQ(b.port, kFirstPort + kDom0Offset);
    EXPECT_TRUE(b.to_dom0 && b.from_dom0);
    c.unbind(b.port);
    auto du = c.direct_upcall(1);
    EXPECT_EQ(du.nr_vcpus, kVcpus);
    EXPECT_TRUE(du.table && du.vcpu);
    try {
      c.bind_interdomain(kLastPort + 1);
      ADD_FAILURE() << "bind of a port not unbound for dom0 succeeded";
    } catch (const ControlError& e) {
      EXPECT_EQ(e.error(), EINVAL);
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the well-behaved client failed: " << e.what();
  }
  ASSERT_TRUE(server.connections_are(0));
  const auto calls = server.take_calls();
  EXPECT_EQ(show(calls), show({{'i', 0}, {'g', 0}, {'x', 0}, {'m', 0}, {'b', kFirstPort}, {'u', kFirstPort + kDom0Offset},
                               {'d', 1}, {'b', kLastPort + 1}}));
  ++totals.well_behaved;
}

TEST(ControlSocketFuzz, AHostileClientGetsExactAnswersOrACloseAndLeavesAWorkingServer) {
  const auto [first, last] = xpv::test::fuzz_seeds(300);
  spdlog::set_level(spdlog::level::off);  // a warning per closed connection
  {
    Server server;
    const std::size_t fds_before = open_fds();
    for (std::uint64_t seed = first; seed <= last; ++seed) {
      SCOPED_TRACE("seed " + std::to_string(seed));
      World w(seed, server);
      w.run(60);
      if (HasFailure()) break;
      expect_well_behaved(server);
      if (HasFailure()) break;
      EXPECT_EQ(open_fds(), fds_before) << "fds leaked (the server's, or ones the test received)";
      if (HasFailure()) break;
    }
  }
  spdlog::set_level(spdlog::level::info);
  const std::uint64_t n = last - first + 1;
  std::printf("seeds %llu: closes %llu (with fds %llu), binds %llu, fds received %llu, closed mid-request %llu, bursts %llu, "
              "out of fds %llu (accepts left waiting %llu)\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(totals.closes),
              static_cast<unsigned long long>(totals.fd_closes), static_cast<unsigned long long>(totals.binds),
              static_cast<unsigned long long>(totals.fds_received), static_cast<unsigned long long>(totals.mid_message),
              static_cast<unsigned long long>(totals.bursts), static_cast<unsigned long long>(totals.starved),
              static_cast<unsigned long long>(totals.starved_accepts));
  for (int t = 1; t <= kLastType; ++t)
    std::printf("  type %d: answers %llu errors %llu\n", t, static_cast<unsigned long long>(totals.answers[t]),
                static_cast<unsigned long long>(totals.errors[t]));
  if (HasFailure() || n < 20) return;
  // Not a check of the server: that the fuzzer reached the answers as well as the refusals.
  for (int t = 1; t <= kLastType; ++t) EXPECT_GT(totals.answers[t], n / 10) << "type " << t << " rarely answered";
  for (const int t : {1, 2, 4, 5, 6, 7, 8, 9, 10, 11}) EXPECT_GT(totals.errors[t], 0u) << "type " << t << " never refused";
  EXPECT_GT(totals.closes, 5 * n);
  EXPECT_GT(totals.fd_closes, n / 2);
  EXPECT_GT(totals.binds, n);
  EXPECT_GT(totals.fds_received, n);
  EXPECT_GT(totals.mid_message, n);
  EXPECT_GT(totals.bursts, n / 20);
  if (!kSanitized) {
    EXPECT_GT(totals.starved_accepts, 0u) << "the server's accept() never met EMFILE";
  }
}

}  // namespace
}  // namespace xpv::domain
