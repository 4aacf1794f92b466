// PvConsole: the VMM's backend of the Xen PV console, driven the way Linux's hvc_xen drives it —
// through the xencons_interface of a real page and two real eventfds (the dom0 binding's), with
// the backend on its own io thread; and a guest that breaks the ring protocol.
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <poll.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "xpv/ring/console.h"
#include "xpv/vmm/pv_console.h"

namespace xpv::vmm {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

struct alignas(4096) Page {
  std::uint8_t bytes[4096] = {};
};

class PvConsoleTest : public ::testing::Test {
 protected:
  PvConsoleTest() {
    guest_kick_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));  // guest → backend (to_dom0)
    host_kick_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));   // backend → guest (from_dom0)
    intf_ = *ring::console_interface(std::span<std::uint8_t>(page_.bytes, sizeof page_.bytes));
  }
  ~PvConsoleTest() override { stop(); }

  void start() {
    console_ = std::make_unique<PvConsole>(
        io_, std::span<std::uint8_t>(page_.bytes, sizeof page_.bytes), UniqueFd(::dup(guest_kick_.get())),
        UniqueFd(::dup(host_kick_.get())), [this](std::span<const std::uint8_t> b) {
          std::lock_guard lk(mu_);
          output_.append(b.begin(), b.end());
        });
    thread_ = std::thread([this] { io_.run(); });
  }
  void stop() {
    if (!thread_.joinable()) return;
    asio::post(io_, [this] {
      console_.reset();
      io_.stop();
    });
    work_.reset();
    thread_.join();
  }
  // The guest side (hvc_xen): write into out, then notify.
  std::size_t guest_writes(const std::string& s) {
    auto out = ring::console_out_ring(*intf_);
    auto n = out->write(std::span<const char>(s.data(), s.size()));
    guest_notifies();
    return n ? *n : 0;
  }
  void guest_notifies() {
    const std::uint64_t one = 1;
    ASSERT_EQ(::write(guest_kick_.get(), &one, sizeof one), 8);
  }
  std::string guest_reads() {
    auto in = ring::console_in_ring(*intf_);
    char buf[2048];
    auto n = in->read(buf);
    return n ? std::string(buf, *n) : std::string("<bad ring>");
  }
  // Bounded wait for the backend's output to become `want`.
  bool output_is(const std::string& want) {
    for (int i = 0; i < 500; ++i) {
      {
        std::lock_guard lk(mu_);
        if (output_ == want) return true;
      }
      std::this_thread::sleep_for(10ms);
    }
    std::lock_guard lk(mu_);
    return output_ == want;
  }
  std::string output() {
    std::lock_guard lk(mu_);
    return output_;
  }
  // Kicks the backend sent the guest since the last call (0 after 1 s without one).
  std::uint64_t guest_was_notified() {
    pollfd p{host_kick_.get(), POLLIN, 0};
    if (::poll(&p, 1, 1000) != 1) return 0;
    std::uint64_t n = 0;
    return ::read(host_kick_.get(), &n, sizeof n) == 8 ? n : 0;
  }

  Page page_;
  ring::XenconsInterface* intf_ = nullptr;
  UniqueFd guest_kick_, host_kick_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_{io_.get_executor()};
  std::thread thread_;
  std::unique_ptr<PvConsole> console_;
  std::mutex mu_;
  std::string output_;
};

TEST_F(PvConsoleTest, WhatTheGuestWroteBeforeTheBackendStartedComesOutFirst) {
  auto out = ring::console_out_ring(*intf_);
  ASSERT_EQ(*out->write(std::string_view("early boot\n")), 11u);  // no notification: hvc_xen's early path
  start();
  EXPECT_TRUE(output_is("early boot\n")) << output();
  EXPECT_GE(guest_was_notified(), 1u);
  EXPECT_EQ(intf_->out_cons, 11u);
}

TEST_F(PvConsoleTest, OutputFollowsEachNotificationAcrossTheRingsWrap) {
  start();
  std::string want;
  // 3 x 1500 bytes: the third write wraps around the 2048-byte ring.
  for (int i = 0; i < 3; ++i) {
    const std::string chunk(1500, static_cast<char>('a' + i));
    ASSERT_EQ(guest_writes(chunk), chunk.size());
    want += chunk;
    ASSERT_TRUE(output_is(want)) << "chunk " << i << ": got " << output().size() << " bytes";
    EXPECT_GE(guest_was_notified(), 1u) << "room again: the guest is told";
  }
  EXPECT_EQ(console_->bytes_out(), 4500u);
}

TEST_F(PvConsoleTest, TypedBytesGoIntoTheInRingAsFarAsTheyFit) {
  start();
  const std::string cmd = "ls /\n";
  EXPECT_EQ(console_->receive(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(cmd.data()), cmd.size())),
            cmd.size());
  EXPECT_GE(guest_was_notified(), 1u);
  EXPECT_EQ(guest_reads(), cmd);
  // More than the 1024-byte in ring holds while the guest reads nothing: the rest is the caller's.
  const std::string big(1500, 'x');
  EXPECT_EQ(console_->receive(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(big.data()), big.size())),
            1024u);
  EXPECT_EQ(console_->receive(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(big.data()), 10)), 0u);
  EXPECT_EQ(guest_reads(), std::string(1024, 'x'));
}

TEST_F(PvConsoleTest, AGuestThatBreaksTheIndexesLosesItsConsoleAndNothingElse) {
  start();
  ASSERT_EQ(guest_writes("fine\n"), 5u);
  ASSERT_TRUE(output_is("fine\n"));
  // out_prod claims 5000 bytes in a 2048-byte ring.
  std::atomic_ref<std::uint32_t>(intf_->out_prod).store(intf_->out_cons + 5000);
  guest_notifies();
  for (int i = 0; i < 200 && !console_->disabled(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(console_->disabled());
  EXPECT_EQ(output(), "fine\n") << "nothing read from a ring whose indexes lie";
  const std::string more = "more";
  EXPECT_EQ(console_->receive(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(more.data()), 4)), 0u);
  EXPECT_EQ(intf_->in_prod, 0u) << "the page is not touched any more";
  // Further notifications are not even looked at; the backend shuts down cleanly.
  guest_notifies();
  stop();
  EXPECT_EQ(output(), "fine\n");
}

TEST_F(PvConsoleTest, ABadInRingConsumerIndexDisablesItToo) {
  start();
  std::atomic_ref<std::uint32_t>(intf_->in_cons).store(0x8000'0000u);  // cons far ahead of prod
  const std::string s = "x";
  EXPECT_EQ(console_->receive(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), 1)), 0u);
  EXPECT_TRUE(console_->disabled());
  EXPECT_EQ(intf_->in_prod, 0u);
}

// Found by tests/fuzz/console: the guest breaks out_prod while a drain is between its two
// rounds; what the first round gave Output is counted all the same.
TEST_F(PvConsoleTest, BytesOutCountsWhatOutputGotBeforeASecondRoundDisables) {
  auto out = ring::console_out_ring(*intf_);
  ASSERT_EQ(*out->write(std::string_view("hello")), 5u);
  std::string got;
  PvConsole console(io_, std::span<std::uint8_t>(page_.bytes, sizeof page_.bytes), UniqueFd(::dup(guest_kick_.get())),
                    UniqueFd(::dup(host_kick_.get())), [&](std::span<const std::uint8_t> b) {
                      got.append(b.begin(), b.end());
                      // The guest, racing the drain: out_prod now claims more than the ring holds.
                      std::atomic_ref<std::uint32_t>(intf_->out_prod).store(intf_->out_cons + 5000);
                    });
  EXPECT_TRUE(console.disabled());
  EXPECT_EQ(got, "hello");
  EXPECT_EQ(console.bytes_out(), 5u) << "bytes_out() is every byte Output got";
}

}  // namespace
}  // namespace xpv::vmm
