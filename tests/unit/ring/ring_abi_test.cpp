// RingAbi.*: every ring struct of xpv::ring against the official Xen public headers (libxen-dev,
// /usr/include/xen/io/*.h): sizeof, every field's offset and size, the constants, the ring sizes
// for 1/2/4/8-page rings against __RING_SIZE, and rings driven by the official macros on one side
// and by xpv's FrontRing/BackRing on the other.
// Every test name carries "abi" in lower case too (RingAbi.*_abi), so `ctest -R abi` selects them.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <chrono>
#include <memory>
#include <new>
#include <string>
#include <thread>

#include "xpv/ring/blkif.h"
#include "xpv/ring/console.h"
#include "xpv/ring/netif.h"
#include "xpv/ring/shared_ring.h"
#include "xpv/ring/xenstore.h"

// The official headers are C; request the current interface and give ring.h its barriers.
#define __XEN_INTERFACE_VERSION__ 0x00040e00
#define xen_mb() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define xen_rmb() __atomic_thread_fence(__ATOMIC_ACQUIRE)
#define xen_wmb() __atomic_thread_fence(__ATOMIC_RELEASE)
extern "C" {
#include <xen/xen.h>
#include <xen/io/ring.h>
#include <xen/io/blkif.h>
#include <xen/io/console.h>
#include <xen/io/netif.h>
#include <xen/io/xs_wire.h>
}

namespace xr = xpv::ring;
constexpr std::size_t XEN_PAGE_SIZE = std::size_t{1} << XEN_PAGE_SHIFT;  // ring.h gives only the shift

namespace {

#define FIELD_SIZE(T, f) sizeof(static_cast<T*>(nullptr)->f)
// Field `fo` of ours (O) has the offset and size of field `fx` of theirs (X).
#define EXPECT_FIELD2(O, fo, X, fx)                                  \
  do {                                                               \
    EXPECT_EQ(offsetof(O, fo), offsetof(X, fx)) << #O "." #fo;       \
    EXPECT_EQ(FIELD_SIZE(O, fo), FIELD_SIZE(X, fx)) << #O "." #fo;   \
  } while (0)
#define EXPECT_FIELD(O, X, f) EXPECT_FIELD2(O, f, X, f)
#define EXPECT_SAME_SIZE(O, X) EXPECT_EQ(sizeof(O), sizeof(X)) << #O " vs " #X

struct AbiPageDeleter {
  void operator()(std::uint8_t* p) const { ::operator delete[](p, std::align_val_t{4096}); }
};
using PageBuf = std::unique_ptr<std::uint8_t[], AbiPageDeleter>;
PageBuf pages(std::size_t n) {
  auto* p = static_cast<std::uint8_t*>(::operator new[](n * 4096, std::align_val_t{4096}));
  std::memset(p, 0xa5, n * 4096);
  return PageBuf(p);
}

// The official front end of a blkif ring on `n` fresh pages (SHARED_RING_INIT, FRONT_RING_INIT);
// attach_back() puts xpv's BackRing on the same pages.
struct OfficialBlkFront {
  explicit OfficialBlkFront(std::size_t n)
      : page(pages(n)), sring(reinterpret_cast<blkif_sring*>(page.get())), bytes(n * XEN_PAGE_SIZE) {
    SHARED_RING_INIT(sring);
    FRONT_RING_INIT(&front, sring, bytes);
  }
  auto attach_back() const { return xr::BlkifBackRing::attach(std::span(page.get(), bytes)); }
  PageBuf page;
  blkif_sring* sring;
  std::size_t bytes;
  blkif_front_ring_t front;
};

TEST(RingAbi, SharedRingHeaderMatchesSring_abi) {
  EXPECT_EQ(offsetof(blkif_sring, ring), xr::kRingEntriesOffset);
  EXPECT_EQ(offsetof(netif_tx_sring, ring), xr::kRingEntriesOffset);
  EXPECT_EQ(offsetof(netif_rx_sring, ring), xr::kRingEntriesOffset);
  EXPECT_EQ(offsetof(xen_netif_ctrl_sring, ring), xr::kRingEntriesOffset);
  EXPECT_EQ(sizeof(xr::SharedRingHeader), offsetof(blkif_sring, ring));
  EXPECT_FIELD(xr::SharedRingHeader, blkif_sring, req_prod);
  EXPECT_FIELD(xr::SharedRingHeader, blkif_sring, req_event);
  EXPECT_FIELD(xr::SharedRingHeader, blkif_sring, rsp_prod);
  EXPECT_FIELD(xr::SharedRingHeader, blkif_sring, rsp_event);
  EXPECT_FIELD2(xr::SharedRingHeader, pvt, blkif_sring, pvt.pvt_pad);
  EXPECT_FIELD2(xr::SharedRingHeader, pad, blkif_sring, __pad);
}

TEST(RingAbi, EntryUnionsMatchSringEntry_abi) {
  EXPECT_SAME_SIZE(xr::BlkifEntry, blkif_sring_entry);
  EXPECT_SAME_SIZE(xr::NetifTxEntry, netif_tx_sring_entry);
  EXPECT_SAME_SIZE(xr::NetifRxEntry, netif_rx_sring_entry);
  EXPECT_SAME_SIZE(xr::NetifCtrlEntry, xen_netif_ctrl_sring_entry);
  EXPECT_EQ(alignof(xr::BlkifEntry), alignof(blkif_sring_entry));
  EXPECT_EQ(alignof(xr::NetifTxEntry), alignof(netif_tx_sring_entry));
  EXPECT_EQ(alignof(xr::NetifRxEntry), alignof(netif_rx_sring_entry));
}

TEST(RingAbi, BlkifStructs_abi) {
  EXPECT_SAME_SIZE(xr::BlkifRequestSegment, blkif_request_segment);
  EXPECT_FIELD(xr::BlkifRequestSegment, blkif_request_segment, gref);
  EXPECT_FIELD(xr::BlkifRequestSegment, blkif_request_segment, first_sect);
  EXPECT_FIELD(xr::BlkifRequestSegment, blkif_request_segment, last_sect);

  EXPECT_SAME_SIZE(xr::BlkifRequest, blkif_request);
  EXPECT_EQ(sizeof(xr::BlkifRequest), 112u);
  EXPECT_FIELD(xr::BlkifRequest, blkif_request, operation);
  EXPECT_FIELD(xr::BlkifRequest, blkif_request, nr_segments);
  EXPECT_FIELD(xr::BlkifRequest, blkif_request, handle);
  EXPECT_FIELD(xr::BlkifRequest, blkif_request, id);
  EXPECT_FIELD(xr::BlkifRequest, blkif_request, sector_number);
  EXPECT_FIELD(xr::BlkifRequest, blkif_request, seg);
  EXPECT_FIELD(xr::BlkifRequest, blkif_request, seg[10].last_sect);

  EXPECT_SAME_SIZE(xr::BlkifRequestDiscard, blkif_request_discard);
  EXPECT_FIELD(xr::BlkifRequestDiscard, blkif_request_discard, operation);
  EXPECT_FIELD(xr::BlkifRequestDiscard, blkif_request_discard, flag);
  EXPECT_FIELD(xr::BlkifRequestDiscard, blkif_request_discard, handle);
  EXPECT_FIELD(xr::BlkifRequestDiscard, blkif_request_discard, id);
  EXPECT_FIELD(xr::BlkifRequestDiscard, blkif_request_discard, sector_number);
  EXPECT_FIELD(xr::BlkifRequestDiscard, blkif_request_discard, nr_sectors);

  EXPECT_SAME_SIZE(xr::BlkifRequestIndirect, blkif_request_indirect);
  EXPECT_FIELD(xr::BlkifRequestIndirect, blkif_request_indirect, operation);
  EXPECT_FIELD(xr::BlkifRequestIndirect, blkif_request_indirect, indirect_op);
  EXPECT_FIELD(xr::BlkifRequestIndirect, blkif_request_indirect, nr_segments);
  EXPECT_FIELD(xr::BlkifRequestIndirect, blkif_request_indirect, id);
  EXPECT_FIELD(xr::BlkifRequestIndirect, blkif_request_indirect, sector_number);
  EXPECT_FIELD(xr::BlkifRequestIndirect, blkif_request_indirect, handle);
  EXPECT_FIELD(xr::BlkifRequestIndirect, blkif_request_indirect, indirect_grefs);

  // blkif_request_other is Linux's, not in the Xen header: its id must sit where every layout's is.
  EXPECT_EQ(offsetof(xr::BlkifRequestOther, operation), offsetof(blkif_request, operation));
  EXPECT_EQ(offsetof(xr::BlkifRequestOther, id), offsetof(blkif_request, id));
  EXPECT_LE(sizeof(xr::BlkifRequestOther), sizeof(blkif_request));

  EXPECT_SAME_SIZE(xr::BlkifResponse, blkif_response);
  EXPECT_FIELD(xr::BlkifResponse, blkif_response, id);
  EXPECT_FIELD(xr::BlkifResponse, blkif_response, operation);
  EXPECT_FIELD(xr::BlkifResponse, blkif_response, status);
}

TEST(RingAbi, BlkifConstants_abi) {
  EXPECT_EQ(xr::kBlkifOpRead, BLKIF_OP_READ);
  EXPECT_EQ(xr::kBlkifOpWrite, BLKIF_OP_WRITE);
  EXPECT_EQ(xr::kBlkifOpWriteBarrier, BLKIF_OP_WRITE_BARRIER);
  EXPECT_EQ(xr::kBlkifOpFlushDiskcache, BLKIF_OP_FLUSH_DISKCACHE);
  EXPECT_EQ(xr::kBlkifOpReserved1, BLKIF_OP_RESERVED_1);
  EXPECT_EQ(xr::kBlkifOpDiscard, BLKIF_OP_DISCARD);
  EXPECT_EQ(xr::kBlkifOpIndirect, BLKIF_OP_INDIRECT);
  EXPECT_EQ(xr::kBlkifMaxSegmentsPerRequest, unsigned{BLKIF_MAX_SEGMENTS_PER_REQUEST});
  EXPECT_EQ(xr::kBlkifMaxIndirectPagesPerRequest, unsigned{BLKIF_MAX_INDIRECT_PAGES_PER_REQUEST});
  EXPECT_EQ(xr::kBlkifRspEopnotsupp, BLKIF_RSP_EOPNOTSUPP);
  EXPECT_EQ(xr::kBlkifRspError, BLKIF_RSP_ERROR);
  EXPECT_EQ(xr::kBlkifRspOkay, BLKIF_RSP_OKAY);
  EXPECT_EQ(xr::kBlkifDiscardSecure, BLKIF_DISCARD_SECURE);
  EXPECT_EQ(xr::kVdiskCdrom, unsigned{VDISK_CDROM});
  EXPECT_EQ(xr::kVdiskRemovable, unsigned{VDISK_REMOVABLE});
  EXPECT_EQ(xr::kVdiskReadonly, unsigned{VDISK_READONLY});
  EXPECT_EQ(xr::kBlkifSegsPerIndirectFrame, XEN_PAGE_SIZE / sizeof(blkif_request_segment));
  EXPECT_EQ(xr::kBlkifSectorsPerPage * xr::kBlkifSectorSize, XEN_PAGE_SIZE);
}

TEST(RingAbi, NetifStructs_abi) {
  EXPECT_SAME_SIZE(xr::NetifTxRequest, netif_tx_request);
  EXPECT_FIELD(xr::NetifTxRequest, netif_tx_request, gref);
  EXPECT_FIELD(xr::NetifTxRequest, netif_tx_request, offset);
  EXPECT_FIELD(xr::NetifTxRequest, netif_tx_request, flags);
  EXPECT_FIELD(xr::NetifTxRequest, netif_tx_request, id);
  EXPECT_FIELD(xr::NetifTxRequest, netif_tx_request, size);

  EXPECT_SAME_SIZE(xr::NetifTxResponse, netif_tx_response);
  EXPECT_FIELD(xr::NetifTxResponse, netif_tx_response, id);
  EXPECT_FIELD(xr::NetifTxResponse, netif_tx_response, status);

  EXPECT_SAME_SIZE(xr::NetifRxRequest, netif_rx_request);
  EXPECT_FIELD(xr::NetifRxRequest, netif_rx_request, id);
  EXPECT_FIELD(xr::NetifRxRequest, netif_rx_request, pad);
  EXPECT_FIELD(xr::NetifRxRequest, netif_rx_request, gref);

  EXPECT_SAME_SIZE(xr::NetifRxResponse, netif_rx_response);
  EXPECT_FIELD(xr::NetifRxResponse, netif_rx_response, id);
  EXPECT_FIELD(xr::NetifRxResponse, netif_rx_response, offset);
  EXPECT_FIELD(xr::NetifRxResponse, netif_rx_response, flags);
  EXPECT_FIELD(xr::NetifRxResponse, netif_rx_response, status);

  EXPECT_SAME_SIZE(xr::NetifCtrlRequest, xen_netif_ctrl_request);
  EXPECT_FIELD(xr::NetifCtrlRequest, xen_netif_ctrl_request, id);
  EXPECT_FIELD(xr::NetifCtrlRequest, xen_netif_ctrl_request, type);
  EXPECT_FIELD(xr::NetifCtrlRequest, xen_netif_ctrl_request, data);
  EXPECT_SAME_SIZE(xr::NetifCtrlResponse, xen_netif_ctrl_response);
  EXPECT_FIELD(xr::NetifCtrlResponse, xen_netif_ctrl_response, id);
  EXPECT_FIELD(xr::NetifCtrlResponse, xen_netif_ctrl_response, type);
  EXPECT_FIELD(xr::NetifCtrlResponse, xen_netif_ctrl_response, status);
  EXPECT_FIELD(xr::NetifCtrlResponse, xen_netif_ctrl_response, data);
}

TEST(RingAbi, NetifExtraInfoAndItsVariants_abi) {
  EXPECT_SAME_SIZE(xr::NetifExtraInfo, netif_extra_info);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, type);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, flags);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u.gso);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u.gso.size);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u.gso.type);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u.gso.pad);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u.gso.features);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u.mcast);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u.mcast.addr);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u.hash);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u.hash.type);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u.hash.algorithm);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u.hash.value);
  EXPECT_FIELD(xr::NetifExtraInfo, netif_extra_info, u.pad);
}

TEST(RingAbi, NetifConstants_abi) {
  EXPECT_EQ(xr::kXenNetifNrSlotsMin, unsigned{XEN_NETIF_NR_SLOTS_MIN});
  EXPECT_EQ(xr::kXenNetifMaxTxSize, unsigned{XEN_NETIF_MAX_TX_SIZE});
  EXPECT_EQ(xr::kNettxfCsumBlank, NETTXF_csum_blank);
  EXPECT_EQ(xr::kNettxfDataValidated, NETTXF_data_validated);
  EXPECT_EQ(xr::kNettxfMoreData, NETTXF_more_data);
  EXPECT_EQ(xr::kNettxfExtraInfo, NETTXF_extra_info);
  EXPECT_EQ(xr::kNetrxfDataValidated, NETRXF_data_validated);
  EXPECT_EQ(xr::kNetrxfCsumBlank, NETRXF_csum_blank);
  EXPECT_EQ(xr::kNetrxfMoreData, NETRXF_more_data);
  EXPECT_EQ(xr::kNetrxfExtraInfo, NETRXF_extra_info);
  EXPECT_EQ(xr::kNetrxfGsoPrefix, NETRXF_gso_prefix);
  EXPECT_EQ(xr::kXenNetifExtraTypeNone, XEN_NETIF_EXTRA_TYPE_NONE);
  EXPECT_EQ(xr::kXenNetifExtraTypeGso, XEN_NETIF_EXTRA_TYPE_GSO);
  EXPECT_EQ(xr::kXenNetifExtraTypeMcastAdd, XEN_NETIF_EXTRA_TYPE_MCAST_ADD);
  EXPECT_EQ(xr::kXenNetifExtraTypeMcastDel, XEN_NETIF_EXTRA_TYPE_MCAST_DEL);
  EXPECT_EQ(xr::kXenNetifExtraTypeHash, XEN_NETIF_EXTRA_TYPE_HASH);
  EXPECT_EQ(xr::kXenNetifExtraTypeMax, XEN_NETIF_EXTRA_TYPE_MAX);
  EXPECT_EQ(xr::kXenNetifExtraFlagMore, XEN_NETIF_EXTRA_FLAG_MORE);
  EXPECT_EQ(xr::kXenNetifGsoTypeNone, XEN_NETIF_GSO_TYPE_NONE);
  EXPECT_EQ(xr::kXenNetifGsoTypeTcpv4, XEN_NETIF_GSO_TYPE_TCPV4);
  EXPECT_EQ(xr::kXenNetifGsoTypeTcpv6, XEN_NETIF_GSO_TYPE_TCPV6);
  EXPECT_EQ(xr::kXenNetifCtrlHashTypeIpv4, XEN_NETIF_CTRL_HASH_TYPE_IPV4);
  EXPECT_EQ(xr::kXenNetifCtrlHashTypeIpv4Tcp, XEN_NETIF_CTRL_HASH_TYPE_IPV4_TCP);
  EXPECT_EQ(xr::kXenNetifCtrlHashTypeIpv6, XEN_NETIF_CTRL_HASH_TYPE_IPV6);
  EXPECT_EQ(xr::kXenNetifCtrlHashTypeIpv6Tcp, XEN_NETIF_CTRL_HASH_TYPE_IPV6_TCP);
  EXPECT_EQ(xr::kXenNetifCtrlHashAlgorithmNone, XEN_NETIF_CTRL_HASH_ALGORITHM_NONE);
  EXPECT_EQ(xr::kXenNetifCtrlHashAlgorithmToeplitz, XEN_NETIF_CTRL_HASH_ALGORITHM_TOEPLITZ);
  EXPECT_EQ(xr::kNetifRspDropped, NETIF_RSP_DROPPED);
  EXPECT_EQ(xr::kNetifRspError, NETIF_RSP_ERROR);
  EXPECT_EQ(xr::kNetifRspOkay, NETIF_RSP_OKAY);
  EXPECT_EQ(xr::kNetifRspNull, NETIF_RSP_NULL);
}

TEST(RingAbi, ConsoleInterface_abi) {
  EXPECT_SAME_SIZE(xr::XenconsInterface, xencons_interface);
  EXPECT_FIELD(xr::XenconsInterface, xencons_interface, in);
  EXPECT_FIELD(xr::XenconsInterface, xencons_interface, out);
  EXPECT_FIELD(xr::XenconsInterface, xencons_interface, in_cons);
  EXPECT_FIELD(xr::XenconsInterface, xencons_interface, in_prod);
  EXPECT_FIELD(xr::XenconsInterface, xencons_interface, out_cons);
  EXPECT_FIELD(xr::XenconsInterface, xencons_interface, out_prod);
  xencons_interface c{};
  for (std::uint32_t idx : {0u, 1u, 1023u, 1024u, 2047u, 2048u, 0xfffffffeu, 0xffffffffu}) {
    EXPECT_EQ(xr::xencons_in_mask(idx), MASK_XENCONS_IDX(idx, c.in)) << idx;
    EXPECT_EQ(xr::xencons_out_mask(idx), MASK_XENCONS_IDX(idx, c.out)) << idx;
  }
}

TEST(RingAbi, XenstoreInterface_abi) {
  EXPECT_SAME_SIZE(xr::XenstoreDomainInterface, xenstore_domain_interface);
  EXPECT_FIELD(xr::XenstoreDomainInterface, xenstore_domain_interface, req);
  EXPECT_FIELD(xr::XenstoreDomainInterface, xenstore_domain_interface, rsp);
  EXPECT_FIELD(xr::XenstoreDomainInterface, xenstore_domain_interface, req_cons);
  EXPECT_FIELD(xr::XenstoreDomainInterface, xenstore_domain_interface, req_prod);
  EXPECT_FIELD(xr::XenstoreDomainInterface, xenstore_domain_interface, rsp_cons);
  EXPECT_FIELD(xr::XenstoreDomainInterface, xenstore_domain_interface, rsp_prod);
  EXPECT_FIELD(xr::XenstoreDomainInterface, xenstore_domain_interface, server_features);
  EXPECT_FIELD(xr::XenstoreDomainInterface, xenstore_domain_interface, connection);
  EXPECT_FIELD(xr::XenstoreDomainInterface, xenstore_domain_interface, error);
  EXPECT_EQ(xr::kXenstoreRingSize, unsigned{XENSTORE_RING_SIZE});
  EXPECT_EQ(xr::kXenstorePayloadMax, unsigned{XENSTORE_PAYLOAD_MAX});
  EXPECT_EQ(xr::kXenstoreAbsPathMax, unsigned{XENSTORE_ABS_PATH_MAX});
  EXPECT_EQ(xr::kXenstoreRelPathMax, unsigned{XENSTORE_REL_PATH_MAX});
  EXPECT_EQ(xr::kXenstoreServerFeatureReconnection, unsigned{XENSTORE_SERVER_FEATURE_RECONNECTION});
  EXPECT_EQ(xr::kXenstoreServerFeatureError, unsigned{XENSTORE_SERVER_FEATURE_ERROR});
  EXPECT_EQ(xr::kXenstoreConnected, unsigned{XENSTORE_CONNECTED});
  EXPECT_EQ(xr::kXenstoreReconnect, unsigned{XENSTORE_RECONNECT});
  EXPECT_EQ(xr::kXenstoreErrorNone, unsigned{XENSTORE_ERROR_NONE});
  EXPECT_EQ(xr::kXenstoreErrorComm, unsigned{XENSTORE_ERROR_COMM});
  EXPECT_EQ(xr::kXenstoreErrorRingIdx, unsigned{XENSTORE_ERROR_RINGIDX});
  EXPECT_EQ(xr::kXenstoreErrorProto, unsigned{XENSTORE_ERROR_PROTO});
  for (std::uint32_t idx : {0u, 5u, 1023u, 1024u, 0xffffffffu}) {
    EXPECT_EQ(xr::xenstore_mask(idx), MASK_XENSTORE_IDX(idx)) << idx;
  }
}

// Ring sizes of 1, 2, 4 and 8 pages against __RING_SIZE and __CONST_RING_SIZE.
TEST(RingAbi, RingSizesMatchRingSizeMacro_abi) {
  blkif_sring blk{};
  netif_tx_sring tx{};
  netif_rx_sring rx{};
  xen_netif_ctrl_sring ctrl{};
  for (unsigned order : {0u, 1u, 2u, 3u}) {
    const std::size_t bytes = xr::ring_bytes_for_order(order);
    ASSERT_EQ(bytes, (std::size_t{1} << order) * XEN_PAGE_SIZE);
    EXPECT_EQ((xr::ring_entries<xr::BlkifRequest, xr::BlkifResponse>(bytes)), __RING_SIZE(&blk, bytes))
        << order;
    EXPECT_EQ((xr::ring_entries<xr::BlkifRequest, xr::BlkifResponse>(bytes)),
              __CONST_RING_SIZE(blkif, bytes)) << order;
    EXPECT_EQ((xr::ring_entries<xr::NetifTxRequest, xr::NetifTxResponse>(bytes)), __RING_SIZE(&tx, bytes))
        << order;
    EXPECT_EQ((xr::ring_entries<xr::NetifRxRequest, xr::NetifRxResponse>(bytes)), __RING_SIZE(&rx, bytes))
        << order;
    EXPECT_EQ((xr::ring_entries<xr::NetifCtrlRequest, xr::NetifCtrlResponse>(bytes)),
              __RING_SIZE(&ctrl, bytes)) << order;
    EXPECT_EQ(xr::blkif_ring_size(order), __CONST_RING_SIZE(blkif, bytes));
    EXPECT_EQ(xr::netif_tx_ring_size(order), __CONST_RING_SIZE(netif_tx, bytes));
    EXPECT_EQ(xr::netif_rx_ring_size(order), __CONST_RING_SIZE(netif_rx, bytes));
  }
  EXPECT_EQ(xr::blkif_ring_size(0), 32u);
  EXPECT_EQ(xr::netif_tx_ring_size(0), 256u);
  EXPECT_EQ(xr::netif_rx_ring_size(0), 256u);
  // Odd sizes too: the rounding down to a power of two is the same.
  for (std::size_t bytes : {std::size_t{64 + 112}, std::size_t{64 + 3 * 112}, std::size_t{1000},
                            std::size_t{12345}, std::size_t{100000}}) {
    EXPECT_EQ((xr::ring_entries<xr::BlkifRequest, xr::BlkifResponse>(bytes)), __RING_SIZE(&blk, bytes))
        << bytes;
    EXPECT_EQ((xr::ring_entries<xr::NetifTxRequest, xr::NetifTxResponse>(bytes)), __RING_SIZE(&tx, bytes))
        << bytes;
  }
}

// The official macros as the front end (guest driver), xpv's BackRing as the back end, on one
// shared page: requests in, responses out, notify decisions as the macros compute them.
TEST(RingAbi, OfficialFrontMacrosInteroperateWithBackRing_abi) {
  OfficialBlkFront ring(2);
  blkif_front_ring_t& front = ring.front;
  ASSERT_EQ(RING_SIZE(&front), 64u);

  auto back = ring.attach_back();
  ASSERT_TRUE(back);
  ASSERT_EQ(back->size(), 64u);

  for (unsigned round = 0; round < 5; ++round) {  // 5 x 40 requests: wraps the 64-entry ring
    for (unsigned half = 0; half < 2; ++half) {
      for (unsigned i = half * 20; i < half * 20 + 20; ++i) {
        blkif_request* r = RING_GET_REQUEST(&front, front.req_prod_pvt);
        std::memset(r, 0, sizeof(*r));
        r->operation = BLKIF_OP_WRITE;
        r->nr_segments = 1;
        r->id = round * 100 + i;
        r->sector_number = 8 * i;
        r->seg[0].gref = 1000 + i;
        r->seg[0].last_sect = 7;
        front.req_prod_pvt++;
      }
      int notify = 0;
      RING_PUSH_REQUESTS_AND_CHECK_NOTIFY(&front, notify);
      // The back end armed req_event = req_cons + 1 (init, or its final check of the last round):
      // the first push passes it; the second does not, since the back end has not looked since.
      EXPECT_EQ(notify != 0, half == 0) << round << "/" << half;
    }

    for (unsigned i = 0; i < 40; ++i) {
      auto req = back->pop_request();
      ASSERT_TRUE(req) << round << "/" << i;
      EXPECT_EQ(req->operation, xr::kBlkifOpWrite);
      EXPECT_EQ(req->id, round * 100u + i);
      EXPECT_EQ(req->sector_number, 8u * i);
      EXPECT_EQ(req->seg[0].gref, 1000u + i);
      EXPECT_EQ(req->seg[0].last_sect, 7u);
      ASSERT_TRUE(back->produce_response({req->id, req->operation, 0, xr::kBlkifRspOkay, {}}));
    }
    auto more = back->final_check_for_requests();
    ASSERT_TRUE(more);
    EXPECT_FALSE(*more);
    // The front end armed rsp_event = rsp_cons + 1 (init, then its final check below).
    EXPECT_TRUE(back->push_responses()) << round;

    int work = 0;
    RING_FINAL_CHECK_FOR_RESPONSES(&front, work);
    ASSERT_TRUE(work);
    for (unsigned i = 0; i < 40; ++i) {
      ASSERT_TRUE(RING_HAS_UNCONSUMED_RESPONSES(&front));
      blkif_response rsp;
      RING_COPY_RESPONSE(&front, front.rsp_cons, &rsp);
      EXPECT_EQ(rsp.id, round * 100u + i);
      EXPECT_EQ(rsp.operation, BLKIF_OP_WRITE);
      EXPECT_EQ(rsp.status, BLKIF_RSP_OKAY);
      front.rsp_cons++;
    }
    RING_FINAL_CHECK_FOR_RESPONSES(&front, work);  // re-arms rsp_event = rsp_cons + 1
    EXPECT_FALSE(work);
  }
}

// xpv's FrontRing as the guest driver, the official macros as the back end (netif tx).
TEST(RingAbi, FrontRingInteroperatesWithOfficialBackMacros_abi) {
  PageBuf page = pages(1);
  auto front = xr::NetifTxFrontRing::init(std::span(page.get(), XEN_PAGE_SIZE));
  ASSERT_TRUE(front);
  auto* sring = reinterpret_cast<netif_tx_sring*>(page.get());
  EXPECT_EQ(sring->req_prod, 0u);
  EXPECT_EQ(sring->rsp_prod, 0u);
  EXPECT_EQ(sring->req_event, 1u);
  EXPECT_EQ(sring->rsp_event, 1u);
  netif_tx_back_ring_t back;
  BACK_RING_INIT(&back, sring, XEN_PAGE_SIZE);
  ASSERT_EQ(RING_SIZE(&back), front->size());

  std::uint16_t next_id = 0;
  for (unsigned round = 0; round < 6; ++round) {  // 6 x 200 > 256: wraps
    for (unsigned i = 0; i < 200; ++i) {
      xr::NetifTxRequest r{};
      r.gref = 7000 + i;
      r.offset = static_cast<std::uint16_t>(i * 2);
      r.flags = xr::kNettxfCsumBlank;
      r.id = next_id++;
      r.size = 1500;
      ASSERT_TRUE(front->produce_request(r));
    }
    EXPECT_TRUE(front->push_requests());  // the official back end's req_event is armed
    int work = 0;
    RING_FINAL_CHECK_FOR_REQUESTS(&back, work);
    ASSERT_EQ(work, 200);
    RING_IDX rc = back.req_cons;
    for (unsigned i = 0; i < 200; ++i, ++rc) {
      netif_tx_request req;
      RING_COPY_REQUEST(&back, rc, &req);
      EXPECT_EQ(req.gref, 7000u + i);
      EXPECT_EQ(req.size, 1500u);
      EXPECT_EQ(req.flags, NETTXF_csum_blank);
      netif_tx_response* rsp = RING_GET_RESPONSE(&back, back.rsp_prod_pvt);
      rsp->id = req.id;
      rsp->status = NETIF_RSP_OKAY;
      back.rsp_prod_pvt++;
    }
    back.req_cons = rc;
    int notify = 0;
    RING_PUSH_RESPONSES_AND_CHECK_NOTIFY(&back, notify);
    EXPECT_TRUE(notify) << round;  // front armed rsp_event (init, then final check below)
    RING_FINAL_CHECK_FOR_REQUESTS(&back, work);
    EXPECT_EQ(work, 0);

    for (unsigned i = 0; i < 200; ++i) {
      auto rsp = front->pop_response();
      ASSERT_TRUE(rsp);
      EXPECT_EQ(rsp->id, static_cast<std::uint16_t>(next_id - 200 + i));
      EXPECT_EQ(rsp->status, xr::kNetifRspOkay);
    }
    auto more = front->final_check_for_responses();
    ASSERT_TRUE(more);
    EXPECT_FALSE(*more);
    EXPECT_EQ(sring->rsp_event, front->rsp_cons() + 1);
  }
}

// BackRing::end_state, the diagnostic a back end logs when it stops, against the official front
// macros: published requests it never took, and responses pushed since the front end last armed
// rsp_event — until its final check, which arms it past them.
TEST(RingAbi, EndStateTellsUntakenRequestsAndResponsesSinceTheFrontEndArmed_abi) {
  OfficialBlkFront ring(1);
  blkif_front_ring_t& front = ring.front;
  blkif_sring* sring = ring.sring;
  auto back = ring.attach_back();
  ASSERT_TRUE(back);
  auto fresh = back->end_state();
  EXPECT_EQ(fresh.untaken, 0u);
  EXPECT_EQ(fresh.responses_since_armed, 0u) << "a fresh ring: rsp_event = rsp_prod + 1";

  for (unsigned i = 0; i < 3; ++i) {
    blkif_request* r = RING_GET_REQUEST(&front, front.req_prod_pvt);
    std::memset(r, 0, sizeof(*r));
    r->id = i;
    front.req_prod_pvt++;
  }
  int notify = 0;
  RING_PUSH_REQUESTS_AND_CHECK_NOTIFY(&front, notify);
  EXPECT_TRUE(notify);
  EXPECT_EQ(back->end_state().untaken, 3u);
  for (unsigned i = 0; i < 2; ++i) {
    auto req = back->pop_request();
    ASSERT_TRUE(req);
    ASSERT_TRUE(back->produce_response({req->id, 0, 0, xr::kBlkifRspOkay, {}}));
  }
  EXPECT_TRUE(back->push_responses());
  auto mid = back->end_state();
  EXPECT_EQ(mid.req_prod, 3u);
  EXPECT_EQ(mid.untaken, 1u);
  EXPECT_EQ(mid.rsp_prod, 2u);
  EXPECT_EQ(mid.responses_since_armed, 2u) << "pushed past rsp_event 1, not yet consumed";

  // The front end consumes one: it has not made its final check, so both still count.
  front.rsp_cons++;
  EXPECT_EQ(back->end_state().responses_since_armed, 2u);
  front.rsp_cons++;
  int work = 0;
  RING_FINAL_CHECK_FOR_RESPONSES(&front, work);
  EXPECT_FALSE(work);
  auto after = back->end_state();
  EXPECT_EQ(after.rsp_event, 3u);
  EXPECT_EQ(after.responses_since_armed, 0u);
  EXPECT_EQ(after.untaken, 1u) << "the third request is still the back end's";
  ASSERT_TRUE(back->pop_request());
  EXPECT_EQ(back->end_state().untaken, 0u);

  // A front end that wrote a req_prod more than a ring ahead: no count is made of it.
  sring->req_prod = 3 + 1000;
  EXPECT_EQ(back->end_state().untaken, 0u);
}

// The same across the 32-bit wrap of the free-running indexes, and for a front end that polls:
// it takes more than a ring of responses without arming, and all of them count.
TEST(RingAbi, EndStateCountsAcrossTheIndexWrapAndPastOneRing_abi) {
  OfficialBlkFront ring(1);
  blkif_front_ring_t& front = ring.front;
  blkif_sring* sring = ring.sring;
  constexpr RING_IDX kStart = 0xffffffffu - 40;  // 41 requests in, the indexes wrap
  sring->req_prod = sring->rsp_prod = front.req_prod_pvt = front.rsp_cons = kStart;
  sring->req_event = sring->rsp_event = kStart + 1;
  auto back = ring.attach_back();
  ASSERT_TRUE(back);
  const RING_IDX size = RING_SIZE(&front);
  ASSERT_EQ(size, 32u);
  EXPECT_EQ(back->end_state().responses_since_armed, 0u);
  // 80 requests, 16 at a time, each batch answered and taken by polling (rsp_cons moves; the
  // front end never arms rsp_event again).
  for (unsigned batch = 0; batch < 5; ++batch) {
    for (unsigned i = 0; i < 16; ++i) {
      std::memset(RING_GET_REQUEST(&front, front.req_prod_pvt), 0, sizeof(blkif_request));
      front.req_prod_pvt++;
    }
    int notify = 0;
    RING_PUSH_REQUESTS_AND_CHECK_NOTIFY(&front, notify);
    (void)notify;
    EXPECT_EQ(back->end_state().untaken, 16u) << batch;
    for (unsigned i = 0; i < 16; ++i) {
      auto req = back->pop_request();
      ASSERT_TRUE(req);
      ASSERT_TRUE(back->produce_response({req->id, 0, 0, xr::kBlkifRspOkay, {}}));
    }
    (void)back->push_responses();
    front.rsp_cons = sring->rsp_prod;
  }
  auto e = back->end_state();
  EXPECT_EQ(e.rsp_prod, kStart + 80) << "wrapped";
  EXPECT_LT(e.rsp_prod, kStart);
  EXPECT_EQ(e.untaken, 0u);
  EXPECT_EQ(e.responses_since_armed, 80u) << "more than a ring (32) since the front end armed";
  // Armed ahead of rsp_prod, as some front ends do (half a ring): nothing owed.
  sring->rsp_event = e.rsp_prod + size / 2;
  EXPECT_EQ(back->end_state().responses_since_armed, 0u);
}

// Waiting for several requests at once (netif rx: the buffers a packet needs): the back end asks
// to be woken at the request after those already posted, so each push by the official macro that
// adds one wakes it, and it does not spin on requests it already counted.
TEST(RingAbi, CheckForRequestsArmsPastWhatIsPostedSoEachPushNotifies_abi) {
  OfficialBlkFront ring(1);
  auto back = ring.attach_back();
  ASSERT_TRUE(back);
  auto post_one = [&] {
    std::memset(RING_GET_REQUEST(&ring.front, ring.front.req_prod_pvt), 0, sizeof(blkif_request));
    ring.front.req_prod_pvt++;
    int notify = 0;
    RING_PUSH_REQUESTS_AND_CHECK_NOTIFY(&ring.front, notify);
    return notify != 0;
  };
  for (RING_IDX have = 0; have < 3; ++have) {
    auto enough = back->check_for_requests(3);
    ASSERT_TRUE(enough);
    EXPECT_FALSE(*enough) << have;
    EXPECT_EQ(ring.sring->req_event, have + 1) << "armed at the request after the " << have << " posted";
    EXPECT_TRUE(post_one()) << "the push of request " << have + 1 << " notifies";
  }
  auto enough = back->check_for_requests(3);
  ASSERT_TRUE(enough);
  EXPECT_TRUE(*enough);
  EXPECT_EQ(ring.sring->req_event, 3u) << "not re-armed once there are enough";
}

// The race that check_for_requests closes: the front end pushes between the back end's count and
// its arming. A front-end thread posts one request at a time with the official macro and kicks an
// eventfd when the macro says so; the back end waits for four at a time and sleeps on the eventfd
// whenever check_for_requests says to. No sleep may miss the push that completes its four (each
// sleep bounded at 5 s; one miss ends the test). Until session 41 xpv-netback armed from the
// first count without looking again until the count held still: a push in between went
// unnotified, and so did every later one (the event stayed behind req_prod).
TEST(RingAbi, CheckForRequestsNeverSleepsThroughThePushThatCompletesTheCount_abi) {
  OfficialBlkFront ring(1);
  auto back = ring.attach_back();
  ASSERT_TRUE(back);
  const int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ASSERT_GE(efd, 0);
  constexpr RING_IDX kNeed = 4, kTotal = 100000;
  std::atomic<bool> give_up{false};
  std::thread front([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    RING_IDX posted = 0;
    while (posted < kTotal && !give_up.load() && std::chrono::steady_clock::now() < deadline) {
      ring.front.rsp_cons = __atomic_load_n(&ring.sring->rsp_prod, __ATOMIC_ACQUIRE);  // answered: free
      if (RING_FULL(&ring.front)) {
        std::this_thread::yield();
        continue;
      }
      blkif_request* r = RING_GET_REQUEST(&ring.front, ring.front.req_prod_pvt);
      std::memset(r, 0, sizeof *r);
      r->id = posted++;
      ring.front.req_prod_pvt++;
      int notify = 0;
      RING_PUSH_REQUESTS_AND_CHECK_NOTIFY(&ring.front, notify);
      if (notify) {
        const std::uint64_t one = 1;
        (void)!::write(efd, &one, sizeof one);
      }
    }
  });
  RING_IDX taken = 0;
  int sleeps = 0;
  std::string missed;
  while (taken < kTotal && missed.empty()) {
    auto enough = back->check_for_requests(kNeed);
    if (!enough) {
      missed = "ring error";
      break;
    }
    if (*enough) {
      for (RING_IDX i = 0; i < kNeed; ++i) {
        auto req = back->pop_request();
        if (!req || req->id != taken + i) missed = "request " + std::to_string(taken + i) + " missing or out of order";
        if (req) (void)back->produce_response({req->id, 0, 0, xr::kBlkifRspOkay, {}});
      }
      (void)back->push_responses();
      taken += kNeed;
      continue;
    }
    ++sleeps;
    pollfd p{efd, POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) {
      missed = "slept 5 s after taking " + std::to_string(taken) + " with " +
               std::to_string(back->unconsumed_requests().value_or(0)) + " posted (req_event " +
               std::to_string(ring.sring->req_event) + ", req_prod " + std::to_string(ring.sring->req_prod) + ")";
      break;
    }
    std::uint64_t n;
    (void)!::read(efd, &n, sizeof n);
  }
  give_up = true;
  front.join();
  ::close(efd);
  EXPECT_EQ(missed, "");
  EXPECT_EQ(taken, kTotal);
  EXPECT_GT(sleeps, 0) << "the back end never had to sleep: the wait was not tried";
}

}  // namespace
