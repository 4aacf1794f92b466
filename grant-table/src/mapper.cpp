#include "xpv/gnttab/mapper.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "shared_entry.h"

namespace xpv::gnttab {

// ---- ScopedMapping -------------------------------------------------------------------------

ScopedMapping& ScopedMapping::operator=(ScopedMapping&& o) noexcept {
  if (this != &o) {
    (void)reset();
    mapper_ = o.mapper_;
    mapping_ = o.mapping_;
    o.mapper_ = nullptr;
  }
  return *this;
}

Expected<void, Status> ScopedMapping::reset() noexcept {
  if (mapper_ == nullptr) return {};
  GrantMapper* m = mapper_;
  mapper_ = nullptr;
  return m->unmap(mapping_.handle());
}

// ---- GrantMapper: setup --------------------------------------------------------------------

namespace {
void check_frames(const detail::Frames& frames) {
  if (frames.size() > std::size_t{UINT32_MAX} / kEntriesPerFrame) {
    throw std::invalid_argument("grant mapper: too many grant frames");
  }
  for (std::size_t i = 0; i < frames.size(); ++i) {
    if (!detail::frame_ok(frames[i])) {
      throw std::invalid_argument("grant mapper: frame " + std::to_string(i) +
                                  " is not one aligned 4 KiB page");
    }
  }
}
}  // namespace

GrantMapper::GrantMapper(DomId self, DomId granter, std::vector<std::span<std::uint8_t>> frames,
                         GuestMemory memory, std::size_t max_handles)
    : self_(self), granter_(granter), max_handles_(max_handles), memory_(std::move(memory)) {
  if (max_handles_ == 0 || max_handles_ > kMaxHandlesLimit) {
    throw std::invalid_argument("grant mapper: handle limit must be between 1 and 2^20");
  }
  check_frames(frames);
  frames_ = std::move(frames);
  active_.resize(frames_.size() * kEntriesPerFrame);
  // Reserved, not touched: the pages behind it are committed only as handles are used.
  track_.reserve(max_handles_);
}

GrantMapper::~GrantMapper() {
  // Release every pin this mapper still holds so the granter can revoke its grants.
  for (std::size_t i = 0; i < track_.size(); ++i) {
    if (track_[i].live) unpin(track_[i].ref, track_[i].readonly);
  }
}

void GrantMapper::set_frames(std::vector<std::span<std::uint8_t>> frames) {
  check_frames(frames);
  const std::size_t new_cap = frames.size() * kEntriesPerFrame;
  for (std::size_t r = new_cap; r < active_.size(); ++r) {
    if (active_[r].readers + active_[r].writers != 0) {
      throw std::logic_error("grant mapper: new frames drop ref " + std::to_string(r) +
                             ", which is still pinned");
    }
  }
  active_.resize(new_cap);
  frames_ = std::move(frames);
}

// ---- pinning (the shared-entry protocol) ---------------------------------------------------

// Sets GTF_reading (and GTF_writing for a write pin) in the entry with one compare-and-swap of
// the flags/domid word, so the domid checked is the domid of the entry pinned. On the first pin
// the entry must be GTF_permit_access (GTF_sub_page refused for a mapping, as Xen) for our domid;
// a write pin is refused on a GTF_readonly grant. A compare-and-swap fails only because the other
// side wrote the word meanwhile: re-check and retry, at most kMaxCasAttempts times in all.
Expected<void, Status> GrantMapper::set_status(std::uint8_t* entry, bool readonly, bool pinned,
                                               bool mapping) noexcept {
  auto header = detail::header_of(entry);
  const std::uint16_t type_mask =
      static_cast<std::uint16_t>(gtf::type_mask | (mapping ? gtf::sub_page : 0));
  const std::uint32_t set =
      gtf::reading | (readonly ? 0u : static_cast<std::uint32_t>(gtf::writing));
  std::uint32_t cur = header.load(std::memory_order_acquire);
  for (int attempt = 1;; ++attempt) {
    const std::uint16_t flags = header_flags(cur);
    if (!pinned && ((flags & type_mask) != gtf::permit_access || header_domid(cur) != self_)) {
      return fail(Status::general_error);
    }
    if (!readonly && (flags & gtf::readonly)) return fail(Status::general_error);
    if (cas_hook_ != nullptr) cas_hook_(cas_hook_ctx_, entry);
    // acq_rel: acquire pairs with the granter's release of the header (we then see its frame);
    // release orders nothing of ours yet but costs nothing extra on x86.
    if (header.compare_exchange_strong(cur, cur | set, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
      return {};
    }
    if (attempt == kMaxCasAttempts) return fail(Status::general_error);
  }
}

Expected<std::span<std::uint8_t>, Status> GrantMapper::pin(GrantRef ref, bool readonly,
                                                           bool mapping) noexcept {
  if (ref >= active_.size()) return fail(Status::bad_gntref);
  Active& a = active_[ref];
  const bool pinned = a.readers + a.writers != 0;
  if (!pinned || (!readonly && a.writers == 0)) {
    std::uint8_t* entry = detail::entry_at(frames_, ref);
    if (auto r = set_status(entry, readonly, pinned, mapping); !r) return fail(r.error());
    if (!pinned) {
      // Read once, after our bits are set: from here on the granter may not change it.
      const std::uint32_t frame = detail::frame_of(entry).load(std::memory_order_relaxed);
      auto page = memory_.page(frame);
      if (!page) {
        const std::uint32_t undo =
            gtf::reading | (readonly ? 0u : static_cast<std::uint32_t>(gtf::writing));
        detail::header_of(entry).fetch_and(~undo, std::memory_order_release);
        return fail(Status::bad_page);
      }
      a.page = *page;
    }
  }
  if (readonly) {
    ++a.readers;
  } else {
    ++a.writers;
  }
  return a.page;
}

// Drops one pin; the last writer clears GTF_writing, the last pin GTF_reading (release: our
// accesses to the page happen before the granter sees the bits go and reuses the frame).
void GrantMapper::unpin(GrantRef ref, bool readonly) noexcept {
  Active& a = active_[ref];
  std::uint32_t clear = 0;
  if (readonly) {
    --a.readers;
  } else if (--a.writers == 0) {
    clear |= gtf::writing;
  }
  if (a.readers + a.writers == 0) {
    clear |= gtf::reading;
    a.page = {};
  }
  if (clear != 0) {
    detail::header_of(detail::entry_at(frames_, ref)).fetch_and(~clear, std::memory_order_release);
  }
}

// ---- map / unmap ---------------------------------------------------------------------------

Expected<Mapping, Status> GrantMapper::map(GrantRef ref, bool readonly) noexcept {
  if (ref >= active_.size()) return fail(Status::bad_gntref);
  if (free_handle_ == kNoHandle && track_.size() >= max_handles_) {
    return fail(Status::no_device_space);
  }
  auto page = pin(ref, readonly, /*mapping=*/true);
  if (!page) return fail(page.error());
  GrantHandle index;
  if (free_handle_ != kNoHandle) {
    index = free_handle_;
    free_handle_ = track_[index].next_free;
  } else {
    index = static_cast<GrantHandle>(track_.size());
    track_.emplace_back();  // within the reserved capacity: no allocation, no throw
  }
  Track& t = track_[index];
  t.ref = ref;
  t.readonly = readonly;
  t.live = true;
  ++live_;
  const GrantHandle handle =
      (static_cast<GrantHandle>(t.generation) << kHandleIndexBits) | index;
  return Mapping(handle, ref, readonly, *page);
}

Expected<ScopedMapping, Status> GrantMapper::map_scoped(GrantRef ref, bool readonly) noexcept {
  auto m = map(ref, readonly);
  if (!m) return fail(m.error());
  return ScopedMapping(*this, *m);
}

Expected<void, Status> GrantMapper::unmap(GrantHandle handle) noexcept {
  const GrantHandle index = handle & ((GrantHandle{1} << kHandleIndexBits) - 1);
  const auto generation = static_cast<std::uint16_t>(handle >> kHandleIndexBits);
  if (index >= track_.size()) return fail(Status::bad_handle);
  Track& t = track_[index];
  if (!t.live || t.generation != generation) return fail(Status::bad_handle);
  unpin(t.ref, t.readonly);
  t.live = false;
  // 12 bits of generation: a stale handle is recognised until its slot was reused 4096 times.
  t.generation = static_cast<std::uint16_t>((t.generation + 1) & 0xfff);
  t.next_free = free_handle_;
  free_handle_ = index;
  --live_;
  return {};
}

PinCounts GrantMapper::pins(GrantRef ref) const noexcept {
  if (ref >= active_.size()) return {};
  return {active_[ref].readers, active_[ref].writers};
}

// ---- copy ----------------------------------------------------------------------------------

std::size_t GrantMapper::copy(std::span<CopyOp> ops) noexcept {
  std::size_t failed = 0;
  // The transient pin carried from one op to the next while they name the same ref.
  bool held = false;
  GrantRef held_ref = 0;
  bool held_readonly = true;
  std::span<std::uint8_t> held_page;
  auto drop = [&] {
    if (held) unpin(held_ref, held_readonly);
    held = false;
  };
  for (CopyOp& op : ops) {
    const bool into_granter = op.dir == CopyDir::to_granter;
    const std::size_t len = into_granter ? op.src.size() : op.dst.size();
    // Written so nothing can overflow: offset <= 4096 first, then len <= 4096 - offset.
    if (op.offset > kFrameSize || len > kFrameSize - op.offset) {
      op.status = Status::bad_copy_arg;
      ++failed;
      continue;
    }
    const bool readonly = !into_granter;
    if (!(held && held_ref == op.ref && (readonly || !held_readonly))) {
      drop();
      auto page = pin(op.ref, readonly, /*mapping=*/false);
      if (!page) {
        op.status = page.error();
        ++failed;
        continue;
      }
      held = true;
      held_ref = op.ref;
      held_readonly = readonly;
      held_page = *page;
    }
    if (len != 0) {
      if (into_granter) {
        std::memcpy(held_page.data() + op.offset, op.src.data(), len);
      } else {
        std::memcpy(op.dst.data(), held_page.data() + op.offset, len);
      }
    }
    op.status = Status::okay;
  }
  drop();
  return failed;
}

Expected<void, Status> GrantMapper::copy_from(GrantRef ref, std::uint32_t offset,
                                              std::span<std::uint8_t> dst) noexcept {
  CopyOp op = CopyOp::from_granter(ref, offset, dst);
  if (copy(std::span<CopyOp>(&op, 1)) != 0) return fail(op.status);
  return {};
}

Expected<void, Status> GrantMapper::copy_to(GrantRef ref, std::uint32_t offset,
                                            std::span<const std::uint8_t> src) noexcept {
  CopyOp op = CopyOp::to_granter(ref, offset, src);
  if (copy(std::span<CopyOp>(&op, 1)) != 0) return fail(op.status);
  return {};
}

}  // namespace xpv::gnttab
