// DomainMemory — a domain's RAM as one memfd, mapped MAP_SHARED, laid out as guest-physical
// regions (DESIGN.md §1: each domain process owns its memory and exports it to dom0 services).
//
// Two ways to get one:
//   create(): the domain process (xpv-vmm, xpv-front) makes the memfd, sizes it and maps it.
//   attach(): a dom0 service maps a memfd it received over the domain control socket, after
//             checking that every region the domain claims lies inside the file.
// In both cases view() gives the bounded GuestMemory over the same pages.
//
// Thread-safety: immutable after construction; view() may be used from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <utility>

#include "xpv/unique_fd.h"
#include "xpv/guest_memory.h"

namespace xpv::domain {

struct MemoryRegion {
  std::uint64_t gpa = 0;     // guest-physical base, page aligned
  std::uint64_t size = 0;    // bytes, page aligned, > 0
  std::uint64_t offset = 0;  // offset of the region in the memfd, page aligned
};

// A private, virtually contiguous mapping of some (not necessarily consecutive) pages of a
// domain's memfd: what a backend needs for a multi-page shared ring whose granted frames are
// scattered in guest-physical memory (blkif ring-page-order). Unmapped by the destructor.
class ContiguousMapping {
 public:
  ContiguousMapping() = default;
  ContiguousMapping(std::uint8_t* base, std::size_t size) noexcept : base_(base), size_(size) {}
  ContiguousMapping(ContiguousMapping&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  ContiguousMapping& operator=(ContiguousMapping&& o) noexcept;
  ContiguousMapping(const ContiguousMapping&) = delete;
  ContiguousMapping& operator=(const ContiguousMapping&) = delete;
  ~ContiguousMapping();

  std::span<std::uint8_t> bytes() const noexcept { return {base_, size_}; }

 private:
  std::uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
};

class DomainMemory {
 public:
  // Regions of `sizes` placed back to back in a new memfd named `name` (visible in
  // /proc/PID/fd). Throws std::system_error / std::invalid_argument (setup path).
  struct RegionSpec {
    std::uint64_t gpa;
    std::uint64_t size;
  };
  static DomainMemory create(const std::string& name, const std::vector<RegionSpec>& regions);

  // Maps a memfd received from a domain. Validates: file size known and page aligned, each region
  // page aligned, non-empty, inside the file, regions not overlapping in guest-physical space.
  // Throws std::invalid_argument naming the bad region, std::system_error for mmap failures.
  static DomainMemory attach(UniqueFd memfd, std::vector<MemoryRegion> regions);

  DomainMemory(DomainMemory&&) noexcept;
  DomainMemory& operator=(DomainMemory&&) noexcept;
  DomainMemory(const DomainMemory&) = delete;
  DomainMemory& operator=(const DomainMemory&) = delete;
  ~DomainMemory();

  const GuestMemory& view() const noexcept { return view_; }

  // Maps the pages `gfns` (in that order) back to back into one new range of this process:
  // a range is reserved (PROT_NONE) and each page of the memfd is mapped over its place with
  // MAP_FIXED, so the result is contiguous whatever the gfns are. The pages are the domain's
  // own (MAP_SHARED): writes are seen through view() and by the domain. Throws
  // std::invalid_argument for an empty list or a gfn outside every region, std::system_error
  // when mmap fails (setup path).
  ContiguousMapping map_contiguous(std::span<const std::uint64_t> gfns) const;
  int fd() const noexcept { return fd_.get(); }
  std::uint64_t file_size() const noexcept { return size_; }
  const std::vector<MemoryRegion>& layout() const noexcept { return layout_; }

 private:
  DomainMemory(UniqueFd fd, std::uint64_t size, std::vector<MemoryRegion> layout);

  UniqueFd fd_;
  std::uint8_t* base_ = nullptr;
  std::uint64_t size_ = 0;
  std::vector<MemoryRegion> layout_;
  GuestMemory view_;
};

}  // namespace xpv::domain
