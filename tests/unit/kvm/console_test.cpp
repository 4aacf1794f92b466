#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "xpv/kvm/console.h"

namespace xpv::kvm {
namespace {

TEST(Console, RefusesABadSpec) {
  EXPECT_THROW(Console("tty"), std::runtime_error);
  EXPECT_THROW(Console("socket:"), std::runtime_error);
  EXPECT_THROW(Console("socket:/" + std::string(200, 'x')), std::runtime_error);
}

TEST(Console, SocketReplaysBacklogAndCarriesInput) {
  const std::string path = "/tmp/xpv-console-test." + std::to_string(getpid()) + ".sock";
  std::mutex mu;
  std::string typed;
  {
    Console c("socket:" + path);
    const std::string early = "boot log\n";
    c.write(std::span(reinterpret_cast<const std::uint8_t*>(early.data()), early.size()));
    c.start_input([&](std::span<const std::uint8_t> b) {
      std::lock_guard lk(mu);
      typed.append(b.begin(), b.end());
      return b.size();
    });
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    std::string got;
    for (int i = 0; i < 50 && got.size() < early.size(); ++i) {  // bounded: 5 s
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        char buf[64];
        const ssize_t n = read(fd, buf, sizeof buf);
        if (n > 0) got.append(buf, static_cast<std::size_t>(n));
      }
    }
    EXPECT_EQ(got, early);
    ASSERT_EQ(write(fd, "ls\n", 3), 3);
    for (int i = 0; i < 50; ++i) {
      {
        std::lock_guard lk(mu);
        if (typed.size() >= 3) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    close(fd);
    c.stop();
  }
  EXPECT_EQ(typed, "ls\n");
  EXPECT_NE(access(path.c_str(), F_OK), 0);  // the socket file is removed
}

int connect_to(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads what arrives within about `ms` milliseconds, or until it ends with `until`.
std::string read_for(int fd, int ms, std::string_view until) {
  std::string got;
  for (int i = 0; i < ms / 20 && !got.ends_with(until); ++i) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  return got;
}

void guest_writes(Console& c, const std::string& s) {
  c.write(std::span(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()));
}

// A client that attaches and reads nothing: the guest's output (a vCPU thread) never waits for
// it — it is let go once its socket is full, and the next client gets the backlog's tail.
TEST(Console, AClientThatReadsNothingNeverHoldsUpTheGuest) {
  const std::string path = "/tmp/xpv-console-test-stuck." + std::to_string(getpid()) + ".sock";
  Console c("socket:" + path);
  c.start_input([](std::span<const std::uint8_t> b) { return b.size(); });
  const int idle = connect_to(path);
  ASSERT_GE(idle, 0);
  guest_writes(c, "hello\n");
  ASSERT_EQ(read_for(idle, 3000, "hello\n").substr(0, 6), "hello\n") << "attached";  // and from here on read nothing
  const std::string line(1023, 'x');
  for (int i = 0; i < 8192; ++i) guest_writes(c, line + "\n");  // 8 MiB: far more than a socket holds
  guest_writes(c, "the end\n");
  const int next = connect_to(path);
  ASSERT_GE(next, 0);
  const std::string got = read_for(next, 3000, "the end\n");
  EXPECT_TRUE(got.ends_with("the end\n")) << got.size() << " bytes";
  close(next);
  close(idle);
  c.stop();
}

// A client that types while the guest reads nothing (its FIFO full), then hangs up: the next
// output is no SIGPIPE (which would end the VMM, and this test), and the next client attaches.
TEST(Console, AClientThatHangsUpWhileTheGuestReadsNothingIsLetGo) {
  const std::string path = "/tmp/xpv-console-test-hup." + std::to_string(getpid()) + ".sock";
  Console c("socket:" + path);
  c.start_input([](std::span<const std::uint8_t>) { return std::size_t{0}; });  // never takes a byte
  const int first = connect_to(path);
  ASSERT_GE(first, 0);
  guest_writes(c, "hello\n");
  ASSERT_EQ(read_for(first, 3000, "hello\n").substr(0, 6), "hello\n") << "attached";
  ASSERT_EQ(write(first, "typed ahead\n", 12), 12);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  close(first);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  guest_writes(c, "after the hang-up\n");
  const int second = connect_to(path);
  ASSERT_GE(second, 0);
  EXPECT_EQ(read_for(second, 2000, "hang-up\n"), "hello\nafter the hang-up\n") << "attached, with the backlog";
  close(second);
  c.stop();
}

// A guest printing without end fills no disk: past the limit the log becomes LOG.1 and a new one
// starts, so at most twice the limit is kept, the newest output always in LOG.
TEST(Console, TheLogIsRotatedAtItsLimit) {
  char dir[] = "/tmp/xpv-console-log-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string log = std::string(dir) + "/console.log";
  {
    Console c("socket:" + std::string(dir) + "/console.sock");  // no client: only the log gets it
    c.set_log(log, 4096);
    const std::string line(99, 'x');
    for (int i = 0; i < 1000; ++i) guest_writes(c, line + "\n");  // 100 000 bytes
    guest_writes(c, "newest\n");
  }
  struct stat a {}, b {};
  ASSERT_EQ(stat(log.c_str(), &a), 0);
  ASSERT_EQ(stat((log + ".1").c_str(), &b), 0);
  EXPECT_LE(a.st_size, 4096 + 100);
  EXPECT_LE(b.st_size, 4096 + 100);
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_TRUE(ss.str().ends_with("newest\n"));
  unlink(log.c_str());
  unlink((log + ".1").c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace xpv::kvm
