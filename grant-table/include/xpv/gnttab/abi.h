// Grant table v1 ABI: the shared entry layout, its flag bits, the GNTST_* status codes and the
// table geometry, exactly as xen/include/public/grant_table.h defines them (checked field by field
// and value by value against /usr/include/xen/grant_table.h in tests/unit/grant-table/abi_test.cpp).
//
// Only grant table v1 is implemented. gtf::sub_page and gtf::transitive are listed so that an entry
// carrying them can be recognised and refused; their v2 semantics are not implemented.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace xpv::gnttab {

using GrantRef = std::uint32_t;   // grant_ref_t
using DomId = std::uint16_t;      // domid_t
using GrantHandle = std::uint32_t;  // grant_handle_t: a mapper's name for one mapping

// One v1 entry (struct grant_entry_v1). Written by the granting domain, flag bits GTF_reading and
// GTF_writing set and cleared by whoever maps it (Xen; in xpv the dom0 backend itself).
struct GrantEntryV1 {
  std::uint16_t flags;  // @0  GTF_*; the type in bits 0..1
  std::uint16_t domid;  // @2  the domain allowed to map/access the frame
  std::uint32_t frame;  // @4  the granting domain's frame number (gfn for an HVM guest)
};
static_assert(std::is_standard_layout_v<GrantEntryV1> && sizeof(GrantEntryV1) == 8);
static_assert(offsetof(GrantEntryV1, flags) == 0);
static_assert(offsetof(GrantEntryV1, domid) == 2);
static_assert(offsetof(GrantEntryV1, frame) == 4);

// flags and domid are one 32-bit "header word", updated together with a single compare-and-swap
// by the mapping side (Xen's union grant_combo) so that the domid it checked is the domid of the
// entry it pinned. With little-endian hosts (x86-64 only, as KVM here) flags are its low half.
static_assert(std::endian::native == std::endian::little,
              "the grant header word layout below assumes a little-endian host");
inline constexpr std::uint32_t header_word(std::uint16_t flags, DomId domid) noexcept {
  return std::uint32_t{flags} | (std::uint32_t{domid} << 16);
}
inline constexpr std::uint16_t header_flags(std::uint32_t word) noexcept {
  return static_cast<std::uint16_t>(word & 0xffffu);
}
inline constexpr DomId header_domid(std::uint32_t word) noexcept {
  return static_cast<DomId>(word >> 16);
}

// GTF_* flag bits, as kConstants-style names in namespace gtf (the Xen header's macros of the same
// GTF_ names would otherwise collide with them wherever both are included): gtf::permit_access is
// GTF_permit_access, gtf::reading is GTF_reading, and so on.
namespace gtf {
// Entry type (bits 0..1).
inline constexpr std::uint16_t invalid = 0;
inline constexpr std::uint16_t permit_access = 1;
inline constexpr std::uint16_t accept_transfer = 2;
inline constexpr std::uint16_t transitive = 3;  // v2 only; refused by xpv
inline constexpr std::uint16_t type_mask = 3;
// Sub-flags of permit_access.
inline constexpr std::uint16_t readonly = 1u << 2;  // [granter] read-only access only
inline constexpr std::uint16_t reading = 1u << 3;   // [mapper] mapped/accessed for reading
inline constexpr std::uint16_t writing = 1u << 4;   // [mapper] mapped/accessed for writing
inline constexpr std::uint16_t pwt = 1u << 5;       // x86 cache attributes (carried, unused)
inline constexpr std::uint16_t pcd = 1u << 6;
inline constexpr std::uint16_t pat = 1u << 7;
inline constexpr std::uint16_t sub_page = 1u << 8;  // v2 only; a v1 map refuses it (as Xen)
// Sub-flags of accept_transfer (page transfer is not implemented; values for completeness).
inline constexpr std::uint16_t transfer_committed = 1u << 2;
inline constexpr std::uint16_t transfer_completed = 1u << 3;
}  // namespace gtf

// Geometry.
inline constexpr std::size_t kFrameSize = 4096;
inline constexpr std::size_t kEntriesPerFrame = kFrameSize / sizeof(GrantEntryV1);  // 512
static_assert(kEntriesPerFrame == 512);
// Refs 0..7 are reserved for the toolstack (GNTTAB_NR_RESERVED_ENTRIES); Linux uses ref 0 for
// the console ring and ref 1 for the xenstore ring. A granter's free list never hands them out.
inline constexpr GrantRef kNrReservedEntries = 8;
inline constexpr GrantRef kReservedConsole = 0;
inline constexpr GrantRef kReservedXenstore = 1;
// Default and ceiling of grant frames per domain: 64 as QEMU's emulated grant table (and Xen's
// gnttab_max_frames default).
inline constexpr std::size_t kDefaultMaxFrames = 64;

// GNTST_* status codes (int16_t in every hypercall argument that carries one).
enum class Status : std::int16_t {
  okay = 0,
  general_error = -1,
  bad_domain = -2,
  bad_gntref = -3,
  bad_handle = -4,
  bad_virt_addr = -5,
  bad_dev_addr = -6,
  no_device_space = -7,
  permission_denied = -8,
  bad_page = -9,
  bad_copy_arg = -10,
  address_too_big = -11,
  eagain = -12,
  no_space = -13,
};

// The numeric GNTST_* value, e.g. for a hypercall's status field.
inline constexpr std::int16_t to_gntst(Status s) noexcept { return static_cast<std::int16_t>(s); }
// The text Xen's GNTTABOP_error_msgs gives each code (own wording); "unknown grant status" else.
const char* to_string(Status s) noexcept;

}  // namespace xpv::gnttab
