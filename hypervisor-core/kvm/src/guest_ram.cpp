#include "xpv/kvm/guest_ram.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xpv::kvm {
namespace {

constexpr std::uint64_t kHugePage = 2ull << 20;

// A file of `bytes` on a tmpfs of its own, mounted huge=within_size, or an invalid fd with *why
// set. The tmpfs is made with the new mount API (fsopen/fsconfig/fsmount): it is never attached to
// any mount point, so no mount table shows it and nothing is left behind by a crash; it lives as
// long as the file's last fd or mapping. Needs CAP_SYS_ADMIN and a kernel with THP.
UniqueFd huge_tmpfs_file(std::uint64_t bytes, std::string* why) {
  const auto fail = [why](const char* what) {
    *why = fmt::format("{}: {}", what, std::strerror(errno));
    return UniqueFd();
  };
  UniqueFd fs(fsopen("tmpfs", FSOPEN_CLOEXEC));
  if (!fs.valid()) return fail("fsopen tmpfs");
  // The size limit only has to let the file's last huge page exist.
  const std::string size = std::to_string((bytes + kHugePage - 1) / kHugePage * kHugePage);
  if (fsconfig(fs.get(), FSCONFIG_SET_STRING, "huge", "within_size", 0) != 0) return fail("tmpfs huge=within_size");
  if (fsconfig(fs.get(), FSCONFIG_SET_STRING, "size", size.c_str(), 0) != 0) return fail("tmpfs size");
  if (fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) return fail("tmpfs create");
  UniqueFd mnt(fsmount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOEXEC | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  if (!mnt.valid()) return fail("fsmount tmpfs");
  UniqueFd file(openat(mnt.get(), ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!file.valid()) return fail("O_TMPFILE on the tmpfs");
  return file;
}

}  // namespace

GuestRam::GuestRam(std::uint64_t size, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& device)
    : size_(size) {
  if (size == 0 || size % kPageSize != 0) {
    throw std::runtime_error(fmt::format("guest memory size {} is not a positive multiple of 4 KiB", size));
  }
  const std::uint64_t low = size < kLowRamMax ? size : kLowRamMax;
  std::uint64_t file = size;
  for (const auto& [gpa, len] : device) {
    // Device memory lives in the hole between low RAM and 4 GiB, page aligned.
    if (len == 0 || gpa % kPageSize != 0 || len % kPageSize != 0 || gpa < low || gpa + len > kHighRamBase ||
        gpa + len < gpa) {
      throw std::runtime_error(fmt::format("device memory [{:#x}, +{:#x}) is not page aligned inside the PCI hole",
                                           gpa, len));
    }
    file += len;
  }
  auto sorted = device;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1].first + sorted[i - 1].second > sorted[i].first) {
      throw std::runtime_error(fmt::format("device memory at {:#x} overlaps the region at {:#x}", sorted[i].first,
                                           sorted[i - 1].first));
    }
  }
  file_size_ = file;
  std::string why;
  fd_ = huge_tmpfs_file(file, &why);
  const bool huge_tmpfs = fd_.valid();
  if (huge_tmpfs) {
    backing_ = "tmpfs huge=within_size";
  } else {
    fd_ = UniqueFd(memfd_create("xpv-guest-ram", MFD_CLOEXEC));
    if (!fd_.valid()) throw std::runtime_error(fmt::format("memfd_create: {}", std::strerror(errno)));
    backing_ = "memfd (no huge tmpfs: " + why + ")";
  }
  if (ftruncate(fd_.get(), static_cast<off_t>(file)) != 0) {
    throw std::runtime_error(fmt::format("guest memory: ftruncate({} bytes): {}", file, std::strerror(errno)));
  }
  void* p = mmap(nullptr, file, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_.get(), 0);
  if (p == MAP_FAILED) {
    throw std::runtime_error(fmt::format("guest memory: mmap({} bytes): {}", file, std::strerror(errno)));
  }
  base_ = static_cast<std::uint8_t*>(p);
  // The memfd gets huge pages where the host's shmem_enabled is "advise" (a hint, no error if not).
  // Not for the tmpfs: there huge pages come from the mount, and MADV_HUGEPAGE would also let each
  // first touch stall in direct compaction (transparent_hugepage/defrag "madvise", the default).
  if (!huge_tmpfs) (void)madvise(p, file, MADV_HUGEPAGE);
  regions_.push_back(Region{0, low, 0, base_});
  if (size > low) regions_.push_back(Region{kHighRamBase, size - low, low, base_ + low});
  std::uint64_t off = size;
  for (const auto& [gpa, len] : device) {
    regions_.push_back(Region{gpa, len, off, base_ + off});
    off += len;
  }
  std::vector<GuestMemory::Region> view;
  for (const auto& r : regions_) view.push_back({r.gpa, r.size, r.host});
  memory_ = GuestMemory(std::move(view));
}

std::optional<std::uint64_t> GuestRam::ram_offset(std::uint64_t gpa, std::uint64_t bytes) const noexcept {
  for (const Region& r : regions_) {
    if (r.fd_offset >= size_) continue;  // device memory (it follows RAM in the file)
    if (gpa >= r.gpa && gpa - r.gpa <= r.size && bytes <= r.size - (gpa - r.gpa)) return r.fd_offset + (gpa - r.gpa);
  }
  return std::nullopt;
}

int GuestRam::discard(std::uint64_t gpa, std::uint64_t bytes) const noexcept {
  const auto off = ram_offset(gpa, bytes);
  if (!off || ((gpa | bytes) & 0xfff) != 0) return EINVAL;
  if (bytes == 0) return 0;
  if (::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(*off),
                  static_cast<off_t>(bytes)) != 0) {
    return errno;
  }
  return 0;
}

GuestRam::~GuestRam() {
  if (base_ != nullptr) munmap(base_, file_size_);
}

}  // namespace xpv::kvm
