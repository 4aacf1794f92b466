// blkif — the Xen block-device ring ABI (io/blkif.h), x86_64 layout.
//
// One ring entry is 112 bytes (the read/write request is the largest member), so a one-page ring
// holds 32 entries, and a ring of 2^order pages (xenstore ring-page-order) 32 << order.
//
// The request slot is always a BlkifRequest (112 bytes). Its first byte, `operation`, says which
// layout the slot really holds:
//   READ/WRITE/WRITE_BARRIER/FLUSH_DISKCACHE  BlkifRequest (segments inline, up to 11)
//   DISCARD                                   BlkifRequestDiscard
//   INDIRECT                                  BlkifRequestIndirect (segments in granted pages)
//   anything else                             BlkifRequestOther (enough to echo `id` back)
// blkif_view<V>(req) re-reads a popped (already copied) request as one of the other layouts;
// blkif_pack(v) builds a slot from one. Both are memcpy: no aliasing through unions.
//
// All offsets below are x86_64 (and every LP64 ABI Xen supports); i386 guests use a different
// packing ("protocol" = "x86_32-abi" in xenstore), which xpv does not support.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "xpv/ring/shared_ring.h"

namespace xpv::ring {

using GrantRef = std::uint32_t;     // grant_ref_t
using BlkifVdev = std::uint16_t;    // blkif_vdev_t
using BlkifSector = std::uint64_t;  // blkif_sector_t: always in 512-byte units

// Operations (BLKIF_OP_*).
inline constexpr std::uint8_t kBlkifOpRead = 0;
inline constexpr std::uint8_t kBlkifOpWrite = 1;
inline constexpr std::uint8_t kBlkifOpWriteBarrier = 2;   // feature-barrier
inline constexpr std::uint8_t kBlkifOpFlushDiskcache = 3;  // feature-flush-cache
inline constexpr std::uint8_t kBlkifOpReserved1 = 4;       // was blktap's
inline constexpr std::uint8_t kBlkifOpDiscard = 5;         // feature-discard
inline constexpr std::uint8_t kBlkifOpIndirect = 6;        // feature-max-indirect-segments

// Response status (BLKIF_RSP_*).
inline constexpr std::int16_t kBlkifRspEopnotsupp = -2;
inline constexpr std::int16_t kBlkifRspError = -1;
inline constexpr std::int16_t kBlkifRspOkay = 0;

// BlkifRequestDiscard::flag.
inline constexpr std::uint8_t kBlkifDiscardSecure = 1u << 0;

// The xenstore "info" bits of a vbd (VDISK_*).
inline constexpr std::uint32_t kVdiskCdrom = 0x1;
inline constexpr std::uint32_t kVdiskRemovable = 0x2;
inline constexpr std::uint32_t kVdiskReadonly = 0x4;

// Geometry.
inline constexpr std::uint32_t kBlkifSectorSize = 512;  // sector_number, first/last_sect unit
inline constexpr std::uint32_t kBlkifSectorsPerPage =
    static_cast<std::uint32_t>(kXenPageSize) / kBlkifSectorSize;  // first/last_sect <= 7
inline constexpr std::uint32_t kBlkifMaxSegmentsPerRequest = 11;     // BLKIF_MAX_SEGMENTS_PER_REQUEST
inline constexpr std::uint32_t kBlkifMaxIndirectPagesPerRequest = 8;  // BLKIF_MAX_INDIRECT_PAGES_PER_REQUEST

struct BlkifRequestSegment {
  GrantRef gref;           // 0x0: grant of the data page
  std::uint8_t first_sect;  // 0x4: first 512-byte sector in the page (inclusive)
  std::uint8_t last_sect;   // 0x5: last sector in the page (inclusive)
  std::uint8_t pad[2];      // 0x6: implicit padding in io/blkif.h
};
static_assert(std::is_standard_layout_v<BlkifRequestSegment> && sizeof(BlkifRequestSegment) == 8);
static_assert(offsetof(BlkifRequestSegment, gref) == 0 && offsetof(BlkifRequestSegment, first_sect) == 4 &&
              offsetof(BlkifRequestSegment, last_sect) == 5 && offsetof(BlkifRequestSegment, pad) == 6);

// Indirect descriptors: each granted indirect page is an array of segments.
inline constexpr std::uint32_t kBlkifSegsPerIndirectFrame =
    static_cast<std::uint32_t>(kXenPageSize / sizeof(BlkifRequestSegment));  // 512
inline constexpr std::uint32_t kBlkifMaxIndirectSegments =
    kBlkifMaxIndirectPagesPerRequest * kBlkifSegsPerIndirectFrame;  // 4096
// Indirect pages needed for `segments` segments (Linux's INDIRECT_GREFS).
constexpr std::uint32_t blkif_indirect_pages(std::uint32_t segments) noexcept {
  return segments / kBlkifSegsPerIndirectFrame + (segments % kBlkifSegsPerIndirectFrame != 0);
}
static_assert(kBlkifSegsPerIndirectFrame == 512 && kBlkifMaxIndirectSegments == 4096);
static_assert(blkif_indirect_pages(0) == 0 && blkif_indirect_pages(1) == 1 &&
              blkif_indirect_pages(512) == 1 && blkif_indirect_pages(513) == 2 &&
              blkif_indirect_pages(kBlkifMaxIndirectSegments) == kBlkifMaxIndirectPagesPerRequest);

// READ / WRITE / WRITE_BARRIER / FLUSH_DISKCACHE (struct blkif_request).
struct BlkifRequest {
  std::uint8_t operation;    // 0x00: kBlkifOp*
  std::uint8_t nr_segments;  // 0x01: 0..11 (0 for a flush)
  BlkifVdev handle;          // 0x02: device handle
  std::uint8_t pad[4];       // 0x04: implicit padding (id is 8-aligned)
  std::uint64_t id;          // 0x08: guest cookie, echoed in the response
  BlkifSector sector_number;  // 0x10: first sector on the disk
  BlkifRequestSegment seg[kBlkifMaxSegmentsPerRequest];  // 0x18: 11 x 8 bytes
};
static_assert(std::is_standard_layout_v<BlkifRequest> && sizeof(BlkifRequest) == 112);
static_assert(offsetof(BlkifRequest, operation) == 0x00 && offsetof(BlkifRequest, nr_segments) == 0x01 &&
              offsetof(BlkifRequest, handle) == 0x02 && offsetof(BlkifRequest, pad) == 0x04 &&
              offsetof(BlkifRequest, id) == 0x08 && offsetof(BlkifRequest, sector_number) == 0x10 &&
              offsetof(BlkifRequest, seg) == 0x18);

// DISCARD (struct blkif_request_discard).
struct BlkifRequestDiscard {
  std::uint8_t operation;      // 0x00: kBlkifOpDiscard
  std::uint8_t flag;           // 0x01: kBlkifDiscardSecure or 0
  BlkifVdev handle;            // 0x02
  std::uint8_t pad[4];         // 0x04: implicit padding
  std::uint64_t id;            // 0x08
  BlkifSector sector_number;   // 0x10: first sector to discard
  std::uint64_t nr_sectors;    // 0x18: contiguous sectors to discard
};
static_assert(std::is_standard_layout_v<BlkifRequestDiscard> && sizeof(BlkifRequestDiscard) == 32);
static_assert(offsetof(BlkifRequestDiscard, flag) == 0x01 && offsetof(BlkifRequestDiscard, handle) == 0x02 &&
              offsetof(BlkifRequestDiscard, id) == 0x08 &&
              offsetof(BlkifRequestDiscard, sector_number) == 0x10 &&
              offsetof(BlkifRequestDiscard, nr_sectors) == 0x18);

// INDIRECT (struct blkif_request_indirect): the segments live in granted indirect pages.
struct BlkifRequestIndirect {
  std::uint8_t operation;      // 0x00: kBlkifOpIndirect
  std::uint8_t indirect_op;    // 0x01: kBlkifOpRead or kBlkifOpWrite
  std::uint16_t nr_segments;   // 0x02: up to the negotiated feature-max-indirect-segments
  std::uint8_t pad1[4];        // 0x04: implicit padding
  std::uint64_t id;            // 0x08
  BlkifSector sector_number;   // 0x10
  BlkifVdev handle;            // 0x18
  std::uint8_t pad2[2];        // 0x1a: implicit padding
  GrantRef indirect_grefs[kBlkifMaxIndirectPagesPerRequest];  // 0x1c: 8 x 4 bytes
  std::uint8_t pad3[4];        // 0x3c: implicit tail padding to 8-byte alignment
};
static_assert(std::is_standard_layout_v<BlkifRequestIndirect> && sizeof(BlkifRequestIndirect) == 64);
static_assert(offsetof(BlkifRequestIndirect, indirect_op) == 0x01 &&
              offsetof(BlkifRequestIndirect, nr_segments) == 0x02 && offsetof(BlkifRequestIndirect, id) == 0x08 &&
              offsetof(BlkifRequestIndirect, sector_number) == 0x10 &&
              offsetof(BlkifRequestIndirect, handle) == 0x18 &&
              offsetof(BlkifRequestIndirect, indirect_grefs) == 0x1c &&
              offsetof(BlkifRequestIndirect, pad3) == 0x3c);

// Any other operation (Linux's blkif_request_other): only what a back end needs to answer it.
struct BlkifRequestOther {
  std::uint8_t operation;  // 0x00
  std::uint8_t pad[7];     // 0x01
  std::uint64_t id;        // 0x08
};
static_assert(std::is_standard_layout_v<BlkifRequestOther> && sizeof(BlkifRequestOther) == 16);
static_assert(offsetof(BlkifRequestOther, id) == 0x08);

// struct blkif_response.
struct BlkifResponse {
  std::uint64_t id;        // 0x00: copied from the request
  std::uint8_t operation;  // 0x08: copied from the request
  std::uint8_t pad1;       // 0x09: implicit padding
  std::int16_t status;     // 0x0a: kBlkifRsp*
  std::uint8_t pad2[4];    // 0x0c: implicit tail padding
};
static_assert(std::is_standard_layout_v<BlkifResponse> && sizeof(BlkifResponse) == 16);
static_assert(offsetof(BlkifResponse, operation) == 0x08 && offsetof(BlkifResponse, status) == 0x0a);

// Re-read / build a request slot as one of the layouts above.
template <class V>
concept BlkifRequestLayout = std::is_same_v<V, BlkifRequestDiscard> ||
                             std::is_same_v<V, BlkifRequestIndirect> ||
                             std::is_same_v<V, BlkifRequestOther>;

template <BlkifRequestLayout V>
inline V blkif_view(const BlkifRequest& req) noexcept {
  static_assert(sizeof(V) <= sizeof(BlkifRequest));
  V v;
  std::memcpy(&v, &req, sizeof(V));
  return v;
}

template <BlkifRequestLayout V>
inline BlkifRequest blkif_pack(const V& v) noexcept {
  BlkifRequest req{};  // bytes past the layout are zero
  std::memcpy(&req, &v, sizeof(V));
  return req;
}

// Ring types (DEFINE_RING_TYPES(blkif, struct blkif_request, struct blkif_response)).
using BlkifEntry = SringEntry<BlkifRequest, BlkifResponse>;
using BlkifFrontRing = FrontRing<BlkifRequest, BlkifResponse>;
using BlkifBackRing = BackRing<BlkifRequest, BlkifResponse>;
static_assert(sizeof(BlkifEntry) == 112);

// Entries per ring of 2^order pages: 32 << order.
constexpr RingIdx blkif_ring_size(unsigned order) noexcept {
  return ring_entries<BlkifRequest, BlkifResponse>(ring_bytes_for_order(order));
}
static_assert(blkif_ring_size(0) == 32 && blkif_ring_size(1) == 64 && blkif_ring_size(2) == 128 &&
              blkif_ring_size(3) == 256 && blkif_ring_size(4) == 512 && blkif_ring_size(8) == 8192);

}  // namespace xpv::ring
