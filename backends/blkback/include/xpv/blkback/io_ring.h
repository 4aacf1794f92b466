// IoRing — one io_uring per data-plane thread (DESIGN.md §3): the blkif queue drains its ring,
// queues one SQE per request (guest pages as the iovecs), submits the batch with one syscall and
// reaps completions, waking on a registered eventfd so that one poll covers both the event
// channel and the completions.
//
// Threading: an IoRing belongs to one thread. Queue calls never block and never allocate; they
// return false when the submission queue is full (submit, then queue again).
#pragma once

#include <liburing.h>
#include <sys/uio.h>

#include <cstdint>

#include "xpv/unique_fd.h"
#include "xpv/expected.h"

namespace xpv::blkback {

class IoRing {
 public:
  // `entries`: submission queue depth (rounded up to a power of two by the kernel). Throws
  // std::system_error if io_uring cannot be set up (disabled by sysctl, no memory).
  explicit IoRing(unsigned entries);
  ~IoRing();
  IoRing(const IoRing&) = delete;
  IoRing& operator=(const IoRing&) = delete;

  // drain: IOSQE_IO_DRAIN — starts only after every earlier request completed (write barriers).
  bool readv(int fd, const iovec* iov, unsigned nr, std::uint64_t offset, std::uint64_t user,
             bool drain = false) noexcept;
  bool writev(int fd, const iovec* iov, unsigned nr, std::uint64_t offset, std::uint64_t user,
              bool drain = false) noexcept;
  bool fsync(int fd, bool datasync, std::uint64_t user, bool drain = false) noexcept;
  // Deallocates [offset, offset+len) keeping the size (blkif discard): reads return zeros after.
  bool punch_hole(int fd, std::uint64_t offset, std::uint64_t len, std::uint64_t user) noexcept;

  // Submits everything queued; returns how many the kernel took, or -errno.
  Expected<unsigned, int> submit() noexcept;
  // Submits and waits until at least `min_complete` completions are available.
  Expected<unsigned, int> submit_and_wait(unsigned min_complete) noexcept;

  // Calls f(user, res) for each available completion (res: bytes done or -errno); returns count.
  template <class F>
  unsigned reap(F&& f) noexcept {
    unsigned n = 0;
    io_uring_cqe* cqe = nullptr;
    unsigned head;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      f(static_cast<std::uint64_t>(cqe->user_data), cqe->res);
      ++n;
    }
    io_uring_cq_advance(&ring_, n);
    in_flight_ -= n;
    return n;
  }

  // Readable (eventfd counter) whenever completions were posted. Consume it before reaping.
  int completion_fd() const noexcept { return event_.get(); }
  // Completions posted and not reaped yet (a look at the shared CQ ring, no syscall).
  bool completions_ready() const noexcept { return io_uring_cq_ready(&ring_) > 0; }
  // Whether completions signal completion_fd(): off while the owner polls the CQ itself (no
  // wake-up to pay for later). Turning it back on does not signal what came meanwhile: check
  // completions_ready() after it.
  void signal_completions(bool on) noexcept { (void)io_uring_cq_eventfd_toggle(&ring_, on); }
  unsigned in_flight() const noexcept { return in_flight_; }
  unsigned space() noexcept { return io_uring_sq_space_left(&ring_); }

 private:
  io_uring_sqe* next_sqe() noexcept;
  static void finish(io_uring_sqe* sqe, std::uint64_t user, bool drain) noexcept;

  io_uring ring_{};
  UniqueFd event_;
  unsigned in_flight_ = 0;  // queued or submitted, not yet reaped
};

}  // namespace xpv::blkback
