// BlkifQueue against a fake frontend that plays the guest side in a memfd "guest": it grants
// pages with the real granter-side GrantTable, produces requests on the real FrontRing and
// kicks/waits on the eventfds of a Dom0Port. The disk is a real file; I/O is real io_uring.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>

#include "xpv/test/temp_dir.h"
#include "xpv/blkback/queue.h"
#include "xpv/blkback/shadow_ring.h"
#include "xpv/domain/memory.h"
#include "xpv/gnttab/granter.h"
#include "xpv/test/running.h"

namespace xpv::blkback {
namespace {

using namespace xpv::ring;
constexpr gnttab::DomId kGuest = 5;

// Guest memory layout: gfn 0 = grant table frame, gfn 1 = ring, gfn 16.. = data pages.
class FakeFrontend {
 public:
  FakeFrontend()
      : mem_(domain::DomainMemory::create("guest", {{0, 256 * kPageSize}})),
        table_({mem_.view().page(0).value()}) {
    auto ring_page = mem_.view().page(1).value();
    front_.emplace(BlkifFrontRing::init(ring_page).value());
    ring_ref = table_.grant_access(0, 1, false).value();
    to_dom0_ = domain::EventFd::create().value();
    from_dom0_ = domain::EventFd::create().value();
  }

  std::span<std::uint8_t> page(std::uint64_t gfn) { return mem_.view().page(gfn).value(); }
  gnttab::GrantRef grant(std::uint64_t gfn, bool readonly) { return table_.grant_access(0, gfn, readonly).value(); }
  gnttab::GrantTable& table() { return table_; }

  // The backend's view: its own mapping of the guest's memfd, as over the control socket.
  std::unique_ptr<gnttab::GrantMapper> make_mapper() {
    backend_mem_.emplace(domain::DomainMemory::attach(UniqueFd(::dup(mem_.fd())), mem_.layout()));
    return std::make_unique<gnttab::GrantMapper>(0, kGuest, std::vector{backend_mem_->view().page(0).value()},
                                                 backend_mem_->view());
  }
  std::unique_ptr<domain::EventChannel> make_channel() {
    return std::make_unique<domain::Dom0Port>(UniqueFd(::dup(to_dom0_.fd())), UniqueFd(::dup(from_dom0_.fd())));
  }

  void push(const BlkifRequest& r) {
    ASSERT_TRUE(front_->produce_request(r));
    if (front_->push_requests()) (void)to_dom0_.notify();
  }
  std::vector<BlkifResponse> responses() {
    std::vector<BlkifResponse> out;
    while (true) {
      auto r = front_->pop_response();
      if (!r) break;
      out.push_back(*r);
    }
    return out;
  }
  std::uint64_t notifications() { return from_dom0_.consume().value_or(0); }
  bool push_kick() { return to_dom0_.notify().has_value(); }
  BlkifFrontRing& ring() { return *front_; }

  gnttab::GrantRef ring_ref = 0;

 private:
  domain::DomainMemory mem_;
  std::optional<domain::DomainMemory> backend_mem_;
  gnttab::GrantTable table_;
  std::optional<BlkifFrontRing> front_;
  domain::EventFd to_dom0_, from_dom0_;
};

BlkifRequest rw(std::uint8_t op, std::uint64_t id, std::uint64_t sector) {
  BlkifRequest r{};
  r.operation = op;
  r.id = id;
  r.sector_number = sector;
  return r;
}

void add_seg(BlkifRequest& r, gnttab::GrantRef g, std::uint8_t first = 0, std::uint8_t last = 7) {
  r.seg[r.nr_segments++] = {g, first, last, {0, 0}};
}

class QueueTest : public ::testing::Test {
 protected:
  void SetUp() override { make_disk(false); }

  void make_disk(bool readonly, off_t size = 4 << 20, bool direct = true) {
    queue_.reset();
    mapper_.reset();
    path_ = dir_.file("disk.img");
    int fd = ::open(path_.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, size), 0);
    ::close(fd);
    disk_ = std::make_unique<Disk>(Disk::open(path_, readonly, direct));
  }

  void start(QueueConfig cfg = {}, ShadowRing* shadow = nullptr) {
    mapper_ = fe_.make_mapper();
    auto ring_map = mapper_->map(fe_.ring_ref, false);
    ASSERT_TRUE(ring_map);
    ring_handle_ = ring_map->handle();
    auto back = BlkifBackRing::attach(ring_map->writable());
    ASSERT_TRUE(back);
    queue_ = std::make_unique<BlkifQueue>("vbd5.51712", *disk_, *mapper_, std::move(*back), fe_.make_channel(), cfg,
                                          shadow);
  }

  // Runs the queue until `n` responses are on the ring (bounded: 2000 passes, 5 s of waiting).
  std::vector<BlkifResponse> serve(std::size_t n) {
    std::vector<BlkifResponse> got;
    for (int i = 0; i < 2000 && got.size() < n; ++i) {
      queue_->poll_once();
      for (auto& r : fe_.responses()) got.push_back(r);
      if (got.size() < n && queue_->in_flight() > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // I/O still in the kernel
      }
    }
    return got;
  }
  // A one-at-a-time guest against a running queue: pushes each request (kicking when the ring
  // says so) and waits, bounded at 2 s, for its one answer. Returns the answers and the kicks.
  struct OneByOne {
    std::vector<BlkifResponse> answers;
    int kicks = 0;
  };
  OneByOne one_at_a_time(int n, const std::function<BlkifRequest(int)>& make) {
    OneByOne out;
    for (int i = 0; i < n; ++i) {
      EXPECT_TRUE(fe_.ring().produce_request(make(i)));
      if (fe_.ring().push_requests()) {
        ++out.kicks;
        (void)fe_.push_kick();
      }
      std::vector<BlkifResponse> got;
      for (int j = 0; j < 40000 && got.empty(); ++j) {  // ≤ 2 s
        got = fe_.responses();
        if (got.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      EXPECT_EQ(got.size(), 1u) << "request " << i;
      if (got.size() != 1) break;
      out.answers.push_back(got[0]);
    }
    return out;
  }
  std::string file_bytes(off_t off, std::size_t n) {
    std::string s(n, '\0');
    UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    EXPECT_EQ(::pread(fd.get(), s.data(), n, off), static_cast<ssize_t>(n));
    return s;
  }

  test::TempDir dir_;
  std::string path_;
  FakeFrontend fe_;
  std::unique_ptr<Disk> disk_;
  std::unique_ptr<gnttab::GrantMapper> mapper_;
  gnttab::GrantHandle ring_handle_ = 0;
  std::unique_ptr<BlkifQueue> queue_;
};

TEST_F(QueueTest, WriteElevenSegmentsThenReadThemBack) {
  start();
  BlkifRequest w = rw(kBlkifOpWrite, 0x11, 8);
  for (int i = 0; i < 11; ++i) {
    std::memset(fe_.page(16 + i).data(), 'a' + i, kPageSize);
    add_seg(w, fe_.grant(16 + i, true));
  }
  fe_.push(w);
  auto rs = serve(1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].id, 0x11u);
  EXPECT_EQ(rs[0].operation, kBlkifOpWrite);
  EXPECT_EQ(rs[0].status, kBlkifRspOkay);
  EXPECT_EQ(file_bytes(8 * 512, 1), "a");
  EXPECT_EQ(file_bytes(8 * 512 + 10 * 4096 + 4095, 1), "k");

  BlkifRequest r = rw(kBlkifOpRead, 0x12, 8 + 8);  // from the second page on
  add_seg(r, fe_.grant(40, false));
  fe_.push(r);
  rs = serve(1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, kBlkifRspOkay);
  EXPECT_EQ(fe_.page(40)[0], 'b');
  EXPECT_EQ(fe_.page(40)[4095], 'b');
  EXPECT_EQ(mapper_->mapped(), 1u) << "only the ring stays mapped; every data grant was released";
}

TEST_F(QueueTest, ABufferedDiskIsWrittenInTheQueueThread) {
  // Without O_DIRECT, writes are copied into the page cache by the queue thread itself (io_uring
  // would hand each to a worker thread): the answer is on the ring after the one pass that took
  // the request, with nothing left in the kernel. Through io_uring it cannot be: a pass reaps
  // before it submits. Reads still go through io_uring.
  make_disk(false, 4 << 20, /*direct=*/false);
  ASSERT_FALSE(disk_->info().direct);
  start();
  BlkifRequest w = rw(kBlkifOpWrite, 0x21, 16);
  for (int i = 0; i < 11; ++i) {
    std::memset(fe_.page(16 + i).data(), 'A' + i, kPageSize);
    add_seg(w, fe_.grant(16 + i, true));
  }
  BlkifRequest w2 = rw(kBlkifOpWrite, 0x22, 0);
  std::memset(fe_.page(40).data(), 'z', kPageSize);
  add_seg(w2, fe_.grant(40, true), 1, 2);  // sectors 1..2 of the page → disk sectors 0..1
  fe_.push(w);
  fe_.push(w2);
  queue_->poll_once();
  EXPECT_EQ(queue_->in_flight(), 0u);
  auto rs = fe_.responses();
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].id, 0x21u);
  EXPECT_EQ(rs[0].status, kBlkifRspOkay);
  EXPECT_EQ(rs[1].id, 0x22u);
  EXPECT_EQ(rs[1].status, kBlkifRspOkay);
  EXPECT_EQ(file_bytes(16 * 512, 1), "A");
  EXPECT_EQ(file_bytes(16 * 512 + 10 * 4096 + 4095, 1), "K");
  EXPECT_EQ(file_bytes(0, 1024), std::string(1024, 'z'));
  EXPECT_EQ(file_bytes(1024, 1), std::string(1, '\0'));
  EXPECT_EQ(queue_->counters().writes.load(), 2u);

  BlkifRequest r = rw(kBlkifOpRead, 0x23, 16);
  add_seg(r, fe_.grant(60, false));
  fe_.push(r);
  auto rr = serve(1);
  ASSERT_EQ(rr.size(), 1u);
  EXPECT_EQ(rr[0].status, kBlkifRspOkay);
  EXPECT_EQ(fe_.page(60)[0], 'A');
  EXPECT_EQ(fe_.page(60)[4095], 'A');
}

TEST_F(QueueTest, SubPageSegmentsAddressSectorsInsideThePage) {
  start();
  std::memset(fe_.page(16).data(), 0, kPageSize);
  std::memset(fe_.page(16).data() + 2 * 512, 'z', 3 * 512);
  BlkifRequest w = rw(kBlkifOpWrite, 1, 100);
  add_seg(w, fe_.grant(16, true), 2, 4);
  fe_.push(w);
  auto rs = serve(1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, kBlkifRspOkay);
  EXPECT_EQ(file_bytes(100 * 512, 3 * 512), std::string(3 * 512, 'z'));
  EXPECT_EQ(file_bytes(103 * 512, 1), std::string(1, '\0'));
}

TEST_F(QueueTest, FlushAndDiscard) {
  start();
  BlkifRequest w = rw(kBlkifOpWrite, 1, 0);
  std::memset(fe_.page(16).data(), 'q', kPageSize);
  add_seg(w, fe_.grant(16, true));
  fe_.push(w);
  ASSERT_EQ(serve(1).at(0).status, kBlkifRspOkay);

  fe_.push(rw(kBlkifOpFlushDiskcache, 2, 0));
  BlkifRequestDiscard d{};
  d.operation = kBlkifOpDiscard;
  d.id = 3;
  d.sector_number = 0;
  d.nr_sectors = 8;
  fe_.push(blkif_pack(d));
  auto rs = serve(2);
  ASSERT_EQ(rs.size(), 2u);
  std::map<std::uint64_t, BlkifResponse> by_id;
  for (auto& r : rs) by_id[r.id] = r;
  EXPECT_EQ(by_id[2].status, kBlkifRspOkay);
  EXPECT_EQ(by_id[2].operation, kBlkifOpFlushDiskcache);
  EXPECT_EQ(by_id[3].status, kBlkifRspOkay);
  EXPECT_EQ(by_id[3].operation, kBlkifOpDiscard);
  EXPECT_EQ(file_bytes(0, 4096), std::string(4096, '\0'));
  EXPECT_EQ(queue_->counters().flushes.load(), 1u);
  EXPECT_EQ(queue_->counters().discards.load(), 1u);
}

// A flush that carries data segments (blkfront never sends one) is answered as an error and
// writes nothing: an OK after a flush that ignored the data would tell the guest it is on disk.
TEST_F(QueueTest, AFlushCarryingDataIsAnErrorNotAnUnwrittenOk) {
  start();
  std::memset(fe_.page(16).data(), 'f', kPageSize);
  BlkifRequest f = rw(kBlkifOpFlushDiskcache, 7, 0);
  add_seg(f, fe_.grant(16, true));
  fe_.push(f);
  auto rs = serve(1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].id, 7u);
  EXPECT_EQ(rs[0].status, kBlkifRspError);
  EXPECT_EQ(rs[0].operation, kBlkifOpFlushDiskcache);
  EXPECT_EQ(file_bytes(0, 4096), std::string(4096, '\0')) << "its data was not written";
  EXPECT_EQ(queue_->counters().flushes.load(), 0u);
  EXPECT_FALSE(queue_->disabled()) << "a bad request is answered, the queue goes on";
}

TEST_F(QueueTest, MalformedRequestsGetErrorResponsesAndTouchNothing) {
  start();
  auto g = fe_.grant(16, false);
  BlkifRequest bad_sect = rw(kBlkifOpRead, 1, 0);
  add_seg(bad_sect, g, 3, 8);  // last_sect past the page
  BlkifRequest reversed = rw(kBlkifOpRead, 2, 0);
  add_seg(reversed, g, 5, 4);
  BlkifRequest past_end = rw(kBlkifOpRead, 3, disk_->info().sectors - 4);
  add_seg(past_end, g);  // 8 sectors, 4 left
  BlkifRequest no_segs = rw(kBlkifOpRead, 4, 0);
  BlkifRequest too_many = rw(kBlkifOpRead, 5, 0);
  too_many.nr_segments = 12;
  BlkifRequest bad_grant = rw(kBlkifOpRead, 6, 0);
  add_seg(bad_grant, 4000);  // never granted
  BlkifRequest wrap = rw(kBlkifOpRead, 7, UINT64_MAX - 2);
  add_seg(wrap, g);
  for (auto* r : {&bad_sect, &reversed, &past_end, &no_segs, &too_many, &bad_grant, &wrap}) fe_.push(*r);
  auto rs = serve(7);
  ASSERT_EQ(rs.size(), 7u);
  for (auto& r : rs) {
    EXPECT_EQ(r.status, kBlkifRspError) << "id " << r.id;
    EXPECT_EQ(r.operation, kBlkifOpRead);
  }
  EXPECT_EQ(queue_->counters().errors.load(), 7u);
  EXPECT_FALSE(queue_->disabled()) << "bad requests are answered, not fatal";
  EXPECT_EQ(mapper_->mapped(), 1u);
  EXPECT_FALSE(fe_.table().is_mapped(g));
}

TEST_F(QueueTest, ReadOnlyGrantCannotBeReadInto) {
  start();
  BlkifRequest r = rw(kBlkifOpRead, 9, 0);
  add_seg(r, fe_.grant(16, /*readonly=*/true));  // a read writes into the guest page
  fe_.push(r);
  auto rs = serve(1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, kBlkifRspError);
}

TEST_F(QueueTest, UnknownOperationsAndBarriersAreUnsupported) {
  start();
  fe_.push(rw(42, 1, 0));
  fe_.push(rw(kBlkifOpWriteBarrier, 2, 0));
  auto rs = serve(2);
  ASSERT_EQ(rs.size(), 2u);
  for (auto& r : rs) EXPECT_EQ(r.status, kBlkifRspEopnotsupp);
  EXPECT_EQ(rs[0].operation, 42);
}

TEST_F(QueueTest, ReadOnlyDiskRefusesWritesAndDiscards) {
  make_disk(true);
  start();
  BlkifRequest w = rw(kBlkifOpWrite, 1, 0);
  add_seg(w, fe_.grant(16, true));
  fe_.push(w);
  BlkifRequestDiscard d{};
  d.operation = kBlkifOpDiscard;
  d.id = 2;
  d.nr_sectors = 8;
  fe_.push(blkif_pack(d));
  BlkifRequest r = rw(kBlkifOpRead, 3, 0);
  add_seg(r, fe_.grant(17, false));
  fe_.push(r);
  auto rs = serve(3);
  ASSERT_EQ(rs.size(), 3u);
  std::map<std::uint64_t, std::int16_t> st;
  for (auto& x : rs) st[x.id] = x.status;
  EXPECT_EQ(st[1], kBlkifRspError);
  EXPECT_EQ(st[2], kBlkifRspEopnotsupp);
  EXPECT_EQ(st[3], kBlkifRspOkay);
}

TEST_F(QueueTest, IndirectRequestsCarryTheirSegmentsInGrantedPages) {
  start();
  // 100 one-page segments in one indirect page: 400 KiB written in one request.
  BlkifRequestIndirect ind{};
  ind.operation = kBlkifOpIndirect;
  ind.indirect_op = kBlkifOpWrite;
  ind.nr_segments = 100;
  ind.id = 77;
  ind.sector_number = 64;
  auto* segs = reinterpret_cast<BlkifRequestSegment*>(fe_.page(15).data());
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t gfn = 100 + static_cast<std::uint64_t>(i);
    std::memset(fe_.page(gfn).data(), i, kPageSize);
    segs[i] = {fe_.grant(gfn, true), 0, 7, {0, 0}};
  }
  ind.indirect_grefs[0] = fe_.grant(15, true);
  fe_.push(blkif_pack(ind));
  auto rs = serve(1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, kBlkifRspOkay);
  EXPECT_EQ(rs[0].operation, kBlkifOpWrite) << "blkfront expects the indirect_op back";
  EXPECT_EQ(file_bytes(64 * 512 + 99 * 4096, 1), std::string(1, static_cast<char>(99)));
  EXPECT_EQ(mapper_->mapped(), 1u);
}

TEST_F(QueueTest, IndirectBeyondTheAdvertisedMaximumIsAnError) {
  QueueConfig cfg;
  cfg.max_indirect_segments = 32;
  start(cfg);
  BlkifRequestIndirect ind{};
  ind.operation = kBlkifOpIndirect;
  ind.indirect_op = kBlkifOpRead;
  ind.nr_segments = 33;
  ind.id = 1;
  fe_.push(blkif_pack(ind));
  auto rs = serve(1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, kBlkifRspError);
  EXPECT_EQ(rs[0].operation, kBlkifOpRead);
}

TEST_F(QueueTest, IndirectNotOfferedIsUnsupported) {
  QueueConfig cfg;
  cfg.max_indirect_segments = 0;
  start(cfg);
  BlkifRequestIndirect ind{};
  ind.operation = kBlkifOpIndirect;
  ind.indirect_op = kBlkifOpRead;
  ind.nr_segments = 1;
  ind.id = 1;
  fe_.push(blkif_pack(ind));
  auto rs = serve(1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, kBlkifRspEopnotsupp);
}

TEST_F(QueueTest, NoMoreIndirectSegmentsThanOneReadvTakes) {
  // One request is one readv/writev, and the kernel takes at most IOV_MAX (1024) iovecs: a queue
  // that offered 1025 answered such a well-formed request with an error (found writing
  // tests/fuzz/blkback).
  QueueConfig cfg;
  cfg.max_indirect_segments = 1025;
  EXPECT_THROW(start(cfg), std::invalid_argument);
  queue_.reset();
  mapper_.reset();  // before make_mapper() replaces the memory it maps
  // 1024 one-sector segments in two indirect pages: served.
  cfg.max_indirect_segments = 1024;
  start(cfg);
  std::memset(fe_.page(16).data(), 'v', kPageSize);
  const auto g = fe_.grant(16, true);
  BlkifRequestIndirect ind{};
  ind.operation = kBlkifOpIndirect;
  ind.indirect_op = kBlkifOpWrite;
  ind.nr_segments = 1024;
  ind.id = 1;
  for (std::uint64_t p = 0; p < 2; ++p) {
    auto* segs = reinterpret_cast<BlkifRequestSegment*>(fe_.page(12 + p).data());
    for (int i = 0; i < 512; ++i) segs[i] = {g, 0, 0, {0, 0}};
    ind.indirect_grefs[p] = fe_.grant(12 + p, true);
  }
  fe_.push(blkif_pack(ind));
  auto rs = serve(1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, kBlkifRspOkay);
  EXPECT_EQ(file_bytes(1023 * 512, 512), std::string(512, 'v'));
  EXPECT_EQ(mapper_->mapped(), 1u);
}

TEST_F(QueueTest, ABadProducerIndexDisablesTheQueue) {
  start();
  // The guest claims 1000 requests on a 32-slot ring.
  auto* req_prod = reinterpret_cast<std::uint32_t*>(fe_.page(1).data());
  *req_prod = 1000;
  EXPECT_FALSE(queue_->poll_once());
  EXPECT_TRUE(queue_->disabled());
  EXPECT_EQ(queue_->counters().requests.load(), 0u) << "nothing is read for a bad index";
  EXPECT_EQ(fe_.notifications(), 0u);
}

TEST_F(QueueTest, NotifiesOncePerBatchAndNeverWithoutResponses) {
  start();
  // A kick with nothing on the ring: no response, no notification (late-EOI frontends).
  queue_->poll_once();
  EXPECT_EQ(fe_.notifications(), 0u);
  // Eight reads in one push: one batch of responses, and the frontend had asked to be told.
  ASSERT_TRUE(fe_.ring().final_check_for_responses().has_value());
  for (std::uint64_t i = 0; i < 8; ++i) {
    BlkifRequest r = rw(kBlkifOpRead, i, i * 8);
    add_seg(r, fe_.grant(16 + i, false));
    ASSERT_TRUE(fe_.ring().produce_request(r));
  }
  fe_.ring().push_requests();
  auto rs = serve(8);
  ASSERT_EQ(rs.size(), 8u);
  const auto notes = fe_.notifications();
  EXPECT_GE(notes, 1u);
  EXPECT_LE(notes, queue_->counters().batches.load());
  EXPECT_EQ(queue_->counters().reads.load(), 8u);
}

TEST_F(QueueTest, RunLoopServesAGuestAndStops) {
  start();
  std::thread t([this] { queue_->run(); });
  for (std::uint64_t i = 0; i < 20; ++i) {
    BlkifRequest w = rw(kBlkifOpWrite, i, i * 8);
    std::memset(fe_.page(16 + i).data(), static_cast<int>('A' + i), kPageSize);
    add_seg(w, fe_.grant(16 + i, true));
    fe_.push(w);
  }
  std::vector<BlkifResponse> got;
  for (int i = 0; i < 500 && got.size() < 20; ++i) {
    auto more = fe_.ring().final_check_for_responses();
    ASSERT_TRUE(more.has_value());
    if (!*more) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (auto& r : fe_.responses()) got.push_back(r);
  }
  queue_->stop();
  t.join();
  ASSERT_EQ(got.size(), 20u);
  for (auto& r : got) EXPECT_EQ(r.status, kBlkifRspOkay);
  EXPECT_EQ(file_bytes(19 * 8 * 512, 1), "T");
  EXPECT_EQ(queue_->in_flight(), 0u);
}

TEST_F(QueueTest, ASpinningQueueAsksForFewKicks) {
  // A queue that polls (adaptive window up to 1 s here) grows its window while requests come
  // soon after its answers, and leaves req_event unarmed while it spins: most requests of a
  // one-at-a-time guest then need no notification at all. The requests are flushes of a queue
  // that offers none: answered at once, with no I/O in flight (the queue does not spin through
  // its own I/O: the next test).
  QueueConfig cfg;
  cfg.poll_max = std::chrono::seconds(1);
  cfg.flush = false;
  start(cfg);
  std::thread t([this] { queue_->run(); });
  constexpr int kRequests = 64;
  const auto run = one_at_a_time(kRequests, [](int i) {
    BlkifRequest f{};
    f.operation = kBlkifOpFlushDiskcache;
    f.id = static_cast<std::uint64_t>(i);
    return f;
  });
  queue_->stop();
  t.join();
  ASSERT_EQ(run.answers.size(), static_cast<std::size_t>(kRequests));
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(run.answers[i].status, kBlkifRspEopnotsupp) << i;
    EXPECT_EQ(run.answers[i].id, static_cast<std::uint64_t>(i));
  }
  EXPECT_LE(run.kicks, kRequests / 2) << "the window grows to cover the gaps between requests";
  EXPECT_EQ(queue_->counters().kick_mutes.load(), 0u) << "a correct frontend's port is never muted";
  EXPECT_GT(queue_->counters().poll_hits.load(), 0u);
}

TEST_F(QueueTest, AFrontendKickingWithNothingNewIsMutedAndStillServed) {
  // A guest sending on the port in a loop without posting anything (kick_throttle.h): after
  // kStreak such kicks in a row the queue leaves the port out of its sleep for a while, instead of
  // waking for each one for ever. A request it posts meanwhile is still answered (at the latest
  // when the mute ends), and its kick is not counted as one with nothing new.
  QueueConfig cfg;
  cfg.poll_max = std::chrono::nanoseconds{0};  // no spinning: each kick meets a sleeping queue
  cfg.flush = false;
  start(cfg);
  test::Running running(*queue_);
  const QueueCounters& c = queue_->counters();
  // Kicks one at a time, each once the queue has gone to sleep again (it counts a poll_miss
  // after it consumed the kicks before and looked at the ring; bounded: 500 kicks, 2 s each),
  // until the queue mutes the port.
  int kicks = 0;
  std::uint64_t slept = 0;
  for (; kicks < 500 && c.kick_mutes.load() == 0; ++kicks) {
    for (int j = 0; j < 40000 && c.poll_misses.load() == slept; ++j) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    ASSERT_GT(c.poll_misses.load(), slept) << "the queue did not go to sleep before kick " << kicks;
    slept = c.poll_misses.load();
    const std::uint64_t before = c.spurious_kicks.load();
    ASSERT_TRUE(fe_.push_kick());
    for (int j = 0; j < 40000 && c.spurious_kicks.load() == before; ++j) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    ASSERT_EQ(c.spurious_kicks.load(), before + 1) << "kick " << kicks << " was not looked at";
  }
  EXPECT_EQ(kicks, static_cast<int>(KickThrottle::kStreak) + 1);
  EXPECT_EQ(c.kick_mutes.load(), 1u);
  // While muted: a real request, with its kick, is answered all the same (bounded: 2 s).
  const auto run = one_at_a_time(1, [](int) {
    BlkifRequest f{};
    f.operation = kBlkifOpFlushDiskcache;
    f.id = 77;
    return f;
  });
  ASSERT_EQ(run.answers.size(), 1u);
  EXPECT_EQ(run.answers[0].id, 77u);
  EXPECT_EQ(run.answers[0].status, kBlkifRspEopnotsupp);
  // Its kick was news, unless this thread lost its CPU between posting and kicking just as the
  // mute ended (the queue then took the flush first): at most one more.
  EXPECT_LE(c.spurious_kicks.load(), static_cast<std::uint64_t>(kicks) + 1);
}

TEST_F(QueueTest, AQueueDoesNotSpinWhileItsOwnIoIsInFlight) {
  // With polling on, the queue spins for the next request only while none of its I/O is in the
  // kernel; for a completion it sleeps (an I/O the kernel finished within the submit is reaped
  // at once). So every spin that found work found a request (or the stop), never a completion:
  // poll hits ≤ requests + 1, whatever the timing. (Spinning through the I/O gave two per write.)
  QueueConfig cfg;
  cfg.poll_max = std::chrono::seconds(1);
  start(cfg);
  std::thread t([this] { queue_->run(); });
  constexpr int kRequests = 64;
  const auto run = one_at_a_time(kRequests, [this](int i) {
    BlkifRequest w = rw(kBlkifOpWrite, static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i) * 8);
    std::memset(fe_.page(16 + i).data(), 'a' + i % 26, kPageSize);
    add_seg(w, fe_.grant(16 + static_cast<std::uint64_t>(i), true));
    return w;
  });
  queue_->stop();
  t.join();
  ASSERT_EQ(run.answers.size(), static_cast<std::size_t>(kRequests));
  for (const auto& r : run.answers) EXPECT_EQ(r.status, kBlkifRspOkay);
  EXPECT_LE(queue_->counters().poll_hits.load(), static_cast<std::uint64_t>(kRequests) + 1);
  EXPECT_EQ(file_bytes(63 * 8 * 512, 1), std::string(1, 'a' + 63 % 26));
}

TEST_F(QueueTest, ItCountsTheTimeWithNothingOutstandingBeforeEachRequest) {
  // The first request after the start is not a gap. One pushed 2 ms after everything was
  // answered is a gap of at least that (counted in the average, or as a long one if this thread
  // was held up past 10 ms); one pushed 30 ms after is a long gap, counted apart and left out of
  // the average; of two pushed together only the first is a gap (the second is taken while the
  // first is outstanding). Every response is counted as answered. Flushes of a queue that offers
  // none: answered in the pass that takes them.
  QueueConfig cfg;
  cfg.flush = false;
  start(cfg);
  const QueueCounters& c = queue_->counters();
  auto flush = [](std::uint64_t id) {
    BlkifRequest f{};
    f.operation = kBlkifOpFlushDiskcache;
    f.id = id;
    return f;
  };
  fe_.push(flush(1));
  queue_->poll_once();
  ASSERT_EQ(fe_.responses().size(), 1u);
  EXPECT_EQ(c.idle_gaps.load() + c.long_idle_gaps.load(), 0u);

  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  fe_.push(flush(2));
  queue_->poll_once();
  ASSERT_EQ(fe_.responses().size(), 1u);
  ASSERT_EQ(c.idle_gaps.load() + c.long_idle_gaps.load(), 1u);
  if (c.idle_gaps.load() == 1) {
    EXPECT_GE(c.idle_gap_us.load(), 2000u);
    EXPECT_LT(c.idle_gap_us.load(), kLongIdleGapUs);
  }
  const std::uint64_t short_gaps = c.idle_gaps.load(), short_us = c.idle_gap_us.load();

  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  fe_.push(flush(3));
  queue_->poll_once();
  ASSERT_EQ(fe_.responses().size(), 1u);
  EXPECT_EQ(c.long_idle_gaps.load(), 2u - short_gaps);
  EXPECT_EQ(c.idle_gaps.load(), short_gaps) << "a long gap stays out of the average";
  EXPECT_EQ(c.idle_gap_us.load(), short_us);

  fe_.push(flush(4));
  fe_.push(flush(5));
  queue_->poll_once();
  ASSERT_EQ(fe_.responses().size(), 2u);
  EXPECT_EQ(c.idle_gaps.load() + c.long_idle_gaps.load(), 3u);
  EXPECT_EQ(c.answered.load(), 5u);
}

TEST_F(QueueTest, ResponsesGoOutInRequestOrder) {
  start();
  // Request 1 is answered at once (bad grant) while request 0 is still in the kernel: its
  // response is held until request 0's is out, so the ring's responses follow its requests.
  std::memset(fe_.page(16).data(), 'x', kPageSize);
  BlkifRequest w = rw(kBlkifOpWrite, 100, 0);
  add_seg(w, fe_.grant(16, true));
  BlkifRequest bad = rw(kBlkifOpRead, 101, 0);
  add_seg(bad, 4000);
  BlkifRequest w2 = rw(kBlkifOpWrite, 102, 8);
  add_seg(w2, fe_.grant(17, true));
  ASSERT_TRUE(fe_.ring().produce_request(w));
  ASSERT_TRUE(fe_.ring().produce_request(bad));
  ASSERT_TRUE(fe_.ring().produce_request(w2));
  fe_.ring().push_requests();
  auto rs = serve(3);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0].id, 100u);
  EXPECT_EQ(rs[0].status, kBlkifRspOkay);
  EXPECT_EQ(rs[1].id, 101u);
  EXPECT_EQ(rs[1].status, kBlkifRspError);
  EXPECT_EQ(rs[2].id, 102u);
  EXPECT_GE(queue_->counters().held.load(), 1u) << "the bad request's answer waited for request 0";
  EXPECT_EQ(queue_->unanswered(), 0u);
}

// A backend that dies with requests consumed but unanswered: a new queue attached at the shared
// rsp_prod redoes them, taking from the shadow the one whose slot already holds an unpublished
// response (the torn state a kill between "write response" and "publish rsp_prod" leaves).
TEST_F(QueueTest, ARestartedQueueRedoesWhatTheDeadOneLeftUnanswered) {
  auto shadow = std::make_unique<ShadowRing>(ShadowRing::create(dir_.file("q0.shadow"), 32));
  start({}, shadow.get());
  for (std::uint64_t i = 0; i < 4; ++i) {
    std::memset(fe_.page(16 + i).data(), static_cast<int>('p' + i), kPageSize);
    BlkifRequest w = rw(kBlkifOpWrite, 200 + i, i * 8);
    add_seg(w, fe_.grant(16 + i, true));
    ASSERT_TRUE(fe_.ring().produce_request(w));
  }
  fe_.ring().push_requests();
  // The "dead" backend consumed all four (they are in the shadow) and answered none: drop it
  // without letting it respond (the destructor waits for the kernel and releases the grants).
  queue_->poll_once();
  EXPECT_EQ(queue_->unanswered(), 4u);
  queue_.reset();
  EXPECT_EQ(mapper_->mapped(), 1u);
  // Its response for index 0 was written into slot 0 but rsp_prod was never published.
  BlkifResponse torn{};
  torn.id = 200;
  torn.operation = kBlkifOpWrite;
  std::memcpy(fe_.page(1).data() + 64, &torn, sizeof torn);
  {
    UniqueFd fd(::open(path_.c_str(), O_WRONLY | O_CLOEXEC));
    for (std::uint64_t i = 0; i < 4; ++i) {
      ASSERT_EQ(::pwrite(fd.get(), "\0", 1, static_cast<off_t>(i * 8 * 512)), 1);  // undo the writes
    }
  }
  auto again = std::make_unique<ShadowRing>(ShadowRing::open(dir_.file("q0.shadow"), 32));
  EXPECT_TRUE(again->reused());
  mapper_.reset();
  start({}, again.get());
  auto rs = serve(4);
  ASSERT_EQ(rs.size(), 4u);
  for (std::uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(rs[i].id, 200 + i);
    EXPECT_EQ(rs[i].status, kBlkifRspOkay);
    EXPECT_EQ(file_bytes(static_cast<off_t>(i * 8 * 512), 1), std::string(1, static_cast<char>('p' + i)));
  }
  EXPECT_EQ(queue_->counters().redone_from_shadow.load(), 4u);
  queue_.reset();
}

// A shadow kept over rings that are gone (a frontend that started over while no backend ran, and
// a restart that trusted xenstore's Connected) can hold a record for an index the new ring
// reaches. A response covers only a slot's first 16 bytes, so beyond them a torn slot still
// equals its shadow copy; one that differs there is another ring's request, and the ring's own
// is done.
TEST_F(QueueTest, AShadowRecordOfAnotherRingIsNotRedone) {
  auto shadow = std::make_unique<ShadowRing>(ShadowRing::create(dir_.file("q0.shadow"), 32));
  std::memset(fe_.page(17).data(), 's', kPageSize);
  BlkifRequest stale = rw(kBlkifOpWrite, 900, 64);
  add_seg(stale, fe_.grant(17, true));
  shadow->put(0, stale);
  start({}, shadow.get());
  std::memset(fe_.page(16).data(), 'q', kPageSize);
  BlkifRequest w = rw(kBlkifOpWrite, 200, 0);
  add_seg(w, fe_.grant(16, true));
  fe_.push(w);
  auto rs = serve(1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].id, 200u);
  EXPECT_EQ(rs[0].status, kBlkifRspOkay);
  EXPECT_EQ(file_bytes(0, 1), "q");
  EXPECT_EQ(file_bytes(64 * 512, 1), std::string(1, '\0')) << "the other ring's write was done";
  EXPECT_EQ(queue_->counters().redone_from_shadow.load(), 0u);
  EXPECT_EQ(queue_->counters().shadow_mismatches.load(), 1u);
  // The record is the ring's now: a restart at this index would redo the ring's request.
  const auto kept = shadow->get(0);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->id, 200u);
  queue_.reset();
}

// The same with a record that differs only where a response would land: another ring's write of
// the same sector from the same grant, under another id, at the index where this ring reads. Its
// slot is intact (no response in it), so the copy is not this request's.
TEST_F(QueueTest, AShadowRecordThatDiffersOnlyInIdAndOperationIsNotRedone) {
  auto shadow = std::make_unique<ShadowRing>(ShadowRing::create(dir_.file("q0.shadow"), 32));
  std::memset(fe_.page(16).data(), 'w', kPageSize);
  const gnttab::GrantRef g = fe_.grant(16, false);
  BlkifRequest stale = rw(kBlkifOpWrite, 900, 0);
  add_seg(stale, g);
  shadow->put(0, stale);
  start({}, shadow.get());
  BlkifRequest r = rw(kBlkifOpRead, 200, 0);
  add_seg(r, g);
  fe_.push(r);
  auto rs = serve(1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].id, 200u);
  EXPECT_EQ(rs[0].operation, kBlkifOpRead);
  EXPECT_EQ(rs[0].status, kBlkifRspOkay);
  EXPECT_EQ(file_bytes(0, 1), std::string(1, '\0')) << "the other ring's write was done";
  EXPECT_EQ(queue_->counters().redone_from_shadow.load(), 0u);
  EXPECT_EQ(queue_->counters().shadow_mismatches.load(), 1u);
  queue_.reset();
}

// A backend killed between publishing a response and notifying: the frontend sleeps with its
// rsp_event already passed, and the answer to the request the dead one left would not notify
// either. The restarted queue notifies once.
TEST_F(QueueTest, ARestartedQueueNotifiesAResponseItsPredecessorPublishedUnannounced) {
  for (std::uint64_t i = 0; i < 2; ++i) {
    BlkifRequest r = rw(kBlkifOpRead, 300 + i, i * 8);
    add_seg(r, fe_.grant(16 + i, false));
    ASSERT_TRUE(fe_.ring().produce_request(r));
  }
  fe_.ring().push_requests();
  auto idle = fe_.ring().final_check_for_responses();  // asleep: rsp_event = rsp_cons + 1
  ASSERT_TRUE(idle);
  ASSERT_FALSE(*idle);
  {
    auto dead = BlkifBackRing::attach(fe_.page(1));
    ASSERT_TRUE(dead);
    auto r = dead->pop_request();
    ASSERT_TRUE(r);
    ASSERT_TRUE(dead->produce_response(BlkifResponse{r->id, kBlkifOpRead, 0, kBlkifRspOkay, {}}));
    ASSERT_TRUE(dead->push_responses());  // "notify", but it was killed first
  }
  start();
  auto rs = serve(2);  // the dead one's answer, and the request it left, redone
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].id, 300u);
  EXPECT_EQ(rs[1].id, 301u);
  EXPECT_EQ(rs[1].status, kBlkifRspOkay);
  EXPECT_EQ(fe_.notifications(), 1u);
  queue_->poll_once();
  EXPECT_EQ(fe_.notifications(), 0u) << "owed once, notified once";
}

TEST(ShadowRing, RecordsByIndexAndRefusesStaleOrForeignFiles) {
  test::TempDir dir;
  const auto path = dir.file("s");
  BlkifRequest r{};
  r.id = 77;
  {
    auto s = ShadowRing::create(path, 32);
    EXPECT_FALSE(s.get(0)) << "a fresh shadow holds nothing, not even index 0";
    s.put(33, r);
    EXPECT_EQ(s.get(33).value().id, 77u);
    EXPECT_FALSE(s.get(1)) << "same record, other index";
    EXPECT_FALSE(s.get(33 + 32));
  }
  {
    auto s = ShadowRing::open(path, 32);
    EXPECT_TRUE(s.reused());
    EXPECT_EQ(s.get(33).value().id, 77u);
  }
  {
    auto s = ShadowRing::open(path, 64);  // another geometry: started afresh
    EXPECT_FALSE(s.reused());
    EXPECT_FALSE(s.get(33));
    s.remove();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_THROW(ShadowRing::create(path, 24), std::invalid_argument);
}

}  // namespace
}  // namespace xpv::blkback
