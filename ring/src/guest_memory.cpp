#include "xpv/guest_memory.h"

#include <algorithm>
#include <stdexcept>

namespace xpv {

const char* to_string(MemError e) noexcept {
  switch (e) {
    case MemError::out_of_range: return "guest address range outside guest memory";
    case MemError::overlap: return "guest memory regions overlap";
  }
  return "unknown memory error";
}

GuestMemory::GuestMemory(std::vector<Region> regions) : regions_(std::move(regions)) {
  std::sort(regions_.begin(), regions_.end(),
            [](const Region& a, const Region& b) { return a.gpa < b.gpa; });
  for (std::size_t i = 0; i < regions_.size(); ++i) {
    const Region& r = regions_[i];
    if (r.size == 0 || r.host == nullptr || r.gpa + r.size < r.gpa) {
      throw std::invalid_argument("guest memory region is empty, unmapped or wraps around");
    }
    if (i > 0 && regions_[i - 1].gpa + regions_[i - 1].size > r.gpa) {
      throw std::invalid_argument(to_string(MemError::overlap));
    }
  }
}

Expected<std::span<std::uint8_t>, MemError> GuestMemory::translate(std::uint64_t gpa,
                                                                   std::uint64_t len) const noexcept {
  // Last region whose base is <= gpa.
  auto it = std::upper_bound(regions_.begin(), regions_.end(), gpa,
                             [](std::uint64_t a, const Region& r) { return a < r.gpa; });
  if (it == regions_.begin()) return fail(MemError::out_of_range);
  const Region& r = *--it;
  const std::uint64_t off = gpa - r.gpa;
  // off <= size and len <= size - off: no addition that could overflow.
  if (off > r.size || len > r.size - off) return fail(MemError::out_of_range);
  return std::span<std::uint8_t>(r.host + off, static_cast<std::size_t>(len));
}

}  // namespace xpv
