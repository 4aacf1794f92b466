#include "xpv/platform_pci/bars.h"

#include <algorithm>

namespace xpv::platform_pci {

void PlatformIoBar::read(std::uint64_t, std::uint64_t offset, std::span<std::uint8_t> data) noexcept {
  std::fill(data.begin(), data.end(), std::uint8_t{0});
  if (offset == kFlagsOffset && data.size() == 1) data[0] = ports_.platform_flags();
}

void PlatformIoBar::write(std::uint64_t, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept {
  if (data.size() != 1) return;
  if (offset == kFlagsOffset) {
    ports_.set_platform_flags(data[0]);
  } else if (offset == kLogOffset) {
    ports_.log_byte(data[0]);
  }
}

void PlatformMmioBar::read(std::uint64_t, std::uint64_t, std::span<std::uint8_t> data) noexcept {
  accesses_.fetch_add(1, std::memory_order_relaxed);
  std::fill(data.begin(), data.end(), std::uint8_t{0});
}

void PlatformMmioBar::write(std::uint64_t, std::uint64_t, std::span<const std::uint8_t>) noexcept {
  accesses_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace xpv::platform_pci
