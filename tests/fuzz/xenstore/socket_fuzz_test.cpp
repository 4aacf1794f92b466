// Fuzzing the running daemon over its socket: a fixed-seed stream of generated, mutated and
// random messages on several connections at once (reconnecting when the daemon closes one for a
// protocol violation). Afterwards the daemon must still answer a READ, and shut down cleanly
// (exit 0 — under ASan that includes LeakSanitizer's check at exit).
// XPV_FUZZ_MESSAGES overrides the default count (200000).
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <array>
#include <cstdlib>
#include <random>

#include "process.h"
#include "xpv/xenbus/wire.h"

using namespace std::chrono_literals;
using xpv::xenbus::wire::MsgType;
namespace wire = xpv::xenbus::wire;

namespace {

std::string z(std::string_view v) { return std::string(v) + std::string(1, '\0'); }

// A non-blocking socket client that discards whatever the daemon answers.
class RawConn {
 public:
  explicit RawConn(const std::string& path) { open(path); }
  ~RawConn() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  void open(const std::string& path) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
      throw std::runtime_error("connect failed");
    path_ = path;
    in_.clear();
  }
  // Sends all bytes (bounded wait); reconnects if the daemon closed us. Returns false on a
  // reconnect.
  bool send(const std::string& bytes) {
    std::size_t off = 0;
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        ++reconnects;
        open(path_);
        return false;
      }
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("daemon stopped reading for 10 s");
      pollfd p{fd_, POLLIN | POLLOUT, 0};
      ::poll(&p, 1, 100);
      if (!drain()) return false;
    }
    return drain();
  }
  // Reads what is available, counting complete replies (watch events aside); reconnects on
  // EOF.
  bool drain() {
    char buf[65536];
    while (true) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        received += static_cast<std::size_t>(n);
        in_.append(buf, static_cast<std::size_t>(n));
        while (in_.size() >= 16) {
          wire::Header h;
          std::memcpy(&h, in_.data(), 16);
          if (in_.size() < 16 + h.len) break;
          if (h.type != static_cast<std::uint32_t>(MsgType::watch_event)) {
            ++replies;
            last_req_id = h.req_id;
          }
          in_.erase(0, 16 + h.len);
        }
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        ++reconnects;
        open(path_);
        return false;
      }
      return true;
    }
  }
  // Sends a marker READ and waits (bounded) until its reply arrived: every earlier request on
  // this connection has been answered by then.
  void sync() {
    static constexpr std::uint32_t kMarker = 0xfeedf00d;
    std::string msg = wire::encode(MsgType::read, kMarker, 0, z("/tool/xenstored"));
    ++sent_sync;
    send(msg);
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (last_req_id != kMarker && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      ::poll(&p, 1, 100);
      drain();
    }
    last_req_id = 0;
  }
  // Sends one request and waits (bounded) for the reply with the same req_id; returns its
  // payload, "!ENAME" for an error, "<closed>" or "<timeout>".
  std::string request(MsgType t, std::uint32_t req_id, const std::string& payload) {
    drain();
    std::string msg = wire::encode(t, req_id, 0, payload);
    if (::send(fd_, msg.data(), msg.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(msg.size()))
      return "<closed>";
    std::string in;
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      while (in.size() >= 16) {
        wire::Header h;
        std::memcpy(&h, in.data(), 16);
        if (in.size() < 16 + h.len) break;
        std::string body = in.substr(16, h.len);
        in.erase(0, 16 + h.len);
        if (h.req_id != req_id || h.type == static_cast<std::uint32_t>(MsgType::watch_event))
          continue;
        if (h.type == static_cast<std::uint32_t>(MsgType::error)) return "!" + body.substr(0, body.size() - 1);
        return body;
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) != 1) continue;
      char buf[8192];
      ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0) return "<closed>";
      if (n > 0) in.append(buf, static_cast<std::size_t>(n));
    }
    return "<timeout>";
  }

  std::size_t received = 0;
  std::size_t reconnects = 0;
  std::size_t replies = 0;
  std::size_t sent_sync = 0;
  std::uint32_t last_req_id = 0;

 private:
  int fd_ = -1;
  std::string path_;
  std::string in_;
};

// Generates protocol-shaped messages from a small vocabulary so that operations actually hit
// nodes, watches and transactions, then mutates some of them.
class Generator {
 public:
  explicit Generator(std::uint64_t seed) : rng_(seed) {}

  struct Msg {
    std::string bytes;
    bool poison;  // breaks the framing: the connection is replaced after it
  };
  Msg next() {
    std::uint32_t dice = pick(1000);
    if (dice < 550) return {valid(), false};
    if (dice < 990) return {mutate(valid()), false};
    if (dice < 994) return {random_bytes(), true};
    if (dice < 997) return {lying_length(valid()), true};
    return {header_only(), true};
  }

 private:
  std::uint32_t pick(std::uint32_t n) { return static_cast<std::uint32_t>(rng_() % n); }
  std::string path() {
    static const std::array<const char*, 14> kPaths = {
        "/f", "/f/a", "/f/a/b", "/f/b", "/f/c/d/e", "rel", "rel/x", "/local/domain/3/x",
        "@introduceDomain", "@releaseDomain", "/", "/f//bad", "/f/bad path", "/tool/xenstored"};
    if (pick(20) == 0) return "/f/" + std::string(pick(3200), 'L');
    return kPaths[pick(kPaths.size())];
  }
  std::string value() {
    std::uint32_t len = pick(10) == 0 ? pick(4090) : pick(16);
    std::string v(len, '\0');
    for (auto& c : v) c = static_cast<char>(pick(256));
    return v;
  }
  std::string valid() {
    static const std::array<MsgType, 21> kTypes = {
        MsgType::read,     MsgType::write,          MsgType::mkdir,
        MsgType::rm,       MsgType::directory,      MsgType::directory_part,
        MsgType::get_perms, MsgType::set_perms,     MsgType::watch,
        MsgType::unwatch,  MsgType::transaction_start, MsgType::transaction_end,
        MsgType::introduce, MsgType::release,       MsgType::is_domain_introduced,
        MsgType::get_domain_path, MsgType::resume,  MsgType::set_target,
        MsgType::reset_watches, MsgType::control,   MsgType::write};
    MsgType t = kTypes[pick(kTypes.size())];
    std::string p;
    switch (t) {
      case MsgType::write: p = z(path()) + value(); break;
      case MsgType::directory_part: p = z(path()) + z(std::to_string(pick(5000))); break;
      case MsgType::set_perms: {
        p = z(path());
        static const char kL[] = "nrwbx";
        for (std::uint32_t i = 0, n = pick(6); i < n; ++i)
          p += z(std::string(1, kL[pick(5)]) + std::to_string(pick(12)));
        break;
      }
      case MsgType::watch:
      case MsgType::unwatch: p = z(path()) + z("tok" + std::to_string(pick(4))); break;
      case MsgType::transaction_start: p = z(""); break;
      case MsgType::transaction_end: p = z(pick(2) ? "T" : "F"); break;
      case MsgType::introduce:
        p = z(std::to_string(pick(40))) + z(std::to_string(rng_())) + z(std::to_string(pick(9)));
        break;
      case MsgType::set_target: p = z(std::to_string(pick(12))) + z(std::to_string(pick(12))); break;
      case MsgType::release:
      case MsgType::is_domain_introduced:
      case MsgType::get_domain_path:
      case MsgType::resume: p = z(std::to_string(pick(40))); break;
      case MsgType::reset_watches: p = ""; break;
      case MsgType::control: p = z(pick(2) ? "print" : "quota") + (pick(2) ? z("x") : ""); break;
      default: p = z(path()); break;
    }
    if (p.size() > wire::kPayloadMax) p.resize(wire::kPayloadMax);  // stays framed
    // Mostly no transaction; sometimes a small id that may exist, sometimes garbage.
    std::uint32_t tx = pick(4) == 0 ? pick(6) : 0;
    return wire::encode(t, static_cast<std::uint32_t>(rng_()), tx, p);
  }
  // Mutates header fields (type, req_id, tx_id) and payload bytes; the length field is then set to
  // the payload's real length (at most 4096) so the stream stays framed.
  std::string mutate(std::string m) {
    for (std::uint32_t i = 0, n = 1 + pick(4); i < n && m.size() > 16; ++i) {
      std::uint32_t plen = static_cast<std::uint32_t>(m.size() - 16);
      switch (pick(5)) {
        case 0: m[16 + pick(plen)] ^= static_cast<char>(1 << pick(8)); break;
        case 1: m.resize(16 + pick(plen)); break;  // truncated payload
        case 2: m.insert(16 + pick(plen), 1, static_cast<char>(pick(256))); break;
        case 3: {  // type field
          std::uint32_t t = pick(3) ? pick(30) : static_cast<std::uint32_t>(rng_());
          if (m.size() >= 4) std::memcpy(m.data(), &t, 4);
          break;
        }
        default: {  // req_id / tx_id
          std::uint32_t v = pick(2) ? pick(8) : static_cast<std::uint32_t>(rng_());
          std::memcpy(m.data() + (pick(2) ? 4 : 8), &v, 4);
          break;
        }
      }
    }
    if (m.size() > 16 + wire::kPayloadMax) m.resize(16 + wire::kPayloadMax);
    std::uint32_t len = static_cast<std::uint32_t>(m.size() - 16);
    std::memcpy(m.data() + 12, &len, 4);
    return m;
  }
  std::string lying_length(std::string m) {
    std::uint32_t len = pick(4097);
    std::memcpy(m.data() + 12, &len, 4);
    return m;
  }
  std::string random_bytes() {
    std::string s(pick(64), '\0');
    for (auto& c : s) c = static_cast<char>(pick(256));
    return s;
  }
  std::string header_only() {
    // Oversize length: a protocol violation, the daemon closes this connection.
    wire::Header h{pick(30), 1, 0, 4097 + pick(100000)};
    std::string s(16, '\0');
    std::memcpy(s.data(), &h, 16);
    return s;
  }

  std::mt19937_64 rng_;
};

std::size_t message_count() {
  if (const char* e = std::getenv("XPV_FUZZ_MESSAGES")) {
    std::size_t n = std::strtoull(e, nullptr, 10);
    if (n > 0) return n;
  }
  return 200000;
}

}  // namespace

TEST(XenstoreFuzz, MalformedMessagesDoNotHurtOthers) {
  xpv::test::Daemon d(XPV_XENSTORED_BIN);
  RawConn good(d.socket()), bad(d.socket());
  EXPECT_EQ(good.request(MsgType::write, 1, z("/m") + "v"), std::string("OK\0", 3));
  EXPECT_EQ(bad.request(MsgType::read, 2, "no-nul"), "!EINVAL");
  EXPECT_EQ(bad.request(static_cast<MsgType>(20), 3, z("/m")), "!ENOSYS");
  EXPECT_EQ(bad.request(static_cast<MsgType>(0xffff), 4, z("/m")), "!ENOSYS");
  EXPECT_EQ(bad.request(MsgType::watch_event, 5, z("/m") + z("t")), "!ENOSYS");
  EXPECT_EQ(bad.request(MsgType::error, 6, z("EINVAL")), "!ENOSYS");
  EXPECT_EQ(bad.request(MsgType::watch, 7, z("/m")), "!EINVAL") << "missing token";
  EXPECT_EQ(bad.request(MsgType::write, 8, z("/" + std::string(3100, 'p')) + "v"), "!EINVAL");
  wire::Header h{static_cast<std::uint32_t>(MsgType::read), 9, 42, 3};
  std::string unknown_tx(16, '\0');
  std::memcpy(unknown_tx.data(), &h, 16);
  EXPECT_EQ(bad.request(MsgType::read, 9, z("/m")), "v");
  // Payload over 4096: the daemon closes that connection only.
  EXPECT_EQ(bad.request(MsgType::write, 10, z("/m") + std::string(4096, 'x')), "<closed>");
  EXPECT_EQ(good.request(MsgType::read, 11, z("/m")), "v");
  // A truncated header followed by a hang-up.
  {
    RawConn trunc(d.socket());
    trunc.send(std::string(7, '\1'));
  }
  EXPECT_EQ(good.request(MsgType::read, 12, z("/m")), "v");
  EXPECT_EQ(d.stop(), 0);
}

TEST(XenstoreFuzz, BoundedRandomAndMutatedMessages) {
  xpv::test::Daemon d(XPV_XENSTORED_BIN);
  constexpr std::size_t kConns = 4;
  std::vector<std::unique_ptr<RawConn>> conns;
  for (std::size_t i = 0; i < kConns; ++i) conns.push_back(std::make_unique<RawConn>(d.socket()));
  Generator gen(0x78656e73746f7265ull);  // fixed seed: "xenstore"
  const std::size_t n = message_count();
  std::size_t framed = 0, poison = 0, replies = 0, reconnects = 0;
  auto retire = [&](std::size_t k) {
    conns[k]->sync();
    replies += conns[k]->replies - conns[k]->sent_sync;
    reconnects += conns[k]->reconnects;
  };
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t k = i % kConns;
    auto m = gen.next();
    if (m.poison) {
      // Account for the connection's framed traffic first, then break it and replace it.
      retire(k);
      conns[k] = std::make_unique<RawConn>(d.socket());
      conns[k]->send(m.bytes);
      conns[k] = std::make_unique<RawConn>(d.socket());
      ++poison;
    } else {
      ++framed;
      conns[k]->send(m.bytes);
    }
    // Now and then, drop a connection to exercise disconnect with live watches/transactions.
    if (i % 5000 == 4999) {
      retire(k);
      conns[k] = std::make_unique<RawConn>(d.socket());
    }
  }
  for (std::size_t k = 0; k < kConns; ++k) retire(k);
  EXPECT_EQ(reconnects, 0u) << "framed messages never get a connection closed";
  EXPECT_EQ(replies, framed) << "exactly one reply per framed message";
  EXPECT_GE(framed + poison, n);
  EXPECT_GT(poison, n / 500);
  // The daemon still serves a fresh client.
  RawConn probe(d.socket());
  EXPECT_EQ(probe.request(MsgType::write, 1, z("/fuzz-done") + "yes"), std::string("OK\0", 3));
  EXPECT_EQ(probe.request(MsgType::read, 2, z("/fuzz-done")), "yes");
  conns.clear();
  EXPECT_EQ(d.stop(), 0) << "clean exit (and, under ASan, no leak)";
}
