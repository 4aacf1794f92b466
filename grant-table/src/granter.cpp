#include "xpv/gnttab/granter.h"

#include <stdexcept>
#include <string>

#include "shared_entry.h"

namespace xpv::gnttab {

GrantTable::GrantTable(std::vector<std::span<std::uint8_t>> frames, std::size_t max_frames)
    : max_frames_(max_frames) {
  if (max_frames_ == 0 || max_frames_ > (std::size_t{UINT32_MAX} / kEntriesPerFrame)) {
    throw std::invalid_argument("grant table: frame limit must be between 1 and 8388607");
  }
  if (frames.size() > max_frames_) {
    throw std::invalid_argument("grant table: " + std::to_string(frames.size()) +
                                " frames exceed the limit of " + std::to_string(max_frames_));
  }
  for (std::size_t i = 0; i < frames.size(); ++i) {
    if (!detail::frame_ok(frames[i])) {
      throw std::invalid_argument("grant table: frame " + std::to_string(i) +
                                  " is not one aligned 4 KiB page");
    }
  }
  const std::size_t max_refs = max_frames_ * kEntriesPerFrame;
  frames_.reserve(max_frames_);
  next_.assign(max_refs, kNone);
  prev_.assign(max_refs, kNone);
  allocated_.assign(max_refs, 0);
  std::lock_guard lock(mu_);
  for (std::span<std::uint8_t> f : frames) {
    const auto first = static_cast<GrantRef>(frames_.size() * kEntriesPerFrame);
    frames_.push_back(f);
    add_refs_locked(first, first + static_cast<GrantRef>(kEntriesPerFrame));
  }
}

std::uint8_t* GrantTable::entry_locked(GrantRef ref) const noexcept {
  return detail::entry_at(frames_, ref);
}

void GrantTable::push_free_locked(GrantRef ref) noexcept {
  next_[ref] = kNone;
  prev_[ref] = free_tail_;
  if (free_tail_ == kNone) {
    free_head_ = ref;
  } else {
    next_[free_tail_] = ref;
  }
  free_tail_ = ref;
}

void GrantTable::unlink_locked(GrantRef ref) noexcept {
  const GrantRef n = next_[ref];
  const GrantRef p = prev_[ref];
  if (p == kNone) free_head_ = n; else next_[p] = n;
  if (n == kNone) free_tail_ = p; else prev_[n] = p;
  next_[ref] = prev_[ref] = kNone;
}

void GrantTable::add_refs_locked(GrantRef first, GrantRef end) noexcept {
  for (GrantRef r = first; r < end; ++r) {
    if (r < kNrReservedEntries) continue;  // reserved: never on the free list
    push_free_locked(r);
  }
}

Expected<void, Status> GrantTable::add_frame(std::span<std::uint8_t> frame) noexcept {
  if (!detail::frame_ok(frame)) return fail(Status::general_error);
  std::lock_guard lock(mu_);
  if (frames_.size() >= max_frames_) return fail(Status::no_space);
  const auto first = static_cast<GrantRef>(frames_.size() * kEntriesPerFrame);
  frames_.push_back(frame);  // within the reserved capacity: no allocation
  add_refs_locked(first, first + static_cast<GrantRef>(kEntriesPerFrame));
  return {};
}

namespace {

// Takes the entry out of the peer's reach: clears its flags with a compare-and-swap unless the
// peer holds it (GTF_reading|GTF_writing: eagain, entry unchanged). Bounded: a peer racing us for
// longer than kMaxCasAttempts gets eagain too. Once the flags are 0 no peer may pin the entry.
Expected<void, Status> revoke(std::uint8_t* entry) noexcept {
  auto header = detail::header_of(entry);
  std::uint32_t cur = header.load(std::memory_order_acquire);
  for (int attempt = 0;; ++attempt) {
    if (header_flags(cur) & (gtf::reading | gtf::writing)) return fail(Status::eagain);
    if (header_flags(cur) == 0) return {};  // already idle
    if (attempt == GrantTable::kMaxCasAttempts) return fail(Status::eagain);
    // Flags to 0, domid kept (only the flags matter to the peer). acq_rel: the peer's last
    // accesses to the page (released when it cleared its bits) happen before we reuse the frame.
    if (header.compare_exchange_weak(cur, cur & 0xffff0000u, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      return {};
    }
  }
}

// Publishes a grant: revoke whatever the entry held (a re-grant must not change the frame under
// a peer that is pinning the old grant), then the frame, then the flags/domid header word with
// release ordering, so a peer that sees GTF_permit_access (acquire) also sees the frame.
Expected<void, Status> publish(std::uint8_t* entry, DomId to, std::uint32_t frame,
                               bool readonly) noexcept {
  if (auto r = revoke(entry); !r) return r;
  const std::uint16_t flags =
      static_cast<std::uint16_t>(gtf::permit_access | (readonly ? gtf::readonly : 0));
  detail::frame_of(entry).store(frame, std::memory_order_relaxed);
  detail::header_of(entry).store(header_word(flags, to), std::memory_order_release);
  return {};
}

}  // namespace

Expected<GrantRef, Status> GrantTable::grant_access(DomId to, std::uint64_t gfn,
                                                    bool readonly) noexcept {
  if (gfn > UINT32_MAX) return fail(Status::address_too_big);
  std::lock_guard lock(mu_);
  if (free_head_ == kNone) return fail(Status::no_space);
  const GrantRef ref = free_head_;
  auto r = publish(entry_locked(ref), to, static_cast<std::uint32_t>(gfn), readonly);
  if (!r) {
    // A free entry is idle unless the peer misbehaves (it set GTF_reading/GTF_writing on an
    // entry it was not granted). The ref stays free but goes to the back of the list so that the
    // next call tries another one.
    unlink_locked(ref);
    push_free_locked(ref);
    return fail(r.error());
  }
  unlink_locked(ref);
  allocated_[ref] = 1;
  ++in_use_;
  return ref;
}

Expected<void, Status> GrantTable::grant_access_ref(GrantRef ref, DomId to, std::uint64_t gfn,
                                                    bool readonly) noexcept {
  if (gfn > UINT32_MAX) return fail(Status::address_too_big);
  std::lock_guard lock(mu_);
  if (ref >= frames_.size() * kEntriesPerFrame) return fail(Status::bad_gntref);
  auto r = publish(entry_locked(ref), to, static_cast<std::uint32_t>(gfn), readonly);
  if (!r) return fail(r.error());
  if (ref >= kNrReservedEntries && !allocated_[ref]) {
    unlink_locked(ref);
    allocated_[ref] = 1;
    ++in_use_;
  }
  return {};
}

Expected<void, Status> GrantTable::end_access(GrantRef ref) noexcept {
  std::lock_guard lock(mu_);
  if (ref >= frames_.size() * kEntriesPerFrame) return fail(Status::bad_gntref);
  const bool reserved = ref < kNrReservedEntries;
  if (!reserved && !allocated_[ref]) return fail(Status::bad_gntref);
  if (auto r = revoke(entry_locked(ref)); !r) return r;
  if (!reserved) {
    allocated_[ref] = 0;
    --in_use_;
    push_free_locked(ref);
  }
  return {};
}

bool GrantTable::is_mapped(GrantRef ref) const noexcept {
  std::lock_guard lock(mu_);
  if (ref >= frames_.size() * kEntriesPerFrame) return false;
  const std::uint32_t w = detail::header_of(entry_locked(ref)).load(std::memory_order_acquire);
  return (header_flags(w) & (gtf::reading | gtf::writing)) != 0;
}

Expected<EntrySnapshot, Status> GrantTable::entry(GrantRef ref) const noexcept {
  std::lock_guard lock(mu_);
  if (ref >= frames_.size() * kEntriesPerFrame) return fail(Status::bad_gntref);
  std::uint8_t* e = entry_locked(ref);
  const std::uint32_t w = detail::header_of(e).load(std::memory_order_acquire);
  return EntrySnapshot{header_flags(w), header_domid(w),
                       detail::frame_of(e).load(std::memory_order_relaxed)};
}

std::size_t GrantTable::in_use() const noexcept {
  std::lock_guard lock(mu_);
  return in_use_;
}

std::size_t GrantTable::capacity() const noexcept {
  std::lock_guard lock(mu_);
  return frames_.size() * kEntriesPerFrame;
}

std::size_t GrantTable::frame_count() const noexcept {
  std::lock_guard lock(mu_);
  return frames_.size();
}

std::vector<std::span<std::uint8_t>> GrantTable::frames() const {
  std::lock_guard lock(mu_);
  return frames_;
}

}  // namespace xpv::gnttab
