// FuseDisk on libfuse's low-level API (see fuse_disk.h): the low-level API lets a request be
// answered after its operation returned, which is what the asynchronous path needs.
#define FUSE_USE_VERSION 312
#include "xpv/frontends/fuse_disk.h"

#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <linux/falloc.h>
#include <linux/fuse.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <fstream>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "fuse_uring.h"

#include "xpv/thread_name.h"

namespace xpv::frontends {

struct FuseDisk::Impl {
  BlockTarget& target;
  std::string name;
  FuseDiskOptions options;
  fuse_session* se = nullptr;
  // FUSE over io_uring (fuse_uring.h): set up while FUSE_INIT is answered, then read-only.
  std::uint64_t init_unique = 0;  // of the kernel's FUSE_INIT (seen by io_read)
  bool uring_offered = false;     // that FUSE_INIT offered FUSE_OVER_IO_URING
  std::unique_ptr<detail::FuseUring> uring_owner;
  std::atomic<detail::FuseUring*> uring{nullptr};
  std::unique_ptr<boost::asio::thread_pool> blocking;  // work a ring worker must not wait for
  // Asynchronous requests whose reply has not been sent: the session must outlive them.
  std::mutex m;
  std::condition_variable idle;
  unsigned in_flight = 0;

  void begin() {
    std::lock_guard l(m);
    ++in_flight;
  }
  void end() {
    std::lock_guard l(m);
    if (--in_flight == 0) idle.notify_all();
  }
};

namespace {

// Worker threads of the FUSE loop, and requests the kernel may have outstanding with us (its
// defaults, 12 background requests, would cap a queue-depth-32 workload at 12). Blocking requests
// need a worker each; asynchronous ones need a worker only to be started.
constexpr unsigned kMaxThreads = 64;
constexpr fuse_ino_t kDiskIno = 2;  // FUSE_ROOT_ID (1) is the directory
constexpr double kForever = 3600;   // the file, its name and its size never change

FuseDisk::Impl& self(fuse_req_t req) { return *static_cast<FuseDisk::Impl*>(fuse_req_userdata(req)); }

struct stat attr_of(const FuseDisk::Impl& d, fuse_ino_t ino) {
  struct stat st {};
  st.st_ino = ino;
  if (ino == FUSE_ROOT_ID) {
    st.st_mode = S_IFDIR | 0500;
    st.st_nlink = 2;
  } else {
    st.st_mode = S_IFREG | (d.target.readonly() ? 0400 : 0600);
    st.st_nlink = 1;
    st.st_size = static_cast<off_t>(d.target.size_bytes());
    st.st_blksize = 4096;
    st.st_blocks = st.st_size / 512;
  }
  return st;
}

void reply_status(fuse_req_t req, long rc) { fuse_reply_err(req, rc < 0 ? static_cast<int>(-rc) : 0); }

// Runs `fn` here, or — on a ring worker, where waiting holds up every request of its queues —
// on the blocking pool.
template <class Fn>
void run_blocking(FuseDisk::Impl& d, Fn&& fn) {
  if (d.blocking && detail::FuseUring::on_worker_thread()) {
    boost::asio::post(*d.blocking, std::forward<Fn>(fn));
  } else {
    fn();
  }
}

void op_init(void* userdata, fuse_conn_info* conn) {
  (void)userdata;
  conn->max_write = 1 << 20;
  conn->max_read = 1 << 20;
  conn->max_background = kMaxThreads;
  conn->congestion_threshold = kMaxThreads * 3 / 4;
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto& d = self(req);
  fuse_entry_param e{};
  e.entry_timeout = kForever;  // also caches a miss (ino 0: a negative entry)
  if (parent == FUSE_ROOT_ID && d.name == name) {
    e.ino = kDiskIno;
    e.attr = attr_of(d, kDiskIno);
    e.attr_timeout = kForever;
  }
  fuse_reply_entry(req, &e);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (ino != FUSE_ROOT_ID && ino != kDiskIno) return (void)fuse_reply_err(req, ENOENT);
  const struct stat st = attr_of(self(req), ino);
  fuse_reply_attr(req, &st, kForever);
}

void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  auto& d = self(req);
  if (ino != kDiskIno) return (void)fuse_reply_err(req, EPERM);
  // O_TRUNC on open, or a resize: a disk has the size it has. Nothing else is settable.
  if (to_set != FUSE_SET_ATTR_SIZE || static_cast<std::uint64_t>(attr->st_size) != d.target.size_bytes()) {
    return (void)fuse_reply_err(req, EPERM);
  }
  const struct stat st = attr_of(d, ino);
  fuse_reply_attr(req, &st, kForever);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  auto& d = self(req);
  if (ino != FUSE_ROOT_ID) return (void)fuse_reply_err(req, ENOTDIR);
  const std::pair<const char*, fuse_ino_t> entries[] = {{".", FUSE_ROOT_ID}, {"..", FUSE_ROOT_ID}, {d.name.c_str(), kDiskIno}};
  std::vector<char> buf(size);
  std::size_t used = 0;
  for (off_t i = off; i < static_cast<off_t>(std::size(entries)); ++i) {
    struct stat st {};
    st.st_ino = entries[i].second;
    st.st_mode = entries[i].second == kDiskIno ? S_IFREG : S_IFDIR;
    const std::size_t need = fuse_add_direntry(req, buf.data() + used, size - used, entries[i].first, &st, i + 1);
    if (need > size - used) break;  // the rest comes with the next call, at offset i
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (ino == FUSE_ROOT_ID) return (void)fuse_reply_err(req, EISDIR);
  if (ino != kDiskIno) return (void)fuse_reply_err(req, ENOENT);
  if ((fi->flags & O_ACCMODE) != O_RDONLY && self(req).target.readonly()) return (void)fuse_reply_err(req, EROFS);
  fi->direct_io = 1;  // no FUSE page cache: every write reaches the PV disk
  fi->keep_cache = 0;
  fuse_reply_open(req, fi);
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  auto& d = self(req);
  if (ino != kDiskIno) return (void)fuse_reply_err(req, EISDIR);
  const auto end = d.target.size_bytes();
  if (off < 0) return (void)fuse_reply_err(req, EINVAL);
  if (static_cast<std::uint64_t>(off) >= end || size == 0) return (void)fuse_reply_buf(req, nullptr, 0);
  size = static_cast<size_t>(std::min<std::uint64_t>(size, end - static_cast<std::uint64_t>(off)));
  // The buffer lives until the reply: for a request from a ring, its entry's payload area (the
  // reply's place: no copy); otherwise our own, owned by the completion when the read is
  // asynchronous.
  std::shared_ptr<std::uint8_t[]> own;
  std::span<std::uint8_t> buf = detail::FuseUring::current_payload();
  if (buf.size() >= size) {
    buf = buf.first(size);
  } else {
    own = std::make_shared_for_overwrite<std::uint8_t[]>(size);
    buf = {own.get(), size};
  }
  BlockTarget::Done done = [req, buf, own, &d](long n) {
    if (n < 0) {
      fuse_reply_err(req, static_cast<int>(-n));
    } else {
      fuse_reply_buf(req, reinterpret_cast<const char*>(buf.data()), static_cast<size_t>(n));
    }
    d.end();
  };
  d.begin();
  if (d.target.start_read(static_cast<std::uint64_t>(off), buf, done)) return;
  run_blocking(d, [&d, off, buf, done] { done(d.target.read(static_cast<std::uint64_t>(off), buf)); });
}

void op_write(fuse_req_t req, fuse_ino_t ino, const char* data, size_t size, off_t off, fuse_file_info*) {
  auto& d = self(req);
  if (ino != kDiskIno) return (void)fuse_reply_err(req, EISDIR);
  if (d.target.readonly()) return (void)fuse_reply_err(req, EROFS);
  const auto end = d.target.size_bytes();
  if (off < 0) return (void)fuse_reply_err(req, EINVAL);
  if (static_cast<std::uint64_t>(off) >= end || size > end - static_cast<std::uint64_t>(off)) {
    return (void)fuse_reply_err(req, ENOSPC);  // a disk does not grow
  }
  // `data` is libfuse's receive buffer: valid only until we return (start_write copies it) —
  // or, for a request from a ring, the ring entry's payload: valid until the reply.
  BlockTarget::Done done = [req, &d](long n) {
    if (n < 0) {
      fuse_reply_err(req, static_cast<int>(-n));
    } else {
      fuse_reply_write(req, static_cast<size_t>(n));
    }
    d.end();
  };
  const std::span<const std::uint8_t> in{reinterpret_cast<const std::uint8_t*>(data), size};
  d.begin();
  if (d.target.start_write(static_cast<std::uint64_t>(off), in, done)) return;
  run_blocking(d, [&d, off, in, done] { done(d.target.write(static_cast<std::uint64_t>(off), in)); });
}

// Only writes already acknowledged (replied to) are covered — what fsync promises.
void op_fsync(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*) {
  auto& d = self(req);
  if (ino != kDiskIno) return (void)fuse_reply_err(req, 0);
  run_blocking(d, [req, &d] { reply_status(req, d.target.readonly() ? 0 : d.target.flush()); });
}

void op_flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }  // close(): nothing cached
void op_release(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, fuse_file_info*) {
  auto& d = self(req);
  auto& t = d.target;
  if (ino != kDiskIno) return (void)fuse_reply_err(req, EISDIR);
  if (t.readonly()) return (void)fuse_reply_err(req, EROFS);
  if (mode != (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)) return (void)fuse_reply_err(req, EOPNOTSUPP);
  if (off < 0 || len <= 0 || static_cast<std::uint64_t>(off) > t.size_bytes() ||
      static_cast<std::uint64_t>(len) > t.size_bytes() - static_cast<std::uint64_t>(off)) {
    return (void)fuse_reply_err(req, EINVAL);
  }
  run_blocking(d, [req, &t, off, len] {
    reply_status(req, t.discard(static_cast<std::uint64_t>(off), static_cast<std::uint64_t>(len)));
  });
}

const fuse_lowlevel_ops kOps = [] {
  fuse_lowlevel_ops o{};
  o.init = op_init;
  o.lookup = op_lookup;
  o.getattr = op_getattr;
  o.setattr = op_setattr;
  o.readdir = op_readdir;
  o.open = op_open;
  o.read = op_read;
  o.write = op_write;
  o.flush = op_flush;
  o.release = op_release;
  o.fsync = op_fsync;
  o.fallocate = op_fallocate;
  return o;
}();

// --- FUSE over io_uring: libfuse's custom I/O hooks -------------------------------------------
// read: notes the kernel's FUSE_INIT (its unique, and whether it offers FUSE_OVER_IO_URING).
// writev: a reply to a ring request goes to its ring entry; the FUSE_INIT reply gets the flag
// (rings set up first, so that a failure can still decline); everything else goes to /dev/fuse.

ssize_t io_read(int fd, void* buf, size_t len, void* userdata) {
  auto& d = *static_cast<FuseDisk::Impl*>(userdata);
  const ssize_t n = ::read(fd, buf, len);
  if (n >= static_cast<ssize_t>(sizeof(fuse_in_header) + offsetof(fuse_init_in, flags2) + sizeof(std::uint32_t))) {
    fuse_in_header in{};
    std::memcpy(&in, buf, sizeof in);
    if (in.opcode == FUSE_INIT) {
      fuse_init_in init{};
      std::memcpy(&init, static_cast<const char*>(buf) + sizeof in,
                  std::min(sizeof init, static_cast<std::size_t>(n) - sizeof in));
      const std::uint64_t flags = init.flags | (init.flags & FUSE_INIT_EXT ? std::uint64_t{init.flags2} << 32 : 0);
      d.init_unique = in.unique;
      d.uring_offered = (flags & detail::kFuseOverIoUring) != 0;
    }
  }
  return n;
}

ssize_t answer_init(FuseDisk::Impl& d, int fd, iovec* iov, int count) {
  fuse_init_out out{};
  std::memcpy(&out, iov[1].iov_base, std::min(sizeof out, iov[1].iov_len));
  const unsigned queues = detail::possible_cpus();
  if (queues > 0) {
    // The kernel wants payload areas of max(FUSE_MIN_READ_BUFFER, max_write, max_pages pages).
    const std::size_t pages = (out.flags & FUSE_MAX_PAGES) ? out.max_pages : 32;
    const std::size_t payload = std::max({detail::kFuseMinReadBuffer, std::size_t{out.max_write}, pages * 4096});
    const unsigned entries = d.options.uring_entries ? d.options.uring_entries : std::clamp(128u / queues, 4u, 32u);
    const unsigned threads = d.options.uring_threads ? d.options.uring_threads : std::min(queues, 4u);
    try {
      d.uring_owner = std::make_unique<detail::FuseUring>(fuse_session_fd(d.se), queues, entries, threads, payload,
                                                          [se = d.se](void* req, std::size_t len) {
                                                            fuse_buf b{};
                                                            b.mem = req;
                                                            b.size = len;
                                                            fuse_session_process_buf(se, &b);
                                                          },
                                                          d.options.uring_poll
                                                              ? detail::FuseUring::Poller{
                                                                    [&t = d.target](bool on) { t.polling(on); },
                                                                    [&t = d.target] { t.poll(); }}
                                                              : detail::FuseUring::Poller{});
      d.blocking = std::make_unique<boost::asio::thread_pool>(16);
    } catch (const std::exception& e) {
      spdlog::warn("FUSE disk: FUSE over io_uring declined, /dev/fuse serves: {}", e.what());
      d.uring_owner.reset();
    }
  }
  if (!d.uring_owner) return ::writev(fd, iov, count);
  out.flags |= FUSE_INIT_EXT;
  out.flags2 |= static_cast<std::uint32_t>(detail::kFuseOverIoUring >> 32);
  std::vector<iovec> v(iov, iov + count);
  v[1] = {&out, std::min(sizeof out, iov[1].iov_len)};
  const ssize_t n = ::writev(fd, v.data(), count);
  if (n < 0) return n;
  // The kernel has taken the reply (its connection is initialised): the workers may register.
  d.uring.store(d.uring_owner.get(), std::memory_order_release);
  d.uring_owner->start();
  return n;
}

ssize_t io_writev(int fd, iovec* iov, int count, void* userdata) {
  auto& d = *static_cast<FuseDisk::Impl*>(userdata);
  std::size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  if (auto* u = d.uring.load(std::memory_order_acquire); u && u->reply(iov, count)) return static_cast<ssize_t>(total);
  if (count >= 2 && d.uring_offered && d.options.uring && iov[0].iov_len >= sizeof(fuse_out_header) &&
      iov[1].iov_len >= offsetof(fuse_init_out, flags2) + sizeof(std::uint32_t)) {
    fuse_out_header oh{};
    std::memcpy(&oh, iov[0].iov_base, sizeof oh);
    if (oh.unique == d.init_unique && oh.error == 0 && !d.uring_owner) return answer_init(d, fd, iov, count);
  }
  return ::writev(fd, iov, count);
}

constexpr fuse_custom_io kIo = {io_writev, io_read, nullptr, nullptr};

}  // namespace

bool FuseDisk::uring_active() const noexcept { return impl_->uring.load(std::memory_order_acquire) != nullptr; }
std::uint64_t FuseDisk::uring_requests() const noexcept {
  const auto* u = impl_->uring.load(std::memory_order_acquire);
  return u ? u->requests() : 0;
}

namespace {
constexpr const char* kUringParam = "/sys/module/fuse/parameters/enable_uring";
constexpr const char* kUringLock = "/run/lock/xpv-fuse-uring.lock";
constexpr const char* kUringMarker = "/run/lock/xpv-fuse-uring.was-off";

bool read_uring_param() {
  std::ifstream f(kUringParam);
  std::string v;
  return static_cast<bool>(f >> v) && (v == "Y" || v == "1");
}
void write_uring_param(bool on) {
  std::ofstream f(kUringParam);
  f << (on ? "Y" : "N");
  f.close();
  if (!f) throw std::runtime_error(std::string("cannot write ") + kUringParam + " (root?)");
}
}  // namespace

bool FuseDisk::uring_offered() { return read_uring_param(); }

bool FuseUringEnable::available() { return ::access(kUringParam, F_OK) == 0; }

FuseUringEnable::FuseUringEnable() {
  if (!available()) throw std::runtime_error(std::string("no ") + kUringParam + ": this kernel has no FUSE over io_uring");
  lock_fd_ = ::open(kUringLock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) throw std::runtime_error(std::string("cannot open ") + kUringLock + ": " + std::strerror(errno));
  // Switch under the exclusive lock, then hold a shared one. Taking shared after exclusive is
  // not atomic: a last holder leaving in between may switch it off again — so look again.
  for (int tries = 0; tries < 8; ++tries) {
    if (::flock(lock_fd_, LOCK_EX) != 0) break;
    try {
      if (!read_uring_param()) {
        if (::access(kUringMarker, F_OK) != 0) {
          std::ofstream marker(kUringMarker);
          marker << "enable_uring was N\n";
        }
        write_uring_param(true);
      }
    } catch (...) {
      ::close(lock_fd_);
      throw;
    }
    if (::flock(lock_fd_, LOCK_SH) != 0) break;
    if (read_uring_param()) return;
  }
  ::close(lock_fd_);
  throw std::runtime_error(std::string("cannot hold ") + kUringParam + " on (" + kUringLock + ")");
}

FuseUringEnable::~FuseUringEnable() {
  // The last holder (no shared lock left but ours) restores what the first found.
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) == 0 && ::access(kUringMarker, F_OK) == 0) {
    try {
      write_uring_param(false);
      ::unlink(kUringMarker);
    } catch (const std::exception& e) {
      spdlog::warn("{}", e.what());
    }
  }
  ::close(lock_fd_);
}

FuseDisk::FuseDisk(std::string mountpoint, std::string name, BlockTarget& target, FuseDiskOptions options)
    : mountpoint_(std::move(mountpoint)),
      name_(std::move(name)),
      impl_(std::make_unique<Impl>(target, name_, options)) {
  if (name_.empty() || name_.find('/') != std::string::npos || name_ == "." || name_ == "..") {
    throw std::runtime_error("FUSE disk name '" + name_ + "' must be a plain file name");
  }
  // argv for libfuse: no -f/-d parsing, just the options we want.
  std::vector<std::string> args = {"xpv-fuse-disk", "-o", "max_read=1048576",
                                   "-o", "fsname=xpv", "-o", "subtype=xpv-disk"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  fuse_args fa = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  impl_->se = fuse_session_new(&fa, &kOps, sizeof kOps, impl_.get());
  fuse_opt_free_args(&fa);
  if (impl_->se == nullptr) throw std::runtime_error("FUSE disk at " + mountpoint_ + ": fuse_session_new failed");
  if (fuse_session_mount(impl_->se, mountpoint_.c_str()) != 0) {
    fuse_session_destroy(impl_->se);
    throw std::runtime_error("FUSE disk at " + mountpoint_ +
                             ": cannot mount (is /dev/fuse available and the directory empty?)");
  }
  // Our own I/O hooks on the mounted device (they only watch for FUSE over io_uring).
  if (options.uring && fuse_session_custom_io(impl_->se, &kIo, fuse_session_fd(impl_->se)) != 0) {
    fuse_session_unmount(impl_->se);
    fuse_session_destroy(impl_->se);
    throw std::runtime_error("FUSE disk at " + mountpoint_ + ": fuse_session_custom_io failed");
  }
  // Where the rings will be offered, /dev/fuse carries little (FUSE_INIT, interrupts, forgets)
  // and the kernel refuses to clone a device of a connection on io_uring: no clone_fd then.
  const bool rings_expected = options.uring && uring_offered();
  loop_ = std::thread([se = impl_->se, mp = mountpoint_, rings_expected] {
    set_thread_name("fuse-loop");
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(cfg, rings_expected ? 0 : 1);
    // Idle workers are kept (up to the maximum): with a lower limit, a queue-depth-32 load made
    // libfuse start and end ~70 workers a second (perf, session 22: a quarter of all samples in
    // short-lived threads over /dev/fuse).
    fuse_loop_cfg_set_idle_threads(cfg, kMaxThreads);
    fuse_loop_cfg_set_max_threads(cfg, kMaxThreads);
    if (int rc = fuse_session_loop_mt(se, cfg); rc != 0 && rc != SIGTERM) {
      spdlog::debug("{}: FUSE loop ended with {}", mp, rc);
    }
    fuse_loop_cfg_destroy(cfg);
  });
}

FuseDisk::~FuseDisk() {
  // Ask the loop to stop, then unmount: the kernel ends the session, blocked reads of /dev/fuse
  // return, and the loop's threads finish. Replies of asynchronous requests still in flight go to
  // the session (the kernel drops them): it is destroyed only after the last one.
  fuse_session_exit(impl_->se);
  if (auto* u = impl_->uring.load(std::memory_order_acquire)) u->closing();
  // End the connection now, also while files on it are open (a loop device, a reader): MNT_FORCE
  // has the kernel abort it (fuse's umount_begin), so their requests fail (ENOTCONN) instead of
  // waiting for a server that is going away, and the loop's threads leave their reads of the
  // device. Then the mount goes — detached if still in use. libfuse's unmount, seeing the
  // connection gone, only closes its descriptor.
  if (::umount2(mountpoint_.c_str(), MNT_FORCE) != 0) (void)::umount2(mountpoint_.c_str(), MNT_DETACH);
  fuse_session_unmount(impl_->se);
  if (loop_.joinable()) loop_.join();
  // The rings' workers stop first (the connection is gone: nothing more to fetch), so that none
  // hands the pool a job after it was joined; their entries stay until the last reply.
  if (impl_->uring_owner) impl_->uring_owner->stop();
  if (impl_->blocking) impl_->blocking->join();  // every job it was given has replied
  {
    std::unique_lock l(impl_->m);
    while (!impl_->idle.wait_for(l, std::chrono::seconds(10), [&] { return impl_->in_flight == 0; })) {
      spdlog::warn("{}: waiting for {} request(s) still in flight on the disk", mountpoint_, impl_->in_flight);
    }
  }
  // The rings go before the session, after the last reply (a late reply still finds its entry).
  impl_->uring.store(nullptr, std::memory_order_release);
  impl_->uring_owner.reset();
  fuse_session_destroy(impl_->se);
}

}  // namespace xpv::frontends
