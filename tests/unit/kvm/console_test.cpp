#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
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

}  // namespace
}  // namespace xpv::kvm
