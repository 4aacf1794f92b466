// ShadowRing — a copy of every blkif request a queue consumed, kept in a file that outlives the
// xpv-blkback process, so that a restarted backend can redo what the dead one left unanswered.
//
// Why it is needed. BlkifQueue answers strictly in request order (queue.h), so after a crash
// every ring index in [rsp_prod, req_prod) is a request nobody answered, and a new backend that
// attaches at the shared rsp_prod redoes them (reads, writes, flushes and discards are
// idempotent; nothing acknowledged was lost, since acknowledgements follow completion). But a
// response is written into the slot of the request it answers before rsp_prod is published: a
// backend killed between those two stores leaves slot rsp_prod holding a response where the new
// backend expects a request. The shadow keeps each request as it was consumed; the new backend
// takes the shadow's copy for an index the old one had consumed, and the ring's slot otherwise.
//
// File layout (host memory only, never seen by a guest): a 64-byte header {magic, version,
// entries}, then `entries` records {tag (8), request (112)}; record i holds the last request
// consumed at a ring index ≡ i (mod entries), tag = (index << 1) | 1 (0 = never written). The
// request is stored before its tag (release), so a tag that names an index vouches for a
// complete copy even if the writer died in the middle of the next record.
//
// Threading: one queue thread uses a ShadowRing; create/open/remove on the control thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "xpv/ring/blkif.h"

namespace xpv::blkback {

class ShadowRing {
 public:
  // A fresh shadow (a new connection): the file is created or truncated. Throws
  // std::system_error naming the path.
  static ShadowRing create(const std::string& path, std::uint32_t entries);
  // A reconnect after a restart: the existing file's records are kept when its header matches
  // `entries`; otherwise (absent, other geometry) a fresh one is made and `reused()` is false.
  static ShadowRing open(const std::string& path, std::uint32_t entries);

  ShadowRing(ShadowRing&&) noexcept;
  ShadowRing& operator=(ShadowRing&&) noexcept;
  ShadowRing(const ShadowRing&) = delete;
  ShadowRing& operator=(const ShadowRing&) = delete;
  ~ShadowRing();

  // Data path (queue thread), allocation-free.
  void put(ring::RingIdx idx, const ring::BlkifRequest& req) noexcept;
  std::optional<ring::BlkifRequest> get(ring::RingIdx idx) const noexcept;

  bool reused() const noexcept { return reused_; }
  const std::string& path() const noexcept { return path_; }
  // Deletes the file (the device closed for good: nothing is left to redo).
  void remove() noexcept;

 private:
  ShadowRing(std::string path, std::uint8_t* base, std::size_t size, std::uint32_t entries, bool reused) noexcept
      : path_(std::move(path)), base_(base), size_(size), entries_(entries), reused_(reused) {}
  static ShadowRing map(const std::string& path, std::uint32_t entries, bool keep);

  std::string path_;
  std::uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  std::uint32_t entries_ = 0;
  bool reused_ = false;
};

}  // namespace xpv::blkback
