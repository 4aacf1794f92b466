// blkback_order_bench — throughput of the whole in-process PV block path (Domain + Blkfront ↔
// ForeignDomain + GrantMapper + BlkifQueue on io_uring over an image file), the workload of
// tests/integration/blk-path at a measurable size. Built against the BlkifQueue of a given
// commit it answers one question: what do in-order responses (the restart design, queue.h)
// cost? Run it on the commit before and after and compare (backends/README.md has the figures).
//
//   blkback_order_bench [DIR] [THREADS]   (image in DIR, default /var/tmp; 8 caller threads)
// Prints one line per workload: MB/s and IOPS, best of 3 runs, host steady_clock.
#include <fcntl.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <thread>

#include "xpv/blkback/queue.h"
#include "xpv/domain/domain.h"
#include "xpv/domain/foreign_domain.h"
#include "xpv/frontends/blkfront.h"
#include "xpv/frontends/guest_events.h"

namespace asio = boost::asio;
using namespace xpv;

namespace {
// `held` exists only where BlkifQueue answers in order; 0 (not counted) elsewhere.
template <class C>
auto held_of(const C& c, int) -> decltype(c.held.load()) {
  return c.held.load();
}
template <class C>
std::uint64_t held_of(const C&, long) {
  return 0;
}

struct Sink : domain::UpcallSink {
  void upcall(unsigned v) noexcept override {
    if (target) target->upcall(v);
  }
  frontends::GuestEvents* target = nullptr;
};
}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/var/tmp";
  const unsigned threads = argc > 2 ? static_cast<unsigned>(std::stoul(argv[2])) : 8;
  const std::string base = dir + "/xpv-order-bench-" + std::to_string(::getpid());
  std::filesystem::create_directories(base + "/run");
  const std::string image = base + "/disk.img";
  constexpr std::uint64_t kImage = 256ull << 20;
  {
    std::ofstream f(image);
  }
  std::filesystem::resize_file(image, kImage);
  {
    // Allocate the blocks so that reads hit real extents, not holes.
    std::vector<char> buf(1 << 20, 'x');
    int fd = ::open(image.c_str(), O_WRONLY);
    for (std::uint64_t o = 0; o < kImage; o += buf.size()) (void)!::pwrite(fd, buf.data(), buf.size(), static_cast<off_t>(o));
    ::fsync(fd);
    ::close(fd);
  }

  asio::io_context io;
  auto work = asio::make_work_guard(io);
  Sink sink;
  domain::DomainConfig cfg;
  cfg.domid = 3;
  cfg.name = "bench";
  cfg.memory_bytes = 256 << 20;
  cfg.run_dir = base + "/run";
  auto dom = std::make_unique<domain::Domain>(io, cfg, sink);
  frontends::GuestEvents events(dom->pages(domain::Domain::kSharedInfoGfn, 1));
  sink.target = &events;
  std::thread io_thread([&] { io.run(); });
  std::thread ev_thread([&] { events.run(); });
  frontends::BlkfrontConfig fcfg;
  fcfg.indirect_segments = 32;
  auto front = std::make_unique<frontends::Blkfront>(*dom, events, fcfg);

  auto disk = std::make_unique<blkback::Disk>(blkback::Disk::open(image, false));
  auto foreign = std::make_unique<domain::ForeignDomain>(domain::ForeignDomain::connect(3, "bench", cfg.run_dir));
  auto mapper = foreign->make_mapper();
  auto ring_map = mapper->map(front->ring_refs().at(0), false);
  auto back = ring::BlkifBackRing::attach(ring_map->writable());
  blkback::QueueConfig qcfg;
  qcfg.max_indirect_segments = 32;
  auto queue = std::make_unique<blkback::BlkifQueue>("bench", *disk, *mapper, std::move(*back),
                                                     foreign->bind(front->event_channel()), qcfg);
  std::thread qt([&] { queue->run(); });
  front->connect({disk->info().sectors, false, true, disk->info().discard});

  auto run = [&](const char* what, std::size_t block, std::uint64_t per_thread, bool write) {
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          std::mt19937_64 rng(t * 7919 + rep);
          std::vector<std::uint8_t> buf(block, static_cast<std::uint8_t>(t));
          for (std::uint64_t i = 0; i < per_thread; ++i) {
            const std::uint64_t off = (rng() % (kImage / block)) * block;
            const long r = write ? front->write(off, buf) : front->read(off, buf);
            if (r != static_cast<long>(block)) std::abort();
          }
        });
      }
      for (auto& t : ts) t.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, double(per_thread) * threads / s);
    }
    std::printf("%-22s %10.0f IOPS %9.1f MB/s\n", what, best, best * double(block) / 1e6);
  };
  std::printf("image %s (%s), %u caller threads, best of 3\n", image.c_str(),
              disk->info().direct ? "O_DIRECT" : "buffered", threads);
  run("4k randread", 4096, 4000, false);
  run("4k randwrite", 4096, 2000, true);
  run("128k randread", 128 << 10, 500, false);
  run("128k randwrite", 128 << 10, 300, true);
  std::printf("responses held for order: %llu of %llu requests\n",
              static_cast<unsigned long long>(held_of(queue->counters(), 0)),
              static_cast<unsigned long long>(queue->counters().requests.load()));

  queue->stop();
  qt.join();
  queue.reset();
  mapper.reset();
  foreign.reset();
  front.reset();
  events.stop();
  ev_thread.join();
  std::promise<void> p;
  asio::post(io, [&] {
    dom.reset();
    p.set_value();
  });
  p.get_future().wait();
  work.reset();
  io.stop();
  io_thread.join();
  std::filesystem::remove_all(base);
  return 0;
}
