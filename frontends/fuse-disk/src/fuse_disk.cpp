// FuseDisk on libfuse's low-level API (see fuse_disk.h): the low-level API lets a request be
// answered after its operation returned, which is what the asynchronous path needs.
#define FUSE_USE_VERSION 312
#include "xpv/frontends/fuse_disk.h"

#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <linux/falloc.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace xpv::frontends {

struct FuseDisk::Impl {
  BlockTarget& target;
  std::string name;
  fuse_session* se = nullptr;
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
  // The buffer lives until the reply: owned by the completion when the read is asynchronous.
  auto buf = std::make_shared<std::vector<std::uint8_t>>(size);
  BlockTarget::Done done = [req, buf, &d](long n) {
    if (n < 0) {
      fuse_reply_err(req, static_cast<int>(-n));
    } else {
      fuse_reply_buf(req, reinterpret_cast<const char*>(buf->data()), static_cast<size_t>(n));
    }
    d.end();
  };
  d.begin();
  if (d.target.start_read(static_cast<std::uint64_t>(off), *buf, done)) return;
  done(d.target.read(static_cast<std::uint64_t>(off), *buf));
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
  // `data` is libfuse's receive buffer: valid only until we return (start_write copies it).
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
  done(d.target.write(static_cast<std::uint64_t>(off), in));
}

// Only writes already acknowledged (replied to) are covered — what fsync promises.
void op_fsync(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*) {
  auto& d = self(req);
  if (ino != kDiskIno) return (void)fuse_reply_err(req, 0);
  reply_status(req, d.target.readonly() ? 0 : d.target.flush());
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
  reply_status(req, t.discard(static_cast<std::uint64_t>(off), static_cast<std::uint64_t>(len)));
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

}  // namespace

FuseDisk::FuseDisk(std::string mountpoint, std::string name, BlockTarget& target)
    : mountpoint_(std::move(mountpoint)), name_(std::move(name)), impl_(std::make_unique<Impl>(target, name_)) {
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
  loop_ = std::thread([se = impl_->se, mp = mountpoint_] {
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(cfg, 1);
    fuse_loop_cfg_set_idle_threads(cfg, 16);
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
  fuse_session_unmount(impl_->se);
  if (loop_.joinable()) loop_.join();
  {
    std::unique_lock l(impl_->m);
    while (!impl_->idle.wait_for(l, std::chrono::seconds(10), [&] { return impl_->in_flight == 0; })) {
      spdlog::warn("{}: waiting for {} request(s) still in flight on the disk", mountpoint_, impl_->in_flight);
    }
  }
  fuse_session_destroy(impl_->se);
}

}  // namespace xpv::frontends
