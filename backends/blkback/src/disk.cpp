#include "xpv/blkback/disk.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <linux/fs.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xpv::blkback {
namespace {

// What O_DIRECT needs on this open regular file: file offsets aligned to `offset` (its storage's
// sector size: 4096 on 4 KiB-sector storage) and buffers to `memory`. 512 each where the kernel or
// the file system does not say (no STATX_DIOALIGN before Linux 6.1); offset 0 where the file
// system offers no O_DIRECT for it.
struct DioAlign {
  std::uint32_t offset = 512, memory = 512;
};
DioAlign direct_io_alignment(int fd) {
  struct statx stx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) != 0 || !(stx.stx_mask & STATX_DIOALIGN)) return {};
  return {stx.stx_dio_offset_align, stx.stx_dio_mem_align};
}

}  // namespace

Disk Disk::open(const std::string& path, bool readonly, bool direct) {
  const int mode = readonly ? O_RDONLY : O_RDWR;
  DiskInfo info;
  info.readonly = readonly;
  UniqueFd fd(::open(path.c_str(), mode | O_CLOEXEC | (direct ? O_DIRECT : 0)));
  if (fd) {
    info.direct = direct;
  } else if (direct && errno == EINVAL) {
    // The file system has no O_DIRECT (tmpfs, some FUSE): buffered I/O, flushes still honoured.
    fd.reset(::open(path.c_str(), mode | O_CLOEXEC));
    if (fd) spdlog::info("{}: no O_DIRECT on this file system; using buffered I/O", path);
  }
  if (!fd) throw std::runtime_error(fmt::format("disk '{}': cannot open: {}", path, std::strerror(errno)));

  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw std::runtime_error(fmt::format("disk '{}': fstat: {}", path, std::strerror(errno)));
  }
  std::uint64_t bytes = 0;
  if (S_ISREG(st.st_mode)) {
    bytes = static_cast<std::uint64_t>(st.st_size);
    info.discard = !readonly;  // FALLOC_FL_PUNCH_HOLE; a file system that lacks it answers EOPNOTSUPP
    const DioAlign align = direct_io_alignment(fd.get());
    // The guest is told the storage's sector size as its disk's physical one (blkif
    // "physical-sector-size"): it then aligns its I/O to it, and the host does no
    // read-modify-write of a sector for a smaller write.
    const std::uint32_t sector = align.offset;
    if (sector > 512 && sector <= 65536 && (sector & (sector - 1)) == 0) info.physical_block_size = sector;
    // Guest segments start at any 512-byte offset of a page: more than that, for offsets or
    // buffers, and O_DIRECT would refuse some of them.
    if (info.direct && (align.offset == 0 || align.offset > 512 || align.memory > 512)) {
      // A file on a file system over 4 KiB-sector storage takes O_DIRECT only in 4 KiB units, and
      // the guest sees a 512-byte-sector disk (an image's partition table and file systems were
      // made for that): O_DIRECT would fail its smaller requests with EINVAL. Buffered I/O takes any
      // 512-byte request; flushes are still honoured.
      // Reopened through /proc/self/fd: the same file, whatever the path names by now.
      UniqueFd buffered(::open(fmt::format("/proc/self/fd/{}", fd.get()).c_str(), mode | O_CLOEXEC));
      if (!buffered) throw std::runtime_error(fmt::format("disk '{}': cannot open: {}", path, std::strerror(errno)));
      spdlog::info("{}: O_DIRECT here needs more than 512-byte alignment; using buffered I/O", path);
      fd = std::move(buffered);
      info.direct = false;
    }
  } else if (S_ISBLK(st.st_mode)) {
    info.block_device = true;
    if (::ioctl(fd.get(), BLKGETSIZE64, &bytes) != 0) {
      throw std::runtime_error(fmt::format("disk '{}': BLKGETSIZE64: {}", path, std::strerror(errno)));
    }
    int lbs = 0;
    unsigned pbs = 0;
    if (::ioctl(fd.get(), BLKSSZGET, &lbs) == 0 && lbs >= 512) info.logical_block_size = static_cast<std::uint32_t>(lbs);
    if (::ioctl(fd.get(), BLKPBSZGET, &pbs) == 0 && pbs >= 512) info.physical_block_size = pbs;
    info.discard = !readonly;  // BLKDISCARD-style via fallocate on the device
  } else {
    throw std::runtime_error(fmt::format("disk '{}': not a regular file or block device", path));
  }
  if (bytes == 0 || bytes % 512 != 0) {
    throw std::runtime_error(
        fmt::format("disk '{}': size {} bytes is not a positive multiple of 512", path, bytes));
  }
  info.sectors = bytes / 512;
  return Disk(path, std::move(fd), info);
}

}  // namespace xpv::blkback
