#include "xpv/kvm/pc_devices.h"

#include <chrono>
#include <cstring>
#include <ctime>

namespace xpv::kvm {

void ResetPorts::read(std::uint64_t base, std::uint64_t, std::span<std::uint8_t> data) noexcept {
  // No keyboard controller behind 0x60/0x64: all-ones status, so Linux's i8042 probe sees a
  // buffer that never drains and says "No controller found" at once (a status of 0 makes it wait
  // for a CTR that never comes: 10 × 500 ms of boot time).
  std::memset(data.data(), 0xff, data.size());
  if (base == 0x92 && !data.empty()) data[0] = port92_.load();
}

void ResetPorts::write(std::uint64_t base, std::uint64_t, std::span<const std::uint8_t> data) noexcept {
  if (data.empty()) return;
  if (base == 0x64 && data[0] == 0xfe) {
    on_reset_();
  } else if (base == 0x92) {
    const std::uint8_t old = port92_.exchange(data[0]);
    if ((data[0] & 1) && !(old & 1)) on_reset_();  // rising edge of bit 0
  }
}

void PostPort::read(std::uint64_t, std::uint64_t, std::span<std::uint8_t> data) noexcept {
  std::memset(data.data(), 0xff, data.size());
}

namespace {
std::uint8_t bcd(int v) { return static_cast<std::uint8_t>(((v / 10) << 4) | (v % 10)); }
}  // namespace

std::uint8_t CmosRtc::reg(unsigned index) noexcept {
  std::time_t now = std::time(nullptr);
  std::tm t{};
  gmtime_r(&now, &t);
  switch (index) {
    case 0x00: return bcd(t.tm_sec);
    case 0x02: return bcd(t.tm_min);
    case 0x04: return bcd(t.tm_hour);
    case 0x06: return bcd(t.tm_wday + 1);
    case 0x07: return bcd(t.tm_mday);
    case 0x08: return bcd(t.tm_mon + 1);
    case 0x09: return bcd(t.tm_year % 100);
    case 0x32: return bcd(19 + t.tm_year / 100);  // century
    case 0x0a: return 0x26;                       // 32.768 kHz base, 1024 Hz, UIP clear
    case 0x0b: return 0x02;                       // 24h, BCD, no interrupts
    case 0x0c: return 0x00;
    case 0x0d: return 0x80;                       // valid RAM and time
    default: return ram_[index & 0x7f];
  }
}

void CmosRtc::read(std::uint64_t, std::uint64_t offset, std::span<std::uint8_t> data) noexcept {
  std::lock_guard lk(mu_);
  for (auto& b : data) b = offset == 1 ? reg(index_) : 0xff;
}

void CmosRtc::write(std::uint64_t, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept {
  std::lock_guard lk(mu_);
  if (data.empty()) return;
  if (offset == 0) {
    index_ = data[0] & 0x7f;  // bit 7 is the NMI mask
  } else if (index_ >= 0x0e) {
    ram_[index_] = data[0];  // NVRAM only; clock registers stay the host's
  }
}

void PmTimer::read(std::uint64_t, std::uint64_t offset, std::span<std::uint8_t> data) noexcept {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch()).count();
  // 3.579545 MHz, split into seconds and the rest so nothing overflows 64 bits.
  const auto uns = static_cast<std::uint64_t>(ns);
  const std::uint64_t ticks = (uns / 1000000000u) * 3579545u + ((uns % 1000000000u) * 3579545u) / 1000000000u;
  const std::uint32_t v = ticks & 0x00ffffffu;
  for (std::size_t i = 0; i < data.size(); ++i) {
    const std::uint64_t byte = offset + i;
    data[i] = byte < 4 ? static_cast<std::uint8_t>(v >> (8 * byte)) : 0;
  }
}

}  // namespace xpv::kvm
