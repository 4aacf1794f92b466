// xpv-vmm's PV console backend (hypervisor-core/kvm: PvConsole) driven by a hostile guest that owns
// the ring page (io/console.h's xencons_interface): seeded, bounded fuzzing over a real heap page
// of exactly 4 KiB (an access past it is an ASan error) and the two real eventfds of the dom0
// binding, as xpv-vmm wires them.
//
// Each seed is one console that lives through:
//  0. (one seed in four) a console created over a page of random bytes, then sequential steps;
//  1. a well-behaved guest (hvc_xen's way: write out[], notify; read in[] when notified) on a
//     thread of its own, the console's io thread draining and a typist calling receive() on a
//     third — maybe with bytes written before the console existed (the early-boot path);
//  2. a few hundred sequential steps with the io_context polled by the test thread, so that each
//     host step is exact: the guest writes anything anywhere (out_prod/out_cons/in_prod/in_cons
//     valid, wild or past the ring, bytes of out[], in[] and the rest of the page), or uses the
//     rings properly, notifies with or without a change; the host drains (a pending notification
//     polled) or receives 0..1500 typed bytes;
//  3. (every other seed) a racing phase: a scribbler thread writes anything into the page and
//     notifies while the io thread drains and the test thread calls receive(); then sequential
//     steps again;
// then a NEW console on a fresh page with a well-behaved guest (as in 1).
//
// Invariants (each one breaks on a real bug):
//  - the process never crashes, nothing is read or written past the page (ASan in CI), every
//    wait is bounded;
//  - a drain (sequential) delivers exactly out[out_cons .. out_prod) as the page held it, in
//    order, advances out_cons to out_prod and changes no other byte of the page, and notifies the
//    guest iff it delivered something — or, when out_prod - out_cons > 2048, disables the console
//    and delivers and writes nothing;
//  - receive() (sequential) takes exactly min(len, 1024 - (in_prod - in_cons)) bytes, writes them
//    at in[in_prod ..] and in_prod += n and nothing else, notifies iff n > 0 — or, when
//    in_prod - in_cons > 1024, returns 0, writes nothing and disables the console; never more
//    than it was offered nor more than the ring holds (also racing);
//  - disabled: receive() returns 0, no host step changes a byte of the page or calls Output or
//    notifies the guest, for good;
//  - a well-behaved guest (phases 1 and the new console) gets byte-exact streams both ways, the
//    early-boot bytes first, and bytes_out() counts exactly what Output got.
// And the fuzz reached the working paths: bytes delivered both ways, consoles disabled through
// each ring, consoles that survived hostile steps (checked at the end over all seeds).
// A failure prints its seed (SCOPED_TRACE); XPV_FUZZ_ITERATIONS=N runs seeds 1..N (default 400),
// XPV_FUZZ_SEED=S seed S alone.
#include <gtest/gtest.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "xpv/ring/console.h"
#include "xpv/test/fuzz_seeds.h"
#include "xpv/vmm/pv_console.h"

namespace xpv::vmm {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using ring::kXenconsInSize;
using ring::kXenconsOutSize;
using ring::XenconsInterface;
using Rng = std::mt19937_64;
using Bytes = std::vector<std::uint8_t>;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kPageSize = 4096;
constexpr auto kDeadline = 5s;  // for any one well-behaved exchange: past it, the console hung
constexpr std::size_t kInOff = offsetof(XenconsInterface, in), kOutOff = offsetof(XenconsInterface, out);
constexpr std::size_t kInCons = offsetof(XenconsInterface, in_cons), kInProd = offsetof(XenconsInterface, in_prod);
constexpr std::size_t kOutCons = offsetof(XenconsInterface, out_cons), kOutProd = offsetof(XenconsInterface, out_prod);

struct alignas(4096) Page {
  std::uint8_t bytes[kPageSize];
};
using Snapshot = std::array<std::uint8_t, kPageSize>;

std::uint32_t u32_at(const Snapshot& s, std::size_t off) {
  std::uint32_t v;
  std::memcpy(&v, s.data() + off, 4);
  return v;
}
void set_u32(Snapshot& s, std::size_t off, std::uint32_t v) { std::memcpy(s.data() + off, &v, 4); }

bool fd_readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}
std::uint64_t take_kicks(int fd) {  // a non-blocking eventfd: its count, reset
  std::uint64_t n = 0;
  return ::read(fd, &n, sizeof n) == 8 ? n : 0;
}
void kick(int fd) {
  const std::uint64_t one = 1;
  ASSERT_EQ(::write(fd, &one, sizeof one), 8);
}

// Where the differences between two page images are, for a failure message.
std::string diff(const Snapshot& want, const Snapshot& got) {
  std::string s;
  int shown = 0;
  for (std::size_t i = 0; i < kPageSize && shown < 8; ++i) {
    if (want[i] == got[i]) continue;
    s += " @" + std::to_string(i) + ":" + std::to_string(want[i]) + "->" + std::to_string(got[i]);
    ++shown;
  }
  return s.empty() ? " (none)" : s;
}

struct Totals {
  std::uint64_t out_exact = 0;      // bytes the sequential model checked, guest → host
  std::uint64_t in_exact = 0;       // host → guest
  std::uint64_t stream_out = 0;     // bytes of the well-behaved threaded exchanges
  std::uint64_t stream_in = 0;
  std::uint64_t disabled_out = 0;   // consoles disabled by a drain
  std::uint64_t disabled_in = 0;    // ... by a receive()
  std::uint64_t survived = 0;       // consoles that took hostile steps and still worked
  std::uint64_t raced = 0;          // racing phases run
  std::uint64_t racing_taken = 0;   // bytes receive() took while racing
};
Totals totals;

// One console: its page (a heap block of exactly one page), eventfds, io_context and Output sink.
class Rig {
 public:
  Rig() : page_(std::make_unique<Page>()) {
    std::memset(page_->bytes, 0, kPageSize);
    guest_kick_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));  // guest → host (to_dom0)
    host_kick_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));   // host → guest (from_dom0)
  }
  ~Rig() {
    stop_thread();
    destroy();
  }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  void create() {
    console_ = std::make_unique<PvConsole>(
        io_, std::span<std::uint8_t>(page_->bytes, kPageSize), UniqueFd(::dup(guest_kick_.get())),
        UniqueFd(::dup(host_kick_.get())), [this](std::span<const std::uint8_t> b) {
          std::lock_guard lk(mu_);
          output_.insert(output_.end(), b.begin(), b.end());
        });
  }
  void destroy() {  // with no io thread running
    console_.reset();
    io_.restart();
    io_.poll();  // the cancelled wait completes
  }
  void start_thread() {
    io_.restart();
    work_.emplace(io_.get_executor());
    thread_ = std::thread([this] { io_.run(); });
  }
  void stop_thread() {
    if (!thread_.joinable()) return;
    work_.reset();
    io_.stop();
    thread_.join();
    io_.restart();
  }
  void poll() { io_.poll(); }

  PvConsole& console() { return *console_; }
  XenconsInterface& intf() { return *reinterpret_cast<XenconsInterface*>(page_->bytes); }
  std::uint8_t* bytes() { return page_->bytes; }
  Snapshot snap() const {
    Snapshot s;
    std::memcpy(s.data(), page_->bytes, kPageSize);
    return s;
  }
  int guest_kick() const { return guest_kick_.get(); }
  int host_kick() const { return host_kick_.get(); }
  std::size_t output_size() {
    std::lock_guard lk(mu_);
    return output_.size();
  }
  Bytes output_from(std::size_t at) {
    std::lock_guard lk(mu_);
    return Bytes(output_.begin() + static_cast<std::ptrdiff_t>(std::min(at, output_.size())), output_.end());
  }

 private:
  std::unique_ptr<Page> page_;
  UniqueFd guest_kick_, host_kick_;
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::thread thread_;
  std::unique_ptr<PvConsole> console_;
  std::mutex mu_;
  Bytes output_;
};

Bytes random_bytes(Rng& rng, std::size_t n) {
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

// A well-behaved guest and typist against a new, running console: `out` written in chunks (after
// its first `early` bytes, which the guest wrote before the console existed), `in` typed; both
// must arrive byte-exact. The rig's io thread runs the console.
void well_behaved_exchange(Rig& rig, Rng& rng, const Bytes& out, std::size_t early, const Bytes& in) {
  const std::size_t out_before = 0;  // a new console: the early bytes were its constructor's drain
  const std::uint64_t counted_before = 0;
  const std::uint64_t guest_seed = rng();
  Bytes got_in;
  std::size_t written = early;  // the early bytes are in the ring already (see the caller)
  const auto deadline = Clock::now() + kDeadline;

  std::thread guest([&] {
    Rng grng(guest_seed);
    auto o = ring::console_out_ring(rig.intf());
    auto i = ring::console_in_ring(rig.intf());
    char buf[kXenconsInSize];
    while (Clock::now() < deadline && (written < out.size() || got_in.size() < in.size())) {
      if (written < out.size()) {
        const std::size_t want = std::min<std::size_t>(out.size() - written, 1 + grng() % 700);
        auto n = o->write(std::span<const char>(reinterpret_cast<const char*>(out.data()) + written, want));
        if (!n) break;  // the host never makes the indexes bad: reported below
        written += *n;
        if (*n != 0) kick(rig.guest_kick());
      }
      auto n = i->read(buf);
      if (!n) break;
      got_in.insert(got_in.end(), buf, buf + *n);
      pollfd p{rig.host_kick(), POLLIN, 0};
      if (::poll(&p, 1, 1) == 1) take_kicks(rig.host_kick());
    }
  });

  std::size_t typed = 0;
  while (typed < in.size() && Clock::now() < deadline) {
    const std::size_t want = std::min<std::size_t>(in.size() - typed, 1 + rng() % 400);
    const std::size_t n = rig.console().receive(std::span<const std::uint8_t>(in.data() + typed, want));
    EXPECT_LE(n, want);
    typed += std::min(n, want);
    if (n == 0) std::this_thread::sleep_for(50us);
  }
  guest.join();
  while (rig.output_size() < out_before + out.size() && Clock::now() < deadline) std::this_thread::sleep_for(100us);
  const std::uint32_t left = std::atomic_ref(rig.intf().out_prod).load() - std::atomic_ref(rig.intf().out_cons).load();
  const bool unserviced = fd_readable(rig.guest_kick());
  rig.stop_thread();
  EXPECT_EQ(left, 0u) << "bytes left in out[] after the guest's last notification"
                      << (unserviced ? " (the notification is still pending)" : " (no notification pending)");

  EXPECT_FALSE(rig.console().disabled()) << "a well-behaved guest lost its console";
  EXPECT_EQ(typed, in.size()) << "the typist could not type everything in time";
  EXPECT_EQ(written, out.size()) << "the guest could not write everything in time";
  EXPECT_TRUE(got_in == in) << "the guest read " << got_in.size() << " of " << in.size() << " typed bytes, or others";
  const Bytes got_out = rig.output_from(out_before);
  EXPECT_TRUE(got_out == out) << "Output got " << got_out.size() << " of " << out.size() << " bytes, or others";
  EXPECT_EQ(rig.console().bytes_out() - counted_before, got_out.size());
  totals.stream_out += out.size();
  totals.stream_in += in.size();
}

class World {
 public:
  explicit World(std::uint64_t seed) : seed_(seed), rng_(seed) {
    // How often the guest breaks the rules in the sequential steps: never, rarely, sometimes, often.
    static constexpr unsigned kHostility[] = {0, 60, 12, 4};
    hostility_ = kHostility[below(4)];
  }

  void run() {
    if (one_in(4)) {
      hostile_from_the_start();
      if (::testing::Test::HasFailure()) return;
    }
    rig_ = std::make_unique<Rig>();
    // Phase 1: early-boot bytes, then a well-behaved exchange.
    const std::size_t early = one_in(2) ? below(kXenconsOutSize + 1) : 0;
    const Bytes out = random_bytes(rng_, early + below(6000)), in = random_bytes(rng_, below(3000));
    {
      // Written by the guest before the console exists, without a notification.
      auto o = ring::console_out_ring(rig_->intf());
      ASSERT_EQ(*o->write(std::span<const char>(reinterpret_cast<const char*>(out.data()), early)), early);
    }
    rig_->create();
    rig_->start_thread();
    well_behaved_exchange(*rig_, rng_, out, early, in);
    if (::testing::Test::HasFailure()) return;

    // Phase 2: sequential, exact.
    take_kicks(rig_->host_kick());
    sequential(200 + static_cast<unsigned>(below(200)));
    if (::testing::Test::HasFailure()) return;

    // Phase 3: racing, then sequential again.
    if (seed_ % 2 == 0) {
      racing();
      if (::testing::Test::HasFailure()) return;
      take_kicks(rig_->host_kick());
      sequential(100);
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_EQ(rig_->console().bytes_out(), rig_->output_size()) << "bytes_out() is not what Output got";
    if (rig_->console().disabled()) {
      expect_disabled_for_good();
    } else if (hostile_steps_ > 0) {
      ++totals.survived;
    }
    rig_.reset();

    // A new console on a fresh page: a well-behaved guest works.
    Rig fresh;
    fresh.create();
    fresh.start_thread();
    const Bytes out2 = random_bytes(rng_, 1 + below(5000)), in2 = random_bytes(rng_, 1 + below(2500));
    well_behaved_exchange(fresh, rng_, out2, 0, in2);
  }

 private:
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool one_in(std::uint64_t n) { return below(n) == 0; }
  std::uint32_t& field(std::size_t off) { return *reinterpret_cast<std::uint32_t*>(rig_->bytes() + off); }
  std::uint32_t load(std::size_t off) { return std::atomic_ref(field(off)).load(std::memory_order_acquire); }
  void store(std::size_t off, std::uint32_t v) { std::atomic_ref(field(off)).store(v, std::memory_order_release); }

  // An index value: near the other index (valid or just past the ring), or anything.
  std::uint32_t wild_index(std::uint32_t other, std::uint32_t size) {
    switch (below(5)) {
      case 0: return other + size + 1 + static_cast<std::uint32_t>(below(size));
      case 1: return other - 1 - static_cast<std::uint32_t>(below(size));
      case 2: return static_cast<std::uint32_t>(rng_());
      case 3: return other + size;  // exactly full: still valid
      default: return other + 0x8000'0000u;
    }
  }

  // One step of a guest that breaks the rules: anything anywhere on the page.
  void hostile_step() {
    ++hostile_steps_;
    switch (below(9)) {
      case 0: store(kOutProd, wild_index(load(kOutCons), kXenconsOutSize)); break;
      case 1: store(kOutCons, wild_index(load(kOutProd), kXenconsOutSize)); break;  // the host's field
      case 2: store(kInCons, wild_index(load(kInProd), kXenconsInSize)); break;
      case 3: store(kInProd, wild_index(load(kInCons), kXenconsInSize)); break;  // the host's field
      case 4: store(kOutProd, load(kOutCons) + static_cast<std::uint32_t>(below(kXenconsOutSize + 1))); break;
      case 5: store(kInCons, load(kInProd) - static_cast<std::uint32_t>(below(kXenconsInSize + 1))); break;
      case 6: {  // host-owned bytes: in[]
        const std::size_t at = below(kXenconsInSize);
        const std::size_t n = std::min<std::size_t>(1 + below(64), kXenconsInSize - at);
        const Bytes b = random_bytes(rng_, n);
        std::memcpy(rig_->bytes() + kInOff + at, b.data(), n);
        break;
      }
      case 7: {  // anything past the interface, in the rest of the page
        const std::size_t at = sizeof(XenconsInterface) + below(kPageSize - sizeof(XenconsInterface));
        rig_->bytes()[at] = static_cast<std::uint8_t>(rng_());
        break;
      }
      default: {  // out[] rewritten, maybe under data not yet read
        const std::size_t at = below(kXenconsOutSize);
        const std::size_t n = std::min<std::size_t>(1 + below(256), kXenconsOutSize - at);
        const Bytes b = random_bytes(rng_, n);
        std::memcpy(rig_->bytes() + kOutOff + at, b.data(), n);
        break;
      }
    }
  }

  // A console created over a page the guest filled with anything: its constructor's drain takes
  // exactly out[out_cons .. out_prod) or disables it; either way nothing else of the page changes.
  void hostile_from_the_start() {
    rig_ = std::make_unique<Rig>();
    const Bytes junk = random_bytes(rng_, kPageSize);
    std::memcpy(rig_->bytes(), junk.data(), kPageSize);
    if (one_in(2)) store(kOutProd, load(kOutCons) + static_cast<std::uint32_t>(below(kXenconsOutSize + 1)));
    const Snapshot before = rig_->snap();
    Snapshot want = before;
    const std::uint32_t cons = u32_at(before, kOutCons), prod = u32_at(before, kOutProd);
    Bytes want_out;
    const bool bad = prod - cons > kXenconsOutSize;
    if (!bad) {
      for (std::uint32_t i = cons; i != prod; ++i) want_out.push_back(before[kOutOff + ring::xencons_out_mask(i)]);
      set_u32(want, kOutCons, prod);
    }
    rig_->create();
    EXPECT_EQ(rig_->console().disabled(), bad);
    EXPECT_TRUE(rig_->snap() == want) << "the first drain changed the page other than documented:" << diff(want, rig_->snap());
    EXPECT_TRUE(rig_->output_from(0) == want_out);
    EXPECT_EQ(take_kicks(rig_->host_kick()), want_out.empty() ? 0u : 1u);
    if (bad) {
      ++totals.disabled_out;
      expect_disabled_for_good();
    } else {
      sequential(50);
    }
    rig_.reset();
  }

  // One step of the guest that follows the protocol (hvc_xen).
  void guest_step() {
    if (one_in(2)) {
      auto o = ring::console_out_ring(rig_->intf());
      const Bytes b = random_bytes(rng_, one_in(8) ? below(3000) : below(200));
      (void)o->write(std::span<const char>(reinterpret_cast<const char*>(b.data()), b.size()));  // may refuse bad indexes
    } else {
      auto i = ring::console_in_ring(rig_->intf());
      char buf[kXenconsInSize];
      (void)i->read(std::span<char>(buf, below(kXenconsInSize + 1)));
    }
  }

  void sequential(unsigned steps) {
    for (unsigned s = 0; s < steps; ++s) {
      SCOPED_TRACE("sequential step " + std::to_string(s));
      switch (below(6)) {
        case 0:
        case 1:
          if (hostility_ != 0 && one_in(hostility_ / 2 + 1)) hostile_step(); else guest_step();
          if (one_in(2)) kick(rig_->guest_kick());
          break;
        case 2: kick(rig_->guest_kick()); break;  // a notification without a change
        case 3:
        case 4: host_drain(); break;
        default: host_receive(); break;
      }
      if (::testing::Test::HasFailure()) return;
    }
  }

  // The io_context polled on this thread: runs the drain iff a notification is pending.
  void host_drain() {
    const Snapshot before = rig_->snap();
    const bool was_disabled = rig_->console().disabled();
    const bool pending = fd_readable(rig_->guest_kick());
    const std::size_t out_at = rig_->output_size();
    Snapshot want = before;
    Bytes want_out;
    bool want_disabled = was_disabled, want_kick = false;
    if (!was_disabled && pending) {
      const std::uint32_t cons = u32_at(before, kOutCons), prod = u32_at(before, kOutProd);
      if (prod - cons > kXenconsOutSize) {
        want_disabled = true;
      } else {
        for (std::uint32_t i = cons; i != prod; ++i) want_out.push_back(before[kOutOff + ring::xencons_out_mask(i)]);
        set_u32(want, kOutCons, prod);
        want_kick = prod != cons;
      }
    }
    rig_->poll();
    const Snapshot after = rig_->snap();
    EXPECT_TRUE(after == want) << "a drain changed the page other than documented:" << diff(want, after);
    EXPECT_TRUE(rig_->output_from(out_at) == want_out) << "Output got other bytes than out[cons..prod) (" << want_out.size() << " expected)";
    EXPECT_EQ(rig_->console().disabled(), want_disabled);
    EXPECT_EQ(take_kicks(rig_->host_kick()), want_kick ? 1u : 0u) << "the guest notified iff bytes were taken";
    if (!rig_->console().disabled()) {
      EXPECT_FALSE(fd_readable(rig_->guest_kick())) << "a pending notification was not serviced";
    }
    totals.out_exact += want_out.size();
    if (want_disabled && !was_disabled) ++totals.disabled_out;
  }

  void host_receive() {
    const std::size_t len = one_in(4) ? below(1500) : below(64);
    const Bytes typed = random_bytes(rng_, len);
    const Snapshot before = rig_->snap();
    const bool was_disabled = rig_->console().disabled();
    Snapshot want = before;
    std::size_t want_n = 0;
    bool want_disabled = was_disabled;
    if (!was_disabled && len != 0) {
      const std::uint32_t cons = u32_at(before, kInCons), prod = u32_at(before, kInProd);
      if (prod - cons > kXenconsInSize) {
        want_disabled = true;
      } else {
        want_n = std::min<std::size_t>(len, kXenconsInSize - (prod - cons));
        for (std::size_t i = 0; i < want_n; ++i)
          want[kInOff + ring::xencons_in_mask(prod + static_cast<std::uint32_t>(i))] = typed[i];
        set_u32(want, kInProd, prod + static_cast<std::uint32_t>(want_n));
      }
    }
    const std::size_t n = rig_->console().receive(typed);
    const Snapshot after = rig_->snap();
    EXPECT_EQ(n, want_n) << "receive() of " << len << " bytes";
    EXPECT_TRUE(after == want) << "receive() changed the page other than documented:" << diff(want, after);
    EXPECT_EQ(rig_->console().disabled(), want_disabled);
    EXPECT_EQ(take_kicks(rig_->host_kick()), want_n != 0 ? 1u : 0u) << "the guest notified iff bytes were given";
    totals.in_exact += want_n;
    if (want_disabled && !was_disabled) ++totals.disabled_in;
  }

  // A scribbler thread writes anything into the page and notifies while the io thread drains and
  // this thread calls receive(). Only what holds under any interleaving is checked here; the
  // sequential steps afterwards check the console is working or disabled.
  void racing() {
    ++totals.raced;
    const bool was_usable = !rig_->console().disabled() && load(kOutProd) - load(kOutCons) <= kXenconsOutSize &&
                            load(kInProd) - load(kInCons) <= kXenconsInSize;
    rig_->start_thread();
    std::atomic<bool> stop{false};
    const std::uint64_t scribbler_seed = rng_();
    const bool only_valid = one_in(2);  // indexes stay within the rings: the console must survive
    std::thread scribbler([&] {
      Rng r(scribbler_seed);
      auto* page = rig_->bytes();
      auto idx = [&](std::size_t off) { return std::atomic_ref(*reinterpret_cast<std::uint32_t*>(page + off)); };
      for (int i = 0; i < 3000 && !stop.load(); ++i) {
        switch (only_valid ? std::array<unsigned, 4>{4, 5, 6, 7}[r() % 4] : r() % 6) {
          case 0: idx(kOutProd).store(idx(kOutCons).load() + static_cast<std::uint32_t>(r() % (kXenconsOutSize + 1))); break;
          case 1: idx(kInCons).store(idx(kInProd).load() - static_cast<std::uint32_t>(r() % (kXenconsInSize + 1))); break;
          case 2: idx(r() % 2 ? kOutProd : kInCons).store(static_cast<std::uint32_t>(r())); break;
          case 3: idx(r() % 2 ? kOutCons : kInProd).store(static_cast<std::uint32_t>(r())); break;
          case 4: std::atomic_ref(page[kOutOff + r() % kXenconsOutSize]).store(static_cast<std::uint8_t>(r())); break;
          case 5: std::atomic_ref(page[kInOff + r() % kXenconsInSize]).store(static_cast<std::uint8_t>(r())); break;
          case 6: {  // a guest that behaves: out_prod moves forward, at most to out_cons + 2048
            const std::uint32_t prod = idx(kOutProd).load(), used = prod - idx(kOutCons).load();
            if (used <= kXenconsOutSize) idx(kOutProd).store(prod + static_cast<std::uint32_t>(r() % (kXenconsOutSize - used + 1)));
            break;
          }
          default: {  // in_cons moves forward, at most to in_prod
            const std::uint32_t cons = idx(kInCons).load(), used = idx(kInProd).load() - cons;
            if (used <= kXenconsInSize) idx(kInCons).store(cons + static_cast<std::uint32_t>(r() % (used + 1)));
            break;
          }
        }
        if (r() % 3 == 0) {
          const std::uint64_t one = 1;
          (void)!::write(rig_->guest_kick(), &one, sizeof one);
        }
        if (r() % 64 == 0) std::this_thread::yield();
      }
    });
    for (int i = 0; i < 400; ++i) {
      const std::size_t len = rng_() % 1500;
      const Bytes typed = random_bytes(rng_, len);
      const std::size_t n = rig_->console().receive(typed);
      EXPECT_LE(n, len);
      EXPECT_LE(n, kXenconsInSize);
      totals.racing_taken += n;
    }
    stop = true;
    scribbler.join();
    rig_->stop_thread();
    hostile_steps_ += 1;
    if (only_valid && was_usable) {
      EXPECT_FALSE(rig_->console().disabled()) << "disabled by a guest whose indexes stayed within the rings";
    }
  }

  // Disabled: whatever the guest writes of its own fields and however it notifies, no host step
  // writes the page, calls Output or notifies again.
  void expect_disabled_for_good() {
    take_kicks(rig_->host_kick());
    const std::size_t out_at = rig_->output_size();
    for (int i = 0; i < 20; ++i) {
      store(kOutProd, load(kOutCons) + static_cast<std::uint32_t>(below(kXenconsOutSize)));
      store(kInCons, load(kInProd));
      kick(rig_->guest_kick());
      const Snapshot before = rig_->snap();
      rig_->poll();
      const Bytes b = random_bytes(rng_, 1 + below(100));
      EXPECT_EQ(rig_->console().receive(b), 0u);
      EXPECT_TRUE(rig_->snap() == before) << "a disabled console wrote the page:" << diff(before, rig_->snap());
    }
    EXPECT_EQ(rig_->output_size(), out_at);
    EXPECT_EQ(take_kicks(rig_->host_kick()), 0u);
  }

  std::uint64_t seed_;
  Rng rng_;
  unsigned hostility_ = 0;
  std::uint64_t hostile_steps_ = 0;
  std::unique_ptr<Rig> rig_;
};

TEST(PvConsoleFuzz, AHostileGuestLosesOnlyItsConsoleAndAWellBehavedOneGetsEveryByte) {
  const auto [first, last] = xpv::test::fuzz_seeds(400);
  spdlog::set_level(spdlog::level::off);  // one error line per disabled console
  for (std::uint64_t seed = first; seed <= last; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    World w(seed);
    w.run();
    if (HasFailure()) break;
  }
  spdlog::set_level(spdlog::level::info);
  const std::uint64_t n = last - first + 1;
  std::printf("seeds %llu: sequential bytes out %llu in %llu; streamed out %llu in %llu; disabled by out %llu, by in %llu; "
              "survived hostile steps %llu; racing phases %llu (bytes taken %llu)\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(totals.out_exact),
              static_cast<unsigned long long>(totals.in_exact), static_cast<unsigned long long>(totals.stream_out),
              static_cast<unsigned long long>(totals.stream_in), static_cast<unsigned long long>(totals.disabled_out),
              static_cast<unsigned long long>(totals.disabled_in), static_cast<unsigned long long>(totals.survived),
              static_cast<unsigned long long>(totals.raced), static_cast<unsigned long long>(totals.racing_taken));
  if (HasFailure() || n < 20) return;
  // Not a check of the console: that the fuzzer reached the working paths as well as the refusals.
  EXPECT_GT(totals.out_exact, 100 * n) << "few bytes drained in the sequential steps";
  EXPECT_GT(totals.in_exact, 100 * n) << "few bytes received in the sequential steps";
  EXPECT_GT(totals.stream_out, 1000 * n);
  EXPECT_GT(totals.stream_in, 1000 * n);
  EXPECT_GT(totals.disabled_out, n / 10) << "out_prod - out_cons past the ring rarely reached a drain";
  EXPECT_GT(totals.disabled_in, n / 10) << "in_prod - in_cons past the ring rarely reached receive()";
  EXPECT_GT(totals.survived, n / 20) << "few consoles survived hostile steps";
  EXPECT_GT(totals.raced, n / 3);
  EXPECT_GT(totals.racing_taken, 0u);
}

}  // namespace
}  // namespace xpv::vmm
