// FuseUring — FUSE requests over io_uring (FUSE_OVER_IO_URING, Linux ≥ 6.14) for FuseDisk.
//
// Over /dev/fuse every request costs its server a read(2) and a writev(2), and a worker thread
// that the kernel wakes for it. Over io_uring the server hands the kernel, per CPU queue, a set
// of buffers (one "entry": a header area and a payload area) with FUSE_IO_URING_CMD_REGISTER;
// the kernel copies a request into a free entry of the queue of the CPU it was issued on and
// completes that command; the server answers by writing the reply into the same entry and
// submitting FUSE_IO_URING_CMD_COMMIT_AND_FETCH, which hands the reply over and gives the entry
// back for the next request — many answers and fetches per io_uring_enter(2), and no
// per-request system call of its own.
//
// Each worker thread owns one io_uring and the entries of some queues; it is the only thread
// that submits to that ring, so the kernel's task work that fills an entry runs in the worker
// itself (io_uring runs a command's completion work in the task that submitted it). A reply
// made on another thread (an asynchronous BlockTarget completing) is queued to the entry's
// worker, and woken through an eventfd only if the worker sleeps. With a Poller (the target's
// polling/poll), a worker that is awake with requests outstanding collects the answers itself
// while it spins, so the reply is made on the worker and no other thread is woken; before it
// sleeps it hands what is still in flight back to the target's thread.
//
// libfuse 3.14 (Debian 12) knows nothing of this: FuseDisk lets libfuse decode requests and
// build replies as usual (fuse_session_process_buf; replies through its custom I/O writev
// hook), and this class only carries them. The kernel ABI below is defined here because Debian
// 12's <linux/fuse.h> predates it (protocol 7.42).
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

namespace xpv::frontends::detail {

// FUSE_INIT flag (bit 41: bit 9 of flags2) — offered by the kernel when its fuse module has
// enable_uring set; the server accepts by setting it in its reply.
inline constexpr std::uint64_t kFuseOverIoUring = 1ULL << 41;
inline constexpr std::uint32_t kFuseIoUringCmdRegister = 1;
inline constexpr std::uint32_t kFuseIoUringCmdCommitAndFetch = 2;
inline constexpr std::size_t kFuseMinReadBuffer = 8192;

struct FuseUringEntInOut {
  std::uint64_t flags;
  std::uint64_t commit_id;   // the request's unique: what COMMIT_AND_FETCH names
  std::uint32_t payload_sz;  // bytes of the payload area in use (request, then reply)
  std::uint32_t padding;
  std::uint64_t reserved;
};
struct FuseUringReqHeader {
  unsigned char in_out[128];  // fuse_in_header (request) / fuse_out_header (reply)
  unsigned char op_in[128];   // the request's per-opcode header (fuse_read_in, …)
  FuseUringEntInOut ring_ent_in_out;
};
struct FuseUringCmdReq {  // the command area of a 128-byte SQE
  std::uint64_t flags;
  std::uint64_t commit_id;
  std::uint16_t qid;
  std::uint8_t padding[6];
};
static_assert(sizeof(FuseUringEntInOut) == 32);
static_assert(sizeof(FuseUringReqHeader) == 288);
static_assert(sizeof(FuseUringCmdReq) == 24);

class FuseUring {
 public:
  // Hands one request (fuse_in_header, its opcode header and payload, contiguous: `len` bytes)
  // to the request decoder. Runs on a worker thread; the request's memory stays valid until it
  // is answered.
  using Process = std::function<void(void* request, std::size_t len)>;

  // Sets up the rings for `queues` kernel queues (one per possible CPU) with `entries` entries
  // each and payload areas of `payload_size` bytes, on `threads` workers; starts nothing yet.
  // Throws std::runtime_error if a ring or the buffers cannot be had (io_uring without 128-byte
  // SQEs, no memory) — before the server accepts FUSE_OVER_IO_URING, so it can decline.
  // Optional polling hooks (BlockTarget::polling/poll): a worker polls while it is awake and has
  // requests outstanding, and stops before it sleeps.
  struct Poller {
    std::function<void(bool)> polling;
    std::function<void()> poll;
  };
  FuseUring(int dev_fd, unsigned queues, unsigned entries, unsigned threads, std::size_t payload_size, Process process,
            Poller poller = {});
  ~FuseUring();  // stop(), then the rings and buffers go
  FuseUring(const FuseUring&) = delete;
  FuseUring& operator=(const FuseUring&) = delete;

  // Starts the workers; each registers its entries with the kernel (only valid once the kernel
  // has taken the FUSE_INIT reply). Until every queue has an entry the kernel holds requests.
  void start();
  // The file system is about to be unmounted: entries the kernel gives back from now on, with
  // whatever error, are the teardown's (no warning).
  void closing() noexcept { closing_.store(true, std::memory_order_relaxed); }
  // Ends the workers. Entries the kernel still holds are cancelled when the rings close.
  void stop();

  // A reply (iov[0] = fuse_out_header), from any thread. true: it answers a request this ring
  // delivered and was taken (copied into the request's entry and queued for commit); false: not
  // a request of the ring (one read from /dev/fuse), the caller writes it to the device.
  bool reply(const iovec* iov, int count);

  // Requests delivered through the ring so far; registrations the kernel refused.
  std::uint64_t requests() const noexcept { return requests_.load(std::memory_order_relaxed); }
  std::uint64_t refused() const noexcept { return refused_.load(std::memory_order_relaxed); }

  // True on a worker thread: work that blocks should be handed elsewhere (it holds up every
  // request of the worker's queues).
  static bool on_worker_thread() noexcept;
  // While the request decoder runs for a ring request: that request's payload area (its reply
  // is copied there; a read may fill it directly, saving the copy). Empty otherwise.
  static std::span<unsigned char> current_payload() noexcept;

  struct Worker;
  struct Entry;

 private:
  void set_up(unsigned queues, unsigned entries, unsigned threads);
  void release() noexcept;
  void run(Worker& w);
  void handle(Worker& w, Entry& e);

  int dev_fd_ = -1;  // a dup of the session's /dev/fuse descriptor
  std::size_t payload_size_;
  Process process_;
  Poller poller_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex pending_m_;
  std::unordered_map<std::uint64_t, Entry*> pending_;  // unique → entry, until its reply
  std::atomic<bool> stopping_{false}, closing_{false};
  std::atomic<std::uint64_t> requests_{0}, refused_{0};
};

// The kernel's queue count for FUSE over io_uring: its possible CPUs
// (/sys/devices/system/cpu/possible). 0 if that cannot be read.
unsigned possible_cpus();

}  // namespace xpv::frontends::detail
