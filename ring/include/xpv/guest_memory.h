// GuestMemory — bounded views of another domain's (or this domain's) memory.
//
// A domain's RAM is a set of regions of one or more memfds mapped into this process. Nothing in
// xpv touches guest memory through a raw pointer without a length: translation takes a guest
// physical address *and* a length and returns a std::span that lies entirely inside one region, or
// an error. (kvmtool's guest_flat_to_host checked only the start address; never do that.)
//
// Thread-safety: the region list is fixed after construction; translate() is const and may be
// called from any thread. The memory itself is shared with a guest that may change it at any time:
// callers copy what they validate (see ring/ and grant-table/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "xpv/expected.h"

namespace xpv {

inline constexpr std::uint64_t kPageShift = 12;
inline constexpr std::uint64_t kPageSize = std::uint64_t{1} << kPageShift;

enum class MemError {
  out_of_range,  // [gpa, gpa+len) is not inside one region (includes overflow of gpa+len)
  overlap,       // two regions given to the constructor overlap
};

const char* to_string(MemError e) noexcept;

class GuestMemory {
 public:
  struct Region {
    std::uint64_t gpa = 0;       // guest-physical base address
    std::uint64_t size = 0;      // bytes
    std::uint8_t* host = nullptr;  // where this process sees it
  };

  GuestMemory() = default;
  // Regions may come in any order; they must not overlap (checked: throws std::invalid_argument,
  // since this is setup code).
  explicit GuestMemory(std::vector<Region> regions);

  // [gpa, gpa+len) as one span, or out_of_range. len 0 is allowed and yields an empty span at gpa
  // when gpa lies inside a region (or at its end).
  Expected<std::span<std::uint8_t>, MemError> translate(std::uint64_t gpa,
                                                        std::uint64_t len) const noexcept;
  // The whole 4 KiB page with frame number gfn.
  Expected<std::span<std::uint8_t>, MemError> page(std::uint64_t gfn) const noexcept {
    if (gfn > (UINT64_MAX >> kPageShift)) return fail(MemError::out_of_range);
    return translate(gfn << kPageShift, kPageSize);
  }

  const std::vector<Region>& regions() const noexcept { return regions_; }

 private:
  std::vector<Region> regions_;  // sorted by gpa
};

}  // namespace xpv
