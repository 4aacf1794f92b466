// ShadowRing — a copy of every blkif request a queue consumed, kept in a file that outlives the
// xpv-blkback process, so that a restarted backend can redo what the dead one left unanswered
// (the file and its layout: ring/include/xpv/shadow_ring.h).
//
// Why it is needed. BlkifQueue answers strictly in request order (queue.h), so after a crash
// every ring index in [rsp_prod, req_prod) is a request nobody answered, and a new backend that
// attaches at the shared rsp_prod redoes them (reads, writes, flushes and discards are
// idempotent; nothing acknowledged was lost, since acknowledgements follow completion). But a
// response is written into the slot of the request it answers before rsp_prod is published: a
// backend killed between those two stores leaves slot rsp_prod holding a response where the new
// backend expects a request. The shadow keeps each request as it was consumed; the new backend
// takes the shadow's copy for an index the old one had consumed, and the ring's slot otherwise.
#pragma once

#include "xpv/ring/blkif.h"
#include "xpv/shadow_ring.h"

namespace xpv::blkback {

using ShadowRing = xpv::ShadowRing<ring::BlkifRequest>;

}  // namespace xpv::blkback
