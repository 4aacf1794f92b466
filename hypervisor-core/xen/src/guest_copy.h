// Private helpers of the hypercall handlers: copying argument structs in and out of the calling
// vCPU's guest-virtual memory, and the Xen errno results.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "xpv/domain/evtchn_abi.h"
#include "xpv/xen/platform.h"

namespace xpv::xen::detail {

using domain::XenErrno;

constexpr std::int64_t err(XenErrno e) noexcept { return domain::to_hypercall_result(e); }

template <class T>
bool copy_in(GuestVirt& mem, std::uint64_t gva, T& out) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  std::array<std::uint8_t, sizeof(T)> buf;
  if (!mem.read(gva, buf)) return false;
  std::memcpy(&out, buf.data(), sizeof(T));
  return true;
}

template <class T>
bool copy_out(GuestVirt& mem, std::uint64_t gva, const T& in) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  std::array<std::uint8_t, sizeof(T)> buf;
  std::memcpy(buf.data(), &in, sizeof(T));
  return mem.write(gva, buf);
}

// A fixed-size, NUL-padded string buffer (xen_extraversion_t and friends).
template <std::size_t N>
std::array<char, N> padded(const char* s) noexcept {
  std::array<char, N> a{};
  const std::size_t n = std::min(std::strlen(s), N - 1);
  std::memcpy(a.data(), s, n);
  return a;
}

}  // namespace xpv::xen::detail
