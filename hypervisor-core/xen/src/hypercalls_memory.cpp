// memory_op (XENMEM_add_to_physmap[_batch], XENMEM_decrease_reservation, XENMEM_populate_physmap)
// and grant_table_op (query_size, set/get_version). vCPU thread of the caller. Grant frames are
// fixed in platform-pci BAR1: "mapping" frame i only checks that the guest put it where it
// already is, and counts it.
#include <algorithm>

#include "guest_copy.h"
#include "xpv/xen/platform.h"

namespace xpv::xen {

using namespace detail;

std::int64_t Platform::add_to_physmap_one(std::uint32_t space, std::uint64_t idx,
                                          std::uint64_t gpfn) {
  switch (space) {
    case abi::kMapspaceSharedInfo: {
      if (idx != 0) return err(XenErrno::einval);
      if (!evtchn_) return err(XenErrno::enosys);
      const std::span<std::uint8_t> page = host_.guest_page(gpfn);
      if (page.size() < domain::kSharedInfoPageBytes) return err(XenErrno::einval);
      if (auto r = evtchn_->move_shared_info(page); !r) return err(r.error());
      shared_info_mapped_.store(true, std::memory_order_release);
      // Events recorded while shared_info was invisible: a vCPU that already chose its upcall
      // mode gets one upcall for them.
      for (unsigned v = 0; v < cfg_.vcpus; ++v) deliver_if_pending(v);
      return 0;
    }
    case abi::kMapspaceGrantTable: {
      if (idx & abi::kMapidxGrantTableStatus) return err(XenErrno::einval);  // v2 status frames
      if (idx >= cfg_.max_grant_frames || gpfn != cfg_.grant_frames_gfn + idx)
        return err(XenErrno::einval);
      const auto n = static_cast<std::uint32_t>(idx + 1);
      std::uint32_t cur = grant_frames_.load(std::memory_order_relaxed);
      while (cur < n && !grant_frames_.compare_exchange_weak(cur, n, std::memory_order_acq_rel)) {
      }
      return 0;
    }
    default:
      log_unsupported("XENMEM_add_to_physmap space", space);
      return err(XenErrno::enosys);
  }
}

// Ballooning, as Linux's xen-balloon driver does it in an HVM guest: decrease_reservation hands
// back the GPFNs listed in extent_start (the host frees their memory), populate_physmap takes
// such GPFNs back. Xen's contract: the result is the number of extents done; the first extent
// that cannot be done (unreadable list entry, a range that is not RAM) ends the call there.
// Xen continues a long call itself (hypercall continuations); xpv does at most kMaxExtents per
// call and says so in the count — Linux's balloon sends at most 512 (one page of GPFNs).
// Extents up to 2 MiB (order 9, Xen's limit for an unprivileged domain).
std::int64_t Platform::reservation_op(std::uint64_t cmd, std::uint64_t arg, GuestVirt& mem) {
  constexpr std::uint32_t kMaxOrder = 9;
  constexpr std::uint64_t kMaxExtents = 1u << 16;
  abi::MemoryReservation r{};
  if (!copy_in(mem, arg, r)) return err(XenErrno::efault);
  if (!is_self(r.domid)) return err(XenErrno::eperm);
  if (r.extent_order > kMaxOrder) return 0;
  const std::uint64_t pages = std::uint64_t{1} << r.extent_order;
  const std::uint64_t n = std::min(r.nr_extents, kMaxExtents);
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t gpfn = 0;
    if (!copy_in(mem, r.extent_start + i * sizeof gpfn, gpfn)) return static_cast<std::int64_t>(i);
    // An extent is aligned to its size, as Xen requires of populate_physmap's GPFNs.
    if ((gpfn & (pages - 1)) != 0) return static_cast<std::int64_t>(i);
    const bool ok = cmd == abi::kXenmemDecreaseReservation ? host_.release_ram(gpfn, pages)
                                                            : host_.populate_ram(gpfn, pages);
    if (!ok) return static_cast<std::int64_t>(i);
  }
  return static_cast<std::int64_t>(n);
}

std::int64_t Platform::memory_op(std::uint64_t cmd, std::uint64_t arg, GuestVirt& mem) {
  switch (cmd) {
    case abi::kXenmemDecreaseReservation:
    case abi::kXenmemPopulatePhysmap:
      return reservation_op(cmd, arg, mem);
    case abi::kXenmemAddToPhysmap: {
      abi::AddToPhysmap a{};
      if (!copy_in(mem, arg, a)) return err(XenErrno::efault);
      if (!is_self(a.domid)) return err(XenErrno::eperm);
      return add_to_physmap_one(a.space, a.idx, a.gpfn);
    }
    case abi::kXenmemAddToPhysmapBatch: {
      abi::AddToPhysmapBatch b{};
      if (!copy_in(mem, arg, b)) return err(XenErrno::efault);
      if (!is_self(b.domid)) return err(XenErrno::eperm);
      if (b.space != abi::kMapspaceSharedInfo && b.space != abi::kMapspaceGrantTable) {
        log_unsupported("XENMEM_add_to_physmap_batch space", b.space);
        return err(XenErrno::enosys);
      }
      // size ≤ 65535 (u16) bounds the loop. Per-entry results go to errs[i]; a bad array
      // pointer fails the whole call with -EFAULT (entries before it took effect, as in Xen).
      for (std::uint64_t i = 0; i < b.size; ++i) {
        std::uint64_t idx = 0, gpfn = 0;
        if (!copy_in(mem, b.idxs + i * sizeof idx, idx) ||
            !copy_in(mem, b.gpfns + i * sizeof gpfn, gpfn))
          return err(XenErrno::efault);
        const auto rc = static_cast<std::int32_t>(add_to_physmap_one(b.space, idx, gpfn));
        if (!copy_out(mem, b.errs + i * sizeof rc, rc)) return err(XenErrno::efault);
      }
      return 0;
    }
    default:
      log_unsupported("memory_op", cmd);
      return err(XenErrno::enosys);
  }
}

std::int64_t Platform::grant_table_op(std::uint64_t cmd, std::uint64_t arg, std::uint64_t count,
                                      GuestVirt& mem) {
  switch (cmd) {
    case abi::kGnttabopQuerySize: {
      if (count != 1) return err(XenErrno::einval);
      abi::GnttabQuerySize q{};
      if (!copy_in(mem, arg, q)) return err(XenErrno::efault);
      if (!is_self(q.dom)) {
        q.status = abi::kGntstPermissionDenied;
      } else {
        q.nr_frames = grant_frames_.load(std::memory_order_acquire);
        q.max_nr_frames = cfg_.max_grant_frames;
        q.status = abi::kGntstOkay;
      }
      return copy_out(mem, arg, q) ? 0 : err(XenErrno::efault);
    }
    case abi::kGnttabopSetVersion: {
      if (count != 1) return err(XenErrno::einval);
      abi::GnttabSetVersion v{};
      if (!copy_in(mem, arg, v)) return err(XenErrno::efault);
      // Only v1. As Xen, the version in force is written back whatever the outcome.
      const std::int64_t rc = v.version == 1 ? 0 : err(XenErrno::einval);
      v.version = 1;
      return copy_out(mem, arg, v) ? rc : err(XenErrno::efault);
    }
    case abi::kGnttabopGetVersion: {
      if (count != 1) return err(XenErrno::einval);
      abi::GnttabGetVersion v{};
      if (!copy_in(mem, arg, v)) return err(XenErrno::efault);
      if (!is_self(v.dom)) return err(XenErrno::eperm);
      v.version = 1;
      return copy_out(mem, arg, v) ? 0 : err(XenErrno::efault);
    }
    default:
      log_unsupported("grant_table_op", cmd);
      return err(XenErrno::enosys);
  }
}

}  // namespace xpv::xen
