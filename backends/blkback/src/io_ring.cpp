#include "xpv/blkback/io_ring.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <system_error>

namespace xpv::blkback {

IoRing::IoRing(unsigned entries) {
  if (int rc = io_uring_queue_init(entries, &ring_, 0); rc < 0) {
    throw std::system_error(-rc, std::generic_category(), "io_uring_queue_init");
  }
  event_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_) {
    const int e = errno;
    io_uring_queue_exit(&ring_);
    throw std::system_error(e, std::generic_category(), "eventfd");
  }
  if (int rc = io_uring_register_eventfd(&ring_, event_.get()); rc < 0) {
    io_uring_queue_exit(&ring_);
    throw std::system_error(-rc, std::generic_category(), "io_uring_register_eventfd");
  }
}

IoRing::~IoRing() {
  // Requests still in flight complete into pages we no longer look at; queue_exit waits for the
  // kernel to be done with them, so no I/O outlives the ring.
  io_uring_queue_exit(&ring_);
}

bool IoRing::ready_before_sleep() noexcept {
  std::uint64_t n;
  (void)!::read(event_.get(), &n, sizeof n);  // EAGAIN: nothing was signalled
  return completions_ready();
}

io_uring_sqe* IoRing::next_sqe() noexcept {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return nullptr;
  ++in_flight_;
  return sqe;
}

bool IoRing::readv(int fd, const iovec* iov, unsigned nr, std::uint64_t offset, std::uint64_t user,
                   bool drain) noexcept {
  io_uring_sqe* sqe = next_sqe();
  if (sqe == nullptr) return false;
  io_uring_prep_readv(sqe, fd, iov, nr, offset);
  finish(sqe, user, drain);
  return true;
}

bool IoRing::writev(int fd, const iovec* iov, unsigned nr, std::uint64_t offset, std::uint64_t user,
                    bool drain) noexcept {
  io_uring_sqe* sqe = next_sqe();
  if (sqe == nullptr) return false;
  io_uring_prep_writev(sqe, fd, iov, nr, offset);
  finish(sqe, user, drain);
  return true;
}

bool IoRing::fsync(int fd, bool datasync, std::uint64_t user, bool drain) noexcept {
  io_uring_sqe* sqe = next_sqe();
  if (sqe == nullptr) return false;
  io_uring_prep_fsync(sqe, fd, datasync ? IORING_FSYNC_DATASYNC : 0);
  finish(sqe, user, drain);
  return true;
}

bool IoRing::punch_hole(int fd, std::uint64_t offset, std::uint64_t len, std::uint64_t user) noexcept {
  io_uring_sqe* sqe = next_sqe();
  if (sqe == nullptr) return false;
  io_uring_prep_fallocate(sqe, fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          static_cast<off_t>(offset), static_cast<off_t>(len));
  finish(sqe, user, false);
  return true;
}

// After io_uring_prep_*: they reset the flags, so user data and flags are set last.
void IoRing::finish(io_uring_sqe* sqe, std::uint64_t user, bool drain) noexcept {
  io_uring_sqe_set_data64(sqe, user);
  if (drain) io_uring_sqe_set_flags(sqe, IOSQE_IO_DRAIN);
}

Expected<unsigned, int> IoRing::submit() noexcept {
  int rc = io_uring_submit(&ring_);
  if (rc < 0) return fail(rc);
  return static_cast<unsigned>(rc);
}

Expected<unsigned, int> IoRing::submit_and_wait(unsigned min_complete) noexcept {
  int rc = io_uring_submit_and_wait(&ring_, min_complete);
  if (rc < 0) return fail(rc);
  return static_cast<unsigned>(rc);
}

}  // namespace xpv::blkback
