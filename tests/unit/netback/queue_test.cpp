// NetbackQueue against a fake frontend that plays the guest side in a memfd "guest": it grants
// pages with the real GrantTable, produces requests on real FrontRings and kicks/waits on the
// eventfds of a Dom0Port. The "TAP" is one end of an AF_UNIX SOCK_SEQPACKET socketpair: like a
// TAP it moves whole frames, each with its 10-byte vnet header, and the test holds the other end.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "xpv/domain/memory.h"
#include "xpv/gnttab/granter.h"
#include "xpv/netback/queue.h"
#include "xpv/test/running.h"
#include "xpv/test/temp_dir.h"

namespace xpv::netback {
namespace {

using namespace xpv::ring;
constexpr gnttab::DomId kGuest = 7;

// Guest memory: gfn 0 = grant table frame, 1 = tx ring, 2 = rx ring, 16.. = data pages.
class FakeFrontend {
 public:
  FakeFrontend()
      : mem_(domain::DomainMemory::create("guest", {{0, 512 * kPageSize}})),
        table_({mem_.view().page(0).value()}) {
    tx_.emplace(NetifTxFrontRing::init(mem_.view().page(1).value()).value());
    rx_.emplace(NetifRxFrontRing::init(mem_.view().page(2).value()).value());
    tx_ref = table_.grant_access(0, 1, false).value();
    rx_ref = table_.grant_access(0, 2, false).value();
    to_dom0_ = domain::EventFd::create().value();
    from_dom0_ = domain::EventFd::create().value();
  }

  std::span<std::uint8_t> page(std::uint64_t gfn) { return mem_.view().page(gfn).value(); }
  gnttab::GrantRef grant(std::uint64_t gfn, bool readonly) { return table_.grant_access(0, gfn, readonly).value(); }

  std::unique_ptr<gnttab::GrantMapper> make_mapper() {
    backend_mem_.emplace(domain::DomainMemory::attach(UniqueFd(::dup(mem_.fd())), mem_.layout()));
    return std::make_unique<gnttab::GrantMapper>(0, kGuest, std::vector{backend_mem_->view().page(0).value()},
                                                 backend_mem_->view());
  }
  std::unique_ptr<domain::EventChannel> make_channel() {
    return std::make_unique<domain::Dom0Port>(UniqueFd(::dup(to_dom0_.fd())), UniqueFd(::dup(from_dom0_.fd())));
  }

  void tx(const NetifTxRequest& r) { ASSERT_TRUE(tx_->produce_request(r)); }
  void tx_push() {
    if (tx_->push_requests()) (void)to_dom0_.notify();
  }
  bool kick() { return to_dom0_.notify().has_value(); }  // with nothing new
  void post_rx(std::uint16_t id, gnttab::GrantRef g) {
    NetifRxRequest r{};
    r.id = id;
    r.gref = g;
    ASSERT_TRUE(rx_->produce_request(r));
  }
  void rx_push() {
    if (rx_->push_requests()) (void)to_dom0_.notify();
  }
  std::vector<NetifTxResponse> tx_responses() {
    std::vector<NetifTxResponse> out;
    for (auto r = tx_->pop_response(); r; r = tx_->pop_response()) out.push_back(*r);
    return out;
  }
  std::vector<NetifRxResponse> rx_responses() {
    std::vector<NetifRxResponse> out;
    for (auto r = rx_->pop_response(); r; r = rx_->pop_response()) out.push_back(*r);
    return out;
  }
  // As netfront ends a poll: takes every response there is and re-arms rsp_event (idle).
  std::vector<NetifRxResponse> rx_responses_and_rearm() {
    auto out = rx_responses();
    for (auto more = rx_->final_check_for_responses(); more && *more; more = rx_->final_check_for_responses()) {
      auto again = rx_responses();
      out.insert(out.end(), again.begin(), again.end());
    }
    return out;
  }
  std::uint64_t notifications() { return from_dom0_.consume().value_or(0); }
  std::span<std::uint8_t> tx_ring_page() { return page(1); }

  gnttab::GrantRef tx_ref = 0, rx_ref = 0;

 private:
  domain::DomainMemory mem_;
  std::optional<domain::DomainMemory> backend_mem_;
  gnttab::GrantTable table_;
  std::optional<NetifTxFrontRing> tx_;
  std::optional<NetifRxFrontRing> rx_;
  domain::EventFd to_dom0_, from_dom0_;
};

// An IPv4/TCP frame of `len` bytes whose payload bytes are (i * 7) & 0xff.
std::vector<std::uint8_t> tcp_frame(std::size_t len) {
  std::vector<std::uint8_t> f(len, 0);
  for (std::size_t i = 0; i < len; ++i) f[i] = static_cast<std::uint8_t>(i * 7);
  f[12] = 0x08;
  f[13] = 0x00;
  f[14] = 0x45;
  f[14 + 6] = f[14 + 7] = 0;  // not a fragment
  f[14 + 9] = 6;
  f[14 + 20 + 12] = 5 << 4;
  return f;
}

// The vnet header of a TCPv4 GSO frame from tcp_frame() (MSS 1448, checksum to be completed).
VnetHdr tcpv4_gso_hdr() {
  VnetHdr h{};
  h.flags = kVnetFNeedsCsum;
  h.gso_type = kVnetGsoTcpv4;
  h.gso_size = 1448;
  h.csum_start = 34;
  h.csum_offset = 16;
  return h;
}

// The queue's event channel, with a look at the host end of the "TAP" at each notification:
// whether a frame was already written to it then (MSG_PEEK, non-blocking).
class PeekingChannel final : public domain::EventChannel {
 public:
  PeekingChannel(std::unique_ptr<domain::EventChannel> inner, int host, std::vector<bool>& frame_there)
      : inner_(std::move(inner)), host_(host), frame_there_(frame_there) {}
  Expected<void, int> notify() noexcept override {
    char b = 0;
    frame_there_.push_back(::recv(host_, &b, 1, MSG_PEEK | MSG_DONTWAIT) >= 0);
    return inner_->notify();
  }
  Expected<std::uint64_t, int> consume() noexcept override { return inner_->consume(); }
  Expected<std::uint64_t, int> wait(int timeout_ms) noexcept override { return inner_->wait(timeout_ms); }
  int wait_fd() const noexcept override { return inner_->wait_fd(); }

 private:
  std::unique_ptr<domain::EventChannel> inner_;
  int host_;
  std::vector<bool>& frame_there_;
};

// Public, so that the scenarios run in both rx_drain modes below can be plain functions.
class NetbackQueueTest : public ::testing::Test {
 public:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
    tap_ = UniqueFd(sv[0]);
    host_ = UniqueFd(sv[1]);
    int big = 1 << 20;
    ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    ::setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  }

  void start(NetbackConfig cfg = {}, RxShadow* shadow = nullptr) {
    cfg.rx_gso = {true, true};
    mapper_ = fe_.make_mapper();
    auto txm = mapper_->map(fe_.tx_ref, false);
    auto rxm = mapper_->map(fe_.rx_ref, false);
    ASSERT_TRUE(txm && rxm);
    auto tx = NetifTxBackRing::attach(txm->writable());
    auto rx = NetifRxBackRing::attach(rxm->writable());
    ASSERT_TRUE(tx && rx);
    std::unique_ptr<domain::EventChannel> ch = fe_.make_channel();
    if (peek_at_notify_) ch = std::make_unique<PeekingChannel>(std::move(ch), host_.get(), frame_at_notify_);
    queue_ = std::make_unique<NetbackQueue>("vif7.0-q0", *mapper_, std::move(*tx), std::move(*rx), std::move(ch),
                                            nullptr, tap_.get(), cfg, shadow);
  }

  // A fairness ledger (64 KiB lead) with another vif's queue on it; start_beside_a_busy_vif
  // starts ours on it with that one backlogged. The test resets queue_ before `other` leaves.
  struct Ledger {
    FairShare share{64 * 1024};
    FairShare::Account* other = share.join();
  };
  void start_beside_a_busy_vif(Ledger& l) {
    NetbackConfig cfg;
    cfg.share = &l.share;
    start(cfg);
    l.share.set_backlog(l.other, true);
  }

  // Puts `frame` into data pages granted from gfn `gfn` on, one slot per page-sized piece.
  std::vector<NetifTxRequest> slots_for(const std::vector<std::uint8_t>& frame, std::uint64_t gfn,
                                        std::uint16_t first_id) {
    std::vector<NetifTxRequest> out;
    for (std::size_t off = 0, i = 0; off < frame.size(); off += kPageSize, ++i) {
      const std::size_t n = std::min<std::size_t>(kPageSize, frame.size() - off);
      std::memcpy(fe_.page(gfn + i).data(), frame.data() + off, n);
      NetifTxRequest r{};
      r.gref = fe_.grant(gfn + i, true);
      r.id = static_cast<std::uint16_t>(first_id + i);
      r.size = static_cast<std::uint16_t>(i == 0 ? frame.size() : n);
      out.push_back(r);
    }
    for (std::size_t i = 0; i + 1 < out.size(); ++i) out[i].flags |= kNettxfMoreData;
    return out;
  }

  // A frame the queue wrote to the "TAP" (nullopt if none); `fd`: another "TAP" queue's host end.
  std::optional<std::pair<VnetHdr, std::vector<std::uint8_t>>> host_read(int fd = -1) {
    VnetHdr h{};
    std::vector<std::uint8_t> buf(70000);
    iovec iov[2] = {{&h, sizeof h}, {buf.data(), buf.size()}};
    const ssize_t n = ::readv(fd < 0 ? host_.get() : fd, iov, 2);
    if (n < static_cast<ssize_t>(sizeof h)) return std::nullopt;
    buf.resize(static_cast<std::size_t>(n) - sizeof h);
    return std::make_pair(h, buf);
  }
  void host_write(const VnetHdr& h, const std::vector<std::uint8_t>& f) {
    iovec iov[2] = {{const_cast<VnetHdr*>(&h), sizeof h}, {const_cast<std::uint8_t*>(f.data()), f.size()}};
    ASSERT_EQ(::writev(host_.get(), iov, 2), static_cast<ssize_t>(sizeof h + f.size()));
  }

  // A queue whose `rate` allows 1500 bytes per `usec`, and two 1000-byte tx packets on its ring.
  void start_with_two_tx_packets_over_a_rate(std::uint64_t usec) {
    NetbackConfig cfg;
    cfg.rate_bytes = 1500;
    cfg.rate_usec = usec;
    start(cfg);
    auto s = slots_for(tcp_frame(1000), 16, 0)[0];
    fe_.tx(s);
    s.id = 1;
    fe_.tx(s);
    fe_.tx_push();
  }

  // Every slot of the rx ring posted, buffer i in gfn 16 + i (the rx fill limit's tests).
  void post_whole_rx_ring() {
    for (std::uint16_t i = 0; i < 256; ++i) fe_.post_rx(i, fe_.grant(16 + i, false));
    fe_.rx_push();
  }
  // `n` copies of `frame` from the host, then one pass of the queue.
  void host_burst(const std::vector<std::uint8_t>& frame, int n) {
    for (int i = 0; i < n; ++i) host_write({}, frame);
    ASSERT_TRUE(queue_->poll_once());
  }

  FakeFrontend fe_;
  UniqueFd tap_, host_;
  bool peek_at_notify_ = false;      // start(): the channel records frame_at_notify_
  std::vector<bool> frame_at_notify_;  // per notification: a frame was in the "TAP" already
  std::unique_ptr<gnttab::GrantMapper> mapper_;
  std::unique_ptr<NetbackQueue> queue_;
};

void tx_packet_with_gso_and_fragments_is_assembled(NetbackQueueTest& t, NetbackConfig cfg);

TEST_F(NetbackQueueTest, TxPacketWithGsoAndFragmentsIsAssembled) {
  tx_packet_with_gso_and_fragments_is_assembled(*this, {});
}

// XPV_NETBACK_TX_RESPOND=early: the packet is copied out and answered before the TAP's write;
// the TAP gets the same bytes and header, the guest the same responses and one notification.
TEST_F(NetbackQueueTest, TxPacketAnsweredBeforeTheTapWriteIsAssembledTheSame) {
  NetbackConfig cfg;
  cfg.tx_respond_early = true;
  tx_packet_with_gso_and_fragments_is_assembled(*this, cfg);
}

void tx_packet_with_gso_and_fragments_is_assembled(NetbackQueueTest& t, NetbackConfig cfg) {
  auto& fe_ = t.fe_;
  auto& queue_ = t.queue_;
  t.peek_at_notify_ = true;
  t.start(cfg);
  const auto frame = tcp_frame(10000);  // 3 slots
  auto s = t.slots_for(frame, 16, 1);
  s[0].flags |= kNettxfCsumBlank | kNettxfDataValidated | kNettxfExtraInfo;
  fe_.tx(s[0]);
  NetifExtraInfo gso{};
  gso.type = kXenNetifExtraTypeGso;
  gso.u.gso.size = 1448;
  gso.u.gso.type = kXenNetifGsoTypeTcpv4;
  fe_.tx(netif_extra_to_tx(gso));
  fe_.tx(s[1]);
  fe_.tx(s[2]);
  fe_.tx_push();
  ASSERT_TRUE(queue_->poll_once());
  auto got = t.host_read();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->second, frame);
  EXPECT_EQ(got->first.flags, kVnetFNeedsCsum);
  EXPECT_EQ(got->first.gso_type, kVnetGsoTcpv4);
  EXPECT_EQ(got->first.gso_size, 1448);
  EXPECT_EQ(got->first.csum_start, 34);
  EXPECT_EQ(got->first.csum_offset, 16);
  EXPECT_EQ(got->first.hdr_len, 54);
  auto r = fe_.tx_responses();
  ASSERT_EQ(r.size(), 4u);  // in ring order: first, extra (NULL), two fragments
  EXPECT_EQ(r[0].id, 1);
  EXPECT_EQ(r[0].status, kNetifRspOkay);
  EXPECT_EQ(r[1].status, kNetifRspNull);
  EXPECT_EQ(r[2].id, 2);
  EXPECT_EQ(r[3].id, 3);
  EXPECT_EQ(r[3].status, kNetifRspOkay);
  EXPECT_EQ(queue_->counters().tx_packets.load(), 1u);
  EXPECT_EQ(queue_->counters().tx_bytes.load(), 10000u);
  EXPECT_EQ(fe_.notifications(), 1u);
  // The one difference: when the guest heard of its answer, the TAP had the frame (after) or
  // not yet (early).
  ASSERT_EQ(t.frame_at_notify_.size(), 1u);
  EXPECT_EQ(t.frame_at_notify_[0], !cfg.tx_respond_early);
}

// Early answers for packets the TAP then refuses, and for the largest packet there is.
TEST_F(NetbackQueueTest, TxAnsweredEarlyIsStillOkayWhenTheTapRefusesItAndTheLargestPacketFits) {
  NetbackConfig cfg;
  cfg.tx_respond_early = true;
  start(cfg);
  const auto big = tcp_frame(0xffff);  // 16 slots: the largest size a tx request can carry
  for (const auto& r : slots_for(big, 16, 0)) fe_.tx(r);
  fe_.tx_push();
  ASSERT_TRUE(queue_->poll_once());
  auto got = host_read();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->second, big);
  auto r = fe_.tx_responses();
  ASSERT_EQ(r.size(), 16u);
  for (const auto& rsp : r) EXPECT_EQ(rsp.status, kNetifRspOkay);
  // Fill the "TAP" until it takes no more (bounded): the next packet's write fails.
  const std::vector<std::uint8_t> filler(60000, 0);
  int filled = 0;
  while (filled < 10000 && ::send(tap_.get(), filler.data(), filler.size(), MSG_DONTWAIT) > 0) ++filled;
  ASSERT_LT(filled, 10000);
  const auto small = tcp_frame(1000);
  fe_.tx(slots_for(small, 40, 100)[0]);
  fe_.tx_push();
  ASSERT_TRUE(queue_->poll_once());
  r = fe_.tx_responses();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].id, 100);
  EXPECT_EQ(r[0].status, kNetifRspOkay) << "a drop on the wire, as a NIC's";
  EXPECT_EQ(queue_->counters().tx_dropped.load(), 1u);
  EXPECT_EQ(queue_->counters().tx_packets.load(), 1u);
}

TEST_F(NetbackQueueTest, MalformedTxPacketsGetErrorResponses) {
  start();
  const auto frame = tcp_frame(100);
  auto ok = slots_for(frame, 16, 0)[0];
  NetifTxRequest tiny = ok;  // shorter than an Ethernet header
  tiny.id = 10;
  tiny.size = 13;
  NetifTxRequest cross = ok;  // offset + size past the page
  cross.id = 11;
  cross.offset = 4000;
  NetifTxRequest badref = ok;  // a grant that does not exist
  badref.id = 12;
  badref.gref = 100000;
  NetifTxRequest bigfrag = ok;  // a fragment larger than the packet
  bigfrag.id = 13;
  bigfrag.flags = kNettxfMoreData;
  NetifTxRequest frag = ok;
  frag.id = 14;
  frag.size = 200;
  NetifTxRequest badextra = ok;  // an unknown extra-info type
  badextra.id = 15;
  badextra.flags = kNettxfExtraInfo;
  NetifExtraInfo e{};
  e.type = 9;
  for (const auto& r : {tiny, cross, badref, bigfrag, frag, badextra}) fe_.tx(r);
  fe_.tx(netif_extra_to_tx(e));
  // 19 slots: one more than a packet may have.
  for (int i = 0; i < 19; ++i) {
    NetifTxRequest r = ok;
    r.id = static_cast<std::uint16_t>(20 + i);
    r.size = i == 0 ? 1900 : 100;
    r.flags = i < 18 ? kNettxfMoreData : 0;
    fe_.tx(r);
  }
  fe_.tx(ok);  // and a good one after all that
  fe_.tx_push();
  ASSERT_TRUE(queue_->poll_once());
  auto r = fe_.tx_responses();
  ASSERT_EQ(r.size(), 6u + 1 + 19 + 1);
  for (std::size_t i = 0; i < 26; ++i) {
    EXPECT_EQ(r[i].status, i == 6 ? kNetifRspNull : kNetifRspError) << i;
  }
  EXPECT_EQ(r[0].id, 10);
  EXPECT_EQ(r[2].id, 12);
  EXPECT_EQ(r[3].id, 13);
  EXPECT_EQ(r[4].id, 14);
  EXPECT_EQ(r.back().status, kNetifRspOkay);
  EXPECT_EQ(queue_->counters().tx_errors.load(), 6u);
  EXPECT_EQ(queue_->counters().tx_packets.load(), 1u);
  EXPECT_FALSE(queue_->disabled());
  auto got = host_read();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->second, frame);
  EXPECT_FALSE(host_read());
}

TEST_F(NetbackQueueTest, APacketWithMissingSlotsDisablesTheQueue) {
  start();
  auto s = slots_for(tcp_frame(5000), 16, 0);
  fe_.tx(s[0]);  // more_data, but the second slot is never published
  fe_.tx_push();
  EXPECT_FALSE(queue_->poll_once());
  EXPECT_TRUE(queue_->disabled());
}

// Disabled in the middle of a turn that moved bytes: the queue's accounts in the fairness ledger
// go idle, so other vifs' queues, ahead of its frozen count, are not held back until its teardown.
TEST_F(NetbackQueueTest, ADisabledQueueHoldsNoOtherQueueBack) {
  Ledger l;
  start_beside_a_busy_vif(l);
  FairShare& share = l.share;
  FairShare::Account* other = l.other;
  const auto frame = tcp_frame(1500);
  fe_.tx(slots_for(frame, 16, 0)[0]);  // a good packet: the turn moves bytes
  fe_.tx(slots_for(tcp_frame(5000), 32, 1)[0]);  // then more_data, and its second slot never comes
  fe_.tx_push();
  EXPECT_FALSE(queue_->poll_once());
  EXPECT_TRUE(queue_->disabled());
  const auto got = host_read();
  EXPECT_TRUE(got && got->second == frame) << "the good packet went out in the turn";
  share.charge(other, 1 << 20);  // the other vif goes on, far past the dead queue's count
  EXPECT_TRUE(share.may_go(other));
  queue_.reset();  // leaves `share` before it goes
  share.leave(other);
}

// Small frames are charged at least quantum / max_packets (4 KiB) each in the ledger, so a queue
// flooding them cannot hold other vifs to its byte rate (fair_scheduler.h, turn_cost). Twenty
// 64-byte frames cost 80 KiB, past the 64 KiB lead over another vif's backlogged queue: the next
// frame waits until that queue has moved as much. Counted by bytes (1280), it went at once.
TEST_F(NetbackQueueTest, SmallFramesAreChargedAPacketsShareOfATurnInTheLedger) {
  Ledger l;
  start_beside_a_busy_vif(l);
  FairShare& share = l.share;
  FairShare::Account* other = l.other;
  const auto small = tcp_frame(64);
  auto s = slots_for(small, 16, 0)[0];
  for (std::uint16_t i = 0; i < 20; ++i) {
    s.id = i;
    fe_.tx(s);
  }
  fe_.tx_push();
  ASSERT_TRUE(queue_->poll_once());
  ASSERT_EQ(queue_->counters().tx_packets.load(), 20u);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(host_read());
  EXPECT_EQ(queue_->counters().fair_waits.load(), 0u);
  s.id = 20;
  fe_.tx(s);
  fe_.tx_push();
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().tx_packets.load(), 20u) << "the 21st frame went although 16 KiB past the lead";
  EXPECT_GT(queue_->counters().fair_waits.load(), 0u);
  EXPECT_FALSE(host_read());
  share.charge(other, 20 * 4096);  // the other vif's queue catches up
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().tx_packets.load(), 21u);
  EXPECT_TRUE(host_read());
  queue_.reset();  // leaves `share` before it goes
  share.leave(other);
}

TEST_F(NetbackQueueTest, ABadProducerIndexDisablesTheQueueForGood) {
  start();
  std::atomic_ref<std::uint32_t> req_prod(*reinterpret_cast<std::uint32_t*>(fe_.tx_ring_page().data()));
  req_prod.store(1000, std::memory_order_release);
  EXPECT_FALSE(queue_->poll_once());
  EXPECT_TRUE(queue_->disabled());
  req_prod.store(0, std::memory_order_release);
  EXPECT_FALSE(queue_->poll_once());
  EXPECT_EQ(fe_.notifications(), 0u);
}

TEST_F(NetbackQueueTest, RxFillsPostedBuffersWithGsoExtra) {
  start();
  for (std::uint16_t i = 0; i < 8; ++i) fe_.post_rx(i, fe_.grant(100 + i, false));
  fe_.rx_push();
  const auto frame = tcp_frame(9000);  // 3 pages
  const VnetHdr h = tcpv4_gso_hdr();
  host_write(h, frame);
  ASSERT_TRUE(queue_->poll_once());
  auto r = fe_.rx_responses();
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].id, 0);
  EXPECT_EQ(r[0].status, 4096);
  EXPECT_EQ(r[0].flags, kNetrxfCsumBlank | kNetrxfDataValidated | kNetrxfMoreData | kNetrxfExtraInfo);
  const NetifExtraInfo e = netif_extra_from_rx(r[1]);
  EXPECT_EQ(e.type, kXenNetifExtraTypeGso);
  EXPECT_EQ(e.u.gso.type, kXenNetifGsoTypeTcpv4);
  EXPECT_EQ(e.u.gso.size, 1448);
  EXPECT_EQ(r[2].id, 2);  // request 1's buffer went to the extra slot
  EXPECT_EQ(r[2].status, 4096);
  EXPECT_EQ(r[2].flags, kNetrxfMoreData);
  EXPECT_EQ(r[3].id, 3);
  EXPECT_EQ(r[3].status, 9000 - 8192);
  EXPECT_EQ(r[3].flags, 0);
  EXPECT_EQ(std::memcmp(fe_.page(100).data(), frame.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(fe_.page(102).data(), frame.data() + 4096, 4096), 0);
  EXPECT_EQ(std::memcmp(fe_.page(103).data(), frame.data() + 8192, 9000 - 8192), 0);
  EXPECT_EQ(queue_->counters().rx_packets.load(), 1u);
  EXPECT_EQ(queue_->counters().rx_bytes.load(), 9000u);
}

// With buffers for the largest packet posted, packets are read from the TAP straight into the
// guest's pages (no bounce buffer): the layout the frontend sees must be the same.
TEST_F(NetbackQueueTest, RxStraightIntoHeldBuffersKeepsTheSlotLayout) {
  start();
  constexpr std::uint16_t kPosted = 40;  // more than NetbackQueue::kRxDirectSlots
  static_assert(kPosted > NetbackQueue::kRxDirectSlots * 2);
  std::vector<gnttab::GrantRef> refs;
  for (std::uint16_t i = 0; i < kPosted; ++i) {
    refs.push_back(fe_.grant(100 + i, false));
    fe_.post_rx(i, refs.back());
  }
  fe_.rx_push();
  // 1. A GSO packet of 3 pages: data in buffers 0, 2, 3; buffer 1's slot carries the extra.
  const auto gso = tcp_frame(9000);
  const VnetHdr h = tcpv4_gso_hdr();
  host_write(h, gso);
  ASSERT_TRUE(queue_->poll_once());
  auto r = fe_.rx_responses();
  ASSERT_EQ(r.size(), 4u) << "only the slots the packet used are answered";
  EXPECT_EQ(r[0].id, 0);
  EXPECT_EQ(r[0].flags, kNetrxfCsumBlank | kNetrxfDataValidated | kNetrxfMoreData | kNetrxfExtraInfo);
  EXPECT_EQ(netif_extra_from_rx(r[1]).type, kXenNetifExtraTypeGso);
  EXPECT_EQ(r[2].id, 2);
  EXPECT_EQ(r[3].id, 3);
  EXPECT_EQ(r[3].status, 9000 - 8192);
  EXPECT_EQ(std::memcmp(fe_.page(100).data(), gso.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(fe_.page(102).data(), gso.data() + 4096, 4096), 0);
  EXPECT_EQ(std::memcmp(fe_.page(103).data(), gso.data() + 8192, 9000 - 8192), 0);
  // 2. A jumbo frame without GSO: its data is moved down into consecutive buffers 4, 5, 6.
  auto jumbo = tcp_frame(9000);
  jumbo[100] = 0x5a;
  host_write({}, jumbo);
  ASSERT_TRUE(queue_->poll_once());
  r = fe_.rx_responses();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].id, 4);
  EXPECT_EQ(r[0].status, 4096);
  EXPECT_EQ(r[0].flags, kNetrxfMoreData);
  EXPECT_EQ(r[1].id, 5);
  EXPECT_EQ(r[1].status, 4096);
  EXPECT_EQ(r[2].id, 6);
  EXPECT_EQ(r[2].status, 9000 - 8192);
  EXPECT_EQ(r[2].flags, 0);
  EXPECT_EQ(std::memcmp(fe_.page(104).data(), jumbo.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(fe_.page(105).data(), jumbo.data() + 4096, 4096), 0);
  EXPECT_EQ(std::memcmp(fe_.page(106).data(), jumbo.data() + 8192, 9000 - 8192), 0);
  // 3. Small frames: one buffer each, in ring order.
  const auto small = tcp_frame(60);
  for (int i = 0; i < 3; ++i) host_write({}, small);
  ASSERT_TRUE(queue_->poll_once());
  r = fe_.rx_responses();
  ASSERT_EQ(r.size(), 3u);
  for (std::uint16_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r[i].id, 7 + i);
    EXPECT_EQ(r[i].status, 60);
    EXPECT_EQ(std::memcmp(fe_.page(107 + i).data(), small.data(), 60), 0);
  }
  EXPECT_EQ(queue_->counters().rx_packets.load(), 5u);
  EXPECT_EQ(queue_->counters().rx_bytes.load(), 9000u + 9000u + 180u);
  // Answered buffers are released; the ones held for the next packet (10.. after 10 used) are not.
  EXPECT_EQ(mapper_->pins(refs[0]).writers, 0u);
  EXPECT_EQ(mapper_->pins(refs[9]).writers, 0u);
  EXPECT_EQ(mapper_->pins(refs[10]).writers, 1u);
  queue_.reset();  // and the queue lets go of those when it goes
  EXPECT_EQ(mapper_->pins(refs[10]).writers, 0u);
}

// A posted buffer whose grant cannot be mapped: the packet that lands on it is answered with
// NETIF_RSP_ERROR in every slot, the next packets use the following buffers normally.
TEST_F(NetbackQueueTest, RxIntoAnUnmappableBufferIsAnErrorForThatPacketOnly) {
  start();
  fe_.post_rx(0, 4000);  // never granted
  for (std::uint16_t i = 1; i < 30; ++i) fe_.post_rx(i, fe_.grant(100 + i, false));
  fe_.rx_push();
  const auto frame = tcp_frame(500);
  host_write({}, frame);
  host_write({}, frame);
  ASSERT_TRUE(queue_->poll_once());
  auto r = fe_.rx_responses();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].id, 0);
  EXPECT_EQ(r[0].status, kNetifRspError);
  EXPECT_EQ(r[1].id, 1);
  EXPECT_EQ(r[1].status, 500);
  EXPECT_EQ(std::memcmp(fe_.page(101).data(), frame.data(), 500), 0);
  EXPECT_EQ(queue_->counters().rx_errors.load(), 1u);
  EXPECT_EQ(queue_->counters().rx_packets.load(), 1u);
  EXPECT_FALSE(queue_->disabled());
}

// Both ways of holding the backlog: drained (all five read at once, dropped together at the
// stall's timeout) or left in the TAP (read one by one, each dropped, the stall's time over).
void waits_then_drops(NetbackQueueTest& t, bool drain) {
  NetbackConfig cfg;
  cfg.rx_stall_ms = 0;  // drop as soon as a packet finds no buffers twice
  cfg.rx_drain = drain;
  t.start(cfg);
  const auto frame = tcp_frame(1000);
  for (int i = 0; i < 5; ++i) t.host_write({}, frame);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(t.queue_->poll_once());
  // All were read and, the stall time over, dropped; none delivered.
  EXPECT_EQ(t.queue_->counters().rx_dropped.load(), 5u);
  EXPECT_EQ(t.queue_->counters().rx_packets.load(), 0u);
  EXPECT_EQ(t.fe_.notifications(), 0u);  // never notify without new responses
  // Buffers come back: traffic flows again.
  t.fe_.post_rx(0, t.fe_.grant(100, false));
  t.fe_.rx_push();
  t.host_write({}, frame);
  ASSERT_TRUE(t.queue_->poll_once());
  auto r = t.fe_.rx_responses();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, 1000);
  EXPECT_EQ(t.fe_.notifications(), 1u);
}

TEST_F(NetbackQueueTest, RxWithoutBuffersWaitsThenDropsAndCounts) { waits_then_drops(*this, /*drain=*/false); }

TEST_F(NetbackQueueTest, RxWithoutBuffersWaitsThenDropsAndCountsDrainingTheTap) {
  waits_then_drops(*this, /*drain=*/true);
}

// Past the stall time with everything dropped and nothing more to read, the queue has no work:
// its thread sleeps until the TAP, the frontend or stop() wakes it (it used to spin at 100 % of a
// CPU — in the testbed, one of L1's two — for as long as the frontend posted no buffers).
TEST_F(NetbackQueueTest, RxPastTheStallTimeWithNothingToDoSleeps) {
  NetbackConfig cfg;
  cfg.rx_stall_ms = 0;
  start(cfg);
  const auto frame = tcp_frame(1000);
  for (int i = 0; i < 3; ++i) host_write({}, frame);
  std::thread t([this] { queue_->run(); });
  for (int i = 0; i < 500 && queue_->counters().rx_dropped.load() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::uint64_t before = queue_->counters().wakeups.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::uint64_t during = queue_->counters().wakeups.load() - before;
  // Buffers come back: the next packet is delivered (the stall is over).
  fe_.post_rx(0, fe_.grant(100, false));
  fe_.rx_push();
  host_write({}, frame);
  std::vector<NetifRxResponse> r;
  for (int i = 0; i < 500 && r.empty(); ++i) {
    r = fe_.rx_responses();
    if (r.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  queue_->stop();
  t.join();
  EXPECT_EQ(queue_->counters().rx_dropped.load(), 3u);
  EXPECT_LE(during, 5u) << "the thread woke " << during << " times in 300 ms with nothing to do";
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, 1000);
}

// After a stall's timeout dropped what waited, buffers that come with nothing to put in them are
// no work: the thread sleeps until a packet comes (it used to spin, the stall still on, for as
// long as the TAP stayed empty), in both ways of buffering the backlog.
void stall_then_buffers_without_packets(NetbackQueueTest& t, bool drain) {
  NetbackConfig cfg;
  cfg.rx_stall_ms = 0;
  cfg.rx_drain = drain;
  t.start(cfg);
  t.host_write({}, tcp_frame(6000));  // 2 slots; 1 posted
  t.fe_.post_rx(0, t.fe_.grant(100, false));
  t.fe_.rx_push();
  std::thread th([&t] { t.queue_->run(); });
  for (int i = 0; i < 500 && t.queue_->counters().rx_dropped.load() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  t.fe_.post_rx(1, t.fe_.grant(101, false));
  t.fe_.post_rx(2, t.fe_.grant(102, false));
  t.fe_.rx_push();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::uint64_t before = t.queue_->counters().wakeups.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::uint64_t during = t.queue_->counters().wakeups.load() - before;
  t.host_write({}, tcp_frame(1000));
  std::vector<NetifRxResponse> r;
  for (int i = 0; i < 500 && r.empty(); ++i) {
    r = t.fe_.rx_responses();
    if (r.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  t.queue_->stop();
  th.join();
  EXPECT_EQ(t.queue_->counters().rx_dropped.load(), 1u);
  EXPECT_LE(during, 5u) << "the thread woke " << during << " times in 300 ms with nothing to do";
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, 1000);
}

TEST_F(NetbackQueueTest, RxBuffersAfterTheStallTimeoutWithNothingToReadAreNoWork) {
  stall_then_buffers_without_packets(*this, /*drain=*/true);
}

TEST_F(NetbackQueueTest, RxBuffersAfterTheStallTimeoutWithNothingToReadAreNoWorkWithoutDraining) {
  stall_then_buffers_without_packets(*this, /*drain=*/false);
}

// Started with `cfg`: a 2-slot packet from the host and one rx buffer posted, one look: the
// packet waits for a second buffer, nothing answered yet.
void waits_for_a_second_buffer(NetbackQueueTest& t, const NetbackConfig& cfg) {
  t.start(cfg);
  t.host_write({}, tcp_frame(6000));  // 2 slots
  t.fe_.post_rx(0, t.fe_.grant(100, false));
  t.fe_.rx_push();
  ASSERT_TRUE(t.queue_->poll_once());
  EXPECT_TRUE(t.fe_.rx_responses().empty());
}

TEST_F(NetbackQueueTest, RxWaitsForBuffersWithinTheStallTime) {
  NetbackConfig cfg;
  cfg.rx_stall_ms = 60000;
  ASSERT_NO_FATAL_FAILURE(waits_for_a_second_buffer(*this, cfg));
  EXPECT_EQ(queue_->counters().rx_dropped.load(), 0u);
  // It asks to be woken by the next buffer after the one already posted (req_event = 2), not by
  // the one it already has (which would make it spin).
  std::atomic_ref<std::uint32_t> req_event(*reinterpret_cast<std::uint32_t*>(fe_.page(2).data() + 4));
  EXPECT_EQ(req_event.load(), 2u);
  fe_.post_rx(1, fe_.grant(101, false));
  fe_.rx_push();
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(fe_.rx_responses().size(), 2u);
  EXPECT_EQ(queue_->counters().rx_packets.load(), 1u);
  EXPECT_EQ(queue_->counters().rx_waits.load(), 1u);
  EXPECT_EQ(queue_->counters().rx_waits_late.load(), 0u) << "the buffers came within the stall time";
}

// A wait whose buffers are found only once the stall's time is over counts as late: in a running
// daemon the guest's notification would have woken the thread at the buffer that completed the
// count (so a late wait is a lost wake-up, or a guest that did not notify). Here the test plays
// the thread and looks only after the time is over.
TEST_F(NetbackQueueTest, RxBuffersFoundOnlyAfterTheStallTimeCountAsALateWait) {
  NetbackConfig cfg;
  cfg.rx_stall_ms = 200;  // long enough that the first look never reaches it (and drops)
  ASSERT_NO_FATAL_FAILURE(waits_for_a_second_buffer(*this, cfg));
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  fe_.post_rx(1, fe_.grant(101, false));
  fe_.rx_push();
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(fe_.rx_responses().size(), 2u) << "delivered: the buffers were there at the timeout's look";
  EXPECT_EQ(queue_->counters().rx_dropped.load(), 0u);
  EXPECT_EQ(queue_->counters().rx_waits.load(), 1u);
  EXPECT_EQ(queue_->counters().rx_waits_late.load(), 1u);
}

// A wait the timeout ended by dropping is a frontend that stopped receiving, not a lost wake-up:
// when its buffers come later, nothing is counted late.
TEST_F(NetbackQueueTest, RxAWaitEndedByTheTimeoutsDropIsNotALateWait) {
  NetbackConfig cfg;
  cfg.rx_stall_ms = 0;  // drop as soon as a packet finds no buffers twice
  start(cfg);
  host_write({}, tcp_frame(1000));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().rx_dropped.load(), 1u);
  fe_.post_rx(0, fe_.grant(100, false));
  fe_.rx_push();
  host_write({}, tcp_frame(1000));
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(fe_.rx_responses().size(), 1u);
  EXPECT_EQ(queue_->counters().rx_waits_late.load(), 0u);
}

// With rx_drain (XPV_NETBACK_RX_DRAIN=all), a guest that receives more slowly than the host sends
// does not have its backlog in the TAP's FIFO, where the ACKs of the guest's own sending flow
// would wait behind every bulk packet: netback drains the TAP while the guest has no buffers, and
// when buffers come the packet of the sparse flow goes out before the bulk backlog.
TEST_F(NetbackQueueTest, RxASparseFlowOvertakesABulkBacklogWhileTheGuestIsBehind) {
  NetbackConfig cfg;
  cfg.rx_drain = true;  // XPV_NETBACK_RX_DRAIN=all; the default leaves the backlog in the TAP
  cfg.rx_queue.seed = 1;  // fixed: two flows share a bucket for one seed in 1024
  start(cfg);
  auto with_port = [](std::vector<std::uint8_t> f, std::uint16_t sport) {
    f[20] = 0x40;  // DF, not a fragment (a fragment's flow is its addresses only)
    f[21] = 0;
    for (std::size_t i = 26; i < 34; ++i) f[i] = static_cast<std::uint8_t>(10 + i % 2);  // addresses
    f[34] = static_cast<std::uint8_t>(sport >> 8);
    f[35] = static_cast<std::uint8_t>(sport);
    return f;
  };
  const auto bulk = with_port(tcp_frame(1400), 1000);
  const auto ack = with_port(tcp_frame(66), 2000);
  for (int i = 0; i < 30; ++i) host_write({}, bulk);
  host_write({}, ack);
  ASSERT_TRUE(queue_->poll_once());  // no buffers: everything is read from the TAP and queued
  EXPECT_TRUE(fe_.rx_responses().empty());
  std::uint8_t probe[16];
  EXPECT_LT(::recv(host_.get(), probe, sizeof probe, MSG_PEEK | MSG_DONTWAIT), 0) << "the host end";
  VnetHdr h{};
  iovec iov[2] = {{&h, sizeof h}, {probe, sizeof probe}};
  EXPECT_LT(::readv(tap_.get(), iov, 2), 0) << "the TAP was drained into netback's flow queue";
  // Four buffers come: the ACK is among the first three packets delivered (the bulk flow may
  // finish its first quantum: two 1400-byte frames), not the 31st.
  for (std::uint16_t i = 0; i < 4; ++i) fe_.post_rx(i, fe_.grant(100 + i, false));
  fe_.rx_push();
  ASSERT_TRUE(queue_->poll_once());
  const auto r = fe_.rx_responses();
  ASSERT_EQ(r.size(), 4u);
  int ack_at = -1;
  for (int i = 0; i < 4; ++i) {
    if (r[i].status == 66) ack_at = i;
  }
  ASSERT_GE(ack_at, 0) << "the ACK was not among the first four packets";
  EXPECT_LE(ack_at, 2);
  EXPECT_EQ(std::memcmp(fe_.page(100 + r[ack_at].id).data(), ack.data(), ack.size()), 0);
  // The rest of the backlog follows as buffers come, complete and in order.
  for (std::uint16_t i = 4; i < 40; ++i) fe_.post_rx(i, fe_.grant(100 + i, false));
  fe_.rx_push();
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(fe_.rx_responses().size(), 27u);
  EXPECT_EQ(queue_->counters().rx_packets.load(), 31u);
  EXPECT_EQ(queue_->counters().rx_queued.load(), 31u);
  EXPECT_EQ(queue_->counters().rx_dropped.load() + queue_->counters().rx_overflow.load(), 0u);
}

// rx_drain off (the default, XPV_NETBACK_RX_DRAIN=head): while the guest is behind only the head packet is
// read from the TAP; the rest waits there in arrival order, as under vhost-net, and is read
// straight into the guest's buffers once enough are posted — one copy, no flow order.
TEST_F(NetbackQueueTest, RxWithoutDrainingLeavesTheBacklogInTheTapInArrivalOrder) {
  NetbackConfig cfg;
  cfg.rx_drain = false;
  start(cfg);
  const auto bulk = tcp_frame(1400);
  const auto ack = tcp_frame(66);
  for (int i = 0; i < 30; ++i) host_write({}, bulk);
  host_write({}, ack);
  ASSERT_TRUE(queue_->poll_once());  // no buffers: the head packet is read, the rest stays
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_TRUE(fe_.rx_responses().empty());
  EXPECT_EQ(queue_->counters().rx_packets.load(), 0u);
  // 29 bulk frames and the ACK are still in the TAP (FIONREAD: the bytes it holds).
  int left = 0;
  ASSERT_EQ(::ioctl(tap_.get(), FIONREAD, &left), 0);
  EXPECT_EQ(left, static_cast<int>(29 * (sizeof(VnetHdr) + bulk.size()) + sizeof(VnetHdr) + ack.size()))
      << "the TAP was drained";
  // Four buffers: the head packet and the next three, in arrival order (the ACK is the 31st).
  for (std::uint16_t i = 0; i < 4; ++i) fe_.post_rx(i, fe_.grant(100 + i, false));
  fe_.rx_push();
  ASSERT_TRUE(queue_->poll_once());
  auto r = fe_.rx_responses();
  ASSERT_EQ(r.size(), 4u);
  for (const auto& rsp : r) EXPECT_EQ(rsp.status, 1400);
  EXPECT_EQ(queue_->counters().rx_queued.load(), 4u);  // fewer than kRxDirectSlots posted: via the queue
  // Enough buffers for the direct path: the rest follows straight, the ACK last.
  for (std::uint16_t i = 4; i < 64; ++i) fe_.post_rx(i, fe_.grant(100 + i, false));
  fe_.rx_push();
  ASSERT_TRUE(queue_->poll_once());
  r = fe_.rx_responses();
  ASSERT_EQ(r.size(), 27u);
  EXPECT_EQ(r.back().status, 66);
  EXPECT_EQ(queue_->counters().rx_packets.load(), 31u);
  // The four, and the fifth packet, read as the head while the guest was short again; the rest
  // went straight into the guest's pages.
  EXPECT_EQ(queue_->counters().rx_queued.load(), 5u);
  EXPECT_EQ(queue_->counters().rx_dropped.load() + queue_->counters().rx_overflow.load(), 0u);
}

// The adaptive fill limit (rx_fill_limit.h) against a guest that falls behind: the limit comes
// down to its floor, netback keeps the rest in its flow queue although buffers are posted (so an
// ACK goes ahead of the bulk backlog there), and a guest that then idles while packets are held
// back gets the limit doubled at once. Every look ends a period here (rx_fill_period_us 0).
TEST_F(NetbackQueueTest, RxFillLimitKeepsTheGuestsRingShortWhileItIsBehind) {
  NetbackConfig cfg;
  cfg.rx_queue.seed = 1;
  cfg.rx_fill_adaptive = true;  // and with it rx_drain, whatever the config says: the ACK
  cfg.rx_fill_period_us = 0;     // below overtakes the backlog in the flow queue
  start(cfg);
  constexpr std::size_t kFloor = 2 * NetbackQueue::kRxDirectSlots;
  auto with_port = [](std::vector<std::uint8_t> f, std::uint16_t sport) {
    f[20] = 0x40;
    f[21] = 0;
    f[34] = static_cast<std::uint8_t>(sport >> 8);
    f[35] = static_cast<std::uint8_t>(sport);
    return f;
  };
  const auto bulk = with_port(tcp_frame(1400), 1000);
  const auto ack = with_port(tcp_frame(66), 2000);
  post_whole_rx_ring();
  EXPECT_EQ(queue_->counters().rx_fill_limit.load(), 256u) << "the whole ring to start with";
  const auto bulk2 = with_port(tcp_frame(1400), 1001);
  // 40 packets of two bulk flows, the guest takes none: its ring holds them.
  for (int i = 0; i < 40; ++i) host_write({}, i % 2 ? bulk2 : bulk);
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().rx_packets.load(), 40u);
  // One more packet per look while it stays behind: each look takes the backlog the guest still
  // has off the limit, down to the floor.
  int looks = 0;
  for (; looks < 20 && queue_->counters().rx_fill_limit.load() > kFloor; ++looks) {
    host_write({}, looks % 2 ? bulk : bulk2);
    ASSERT_TRUE(queue_->poll_once());
  }
  ASSERT_EQ(queue_->counters().rx_fill_limit.load(), kFloor);
  EXPECT_LT(looks, 20);
  EXPECT_EQ(queue_->counters().rx_fill_shrinks.load(), static_cast<std::uint64_t>(looks));
  const std::uint64_t behind = queue_->counters().rx_packets.load();
  EXPECT_GE(behind, 40u);
  const std::uint64_t total = 40 + static_cast<std::uint64_t>(looks) + 61;
  // Above the floor's worth behind, the next packets wait in netback although buffers are posted.
  for (int i = 0; i < 60; ++i) host_write({}, bulk);
  host_write({}, ack);
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().rx_packets.load(), behind) << "held back with buffers posted";
  EXPECT_GT(queue_->counters().rx_fill_holds.load(), 0u);
  // The guest works off its backlog and posts the buffers again, still busy (no re-arm): the
  // next packets fill up to the limit, the ACK among the first of them.
  const auto first = fe_.rx_responses();
  ASSERT_EQ(first.size(), behind);
  for (const auto& r : first) fe_.post_rx(r.id, fe_.grant(16 + r.id, false));
  fe_.rx_push();
  ASSERT_TRUE(queue_->poll_once());
  const auto second = fe_.rx_responses();
  EXPECT_EQ(second.size(), kFloor) << "up to the limit and no further";
  int ack_at = -1;
  for (std::size_t i = 0; i < second.size(); ++i) {
    if (second[i].status == 66) ack_at = static_cast<int>(i);
  }
  ASSERT_GE(ack_at, 0);
  EXPECT_LE(ack_at, 2) << "the ACK went ahead of the bulk backlog";
  EXPECT_EQ(std::memcmp(fe_.page(16 + second[static_cast<std::size_t>(ack_at)].id).data(), ack.data(), ack.size()), 0);
  EXPECT_EQ(queue_->counters().rx_fill_grows.load(), 0u);
  // Now it takes everything, posts the buffers again and goes idle while netback still holds
  // packets back: starved by the limit, which doubles.
  for (const auto& r : second) fe_.post_rx(r.id, fe_.grant(16 + r.id, false));
  ASSERT_TRUE(fe_.rx_responses_and_rearm().empty());
  fe_.rx_push();
  const std::uint64_t before = queue_->counters().rx_packets.load();
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().rx_fill_grows.load(), 1u);
  EXPECT_EQ(queue_->counters().rx_fill_limit.load(), 2 * kFloor);
  // Everything left goes out in order and complete; nothing was dropped on the way.
  for (int pass = 0; pass < 10 && queue_->counters().rx_packets.load() < total; ++pass) {
    for (const auto& r : fe_.rx_responses_and_rearm()) fe_.post_rx(r.id, fe_.grant(16 + r.id, false));
    fe_.rx_push();
    ASSERT_TRUE(queue_->poll_once());
  }
  EXPECT_GT(queue_->counters().rx_packets.load(), before);
  EXPECT_EQ(queue_->counters().rx_packets.load(), total);
  EXPECT_EQ(queue_->counters().rx_dropped.load() + queue_->counters().rx_overflow.load(), 0u);
}

// One flow alone has nothing to go ahead of it: however far behind the guest is and however low
// the limit, nothing is held back (each held packet would only cost a second copy).
TEST_F(NetbackQueueTest, RxFillLimitHoldsNothingBackForOneFlowAlone) {
  NetbackConfig cfg;
  cfg.rx_fill_adaptive = true;
  cfg.rx_fill_period_us = 0;
  start(cfg);
  post_whole_rx_ring();
  const auto frame = tcp_frame(1400);
  host_burst(frame, 40);
  for (int i = 0; i < 20; ++i) host_burst(frame, 1);  // looks while 40 and more behind: the limit comes down
  EXPECT_EQ(queue_->counters().rx_fill_limit.load(), 2 * NetbackQueue::kRxDirectSlots);
  host_burst(frame, 100);
  for (int pass = 0; pass < 4; ++pass) ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().rx_packets.load(), 160u) << "every packet straight into a posted buffer";
  EXPECT_EQ(queue_->counters().rx_fill_holds.load(), 0u);
  EXPECT_EQ(queue_->counters().rx_queued.load(), 0u);
}

// Without the limit (the default; XPV_NETBACK_RX_FILL=adaptive turns it on): every posted buffer
// is used.
TEST_F(NetbackQueueTest, RxFillLimitOffFillsEveryPostedBuffer) {
  NetbackConfig cfg;
  cfg.rx_fill_adaptive = false;
  cfg.rx_fill_period_us = 0;
  start(cfg);
  post_whole_rx_ring();
  const auto frame = tcp_frame(1400);
  host_burst(frame, 40);
  host_burst(frame, 100);
  for (int pass = 0; pass < 4; ++pass) ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().rx_packets.load(), 140u);
  EXPECT_EQ(queue_->counters().rx_fill_limit.load(), 256u);
  EXPECT_EQ(queue_->counters().rx_fill_holds.load(), 0u);
}

TEST_F(NetbackQueueTest, RxGsoTheFrontendDidNotNegotiateIsDropped) {
  start();
  fe_.post_rx(0, fe_.grant(100, false));
  fe_.rx_push();
  VnetHdr h{};
  h.flags = kVnetFNeedsCsum;
  h.gso_type = kVnetGsoUdp;
  h.gso_size = 1400;
  host_write(h, tcp_frame(3000));
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_TRUE(fe_.rx_responses().empty());
  EXPECT_EQ(queue_->counters().rx_dropped.load(), 1u);
}

TEST_F(NetbackQueueTest, BothDirectionsTakeTurns) {
  NetbackConfig cfg;
  cfg.fair = {/*quantum_bytes=*/3000, /*max_packets=*/64};
  start(cfg);
  for (std::uint16_t i = 0; i < 64; ++i) fe_.post_rx(i, fe_.grant(200 + i, false));
  fe_.rx_push();
  const auto frame = tcp_frame(1000);
  for (int i = 0; i < 6; ++i) host_write({}, frame);
  auto s = slots_for(frame, 16, 0)[0];
  for (std::uint16_t i = 0; i < 6; ++i) {
    s.id = i;
    fe_.tx(s);
  }
  fe_.tx_push();
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().tx_packets.load(), 6u);
  EXPECT_EQ(queue_->counters().rx_packets.load(), 6u);
  // 3 packets of 1000 bytes per 3000-byte turn: T R T R.
  EXPECT_EQ(queue_->counters().tx_turns.load(), 2u);
  EXPECT_EQ(queue_->counters().rx_turns.load(), 3u);  // the third finds the TAP empty
  // The tx ring was found with requests once: it still had some at the look between its turns.
  EXPECT_EQ(queue_->counters().tx_found.load(), 1u);
}

TEST_F(NetbackQueueTest, NewTxRequestsAreCountedOnceEachTimeTheyAppear) {
  start();
  const auto frame = tcp_frame(1000);
  auto s = slots_for(frame, 16, 0)[0];
  auto send = [&](int n) {
    for (int i = 0; i < n; ++i) {
      fe_.tx(s);
      ++s.id;
    }
    fe_.tx_push();
  };
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().tx_found.load(), 0u);
  send(1);
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().tx_found.load(), 1u);
  ASSERT_TRUE(queue_->poll_once());  // nothing new
  EXPECT_EQ(queue_->counters().tx_found.load(), 1u);
  send(3);  // three packets, found at one look
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().tx_found.load(), 2u);
  EXPECT_EQ(queue_->counters().tx_packets.load(), 4u);
}

TEST_F(NetbackQueueTest, AFrontendKickingWithNothingNewIsMutedAndStillServed) {
  // A guest sending on the port in a loop without posting anything (kick_throttle.h): after
  // kStreak such kicks in a row the queue leaves the port out of its sleep for a while, instead of
  // waking for each one for ever. A packet it sends meanwhile still goes out (at the latest when
  // the mute ends).
  start();
  test::Running running(*queue_);  // stopped and joined also when an ASSERT returns early
  const NetbackCounters& c = queue_->counters();
  // One kick at a time, each looked at before the next (bounded: 300 kicks, 100 ms each; a kick
  // that came before the queue went to sleep is consumed with the look before it, not counted).
  for (int kicks = 0; kicks < 300 && c.kick_mutes.load() == 0; ++kicks) {
    const std::uint64_t before = c.spurious_kicks.load();
    ASSERT_TRUE(fe_.kick());
    for (int j = 0; j < 2000 && c.spurious_kicks.load() == before; ++j) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  EXPECT_EQ(c.kick_mutes.load(), 1u);
  EXPECT_EQ(c.spurious_kicks.load(), std::uint64_t{KickThrottle::kStreak} + 1);
  // While muted: a tx packet, with its kick, still goes to the host (bounded: 2 s).
  const auto frame = tcp_frame(1000);
  auto s = slots_for(frame, 16, 0)[0];
  fe_.tx(s);
  fe_.tx_push();
  std::vector<NetifTxResponse> r;
  for (int i = 0; i < 200 && r.empty(); ++i) {
    r = fe_.tx_responses();
    if (r.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, kNetifRspOkay);
  EXPECT_EQ(c.tx_packets.load(), 1u);
}

TEST_F(NetbackQueueTest, ATxStreamOneAtATimeNeverMutesACorrectFrontend) {
  // A correct frontend kicks only for what it posted: over a running queue, 200 tx packets one
  // at a time (each kicked when the ring asks) count no spurious streak, whatever the races.
  start();
  test::Running running(*queue_);
  const auto frame = tcp_frame(200);
  auto s = slots_for(frame, 16, 0)[0];
  for (int i = 0; i < 200; ++i) {
    fe_.tx(s);
    ++s.id;
    fe_.tx_push();
    std::vector<NetifTxResponse> r;
    for (int j = 0; j < 2000 && r.empty(); ++j) {  // ≤ 2 s
      r = fe_.tx_responses();
      if (r.empty()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ASSERT_EQ(r.size(), 1u) << "packet " << i;
  }
  EXPECT_EQ(queue_->counters().kick_mutes.load(), 0u);
  EXPECT_EQ(queue_->counters().tx_packets.load(), 200u);
}

TEST_F(NetbackQueueTest, RateLimitHoldsPacketsOnTheRing) {
  start_with_two_tx_packets_over_a_rate(60ull * 1000 * 1000);  // one window per minute: the second must wait
  ASSERT_TRUE(queue_->poll_once());
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().tx_packets.load(), 1u);
  EXPECT_EQ(fe_.tx_responses().size(), 1u);
  EXPECT_GE(queue_->counters().rate_limited.load(), 1u);
}

// A credit window that reopens is not new tx requests: the packet that waited for it was found
// when it came.
TEST_F(NetbackQueueTest, ARateWindowThatReopensIsNotCountedAsNewTxRequests) {
  start_with_two_tx_packets_over_a_rate(20 * 1000);
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().tx_packets.load(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the next window is open
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().tx_packets.load(), 2u);
  EXPECT_EQ(queue_->counters().tx_found.load(), 1u);
}

// A TCP frame of `len` bytes from 10.0.0.<src>:<sport> to 10.0.0.<dst>:<dport>.
std::vector<std::uint8_t> flow_frame(std::uint8_t src, std::uint16_t sport, std::uint8_t dst, std::uint16_t dport,
                                     std::size_t len) {
  auto f = tcp_frame(len);
  const std::uint8_t ends[8] = {10, 0, 0, src, 10, 0, 0, dst};
  std::memcpy(&f[14 + 12], ends, sizeof ends);
  f[14 + 6] = f[14 + 7] = 0;  // not a fragment
  f[14 + 20] = static_cast<std::uint8_t>(sport >> 8);
  f[14 + 21] = static_cast<std::uint8_t>(sport);
  f[14 + 22] = static_cast<std::uint8_t>(dport >> 8);
  f[14 + 23] = static_cast<std::uint8_t>(dport);
  return f;
}

// Flow steering (flow_steering.h): the queue writes a guest-tx packet on the TAP queue the vif's
// table picks for its flow, and tells the table of the rx packets it delivers.
// A vif with an address (tx_source): a frame from another IPv4 source is answered OKAY, as a
// firewall's drop, and never reaches the TAP; the one from the domain's address does.
TEST_F(NetbackQueueTest, TxFromAnotherSourceThanTheVifsAddressIsDroppedAndAnsweredOkay) {
  const auto good = tcp_frame(1000);
  const std::uint32_t domain = std::uint32_t{good[26]} << 24 | std::uint32_t{good[27]} << 16 |
                               std::uint32_t{good[28]} << 8 | good[29];
  NetbackConfig cfg;
  cfg.tx_source = domain;
  start(cfg);
  auto forged = good;
  forged[29] ^= 1;  // the next address
  fe_.tx(slots_for(forged, 16, 1)[0]);
  fe_.tx(slots_for(good, 17, 2)[0]);
  fe_.tx_push();
  ASSERT_TRUE(queue_->poll_once());
  auto got = host_read();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->second, good);
  EXPECT_FALSE(host_read()) << "the forged frame reached the TAP";
  auto r = fe_.tx_responses();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].id, 1);
  EXPECT_EQ(r[0].status, kNetifRspOkay);
  EXPECT_EQ(r[1].status, kNetifRspOkay);
  EXPECT_EQ(queue_->counters().tx_spoofed.load(), 1u);
  EXPECT_EQ(queue_->counters().tx_packets.load(), 1u);
  EXPECT_EQ(queue_->counters().tx_errors.load(), 0u);
  EXPECT_FALSE(queue_->disabled());
}

// The header bytes the queue parsed and checked are written from its copy and the rest from the
// guest's pages: a frame whose first slots are shorter than the copy (10 and 100 bytes, then
// the rest) reaches the TAP byte for byte.
TEST_F(NetbackQueueTest, TxFrameWhoseHeaderSpansSeveralShortSlotsIsWrittenWhole) {
  start();
  const auto frame = tcp_frame(3000);
  const std::size_t cut[] = {10, 110};
  std::vector<NetifTxRequest> s;
  for (std::size_t i = 0, off = 0; i < 3; ++i) {
    const std::size_t end = i < 2 ? cut[i] : frame.size();
    std::memcpy(fe_.page(16 + i).data(), frame.data() + off, end - off);
    NetifTxRequest q{};
    q.gref = fe_.grant(16 + i, true);
    q.id = static_cast<std::uint16_t>(i);
    q.size = static_cast<std::uint16_t>(i == 0 ? frame.size() : end - off);
    q.flags = i < 2 ? kNettxfMoreData : 0;
    s.push_back(q);
    off = end;
  }
  for (const auto& q : s) fe_.tx(q);
  fe_.tx_push();
  ASSERT_TRUE(queue_->poll_once());
  auto got = host_read();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->second, frame);
  EXPECT_EQ(queue_->counters().tx_bytes.load(), 3000u);
}

TEST_F(NetbackQueueTest, TxOfAFlowTheSteeringMovedIsWrittenOnTheOtherQueuesTap) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
  UniqueFd tap1(sv[0]), host1(sv[1]);
  // A and B: flows the guest receives on (what it sends of them here: a segment of A, B's ACK);
  // C: another flow to it.
  const auto a = flow_frame(2, 40001, 1, 5202, 1200), b_ack = flow_frame(2, 40000, 1, 5201, 66),
             c = flow_frame(1, 5300, 2, 40002, 300);
  const auto key_a = FlowSteering::flow_key(a), key_b = FlowSteering::flow_key(b_ack);
  ASSERT_TRUE(key_a && key_b);
  // Periods of an hour: the table is looked at only at the synthetic times below, never at the
  // queue's own (steady_clock) ones, so what the queue reports stays there to be checked.
  FlowSteeringConfig sc;
  sc.queues = 2;
  sc.period_us = sc.hold_us = 3'600'000'000ull;
  sc.idle_us = 2 * sc.period_us;
  sc.heavy_bytes = 10000;
  FlowSteering steer(sc);
  // Both busy on queue 0 in one period; when it ends, A (netback wrote it in the period, B it
  // did not) is moved.
  const auto t0 = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                                 std::chrono::steady_clock::now().time_since_epoch())
                                                 .count());
  steer.on_rx(*key_b, 0, 50000, t0);
  steer.on_rx(*key_a, 0, 50000, t0);
  ASSERT_EQ(steer.on_tx(*key_a, 0, 60, t0), 0u);
  ASSERT_EQ(steer.on_tx(*key_a, 0, 1, t0 + sc.period_us), 1u);

  NetbackConfig cfg;
  const int fds[2] = {tap_.get(), tap1.get()};
  cfg.steer = &steer;
  cfg.queue_index = 0;
  cfg.tap_fds = fds;
  start(cfg);
  fe_.tx(slots_for(a, 16, 0)[0]);
  fe_.tx(slots_for(b_ack, 17, 1)[0]);
  fe_.tx_push();
  ASSERT_TRUE(queue_->poll_once());
  auto on1 = host_read(host1.get()), on0 = host_read();
  ASSERT_TRUE(on1 && on0);
  EXPECT_EQ(on1->second, a) << "A went out on queue 1's TAP fd";
  EXPECT_EQ(on0->second, b_ack) << "B stays on this queue's";
  EXPECT_FALSE(host_read(host1.get()));
  EXPECT_FALSE(host_read());
  EXPECT_EQ(queue_->counters().tx_steered.load(), 1u);
  EXPECT_EQ(queue_->counters().tx_packets.load(), 2u);
  for (const auto& r : fe_.tx_responses()) EXPECT_EQ(r.status, kNetifRspOkay);

  // rx: what the queue delivers is reported to the table, with its queue and size — through
  // the queued path (fewer buffers than the largest packet needs), then straight into the pages.
  const auto key_c = FlowSteering::flow_key(c);
  ASSERT_TRUE(key_c);
  EXPECT_FALSE(steer.flow(*key_c));
  for (std::uint16_t i = 0; i < 8; ++i) fe_.post_rx(i, fe_.grant(100 + i, false));
  fe_.rx_push();
  host_write({}, c);
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().rx_packets.load(), 1u);
  EXPECT_EQ(queue_->counters().rx_queued.load(), 1u);
  for (std::uint16_t i = 8; i < 8 + NetbackQueue::kRxDirectSlots; ++i) fe_.post_rx(i, fe_.grant(100 + i, false));
  fe_.rx_push();
  host_write({}, c);
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(queue_->counters().rx_packets.load(), 2u);
  EXPECT_EQ(queue_->counters().rx_queued.load(), 1u) << "the second went straight in";
  auto fc = steer.flow(*key_c);
  ASSERT_TRUE(fc);
  EXPECT_EQ(fc->rx_q, 0);
  EXPECT_EQ(fc->bytes, 2 * c.size());
  EXPECT_EQ(fc->rx_bytes, 2 * c.size());
  EXPECT_EQ(steer.flows(), 3u);
  auto fa = steer.flow(*key_a);
  ASSERT_TRUE(fa);
  EXPECT_TRUE(fa->moved);
  EXPECT_EQ(fa->write_q, 1);
}

TEST_F(NetbackQueueTest, AQueueWhoseFdIsNotAtItsIndexIsRefused) {
  FlowSteering steer(FlowSteeringConfig{.queues = 2});
  NetbackConfig cfg;
  const int fds[2] = {tap_.get() + 100, tap_.get()};
  cfg.steer = &steer;
  cfg.queue_index = 0;
  cfg.tap_fds = fds;
  EXPECT_THROW(start(cfg), std::invalid_argument);
}

TEST_F(NetbackQueueTest, RunStopsOnRequestAndMovesTraffic) {
  start();
  std::thread t([this] { queue_->run(); });
  const auto frame = tcp_frame(1500);
  fe_.tx(slots_for(frame, 16, 0)[0]);
  fe_.tx_push();
  std::optional<std::pair<VnetHdr, std::vector<std::uint8_t>>> got;
  for (int i = 0; i < 500 && !got; ++i) {
    got = host_read();
    if (!got) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  queue_->stop();
  t.join();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->second, frame);
}

}  // namespace
}  // namespace xpv::netback

namespace xpv::netback {
namespace {

// A restarted backend (NetbackConfig::resume) finds rings a dead one served: requests consumed
// and unanswered, one of each ring's slots torn by a response written but never published.
TEST_F(NetbackQueueTest, AResumedQueueAnswersWhatTheDeadOneLeftWithoutUsingIt) {
  // tx: a 3-slot GSO packet (first, extra, fragment) and a 1-slot packet; rx: 3 buffers.
  const auto big = tcp_frame(5000);
  auto s = slots_for(big, 16, 1);
  s[0].flags |= kNettxfExtraInfo | kNettxfCsumBlank;
  fe_.tx(s[0]);
  NetifExtraInfo gso{};
  gso.type = kXenNetifExtraTypeGso;
  gso.u.gso.size = 1448;
  gso.u.gso.type = kXenNetifGsoTypeTcpv4;
  fe_.tx(netif_extra_to_tx(gso));
  fe_.tx(s[1]);
  fe_.tx(slots_for(tcp_frame(100), 20, 7)[0]);
  fe_.tx_push();
  for (std::uint16_t i = 0; i < 3; ++i) fe_.post_rx(i, fe_.grant(30 + i, false));
  fe_.rx_push();
  // The dead backend answered slot 0 of each ring into the slot, then died before rsp_prod.
  auto tx_page = fe_.tx_ring_page();
  NetifTxResponse t{1, kNetifRspOkay};
  std::memcpy(tx_page.data() + kRingEntriesOffset, &t, sizeof t);  // slot 0
  auto rx_page = fe_.page(2);
  NetifRxResponse rr{0, 0, 0, 100};
  std::memcpy(rx_page.data() + kRingEntriesOffset, &rr, sizeof rr);
  std::memset(fe_.page(30).data(), 0xAA, 16);

  NetbackConfig cfg;
  cfg.resume = true;
  ASSERT_NO_FATAL_FAILURE(start(cfg));
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_FALSE(host_read()) << "nothing the dead backend consumed is sent again";
  auto tr = fe_.tx_responses();
  ASSERT_EQ(tr.size(), 4u);
  EXPECT_EQ(tr[0].id, 1);
  EXPECT_EQ(tr[0].status, kNetifRspOkay);
  EXPECT_EQ(tr[1].status, kNetifRspNull);
  EXPECT_EQ(tr[2].id, 2);
  EXPECT_EQ(tr[3].id, 7);
  EXPECT_EQ(tr[3].status, kNetifRspOkay);
  auto rx = fe_.rx_responses();
  ASSERT_EQ(rx.size(), 3u);
  for (std::uint16_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rx[i].id, i);
    EXPECT_EQ(rx[i].status, kNetifRspError);
    EXPECT_EQ(rx[i].flags, 0);
  }
  EXPECT_EQ(fe_.page(30)[0], 0xAA) << "a returned buffer is not written";
  EXPECT_EQ(queue_->counters().resume_tx_dropped.load(), 2u);
  EXPECT_EQ(queue_->counters().resume_rx_returned.load(), 3u);
  EXPECT_EQ(queue_->counters().tx_packets.load(), 0u);

  // Then it is an ordinary queue: a new packet goes out, a host frame comes in.
  const auto next = tcp_frame(300);
  fe_.tx(slots_for(next, 40, 9)[0]);
  fe_.tx_push();
  fe_.post_rx(3, fe_.grant(50, false));
  fe_.rx_push();
  host_write({}, tcp_frame(200));
  ASSERT_TRUE(queue_->poll_once());
  auto got = host_read();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->second, next);
  auto rx2 = fe_.rx_responses();
  ASSERT_EQ(rx2.size(), 1u);
  EXPECT_EQ(rx2[0].id, 3);
  EXPECT_EQ(rx2[0].status, 200);
  EXPECT_FALSE(queue_->disabled());
}

// A dead queue took a GSO packet's buffers and wrote its first two responses into their slots —
// the data response (it repeats the request's id), then the extra-info response (no id: its type
// and flags are where the id was) — and died before rsp_prod. The resumed queue gives every
// buffer back with the frontend's own id: from the rx shadow the dead queue kept where the slot no
// longer has it. A queue with a shadow records each rx request it takes.
TEST_F(NetbackQueueTest, AResumedQueueGivesTornBuffersBackWithTheIdsItsShadowKept) {
  test::TempDir dir;
  const std::string path = dir.file("vif7.0-q0.rxids");
  const std::uint16_t ids[3] = {40, 41, 42};  // a frontend's ids, not the slots' indexes
  for (std::uint16_t i = 0; i < 3; ++i) fe_.post_rx(ids[i], fe_.grant(30 + i, false));
  fe_.rx_push();
  {
    auto dead = RxShadow::create(path, 256);  // what the dead queue kept as it took slots 0 and 1
    for (std::uint16_t i = 0; i < 2; ++i) dead.put(i, NetifRxRequest{ids[i], 0, 0});
  }
  auto rx_page = fe_.page(2);
  NetifRxResponse first{ids[0], 0, static_cast<std::uint16_t>(kNetrxfExtraInfo | kNetrxfMoreData), 4096};
  std::memcpy(rx_page.data() + kRingEntriesOffset, &first, sizeof first);
  NetifExtraInfo gso{};
  gso.type = kXenNetifExtraTypeGso;
  gso.u.gso.size = 1448;
  gso.u.gso.type = kXenNetifGsoTypeTcpv4;
  const NetifRxResponse extra = netif_extra_to_rx(gso);
  std::memcpy(rx_page.data() + kRingEntriesOffset + sizeof(NetifRxResponse), &extra, sizeof extra);
  ASSERT_NE(extra.id, ids[1]);

  auto shadow = RxShadow::open(path, 256);
  ASSERT_TRUE(shadow.reused());
  NetbackConfig cfg;
  cfg.resume = true;
  ASSERT_NO_FATAL_FAILURE(start(cfg, &shadow));
  ASSERT_TRUE(queue_->poll_once());
  auto rx = fe_.rx_responses();
  ASSERT_EQ(rx.size(), 3u);
  for (std::uint16_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rx[i].id, ids[i]) << "slot " << i;
    EXPECT_EQ(rx[i].status, kNetifRspError);
  }
  EXPECT_EQ(queue_->counters().resume_rx_returned.load(), 3u);

  // Then an ordinary queue that keeps its shadow: the buffer it takes for a host frame is there.
  fe_.post_rx(43, fe_.grant(50, false));
  fe_.rx_push();
  host_write({}, tcp_frame(200));
  ASSERT_TRUE(queue_->poll_once());
  auto rx2 = fe_.rx_responses();
  ASSERT_EQ(rx2.size(), 1u);
  EXPECT_EQ(rx2[0].id, 43);
  EXPECT_EQ(rx2[0].status, 200);
  ASSERT_TRUE(shadow.get(3).has_value());
  EXPECT_EQ(shadow.get(3)->id, 43);
  EXPECT_FALSE(shadow.get(4).has_value());
}

// A backend killed between publishing responses and notifying: the frontend, asleep with its
// rsp_event armed, would never look again (a push of later responses does not notify, the event
// index is already passed). The resumed queue notifies once.
TEST_F(NetbackQueueTest, AResumedQueueNotifiesResponsesItsPredecessorPublishedUnannounced) {
  for (std::uint16_t i = 0; i < 2; ++i) fe_.post_rx(i, fe_.grant(30 + i, false));
  fe_.rx_push();
  ASSERT_TRUE(fe_.rx_responses_and_rearm().empty());  // asleep: rsp_event = rsp_cons + 1
  {
    auto dead = NetifRxBackRing::attach(fe_.page(2));
    ASSERT_TRUE(dead);
    auto r = dead->pop_request();
    ASSERT_TRUE(r);
    NetifRxResponse rsp{};
    rsp.id = r->id;
    rsp.status = kNetifRspError;
    ASSERT_TRUE(dead->produce_response(rsp));
    ASSERT_TRUE(dead->push_responses());  // "notify", but it was killed first
  }
  NetbackConfig cfg;
  cfg.resume = true;
  ASSERT_NO_FATAL_FAILURE(start(cfg));
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(fe_.notifications(), 1u);
  auto rx = fe_.rx_responses_and_rearm();
  ASSERT_EQ(rx.size(), 2u);  // the dead backend's, and the buffer it left, given back
  EXPECT_EQ(rx[0].id, 0);
  EXPECT_EQ(rx[1].id, 1);
  EXPECT_EQ(rx[1].status, kNetifRspError);
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_EQ(fe_.notifications(), 0u) << "owed once, notified once";
  EXPECT_FALSE(queue_->disabled());
}

TEST_F(NetbackQueueTest, AResumedQueueWithNothingLeftIsAnOrdinaryQueue) {
  NetbackConfig cfg;
  cfg.resume = true;
  ASSERT_NO_FATAL_FAILURE(start(cfg));
  ASSERT_TRUE(queue_->poll_once());
  EXPECT_TRUE(fe_.tx_responses().empty());
  EXPECT_TRUE(fe_.rx_responses().empty());
  EXPECT_EQ(fe_.notifications(), 0u) << "no notification without new responses";
  EXPECT_EQ(queue_->counters().resume_tx_dropped.load(), 0u);
}

}  // namespace
}  // namespace xpv::netback
