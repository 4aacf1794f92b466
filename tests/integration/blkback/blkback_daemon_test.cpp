// xpv-blkback end to end, as processes: a real xpv-xenstored on a temporary socket and a real
// xpv-blkback on a temporary run dir. The test process is the toolstack (it writes the vbd nodes
// of docs/PROCESS-DOMAINS.md through SyncClient as dom0) and the domains: a process Domain with
// GuestEvents and xpv's Blkfront, whose xenbus steps are done here by hand, or a raw frontend
// that builds its rings itself (scattered multi-page rings, several queues, garbage indexes).
// Every wait is bounded; processes, temp dirs and domains are cleaned up also on failure.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "xpv/domain/domain.h"
#include "xpv/frontends/blkfront.h"
#include "xpv/frontends/fuse_disk.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/ring/blkif.h"
#include "xpv/test/loop_device.h"
#include "xpv/xenbus/client/sync_client.h"
#include "blkback_rig.h"
#include "xpv/xenbus/daemon/backend_main.h"
#include "xpv/test/thread_names.h"

extern char** environ;

namespace xpv {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using frontends::Blkfront;
using xenbus::client::SyncClient;

constexpr std::uint32_t kXvda = 51712, kXvdb = 51728, kXvdc = 51744;

using test::blkrig::Child;
using test::blkrig::Guest;
using test::blkrig::RawFront;

class BlkbackDaemon : public ::testing::Test, protected test::blkrig::BlkbackRig {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (domain control sockets, io_uring on images)";
    start();
  }
  void TearDown() override { stop(HasFailure()); }
};

std::vector<std::uint8_t> random_bytes(std::size_t n, unsigned seed) {
  std::vector<std::uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::uint8_t>(rng());
  return v;
}

std::uint64_t checksum(std::span<const std::uint8_t> d) {  // FNV-1a
  std::uint64_t h = 1469598103934665603ull;
  for (auto b : d) h = (h ^ b) * 1099511628211ull;
  return h;
}

TEST_F(BlkbackDaemon, ConnectsABlkfrontAndRoundTripsChecksummedData) {
  const auto img = image("a.img");
  Guest& g = guest(3);
  add_vbd(3, kXvda, img, "w");
  connect_blkfront(g, kXvda);
  EXPECT_EQ(xs_->read(be(3, kXvda) + "/sectors").value_or(""), std::to_string((64 << 20) / 512));
  EXPECT_EQ(xs_->read(be(3, kXvda) + "/info").value_or(""), "0");
  EXPECT_EQ(xs_->read(be(3, kXvda) + "/sector-size").value_or(""), "512");
  const auto data = random_bytes(4 << 20, 11);
  ASSERT_EQ(g.front->write(1 << 20, data), static_cast<long>(data.size()));
  ASSERT_EQ(g.front->flush(), 0);
  std::vector<std::uint8_t> back(data.size());
  ASSERT_EQ(g.front->read(1 << 20, back), static_cast<long>(back.size()));
  EXPECT_EQ(checksum(back), checksum(data));
  const std::string on_disk = image_bytes(img, 1 << 20, data.size());
  EXPECT_EQ(checksum(std::span(reinterpret_cast<const std::uint8_t*>(on_disk.data()), on_disk.size())), checksum(data));
  EXPECT_FALSE(g.front->broken());
}

TEST_F(BlkbackDaemon, MultiPageRingWithIndirectSegments) {
  const auto img = image("a.img");
  Guest& g = guest(3);
  add_vbd(3, kXvda, img, "w");
  frontends::BlkfrontConfig cfg;
  cfg.ring_page_order = 2;
  cfg.indirect_segments = 64;
  connect_blkfront(g, kXvda, cfg);
  const auto data = random_bytes(1 << 20, 12);
  const auto before = g.front->stats().requests;
  ASSERT_EQ(g.front->write(0, data), static_cast<long>(data.size()));
  EXPECT_EQ(g.front->stats().requests - before, 4u) << "256 KiB per indirect request";
  std::vector<std::uint8_t> back(data.size());
  ASSERT_EQ(g.front->read(0, back), static_cast<long>(back.size()));
  EXPECT_EQ(back, data);
}

TEST_F(BlkbackDaemon, AMultiQueueBlkfrontIsServedOnEveryQueue) {
  // xpv's Blkfront with 3 queues of order-1 rings against the real daemon (which offers 4):
  // three threads (consecutive threads land on different queues) write their own regions; every
  // queue carried requests and got them answered; the data is in the image.
  const auto img = image("a.img");
  Guest& g = guest(3);
  add_vbd(3, kXvda, img, "w");
  frontends::BlkfrontConfig cfg;
  cfg.queues = 3;
  cfg.ring_page_order = 1;
  connect_blkfront(g, kXvda, cfg);
  ASSERT_EQ(g.front->queues(), 3u);
  std::vector<std::vector<std::uint8_t>> data;
  for (unsigned t = 0; t < 3; ++t) data.push_back(random_bytes(1 << 20, 20 + t));
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < 3; ++t) {
    ts.emplace_back([&, t] {
      if (g.front->write((t + 1) << 20, data[t]) != static_cast<long>(data[t].size())) ++failures;
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_EQ(failures.load(), 0);
  ASSERT_EQ(g.front->flush(), 0);
  for (std::uint32_t q = 0; q < 3; ++q) {
    const auto st = g.front->queue_stats(q);
    EXPECT_GE(st.requests, 1u) << "queue " << q;
    EXPECT_EQ(st.responses, st.requests) << "queue " << q;
  }
  // One named data-plane thread per queue, as top -H shows them.
  const auto names = test::thread_names(blkback_->pid());
  for (const char* t : {"vbd3.51712-q0", "vbd3.51712-q1", "vbd3.51712-q2"}) EXPECT_EQ(names.count(t), 1u) << t;
  for (unsigned t = 0; t < 3; ++t) {
    const std::string on_disk = image_bytes(img, (t + 1) << 20, data[t].size());
    EXPECT_EQ(checksum(std::span(reinterpret_cast<const std::uint8_t*>(on_disk.data()), on_disk.size())), checksum(data[t]))
        << "thread " << t;
  }
  EXPECT_FALSE(g.front->broken());
}

TEST_F(BlkbackDaemon, ScatteredMultiPageRingsOnSeveralQueues) {
  const auto img = image("a.img");
  Guest& g = guest(4);
  add_vbd(4, kXvda, img, "w");
  RawFront raw(*g.dom, 3, 1);
  connect_raw(g, kXvda, raw, 1);
  for (unsigned q = 0; q < 3; ++q) {
    std::memset(raw.data(q).data(), 'a' + static_cast<int>(q), 4096);
    EXPECT_EQ(raw.io(q, true, 8 * q), ring::kBlkifRspOkay) << "queue " << q;
  }
  for (unsigned q = 0; q < 3; ++q) EXPECT_EQ(image_bytes(img, 4096 * q + 4095, 1), std::string(1, static_cast<char>('a' + q)));
  std::memset(raw.data(1).data(), 0, 4096);
  EXPECT_EQ(raw.io(1, false, 16), ring::kBlkifRspOkay);
  EXPECT_EQ(raw.data(1)[100], 'c');
}

TEST_F(BlkbackDaemon, ARestartReattachesScatteredRingsOfEveryQueue) {
  const auto img = image("a.img");
  Guest& g = guest(4);
  add_vbd(4, kXvda, img, "w");
  RawFront raw(*g.dom, 2, 1);
  connect_raw(g, kXvda, raw, 1);
  std::memset(raw.data(0).data(), 'x', 4096);
  ASSERT_EQ(raw.io(0, true, 0), ring::kBlkifRspOkay);
  blkback_->kill(SIGKILL);
  EXPECT_EQ(blkback_->wait(10s), 128 + SIGKILL);
  start_blkback();
  for (unsigned q = 0; q < 2; ++q) {
    std::memset(raw.data(q).data(), 'm' + static_cast<int>(q), 4096);
    EXPECT_EQ(raw.io(q, true, 8 + 8 * q), ring::kBlkifRspOkay) << "queue " << q;
    EXPECT_EQ(image_bytes(img, 4096 * (q + 1), 1), std::string(1, static_cast<char>('m' + q)));
  }
  EXPECT_NE(log().find("vbd4.51712: reconnected to 2 queue(s)"), std::string::npos);
  EXPECT_EQ(xs_->read(be(4, kXvda) + "/state").value_or(""), "4");
}

TEST_F(BlkbackDaemon, AReadOnlyDiskRefusesWrites) {
  const auto img = image("ro.img");
  Guest& g = guest(3);
  add_vbd(3, kXvda, img, "r");
  connect_blkfront(g, kXvda, {}, /*lie_rw=*/true);  // the frontend ignores info and writes anyway
  EXPECT_EQ(xs_->read(be(3, kXvda) + "/info").value_or(""), "4");
  std::vector<std::uint8_t> ones(4096, 1);
  EXPECT_EQ(g.front->write(0, ones), -EIO);
  EXPECT_EQ(image_bytes(img, 0, 1), std::string(1, '\0'));
  std::vector<std::uint8_t> back(4096, 7);
  EXPECT_EQ(g.front->read(0, back), 4096);
  EXPECT_EQ(back[0], 0);
  EXPECT_EQ(xs_->read(be(3, kXvda) + "/state").value_or(""), "4") << "a refused write is not a protocol violation";
}

TEST_F(BlkbackDaemon, AMissingImageIsReportedAndTheDaemonKeepsServing) {
  Guest& g = guest(3);
  add_vbd(3, kXvdb, dir_ + "/no-such.img", "w");
  EXPECT_EQ(wait_value(be(3, kXvdb) + "/state", "6"), "6");
  EXPECT_NE(xs_->read(be(3, kXvdb) + "/error").value_or("").find("no-such.img"), std::string::npos);
  const auto img = image("a.img");
  add_vbd(3, kXvda, img, "w");
  connect_blkfront(g, kXvda);
  std::vector<std::uint8_t> d(4096, 9);
  EXPECT_EQ(g.front->write(0, d), 4096);
  // The guest shuts down: the failed device's frontend goes Closing and gets the Closing it waits
  // for (until session 46 the error kept the backend silent, and Linux's frontend waited out its
  // timeout), then Closed, and the backend with it.
  ASSERT_TRUE(xs_->write(fe(3, kXvdb) + "/state", "5"));
  EXPECT_EQ(wait_value(be(3, kXvdb) + "/state", "5"), "5");
  ASSERT_TRUE(xs_->write(fe(3, kXvdb) + "/state", "6"));
  EXPECT_EQ(wait_value(be(3, kXvdb) + "/state", "6"), "6");
  // A frontend that was Closing after an error and starts over without the backend seeing its
  // Closed (a reset, or Closed and Initialising between two reads) gets the device offered
  // again — here its image exists by then. Before, the error's gate waited for a Closed that
  // had come and gone, and both ends stayed where they were.
  add_vbd(3, kXvdc, dir_ + "/late.img", "w");
  EXPECT_EQ(wait_value(be(3, kXvdc) + "/state", "6"), "6");
  ASSERT_TRUE(xs_->write(fe(3, kXvdc) + "/state", "5"));
  EXPECT_EQ(wait_value(be(3, kXvdc) + "/state", "5"), "5");
  image("late.img");
  ASSERT_TRUE(xs_->write(fe(3, kXvdc) + "/state", "1"));
  EXPECT_EQ(wait_value(be(3, kXvdc) + "/state", "2"), "2") << log();
}

TEST_F(BlkbackDaemon, AGarbageRingDisablesOnlyThatDevice) {
  Guest& good = guest_with_disk(3, kXvda, "a.img");
  Guest& bad = guest_with_disk(4, kXvda, "b.img");
  connect_blkfront(good, kXvda);
  RawFront raw(*bad.dom, 1, 0);
  connect_raw(bad, kXvda, raw, 0);
  EXPECT_EQ(raw.io(0, true, 0), ring::kBlkifRspOkay);
  // The bad guest claims 1000 requests on a 32-slot ring and kicks.
  auto* req_prod = reinterpret_cast<std::uint32_t*>(raw.ring_bytes(0).data());
  std::atomic_ref<std::uint32_t>(*req_prod).fetch_add(1000);
  ASSERT_TRUE(bad.dom->evtchn().send(raw.port(0)));
  EXPECT_EQ(wait_value(be(4, kXvda) + "/state", "5"), "5");
  EXPECT_NE(xs_->read(be(4, kXvda) + "/error").value_or("").find("protocol violation"), std::string::npos);
  // The other domain's device, and the daemon, keep working.
  const auto data = random_bytes(256 << 10, 13);
  ASSERT_EQ(good.front->write(0, data), static_cast<long>(data.size()));
  std::vector<std::uint8_t> back(data.size());
  ASSERT_EQ(good.front->read(0, back), static_cast<long>(back.size()));
  EXPECT_EQ(back, data);
  EXPECT_EQ(xs_->read(be(3, kXvda) + "/state").value_or(""), "4");
  EXPECT_FALSE(bad.dom->grants().is_mapped(raw.refs(0)[0])) << "the disabled device's ring was unmapped";
}

TEST_F(BlkbackDaemon, FrontendCloseStopsTheQueuesAndClosesTheBackend) {
  const auto img = image("a.img");
  Guest& g = guest(3);
  add_vbd(3, kXvda, img, "w");
  connect_blkfront(g, kXvda);
  std::vector<std::uint8_t> d(4096, 5);
  ASSERT_EQ(g.front->write(0, d), 4096);
  const auto ring_ref = g.front->ring_refs()[0];
  EXPECT_TRUE(g.dom->grants().is_mapped(ring_ref));
  ASSERT_TRUE(xs_->write(fe(3, kXvda) + "/state", "5"));
  EXPECT_EQ(wait_value(be(3, kXvda) + "/state", "5"), "5");
  ASSERT_TRUE(xs_->write(fe(3, kXvda) + "/state", "6"));
  EXPECT_EQ(wait_value(be(3, kXvda) + "/state", "6"), "6");
  EXPECT_FALSE(g.dom->grants().is_mapped(ring_ref)) << "queues stopped, ring unmapped";
  EXPECT_NE(log().find("vbd3.51712: disconnected"), std::string::npos);
  // The toolstack removes the device: the daemon forgets it.
  ASSERT_TRUE(xs_->rm(be(3, kXvda)));
  ASSERT_TRUE(xs_->rm(fe(3, kXvda)));
  for (int i = 0; i < 500 && log().find("device forgotten") == std::string::npos; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_NE(log().find("vbd3.51712: backend directory removed; device forgotten"), std::string::npos);
}

TEST_F(BlkbackDaemon, SigtermLeavesDevicesConnectedAndARestartReconnects) {
  const auto img = image("a.img");
  Guest& g = guest(3);
  add_vbd(3, kXvda, img, "w");
  connect_blkfront(g, kXvda);
  std::vector<std::uint8_t> d(8192, 0x42);
  ASSERT_EQ(g.front->write(0, d), 8192);
  blkback_->kill(SIGTERM);
  EXPECT_EQ(blkback_->wait(10s), 0);
  EXPECT_EQ(xs_->read(be(3, kXvda) + "/state").value_or(""), "4");
  EXPECT_FALSE(g.dom->grants().is_mapped(g.front->ring_refs()[0]));
  start_blkback();
  std::vector<std::uint8_t> back(8192);
  ASSERT_EQ(g.front->read(0, back), 8192);  // blocks until the new daemon serves the ring
  EXPECT_EQ(back, d);
  // The queue threads may serve the read before the control thread logs the reconnection.
  for (int i = 0; i < 500 && log().find("vbd3.51712: reconnected") == std::string::npos; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_NE(log().find("vbd3.51712: reconnected"), std::string::npos);
}

// The shadows of disks that went while no xpv-blkback ran (their domain destroyed meanwhile) are
// removed by the next daemon once it has listed the disks xenstore has; a disk that is there
// keeps its shadow over the restart, and files that are no shadow stay.
TEST_F(BlkbackDaemon, AStartingDaemonRemovesTheShadowsOfDisksNoLongerInXenstore) {
  const std::string shadows = run_ + "/blkback";
  Guest& a = guest_with_disk(3, kXvda, "a.img");
  Guest& b = guest_with_disk(4, kXvda, "b.img");
  connect_blkfront(a, kXvda);
  connect_blkfront(b, kXvda);
  std::vector<std::uint8_t> d(8192, 0x5a);
  ASSERT_EQ(a.front->write(0, d), 8192);
  ASSERT_TRUE(std::filesystem::exists(shadows + "/vbd3.51712-q0.shadow"));
  ASSERT_TRUE(std::filesystem::exists(shadows + "/vbd4.51712-q0.shadow"));
  blkback_->kill(SIGTERM);
  ASSERT_EQ(blkback_->wait(10s), 0);
  // While no daemon runs: domain 4 is destroyed, and a shadow of an older run is lying there.
  ASSERT_TRUE(xs_->rm(be(4, kXvda)));
  ASSERT_TRUE(xs_->rm("/local/domain/4"));
  for (const char* f : {"/vbd77.51728-q1.shadow", "/notes"}) std::ofstream(shadows + f) << "x";

  start_blkback();
  std::vector<std::uint8_t> back(8192);
  ASSERT_EQ(a.front->read(0, back), 8192);  // the live disk resumed
  EXPECT_EQ(back, d);
  for (int i = 0; i < 500 && log().find("removed vbd77.51728-q1.shadow") == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_NE(log().find("blkback: removed vbd77.51728-q1.shadow: its device is not in xenstore"), std::string::npos)
      << log();
  EXPECT_FALSE(std::filesystem::exists(shadows + "/vbd77.51728-q1.shadow"));
  EXPECT_FALSE(std::filesystem::exists(shadows + "/vbd4.51712-q0.shadow")) << log();
  EXPECT_TRUE(std::filesystem::exists(shadows + "/vbd3.51712-q0.shadow")) << "the live disk's shadow stays";
  EXPECT_TRUE(std::filesystem::exists(shadows + "/notes"));
}

// Storage that stops answering: a disk in memory, served through FUSE, whose writes can be held
// (what a hung NFS server or a stopped FUSE daemon looks like to xpv-blkback).
class HeldStorage : public frontends::BlockTarget {
 public:
  explicit HeldStorage(std::size_t size) : data_(size) {}
  std::uint64_t size_bytes() const override { return data_.size(); }
  bool readonly() const override { return false; }
  long read(std::uint64_t off, std::span<std::uint8_t> out) override {
    std::lock_guard l(m_);
    if (off > data_.size() || out.size() > data_.size() - off) return -EINVAL;
    std::memcpy(out.data(), data_.data() + off, out.size());
    return static_cast<long>(out.size());
  }
  long write(std::uint64_t off, std::span<const std::uint8_t> in) override {
    std::unique_lock l(m_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(l, [&] { return !held_; });
    --waiting_;
    if (off > data_.size() || in.size() > data_.size() - off) return -EINVAL;
    std::memcpy(data_.data() + off, in.data(), in.size());
    return static_cast<long>(in.size());
  }
  int flush() override { return 0; }
  int discard(std::uint64_t, std::uint64_t) override { return 0; }

  void hold(bool on) {
    std::lock_guard l(m_);
    held_ = on;
    cv_.notify_all();
  }
  // A write has arrived and is being held.
  bool a_write_is_held(std::chrono::seconds limit) {
    std::unique_lock l(m_);
    return cv_.wait_for(l, limit, [&] { return held_ && waiting_ > 0; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::uint8_t> data_;
  bool held_ = false;
  int waiting_ = 0;
};

// Guest 3's disk on HeldStorage through FUSE, connected with raw rings, with one write of 0x5c
// bytes to sector 8 held in the storage.
class BlkbackHungDisk : public BlkbackDaemon {
 protected:
  void SetUp() override {
    BlkbackDaemon::SetUp();
    if (IsSkipped() || HasFailure()) return;
    if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "needs /dev/fuse";
    const std::string mnt = dir_ + "/hung";
    std::filesystem::create_directories(mnt);
    fuse_ = std::make_unique<frontends::FuseDisk>(mnt, "disk", storage_);
    Guest& a = guest(3);
    add_vbd(3, kXvda, fuse_->file_path(), "w");
    old_rings_ = std::make_unique<RawFront>(*a.dom, 1, 0);
    connect_raw(a, kXvda, *old_rings_, 0);
    ASSERT_EQ(old_rings_->io(0, /*write=*/true, 0), std::optional<std::int16_t>(0)) << "the disk works";
    storage_.hold(true);
    std::memset(old_rings_->data(0).data(), 0x5c, 4096);
    held_ = old_rings_->submit(0, /*write=*/true, 8);
    ASSERT_TRUE(held_);
    ASSERT_TRUE(storage_.a_write_is_held(10s)) << log();
  }
  void TearDown() override {
    storage_.hold(false);  // before the daemon stops: it waits for its I/O
    if (blkback_ && HasFailure()) std::cerr << "---- xpv-blkback log ----\n" << log() << "----\n";
    if (blkback_) {  // it lets go of the file before FUSE goes, and FUSE before the temp dir
      blkback_->kill(SIGTERM);
      blkback_->wait(10s);
      blkback_.reset();
    }
    fuse_.reset();
    BlkbackDaemon::TearDown();
  }
  // Guest 4's disk connects and serves: the control thread is not held.
  void another_disk_serves() {
    Guest& b = guest_with_disk(4, kXvda, "b.img");
    ASSERT_NO_FATAL_FAILURE(connect_blkfront(b, kXvda)) << log();
    const std::vector<std::uint8_t> d(8192, 0x33);
    std::vector<std::uint8_t> back(d.size());
    ASSERT_EQ(b.front->write(0, d), 8192);
    ASSERT_EQ(b.front->read(0, back), 8192);
    EXPECT_EQ(back, d);
  }
  // The storage answers: the held write is done and answered on the old ring.
  void release() {
    storage_.hold(false);
    EXPECT_EQ(old_rings_->collect(0, *held_, 10s), std::optional<std::int16_t>(0)) << log();
  }
  // New rings of guest 3's disk, published with state 3.
  std::unique_ptr<RawFront> publish_new_rings() {
    auto rings = std::make_unique<RawFront>(*guests_.front()->dom, 1, 0);
    NodeList nodes = raw_nodes(fe(3, kXvda), *rings, 0);
    nodes.emplace_back(fe(3, kXvda) + "/state", "3");
    publish(nodes);
    return rings;
  }
  // Connected over `rings`, which read back what the held write put on the disk.
  void serves_the_held_write(RawFront& rings) {
    ASSERT_EQ(wait_value(be(3, kXvda) + "/state", "4"), "4") << log();
    ASSERT_TRUE(xs_->write(fe(3, kXvda) + "/state", "4"));
    ASSERT_EQ(rings.io(0, /*write=*/false, 8), std::optional<std::int16_t>(0)) << log();
    const auto got = rings.data(0);
    EXPECT_EQ(std::vector<std::uint8_t>(got.begin(), got.end()), std::vector<std::uint8_t>(4096, 0x5c));
  }

  HeldStorage storage_{16 << 20};
  std::unique_ptr<frontends::FuseDisk> fuse_;
  std::unique_ptr<RawFront> old_rings_;
  std::optional<std::uint64_t> held_;
};

// The guest closes the disk while that write hangs. xpv-blkback's queue must answer the write
// before the ring and the guest's pages are let go, so the disk says nothing (not even Closing:
// xpv's own blkfront would take its pages back) until it is; that wait holds up this disk only:
// another guest's disk connects and serves meanwhile. Once the write is answered the disk
// closes, and starts over with new rings.
TEST_F(BlkbackHungDisk, AClosingDiskWaitsForItsStorageAndHoldsUpNoOtherDisk) {
  const std::string b3 = be(3, kXvda), f3 = fe(3, kXvda);
  ASSERT_TRUE(xs_->write(f3 + "/state", "5"));
  ASSERT_NO_FATAL_FAILURE(another_disk_serves());
  // The frontend's Closing came before disk 4 was added (watch events keep their order).
  EXPECT_EQ(xs_->read(b3 + "/state").value_or(""), "4") << "nothing said with a write in flight";
  EXPECT_TRUE(guests_.front()->dom->grants().is_mapped(old_rings_->refs(0)[0])) << "the old ring is still in use";

  release();
  ASSERT_EQ(wait_value(b3 + "/state", "5"), "5") << log();
  EXPECT_FALSE(guests_.front()->dom->grants().is_mapped(old_rings_->refs(0)[0])) << "Closing: the ring let go";
  ASSERT_TRUE(xs_->write(f3 + "/state", "6"));
  ASSERT_EQ(wait_value(b3 + "/state", "6"), "6") << log();
  ASSERT_TRUE(xs_->write(f3 + "/state", "1"));
  ASSERT_EQ(wait_value(b3 + "/state", "2"), "2") << log();
  auto new_rings = publish_new_rings();
  serves_the_held_write(*new_rings);
}

// A Linux blkfront reset by a kexec kernel while that write hangs: it writes Closing, Closed and
// Initialising, waiting 5 s at most for the backend after each, then takes the backend's
// Connected for an offer and connects new rings. Once the write is answered, those are
// connected.
TEST_F(BlkbackHungDisk, AFrontendThatStartedOverMeanwhileGetsItsNewRingsConnected) {
  const std::string b3 = be(3, kXvda), f3 = fe(3, kXvda);
  ASSERT_TRUE(xs_->write(f3 + "/state", "5"));
  // Linux waits up to 5 s for the backend at each step; here: until the daemon took the first.
  for (int i = 0; i < 1000 && log().find("vbd3.51712: disconnecting") == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_NE(log().find("vbd3.51712: disconnecting: its queues finish the I/O in flight"), std::string::npos) << log();
  for (const char* state : {"6", "1"}) ASSERT_TRUE(xs_->write(f3 + "/state", state));
  auto new_rings = publish_new_rings();
  ASSERT_NO_FATAL_FAILURE(another_disk_serves());
  EXPECT_EQ(xs_->read(b3 + "/state").value_or(""), "4") << "nothing said with a write in flight";

  release();
  for (int i = 0; i < 1000 && log().find("vbd3.51712: the frontend connected new rings") == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_NE(log().find("vbd3.51712: the frontend connected new rings while the old ones were let go"), std::string::npos)
      << log();
  serves_the_held_write(*new_rings);
}

// The headline: kill -9 in the middle of a loop of fsync'd writes, a new xpv-blkback, the loop
// goes on without an error the guest could see, and every acknowledged write is in the image.
TEST_F(BlkbackDaemon, KillDashNineMidWriteLoopLosesNothingAcknowledged) {
  const auto img = image("a.img");
  Guest& g = guest(3);
  add_vbd(3, kXvda, img, "w");
  connect_blkfront(g, kXvda);
  std::vector<std::string> states;
  std::mutex states_m;
  ASSERT_TRUE(xs_->watch(be(3, kXvda) + "/state", "states", [&](const std::string& p, const std::string&) {
    (void)p;
    std::lock_guard l(states_m);
    states.push_back("event");
  }));
  constexpr int kBlocks = 300, kWriters = 4;
  constexpr std::size_t kBlock = 64 << 10;
  std::atomic<int> acked{0};
  std::atomic<int> errors{0};
  std::vector<std::atomic<bool>> done(kBlocks);
  auto block_ok = [&](int i) {
    const std::string got = image_bytes(img, off_t(i) * kBlock, kBlock);
    int tag = -1;
    std::memcpy(&tag, got.data(), sizeof tag);
    return tag == i && static_cast<std::uint8_t>(got[kBlock - 1]) == static_cast<std::uint8_t>(i * 7 + 1);
  };
  // Four guest threads, each a loop of write + flush over its own blocks: several requests are
  // in the ring when the backend dies.
  std::vector<std::thread> writers;
  for (int t = 0; t < kWriters; ++t) {
    writers.emplace_back([&, t] {
      for (int i = t; i < kBlocks; i += kWriters) {
        std::vector<std::uint8_t> b(kBlock, static_cast<std::uint8_t>(i * 7 + 1));
        std::memcpy(b.data(), &i, sizeof i);
        if (g.front->write(std::uint64_t(i) * kBlock, b) != static_cast<long>(kBlock) || g.front->flush() != 0) {
          ++errors;
          return;
        }
        done[i].store(true);
        acked.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 2000 && acked.load() < 60; ++i) std::this_thread::sleep_for(5ms);
  blkback_->kill(SIGKILL);
  EXPECT_EQ(blkback_->wait(10s), 128 + SIGKILL);
  // Every write acknowledged so far is in the image now, with no backend running.
  std::vector<int> acked_before;
  for (int i = 0; i < kBlocks; ++i) {
    if (done[i].load()) acked_before.push_back(i);
  }
  const int acked_at_kill = static_cast<int>(acked_before.size());
  for (int i : acked_before) EXPECT_TRUE(block_ok(i)) << "acknowledged block " << i << " is not in the image";
  std::this_thread::sleep_for(50ms);  // the guest keeps queueing into the ring meanwhile
  start_blkback();
  for (int i = 0; i < 6000 && acked.load() < kBlocks && errors.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  if (acked.load() < kBlocks && errors.load() == 0) {
    // The writer is blocked on a request nobody will answer: leave it and its domain behind
    // (leaked on purpose: destroying them under it would crash the test process).
    ADD_FAILURE() << "the write loop did not finish after the restart (acked " << acked.load() << ")";
    for (auto& w : writers) w.detach();
    for (auto& gp : guests_) (void)gp.release();
    guests_.clear();
    return;
  }
  for (auto& w : writers) w.join();
  EXPECT_EQ(errors.load(), 0) << "a guest-visible error";
  EXPECT_EQ(acked.load(), kBlocks);
  EXPECT_GE(acked_at_kill, 60);
  EXPECT_EQ(xs_->read(be(3, kXvda) + "/state").value_or(""), "4");
  {
    std::lock_guard l(states_m);
    EXPECT_EQ(states.size(), 1u) << "only the registration event: the backend state never changed";
  }
  (void)xs_->unwatch(be(3, kXvda) + "/state", "states");
  for (int i = 0; i < kBlocks; ++i) ASSERT_TRUE(block_ok(i)) << "block " << i;
  EXPECT_NE(log().find("vbd3.51712: reconnected"), std::string::npos);
  // Grant flags the killed process left set were re-pinned by the new one and cleared when it
  // let go: once it stops, no grant of the guest is mapped any more.
  blkback_->kill(SIGTERM);
  EXPECT_EQ(blkback_->wait(10s), 0);
  blkback_.reset();
  std::size_t still_mapped = 0;
  for (gnttab::GrantRef r = 0; r < g.dom->grants().capacity(); ++r) still_mapped += g.dom->grants().is_mapped(r);
  EXPECT_EQ(still_mapped, 0u);
  const std::string l = log();
  // The restarted process raised the domain's upcalls itself (direct upcalls: it got the table
  // again) and none went through the domain's control thread: the counts it logs when it lets
  // the domain go. The killed one logs nothing.
  const std::regex direct(R"(dom3: direct upcalls: ([0-9]+) notifications delivered, [0-9]+ interrupts raised, ([0-9]+) through the domain)");
  std::vector<std::smatch> found(std::sregex_iterator(l.begin(), l.end(), direct), std::sregex_iterator());
  ASSERT_EQ(found.size(), 1u) << l;
  EXPECT_GT(std::stoul(found[0][1]), 0u) << found[0].str();
  EXPECT_EQ(found[0][2], "0") << found[0].str();
  // The restarted process's last word on each queue: every request the guest published was
  // taken and answered (the stall diagnostic of the line reads clean for a run that did not
  // stall), and the line says how the stop found the thread (its counts are not checked: the
  // daemon is idle when stopped here). The count of answers since the frontend armed its event
  // is not checked: this frontend polls, and a poll takes answers without arming.
  const std::regex left(R"(vbd3\.51712(q[0-9])?: requests [0-9]+ .*; ring left: ([0-9]+) published and not taken, ([0-9]+) taken and not answered, [0-9]+ answered since the frontend last armed its event )"
                         R"(\(req_prod [0-9]+, rsp_prod [0-9]+, rsp_event [0-9]+\); the stop (came while it was awake|woke it from a sleep with [0-9]+ I/O in flight, ([0-9]+) of them completed and not reaped))");
  std::vector<std::smatch> ends(std::sregex_iterator(l.begin(), l.end(), left), std::sregex_iterator());
  ASSERT_FALSE(ends.empty()) << l;
  for (const auto& m : ends) {
    EXPECT_EQ(m[2], "0") << m.str();
    EXPECT_EQ(m[3], "0") << m.str();
  }
  // What the restart found in the ring (informational: how many requests were redone).
  if (auto at = l.find("resuming at rsp_prod"); at != std::string::npos) {
    std::cout << "restart: " << l.substr(at, l.find('\n', at) - at) << " (" << acked_at_kill << " writes acked at the kill)\n";
  }
}

TEST_F(BlkbackDaemon, DaemonModeReportsStartupErrorsAndWritesItsPidFile) {
  // The fixture's daemon must hold the run dir's lock before the second one tries (it takes it
  // before it watches xenstore; under a loaded ctest -j the second one once won the race).
  for (int i = 0; i < 1000 && log().find("watching /local/domain/0/backend/vbd") == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_NE(log().find("watching /local/domain/0/backend/vbd"), std::string::npos) << log();
  // A second instance on the same run dir is refused, through the launcher, with one line.
  const std::string pid_file = dir_ + "/second.pid";
  {
    Child second({XPV_BLKBACK_BIN, "--xenstore", xs_sock_, "--run-dir", run_, "--pid-file", pid_file},
                 dir_ + "/second.log");
    const int rc = second.wait(10s);
    EXPECT_EQ(rc, 1);
    if (rc == 0) {
      // It was not refused and runs as a daemon: stop it, or it outlives the test.
      std::ifstream pf(pid_file);
      pid_t pid = 0;
      pf >> pid;
      if (pid > 0) ::kill(pid, SIGTERM);
    }
  }
  std::ifstream f(dir_ + "/second.log");
  std::string line;
  std::getline(f, line);
  EXPECT_NE(line.find("another xpv-blkback is running"), std::string::npos) << line;
  EXPECT_FALSE(std::filesystem::exists(pid_file));
  // Stop the foreground one; a daemonized one takes over, with its pid file.
  blkback_->kill(SIGTERM);
  ASSERT_EQ(blkback_->wait(10s), 0);
  blkback_.reset();
  {
    Child launcher({XPV_BLKBACK_BIN, "--xenstore", xs_sock_, "--run-dir", run_, "--pid-file", pid_file,
                    "--log-file", dir_ + "/daemon.log"},
                   dir_ + "/launcher.log");
    ASSERT_EQ(launcher.wait(10s), 0);
  }
  std::ifstream pf(pid_file);
  pid_t pid = 0;
  pf >> pid;
  ASSERT_GT(pid, 0);
  EXPECT_EQ(::kill(pid, 0), 0);
  ::kill(pid, SIGTERM);
  for (int i = 0; i < 1000 && std::filesystem::exists(pid_file); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(std::filesystem::exists(pid_file)) << "removed at exit";
  for (int i = 0; i < 1000 && ::kill(pid, 0) == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_NE(::kill(pid, 0), 0);
}

TEST_F(BlkbackDaemon, BadOptionsGiveOneErrorLine) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--bogus"}, "xpv-blkback: The following argument was not expected: --bogus"},
      {{"--max-queues", "0"}, "xpv-blkback: --max-queues: Value 0 not in range 1 to 64"},
      {{"--log-level", "loud"}, "xpv-blkback: --log-level 'loud': expected trace, debug, info, warn, error or off"},
      {{"--foreground", "--xenstore", dir_ + "/nothing.sock", "--run-dir", dir_ + "/other-run"},
       "xpv-blkback: cannot connect to xpv-xenstored at " + dir_ + "/nothing.sock"}};
  int n = 0;
  for (const auto& [args, want] : cases) {
    std::vector<std::string> argv{XPV_BLKBACK_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string out = dir_ + "/bad" + std::to_string(++n) + ".log";
    Child c(argv, out);
    EXPECT_EQ(c.wait(10s), args.front() == "--foreground" ? 1 : 2) << want;
    std::ifstream f(out);
    std::stringstream text;
    text << f.rdbuf();
    EXPECT_EQ(text.str(), want + "\n");
  }
}

TEST_F(BlkbackDaemon, LosingXenstoredKeepsTheDataPlaneServing) {
  const auto img = image("a.img");
  Guest& g = guest(3);
  add_vbd(3, kXvda, img, "w");
  connect_blkfront(g, kXvda);
  xs_.reset();
  xenstored_->kill(SIGKILL);
  EXPECT_EQ(xenstored_->wait(10s), 128 + SIGKILL);
  const auto data = random_bytes(512 << 10, 14);
  ASSERT_EQ(g.front->write(0, data), static_cast<long>(data.size()));
  std::vector<std::uint8_t> back(data.size());
  ASSERT_EQ(g.front->read(0, back), static_cast<long>(back.size()));
  EXPECT_EQ(back, data);
  // It noticed the loss: by the break itself (SyncClient::on_lost, unit-tested in
  // XenstoreClient.ABrokenConnectionIsReportedOnce), or by a call of its own that met it.
  for (int i = 0; i < 1000 && log().find("looking each second") == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_NE(log().find("blkback: lost xpv-xenstored at " + xs_sock_ + "; control plane stopped, 1 device(s) keep "
                       "being served; looking each second whether it answers again"),
            std::string::npos)
      << log();
  // A xenstored answers at the socket again: the daemon stops as on SIGTERM, leaving the device
  // as it is, with the status that asks its supervisor for the restart that resumes it.
  xenstored_ = std::make_unique<Child>(
      std::vector<std::string>{XPV_XENSTORED_BIN, "--socket", xs_sock_, "--foreground", "--log-level", "warn"},
      dir_ + "/xenstored2.log");
  EXPECT_EQ(blkback_->wait(30s), daemon::kExitXenstoreBack);
  blkback_.reset();
  EXPECT_NE(log().find("blkback: xpv-xenstored at " + xs_sock_ + " answers again; stopping, so that the next start "
                       "resumes the 1 device(s) over a new connection"),
            std::string::npos)
      << log();
  EXPECT_NE(log().find("blkback: stopped (exit 3)"), std::string::npos) << log();
}

// ext4 through the daemon: FUSE file over Blkfront, a loop device, mkfs, mount, fsync'd data,
// then the image checked straight from the host.
TEST_F(BlkbackDaemon, Ext4OverFuseAndLoop) {
  if (::access("/dev/fuse", R_OK | W_OK) != 0 || std::system("command -v losetup mkfs.ext4 >/dev/null") != 0) {
    GTEST_SKIP() << "needs /dev/fuse, losetup and mkfs.ext4";
  }
  const auto img = image("ext4.img");
  Guest& g = guest(3);
  add_vbd(3, kXvda, img, "w");
  frontends::BlkfrontConfig cfg;
  cfg.indirect_segments = 32;
  connect_blkfront(g, kXvda, cfg);
  const std::string mnt = dir_ + "/fuse", fsdir = dir_ + "/fs";
  std::filesystem::create_directories(mnt);
  std::filesystem::create_directories(fsdir);
  {
    frontends::FuseDisk fuse(mnt, "xvda", *g.front);
    test::LoopDevice loop(fuse.file_path());
    if (loop.empty()) GTEST_SKIP() << "no free loop device";
    test::UnmountAtExit unmount{fsdir};
    ASSERT_EQ(std::system(("mkfs.ext4 -q -F " + loop.path() + " >/dev/null 2>&1").c_str()), 0);
    ASSERT_EQ(std::system(("mount " + loop.path() + " " + fsdir).c_str()), 0);
    ASSERT_EQ(std::system(("dd if=/dev/urandom of=" + fsdir + "/f bs=64k count=64 conv=fsync status=none").c_str()), 0);
    ASSERT_EQ(std::system(("sha256sum " + fsdir + "/f > " + dir_ + "/sum").c_str()), 0);
  }
  ASSERT_EQ(std::system(("mount -o ro,loop " + img + " " + fsdir).c_str()), 0);
  EXPECT_EQ(std::system(("sha256sum -c --quiet " + dir_ + "/sum").c_str()), 0);
  EXPECT_EQ(std::system(("umount " + fsdir).c_str()), 0);
}

// An image on a file system over 4 KiB-sector storage: O_DIRECT there takes 4 KiB units only, the
// guest's disk has 512-byte sectors, so xpv-blkback reads and writes it buffered (STATX_DIOALIGN)
// and the guest's single sectors, and a write across a 4 KiB boundary, land where it put them;
// the storage's 4 KiB is the disk's physical sector size, so that the guest aligns to it.
TEST_F(BlkbackDaemon, AnImageOnA4KSectorFileSystemTakes512ByteRequests) {
  if (std::system("command -v losetup mkfs.ext4 >/dev/null") != 0) GTEST_SKIP() << "needs losetup and mkfs.ext4";
  const auto backing = image("fs4k.img", 64 << 20);
  const std::string fsdir = dir_ + "/fs4k";
  std::filesystem::create_directories(fsdir);
  test::LoopDevice loop(backing, 4096);
  if (loop.empty()) GTEST_SKIP() << "no free loop device";
  ASSERT_EQ(std::system(("mkfs.ext4 -q -F " + loop.path() + " >/dev/null 2>&1").c_str()), 0);
  ASSERT_EQ(std::system(("mount " + loop.path() + " " + fsdir).c_str()), 0);
  test::UnmountAtExit unmount{fsdir};
  struct StopBlkbackFirst {  // the daemon holds the image open: it goes before the unmount
    test::blkrig::Child& c;
    ~StopBlkbackFirst() {
      c.kill(SIGTERM);
      c.wait(10s);
    }
  } stop_first{*blkback_};
  const std::string img = fsdir + "/a.img";
  { std::ofstream f(img); }
  std::filesystem::resize_file(img, 16 << 20);

  Guest& g = guest(3);
  add_vbd(3, kXvda, img, "w");
  connect_blkfront(g, kXvda);
  EXPECT_EQ(xs_->read(be(3, kXvda) + "/sector-size").value_or(""), "512");
  EXPECT_EQ(xs_->read(be(3, kXvda) + "/physical-sector-size").value_or(""), "4096") << "the guest aligns to it";
  const auto one = random_bytes(512, 21), across = random_bytes(1536, 22);
  ASSERT_EQ(g.front->write(512, one), 512);
  ASSERT_EQ(g.front->write(3584, across), 1536) << "sectors 7-9, across the first 4 KiB";
  ASSERT_EQ(g.front->flush(), 0);
  std::vector<std::uint8_t> back(1536);
  ASSERT_EQ(g.front->read(3584, back), 1536);
  EXPECT_EQ(back, across);
  back.resize(512);
  ASSERT_EQ(g.front->read(512, back), 512);
  EXPECT_EQ(back, one);
  EXPECT_FALSE(g.front->broken());
  EXPECT_NE(log().find("O_DIRECT here needs more than 512-byte alignment"), std::string::npos);
  const std::string on_disk = image_bytes(img, 3584, across.size());
  EXPECT_EQ(std::vector<std::uint8_t>(on_disk.begin(), on_disk.end()), across);
}

}  // namespace
}  // namespace xpv
