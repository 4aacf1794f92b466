#include "xpv/domain/memory.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <system_error>

namespace xpv::domain {
namespace {

bool page_aligned(std::uint64_t v) { return (v & (kPageSize - 1)) == 0; }

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace

DomainMemory DomainMemory::create(const std::string& name, const std::vector<RegionSpec>& regions) {
  std::vector<MemoryRegion> layout;
  std::uint64_t offset = 0;
  for (const RegionSpec& r : regions) {
    if (r.size == 0 || !page_aligned(r.gpa) || !page_aligned(r.size)) {
      throw std::invalid_argument(
          fmt::format("memory region at {:#x} size {:#x}: must be non-empty and page aligned", r.gpa,
                      r.size));
    }
    layout.push_back({r.gpa, r.size, offset});
    offset += r.size;
  }
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw_errno("memfd_create " + name);
  if (::ftruncate(fd.get(), static_cast<off_t>(offset)) != 0) throw_errno("ftruncate " + name);
  // The size is final: a peer that maps the file must never see it shrink under it (SIGBUS).
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw_errno("seal " + name);
  }
  return DomainMemory(std::move(fd), offset, std::move(layout));
}

DomainMemory DomainMemory::attach(UniqueFd memfd, std::vector<MemoryRegion> regions) {
  struct stat st {};
  if (::fstat(memfd.get(), &st) != 0) throw_errno("fstat of domain memory");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size == 0 || !page_aligned(size)) {
    throw std::invalid_argument(fmt::format("domain memory file size {:#x} is not page aligned", size));
  }
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const MemoryRegion& r = regions[i];
    if (r.size == 0 || !page_aligned(r.gpa) || !page_aligned(r.size) || !page_aligned(r.offset) ||
        r.offset > size || r.size > size - r.offset || r.gpa + r.size < r.gpa) {
      throw std::invalid_argument(fmt::format(
          "domain memory region {} (gpa {:#x} size {:#x} offset {:#x}) is not inside the {:#x}-byte file "
          "or not page aligned",
          i, r.gpa, r.size, r.offset, size));
    }
  }
  return DomainMemory(std::move(memfd), size, std::move(regions));
}

DomainMemory::DomainMemory(UniqueFd fd, std::uint64_t size, std::vector<MemoryRegion> layout)
    : fd_(std::move(fd)), size_(size), layout_(std::move(layout)) {
  void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (p == MAP_FAILED) throw_errno("mmap of domain memory");
  base_ = static_cast<std::uint8_t*>(p);
  std::vector<GuestMemory::Region> view_regions;
  for (const MemoryRegion& r : layout_) view_regions.push_back({r.gpa, r.size, base_ + r.offset});
  try {
    view_ = GuestMemory(std::move(view_regions));  // rejects overlapping guest-physical ranges
  } catch (...) {
    ::munmap(base_, size_);
    base_ = nullptr;
    throw;
  }
}

DomainMemory::DomainMemory(DomainMemory&& o) noexcept
    : fd_(std::move(o.fd_)),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      layout_(std::move(o.layout_)),
      view_(std::move(o.view_)) {}

DomainMemory& DomainMemory::operator=(DomainMemory&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(base_, size_);
    fd_ = std::move(o.fd_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    layout_ = std::move(o.layout_);
    view_ = std::move(o.view_);
  }
  return *this;
}

DomainMemory::~DomainMemory() {
  if (base_) ::munmap(base_, size_);
}

ContiguousMapping& ContiguousMapping::operator=(ContiguousMapping&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(base_, size_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

ContiguousMapping::~ContiguousMapping() {
  if (base_) ::munmap(base_, size_);
}

ContiguousMapping DomainMemory::map_contiguous(std::span<const std::uint64_t> gfns) const {
  if (gfns.empty()) throw std::invalid_argument("map_contiguous: no pages");
  // File offset of each page first: nothing is mapped for a bad list.
  std::vector<std::uint64_t> offsets;
  offsets.reserve(gfns.size());
  for (const std::uint64_t gfn : gfns) {
    const std::uint64_t gpa = gfn << kPageShift;
    const MemoryRegion* hit = nullptr;
    if ((gpa >> kPageShift) == gfn) {
      for (const MemoryRegion& r : layout_) {
        if (gpa >= r.gpa && gpa - r.gpa < r.size) hit = &r;
      }
    }
    if (!hit) throw std::invalid_argument(fmt::format("map_contiguous: gfn {:#x} is outside the domain's memory", gfn));
    offsets.push_back(hit->offset + (gpa - hit->gpa));
  }
  const std::size_t size = gfns.size() * kPageSize;
  void* p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw_errno("reserving a contiguous range");
  ContiguousMapping m(static_cast<std::uint8_t*>(p), size);  // unmaps the range on a throw below
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    void* at = static_cast<std::uint8_t*>(p) + i * kPageSize;
    if (::mmap(at, kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd_.get(),
               static_cast<off_t>(offsets[i])) == MAP_FAILED) {
      throw_errno("mapping a domain page into a contiguous range");
    }
  }
  return m;
}

}  // namespace xpv::domain
