#include "xpv/kvm/io_bus.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

namespace xpv::kvm {

Result<void> IoBus::add(std::uint64_t base, std::uint64_t len, BusDevice* dev, std::string what) {
  if (len == 0 || base + len < base) return err(fmt::format("{} bus: {}: bad range {:#x}+{:#x}", name_, what, base, len));
  if (dev == nullptr) return err(fmt::format("{} bus: {}: no device", name_, what));
  for (const auto& r : ranges_) {
    if (base < r.base + r.len && r.base < base + len) {
      return err(fmt::format("{} bus: {} [{:#x}, {:#x}) overlaps {} [{:#x}, {:#x})", name_, what, base,
                             base + len, r.what, r.base, r.base + r.len));
    }
  }
  ranges_.push_back(Range{base, len, dev, std::move(what)});
  std::sort(ranges_.begin(), ranges_.end(), [](const Range& a, const Range& b) { return a.base < b.base; });
  return {};
}

const IoBus::Range* IoBus::find(std::uint64_t addr, std::uint64_t len) const noexcept {
  // Few ranges (tens): the first range whose end lies above addr.
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), addr,
                             [](std::uint64_t a, const Range& r) { return a < r.base; });
  if (it == ranges_.begin()) return nullptr;
  --it;
  if (addr - it->base >= it->len || len > it->len - (addr - it->base)) return nullptr;
  return &*it;
}

bool IoBus::read(std::uint64_t addr, std::span<std::uint8_t> data) const noexcept {
  if (const Range* r = find(addr, data.size())) {
    r->dev->read(r->base, addr - r->base, data);
    return true;
  }
  std::memset(data.data(), 0xff, data.size());
  unclaimed_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

bool IoBus::write(std::uint64_t addr, std::span<const std::uint8_t> data) const noexcept {
  if (const Range* r = find(addr, data.size())) {
    r->dev->write(r->base, addr - r->base, data);
    return true;
  }
  unclaimed_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace xpv::kvm
