// ByteRing — one direction of a masked byte ring (the console's in/out rings, io/console.h, and
// xenstore's req/rsp rings, io/xs_wire.h).
//
// A byte ring is a power-of-two char array plus two free-running uint32 indexes (cons, prod) in the
// same shared page; byte i lives at data[i & (size - 1)]. Unlike the request/response rings there is
// no event index: the writer notifies after every write that moved prod.
//
// Both indexes live in shared memory and the peer may write either of them (a broken or malicious
// guest), so each call reads both once, validates `prod - cons <= size` BEFORE touching data, and
// reports a bad pair as a protocol error (xenstored's domain.c does the same). The view keeps no
// state of its own: a restarted backend re-attaches to the same page and continues.
//
// Ordering (std::atomic_ref on the indexes):
//  - consumer (read): prod ACQUIRE (bytes before the index are visible), copy out, then cons stored
//    with RELEASE (our reads of the bytes happen before the producer may overwrite them);
//  - producer (write): cons ACQUIRE (the consumer's reads are done before we overwrite the space it
//    freed), copy in, then prod stored with RELEASE.
// Each side is used by one thread; the two sides may run concurrently.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "xpv/expected.h"
#include "xpv/ring/ring_error.h"

namespace xpv::ring {

class ByteRing {
 public:
  // `data`: the ring bytes, a power of two in size (1 .. 2^31); `cons`/`prod`: its indexes, 4-byte
  // aligned. All three normally lie in one shared page (see console.h, xenstore.h).
  static Expected<ByteRing, RingError> make(std::span<char> data, std::uint32_t& cons,
                                            std::uint32_t& prod) noexcept {
    if (data.empty() || !std::has_single_bit(data.size()) ||
        data.size() > (std::size_t{1} << 31)) {
      return fail(RingError::bad_size);
    }
    constexpr std::size_t kAlign = std::atomic_ref<std::uint32_t>::required_alignment;
    if (reinterpret_cast<std::uintptr_t>(&cons) % kAlign != 0 ||
        reinterpret_cast<std::uintptr_t>(&prod) % kAlign != 0) {
      return fail(RingError::misaligned);
    }
    return ByteRing(data, &cons, &prod);
  }

  std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(data_.size()); }
  std::uint32_t mask(std::uint32_t idx) const noexcept { return idx & (size() - 1); }

  // --- consumer side ---
  // Bytes ready to read, or bad_producer_index when prod - cons > size.
  Expected<std::uint32_t, RingError> readable() const noexcept {
    const std::uint32_t prod = prod_ref().load(std::memory_order_acquire);
    const std::uint32_t cons = cons_ref().load(std::memory_order_relaxed);
    const std::uint32_t used = prod - cons;
    if (used > size()) return fail(RingError::bad_producer_index);
    return used;
  }

  // Copies up to out.size() bytes out and advances cons; returns the count (0 when empty). On a bad
  // index nothing is read or written.
  Expected<std::size_t, RingError> read(std::span<char> out) noexcept {
    const std::uint32_t prod = prod_ref().load(std::memory_order_acquire);  // read once
    const std::uint32_t cons = cons_ref().load(std::memory_order_relaxed);
    const std::uint32_t used = prod - cons;
    if (used > size()) return fail(RingError::bad_producer_index);
    const std::uint32_t n =
        static_cast<std::uint32_t>(std::min<std::size_t>(used, out.size()));
    copy_from_ring(cons, out.first(n));
    cons_ref().store(cons + n, std::memory_order_release);
    return std::size_t{n};
  }

  // --- producer side ---
  // Free space, or bad_consumer_index when prod - cons > size.
  Expected<std::uint32_t, RingError> writable() const noexcept {
    const std::uint32_t cons = cons_ref().load(std::memory_order_acquire);
    const std::uint32_t prod = prod_ref().load(std::memory_order_relaxed);
    const std::uint32_t used = prod - cons;
    if (used > size()) return fail(RingError::bad_consumer_index);
    return size() - used;
  }

  // Copies as many bytes of `in` as fit and advances prod; returns the count (0 when full).
  Expected<std::size_t, RingError> write(std::span<const char> in) noexcept {
    const std::uint32_t cons = cons_ref().load(std::memory_order_acquire);  // read once
    const std::uint32_t prod = prod_ref().load(std::memory_order_relaxed);
    const std::uint32_t used = prod - cons;
    if (used > size()) return fail(RingError::bad_consumer_index);
    const std::uint32_t n =
        static_cast<std::uint32_t>(std::min<std::size_t>(size() - used, in.size()));
    copy_to_ring(prod, in.first(n));
    prod_ref().store(prod + n, std::memory_order_release);
    return std::size_t{n};
  }

 private:
  ByteRing(std::span<char> data, std::uint32_t* cons, std::uint32_t* prod) noexcept
      : data_(data), cons_(cons), prod_(prod) {}

  std::atomic_ref<std::uint32_t> cons_ref() const noexcept { return std::atomic_ref(*cons_); }
  std::atomic_ref<std::uint32_t> prod_ref() const noexcept { return std::atomic_ref(*prod_); }

  // At most two chunks: up to the end of the array, then from its start.
  void copy_from_ring(std::uint32_t from, std::span<char> out) const noexcept {
    if (out.empty()) return;  // memcpy must not see a null pointer, even for 0 bytes
    const std::size_t at = mask(from);
    const std::size_t first = std::min(out.size(), data_.size() - at);
    std::memcpy(out.data(), data_.data() + at, first);
    std::memcpy(out.data() + first, data_.data(), out.size() - first);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // pin the copy (no re-fetch), as in shared_ring.h
  }
  void copy_to_ring(std::uint32_t to, std::span<const char> in) const noexcept {
    if (in.empty()) return;
    const std::size_t at = mask(to);
    const std::size_t first = std::min(in.size(), data_.size() - at);
    std::memcpy(data_.data() + at, in.data(), first);
    std::memcpy(data_.data(), in.data() + first, in.size() - first);
  }

  std::span<char> data_;
  std::uint32_t* cons_;  // in shared memory, next to data_
  std::uint32_t* prod_;
};

}  // namespace xpv::ring
