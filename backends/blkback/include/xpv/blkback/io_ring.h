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

  // Readable (eventfd counter) whenever completions were posted since the last
  // ready_before_sleep(). The kernel signals it for every completion: it is never turned off
  // (IORING_CQ_EVENTFD_DISABLED), because the kernel reads that flag after posting a CQE
  // without a full barrier in between (Linux 6.1 has one there, later kernels' io_eventfd_grab
  // none): a thread that turns it on, finds the CQ empty and sleeps can miss a completion posted
  // by an io-wq worker meanwhile, and nothing would wake it again.
  int completion_fd() const noexcept { return event_.get(); }
  // Completions posted and not reaped yet (a look at the shared CQ ring, no syscall).
  bool completions_ready() const noexcept { return io_uring_cq_ready(&ring_) > 0; }
  unsigned completions_waiting() const noexcept { return io_uring_cq_ready(&ring_); }
  // Before sleeping on completion_fd(): consumes its counter, then looks at the CQ ring. true:
  // completions are waiting (do not sleep). false: none was posted before the look, and any
  // posted after it signals the eventfd, so the sleep cannot miss it (the kernel stores the CQ
  // tail before it signals; the eventfd's lock orders that signal against the read here).
  bool ready_before_sleep() noexcept;
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
