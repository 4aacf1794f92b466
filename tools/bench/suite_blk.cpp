// xpv bench blk — fio and bonnie++ through the PV block path, next to the same tools on the same
// image file without it, in one run on one machine.
//
// The PV path here is the whole stack of a process domain in this process: Blkfront in a Domain
// (grants, rings, event channels in memfd memory) ↔ the control socket ↔ ForeignDomain +
// GrantMapper + BlkifQueue on io_uring over the image — exactly what xpv-front and xpv-blkback
// run — with the disk exposed as a FUSE file (what `losetup` and the user see).
//   fio:      through the FUSE file (io_uring, O_DIRECT)  vs  the image file (io_uring, O_DIRECT);
//             the FUSE file on FUSE over io_uring where the kernel has it (the fuse module's
//             enable_uring is switched on for the run), and the same PV disk through a second
//             FUSE file on /dev/fuse (extra rows, "PV over /dev/fuse")
//   library:  the same job shapes through the Blkfront API directly (the PV path without FUSE)
//   FUSE:     the same fio jobs through a FUSE file that passes straight to the image (io_uring,
//             started asynchronously like the PV disk's requests), with no PV path: what FUSE
//             costs by itself (reported as extra rows); and through a FUSE file with no storage
//             behind it at all (each request answered on the worker that took it): FUSE's own
//             round trip, the ceiling of any disk exposed through a FUSE file
//   bonnie++: ext4 on a loop device over the FUSE file  vs  ext4 on a loop device over the image
//             (loop with --direct-io=on, bonnie++ -f -D -s 1024: O_DIRECT bulk phases; block read
//             still comes out "+++++" here — the cloud volume serves it from the host's cache)
// Each fio job runs in all six variants back to back before the next job (the volume's speed
// drifts over minutes). 1.5 GiB image, written in full first.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <fmt/core.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "bench/bench.h"
#include "xpv/adaptive_poll.h"
#include "xpv/blkback/io_ring.h"
#include "xpv/blkback/queue.h"
#include "xpv/domain/domain.h"
#include "xpv/domain/foreign_domain.h"
#include "xpv/frontends/blkfront.h"
#include "xpv/frontends/fuse_disk.h"
#include "xpv/frontends/guest_events.h"

namespace xpv::bench {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;

std::string run_capture(const std::string& cmd) {
  auto c = xpv::bench::shell_capture(cmd);
  if (c.rc != 0) throw std::runtime_error("failed (exit " + std::to_string(c.rc) + "): " + cmd);
  return c.out;
}

// A FUSE target that reads and writes the image directly: the FUSE-only baseline. Reads and
// writes start asynchronously on an io_uring of its own, as the PV disk's do on blkfront's rings,
// so that the baseline has the same FUSE worker model as the PV disk: a worker takes a request
// and goes back for the next, and the reply leaves from the completion thread. (A synchronous
// pread/pwrite here would hold a worker per request and measure that, not FUSE.)
class FileTarget : public frontends::BlockTarget {
 public:
  // O_DIRECT like blkback, so the page cache flatters neither side.
  explicit FileTarget(const std::string& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_DIRECT)), ring_(kDepth) {
    if (!fd_) throw std::runtime_error("cannot open " + path);
    size_ = static_cast<std::uint64_t>(::lseek(fd_.get(), 0, SEEK_END));
    completions_ = std::thread([this] { run(); });
  }
  ~FileTarget() override {
    {
      std::lock_guard l(lock_);
      stopping_ = true;
    }
    std::uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
    completions_.join();
    for (void* b : free_) std::free(b);
  }
  std::uint64_t size_bytes() const override { return size_; }
  bool readonly() const override { return false; }
  // FUSE hands over buffers with no particular alignment: each request goes through an aligned
  // buffer, one copy, as the PV path copies into granted pages.
  long read(std::uint64_t off, std::span<std::uint8_t> out) override {
    return wait_for([&](Done& d) { return start_read(off, out, d); });
  }
  long write(std::uint64_t off, std::span<const std::uint8_t> in) override {
    return wait_for([&](Done& d) { return start_write(off, in, d); });
  }
  int flush() override { return ::fdatasync(fd_.get()) == 0 ? 0 : -errno; }
  int discard(std::uint64_t, std::uint64_t) override { return -EOPNOTSUPP; }

  bool start_read(std::uint64_t off, std::span<std::uint8_t> out, Done& done) override {
    return start(false, off, out.data(), out.size(), done);
  }
  bool start_write(std::uint64_t off, std::span<const std::uint8_t> in, Done& done) override {
    return start(true, off, const_cast<std::uint8_t*>(in.data()), in.size(), done);
  }

 private:
  static constexpr unsigned kDepth = 128;           // in flight at most (FUSE allows 64)
  static constexpr std::size_t kMaxIo = 1u << 20;   // FUSE's max_read / max_write
  struct Req {
    Done done;
    std::uint8_t* user = nullptr;  // a read's destination
    void* bounce = nullptr;
    iovec iov{};
    bool write = false;
  };

  template <class Start>
  long wait_for(Start&& start) {
    std::promise<long> p;
    Done d = [&p](long n) { p.set_value(n); };
    if (!start(d)) return -EINVAL;
    return p.get_future().get();
  }

  bool start(bool write, std::uint64_t off, std::uint8_t* data, std::size_t n, Done& done) {
    if (n == 0 || n > kMaxIo || off % 512 != 0 || n % 512 != 0) return false;  // O_DIRECT's rules
    auto r = std::make_unique<Req>();
    r->write = write;
    r->user = data;
    {
      std::lock_guard l(lock_);
      if (stopping_ || ring_.in_flight() >= kDepth) return false;
      if (!free_.empty()) {
        r->bounce = free_.back();
        free_.pop_back();
      }
    }
    if (!r->bounce && ::posix_memalign(&r->bounce, 4096, kMaxIo) != 0) return false;
    if (write) std::memcpy(r->bounce, data, n);
    r->iov = {r->bounce, n};
    r->done = std::move(done);
    std::lock_guard l(lock_);
    const auto user = reinterpret_cast<std::uint64_t>(r.get());
    const bool queued = write ? ring_.writev(fd_.get(), &r->iov, 1, off, user) : ring_.readv(fd_.get(), &r->iov, 1, off, user);
    if (!queued || !ring_.submit()) {
      done = std::move(r->done);  // not started: the caller keeps its callback
      free_.push_back(r->bounce);
      return false;
    }
    (void)r.release();  // the completion thread owns it now
    return true;
  }

  // The completion thread: waits on the ring's eventfd, reaps, replies outside the lock.
  void run() {
    std::vector<std::pair<Req*, int>> batch;
    for (;;) {
      // Spin first, as blkfront's completion threads do (the same adaptive window), so that
      // the baseline pays no more wake-ups per request than the PV disk does. Only this thread
      // reaps, so it may look at the completion queue without the lock.
      if (!poll_.spin([&] { return ring_.completions_ready(); })) {
        pollfd fds[2] = {{ring_.completion_fd(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
        (void)::poll(fds, 2, -1);
        poll_.after_sleep();
      }
      std::uint64_t v;
      (void)!::read(ring_.completion_fd(), &v, sizeof v);
      (void)!::read(wake_.get(), &v, sizeof v);
      batch.clear();
      bool stop = false;
      {
        std::lock_guard l(lock_);
        ring_.reap([&](std::uint64_t user, int res) { batch.emplace_back(reinterpret_cast<Req*>(user), res); });
        stop = stopping_ && ring_.in_flight() == 0;
      }
      for (auto [r, res] : batch) {
        std::unique_ptr<Req> own(r);
        if (res > 0 && !r->write) std::memcpy(r->user, r->bounce, static_cast<std::size_t>(res));
        {
          std::lock_guard l(lock_);
          free_.push_back(r->bounce);
        }
        r->done(res);
      }
      if (stop) return;
    }
  }

  UniqueFd fd_;
  UniqueFd wake_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  std::uint64_t size_ = 0;
  std::mutex lock_;  // ring_, free_, stopping_
  blkback::IoRing ring_;
  std::vector<void*> free_;  // aligned bounce buffers of kMaxIo bytes
  bool stopping_ = false;
  AdaptivePoll poll_{std::chrono::microseconds(100)};  // blkfront's default window
  std::thread completions_;
};

// A FUSE target with no storage behind it: reads are zeros, writes go nowhere, each answered on
// the FUSE worker that took it. What is left is FUSE's own round trip (the kernel, the transport,
// libfuse's decoding and reply): the most any disk exposed through a FUSE file could do here.
class NoStorageTarget : public frontends::BlockTarget {
 public:
  explicit NoStorageTarget(std::uint64_t size) : size_(size) {}
  std::uint64_t size_bytes() const override { return size_; }
  bool readonly() const override { return false; }
  long read(std::uint64_t, std::span<std::uint8_t> out) override {
    std::memset(out.data(), 0, out.size());
    return static_cast<long>(out.size());
  }
  long write(std::uint64_t, std::span<const std::uint8_t> in) override { return static_cast<long>(in.size()); }
  int flush() override { return 0; }
  int discard(std::uint64_t, std::uint64_t) override { return 0; }
  bool start_read(std::uint64_t off, std::span<std::uint8_t> out, Done& done) override {
    done(read(off, out));
    return true;
  }
  bool start_write(std::uint64_t off, std::span<const std::uint8_t> in, Done& done) override {
    done(write(off, in));
    return true;
  }

 private:
  std::uint64_t size_;
};

// blkif queues (rings) of the PV disk: fio runs one job, but FUSE serves it from several worker
// threads and the library rows use qd threads; Blkfront gives each calling thread its queue, so
// with 2 rings the PV path is measured multi-queue (xpv-front uses one per vCPU, up to the
// backend's multi-queue-max-queues). Each ring has its own BlkifQueue thread, as in xpv-blkback.
constexpr std::uint32_t kPvQueues = 2;

// The PV stack of one process domain with one disk, in this process.
class PvDisk {
 public:
  PvDisk(const std::string& dir, const std::string& image) {
    domain::DomainConfig cfg;
    cfg.domid = 7;
    cfg.name = "bench";
    cfg.memory_bytes = 192 << 20;
    cfg.run_dir = dir + "/run";
    domain_ = std::make_unique<domain::Domain>(io_, cfg, sink_);
    events_ = std::make_unique<frontends::GuestEvents>(domain_->pages(domain::Domain::kSharedInfoGfn, 1));
    events_->enable_direct_upcalls(*domain_);  // as xpv-front does
    sink_.target = events_.get();
    io_thread_ = std::thread([this] { io_.run(); });
    events_thread_ = std::thread([this] { events_->run(); });
    frontends::BlkfrontConfig f;
    f.indirect_segments = 256;
    f.queues = kPvQueues;
    f.completion_threads = true;  // FUSE's reads and writes start asynchronously
    front_ = std::make_unique<frontends::Blkfront>(*domain_, *events_, f);
    disk_ = std::make_unique<blkback::Disk>(blkback::Disk::open(image, false));
    foreign_ = std::make_unique<domain::ForeignDomain>(domain::ForeignDomain::connect(7, "bench", cfg.run_dir));
    for (std::uint32_t i = 0; i < front_->queues(); ++i) {
      // One GrantMapper per data-plane thread (mapper.h: a mapper has no lock), as
      // xpv-blkback has one per queue.
      mappers_.push_back(foreign_->make_mapper());
      auto ring_map = mappers_.back()->map(front_->ring_refs(i).at(0), false);
      if (!ring_map) throw std::runtime_error("cannot map the ring");
      auto back = ring::BlkifBackRing::attach(ring_map->writable());
      if (!back) throw std::runtime_error("cannot attach the ring");
      blkback::QueueConfig q;
      q.max_indirect_segments = 256;
      queues_.push_back(std::make_unique<blkback::BlkifQueue>("bench." + std::to_string(i), *disk_, *mappers_.back(),
                                                              std::move(*back), foreign_->bind(front_->event_channel(i)), q));
    }
    // Threads only once nothing above can throw (a throwing constructor joins nothing).
    for (std::size_t i = 0; i < queues_.size(); ++i) queue_threads_.emplace_back([this, i] { queues_[i]->run(); });
    front_->connect({disk_->info().sectors, false, true, disk_->info().discard});
  }
  ~PvDisk() {
    for (auto& q : queues_) q->stop();
    for (auto& t : queue_threads_) t.join();
    queues_.clear();
    mappers_.clear();
    foreign_.reset();
    front_.reset();
    events_->stop();
    events_thread_.join();
    std::promise<void> done;
    asio::post(io_, [&] {
      domain_.reset();
      done.set_value();
    });
    done.get_future().wait();
    work_.reset();
    io_.stop();
    io_thread_.join();
  }
  frontends::Blkfront& front() { return *front_; }

 private:
  struct Sink : domain::UpcallSink {
    void upcall(unsigned v) noexcept override {
      if (target) target->upcall(v);
    }
    frontends::GuestEvents* target = nullptr;
  };
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  Sink sink_;
  std::unique_ptr<domain::Domain> domain_;
  std::unique_ptr<frontends::GuestEvents> events_;
  std::unique_ptr<frontends::Blkfront> front_;
  std::unique_ptr<blkback::Disk> disk_;
  std::unique_ptr<domain::ForeignDomain> foreign_;
  std::vector<std::unique_ptr<gnttab::GrantMapper>> mappers_;  // one per queue
  std::vector<std::unique_ptr<blkback::BlkifQueue>> queues_;
  std::vector<std::thread> queue_threads_;
  std::thread io_thread_, events_thread_;
};

struct FioJob {
  const char* metric;
  const char* rw;
  const char* bs;
  int qd;
};
constexpr FioJob kJobs[] = {
    {"fio 4k randread qd1", "randread", "4k", 1},   {"fio 4k randread qd32", "randread", "4k", 32},
    {"fio 4k randwrite qd32", "randwrite", "4k", 32}, {"fio 1m read qd8", "read", "1m", 8},
    {"fio 1m write qd8", "write", "1m", 8},
};

// Runs one fio job on `file`; returns IOPS for 4k jobs, MB/s for 1m jobs.
double fio(const FioJob& j, const std::string& file, int seconds) {
  const std::string cmd = fmt::format(
      "fio --name=xpv --filename={} --ioengine=io_uring --direct=1 --rw={} --bs={} --iodepth={} "
      "--runtime={} --time_based --numjobs=1 --size=192M --randrepeat=1 --norandommap "
      "--output-format=json 2>/dev/null",
      file, j.rw, j.bs, j.qd, seconds);
  auto out = nlohmann::json::parse(run_capture(cmd));
  const auto& job = out.at("jobs").at(0);
  const auto& side = std::string(j.rw).find("write") != std::string::npos ? job.at("write") : job.at("read");
  if (std::string(j.bs) == "4k") return side.at("iops").get<double>();
  return side.at("bw_bytes").get<double>() / 1e6;
}

// bonnie++ on ext4 over a loop device over `file`: {block write, block read, rewrite} in MB/s.
std::array<double, 3> bonnie(const std::string& file, const std::string& mnt) {
  // Direct I/O all the way down: the loop device reads and writes its file with O_DIRECT, and
  // bonnie++ -D uses O_DIRECT for its bulk phases, so neither side's page cache answers (with 24
  // GiB of RAM and small sizes every phase was "+++++" otherwise).
  std::string loop = run_capture("losetup --direct-io=on --find --show " + file);
  while (!loop.empty() && loop.back() == '\n') loop.pop_back();
  struct Cleanup {
    std::string loop, mnt;
    ~Cleanup() {
      (void)!std::system(("umount " + mnt + " 2>/dev/null").c_str());
      (void)!std::system(("losetup -d " + loop + " 2>/dev/null").c_str());
    }
  } cleanup{loop, mnt};
  run_capture("mkfs.ext4 -q -F " + loop + " 2>&1");
  fs::create_directories(mnt);
  run_capture("mount " + loop + " " + mnt);
  // -s 1 GiB with -r 512 (bonnie++ wants size >= 2x RAM it is told about; smaller files were read
  // in under the 0.5 s bonnie++ times at O_DIRECT speed → "+++++"); no small-file test,
  // no per-character phases (-f; the metrics are the block ones); -D: O_DIRECT.
  const std::string csv = run_capture("bonnie++ -q -f -D -d " + mnt + " -s 1024 -r 512 -n 0 -u root 2>/dev/null");
  // CSV format 1.98: format, version, name, concurrency, seed, size, chunk size, seeks,
  // seek processes, putc, putc %cpu, block write (11), %cpu, rewrite (13), %cpu, getc, %cpu,
  // block read (17), ... in K/s; "+++++" where a phase was too quick to measure.
  std::string line = csv.substr(0, csv.find('\n'));
  std::vector<std::string> f;
  std::stringstream ss(line);
  for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
  auto kps = [&](std::size_t i) {
    // Too quick to measure ("+++++") or missing: no number (null in the JSON).
    if (i >= f.size() || f[i].empty() || f[i].find('+') != std::string::npos) return std::numeric_limits<double>::quiet_NaN();
    return std::stod(f[i]) / 1000.0;  // K/s → MB/s
  };
  return {kps(11), kps(17), kps(13)};
}

// The same job shapes through the Blkfront library API directly (no FUSE), as a guest's blk-mq
// drives blkfront: `qd` requests in flight in all, spread over the queues (qd 1 uses one); each
// request, when its completion thread (one per queue, as an interrupt handler) runs its callback,
// starts the next one of its chain, for `seconds`. Returns IOPS (4k) or MB/s (1m), timed on the
// host clock.
double library(frontends::Blkfront& front, const FioJob& j, int seconds) {
  const std::uint64_t bs = std::string(j.bs) == "4k" ? 4096 : (1 << 20);
  if (bs > front.max_io_bytes()) throw std::runtime_error("bench blk: the PV disk takes less than one job's block per request");
  const bool write = std::string(j.rw).find("write") != std::string::npos;
  const bool random = std::string(j.rw).find("rand") != std::string::npos;
  const std::uint64_t span = 192ull << 20;  // as fio's --size
  const auto queues = std::min<std::uint32_t>(front.queues(), static_cast<std::uint32_t>(j.qd));
  // One chain per request in flight; a chain's state is touched by one thread at a time (its
  // start happens before its callback).
  struct Chain {
    std::uint32_t queue = 0;
    std::vector<std::uint8_t> buf;
    std::uint64_t x = 0, seq = 0;
  };
  std::vector<Chain> chains(static_cast<std::size_t>(j.qd));
  std::atomic<std::uint64_t> ops{0};
  std::atomic<int> live{0};
  std::atomic<bool> stop{false}, failed{false};
  std::function<void(Chain&)> start_one = [&](Chain& c) {
    std::uint64_t off;
    if (random) {
      c.x ^= c.x << 13, c.x ^= c.x >> 7, c.x ^= c.x << 17;
      off = (c.x % (span / bs)) * bs;
    } else {
      off = c.seq % span;
      c.seq += bs;
    }
    const int rc = front.start(c.queue, write, off, c.buf, [&, cp = &c](int r) {
      if (r != 0) failed = true;
      ops.fetch_add(1, std::memory_order_relaxed);
      if (stop.load(std::memory_order_relaxed) || failed.load(std::memory_order_relaxed)) {
        live.fetch_sub(1);
      } else {
        start_one(*cp);
      }
    });
    if (rc != 0) {
      failed = true;
      live.fetch_sub(1);
    }
  };
  const auto t0 = Clock::now();
  for (std::size_t k = 0; k < chains.size(); ++k) {
    Chain& c = chains[k];
    c.queue = static_cast<std::uint32_t>(k % queues);
    c.buf.assign(bs, static_cast<std::uint8_t>(k));
    c.x = 0x9e3779b97f4a7c15ull * (k + 1);
    c.seq = k * (span / chains.size()) / bs * bs;
    live.fetch_add(1);
    start_one(c);
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop = true;
  // Bounded: every chain ends with its request in flight answered.
  for (int i = 0; i < 10000 && live.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (live.load() > 0) throw std::runtime_error("bench blk: library-path requests still unanswered after 10 s");
  const double secs = seconds_since(t0);
  if (failed) throw std::runtime_error("a library-path I/O failed");
  const double n = static_cast<double>(ops.load());
  return bs == 4096 ? n / secs : n * static_cast<double>(bs) / secs / 1e6;
}

std::vector<Result> run_blk(const Options& opt) {
  if (::geteuid() != 0) throw std::runtime_error("xpv bench blk needs root (FUSE, loop devices)");
  const int seconds = std::max(1, static_cast<int>(5 * opt.scale + 0.5));
  char tmpl[] = "/var/tmp/xpv-bench-blk-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  const std::string dir = tmpl;
  struct RmDir {
    std::string d;
    ~RmDir() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } rm{dir};
  const std::string image = dir + "/disk.img";
  // Written once in full: reads of unwritten extents would cost no I/O and flatter the reference.
  run_capture("dd if=/dev/zero of=" + image + " bs=1M count=1536 oflag=direct status=none");

  std::vector<Result> results;
  std::vector<double> ref, pv, pv_dev, fuse_only, fuse_null, lib;
  std::array<double, 3> bonnie_pv{}, bonnie_ref{};
  std::string transport;  // what carried the main rows' FUSE requests
  std::string fuse_only_transport, fuse_null_transport;  // and the FUSE-alone and no-storage rows'
  {
    // FUSE over io_uring where the kernel has it (Linux ≥ 6.14): the fuse module's enable_uring
    // is switched on for the run (and back off after, if it was off), so that the FUSE files
    // below are offered it; the PV disk is also measured over /dev/fuse, side by side.
    std::optional<frontends::FuseUringEnable> uring_on;
    if (frontends::FuseUringEnable::available()) uring_on.emplace();
    // Every variant of one job runs back to back (image, FUSE alone, PV through FUSE, PV
    // library), job after job: the disk under /var/tmp is a cloud volume whose speed drifts by
    // tens of percent over minutes, and a reference measured minutes before its counterpart
    // would carry that drift into the ratio.
    FileTarget t(image);
    fs::create_directories(dir + "/fuse-only");
    frontends::FuseDisk fuse_only_disk(dir + "/fuse-only", "disk", t);
    NoStorageTarget nothing(t.size_bytes());
    fs::create_directories(dir + "/fuse-null");
    frontends::FuseDisk fuse_null_disk(dir + "/fuse-null", "disk", nothing);
    PvDisk d(dir, image);
    fs::create_directories(dir + "/fuse");
    frontends::FuseDisk pv_disk(dir + "/fuse", "xvda", d.front());
    fs::create_directories(dir + "/fuse-dev");
    frontends::FuseDiskOptions dev_only;
    dev_only.uring = false;
    frontends::FuseDisk pv_dev_disk(dir + "/fuse-dev", "xvda", d.front(), dev_only);
    for (const auto& j : kJobs) {
      ref.push_back(fio(j, image, seconds));
      fuse_only.push_back(fio(j, fuse_only_disk.file_path(), seconds));
      fuse_null.push_back(fio(j, fuse_null_disk.file_path(), seconds));
      pv.push_back(fio(j, pv_disk.file_path(), seconds));
      pv_dev.push_back(fio(j, pv_dev_disk.file_path(), seconds));
      lib.push_back(library(d.front(), j, seconds));
    }
    auto transport_of = [&](const frontends::FuseDisk& f) -> std::string {
      if (f.uring_active()) return fmt::format("FUSE over io_uring, {} requests through the rings", f.uring_requests());
      if (uring_on) return "/dev/fuse: the kernel offered FUSE over io_uring but xpv's rings were not set up (its log says why)";
      return "/dev/fuse: this kernel has no FUSE over io_uring";
    };
    transport = transport_of(pv_disk);
    fuse_only_transport = transport_of(fuse_only_disk);
    fuse_null_transport = transport_of(fuse_null_disk);
    if (opt.scale >= 1.0) {
      bonnie_ref = bonnie(image, dir + "/mnt");
      bonnie_pv = bonnie(pv_disk.file_path(), dir + "/mnt");
    }
  }

  for (std::size_t i = 0; i < std::size(kJobs); ++i) {
    const bool iops = std::string(kJobs[i].bs) == "4k";
    results.push_back({kJobs[i].metric, iops ? "IOPS" : "MB/s", pv[i], ref[i],
                       "xpv: fio io_uring O_DIRECT on the PV disk's FUSE file (2 blkif queues; " + transport +
                           "); reference: the same on the image file"});
  }
  for (std::size_t i = 0; i < std::size(kJobs); ++i) {
    const bool iops = std::string(kJobs[i].bs) == "4k";
    results.push_back({std::string(kJobs[i].metric) + " (PV over /dev/fuse)", iops ? "IOPS" : "MB/s", pv_dev[i], ref[i],
                       "the same PV disk through a second FUSE file that reads and writes /dev/fuse (libfuse's own "
                       "transport, worker threads); reference: fio on the image"});
  }
  for (std::size_t i = 0; i < std::size(kJobs); ++i) {
    const bool iops = std::string(kJobs[i].bs) == "4k";
    results.push_back({"library" + std::string(kJobs[i].metric).substr(3) + " (Blkfront API, no FUSE)", iops ? "IOPS" : "MB/s", lib[i], ref[i],
                       "the same shape through the Blkfront API (2 blkif queues): qd requests in flight, each completion (a thread per queue) starting the next; reference: fio on the image"});
  }
  for (std::size_t i = 0; i < std::size(kJobs); ++i) {
    const bool iops = std::string(kJobs[i].bs) == "4k";
    results.push_back({std::string(kJobs[i].metric) + " (FUSE alone)", iops ? "IOPS" : "MB/s", fuse_only[i], ref[i],
                       "a FUSE file passing straight to the image (io_uring O_DIRECT, started asynchronously as the PV "
                       "disk's are), no PV path: what FUSE costs by itself (" + fuse_only_transport + ")"});
  }
  for (std::size_t i = 0; i < std::size(kJobs); ++i) {
    const bool iops = std::string(kJobs[i].bs) == "4k";
    results.push_back({std::string(kJobs[i].metric) + " (FUSE, no storage)", iops ? "IOPS" : "MB/s", fuse_null[i], ref[i],
                       "a FUSE file with nothing behind it (zeros read, writes dropped, each answered on the worker "
                       "that took it): FUSE's own round trip, the most a disk behind a FUSE file could do (" +
                           fuse_null_transport + "); reference: fio on the image"});
  }
  if (opt.scale >= 1.0) {
    const char* names[] = {"bonnie++ block write", "bonnie++ block read", "bonnie++ rewrite"};
    for (int i = 0; i < 3; ++i) {
      results.push_back({names[i], "MB/s", bonnie_pv[i], bonnie_ref[i],
                         "ext4 on loop over the PV disk's FUSE file vs ext4 on loop over the image"});
    }
  } else {
    results.push_back({"bonnie++ block write", "MB/s", std::numeric_limits<double>::quiet_NaN(), std::nullopt,
                       "skipped under --quick"});
  }
  return results;
}

XPV_BENCH_SUITE("blk", "fio + bonnie++ through the PV block path (FUSE file) vs the same on the image file", run_blk);

}  // namespace
}  // namespace xpv::bench
