// The two sides in two processes, as in xpv: the granting domain owns memfds for its RAM and its
// grant table; a backend process maps the same memfds and does the protocol on the shared
// entries itself. Every wait is bounded (poll with a timeout); the child is killed and reaped
// whatever happens.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>

#include "xpv/gnttab/granter.h"
#include "xpv/gnttab/mapper.h"
#include "xpv/guest_memory.h"

namespace xpv::gnttab {
namespace {

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

class Map {
 public:
  Map(int fd, std::size_t len) : len_(len) {
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    p_ = p == MAP_FAILED ? nullptr : static_cast<std::uint8_t*>(p);
  }
  Map(const Map&) = delete;
  Map& operator=(const Map&) = delete;
  ~Map() {
    if (p_ != nullptr) ::munmap(p_, len_);
  }
  std::uint8_t* data() const { return p_; }

 private:
  std::uint8_t* p_ = nullptr;
  std::size_t len_;
};

// The child we forked: killed (if still running) and reaped on every path.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Exit status, or -1 if it did not exit normally.
  int wait() {
    if (pid_ <= 0) return -1;  // waited for already: never waitpid(-1)
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return (r > 0 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
  }

 private:
  pid_t pid_;
};

bool send_byte(int fd, char c) { return ::write(fd, &c, 1) == 1; }

// Waits at most timeout_ms for one byte.
bool recv_byte(int fd, char expected, int timeout_ms = 10000) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) != 1) return false;
  char c = 0;
  return ::read(fd, &c, 1) == 1 && c == expected;
}

constexpr std::size_t kRamPages = 4;
constexpr DomId kDomain = 5;

// The backend process: maps the memfds itself, maps the grant, writes into the page, tells the
// parent, waits to be told to unmap. Exit code 0 on success, a distinct code per failure.
[[noreturn]] void backend_main(int ram_fd, int table_fd, GrantRef ref, int to_parent,
                               int from_parent) {
  Map ram(ram_fd, kRamPages * kFrameSize);
  Map table(table_fd, kFrameSize);
  if (ram.data() == nullptr || table.data() == nullptr) ::_exit(10);
  GuestMemory mem({{0, kRamPages * kFrameSize, ram.data()}});
  GrantMapper mapper(0, kDomain, {std::span<std::uint8_t>(table.data(), kFrameSize)}, mem);
  auto m = mapper.map(ref, /*readonly=*/false);
  if (!m) ::_exit(11);
  std::memset(m->writable().data(), 0x77, 16);
  if (!send_byte(to_parent, 'M')) ::_exit(12);
  if (!recv_byte(from_parent, 'U')) ::_exit(13);
  if (!mapper.unmap(*m)) ::_exit(14);
  if (!send_byte(to_parent, 'D')) ::_exit(15);
  ::_exit(0);
}

TEST(GnttabProcesses, BackendInAnotherProcessMapsOverMemfdsAndEndAccessWaitsForItsUnmap) {
  Fd ram_fd(::memfd_create("xpv-test-ram", MFD_CLOEXEC));
  Fd table_fd(::memfd_create("xpv-test-gnttab", MFD_CLOEXEC));
  ASSERT_GE(ram_fd.get(), 0);
  ASSERT_GE(table_fd.get(), 0);
  ASSERT_EQ(::ftruncate(ram_fd.get(), kRamPages * kFrameSize), 0);
  ASSERT_EQ(::ftruncate(table_fd.get(), kFrameSize), 0);
  Map ram(ram_fd.get(), kRamPages * kFrameSize);
  Map table(table_fd.get(), kFrameSize);
  ASSERT_NE(ram.data(), nullptr);
  ASSERT_NE(table.data(), nullptr);

  GrantTable granter({std::span<std::uint8_t>(table.data(), kFrameSize)});
  auto ref = granter.grant_access(0, 2, /*readonly=*/false);
  ASSERT_TRUE(ref);

  int to_parent[2], from_parent[2];
  ASSERT_EQ(::pipe2(to_parent, O_CLOEXEC), 0);
  Fd tp_r(to_parent[0]), tp_w(to_parent[1]);
  ASSERT_EQ(::pipe2(from_parent, O_CLOEXEC), 0);
  Fd fp_r(from_parent[0]), fp_w(from_parent[1]);

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) backend_main(ram_fd.get(), table_fd.get(), *ref, tp_w.get(), fp_r.get());
  Child child(pid);

  ASSERT_TRUE(recv_byte(tp_r.get(), 'M')) << "the backend did not map the grant";
  EXPECT_EQ(ram.data()[2 * kFrameSize], 0x77);   // its write reached our page
  EXPECT_EQ(ram.data()[2 * kFrameSize + 16], 0);  // and nothing beyond it
  EXPECT_TRUE(granter.is_mapped(*ref));
  auto refused = granter.end_access(*ref);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(), Status::eagain);

  ASSERT_TRUE(send_byte(fp_w.get(), 'U'));
  ASSERT_TRUE(recv_byte(tp_r.get(), 'D')) << "the backend did not unmap";
  EXPECT_FALSE(granter.is_mapped(*ref));
  EXPECT_TRUE(granter.end_access(*ref));
  EXPECT_EQ(child.wait(), 0);
}

}  // namespace
}  // namespace xpv::gnttab
