// GrantTable — the granting (frontend) side of grant table v1.
//
// A domain owns its grant table: a set of 4 KiB frames of shared memory (the domain process
// exports them to dom0 through its control socket) holding GrantEntryV1[512] each. Its frontends
// grant a peer access to one of its frames by filling an entry; the peer (a dom0 backend with a
// GrantMapper over the same frames) maps it and marks the entry GTF_reading/GTF_writing while it
// holds it. Nothing sits in between: both sides follow the protocol with atomics on the entries.
//
// Entry life cycle, as seen by the granter (M = the mapper's bits):
//
//     free ──grant_access──▶ granted ──(mapper sets M)──▶ granted+mapped
//      ▲                       │  ▲                           │
//      │                       │  └──(mapper clears M)────────┘
//      └─────end_access────────┘      end_access while mapped: refused (eagain), entry unchanged
//
// Publication order (grant): frame first, then the flags/domid header word with release
// semantics, so a mapper that sees GTF_permit_access (acquire) also sees the frame.
// Revocation (end_access): a compare-and-swap that clears the flags only if neither GTF_reading
// nor GTF_writing is set, retried while the peer changes the word under us — the behaviour of
// Linux's gnttab_end_foreign_access_ref for v1 (re-implemented here). Linux retries without a
// bound because only Xen writes the other bits; xpv bounds it anyway (kMaxCasAttempts) and
// then reports eagain, the same answer as "still mapped".
//
// Thread-safety: any thread of the domain process; one internal mutex (a leaf: no other lock is
// taken under it, nothing blocks under it) guards the free list and the frame list. The entries
// themselves are shared with the mapper in another process and are only touched through
// std::atomic_ref. Two threads of the granter working on the *same* ref at once is a caller bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "xpv/expected.h"
#include "xpv/gnttab/abi.h"

namespace xpv::gnttab {

// What an entry holds right now (a snapshot; the mapper may change the flags a moment later).
struct EntrySnapshot {
  std::uint16_t flags = 0;
  DomId domid = 0;
  std::uint32_t frame = 0;
};

class GrantTable {
 public:
  // Bound on the compare-and-swap retries of end_access/grant_access_ref against a peer that keeps
  // changing the entry (each retry means the peer wrote the word).
  static constexpr int kMaxCasAttempts = 64;

  // frames: the table's initial frames (each exactly 4 KiB, 4-byte aligned; may be empty),
  // max_frames: how many it may grow to (1..; default 64). Throws std::invalid_argument for a bad
  // frame, max_frames == 0 or more frames than max_frames (setup code). The frames' memory must
  // outlive the table; the table does not clear it (a fresh memfd is zero).
  explicit GrantTable(std::vector<std::span<std::uint8_t>> frames,
                      std::size_t max_frames = kDefaultMaxFrames);
  GrantTable(const GrantTable&) = delete;
  GrantTable& operator=(const GrantTable&) = delete;

  // Appends one frame (HVM guests add them one at a time with XENMAPSPACE_grant_table idx i);
  // its 512 refs join the free list. no_space at the frame limit, general_error for a frame that
  // is not one aligned 4 KiB page. Never allocates (bookkeeping is sized for max_frames up front).
  Expected<void, Status> add_frame(std::span<std::uint8_t> frame) noexcept;

  // Allocates a free ref (never a reserved one) and grants domain `to` access to frame `gfn`.
  // no_space when every ref of the current frames is in use; address_too_big when gfn does not
  // fit v1's 32-bit frame field.
  Expected<GrantRef, Status> grant_access(DomId to, std::uint64_t gfn, bool readonly) noexcept;

  // Fills a specific ref, typically a reserved one (console 0, xenstore 1). A non-reserved ref
  // that is free is taken off the free list; one already in use is re-granted. Refused with
  // bad_gntref outside the table, eagain while the peer has it mapped (entry unchanged),
  // address_too_big as above.
  Expected<void, Status> grant_access_ref(GrantRef ref, DomId to, std::uint64_t gfn,
                                          bool readonly) noexcept;

  // Revokes ref: clears its flags unless GTF_reading|GTF_writing are set, then frees it
  // (reserved refs are cleared but never freed). eagain while mapped (entry unchanged: the caller
  // keeps the ref and retries after the peer unmapped), bad_gntref for a ref outside the table or
  // one that is not granted.
  Expected<void, Status> end_access(GrantRef ref) noexcept;

  // Whether the peer currently has ref mapped or is copying (GTF_reading|GTF_writing); false for
  // a ref outside the table. Linux's gnttab_query_foreign_access.
  bool is_mapped(GrantRef ref) const noexcept;

  // Snapshot of one entry, bad_gntref outside the table.
  Expected<EntrySnapshot, Status> entry(GrantRef ref) const noexcept;

  std::size_t in_use() const noexcept;          // non-reserved refs currently allocated
  std::size_t capacity() const noexcept;        // refs in the current frames (frames * 512)
  std::size_t frame_count() const noexcept;
  std::size_t max_frames() const noexcept { return max_frames_; }
  // The frames, for exporting them to dom0 (a copy: the list may grow afterwards).
  std::vector<std::span<std::uint8_t>> frames() const;

 private:
  static constexpr GrantRef kNone = UINT32_MAX;

  void add_refs_locked(GrantRef first, GrantRef end) noexcept;
  void unlink_locked(GrantRef ref) noexcept;
  void push_free_locked(GrantRef ref) noexcept;
  std::uint8_t* entry_locked(GrantRef ref) const noexcept;

  const std::size_t max_frames_;
  mutable std::mutex mu_;
  // Everything below is guarded by mu_.
  std::vector<std::span<std::uint8_t>> frames_;  // capacity reserved to max_frames_
  // Free list: doubly linked through next_/prev_ so that grant_access_ref can take any ref off it
  // in O(1). FIFO (allocate at the head, free at the tail) so a just-revoked ref is reused as late
  // as possible, which makes a peer's stale-ref bug show up as a refused map, not as a silent
  // mapping of someone else's page. Sized max_frames_ * 512 at construction.
  std::vector<GrantRef> next_;
  std::vector<GrantRef> prev_;
  std::vector<std::uint8_t> allocated_;  // 1 while a non-reserved ref is granted
  GrantRef free_head_ = kNone;
  GrantRef free_tail_ = kNone;
  std::size_t in_use_ = 0;
};

}  // namespace xpv::gnttab
