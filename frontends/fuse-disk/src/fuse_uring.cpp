// FuseUring (see fuse_uring.h): the workers, the entries and the reply hand-off.
#include "fuse_uring.h"

#include <liburing.h>
#include <linux/fuse.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "xpv/adaptive_poll.h"
#include "xpv/thread_name.h"

namespace xpv::frontends::detail {

namespace {

// Each entry: a page for the header area, then its payload area. The request decoder wants
// the request contiguous (header, opcode header, payload), so the two headers are copied to
// the end of the header page, right in front of the payload: no copy of the payload itself.
constexpr std::size_t kHeaderPage = 4096;
constexpr std::uint64_t kWakeTag = 1;  // user_data of the eventfd read; entries are pointers
// A worker with nothing to do looks for replies and requests this long before it sleeps (the
// window adapts: xpv/adaptive_poll.h): a reply found while spinning costs its thread no eventfd
// write and the worker no wake-up. 100 µs, as xpv-blkback's queues: about one round trip
// through the PV disk on these machines.
constexpr std::chrono::nanoseconds kPollMax{100000};

thread_local bool t_worker = false;
thread_local std::span<unsigned char> t_payload;

}  // namespace

struct FuseUring::Entry {
  unsigned char* base = nullptr;  // header page; the payload follows it
  iovec iov[2]{};
  std::uint16_t qid = 0;
  std::uint64_t unique = 0;  // of the request it holds
  Worker* owner = nullptr;
  FuseUringReqHeader& header() { return *reinterpret_cast<FuseUringReqHeader*>(base); }
  unsigned char* payload() { return base + kHeaderPage; }
};

struct FuseUring::Worker {
  io_uring ring{};
  bool ring_ok = false;
  int wake_fd = -1;
  std::uint64_t wake_buf = 0;
  void* area = nullptr;
  std::size_t area_size = 0;
  std::vector<Entry> entries;
  std::thread thread;
  std::mutex m;
  std::vector<Entry*> commits;  // answered, to be committed (under m)
  bool sleeping = false;        // waiting in the kernel with nothing to submit (under m)
  std::atomic<bool> has_commits{false};  // commits is not empty: what a spinning worker looks at
  unsigned outstanding = 0;  // requests handed to the decoder, not yet committed (worker only)
  AdaptivePoll poll{kPollMax};
};

unsigned possible_cpus() {
  std::ifstream f("/sys/devices/system/cpu/possible");
  std::string list;
  if (!std::getline(f, list)) return 0;
  unsigned n = 0;
  std::stringstream ss(list);
  std::string part;
  while (std::getline(ss, part, ',')) {
    unsigned a = 0, b = 0;
    const auto dash = part.find('-');
    try {
      a = static_cast<unsigned>(std::stoul(part.substr(0, dash)));
      b = dash == std::string::npos ? a : static_cast<unsigned>(std::stoul(part.substr(dash + 1)));
    } catch (const std::exception&) {
      return 0;
    }
    if (b < a) return 0;
    n += b - a + 1;
  }
  return n;
}

bool FuseUring::on_worker_thread() noexcept { return t_worker; }
std::span<unsigned char> FuseUring::current_payload() noexcept { return t_payload; }

FuseUring::FuseUring(int dev_fd, unsigned queues, unsigned entries, unsigned threads, std::size_t payload_size,
                     Process process, Poller poller)
    : payload_size_(payload_size), process_(std::move(process)), poller_(std::move(poller)) {
  // Our own descriptor of the device: libfuse closes its own when it unmounts, and answers still
  // to be committed after that must not find the number gone (or taken by another file).
  dev_fd_ = ::fcntl(dev_fd, F_DUPFD_CLOEXEC, 0);
  if (dev_fd_ < 0) throw std::runtime_error(std::string("FUSE io_uring: dup of /dev/fuse: ") + std::strerror(errno));
  try {
    set_up(queues, entries, threads);
  } catch (...) {
    release();  // nothing is left half made
    throw;
  }
}

void FuseUring::set_up(unsigned queues, unsigned entries, unsigned threads) {
  const std::size_t payload_size = payload_size_;
  if (queues == 0 || entries == 0 || threads == 0 || queues > 0xffff) {
    throw std::runtime_error("FUSE io_uring: bad geometry (queues " + std::to_string(queues) + ", entries " +
                             std::to_string(entries) + ", threads " + std::to_string(threads) + ")");
  }
  threads = std::min(threads, queues);
  const std::size_t entry_size = kHeaderPage + (payload_size + kHeaderPage - 1) / kHeaderPage * kHeaderPage;
  for (unsigned t = 0; t < threads; ++t) {
    auto w = std::make_unique<Worker>();
    Worker& wr = *w;
    workers_.push_back(std::move(w));
    unsigned mine = 0;
    for (unsigned q = t; q < queues; q += threads) mine += entries;
    wr.area_size = entry_size * mine;
    // Reserved lazily: a 4 KiB request touches 8 KiB of its entry, not the 1 MiB it may hold.
    wr.area = ::mmap(nullptr, wr.area_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (wr.area == MAP_FAILED) {
      wr.area = nullptr;
      throw std::runtime_error("FUSE io_uring: cannot map " + std::to_string(wr.area_size) + " bytes of buffers");
    }
    wr.entries.resize(mine);
    std::size_t i = 0;
    for (unsigned q = t; q < queues; q += threads) {
      for (unsigned k = 0; k < entries; ++k, ++i) {
        Entry& e = wr.entries[i];
        e.base = static_cast<unsigned char*>(wr.area) + i * entry_size;
        e.iov[0] = {e.base, sizeof(FuseUringReqHeader)};
        e.iov[1] = {e.payload(), payload_size};
        e.qid = static_cast<std::uint16_t>(q);
        e.owner = &wr;
      }
    }
    wr.wake_fd = ::eventfd(0, EFD_CLOEXEC);
    if (wr.wake_fd < 0) throw std::runtime_error(std::string("FUSE io_uring: eventfd: ") + std::strerror(errno));
    io_uring_params p{};
    // COOP_TASKRUN: the kernel's work of filling an entry with a new request waits for the
    // worker's next entry into the kernel instead of interrupting it (an IPI: costly in a VM);
    // TASKRUN_FLAG marks such work pending in the SQ ring's flags, which the worker looks at.
    // Measured on this 2-vCPU machine (fio through the PV disk's FUSE file, image on the cloud
    // volume, two alternations): 4k randread qd32 36–39k against 30–31k IOPS, 4k randwrite qd32
    // 33–36k against 25k; qd1 within noise.
    p.flags = IORING_SETUP_SQE128 | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
    unsigned depth = 8;
    while (depth < mine + 2) depth *= 2;
    if (int rc = io_uring_queue_init_params(depth, &wr.ring, &p); rc < 0) {
      throw std::runtime_error(std::string("FUSE io_uring: io_uring with 128-byte SQEs: ") + std::strerror(-rc));
    }
    wr.ring_ok = true;
  }
}

FuseUring::~FuseUring() {
  stop();
  release();
}

void FuseUring::release() noexcept {
  for (auto& w : workers_) {
    if (w->ring_ok) io_uring_queue_exit(&w->ring);  // cancels the commands the kernel still holds
    if (w->wake_fd >= 0) ::close(w->wake_fd);
    if (w->area) ::munmap(w->area, w->area_size);
  }
  workers_.clear();
  if (dev_fd_ >= 0) ::close(dev_fd_);
  dev_fd_ = -1;
}

void FuseUring::start() {
  for (std::size_t t = 0; t < workers_.size(); ++t) {
    Worker* wp = workers_[t].get();
    wp->thread = std::thread([this, wp, t] {
      set_thread_name("fuse-ring" + std::to_string(t));
      run(*wp);
    });
  }
}

void FuseUring::stop() {
  stopping_.store(true, std::memory_order_release);
  for (auto& w : workers_) {
    if (!w->thread.joinable()) continue;
    const std::uint64_t one = 1;
    (void)!::write(w->wake_fd, &one, sizeof one);
    w->thread.join();
  }
}

namespace {

io_uring_sqe* sqe_of(io_uring& ring) {
  io_uring_sqe* s = io_uring_get_sqe(&ring);
  if (s == nullptr) {
    (void)io_uring_submit(&ring);
    s = io_uring_get_sqe(&ring);
  }
  return s;  // the ring holds one SQE per entry plus the eventfd read: never null after a submit
}

void prep_cmd(io_uring& ring, int fd, std::uint32_t op, FuseUring::Entry& e, std::uint16_t qid, std::uint64_t commit_id,
              iovec* iov) {
  io_uring_sqe* s = sqe_of(ring);
  // A 128-byte SQE (IORING_SETUP_SQE128): the command area runs past struct io_uring_sqe.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
  std::memset(static_cast<void*>(s), 0, 128);
  s->opcode = IORING_OP_URING_CMD;
  s->fd = fd;
  s->cmd_op = op;
  s->addr = reinterpret_cast<std::uint64_t>(iov);
  s->len = 2;
  auto* cmd = reinterpret_cast<FuseUringCmdReq*>(s->cmd);
  cmd->qid = qid;
  cmd->commit_id = commit_id;
#pragma GCC diagnostic pop
  io_uring_sqe_set_data(s, &e);
}

void prep_wake(io_uring& ring, int fd, std::uint64_t* buf) {
  io_uring_sqe* s = sqe_of(ring);
  io_uring_prep_read(s, fd, buf, sizeof *buf, 0);
  io_uring_sqe_set_data64(s, kWakeTag);
}

}  // namespace

void FuseUring::run(Worker& w) {
  t_worker = true;
  for (Entry& e : w.entries) prep_cmd(w.ring, dev_fd_, kFuseIoUringCmdRegister, e, e.qid, 0, e.iov);
  prep_wake(w.ring, w.wake_fd, &w.wake_buf);
  std::vector<Entry*> commits;
  unsigned live = static_cast<unsigned>(w.entries.size());  // entries whose command the kernel holds or will
  bool sleep = false;
  const bool polls = poller_.poll && poller_.polling;
  bool polling = false;  // poller_.polling(true) in force
  for (;;) {
    auto idle = [&] {
      return !w.has_commits.load(std::memory_order_acquire) && io_uring_cq_ready(&w.ring) == 0 &&
             !(IO_URING_READ_ONCE(*w.ring.sq.kflags) & IORING_SQ_TASKRUN) &&  // a request waits to be filled in
             io_uring_sq_ready(&w.ring) == 0 && !stopping_.load(std::memory_order_relaxed);
    };
    // With a poller, spin for any request awaiting its reply, collecting the answers here: the
    // target's own thread stays asleep meanwhile (polling(true)), so no answer is handed from
    // thread to thread and no second thread spins. Measured (`xpv bench blk --quick`, three
    // alternations on this 2-vCPU machine, session 23; means): 4k randread qd1 10.5k against
    // 9.8k IOPS, randread qd32 72k against 62k, randwrite qd32 59k against 55k (six more
    // alternations of a first version, which took polling(true) only after starting the
    // requests: 12.1k / 10.7k, 72k / 64k, 59k / 54k). Without one, spin only with several
    // requests awaiting their replies: with one, the thread that will answer it spins itself
    // (Blkfront's completion thread), and a third spinner on two CPUs delays both (tmpfs image,
    // 4k randread qd1: ~10k IOPS with the spin, ~17k without).
    const bool spun = idle() && w.outstanding >= (polling ? 1u : 2u) && !w.poll.spin([&] {
      if (polling) poller_.poll();
      return !idle();
    });
    {
      std::lock_guard l(w.m);
      commits.swap(w.commits);
      w.has_commits.store(false, std::memory_order_relaxed);
      // Sleep in the kernel only with nothing to submit and nothing reaped: a reply queued from
      // another thread after this sees `sleeping` and writes the eventfd.
      sleep = commits.empty() && io_uring_cq_ready(&w.ring) == 0 && io_uring_sq_ready(&w.ring) == 0;
      w.sleeping = sleep;
    }
    for (Entry* e : commits) {
      --w.outstanding;
      prep_cmd(w.ring, dev_fd_, kFuseIoUringCmdCommitAndFetch, *e, e->qid, e->unique, e->iov);
    }
    commits.clear();
    if (stopping_.load(std::memory_order_acquire)) {
      (void)io_uring_submit(&w.ring);  // answers already made still reach the kernel
      break;
    }
    if (sleep && polling) {
      poller_.polling(false);  // asleep: the target's own thread completes what is in flight
      polling = false;
    }
    const int rc = sleep ? io_uring_submit_and_wait(&w.ring, 1) : io_uring_submit(&w.ring);
    if (sleep) {
      std::lock_guard l(w.m);
      w.sleeping = false;
    }
    if (spun && sleep) w.poll.after_sleep();
    if (rc < 0 && rc != -EINTR && rc != -EBUSY) {
      spdlog::error("FUSE io_uring: io_uring_enter: {}; the worker stops", std::strerror(-rc));
      break;
    }
    if (polls && !polling && io_uring_cq_ready(&w.ring) > 0) {
      // Awake with work, before starting any of it: the answers are this worker's to collect,
      // and the target's thread need not wake up for them.
      poller_.polling(true);
      polling = true;
    }
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(&w.ring, head, cqe) {
      ++seen;
      const std::uint64_t tag = io_uring_cqe_get_data64(cqe);
      if (tag == kWakeTag) {
        if (!stopping_.load(std::memory_order_acquire)) prep_wake(w.ring, w.wake_fd, &w.wake_buf);
        continue;
      }
      Entry& e = *reinterpret_cast<Entry*>(tag);
      if (cqe->res < 0) {
        // The kernel gave the entry back without a request: torn down (unmount: -ENOTCONN,
        // -ECANCELED) or refused at registration.
        --live;
        if (cqe->res != -ENOTCONN && cqe->res != -ECANCELED && !closing_.load(std::memory_order_relaxed)) {
          refused_.fetch_add(1, std::memory_order_relaxed);
          spdlog::warn("FUSE io_uring: queue {}: the kernel refused an entry: {}", e.qid, std::strerror(-cqe->res));
        }
        continue;
      }
      handle(w, e);
    }
    io_uring_cq_advance(&w.ring, seen);
    if (live == 0 && stopping_.load(std::memory_order_acquire)) break;
  }
  if (polling) poller_.polling(false);
  t_worker = false;
}

void FuseUring::handle(Worker& w, Entry& e) {
  FuseUringReqHeader& h = e.header();
  fuse_in_header in{};
  std::memcpy(&in, h.in_out, sizeof in);
  const std::uint32_t payload = h.ring_ent_in_out.payload_sz;
  // The kernel's own layout: len covers the header, the opcode header and the payload.
  if (payload > payload_size_ || in.len < sizeof in + payload || in.len - sizeof in - payload > sizeof h.op_in) {
    spdlog::error("FUSE io_uring: queue {}: request {} of {} bytes with a payload of {}: not a request this "
                  "server can read; answered EIO",
                  e.qid, in.unique, in.len, payload);
    fuse_out_header out{sizeof(fuse_out_header), -EIO, in.unique};
    std::memcpy(h.in_out, &out, sizeof out);
    h.ring_ent_in_out.payload_sz = 0;
    e.unique = in.unique;
    ++w.outstanding;
    std::lock_guard l(w.m);
    w.commits.push_back(&e);
    w.has_commits.store(true, std::memory_order_release);
    return;
  }
  ++w.outstanding;
  const std::size_t op = in.len - sizeof in - payload;
  unsigned char* start = e.payload() - sizeof in - op;
  std::memmove(start + sizeof in, h.op_in, op);
  std::memcpy(start, &in, sizeof in);
  e.unique = in.unique;
  {
    std::lock_guard l(pending_m_);
    pending_[in.unique] = &e;
  }
  requests_.fetch_add(1, std::memory_order_relaxed);
  t_payload = {e.payload(), payload_size_};
  process_(start, in.len);
  t_payload = {};
}

bool FuseUring::reply(const iovec* iov, int count) {
  if (count < 1 || iov[0].iov_len < sizeof(fuse_out_header)) return false;
  fuse_out_header out{};
  std::memcpy(&out, iov[0].iov_base, sizeof out);
  Entry* e = nullptr;
  {
    std::lock_guard l(pending_m_);
    auto it = pending_.find(out.unique);
    if (it == pending_.end()) return false;
    e = it->second;
    pending_.erase(it);
  }
  FuseUringReqHeader& h = e->header();
  std::size_t used = 0;
  for (int i = 1; i < count; ++i) {
    const std::size_t n = iov[i].iov_len;
    if (n > payload_size_ - used) {  // libfuse never answers more than was asked; a bug if so
      spdlog::error("FUSE io_uring: a reply of more than {} bytes to request {}; answered EIO", payload_size_, out.unique);
      out.error = -EIO;
      used = 0;
      break;
    }
    if (iov[i].iov_base != e->payload() + used) std::memcpy(e->payload() + used, iov[i].iov_base, n);
    used += n;
  }
  out.len = static_cast<std::uint32_t>(sizeof out + used);
  std::memcpy(h.in_out, &out, sizeof out);
  h.ring_ent_in_out.payload_sz = static_cast<std::uint32_t>(used);
  Worker& w = *e->owner;
  bool wake = false;
  {
    std::lock_guard l(w.m);
    w.commits.push_back(e);
    w.has_commits.store(true, std::memory_order_release);
    if (w.sleeping) {
      w.sleeping = false;  // one wake-up is enough
      wake = true;
    }
  }
  if (wake) {
    const std::uint64_t one = 1;
    (void)!::write(w.wake_fd, &one, sizeof one);
  }
  return true;
}

}  // namespace xpv::frontends::detail
