// EventFd — RAII owner of one Linux eventfd in counter mode (EFD_NONBLOCK | EFD_CLOEXEC).
//
// Header-only (only libc and unique_fd.h) so that backends can use it through the small
// `xpv::domain_port` target without linking the domain library.
//
// notify() adds n to the counter (a reader wakes up); consume() reads and resets it, returning 0
// when nothing was pending; wait() polls with a timeout, then consumes. Every call is noexcept and
// reports a positive host errno. Thread-safety: an eventfd may be written and read from different
// threads at the same time; the object itself must not be moved or destroyed while in use.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>

#include "xpv/expected.h"
#include "xpv/unique_fd.h"

namespace xpv::domain {

class EventFd {
 public:
  EventFd() noexcept = default;  // holds no fd (valid() == false)
  // Adopts an fd that is an eventfd (e.g. one received with SCM_RIGHTS).
  explicit EventFd(UniqueFd fd) noexcept : fd_(std::move(fd)) {}

  static Expected<EventFd, int> create(std::uint32_t initial = 0) noexcept {
    int fd = ::eventfd(initial, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) return fail(errno);
    return EventFd(UniqueFd(fd));
  }

  bool valid() const noexcept { return fd_.valid(); }
  int fd() const noexcept { return fd_.get(); }

  // Adds n (> 0) to the counter. A full counter (EAGAIN: 2^64-2 unread events) already wakes
  // every reader, so it counts as success.
  Expected<void, int> notify(std::uint64_t n = 1) const noexcept {
    for (;;) {
      ssize_t r = ::write(fd_.get(), &n, sizeof n);
      if (r == static_cast<ssize_t>(sizeof n)) return {};
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == EAGAIN) return {};
      return fail(r < 0 ? errno : EIO);
    }
  }

  // Reads and resets the counter: the number of notifications since the last consume, 0 if none.
  Expected<std::uint64_t, int> consume() const noexcept {
    for (;;) {
      std::uint64_t v = 0;
      ssize_t r = ::read(fd_.get(), &v, sizeof v);
      if (r == static_cast<ssize_t>(sizeof v)) return v;
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == EAGAIN) return std::uint64_t{0};
      return fail(r < 0 ? errno : EIO);
    }
  }

  // Waits up to timeout_ms (-1: forever) for the counter to become non-zero, then consumes it.
  // Returns 0 on timeout.
  Expected<std::uint64_t, int> wait(int timeout_ms) const noexcept {
    pollfd p{fd_.get(), POLLIN, 0};
    for (;;) {
      int r = ::poll(&p, 1, timeout_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return fail(errno);
      if (r == 0) return std::uint64_t{0};
      return consume();
    }
  }

  // A second descriptor for the same eventfd (close-on-exec), e.g. to pass with SCM_RIGHTS.
  Expected<UniqueFd, int> dup() const noexcept {
    int fd = ::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return fail(errno);
    return UniqueFd(fd);
  }

 private:
  UniqueFd fd_;
};

}  // namespace xpv::domain
