// FuseDisk on a real FUSE mount (needs /dev/fuse and root): plain syscalls, O_DIRECT, fsync,
// punch-hole, and a loop device with ext4 on top — what `xpv block-attach` gives dom0.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <thread>
#include <tuple>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <vector>

#include "xpv/frontends/fuse_disk.h"
#include "xpv/test/loop_device.h"
#include "xpv/unique_fd.h"

namespace xpv::frontends {
namespace {

// An in-memory disk, thread-safe, counting what reached it. With `async`, reads and writes
// start asynchronously (BlockTarget::start_read/start_write) and a thread of its own completes
// them in batches, newest first — out of order, as a device with a queue may. With `at_once`
// as well, each is answered inside start_read/start_write (a target that finishes at once).
// With `polled` as well, a caller between polling(true) and polling(false) runs the answers in
// poll(), and the target's thread leaves them alone meanwhile (as Blkfront does).
class MemoryTarget : public BlockTarget {
 public:
  MemoryTarget(std::size_t size, bool ro) : data_(size), ro_(ro) {}
  ~MemoryTarget() override {
    {
      std::lock_guard l(jobs_m_);
      stop_ = true;
    }
    jobs_cv_.notify_all();
    if (completer_.joinable()) completer_.join();
  }
  std::uint64_t size_bytes() const override { return data_.size(); }
  bool readonly() const override { return ro_; }
  long read(std::uint64_t off, std::span<std::uint8_t> out) override {
    if (fail_with) return -fail_with;
    std::lock_guard lock(m_);
    std::memcpy(out.data(), data_.data() + off, out.size());
    return static_cast<long>(out.size());
  }
  long write(std::uint64_t off, std::span<const std::uint8_t> in) override {
    if (fail_with) return -fail_with;
    std::lock_guard lock(m_);
    std::memcpy(data_.data() + off, in.data(), in.size());
    writes++;
    return static_cast<long>(in.size());
  }
  int flush() override {
    flushes++;
    return 0;
  }
  int discard(std::uint64_t off, std::uint64_t len) override {
    std::lock_guard lock(m_);
    std::memset(data_.data() + off, 0, len);
    last_discard = {off, len};
    return 0;
  }
  bool start_read(std::uint64_t off, std::span<std::uint8_t> out, Done& done) override {
    if (!async) return false;
    if (at_once) {
      async_started++;
      done(read(off, out));
      return true;
    }
    queue([this, off, out, done = std::move(done)] { done(read(off, out)); });
    return true;
  }
  bool start_write(std::uint64_t off, std::span<const std::uint8_t> in, Done& done) override {
    if (!async) return false;
    if (at_once) {
      async_started++;
      done(write(off, in));
      return true;
    }
    // `in` is the caller's only until we return.
    queue([this, off, data = std::vector<std::uint8_t>(in.begin(), in.end()), done = std::move(done)] {
      done(write(off, data));
    });
    return true;
  }
  void polling(bool on) override {
    if (!polled) return;
    {
      std::lock_guard l(jobs_m_);
      pollers_ += on ? 1 : -1;
    }
    jobs_cv_.notify_all();
  }
  void poll() override {
    if (!polled) return;
    std::vector<std::function<void()>> mine;
    {
      std::lock_guard l(jobs_m_);
      mine.swap(jobs_);
    }
    for (auto& j : mine) j();
    polled_answers += static_cast<int>(mine.size());
  }
  std::vector<std::uint8_t> snapshot() {
    std::lock_guard lock(m_);
    return data_;
  }

  bool async = false, at_once = false, polled = false;
  std::atomic<int> flushes{0}, writes{0}, fail_with{0}, async_started{0}, polled_answers{0};
  std::pair<std::uint64_t, std::uint64_t> last_discard{0, 0};

 private:
  void queue(std::function<void()> job) {
    async_started++;
    {
      std::lock_guard l(jobs_m_);
      jobs_.push_back(std::move(job));
      if (!completer_.joinable()) completer_ = std::thread([this] { complete_jobs(); });
    }
    jobs_cv_.notify_one();
  }
  void complete_jobs() {
    std::unique_lock l(jobs_m_);
    for (;;) {
      jobs_cv_.wait(l, [&] { return stop_ || (!jobs_.empty() && pollers_ == 0); });
      if (jobs_.empty()) return;  // stop_, nothing left
      // Let a few more arrive (bounded), then complete the batch newest first.
      jobs_cv_.wait_for(l, std::chrono::milliseconds(1), [&] { return jobs_.size() >= 8 || stop_; });
      std::vector<std::function<void()>> batch(std::make_move_iterator(jobs_.rbegin()), std::make_move_iterator(jobs_.rend()));
      jobs_.clear();
      l.unlock();
      for (auto& j : batch) j();
      l.lock();
    }
  }

  std::mutex m_;
  std::vector<std::uint8_t> data_;
  bool ro_;
  std::mutex jobs_m_;
  std::condition_variable jobs_cv_;
  std::vector<std::function<void()>> jobs_;
  bool stop_ = false;
  int pollers_ = 0;
  std::thread completer_;
};

bool is_mounted(const std::string& path) {
  std::ifstream f("/proc/self/mountinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.find(" " + path + " ") != std::string::npos) return true;
  }
  return false;
}

int run(const std::string& cmd) {
  int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Every test runs eight times: the target blocking FUSE's worker (sync), completing on a thread
// of its own (async), answering inside the start call (at once) or leaving its answers to a
// poller while there is one (polled), each over /dev/fuse and over FUSE's io_uring rings (whose
// workers poll). The io_uring
// runs switch the fuse module's enable_uring on for their time (FuseUringEnable: the last
// holder switches it back off) and are skipped on a kernel without it (before Linux 6.14,
// Debian 12's own); they check that the rings carried the requests.
enum class Completion { sync, async, at_once, polled };

class FuseDiskTest : public ::testing::TestWithParam<std::tuple<Completion, bool>> {
 protected:
  bool async() const { return std::get<0>(GetParam()) != Completion::sync; }
  bool uring() const { return std::get<1>(GetParam()); }
  void SetUp() override {
    if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "no /dev/fuse";
    if (uring()) {
      if (!FuseUringEnable::available()) GTEST_SKIP() << "this kernel has no FUSE over io_uring";
      enable_ = std::make_unique<FuseUringEnable>();
    }
    char tmpl[] = "/tmp/xpv-fuse-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (disk_ && !HasFatalFailure()) {
      EXPECT_EQ(disk_->uring_active(), uring());
      if (uring()) EXPECT_GT(disk_->uring_requests(), 0u) << "the requests came through the rings";
      else EXPECT_EQ(disk_->uring_requests(), 0u);
    }
    disk_.reset();
    target_.reset();  // after the disk: FUSE's workers may call into it until they are gone
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    enable_.reset();
  }
  // The test's target, owned here so that it outlives the disk.
  template <class T = MemoryTarget>
  T& target(std::size_t size, bool ro) {
    auto t = std::make_unique<T>(size, ro);
    T& ref = *t;
    target_ = std::move(t);
    return ref;
  }
  void mount(MemoryTarget& t) {
    t.async = async();
    t.at_once = std::get<0>(GetParam()) == Completion::at_once;
    t.polled = std::get<0>(GetParam()) == Completion::polled;
    FuseDiskOptions o;
    o.uring = uring();
    disk_ = std::make_unique<FuseDisk>(dir_, "disk", t, o);
  }

  std::unique_ptr<FuseUringEnable> enable_;
  std::string dir_;
  std::unique_ptr<MemoryTarget> target_;
  std::unique_ptr<FuseDisk> disk_;
};

TEST_P(FuseDiskTest, TheDiskIsAFileOfTheRightSize) {
  auto& t = target(8 << 20, false);
  mount(t);
  struct stat st {};
  ASSERT_EQ(::stat(disk_->file_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 8 << 20);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"disk"});
  EXPECT_TRUE(is_mounted(dir_));
}

TEST_P(FuseDiskTest, WritesReachTheTargetAndReadBack) {
  auto& t = target(1 << 20, false);
  mount(t);
  UniqueFd fd(::open(disk_->file_path().c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(fd);
  const char msg[] = "paravirtual";
  ASSERT_EQ(::pwrite(fd.get(), msg, sizeof msg, 12345), static_cast<ssize_t>(sizeof msg));
  auto snap = t.snapshot();
  EXPECT_EQ(std::memcmp(snap.data() + 12345, msg, sizeof msg), 0) << "direct_io: no cache in between";
  char back[sizeof msg] = {};
  ASSERT_EQ(::pread(fd.get(), back, sizeof back, 12345), static_cast<ssize_t>(sizeof back));
  EXPECT_STREQ(back, msg);
}

TEST_P(FuseDiskTest, ODirectLargeIo) {
  auto& t = target(4 << 20, false);
  mount(t);
  UniqueFd fd(::open(disk_->file_path().c_str(), O_RDWR | O_DIRECT | O_CLOEXEC));
  ASSERT_TRUE(fd);
  void* p = nullptr;
  ASSERT_EQ(::posix_memalign(&p, 4096, 1 << 20), 0);
  std::unique_ptr<void, decltype(&std::free)> buf(p, &std::free);
  std::memset(p, 0x3c, 1 << 20);
  ASSERT_EQ(::pwrite(fd.get(), p, 1 << 20, 1 << 20), 1 << 20);
  std::memset(p, 0, 1 << 20);
  ASSERT_EQ(::pread(fd.get(), p, 1 << 20, 1 << 20), 1 << 20);
  EXPECT_EQ(static_cast<unsigned char*>(p)[0], 0x3c);
  EXPECT_EQ(static_cast<unsigned char*>(p)[(1 << 20) - 1], 0x3c);
}

TEST_P(FuseDiskTest, FsyncFlushesAndPunchHoleDiscards) {
  auto& t = target(1 << 20, false);
  mount(t);
  UniqueFd fd(::open(disk_->file_path().c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(fd);
  std::vector<char> ones(65536, 1);
  ASSERT_EQ(::pwrite(fd.get(), ones.data(), ones.size(), 0), 65536);
  ASSERT_EQ(::fdatasync(fd.get()), 0);
  EXPECT_GE(t.flushes.load(), 1);
  ASSERT_EQ(::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 8192), 0);
  EXPECT_EQ(t.last_discard, (std::pair<std::uint64_t, std::uint64_t>{4096, 8192}));
  char c = 1;
  ASSERT_EQ(::pread(fd.get(), &c, 1, 5000), 1);
  EXPECT_EQ(c, 0);
  // Growing the file is not a discard.
  EXPECT_NE(::fallocate(fd.get(), 0, 0, 4096), 0);
}

TEST_P(FuseDiskTest, TheDiskDoesNotGrowOrShrink) {
  auto& t = target(1 << 20, false);
  mount(t);
  UniqueFd fd(::open(disk_->file_path().c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(fd);
  char b = 0;
  EXPECT_EQ(::pwrite(fd.get(), &b, 1, 1 << 20), -1);
  EXPECT_EQ(errno, ENOSPC);
  EXPECT_NE(::ftruncate(fd.get(), 4096), 0);
  EXPECT_EQ(::pread(fd.get(), &b, 1, 1 << 20), 0) << "reading at the end is EOF";
}

TEST_P(FuseDiskTest, ReadOnlyDiskRefusesWriters) {
  auto& t = target(1 << 20, true);
  mount(t);
  UniqueFd rw(::open(disk_->file_path().c_str(), O_RDWR | O_CLOEXEC));
  EXPECT_FALSE(rw);
  EXPECT_EQ(errno, EROFS);
  UniqueFd ro(::open(disk_->file_path().c_str(), O_RDONLY | O_CLOEXEC));
  EXPECT_TRUE(ro);
  EXPECT_EQ(t.writes.load(), 0);
}

TEST_P(FuseDiskTest, TargetErrorsReachTheCaller) {
  auto& t = target(1 << 20, false);
  mount(t);
  UniqueFd fd(::open(disk_->file_path().c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(fd);
  t.fail_with = EIO;
  char b[512];
  EXPECT_EQ(::pread(fd.get(), b, sizeof b, 0), -1);
  EXPECT_EQ(errno, EIO);
}

TEST_P(FuseDiskTest, UnknownNamesAreAbsent) {
  auto& t = target(1 << 20, false);
  mount(t);
  struct stat st {};
  EXPECT_NE(::stat((dir_ + "/other").c_str(), &st), 0);
  EXPECT_EQ(errno, ENOENT);
  UniqueFd created(::open((dir_ + "/new").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600));
  EXPECT_FALSE(created) << "the directory holds the disk and nothing else";
}

TEST_P(FuseDiskTest, DestructionUnmounts) {
  auto& t = target(1 << 20, false);
  mount(t);
  ASSERT_TRUE(is_mounted(dir_));
  disk_.reset();
  EXPECT_FALSE(is_mounted(dir_));
}

TEST_P(FuseDiskTest, LoopDeviceWithExt4OnTop) {
  if (::geteuid() != 0 || run("command -v losetup") != 0 || run("command -v mkfs.ext4") != 0) {
    GTEST_SKIP() << "needs root, losetup and mkfs.ext4";
  }
  auto& t = target(64 << 20, false);
  mount(t);
  const std::string mnt = dir_ + "-mnt";
  std::filesystem::create_directory(mnt);
  test::LoopDevice loop(disk_->file_path());
  if (loop.empty()) {
    std::filesystem::remove(mnt);
    GTEST_SKIP() << "no free loop device";
  }
  struct Cleanup {
    std::string mnt;
    ~Cleanup() {
      run("umount " + mnt);
      std::error_code ec;
      std::filesystem::remove(mnt, ec);
    }
  } cleanup{mnt};
  ASSERT_EQ(run("mkfs.ext4 -q -F " + loop.path()), 0);
  ASSERT_EQ(run("mount " + loop.path() + " " + mnt), 0);
  ASSERT_EQ(run("sh -c 'echo pv-root > " + mnt + "/hello && sync " + mnt + "/hello'"), 0);
  ASSERT_EQ(run("umount " + mnt), 0);
  ASSERT_EQ(run("mount -o ro " + loop.path() + " " + mnt), 0);
  std::ifstream f(mnt + "/hello");
  std::string s;
  std::getline(f, s);
  EXPECT_EQ(s, "pv-root");
  EXPECT_GT(t.writes.load(), 0);
  EXPECT_GE(t.flushes.load(), 1) << "ext4 and sync flush the disk";
}

TEST_P(FuseDiskTest, ManyRequestsInFlightGetTheirOwnAnswers) {
  auto& t = target(4 << 20, false);
  mount(t);
  // 8 threads × 32 blocks of 4 KiB, each block its own pattern: written with O_DIRECT at once,
  // then read back at once (the async target answers them in batches, newest first).
  constexpr int kThreads = 8, kBlocks = 32;
  auto pattern = [](int th, int b) { return static_cast<char>(th * kBlocks + b + 1); };
  std::atomic<int> bad{0};
  auto run_all = [&](bool write) {
    std::vector<std::thread> ts;
    for (int th = 0; th < kThreads; ++th) {
      ts.emplace_back([&, th] {
        UniqueFd fd(::open(disk_->file_path().c_str(), O_RDWR | O_DIRECT | O_CLOEXEC));
        void* p = nullptr;
        if (!fd || ::posix_memalign(&p, 4096, 4096) != 0) return (void)++bad;
        std::unique_ptr<void, decltype(&std::free)> buf(p, &std::free);
        for (int b = 0; b < kBlocks; ++b) {
          const off_t off = (off_t{b} * kThreads + th) * 4096;
          if (write) {
            std::memset(p, pattern(th, b), 4096);
            if (::pwrite(fd.get(), p, 4096, off) != 4096) ++bad;
          } else {
            std::memset(p, 0, 4096);
            if (::pread(fd.get(), p, 4096, off) != 4096 ||
                std::memcmp(p, std::string(4096, pattern(th, b)).data(), 4096) != 0) {
              ++bad;
            }
          }
        }
      });
    }
    for (auto& x : ts) x.join();
  };
  run_all(true);
  run_all(false);
  EXPECT_EQ(bad.load(), 0);
  const auto snap = t.snapshot();
  EXPECT_EQ(snap[(5 * kThreads + 3) * 4096 + 17], static_cast<std::uint8_t>(pattern(3, 5)));
  if (async()) {
    EXPECT_GE(t.async_started.load(), 2 * kThreads * kBlocks) << "every read and write went the async way";
  } else {
    EXPECT_EQ(t.async_started.load(), 0);
  }
  if (t.polled && uring()) {
    EXPECT_GT(t.polled_answers.load(), 0) << "the ring workers collected answers by polling";
  } else {
    EXPECT_EQ(t.polled_answers.load(), 0) << "only FUSE's ring workers poll";
  }
}

// The disk is destroyed while four threads still read and write it (their files open): the
// destructor ends the connection — their later requests fail, none hangs — and returns with
// nothing left mounted. Bounded: 400 I/Os a thread.
TEST_P(FuseDiskTest, DestroyingTheDiskWhileItIsInUseEndsCleanly) {
  auto& t = target(4 << 20, false);
  mount(t);
  constexpr int kThreads = 4, kOps = 400;
  std::atomic<int> done_ops{0}, failed{0}, started{0};
  std::vector<std::thread> ts;
  for (int th = 0; th < kThreads; ++th) {
    ts.emplace_back([&, th] {
      UniqueFd fd(::open(disk_->file_path().c_str(), O_RDWR | O_DIRECT | O_CLOEXEC));
      void* p = nullptr;
      if (!fd || ::posix_memalign(&p, 4096, 4096) != 0) return (void)++failed;
      std::unique_ptr<void, decltype(&std::free)> buf(p, &std::free);
      ++started;
      for (int i = 0; i < kOps; ++i) {
        const off_t off = (off_t{i % 64} * kThreads + th) * 4096;
        std::memset(p, th + 1, 4096);
        const bool ok = (i & 1) ? ::pread(fd.get(), p, 4096, off) == 4096 : ::pwrite(fd.get(), p, 4096, off) == 4096;
        ok ? ++done_ops : ++failed;
      }
    });
  }
  // Until every thread is under way (bounded: 10 s).
  for (int i = 0; i < 10000 && (started < kThreads || done_ops < 2 * kThreads) && failed == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const std::uint64_t through_rings = disk_->uring_requests();
  disk_.reset();  // with the threads mid-way
  for (auto& x : ts) x.join();
  EXPECT_EQ(done_ops.load() + failed.load(), kThreads * kOps) << "every request ended, answered or refused";
  EXPECT_GT(done_ops.load(), 0);
  EXPECT_FALSE(is_mounted(dir_));
  if (uring()) {
    EXPECT_GT(through_rings, 0u);
  }
}

// A flush that takes its time (a disk cache being written back) holds up neither reads nor
// writes behind it: over /dev/fuse other workers serve them, over the rings the flush waits on
// a pool thread, not on the ring's worker. Both threads are pinned to one CPU, so that over
// io_uring their requests land on one kernel queue (one worker).
TEST_P(FuseDiskTest, ASlowFlushHoldsUpNoReadOnItsQueue) {
  struct SlowFlush : MemoryTarget {
    using MemoryTarget::MemoryTarget;
    int flush() override {
      std::unique_lock l(m);
      entered = true;
      cv.notify_all();
      cv.wait_for(l, std::chrono::seconds(20), [&] { return released; });
      return MemoryTarget::flush();
    }
    std::mutex m;
    std::condition_variable cv;
    bool entered = false, released = false;
  };
  auto& t = target<SlowFlush>(1 << 20, false);
  mount(t);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  UniqueFd fd(::open(disk_->file_path().c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(fd);
  std::thread flusher([&] {
    (void)::sched_setaffinity(0, sizeof one, &one);
    EXPECT_EQ(::fsync(fd.get()), 0);
  });
  {
    std::unique_lock l(t.m);
    EXPECT_TRUE(t.cv.wait_for(l, std::chrono::seconds(10), [&] { return t.entered; })) << "the flush reached the target";
  }
  // While the flush is held: a read on the same CPU is answered (bounded: 10 s).
  std::atomic<bool> read_done{false};
  std::thread reader([&] {
    (void)::sched_setaffinity(0, sizeof one, &one);
    char b[512];
    if (::pread(fd.get(), b, sizeof b, 4096) == static_cast<ssize_t>(sizeof b)) read_done = true;
  });
  for (int i = 0; i < 1000 && !read_done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(read_done.load()) << "a read behind a flush that had not returned was not answered";
  {
    std::lock_guard l(t.m);
    t.released = true;
  }
  t.cv.notify_all();
  flusher.join();
  reader.join();
  EXPECT_EQ(t.flushes.load(), 1);
}

std::string transport_name(const ::testing::TestParamInfo<std::tuple<Completion, bool>>& i) {
  static const char* const kCompletion[] = {"Sync", "Async", "AtOnce", "Polled"};
  return std::string(kCompletion[static_cast<int>(std::get<0>(i.param))]) + (std::get<1>(i.param) ? "Uring" : "DevFuse");
}

INSTANTIATE_TEST_SUITE_P(Transports, FuseDiskTest,
                         ::testing::Combine(::testing::Values(Completion::sync, Completion::async, Completion::at_once, Completion::polled),
                                            ::testing::Bool()),
                         transport_name);

}  // namespace
}  // namespace xpv::frontends
