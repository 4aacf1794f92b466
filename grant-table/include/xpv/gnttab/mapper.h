// GrantMapper — the mapping (backend) side of grant table v1, done in the backend process itself.
//
// In Xen a backend asks the hypervisor to map a grant (GNTTABOP_map_grant_ref); in xpv there is
// no hypervisor on the data path: a dom0 backend maps the granting domain's memfd and its
// grant-table frames, and this class performs what Xen's map/unmap/copy would, with atomics on
// the shared entries:
//
//   map(ref, ro)  1. ref < frames*512                                  else bad_gntref
//                 2. a free handle                                    else no_device_space
//                 3. first pin (or first write pin): compare-and-swap the flags/domid word,
//                    checking type == GTF_permit_access (GTF_sub_page refused for a map),
//                    domid == the mapping domain, !GTF_readonly for rw;  else general_error
//                    setting GTF_reading (+GTF_writing for rw); at most kMaxCasAttempts tries
//                    (a guest flipping its flags forever gets general_error, never a livelock)
//                 4. first pin: frame → GuestMemory::page()           else bad_page, bits undone
//                 5. pin count +1; a handle naming (ref, ro) comes back with a bounded span
//   unmap(handle)    unknown / already released handle → bad_handle; else pin count -1; when the
//                    last writer goes GTF_writing is cleared, when the last pin goes GTF_reading.
//   copy(ops)        GNTTABOP_copy between a (ref, offset, len) of the granter and a local
//                    buffer, either way: offset+len <= 4096 else bad_copy_arg; the grant is pinned
//                    (reading, or reading+writing to write into it) only for the copy itself.
//
// Status codes follow Xen's xen/common/grant_table.c: a wrong type, wrong domid, write pin of a
// read-only grant and an unstable entry are all GNTST_general_error (Xen never returns
// permission_denied for these — that is its XSM refusal); a ref beyond the table is bad_gntref;
// an unknown handle bad_handle; an exhausted handle table no_device_space (Xen's maptrack); a
// frame outside the granter's memory bad_page (get_paged_frame); a copy beyond the page
// bad_copy_arg.
//
// Pin counts (Xen's active entries: separate reader and writer counts per ref) live inside one
// GrantMapper. LIMITATION: two mappers (two processes) mapping the same ref of the same domain
// would each set and clear the flags on their own, so the first to unmap clears GTF_reading while
// the other still uses the page and the granter could revoke and reuse it. xpv avoids this by
// construction: each device of a domain is served by exactly one backend (one GrantMapper per
// device data-plane thread), and a frontend grants each ref to one device only.
//
// Thread-safety: a GrantMapper belongs to one data-plane thread (map, unmap, copy, set_frames,
// destruction all from it); it has no lock. Other threads must not call it. The shared entries
// are accessed only through std::atomic_ref; the granted pages are read and written with memcpy
// (the guest may change them at any time: callers copy out what they validate).
//
// Lifetime: the frames' and the GuestMemory regions' host mappings must outlive the mapper. The
// spans handed out are valid until the mapping is unmapped. Destroying the mapper releases every
// pin it still holds (flags cleared) — outstanding Mapping spans must not be used afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "xpv/expected.h"
#include "xpv/gnttab/abi.h"
#include "xpv/guest_memory.h"

namespace xpv::gnttab {

class GrantMapper;

// One live mapping: a handle for unmap and a bounded view of the granted page. A read-only
// mapping exposes only the const view: writable() is empty.
class Mapping {
 public:
  Mapping() = default;
  GrantHandle handle() const noexcept { return handle_; }
  GrantRef ref() const noexcept { return ref_; }
  bool readonly() const noexcept { return readonly_; }
  std::span<const std::uint8_t> data() const noexcept { return page_; }
  std::span<std::uint8_t> writable() const noexcept {
    return readonly_ ? std::span<std::uint8_t>{} : page_;
  }

 private:
  friend class GrantMapper;
  Mapping(GrantHandle h, GrantRef r, bool ro, std::span<std::uint8_t> page) noexcept
      : handle_(h), ref_(r), readonly_(ro), page_(page) {}

  GrantHandle handle_ = 0;
  GrantRef ref_ = 0;
  bool readonly_ = true;
  std::span<std::uint8_t> page_;
};

// RAII owner of one Mapping: unmaps in its destructor. Move-only; same thread as its mapper.
class ScopedMapping {
 public:
  ScopedMapping() = default;
  ScopedMapping(GrantMapper& mapper, Mapping m) noexcept : mapper_(&mapper), mapping_(m) {}
  ScopedMapping(ScopedMapping&& o) noexcept : mapper_(o.mapper_), mapping_(o.mapping_) {
    o.mapper_ = nullptr;
  }
  ScopedMapping& operator=(ScopedMapping&& o) noexcept;
  ScopedMapping(const ScopedMapping&) = delete;
  ScopedMapping& operator=(const ScopedMapping&) = delete;
  ~ScopedMapping() { (void)reset(); }

  explicit operator bool() const noexcept { return mapper_ != nullptr; }
  const Mapping& operator*() const noexcept { return mapping_; }
  const Mapping* operator->() const noexcept { return &mapping_; }
  // Unmaps now (no-op on an empty ScopedMapping).
  Expected<void, Status> reset() noexcept;
  // Gives up ownership without unmapping.
  Mapping release() noexcept {
    mapper_ = nullptr;
    return mapping_;
  }

 private:
  GrantMapper* mapper_ = nullptr;
  Mapping mapping_;
};

enum class CopyDir : std::uint8_t {
  from_granter,  // granted page → local buffer (needs a read grant)
  to_granter,    // local buffer → granted page (needs a writable grant)
};

// One GNTTABOP_copy-like operation. The length is the local span's size.
struct CopyOp {
  CopyDir dir = CopyDir::from_granter;
  GrantRef ref = 0;
  std::uint32_t offset = 0;            // byte offset in the granted page
  std::span<std::uint8_t> dst;         // from_granter: where the bytes go
  std::span<const std::uint8_t> src;   // to_granter: where they come from
  Status status = Status::okay;        // out

  static CopyOp from_granter(GrantRef r, std::uint32_t off, std::span<std::uint8_t> to) noexcept {
    CopyOp op;
    op.dir = CopyDir::from_granter;
    op.ref = r;
    op.offset = off;
    op.dst = to;
    return op;
  }
  static CopyOp to_granter(GrantRef r, std::uint32_t off,
                           std::span<const std::uint8_t> from) noexcept {
    CopyOp op;
    op.dir = CopyDir::to_granter;
    op.ref = r;
    op.offset = off;
    op.src = from;
    return op;
  }
};

struct PinCounts {
  std::uint32_t readers = 0;
  std::uint32_t writers = 0;
};

class GrantMapper {
 public:
  // Compare-and-swap attempts on a shared entry before giving up with general_error: Xen's
  // _set_status_v1 tries once and retries four times.
  static constexpr int kMaxCasAttempts = 5;
  static constexpr std::size_t kDefaultMaxHandles = 65536;
  static constexpr std::size_t kMaxHandlesLimit = std::size_t{1} << 20;

  // self: the mapping domain (0 for a dom0 backend); granter: the granting domain; frames: its
  // grant-table frames as this process sees them; memory: its RAM. max_handles: how many
  // mappings may be live at once (1..2^20). Throws std::invalid_argument on a bad frame or limit.
  GrantMapper(DomId self, DomId granter, std::vector<std::span<std::uint8_t>> frames,
              GuestMemory memory, std::size_t max_handles = kDefaultMaxHandles);
  ~GrantMapper();
  GrantMapper(const GrantMapper&) = delete;
  GrantMapper& operator=(const GrantMapper&) = delete;

  // The granter grew its table (or the frames were remapped). Throws std::invalid_argument on a
  // bad frame and std::logic_error when the new table would drop a ref that is still pinned.
  void set_frames(std::vector<std::span<std::uint8_t>> frames);

  Expected<Mapping, Status> map(GrantRef ref, bool readonly) noexcept;
  Expected<ScopedMapping, Status> map_scoped(GrantRef ref, bool readonly) noexcept;
  Expected<void, Status> unmap(GrantHandle handle) noexcept;
  Expected<void, Status> unmap(const Mapping& m) noexcept { return unmap(m.handle()); }

  Expected<void, Status> copy_from(GrantRef ref, std::uint32_t offset,
                                   std::span<std::uint8_t> dst) noexcept;
  Expected<void, Status> copy_to(GrantRef ref, std::uint32_t offset,
                                 std::span<const std::uint8_t> src) noexcept;
  // Batched copy: every op gets its own status; returns how many failed. Consecutive ops on the
  // same ref share one transient pin (as Xen's batched GNTTABOP_copy does).
  std::size_t copy(std::span<CopyOp> ops) noexcept;

  // Test seam: called with the entry before every compare-and-swap attempt of a pin, so a test
  // can play a guest that rewrites its flags between our read and our compare-and-swap. One
  // predictable branch per attempt when unset.
  using CasHook = void (*)(void* ctx, std::uint8_t* entry) noexcept;
  void set_cas_hook_for_testing(CasHook hook, void* ctx) noexcept {
    cas_hook_ = hook;
    cas_hook_ctx_ = ctx;
  }

  PinCounts pins(GrantRef ref) const noexcept;   // {0,0} for a ref outside the table
  std::size_t mapped() const noexcept { return live_; }  // live handles
  std::size_t capacity() const noexcept { return frames_.size() * kEntriesPerFrame; }
  DomId self() const noexcept { return self_; }
  DomId granter() const noexcept { return granter_; }

 private:
  struct Active {
    std::uint32_t readers = 0;
    std::uint32_t writers = 0;
    std::span<std::uint8_t> page;  // valid while readers + writers > 0
  };
  struct Track {
    GrantRef ref = 0;
    GrantHandle next_free = 0;
    std::uint16_t generation = 0;
    bool live = false;
    bool readonly = false;
  };
  static constexpr GrantHandle kNoHandle = UINT32_MAX;
  static constexpr unsigned kHandleIndexBits = 20;

  Expected<std::span<std::uint8_t>, Status> pin(GrantRef ref, bool readonly,
                                                bool mapping) noexcept;
  void unpin(GrantRef ref, bool readonly) noexcept;
  Expected<void, Status> set_status(std::uint8_t* entry, bool readonly, bool pinned,
                                    bool mapping) noexcept;

  const DomId self_;
  const DomId granter_;
  const std::size_t max_handles_;
  std::vector<std::span<std::uint8_t>> frames_;
  GuestMemory memory_;
  std::vector<Active> active_;  // one per ref of the current frames
  std::vector<Track> track_;    // capacity reserved to max_handles_: grows without reallocating
  GrantHandle free_handle_ = kNoHandle;
  std::size_t live_ = 0;
  CasHook cas_hook_ = nullptr;
  void* cas_hook_ctx_ = nullptr;
};

}  // namespace xpv::gnttab
