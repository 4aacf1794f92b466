// The whole PV block path in one test process, with every real component: a process Domain
// (memfd memory, grant table, event channels, control socket), xpv's Blkfront in it, and the
// backend side exactly as xpv-blkback builds it — ForeignDomain over the control socket, a
// GrantMapper, BlkifQueue on io_uring over a real image file — then FUSE + loop + ext4 on top.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include "xpv/blkback/queue.h"
#include "xpv/domain/domain.h"
#include "xpv/domain/foreign_domain.h"
#include "xpv/frontends/blkfront.h"
#include "xpv/frontends/fuse_disk.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/test/loop_device.h"
#include "xpv/test/run_on.h"

namespace xpv {
namespace {

namespace asio = boost::asio;
using frontends::Blkfront;

class BlkPath : public ::testing::Test {
 protected:
  template <class F>
  auto on_io(F f) -> decltype(f()) {
    return xpv::test::run_on(io_, std::move(f));
  }
  void SetUp() override {
    char tmpl[] = "/tmp/xpv-blkpath-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    image_ = dir_ + "/disk.img";
    {
      std::ofstream f(image_);
    }
    std::filesystem::resize_file(image_, 64 << 20);
  }
  void TearDown() override {
    stop_backend();
    front_.reset();
    if (events_) events_->stop();
    if (events_thread_.joinable()) events_thread_.join();
    if (domain_) on_io([this] { domain_.reset(); });
    work_.reset();
    io_.stop();
    if (io_thread_.joinable()) io_thread_.join();
    std::filesystem::remove_all(dir_);
  }

  // serve = false: no BlkifQueue; the test plays the backend through hostile_ring_/hostile_port_.
  void start(frontends::BlkfrontConfig fcfg = {}, blkback::QueueConfig bcfg = {}, bool serve = true) {
    domain::DomainConfig cfg;
    cfg.domid = 3;
    cfg.name = "pv-disk-test";
    cfg.memory_bytes = 96 << 20;
    cfg.run_dir = dir_ + "/run";
    // Guest side: the domain's event channels upcall into GuestEvents, like a guest kernel.
    shared_info_holder_ = std::make_unique<ForwardingSink>();
    domain_ = std::make_unique<domain::Domain>(io_, cfg, *shared_info_holder_);
    events_ = std::make_unique<frontends::GuestEvents>(domain_->pages(domain::Domain::kSharedInfoGfn, 1));
    shared_info_holder_->target = events_.get();
    if (direct_upcalls_) events_->enable_direct_upcalls(*domain_);  // as xpv-front does
    io_thread_ = std::thread([this] { io_.run(); });
    events_thread_ = std::thread([this] { events_->run(); });
    front_ = std::make_unique<Blkfront>(*domain_, *events_, fcfg);

    // Backend side, from the refs and port the frontend would publish in xenstore.
    disk_ = std::make_unique<blkback::Disk>(blkback::Disk::open(image_, false));
    foreign_ = std::make_unique<domain::ForeignDomain>(domain::ForeignDomain::connect(3, "blkback", cfg.run_dir));
    // One BlkifQueue (and data-plane thread) per ring, as xpv-blkback serves queue-<i>/.
    for (std::uint32_t q = 0; q < front_->queues(); ++q) {
      const auto& refs = front_->ring_refs(q);
      ASSERT_EQ(refs.size(), 1u) << "single-page rings in this test";
      // One GrantMapper per data-plane thread (mapper.h: a mapper has no lock), as
      // xpv-blkback has one per queue.
      mappers_.push_back(foreign_->make_mapper());
      auto ring_map = mappers_.back()->map(refs.at(0), false);
      ASSERT_TRUE(ring_map);
      auto back = ring::BlkifBackRing::attach(ring_map->writable());
      ASSERT_TRUE(back);
      if (!serve) {
        hostile_map_.emplace(std::move(*ring_map));
        hostile_ring_.emplace(std::move(*back));
        hostile_port_ = foreign_->bind(front_->event_channel(q));
        continue;
      }
      queues_.push_back(std::make_unique<blkback::BlkifQueue>(
          "vbd3.51712." + std::to_string(q), *disk_, *mappers_.back(), std::move(*back),
          foreign_->bind(front_->event_channel(q)), bcfg));
      // The queue itself, not queues_[q]: the next push_back may move the vector's storage
      // while this thread is still reading its element (a segfault in run() with `this` garbage).
      queue_threads_.emplace_back([queue = queues_.back().get()] { queue->run(); });
    }
    front_->connect({disk_->info().sectors, false, true, disk_->info().discard});
  }
  // Two queues with completion threads and 32 indirect segments: what FUSE's asynchronous
  // path runs on.
  void start_async_two_queues() {
    frontends::BlkfrontConfig f;
    f.completion_threads = true;
    f.queues = 2;
    f.indirect_segments = 32;
    blkback::QueueConfig b;
    b.max_indirect_segments = 32;
    start(f, b);
  }
  bool direct_upcalls_ = false;  // start(): the backend raises the domain's upcall itself
  void stop_backend() {
    hostile_port_.reset();
    hostile_ring_.reset();
    hostile_map_.reset();
    for (auto& q : queues_) q->stop();
    for (auto& t : queue_threads_) t.join();
    queue_threads_.clear();
    queues_.clear();
    mappers_.clear();
    foreign_.reset();
  }
  blkback::BlkifQueue& queue(std::size_t q = 0) { return *queues_.at(q); }
  // ext4 on a loop device over the PV disk's FUSE file (after start()), written, unmounted,
  // and checked straight from the image.
  // uring: the FUSE file on FUSE over io_uring (the caller holds FuseUringEnable); returns the
  // requests the rings carried.
  std::uint64_t ext4_over_fuse(bool uring = false) {
    std::uint64_t ring_requests = 0;
    ext4_over_fuse_into(uring, ring_requests);
    return ring_requests;
  }
  void ext4_over_fuse_into(bool uring, std::uint64_t& ring_requests) {
    const std::string mnt = dir_ + "/fuse", fsdir = dir_ + "/fs";
    std::filesystem::create_directories(mnt);
    std::filesystem::create_directories(fsdir);
    frontends::FuseDiskOptions o;
    o.uring = uring;
    frontends::FuseDisk fuse(mnt, "xvda", *front_, o);
    test::LoopDevice loop(fuse.file_path());
    ASSERT_FALSE(loop.empty()) << "no free loop device";
    test::UnmountAtExit unmount{fsdir};
    ASSERT_EQ(std::system(("mkfs.ext4 -q -F " + loop.path() + " >/dev/null 2>&1").c_str()), 0);
    ASSERT_EQ(std::system(("mount " + loop.path() + " " + fsdir).c_str()), 0);
    ASSERT_EQ(std::system(("dd if=/dev/urandom of=" + fsdir + "/f bs=64k count=64 conv=fsync status=none").c_str()), 0);
    ASSERT_EQ(std::system(("sha256sum " + fsdir + "/f > " + dir_ + "/sum").c_str()), 0);
    ASSERT_EQ(std::system(("umount " + fsdir).c_str()), 0);
    ASSERT_EQ(loop.detach(), 0);
    // The same image, now straight from the host: the file system and the data are there.
    ASSERT_EQ(std::system(("mount -o ro,loop " + image_ + " " + fsdir).c_str()), 0);
    EXPECT_EQ(std::system(("sha256sum -c --quiet " + dir_ + "/sum").c_str()), 0);
    std::uint64_t flushes = 0;
    for (auto& q : queues_) flushes += q->counters().flushes.load();
    EXPECT_GE(flushes, 1u);
    ring_requests = fuse.uring_requests();
  }

  std::string image_bytes(off_t off, std::size_t n) {
    std::string s(n, '\0');
    int fd = ::open(image_.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_EQ(::pread(fd, s.data(), n, off), static_cast<ssize_t>(n));
    ::close(fd);
    return s;
  }

  struct ForwardingSink : domain::UpcallSink {
    void upcall(unsigned v) noexcept override {
      if (target) target->upcall(v);
    }
    frontends::GuestEvents* target = nullptr;
  };

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::string dir_, image_;
  std::unique_ptr<ForwardingSink> shared_info_holder_;
  std::unique_ptr<domain::Domain> domain_;
  std::unique_ptr<frontends::GuestEvents> events_;
  std::unique_ptr<Blkfront> front_;
  std::unique_ptr<blkback::Disk> disk_;
  std::unique_ptr<domain::ForeignDomain> foreign_;
  std::vector<std::unique_ptr<gnttab::GrantMapper>> mappers_;  // one per queue
  std::vector<std::unique_ptr<blkback::BlkifQueue>> queues_;
  std::vector<std::thread> queue_threads_;
  std::thread io_thread_, events_thread_;
  // start(..., serve = false): the ring and event channel of queue 0, for a test-made backend.
  std::optional<gnttab::Mapping> hostile_map_;
  std::optional<ring::BlkifBackRing> hostile_ring_;
  std::unique_ptr<domain::Dom0Port> hostile_port_;
};

TEST_F(BlkPath, WritesLandInTheImageAndReadBack) {
  start();
  std::vector<std::uint8_t> data(1 << 20);
  std::mt19937 rng(7);
  for (auto& b : data) b = static_cast<std::uint8_t>(rng());
  ASSERT_EQ(front_->write(4096, data), static_cast<long>(data.size()));
  EXPECT_EQ(image_bytes(4096, 16), std::string(reinterpret_cast<char*>(data.data()), 16));
  std::vector<std::uint8_t> back(data.size());
  ASSERT_EQ(front_->read(4096, back), static_cast<long>(back.size()));
  EXPECT_EQ(back, data);
  EXPECT_GE(front_->stats().requests, (1u << 20) / (11 * 4096));
  EXPECT_FALSE(front_->broken());
}

// A process domain that takes direct upcalls (GuestEvents::enable_direct_upcalls, what xpv-front
// does): every notification of the backend's sets the pending bit in the domain's shared_info and
// wakes the dispatcher itself. None goes through the domain's control thread (which would make
// EventChannels call GuestEvents::upcall), and nothing is lost: the frontend never spins
// (poll_max 0), so each answer is found through a notification.
TEST_F(BlkPath, DirectUpcallsWakeTheDispatcherWithoutTheControlThread) {
  direct_upcalls_ = true;
  frontends::BlkfrontConfig f;
  f.poll_max = std::chrono::nanoseconds{0};
  f.completion_threads = true;
  start(f);
  ASSERT_TRUE(foreign_->direct()) << "the backend's side did not get the domain's direct upcall table";
  std::vector<std::uint8_t> data(256 << 10);
  std::mt19937 rng(11);
  for (auto& b : data) b = static_cast<std::uint8_t>(rng());
  for (int i = 0; i < 16; ++i) {
    ASSERT_EQ(front_->write(static_cast<std::uint64_t>(i) * data.size(), data), static_cast<long>(data.size()));
  }
  std::vector<std::uint8_t> back(data.size());
  for (int i = 0; i < 16; ++i) {
    ASSERT_EQ(front_->read(static_cast<std::uint64_t>(i) * data.size(), back), static_cast<long>(back.size()));
    ASSERT_EQ(back, data) << "chunk " << i;
  }
  EXPECT_GT(foreign_->direct()->delivered(), 0u);
  EXPECT_GT(foreign_->direct()->interrupts(), 0u);
  EXPECT_EQ(foreign_->direct()->declined(), 0u);
  EXPECT_EQ(events_->upcalls(), 0u) << "a notification went through the domain's control thread";
  EXPECT_FALSE(front_->broken());
}

TEST_F(BlkPath, DirectUpcallsNeedTheDomainWhoseSharedInfoTheDispatcherReads) {
  start();
  domain::DomainConfig cfg;
  cfg.domid = 4;
  cfg.name = "other";
  cfg.memory_bytes = 16 << 20;
  cfg.run_dir = dir_ + "/run-other";
  ForwardingSink sink;
  std::unique_ptr<domain::Domain> other;
  on_io([&] { other = std::make_unique<domain::Domain>(io_, cfg, sink); });
  EXPECT_THROW(events_->enable_direct_upcalls(*other), std::invalid_argument);
  on_io([&] { other.reset(); });
}

TEST_F(BlkPath, UnalignedBytesAreReadModifyWritten) {
  start();
  const char msg[] = "not sector aligned";
  ASSERT_EQ(front_->write(1000, std::span(reinterpret_cast<const std::uint8_t*>(msg), sizeof msg)),
            static_cast<long>(sizeof msg));
  EXPECT_EQ(image_bytes(1000, sizeof msg), std::string(msg, sizeof msg));
  EXPECT_EQ(image_bytes(999, 1), std::string(1, '\0'));
  std::uint8_t b[5];
  ASSERT_EQ(front_->read(1004, b), 5);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(b), 5), "secto");
}

TEST_F(BlkPath, IndirectRequestsCarryLargeIo) {
  frontends::BlkfrontConfig f;
  f.indirect_segments = 64;
  blkback::QueueConfig b;
  b.max_indirect_segments = 64;
  start(f, b);
  std::vector<std::uint8_t> data(256 * 1024, 0x5a);
  const auto before = front_->stats().requests;
  ASSERT_EQ(front_->write(0, data), static_cast<long>(data.size()));
  EXPECT_EQ(front_->stats().requests - before, 1u) << "64 segments x 4 KiB in one request";
  EXPECT_EQ(image_bytes(256 * 1024 - 1, 1), "Z");
}

TEST_F(BlkPath, FlushAndDiscard) {
  start();
  std::vector<std::uint8_t> ones(64 * 1024, 1);
  ASSERT_EQ(front_->write(0, ones), static_cast<long>(ones.size()));
  EXPECT_EQ(front_->flush(), 0);
  EXPECT_EQ(front_->discard(100, 20000), 0);  // unaligned ends: zeroed by writes
  EXPECT_EQ(image_bytes(99, 1), std::string(1, '\1'));
  EXPECT_EQ(image_bytes(100, 20000), std::string(20000, '\0'));
  EXPECT_EQ(image_bytes(20100, 1), std::string(1, '\1'));
  EXPECT_EQ(queue().counters().flushes.load(), 1u);
  EXPECT_EQ(queue().counters().discards.load(), 1u);
}

TEST_F(BlkPath, ConcurrentCallersShareTheRing) {
  start();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([this, t] {
      std::vector<std::uint8_t> buf(32 * 1024, static_cast<std::uint8_t>('a' + t));
      for (int i = 0; i < 32; ++i) {
        const std::uint64_t off = (std::uint64_t(t) * 32 + i) * buf.size();
        ASSERT_EQ(front_->write(off, buf), static_cast<long>(buf.size()));
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(image_bytes((t * 32 + 31) * 32 * 1024 + 5, 1), std::string(1, static_cast<char>('a' + t)));
  }
}

TEST_F(BlkPath, TwoQueuesCarryConcurrentWriters) {
  frontends::BlkfrontConfig f;
  f.queues = 2;
  start(f);
  ASSERT_EQ(front_->queues(), 2u);
  EXPECT_NE(front_->event_channel(0), front_->event_channel(1));
  EXPECT_NE(front_->ring_refs(0).at(0), front_->ring_refs(1).at(0));
  // Two threads write their own regions (different patterns, 44 KiB: one full direct request
  // each time) at once; each thread keeps its queue, and consecutive threads get different ones.
  constexpr int kThreads = 2, kWrites = 64;
  constexpr std::size_t kChunk = 11 * 4096;
  auto pattern = [](int t, int i, std::size_t k) {
    return static_cast<std::uint8_t>(t * 131 + i * 7 + k * 13 + (k >> 9));
  };
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::vector<std::uint8_t> buf(kChunk);
      for (int i = 0; i < kWrites; ++i) {
        for (std::size_t k = 0; k < kChunk; ++k) buf[k] = pattern(t, i, k);
        const std::uint64_t off = (std::uint64_t(i) * kThreads + t) * kChunk;
        if (front_->write(off, buf) != static_cast<long>(kChunk)) ++failures;
      }
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_EQ(failures.load(), 0);
  // Every queue carried requests, each answered on its own ring.
  for (std::uint32_t q = 0; q < 2; ++q) {
    EXPECT_GE(front_->queue_stats(q).requests, 1u) << "queue " << q;
    EXPECT_EQ(front_->queue_stats(q).responses, front_->queue_stats(q).requests) << "queue " << q;
    EXPECT_GE(queue(q).counters().writes.load(), 1u) << "backend queue " << q;
  }
  EXPECT_EQ(front_->stats().requests, std::uint64_t{kThreads} * kWrites);
  // One flush (on this thread's queue) after every write was acknowledged.
  EXPECT_EQ(front_->flush(), 0);
  EXPECT_EQ(queue(0).counters().flushes.load() + queue(1).counters().flushes.load(), 1u);
  // Read back through the frontend (this thread's queue) and straight from the image.
  std::vector<std::uint8_t> back(kChunk), want(kChunk);
  for (int i = 0; i < kWrites; ++i) {
    for (int t = 0; t < kThreads; ++t) {
      for (std::size_t k = 0; k < kChunk; ++k) want[k] = pattern(t, i, k);
      const std::uint64_t off = (std::uint64_t(i) * kThreads + t) * kChunk;
      ASSERT_EQ(front_->read(off, back), static_cast<long>(kChunk));
      ASSERT_EQ(back, want) << "thread " << t << " write " << i;
      ASSERT_EQ(image_bytes(static_cast<off_t>(off), kChunk),
                std::string(reinterpret_cast<const char*>(want.data()), kChunk));
    }
  }
  EXPECT_FALSE(front_->broken());
}

TEST_F(BlkPath, AsyncRequestsKeepTheRingFullFromOneThread) {
  start();
  auto never = [](int) { ADD_FAILURE() << "a refused request completed"; };
  std::vector<std::uint8_t> sector(512), odd(700), big(front_->max_io_bytes() + 4096);
  EXPECT_EQ(front_->start(0, false, 100, sector, never), -EINVAL) << "offset not in sectors";
  EXPECT_EQ(front_->start(0, false, 0, odd, never), -EINVAL) << "length not in sectors";
  EXPECT_EQ(front_->start(0, false, 0, big, never), -EINVAL) << "more than one request carries";
  EXPECT_EQ(front_->start(0, false, 64 << 20, sector, never), -EINVAL) << "past the end";
  EXPECT_EQ(front_->start(1, false, 0, sector, never), -EINVAL) << "no queue 1";
  EXPECT_EQ(front_->complete(0, 0), 0u);

  // 4 KiB writes, each with its own pattern, started until every slot is in flight.
  constexpr std::size_t kIo = 4096;
  constexpr int kMost = 64;
  auto pattern = [](int i, std::size_t k) { return static_cast<std::uint8_t>(i * 37 + k * 11 + (k >> 8)); };
  auto offset = [](int i) { return std::uint64_t(i) * 3 * kIo; };  // not adjacent
  std::vector<std::vector<std::uint8_t>> bufs(kMost, std::vector<std::uint8_t>(kIo));
  std::vector<int> results(kMost, 1);
  int started = 0, rc = 0;
  for (; started < kMost; ++started) {
    for (std::size_t k = 0; k < kIo; ++k) bufs[started][k] = pattern(started, k);
    rc = front_->start(0, true, offset(started), bufs[started], [&results, i = started](int r) { results[i] = r; });
    if (rc != 0) break;
  }
  EXPECT_EQ(rc, -EBUSY);
  EXPECT_EQ(started, 32) << "one request per slot of a one-page ring";
  // A blocking caller meanwhile waits for a slot and gets one as the async ones finish.
  std::vector<std::uint8_t> sync_buf(kIo, 0x77);
  auto sync = std::async(std::launch::async, [&] { return front_->write(60 << 20, sync_buf); });
  EXPECT_EQ(front_->complete(0, static_cast<unsigned>(started)), static_cast<unsigned>(started));
  EXPECT_EQ(sync.get(), static_cast<long>(kIo));
  for (int i = 0; i < started; ++i) {
    ASSERT_EQ(results[i], 0) << "write " << i;
    ASSERT_EQ(image_bytes(static_cast<off_t>(offset(i)), kIo),
              std::string(reinterpret_cast<const char*>(bufs[i].data()), kIo)) << "write " << i;
  }
  EXPECT_EQ(image_bytes(60 << 20, 1), "w");

  // Read them back asynchronously, completing as we go (never more than the ring in flight).
  std::vector<std::vector<std::uint8_t>> back(started, std::vector<std::uint8_t>(kIo, 0));
  std::fill(results.begin(), results.end(), 1);
  unsigned ran = 0;
  for (int i = 0; i < started; ++i) {
    auto done = [&results, i](int r) { results[i] = r; };
    while ((rc = front_->start(0, false, offset(i), back[i], done)) == -EBUSY) ran += front_->complete(0, 1);
    ASSERT_EQ(rc, 0) << "read " << i;
  }
  ran += front_->complete(0, static_cast<unsigned>(started) - ran);
  EXPECT_EQ(ran, static_cast<unsigned>(started));
  EXPECT_EQ(front_->complete(0, 1), 0u) << "nothing left in flight: returns at once";
  for (int i = 0; i < started; ++i) {
    ASSERT_EQ(results[i], 0) << "read " << i;
    ASSERT_EQ(back[i], bufs[i]) << "read " << i;
  }
  EXPECT_EQ(front_->stats().responses, front_->stats().requests);
  EXPECT_FALSE(front_->broken());
}

// FUSE's io_uring worker starts every request of its CPU's queue from one thread: when that
// thread's blkif queue has no free slot, the start goes to the next queue rather than failing
// (which would send the request to a blocking thread).
TEST_F(BlkPath, AnAsynchronousStartTakesTheNextQueueWhenItsOwnIsFull) {
  frontends::BlkfrontConfig f;
  f.completion_threads = true;
  f.queues = 2;
  start(f, {}, /*serve=*/false);  // nobody answers: every started request keeps its slot
  std::vector<std::uint8_t> buf(4096);
  frontends::BlockTarget::Done done;
  int started = 0;
  for (; started < 100; ++started) {
    done = [](long) { ADD_FAILURE() << "nobody answers"; };
    if (!front_->start_read(std::uint64_t(started) * 4096, buf, done)) break;
  }
  EXPECT_EQ(started, 64) << "32 slots on each of two one-page rings, all from one thread";
  EXPECT_EQ(front_->queue_stats(0).async_requests, 32u);
  EXPECT_EQ(front_->queue_stats(1).async_requests, 32u);
  EXPECT_TRUE(static_cast<bool>(done)) << "a start that did not happen leaves `done` with the caller";
}

TEST_F(BlkPath, AsyncRequestsFinishWithEioWhenTheBackendBreaksTheRing) {
  start({}, {}, /*serve=*/false);
  ASSERT_TRUE(hostile_ring_);
  std::vector<std::vector<std::uint8_t>> bufs(3, std::vector<std::uint8_t>(4096, 0x11));
  std::vector<int> results(3, 1);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(front_->start(0, false, std::uint64_t(i) * 4096, bufs[i], [&results, i](int r) { results[i] = r; }), 0);
  }
  // The "backend" answers one request with an id the frontend never used.
  auto req = hostile_ring_->pop_request();
  ASSERT_TRUE(req);
  ring::BlkifResponse rsp{};
  rsp.id = 999;
  rsp.operation = req->operation;
  rsp.status = ring::kBlkifRspOkay;
  ASSERT_TRUE(hostile_ring_->produce_response(rsp));
  if (hostile_ring_->push_responses()) (void)hostile_port_->notify();
  // Every request still in flight finishes, with -EIO, and its read buffer is left alone.
  EXPECT_EQ(front_->complete(0, 3), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(results[i], -EIO) << i;
    EXPECT_EQ(bufs[i], std::vector<std::uint8_t>(4096, 0x11)) << i;
  }
  EXPECT_TRUE(front_->broken());
  EXPECT_EQ(front_->start(0, false, 0, bufs[0], [](int) { ADD_FAILURE() << "started on a broken ring"; }), -EIO);
  EXPECT_EQ(front_->read(0, bufs[0]), -EIO);
}

// A frontend torn down while the backend still maps its ring (a backend that has not let go
// yet) keeps the ring's page: the backend may still write into it, so it must not be handed out
// again. Its grant stays as it is.
TEST_F(BlkPath, ARingPageTheBackendStillMapsIsNotReusedAfterTheFrontendGoes) {
  start({}, {}, /*serve=*/false);
  ASSERT_TRUE(hostile_map_);
  const gnttab::GrantRef ref = front_->ring_refs(0).at(0);
  const auto entry = domain_->grants().entry(ref);
  ASSERT_TRUE(entry);
  const std::uint64_t ring_gfn = entry->frame;
  front_.reset();
  EXPECT_TRUE(domain_->grants().is_mapped(ref));
  // Every free page of the domain, one by one (bounded by its 96 MiB): none is the ring's.
  std::uint64_t pages = 0;
  while (const auto gfn = domain_->alloc_pages(1)) {
    ASSERT_NE(*gfn, ring_gfn) << "the ring's page was handed out again";
    ASSERT_LT(++pages, std::uint64_t{96 << 20} / 4096);
  }
  EXPECT_GT(pages, 0u) << "the pages the frontend could give back were given back";
}

TEST_F(BlkPath, QueueCountOutOfRangeIsRefused) {
  domain::DomainConfig cfg;
  cfg.domid = 3;
  cfg.name = "pv-disk-test";
  cfg.memory_bytes = 8 << 20;
  cfg.run_dir = dir_ + "/run";
  shared_info_holder_ = std::make_unique<ForwardingSink>();
  domain_ = std::make_unique<domain::Domain>(io_, cfg, *shared_info_holder_);
  events_ = std::make_unique<frontends::GuestEvents>(domain_->pages(domain::Domain::kSharedInfoGfn, 1));
  io_thread_ = std::thread([this] { io_.run(); });
  for (std::uint32_t n : {0u, 17u}) {
    frontends::BlkfrontConfig f;
    f.queues = n;
    EXPECT_THROW((Blkfront(*domain_, *events_, f)), std::invalid_argument) << n;
  }
  // The largest run of free pages the domain can hand out (alloc_pages is contiguous).
  auto largest_free_run = [&] {
    std::uint64_t lo = 0, hi = cfg.memory_bytes >> 12;
    while (lo < hi) {  // ≤ 12 rounds
      const std::uint64_t mid = (lo + hi + 1) / 2;
      if (auto g = domain_->alloc_pages(mid)) {
        domain_->free_pages(*g, mid);
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  };
  const std::uint64_t before = largest_free_run();
  ASSERT_GT(before, 353u * 2) << "room for two direct-request queues (1 + 32 x 11 pages each)";
  // 16 queues of direct requests (353 pages each) do not fit in 8 MiB: the queues made before
  // the one that failed, and the half-made one, give back every page.
  frontends::BlkfrontConfig big;
  big.queues = 16;
  EXPECT_THROW((Blkfront(*domain_, *events_, big)), std::runtime_error);
  EXPECT_EQ(largest_free_run(), before);
  frontends::BlkfrontConfig two;
  two.queues = 2;
  {
    Blkfront b{*domain_, *events_, two};
    EXPECT_EQ(b.queues(), 2u);
    EXPECT_LE(largest_free_run(), before - 2 * 353);
  }
  EXPECT_EQ(largest_free_run(), before);
}

TEST_F(BlkPath, OutOfRangeIsRefusedByTheFrontend) {
  start();
  std::uint8_t b[512];
  EXPECT_EQ(front_->read(64 << 20, b), -EINVAL);
  EXPECT_EQ(front_->write((64 << 20) - 256, b), -EINVAL);
}

TEST_F(BlkPath, Ext4OverFuseAndLoop) {
  if (::geteuid() != 0 || ::access("/dev/fuse", R_OK | W_OK) != 0 || std::system("command -v losetup >/dev/null") != 0) {
    GTEST_SKIP() << "needs root, /dev/fuse and losetup";
  }
  frontends::BlkfrontConfig f;
  start(f);
  ext4_over_fuse();
  EXPECT_EQ(front_->stats().async_requests, 0u) << "no completion threads: FUSE blocks a worker per request";
}

// A poller (FUSE's ring worker while it is awake) collects the answers on its own thread: while
// it polls, the completion threads leave them alone; once it stops, they complete what is still
// in flight. Bounded: 10 s for each wait.
TEST_F(BlkPath, APollerCollectsAnswersAndHandsTheRestBackWhenItStops) {
  start_async_two_queues();
  const auto me = std::this_thread::get_id();
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::thread::id> who;  // the thread each answer ran on
  std::vector<std::uint8_t> buf(8 * 4096);
  auto start8 = [&] {
    for (int i = 0; i < 8; ++i) {
      frontends::BlockTarget::Done done = [&](long n) {
        EXPECT_EQ(n, 4096);
        std::lock_guard l(m);
        who.push_back(std::this_thread::get_id());
        cv.notify_all();
      };
      ASSERT_TRUE(front_->start_read(std::uint64_t(i) * 4096, std::span(buf).subspan(i * 4096, 4096), done));
    }
  };
  auto answered = [&] {
    std::lock_guard l(m);
    return who.size();
  };

  front_->polling(true);
  start8();
  // The backend answers; nobody but this thread runs the callbacks.
  for (int i = 0; i < 10000 && answered() < 8; ++i) {
    front_->poll();
    if (answered() < 8) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  {
    std::lock_guard l(m);
    ASSERT_EQ(who.size(), 8u) << "every answer was collected by polling";
    for (auto id : who) EXPECT_EQ(id, me) << "an answer ran on another thread while this one polled";
    who.clear();
  }

  start8();
  front_->polling(false);  // handed back: the completion threads finish them
  {
    std::unique_lock l(m);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::seconds(10), [&] { return who.size() == 8; }))
        << "requests in flight when polling stopped were never completed";
    for (auto id : who) EXPECT_NE(id, me);
  }
  const auto st = front_->stats();
  EXPECT_EQ(st.async_requests, 16u);
  EXPECT_EQ(st.responses, st.requests);
}

TEST_F(BlkPath, Ext4OverFuseAndLoopThroughTheAsynchronousPath) {
  if (::geteuid() != 0 || ::access("/dev/fuse", R_OK | W_OK) != 0 || std::system("command -v losetup >/dev/null") != 0) {
    GTEST_SKIP() << "needs root, /dev/fuse and losetup";
  }
  start_async_two_queues();
  ext4_over_fuse();
  const auto st = front_->stats();
  EXPECT_GT(st.async_requests, 0u);
  EXPECT_EQ(st.responses, st.requests);
  EXPECT_THROW(front_->complete(0, 1), std::logic_error) << "the completion threads own complete()";
}

// The same over FUSE's io_uring rings (Linux ≥ 6.14; the test switches the fuse module's
// enable_uring on for its time): mkfs, mount, fsync'd writes, and the image holds them.
TEST_F(BlkPath, Ext4OverFuseOverIoUringThroughTheAsynchronousPath) {
  if (::geteuid() != 0 || ::access("/dev/fuse", R_OK | W_OK) != 0 || std::system("command -v losetup >/dev/null") != 0) {
    GTEST_SKIP() << "needs root, /dev/fuse and losetup";
  }
  if (!frontends::FuseUringEnable::available()) GTEST_SKIP() << "this kernel has no FUSE over io_uring";
  frontends::FuseUringEnable on;
  start_async_two_queues();
  const std::uint64_t ring_requests = ext4_over_fuse(/*uring=*/true);
  if (HasFatalFailure()) return;  // the helper stopped before it counted: no claim about the rings
  EXPECT_GT(ring_requests, 0u) << "the rings carried the requests";
  const auto st = front_->stats();
  EXPECT_GT(st.async_requests, 0u);
  EXPECT_EQ(st.responses, st.requests);
}

}  // namespace
}  // namespace xpv
