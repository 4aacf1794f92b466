#define FUSE_USE_VERSION 312
#include "xpv/frontends/fuse_disk.h"

#include <fcntl.h>
#include <fuse3/fuse.h>
#include <linux/falloc.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <csignal>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace xpv::frontends {

struct FuseDisk::Impl {
  BlockTarget& target;
  std::string name;
  fuse* f = nullptr;
};

namespace {

// Worker threads of the FUSE loop, and requests the kernel may have outstanding with us: the
// deepest queue a user of the file gets (the PV disk below has up to 16 × 32 slots).
constexpr unsigned kMaxThreads = 64;

FuseDisk::Impl& self() {
  return *static_cast<FuseDisk::Impl*>(fuse_get_context()->private_data);
}

bool is_disk(const char* path) { return path[0] == '/' && self().name == path + 1; }

int op_getattr(const char* path, struct stat* st, fuse_file_info*) {
  std::memset(st, 0, sizeof *st);
  if (std::strcmp(path, "/") == 0) {
    st->st_mode = S_IFDIR | 0500;
    st->st_nlink = 2;
    return 0;
  }
  if (!is_disk(path)) return -ENOENT;
  auto& d = self();
  st->st_mode = S_IFREG | (d.target.readonly() ? 0400 : 0600);
  st->st_nlink = 1;
  st->st_size = static_cast<off_t>(d.target.size_bytes());
  st->st_blksize = 4096;
  st->st_blocks = st->st_size / 512;
  return 0;
}

int op_readdir(const char* path, void* buf, fuse_fill_dir_t fill, off_t, fuse_file_info*,
               fuse_readdir_flags) {
  if (std::strcmp(path, "/") != 0) return -ENOTDIR;
  fill(buf, ".", nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
  fill(buf, "..", nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
  fill(buf, self().name.c_str(), nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
  return 0;
}

int op_open(const char* path, fuse_file_info* fi) {
  if (!is_disk(path)) return -ENOENT;
  if ((fi->flags & O_ACCMODE) != O_RDONLY && self().target.readonly()) return -EROFS;
  fi->direct_io = 1;      // no FUSE page cache: every write reaches the PV disk
  fi->keep_cache = 0;
  return 0;
}

int op_truncate(const char* path, off_t size, fuse_file_info*) {
  if (!is_disk(path)) return -ENOENT;
  // O_TRUNC on open, or a resize: a disk has the size it has.
  return static_cast<std::uint64_t>(size) == self().target.size_bytes() ? 0 : -EPERM;
}

int op_read(const char* path, char* buf, size_t size, off_t off, fuse_file_info*) {
  if (!is_disk(path)) return -ENOENT;
  auto& t = self().target;
  const auto end = t.size_bytes();
  if (off < 0) return -EINVAL;
  if (static_cast<std::uint64_t>(off) >= end) return 0;
  size = static_cast<size_t>(std::min<std::uint64_t>(size, end - static_cast<std::uint64_t>(off)));
  long n = t.read(static_cast<std::uint64_t>(off), {reinterpret_cast<std::uint8_t*>(buf), size});
  return static_cast<int>(n);
}

int op_write(const char* path, const char* buf, size_t size, off_t off, fuse_file_info*) {
  if (!is_disk(path)) return -ENOENT;
  auto& t = self().target;
  if (t.readonly()) return -EROFS;
  const auto end = t.size_bytes();
  if (off < 0) return -EINVAL;
  if (static_cast<std::uint64_t>(off) >= end || size > end - static_cast<std::uint64_t>(off)) {
    return -ENOSPC;  // a disk does not grow
  }
  long n = t.write(static_cast<std::uint64_t>(off), {reinterpret_cast<const std::uint8_t*>(buf), size});
  return static_cast<int>(n);
}

int op_fsync(const char* path, int, fuse_file_info*) {
  if (!is_disk(path)) return -ENOENT;
  return self().target.readonly() ? 0 : self().target.flush();
}

int op_fallocate(const char* path, int mode, off_t off, off_t len, fuse_file_info*) {
  if (!is_disk(path)) return -ENOENT;
  auto& t = self().target;
  if (t.readonly()) return -EROFS;
  if (mode != (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)) return -EOPNOTSUPP;
  if (off < 0 || len <= 0 || static_cast<std::uint64_t>(off) > t.size_bytes() ||
      static_cast<std::uint64_t>(len) > t.size_bytes() - static_cast<std::uint64_t>(off)) {
    return -EINVAL;
  }
  return t.discard(static_cast<std::uint64_t>(off), static_cast<std::uint64_t>(len));
}

void* op_init(fuse_conn_info* conn, fuse_config* cfg) {
  cfg->direct_io = 1;
  cfg->entry_timeout = cfg->attr_timeout = 3600;  // the file and its size never change
  cfg->negative_timeout = 3600;
  conn->max_write = 1 << 20;
  conn->max_read = 1 << 20;
  // Requests the kernel keeps in flight to us (its defaults, 12 and 9, would cap a queue-depth-32
  // workload at 12 whatever the disk behind us can do).
  conn->max_background = kMaxThreads;
  conn->congestion_threshold = kMaxThreads * 3 / 4;
  conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  return fuse_get_context()->private_data;
}

const fuse_operations kOps = [] {
  fuse_operations o{};
  o.getattr = op_getattr;
  o.readdir = op_readdir;
  o.open = op_open;
  o.truncate = op_truncate;
  o.read = op_read;
  o.write = op_write;
  o.fsync = op_fsync;
  o.fallocate = op_fallocate;
  o.init = op_init;
  return o;
}();

}  // namespace

FuseDisk::FuseDisk(std::string mountpoint, std::string name, BlockTarget& target)
    : mountpoint_(std::move(mountpoint)), name_(std::move(name)),
      impl_(std::make_unique<Impl>(Impl{target, name_, nullptr})) {
  if (name_.empty() || name_.find('/') != std::string::npos) {
    throw std::runtime_error("FUSE disk name '" + name_ + "' must be a plain file name");
  }
  // argv for libfuse: no -f/-d parsing, just the options we want.
  std::vector<std::string> args = {"xpv-fuse-disk", "-o", "max_read=1048576",
                                   "-o", "fsname=xpv", "-o", "subtype=xpv-disk"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  fuse_args fa = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  impl_->f = fuse_new(&fa, &kOps, sizeof kOps, impl_.get());
  fuse_opt_free_args(&fa);
  if (impl_->f == nullptr) throw std::runtime_error("FUSE disk at " + mountpoint_ + ": fuse_new failed");
  if (fuse_mount(impl_->f, mountpoint_.c_str()) != 0) {
    fuse_destroy(impl_->f);
    throw std::runtime_error("FUSE disk at " + mountpoint_ +
                             ": cannot mount (is /dev/fuse available and the directory empty?)");
  }
  loop_ = std::thread([f = impl_->f, mp = mountpoint_] {
    // libfuse's default of at most 10 worker threads would be the disk's queue depth: every
    // request a worker serves blocks it until the PV answer comes.
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(cfg, 1);
    fuse_loop_cfg_set_idle_threads(cfg, 16);
    fuse_loop_cfg_set_max_threads(cfg, kMaxThreads);
    if (int rc = fuse_loop_mt(f, cfg); rc != 0 && rc != SIGTERM) {
      spdlog::debug("{}: FUSE loop ended with {}", mp, rc);
    }
    fuse_loop_cfg_destroy(cfg);
  });
}

FuseDisk::~FuseDisk() {
  // Ask the loop to stop, then unmount: the kernel ends the session, blocked reads of /dev/fuse
  // return, and the loop's threads finish.
  fuse_exit(impl_->f);
  fuse_unmount(impl_->f);
  if (loop_.joinable()) loop_.join();
  fuse_destroy(impl_->f);
}

}  // namespace xpv::frontends
