// IoRing against real files: real io_uring, O_DIRECT where the file system has it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include "xpv/test/temp_dir.h"
#include "xpv/blkback/disk.h"
#include "xpv/blkback/io_ring.h"

namespace xpv::blkback {
namespace {

struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t n) : size(n) {
    void* p = nullptr;
    if (::posix_memalign(&p, 4096, n) != 0) throw std::bad_alloc();
    data.reset(static_cast<std::uint8_t*>(p));
    std::memset(p, 0, n);
  }
  struct Free {
    void operator()(std::uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<std::uint8_t, Free> data;
  std::size_t size;
};

class IoRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("disk.img");
    int fd = ::open(path_.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 4 << 20), 0);
    ::close(fd);
    disk_ = std::make_unique<Disk>(Disk::open(path_, false));
  }
  // Submits, waits for `n` completions, returns user → res.
  std::map<std::uint64_t, int> run(unsigned n) {
    auto s = ring_.submit_and_wait(n);
    EXPECT_TRUE(s);
    std::map<std::uint64_t, int> done;
    for (int spins = 0; done.size() < n && spins < 1000; ++spins) {
      ring_.reap([&](std::uint64_t user, int res) { done[user] = res; });
      if (done.size() < n) (void)ring_.submit_and_wait(1);
    }
    return done;
  }

  test::TempDir dir_;
  std::string path_;
  std::unique_ptr<Disk> disk_;
  IoRing ring_{64};
};

TEST_F(IoRingTest, WriteThenReadBackScatterGather) {
  AlignedBuffer a(4096), b(4096), r1(4096), r2(4096);
  std::memset(a.data.get(), 0xaa, 4096);
  std::memset(b.data.get(), 0xbb, 4096);
  iovec w[2] = {{a.data.get(), 4096}, {b.data.get(), 4096}};
  ASSERT_TRUE(ring_.writev(disk_->fd(), w, 2, 8192, 1));
  auto done = run(1);
  ASSERT_EQ(done.at(1), 8192);

  iovec r[2] = {{r1.data.get(), 4096}, {r2.data.get(), 4096}};
  ASSERT_TRUE(ring_.readv(disk_->fd(), r, 2, 8192, 2));
  done = run(1);
  ASSERT_EQ(done.at(2), 8192);
  EXPECT_EQ(std::memcmp(r1.data.get(), a.data.get(), 4096), 0);
  EXPECT_EQ(std::memcmp(r2.data.get(), b.data.get(), 4096), 0);
  EXPECT_EQ(ring_.in_flight(), 0u);
}

TEST_F(IoRingTest, SubSector512ByteSegmentsWork) {
  // blkif segments are counted in 512-byte sectors inside a page: first_sect..last_sect.
  AlignedBuffer page(4096);
  std::memset(page.data.get() + 512, 0x5a, 1024);
  iovec w{page.data.get() + 512, 1024};
  ASSERT_TRUE(ring_.writev(disk_->fd(), &w, 1, 512 * 3, 7));
  EXPECT_EQ(run(1).at(7), 1024);
  char back[1024];
  UniqueFd plain(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_EQ(::pread(plain.get(), back, sizeof back, 512 * 3), 1024);
  EXPECT_EQ(static_cast<unsigned char>(back[0]), 0x5a);
  EXPECT_EQ(static_cast<unsigned char>(back[1023]), 0x5a);
}

TEST_F(IoRingTest, FsyncCompletes) {
  ASSERT_TRUE(ring_.fsync(disk_->fd(), true, 9));
  ASSERT_TRUE(ring_.fsync(disk_->fd(), false, 10, /*drain=*/true));
  auto done = run(2);
  EXPECT_EQ(done.at(9), 0);
  EXPECT_EQ(done.at(10), 0);
}

TEST_F(IoRingTest, PunchHoleReadsBackZerosAndFreesBlocks) {
  AlignedBuffer data(1 << 20), back(1 << 20);
  std::memset(data.data.get(), 0x77, data.size);
  iovec w{data.data.get(), data.size};
  ASSERT_TRUE(ring_.writev(disk_->fd(), &w, 1, 0, 1));
  ASSERT_EQ(run(1).at(1), static_cast<int>(data.size));
  ASSERT_TRUE(ring_.fsync(disk_->fd(), true, 2));
  run(1);
  struct stat before {};
  ASSERT_EQ(::fstat(disk_->fd(), &before), 0);

  ASSERT_TRUE(ring_.punch_hole(disk_->fd(), 0, 1 << 20, 3));
  int res = run(1).at(3);
  if (res == -EOPNOTSUPP) GTEST_SKIP() << "this file system cannot punch holes";
  ASSERT_EQ(res, 0);
  struct stat after {};
  ASSERT_EQ(::fstat(disk_->fd(), &after), 0);
  EXPECT_LT(after.st_blocks, before.st_blocks);
  EXPECT_EQ(after.st_size, before.st_size);

  iovec r{back.data.get(), back.size};
  ASSERT_TRUE(ring_.readv(disk_->fd(), &r, 1, 0, 4));
  ASSERT_EQ(run(1).at(4), static_cast<int>(back.size));
  for (std::size_t i = 0; i < back.size; i += 4096) ASSERT_EQ(back.data.get()[i], 0) << i;
}

TEST_F(IoRingTest, ReadPastTheEndIsShort) {
  AlignedBuffer buf(8192);
  iovec r{buf.data.get(), buf.size};
  ASSERT_TRUE(ring_.readv(disk_->fd(), &r, 1, (4 << 20) - 4096, 5));
  EXPECT_EQ(run(1).at(5), 4096);
}

TEST_F(IoRingTest, ErrorsComeBackAsNegativeErrno) {
  Disk ro = Disk::open(path_, true);
  AlignedBuffer buf(4096);
  iovec w{buf.data.get(), buf.size};
  ASSERT_TRUE(ring_.writev(ro.fd(), &w, 1, 0, 6));
  EXPECT_EQ(run(1).at(6), -EBADF);
}

TEST_F(IoRingTest, QueueReportsAFullSubmissionQueue) {
  IoRing small(4);
  const unsigned cap = small.space();
  ASSERT_GE(cap, 4u);
  unsigned queued = 0;
  while (queued < 1000 && small.fsync(disk_->fd(), true, queued)) ++queued;
  EXPECT_EQ(queued, cap);
  EXPECT_FALSE(small.fsync(disk_->fd(), true, 999));
  auto s = small.submit_and_wait(queued);
  ASSERT_TRUE(s);
  unsigned reaped = 0;
  for (int i = 0; i < 100 && reaped < queued; ++i) {
    reaped += small.reap([](std::uint64_t, int res) { EXPECT_EQ(res, 0); });
    if (reaped < queued) (void)small.submit_and_wait(1);
  }
  EXPECT_EQ(reaped, queued);
  EXPECT_TRUE(small.fsync(disk_->fd(), true, 1000)) << "space is back after reaping";
  (void)small.submit_and_wait(1);
}

TEST_F(IoRingTest, CompletionEventfdSignals) {
  ASSERT_TRUE(ring_.fsync(disk_->fd(), true, 11));
  ASSERT_TRUE(ring_.submit_and_wait(1));
  std::uint64_t count = 0;
  ASSERT_EQ(::read(ring_.completion_fd(), &count, sizeof count), 8);
  EXPECT_GE(count, 1u);
  EXPECT_EQ(ring_.reap([](std::uint64_t user, int res) {
    EXPECT_EQ(user, 11u);
    EXPECT_EQ(res, 0);
  }), 1u);
}

// The sleep protocol of a queue thread (queue.cpp run()): ready_before_sleep(), and when it says
// nothing is waiting, poll the eventfd. Every fsync completes on an io-wq worker, another thread,
// at a moment the sleeper does not choose: no completion may be slept through (each poll is
// bounded; a miss fails at once). Until session 41 the eventfd was turned off while the thread
// was awake and on again before it slept — a completion posted between the kernel's look at that
// flag and the CQ look here was lost (io_ring.h), a race too narrow to meet on demand.
TEST_F(IoRingTest, NoCompletionOfAnIoWorkerIsSleptThrough) {
  int slept = 0;
  for (std::uint64_t i = 0; i < 500; ++i) {
    ASSERT_TRUE(ring_.fsync(disk_->fd(), true, i));
    ASSERT_TRUE(ring_.submit());
    unsigned got = 0;
    for (int round = 0; round < 10 && got == 0; ++round) {
      if (!ring_.ready_before_sleep()) {
        ++slept;
        pollfd p{ring_.completion_fd(), POLLIN, 0};
        ASSERT_EQ(::poll(&p, 1, 10'000), 1) << "fsync " << i << ": slept 10 s through its completion";
      }
      got += ring_.reap([&](std::uint64_t user, int res) {
        EXPECT_EQ(user, i);
        EXPECT_EQ(res, 0);
      });
    }
    ASSERT_EQ(got, 1u) << "fsync " << i;
  }
  EXPECT_GT(slept, 0) << "no look found the CQ empty: the sleep was never tried";
}

// Completions reaped while the thread was awake leave no stale signal behind: the sleep that
// follows is not woken for them (a spurious wake-up per batch otherwise).
TEST_F(IoRingTest, ReadyBeforeSleepConsumesTheSignalOfWhatWasReaped) {
  for (std::uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(ring_.fsync(disk_->fd(), true, i));
  const auto done = run(4);
  ASSERT_EQ(done.size(), 4u);
  // An io-wq worker signals after it posts, so a signal of the four may still come after the
  // reap: at most four such late ones, each consumed by the next look.
  bool quiet = false;
  for (int look = 0; look < 5 && !quiet; ++look) {
    EXPECT_FALSE(ring_.ready_before_sleep());
    pollfd p{ring_.completion_fd(), POLLIN, 0};
    quiet = ::poll(&p, 1, 0) == 0;
  }
  EXPECT_TRUE(quiet) << "the eventfd still says completions were posted after five looks";
  EXPECT_EQ(ring_.in_flight(), 0u);
}

}  // namespace
}  // namespace xpv::blkback
