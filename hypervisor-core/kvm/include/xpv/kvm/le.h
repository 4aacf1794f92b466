// Little-endian loads and stores on byte spans with bounds already checked by the caller
// (memcpy: no alignment or aliasing assumptions).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

namespace xpv::kvm::le {

template <class T>
inline T load(std::span<const std::uint8_t> s, std::size_t off) noexcept {
  T v{};
  std::memcpy(&v, s.data() + off, sizeof v);
  return v;
}

template <class T>
inline void store(std::span<std::uint8_t> s, std::size_t off, T v) noexcept {
  std::memcpy(s.data() + off, &v, sizeof v);
}

}  // namespace xpv::kvm::le
