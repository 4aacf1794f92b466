// The PV console page (io/console.h: struct xencons_interface).
//
// Two byte rings on one shared page: `in` (host → guest, 1024 bytes: keyboard input) and `out`
// (guest → host, 2048 bytes: console output). Indexes are free-running uint32 counters masked with
// the ring's size. The guest consumes `in` and produces `out`; the console backend the other way
// round. Use console_in_ring()/console_out_ring() to get a validated ByteRing view of each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "xpv/expected.h"
#include "xpv/ring/byte_ring.h"
#include "xpv/ring/ring_error.h"

namespace xpv::ring {

inline constexpr std::uint32_t kXenconsInSize = 1024;
inline constexpr std::uint32_t kXenconsOutSize = 2048;

struct XenconsInterface {
  char in[kXenconsInSize];    // 0x000: host → guest
  char out[kXenconsOutSize];  // 0x400: guest → host
  std::uint32_t in_cons;      // 0xc00: written by the guest
  std::uint32_t in_prod;      // 0xc04: written by the backend
  std::uint32_t out_cons;     // 0xc08: written by the backend
  std::uint32_t out_prod;     // 0xc0c: written by the guest
};
static_assert(std::is_standard_layout_v<XenconsInterface> && sizeof(XenconsInterface) == 0xc10);
static_assert(offsetof(XenconsInterface, out) == 0x400 && offsetof(XenconsInterface, in_cons) == 0xc00 &&
              offsetof(XenconsInterface, in_prod) == 0xc04 && offsetof(XenconsInterface, out_cons) == 0xc08 &&
              offsetof(XenconsInterface, out_prod) == 0xc0c);

// MASK_XENCONS_IDX for each ring.
constexpr std::uint32_t xencons_in_mask(std::uint32_t idx) noexcept { return idx & (kXenconsInSize - 1); }
constexpr std::uint32_t xencons_out_mask(std::uint32_t idx) noexcept { return idx & (kXenconsOutSize - 1); }
static_assert(xencons_in_mask(1024) == 0 && xencons_in_mask(1023) == 1023 && xencons_out_mask(0xffffffffu) == 2047);

// The interface at the start of a shared page: refuses a span shorter than the struct or not
// 4-byte aligned. The pointer is valid for sizeof(XenconsInterface) bytes, as long as the span.
inline Expected<XenconsInterface*, RingError> console_interface(std::span<std::uint8_t> page) noexcept {
  if (page.size() < sizeof(XenconsInterface)) return fail(RingError::too_small);
  if (reinterpret_cast<std::uintptr_t>(page.data()) % alignof(XenconsInterface) != 0) {
    return fail(RingError::misaligned);
  }
  return reinterpret_cast<XenconsInterface*>(page.data());
}

// in: the backend writes, the guest reads. out: the guest writes, the backend reads.
inline Expected<ByteRing, RingError> console_in_ring(XenconsInterface& intf) noexcept {
  return ByteRing::make(intf.in, intf.in_cons, intf.in_prod);
}
inline Expected<ByteRing, RingError> console_out_ring(XenconsInterface& intf) noexcept {
  return ByteRing::make(intf.out, intf.out_cons, intf.out_prod);
}

}  // namespace xpv::ring
