// NetbackQueue against a hostile frontend: seeded, bounded fuzzing of everything a guest controls
// on a netif queue — the tx and rx ring slots, its producer indexes, its grant-table entries and
// the pages it grants — and of what the host's "TAP" hands netback (any frame, any vnet header).
// The guest is a memfd with a real GrantTable and real front rings, as in the unit tests
// (tests/unit/netback/queue_test.cpp); the TAP is one end of a SOCK_SEQPACKET socketpair.
//
// Three modes, each with invariants that a real bug breaks:
//   protocol  the guest keeps the ring indexes consistent but fills slots with anything (random
//             flags, sizes, offsets, ids, extra-info slots, grants that are out of the table,
//             revoked, read-only, someone else's, the rings' own), and its pages with anything.
//             After every pass: at most the rings' two mappings plus one packet's rx buffers
//             stay mapped; every frame written to the TAP is an Ethernet frame of 14..65535 bytes
//             whose vnet header stays inside it. At the end, a queue that was not disabled must
//             still work: a well-formed tx packet reaches the TAP byte-exact and a host frame
//             reaches posted rx buffers byte-exact; and once the queue is gone no grant it mapped
//             is left marked mapped (GTF_reading/GTF_writing) in the guest's table.
//   chaos     as protocol, plus raw scribbles: random producer indexes, random bytes over the
//             ring pages and over grant entries, the rings' own pages posted as rx buffers. A disabled queue must stay silent (no response,
//             no notification, no frame); the mapping bound holds throughout; every mapping is
//             released with the queue.
//   racing    the queue runs on its own thread while the guest rewrites its granted pages and
//             grant entries under it (time of check against time of use) and keeps sending and
//             posting as in protocol mode. The process must survive (ASan/UBSan in CI), the queue
//             must still work afterwards as above, and every mapping is released with it.
// Each test prints what got through (packets sent and refused, delivered and dropped, queues
// disabled) and asserts that the fuzzer reached the working paths too, not only the refusals.
// A failure prints its seed (SCOPED_TRACE): XPV_FUZZ_SEED=N replays it, XPV_FUZZ_LOG=1 shows the
// queue's own log lines; XPV_FUZZ_ITERATIONS=N runs N seeds per mode (default 60).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "xpv/test/fuzz_seeds.h"
#include "xpv/domain/memory.h"
#include "xpv/gnttab/granter.h"
#include "xpv/netback/queue.h"

namespace xpv::netback {
namespace {

using namespace xpv::ring;
constexpr gnttab::DomId kGuest = 7;
constexpr std::uint64_t kTxGfn = 16, kRxGfn = 100, kDataPages = 64, kCheckGfn = 200;
constexpr std::uint16_t kCheckIdBase = 1000;  // rx ids of the final check; the fuzzer's stay below
constexpr std::size_t kRingMaps = 2;          // the test's own mappings of the two ring pages

using xpv::test::env_number;
std::uint64_t iterations(std::uint64_t fallback) { return env_number("XPV_FUZZ_ITERATIONS", fallback); }
// XPV_FUZZ_SEED=N replays that one seed of each test (the number SCOPED_TRACE printed).
bool skip_seed(std::uint64_t seed) {
  const std::uint64_t only = env_number("XPV_FUZZ_SEED", 0);
  return only != 0 && seed != only;
}

// An IPv4/TCP frame of `len` (>= 54) bytes whose payload bytes follow `salt`.
std::vector<std::uint8_t> tcp_frame(std::size_t len, std::uint8_t salt) {
  std::vector<std::uint8_t> f(std::max<std::size_t>(len, 54), 0);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<std::uint8_t>(i * 7 + salt);
  f[12] = 0x08;
  f[13] = 0x00;
  f[14] = 0x45;
  f[14 + 6] = f[14 + 7] = 0;  // not a fragment
  f[14 + 9] = 6;
  f[14 + 20 + 12] = 5 << 4;
  return f;
}

// One hostile guest with one netif queue served by a real NetbackQueue.
class World {
 public:
  World(std::uint64_t seed, bool split_channels)
      : rng_(seed),
        mem_(domain::DomainMemory::create("guest", {{0, 512 * kPageSize}})),
        table_({mem_.view().page(0).value()}) {
    tx_.emplace(NetifTxFrontRing::init(page(1)).value());
    rx_.emplace(NetifRxFrontRing::init(page(2)).value());
    tx_ref_ = table_.grant_access(0, 1, false).value();
    rx_ref_ = table_.grant_access(0, 2, false).value();
    for (auto* e : {&to_dom0_, &from_dom0_, &to_dom0_rx_, &from_dom0_rx_}) *e = domain::EventFd::create().value();
    // Pools of grants the fuzzer draws from: the data pages (read-only for tx, writable for rx),
    // grants for another domain, read-only grants of rx pages, and refs granted then revoked.
    for (std::uint64_t i = 0; i < kDataPages; ++i) {
      tx_pool_.push_back(table_.grant_access(0, kTxGfn + i, true).value());
      rx_pool_.push_back(table_.grant_access(0, kRxGfn + i, false).value());
    }
    for (std::uint64_t i = 0; i < 8; ++i) {
      odd_pool_.push_back(table_.grant_access(3, kTxGfn + i, false).value());  // not ours to map
      odd_pool_.push_back(table_.grant_access(0, kRxGfn + i, true).value());   // read-only rx
      const gnttab::GrantRef r = table_.grant_access(0, kTxGfn + i, false).value();
      (void)table_.end_access(r);
      odd_pool_.push_back(r);  // revoked
    }
    for (auto& b : page_span(kTxGfn, kDataPages)) b = static_cast<std::uint8_t>(rng_());
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
    tap_ = UniqueFd(sv[0]);
    host_ = UniqueFd(sv[1]);
    int big = 4 << 20;
    ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    ::setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);

    backend_mem_.emplace(domain::DomainMemory::attach(UniqueFd(::dup(mem_.fd())), mem_.layout()));
    mapper_ = std::make_unique<gnttab::GrantMapper>(0, kGuest, std::vector{backend_mem_->view().page(0).value()},
                                                    backend_mem_->view());
    auto txm = mapper_->map(tx_ref_, false);
    auto rxm = mapper_->map(rx_ref_, false);
    EXPECT_TRUE(txm && rxm);
    NetbackConfig cfg;
    cfg.sg = sg_ = rng_() % 4 != 0;
    cfg.rx_gso = {rng_() % 2 == 0, rng_() % 2 == 0};
    cfg.rx_stall_ms = 5;  // the fuzzer's backlogs are dropped quickly instead of piling up
    cfg.rx_queue.pool_bytes = 256u << 10;
    cfg.rx_drain = rng_() % 2 == 0;  // both ways of holding a backlog (the default leaves it in the TAP)
    cfg.rx_queue.seed = static_cast<std::uint32_t>(seed);
    auto chan = [](domain::EventFd& in, domain::EventFd& out) {
      return std::make_unique<domain::Dom0Port>(UniqueFd(::dup(in.fd())), UniqueFd(::dup(out.fd())));
    };
    queue_ = std::make_unique<NetbackQueue>(
        "vif7.0-q0", *mapper_, NetifTxBackRing::attach(txm->writable()).value(),
        NetifRxBackRing::attach(rxm->writable()).value(), chan(to_dom0_, from_dom0_),
        split_channels ? chan(to_dom0_rx_, from_dom0_rx_) : nullptr, tap_.get(), cfg);
  }

  std::mt19937_64& rng() { return rng_; }
  NetbackQueue& queue() { return *queue_; }
  gnttab::GrantMapper& mapper() { return *mapper_; }
  std::span<std::uint8_t> page(std::uint64_t gfn) { return mem_.view().page(gfn).value(); }
  std::span<std::uint8_t> page_span(std::uint64_t gfn, std::uint64_t n) {
    return {page(gfn).data(), n * kPageSize};
  }
  bool scribbled_table() const { return scribbled_table_; }

  // ---- what a hostile guest does --------------------------------------------------------------

  // With `own_rings`, also the rings' own writable grants: a guest that posts its ring page as an
  // rx buffer has netback write a packet over its ring indexes — it wrecks itself (the queue is
  // disabled, correctly), so only chaos does that.
  gnttab::GrantRef pick_ref(bool for_rx) {
    switch (rng_() % 12) {
      case 0: return static_cast<gnttab::GrantRef>(rng_());
      case 1: return static_cast<gnttab::GrantRef>(table_.capacity() + rng_() % 64);
      case 2:
        if (for_rx && (!own_rings_ || rng_() % 8 != 0)) return rx_pool_[rng_() % rx_pool_.size()];
        return rng_() % 2 ? tx_ref_ : rx_ref_;
      case 3: return static_cast<gnttab::GrantRef>(rng_() % 8);  // reserved refs
      case 4:
      case 5: return odd_pool_[rng_() % odd_pool_.size()];
      default: {
        auto& pool = for_rx ? rx_pool_ : tx_pool_;
        return pool[rng_() % pool.size()];
      }
    }
  }

  // A run of tx slots of anything, ending with two plain slots so that the ring is left at a
  // packet boundary (a packet that runs past what was pushed disables the queue, as Linux netback
  // does): the first ends a chain of extra-info slots (gref 0 reads as type 0, no "more" flag),
  // the second the fragments of a packet whose first slot said more data.
  void tx_garbage() {
    const int n = 1 + static_cast<int>(rng_() % 24);
    for (int i = 0; i < n && tx_->free_requests() > 2; ++i) {
      NetifTxRequest r{};
      if (rng_() % 8 == 0) {
        std::uint8_t raw[sizeof r];
        for (auto& b : raw) b = static_cast<std::uint8_t>(rng_());
        std::memcpy(&r, raw, sizeof r);
      } else if (rng_() % 6 == 0) {
        NetifExtraInfo e{};
        e.type = static_cast<std::uint8_t>(rng_() % 7);
        e.flags = static_cast<std::uint8_t>(rng_() % 4 == 0 ? 1 : 0);  // XEN_NETIF_EXTRA_FLAG_MORE
        e.u.gso.size = static_cast<std::uint16_t>(rng_() % 3 == 0 ? 0 : rng_());
        e.u.gso.type = static_cast<std::uint8_t>(rng_() % 4);
        r = netif_extra_to_tx(e);
      } else {
        r.gref = pick_ref(false);
        r.offset = static_cast<std::uint16_t>(rng_() % 3 == 0 ? 0 : rng_() % 4200);
        r.size = static_cast<std::uint16_t>(rng_() % 3 == 0 ? rng_() % 200 : rng_());
        r.flags = static_cast<std::uint16_t>(rng_() % 16);
        r.id = static_cast<std::uint16_t>(rng_());
      }
      if (!tx_->produce_request(r)) return;  // chaos may have broken the front ring's view
    }
    for (int i = 0; i < 2; ++i) {
      NetifTxRequest end{};  // gref 0, flags 0: also an invalid extra-info slot if read as one
      end.size = static_cast<std::uint16_t>(rng_() % 100);
      end.id = static_cast<std::uint16_t>(rng_());
      if (!tx_->produce_request(end)) return;
    }
    tx_kick();
  }

  // A packet that is well formed except for what the fuzzer puts in its pages and offload bits.
  void tx_plausible() {
    const std::size_t len = 54 + rng_() % (rng_() % 4 == 0 ? 65000 : 3000);
    const std::size_t slots = (len + kPageSize - 1) / kPageSize;
    const bool extra = rng_() % 3 == 0;
    if (tx_->free_requests() < slots + 1 || slots > kDataPages) return;
    const std::size_t first = rng_() % (kDataPages - slots + 1);
    const auto f = tcp_frame(len, static_cast<std::uint8_t>(rng_()));
    for (std::size_t i = 0; i < slots; ++i) {
      const std::size_t n = std::min<std::size_t>(kPageSize, len - i * kPageSize);
      std::memcpy(page(kTxGfn + first + i).data(), f.data() + i * kPageSize, n);
      NetifTxRequest r{};
      r.gref = tx_pool_[first + i];
      r.id = static_cast<std::uint16_t>(rng_());
      r.size = static_cast<std::uint16_t>(i == 0 ? len : n);
      r.flags = static_cast<std::uint16_t>((i + 1 < slots ? kNettxfMoreData : 0) |
                                           (i == 0 ? (rng_() % 4) | (extra ? kNettxfExtraInfo : 0) : 0));
      if (!tx_->produce_request(r)) return;
      if (i == 0 && extra) {
        NetifExtraInfo e{};
        e.type = kXenNetifExtraTypeGso;
        e.u.gso.size = static_cast<std::uint16_t>(rng_() % 2 ? 1448 : rng_());
        e.u.gso.type = static_cast<std::uint8_t>(1 + rng_() % 2);
        if (!tx_->produce_request(netif_extra_to_tx(e))) return;
      }
    }
    tx_kick();
  }

  void rx_post_garbage() {
    const int n = 1 + static_cast<int>(rng_() % 40);
    for (int i = 0; i < n && rx_->free_requests() > 0; ++i) {
      NetifRxRequest r{};
      r.id = static_cast<std::uint16_t>(rng_() % kCheckIdBase);
      r.gref = pick_ref(true);
      if (!rx_->produce_request(r)) return;
    }
    (void)rx_->push_requests();
    kick_all();
  }

  // The host's side of the TAP: any vnet header, any frame up to a TAP's 64 KiB (a kernel's TAP
  // would not send some of these; netback must not care).
  void host_garbage() {
    VnetHdr h{};
    if (rng_() % 2) {
      std::uint8_t raw[sizeof h];
      for (auto& b : raw) b = static_cast<std::uint8_t>(rng_());
      std::memcpy(&h, raw, sizeof h);
    } else if (rng_() % 2) {
      h.flags = 1;  // needs csum
      h.gso_type = static_cast<std::uint8_t>(rng_() % 5);
      h.gso_size = static_cast<std::uint16_t>(rng_() % 2 ? 1448 : rng_());
      h.csum_start = 34;
      h.csum_offset = 16;
    }
    const std::size_t len = rng_() % 4 == 0 ? rng_() % 65536 : rng_() % 1600;
    std::vector<std::uint8_t> f;
    if (len < 54 || rng_() % 3 == 0) {
      f.resize(len);
      for (auto& b : f) b = static_cast<std::uint8_t>(rng_());
    } else {
      f = tcp_frame(len, static_cast<std::uint8_t>(rng_()));
    }
    iovec iov[2] = {{&h, sizeof h}, {f.data(), f.size()}};
    (void)::writev(host_.get(), iov, 2);  // may not fit (EMSGSIZE/EAGAIN): then it is not sent
  }

  void scribble_data() {
    auto d = page_span(rng_() % 2 ? kTxGfn : kRxGfn, kDataPages);
    const std::size_t at = rng_() % d.size();
    const std::size_t n = std::min<std::size_t>(d.size() - at, 1 + rng_() % 512);
    for (std::size_t i = 0; i < n; ++i) d[at + i] = static_cast<std::uint8_t>(rng_());
  }

  // A grant entry of the pools re-granted or revoked through the table (what a guest may do).
  void flip_grant() {
    const bool rx = rng_() % 2;
    auto& pool = rx ? rx_pool_ : tx_pool_;
    const std::size_t i = rng_() % pool.size();
    const std::uint64_t gfn = (rx ? kRxGfn : kTxGfn) + i;
    if (table_.end_access(pool[i])) {
      // After chaos scribbled the table the granter may refuse; the revoked ref then stays.
      if (auto r = table_.grant_access(rng_() % 4 == 0 ? 9 : 0, gfn, rx ? rng_() % 4 == 0 : true)) pool[i] = *r;
    }
  }

  // ---- chaos: what a guest may write that no driver would ------------------------------------

  void allow_own_rings() { own_rings_ = true; }

  // Random bits over the entry of a grant the fuzzer uses (flags, domid, frame: GTF_reading and
  // GTF_writing too, which only the mapper should set). Never the rings' own, and no free entry
  // but odd_pool_'s revoked refs (a scribbled free entry makes the fuzzer's granter refuse it
  // when it comes round again; its free list is first in, first out, and a run allocates far
  // fewer than the ~350 refs ahead of those). Without own_rings, never a
  // frame that makes the entry a grant of the guest's own grant table or ring pages, or of the
  // final check's pages: a writable grant of those posted as an rx buffer has netback write a
  // host frame over the guest's own indexes or grant entries (as pick_ref says, it wrecks
  // itself: the queue is disabled, correctly, or the guest's granter refuses to grant again) —
  // and the racing mode, which scribbles too, then checks that the queue still works.
  void scribble_table() {
    auto t = page(0);
    auto& pool = rng_() % 3 == 0 ? odd_pool_ : rng_() % 2 ? tx_pool_ : rx_pool_;
    const std::size_t entry = pool[rng_() % pool.size()];
    std::optional<std::uint8_t> bytes[8];
    for (auto& b : bytes) {
      if (rng_() % 3 == 0) b = static_cast<std::uint8_t>(rng_());
    }
    if (!own_rings_) {
      std::uint32_t frame = 0;  // the frame field (bytes 4..7) as the scribble would leave it
      for (std::size_t i = 0; i < 4; ++i) {
        frame |= std::uint32_t{bytes[4 + i].value_or(t[entry * 8 + 4 + i])} << (8 * i);
      }
      if (guest_own_page(frame)) {
        for (std::size_t i = 4; i < 8; ++i) bytes[i].reset();  // the frame stays as it was
      }
    }
    for (std::size_t i = 0; i < 8; ++i) {
      if (bytes[i]) t[entry * 8 + i] = *bytes[i];
    }
    scribbled_table_ = true;
  }
  // The grant table (gfn 0), the rings (1, 2) and the pages of check_still_works.
  static bool guest_own_page(std::uint64_t gfn) {
    return gfn <= 2 || (gfn >= kCheckGfn && gfn < kCheckGfn + 8 + 40);
  }
  void scribble_ring() {
    auto r = page(rng_() % 2 ? 1 : 2);
    const std::size_t at = rng_() % 4 == 0 ? rng_() % 16 : 64 + rng_() % (kPageSize - 64);
    const std::size_t n = 1 + rng_() % 16;
    for (std::size_t i = 0; i < n && at + i < kPageSize; ++i) r[at + i] = static_cast<std::uint8_t>(rng_());
    kick_all();
  }
  void wild_producer() {
    std::atomic_ref<std::uint32_t> prod(*reinterpret_cast<std::uint32_t*>(page(rng_() % 2 ? 1 : 2).data()));
    prod.store(static_cast<std::uint32_t>(rng_() % 2 ? rng_() : prod.load() + rng_() % 600 - 300));
    kick_all();
  }
  void kick_all() {
    (void)to_dom0_.notify();
    (void)to_dom0_rx_.notify();
  }

  // ---- what the guest and the host get back --------------------------------------------------

  // Pops every response (ignored while chaos broke the front ring's view); recycles rx slots.
  void drain_responses() {
    while (tx_->pop_response()) {
    }
    while (rx_->pop_response()) {
    }
  }

  // Reads every frame netback wrote to the TAP and checks each one's shape. Returns them.
  std::vector<std::vector<std::uint8_t>> host_frames() {
    std::vector<std::vector<std::uint8_t>> out;
    for (int i = 0; i < 512; ++i) {
      VnetHdr h{};
      std::vector<std::uint8_t> buf(70000);
      iovec iov[2] = {{&h, sizeof h}, {buf.data(), buf.size()}};
      const ssize_t n = ::readv(host_.get(), iov, 2);
      if (n < 0) break;
      EXPECT_GE(n, static_cast<ssize_t>(sizeof h + 14)) << "a frame shorter than an Ethernet header";
      const std::size_t len = static_cast<std::size_t>(n) - sizeof h;
      EXPECT_LE(len, 65535u);
      if (h.flags & kVnetFNeedsCsum) {
        EXPECT_LE(std::size_t{h.csum_start} + h.csum_offset + 2, len) << "checksum field outside the frame";
      }
      if (h.gso_type != kVnetGsoNone) {
        EXPECT_TRUE(h.flags & kVnetFNeedsCsum) << "GSO without a partial checksum";
        EXPECT_GT(h.gso_size, 0);
        EXPECT_LE(h.hdr_len, len);
      }
      buf.resize(len);
      out.push_back(std::move(buf));
    }
    return out;
  }

  std::uint64_t notifications() {
    return from_dom0_.consume().value_or(0) + from_dom0_rx_.consume().value_or(0);
  }
  RingIdx tx_rsp_prod() { return std::atomic_ref<RingIdx>(*reinterpret_cast<RingIdx*>(page(1).data() + 8)).load(); }
  RingIdx rx_rsp_prod() { return std::atomic_ref<RingIdx>(*reinterpret_cast<RingIdx*>(page(2).data() + 8)).load(); }

  // ---- the final check of a queue that survived ------------------------------------------------

  // A well-formed packet out and one in must still work.
  void check_still_works() {
    for (int i = 0; i < 8; ++i) {  // let the queue finish what the fuzzer left on the rings
      ASSERT_TRUE(queue_->poll_once());
      drain_responses();
    }
    ASSERT_GE(tx_->free_requests(), 3u);
    (void)host_frames();
    // Out: a 3-slot packet from pages the fuzzer never granted.
    const auto out = tcp_frame(9000, 0x5a);
    std::vector<gnttab::GrantRef> refs;
    for (std::size_t i = 0; i < 3; ++i) {
      std::memcpy(page(kCheckGfn + i).data(), out.data() + i * kPageSize, std::min<std::size_t>(kPageSize, 9000 - i * kPageSize));
      refs.push_back(table_.grant_access(0, kCheckGfn + i, true).value());
      NetifTxRequest r{};
      r.gref = refs.back();
      r.id = static_cast<std::uint16_t>(60000 + i);
      r.size = static_cast<std::uint16_t>(i == 0 ? 9000 : std::min<std::size_t>(kPageSize, 9000 - i * kPageSize));
      r.flags = i < 2 ? kNettxfMoreData : 0;
      ASSERT_TRUE(tx_->produce_request(r));
    }
    tx_kick();
    bool sent = false;
    for (int pass = 0; pass < 50 && !sent; ++pass) {
      ASSERT_TRUE(queue_->poll_once()) << "the queue was disabled by a well-formed packet";
      for (const auto& f : host_frames()) sent = sent || f == out;
      for (auto r = tx_->pop_response(); r; r = tx_->pop_response()) {
        if (r->id == 60000) {
          EXPECT_EQ(r->status, kNetifRspOkay);
        }
      }
    }
    EXPECT_TRUE(sent) << "a well-formed tx packet did not reach the TAP intact";
    // In: the ring may still hold up to 256 buffers the fuzzer posted (and netback up to
    // kRxDirectSlots of them popped), ahead of ours; what its host side left queued goes first.
    // So: host frames of one slot until a response names a buffer of ours — from there on every
    // buffer netback holds or pops is ours — then one known frame that must arrive byte-exact.
    std::uint16_t next_id = kCheckIdBase;
    std::vector<std::uint16_t> gfn_of(65536, 0);
    auto post = [&](int n) {
      for (int i = 0; i < n && rx_->free_requests() > 0; ++i) {
        const std::uint64_t gfn = kCheckGfn + 8 + (next_id % 40);
        NetifRxRequest r{};
        r.id = next_id;
        r.gref = check_grant(gfn);
        gfn_of[next_id] = static_cast<std::uint16_t>(gfn);
        next_id = static_cast<std::uint16_t>(next_id + 1 >= 60000 ? kCheckIdBase : next_id + 1);
        ASSERT_TRUE(rx_->produce_request(r));
      }
      (void)rx_->push_requests();
      kick_all();
    };
    auto host_send = [&](const std::vector<std::uint8_t>& f) {
      VnetHdr h{};
      iovec iov[2] = {{&h, sizeof h}, {const_cast<std::uint8_t*>(f.data()), f.size()}};
      ASSERT_EQ(::writev(host_.get(), iov, 2), static_cast<ssize_t>(sizeof h + f.size()));
    };
    // One pass: post, serve, and read the packets answered; `on_packet(data, ours)` for each (ours:
    // every slot a buffer of the check, none an error).
    auto pass_once = [&](auto&& on_packet) {
      post(40);
      ASSERT_TRUE(queue_->poll_once()) << "the queue was disabled by well-formed rx buffers";
      std::vector<std::uint8_t> pkt;
      bool in_pkt = false, skip_extra = false, ours = true;
      for (auto r = rx_->pop_response(); r; r = rx_->pop_response()) {
        if (skip_extra) {
          skip_extra = false;
          continue;
        }
        if (r->status < 0 || r->id < kCheckIdBase || r->id >= 60000) {
          ours = false;
        } else {
          const auto p = page(gfn_of[r->id]);
          pkt.insert(pkt.end(), p.begin(), p.begin() + std::min<std::ptrdiff_t>(r->status, kPageSize));
        }
        if (!in_pkt && (r->flags & kNetrxfExtraInfo)) skip_extra = true;
        in_pkt = (r->flags & kNetrxfMoreData) != 0;
        if (!in_pkt) {
          on_packet(pkt, ours);
          pkt.clear();
          ours = true;
        }
      }
    };
    const auto filler = tcp_frame(1500, 0x11);
    bool reached = false;
    for (int pass = 0; pass < 400 && !reached; ++pass) {
      pass_once([&](const std::vector<std::uint8_t>&, bool ours) { reached = reached || ours; });
      if (testing::Test::HasFatalFailure()) return;
      if (!reached) host_send(filler);
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // let rx_stall_ms run out
    }
    ASSERT_TRUE(reached) << "no rx buffer posted by the check was ever answered";
    const auto in = tcp_frame(sg_ ? 5000 : 1500, 0xa5);  // without feature-sg: one slot
    host_send(in);
    bool got = false;
    for (int pass = 0; pass < 20 && !got; ++pass) {
      pass_once([&](const std::vector<std::uint8_t>& data, bool ours) { got = got || (ours && data == in); });
      if (testing::Test::HasFatalFailure()) return;
    }
    EXPECT_TRUE(got) << "a host frame did not reach posted rx buffers intact";
  }

  // After the queue is destroyed: every mapping but the rings' is released, and (unless the
  // fuzzer wrote flag bits itself) no entry is left marked mapped.
  void check_released() {
    queue_.reset();
    EXPECT_EQ(mapper_->mapped(), kRingMaps) << "grant mappings leaked by the queue";
    if (scribbled_table_) return;
    for (gnttab::GrantRef r = 8; r < table_.capacity(); ++r) {
      if (r == tx_ref_ || r == rx_ref_) continue;
      EXPECT_FALSE(table_.is_mapped(r)) << "grant " << r << " left marked mapped";
    }
  }

 private:
  void tx_kick() {
    if (tx_->push_requests()) (void)to_dom0_.notify();
    (void)to_dom0_.notify();  // an extra kick is harmless and keeps a parked queue awake
  }
  gnttab::GrantRef check_grant(std::uint64_t gfn) {
    auto& ref = check_refs_[gfn - kCheckGfn];
    if (ref == 0) ref = table_.grant_access(0, gfn, false).value();
    return ref;
  }

  std::mt19937_64 rng_;
  domain::DomainMemory mem_;
  std::optional<domain::DomainMemory> backend_mem_;
  gnttab::GrantTable table_;
  std::optional<NetifTxFrontRing> tx_;
  std::optional<NetifRxFrontRing> rx_;
  gnttab::GrantRef tx_ref_ = 0, rx_ref_ = 0;
  std::vector<gnttab::GrantRef> tx_pool_, rx_pool_, odd_pool_;
  gnttab::GrantRef check_refs_[64] = {};
  domain::EventFd to_dom0_, from_dom0_, to_dom0_rx_, from_dom0_rx_;
  UniqueFd tap_, host_;
  std::unique_ptr<gnttab::GrantMapper> mapper_;
  std::unique_ptr<NetbackQueue> queue_;
  bool scribbled_table_ = false, own_rings_ = false, sg_ = true;
};

// One hostile step; chaos adds the writes no driver makes (with `headers`, to the rings'
// indexes too).
void step(World& w, bool chaos, bool headers = true) {
  auto& rng = w.rng();
  // Writes to the rings' indexes end a queue at once (correctly): rare, so that chaos also
  // reaches a queue that has lived through many of the other writes.
  switch (rng() % (chaos ? 10 + (rng() % 16 == 0) : 8)) {
    case 0:
    case 1: w.tx_garbage(); break;
    case 2: w.tx_plausible(); break;
    case 3: w.rx_post_garbage(); break;
    case 4: w.host_garbage(); break;
    case 5: w.scribble_data(); break;
    case 6: w.flip_grant(); break;
    case 7: w.drain_responses(); break;
    case 8: w.scribble_table(); break;
    case 9:
      if (headers) w.scribble_ring();
      break;
    default:
      if (headers) w.wild_producer();
      break;
  }
}

// The queues' complaints about the guest are the point here, not worth printing.
const bool kQuiet = [] {
  spdlog::set_level(env_number("XPV_FUZZ_LOG", 0) ? spdlog::level::info : spdlog::level::critical);
  return true;
}();

// What the fuzzer got through, summed over seeds and printed: a fuzzer that only ever reaches the
// refusals tests half of the queue.
struct Reach {
  std::uint64_t tx_ok = 0, tx_errors = 0, rx_ok = 0, rx_dropped = 0, disabled = 0;
  void add(const NetbackQueue& q) {
    const auto& c = q.counters();
    tx_ok += c.tx_packets.load();
    tx_errors += c.tx_errors.load();
    rx_ok += c.rx_packets.load();
    rx_dropped += c.rx_dropped.load() + c.rx_errors.load() + c.rx_overflow.load();
    disabled += q.disabled() ? 1 : 0;
  }
  void print(const char* mode, std::uint64_t seeds) const {
    std::printf("%s: %llu seeds, %llu queues disabled; tx %llu sent, %llu refused; rx %llu delivered, %llu dropped\n",
                mode, static_cast<unsigned long long>(seeds), static_cast<unsigned long long>(disabled),
                static_cast<unsigned long long>(tx_ok), static_cast<unsigned long long>(tx_errors),
                static_cast<unsigned long long>(rx_ok), static_cast<unsigned long long>(rx_dropped));
  }
};

// The rings' mappings, plus at most one packet's worth of rx buffers held between passes.
constexpr std::size_t kMaxMapped = kRingMaps + NetbackQueue::kRxDirectSlots;

TEST(NetbackRingFuzz, AHostileFrontendNeverBreaksTheQueueItDoesNotDisable) {
  const std::uint64_t n = iterations(60);
  std::uint64_t ran = 0, survived = 0;
  Reach reach;
  for (std::uint64_t seed = 1; seed <= n; ++seed) {
    if (skip_seed(seed)) continue;
    SCOPED_TRACE("seed " + std::to_string(seed) + " (protocol mode)");
    ++ran;
    World w(seed, seed % 2 == 0);
    for (int s = 0; s < 300 && !w.queue().disabled(); ++s) {
      step(w, false);
      if (testing::Test::HasFatalFailure()) return;
      (void)w.queue().poll_once();
      ASSERT_LE(w.mapper().mapped(), kMaxMapped) << "step " << s << ": grant mappings pile up";
      (void)w.host_frames();
    }
    reach.add(w.queue());
    if (!w.queue().disabled()) {
      ++survived;
      w.check_still_works();
      if (testing::Test::HasFatalFailure()) return;
    }
    w.check_released();
  }
  reach.print("protocol", ran);
  if (ran >= 8) {
    // The fuzzer must also reach the queue's working paths, not only its refusals.
    EXPECT_GT(survived, ran / 4) << "most seeds disabled the queue: the check above tested little";
    EXPECT_GT(reach.tx_ok, 0u) << "no fuzzed tx packet ever went through";
    EXPECT_GT(reach.rx_ok, 0u) << "no fuzzed host frame was ever delivered";
  }
}

TEST(NetbackRingFuzz, ADisabledQueueStaysSilentWhateverTheGuestWrites) {
  const std::uint64_t n = iterations(60);
  std::uint64_t ran = 0;
  Reach reach;
  for (std::uint64_t seed = 1; seed <= n; ++seed) {
    if (skip_seed(seed)) continue;
    SCOPED_TRACE("seed " + std::to_string(seed) + " (chaos mode)");
    ++ran;
    World w(seed * 7919, seed % 2 == 1);
    w.allow_own_rings();
    for (int s = 0; s < 300 && !w.queue().disabled(); ++s) {
      step(w, true);
      (void)w.queue().poll_once();
      ASSERT_LE(w.mapper().mapped(), kMaxMapped) << "step " << s << ": grant mappings pile up";
      (void)w.host_frames();
    }
    if (w.queue().disabled()) {
      (void)w.notifications();
      (void)w.host_frames();
      const RingIdx tx = w.tx_rsp_prod(), rx = w.rx_rsp_prod();
      for (int t = 0; t < 50; ++t) {
        step(w, true, /*headers=*/false);  // the guest's writes, not over the response indexes
        EXPECT_FALSE(w.queue().poll_once());
      }
      EXPECT_EQ(w.tx_rsp_prod(), tx) << "a disabled queue answered tx requests";
      EXPECT_EQ(w.rx_rsp_prod(), rx) << "a disabled queue answered rx requests";
      EXPECT_EQ(w.notifications(), 0u) << "a disabled queue notified the guest";
      EXPECT_TRUE(w.host_frames().empty()) << "a disabled queue sent frames to the host";
    }
    reach.add(w.queue());
    w.check_released();
  }
  reach.print("chaos", ran);
  if (ran >= 8) {
    EXPECT_GT(reach.disabled, 0u) << "chaos never disabled a queue: the silence check tested nothing";
  }
}

TEST(NetbackRingFuzz, AGuestRewritingItsPagesUnderTheRunningQueue) {
  const std::uint64_t n = iterations(60) / 6 + 1;
  std::uint64_t ran = 0;
  Reach reach;
  for (std::uint64_t seed = 1; seed <= n; ++seed) {
    if (skip_seed(seed)) continue;
    SCOPED_TRACE("seed " + std::to_string(seed) + " (racing mode)");
    ++ran;
    World w(seed * 104729, seed % 2 == 0);
    {
      std::thread t([&] { w.queue().run(); });
      struct Join {  // also when the guest's side throws: never a joinable thread destroyed
        NetbackQueue& q;
        std::thread& t;
        ~Join() {
          q.stop();
          t.join();
        }
      } join{w.queue(), t};
      for (int s = 0; s < 2000 && !w.queue().disabled(); ++s) {
        step(w, s % 16 == 15, /*headers=*/false);
        if (s % 64 == 0) (void)w.host_frames();
      }
    }
    (void)w.host_frames();
    reach.add(w.queue());
    if (!w.queue().disabled()) {  // no writes to ring indexes here: it must still work
      w.check_still_works();
      if (testing::Test::HasFatalFailure()) return;
    }
    w.check_released();
  }
  reach.print("racing", ran);
}

}  // namespace
}  // namespace xpv::netback
