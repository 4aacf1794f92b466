// Access to the shared grant entries, for both sides (granter.cpp and mapper.cpp).
//
// The entries live in memory shared with another process (and, for an HVM domain, with a guest
// vCPU): every access to the flags/domid header word and to the frame field goes through
// std::atomic_ref on that memory, never through a plain load or store.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "xpv/gnttab/abi.h"

namespace xpv::gnttab::detail {

using Frames = std::vector<std::span<std::uint8_t>>;

// A frame the table may use: exactly one 4 KiB page, aligned for the 32-bit atomics below.
inline bool frame_ok(std::span<std::uint8_t> f) noexcept {
  return f.data() != nullptr && f.size() == kFrameSize &&
         reinterpret_cast<std::uintptr_t>(f.data()) %
                 std::atomic_ref<std::uint32_t>::required_alignment ==
             0;
}

// Caller has checked ref < frames.size() * kEntriesPerFrame.
inline std::uint8_t* entry_at(const Frames& frames, GrantRef ref) noexcept {
  return frames[ref / kEntriesPerFrame].data() + (ref % kEntriesPerFrame) * sizeof(GrantEntryV1);
}

// flags (low half) + domid (high half), see header_word() in abi.h.
inline std::atomic_ref<std::uint32_t> header_of(std::uint8_t* entry) noexcept {
  return std::atomic_ref<std::uint32_t>(
      *reinterpret_cast<std::uint32_t*>(entry + offsetof(GrantEntryV1, flags)));
}

inline std::atomic_ref<std::uint32_t> frame_of(std::uint8_t* entry) noexcept {
  return std::atomic_ref<std::uint32_t>(
      *reinterpret_cast<std::uint32_t*>(entry + offsetof(GrantEntryV1, frame)));
}

}  // namespace xpv::gnttab::detail
