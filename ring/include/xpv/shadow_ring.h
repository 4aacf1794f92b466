// ShadowRing<Req> — a copy of every request a backend queue consumed, kept in a file that
// outlives the backend process, so that a restarted backend can tell what a slot held before the
// dead one wrote its response there (backends/README.md, "Backend restart without a guest
// reboot").
//
// Why it is needed. A response is written into the slot of the request it answers before the
// ring's rsp_prod is published: a backend killed between those two stores leaves slots in
// [rsp_prod, req_prod) holding responses where the new backend expects requests. xpv-blkback
// keeps whole blkif requests (it redoes them); xpv-netback keeps rx requests (it gives each
// buffer back with the frontend's own id, which a GSO extra-info response overwrote).
//
// File layout (host memory only, never seen by a guest): a 64-byte header {magic, version,
// entries, record bytes}, then `entries` records {tag (8), request (sizeof Req, padded to 8)};
// record i holds the last request consumed at a ring index ≡ i (mod entries), tag = (index << 1)
// | 1 (0 = never written). The request is stored before its tag (release), so a tag that names an
// index vouches for a complete copy of that index's request. A writer that dies while it copies a
// new request over a record leaves the record's old tag with a torn copy: harmless, as the old
// tag names index - entries, whose response was published before the ring let the frontend
// post the request at index (nobody asks for that index again). Version 1 files (blkback's,
// 120-byte records, no record size in the header) are still read.
//
// Threading: one queue thread uses a ShadowRing; create/open/remove on a control thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace xpv {

// The untyped file: records of `payload` bytes behind their tags.
class ShadowFile {
 public:
  // A fresh shadow (keep = false: created or truncated) or a reopened one (keep = true: the
  // existing records are kept when the header matches `entries` and `payload`; otherwise it is
  // made afresh and reused() is false). Throws std::invalid_argument (entries not a power of two,
  // payload 0) or std::system_error naming the path.
  static ShadowFile map(const std::string& path, std::uint32_t entries, std::size_t payload, bool keep);

  ShadowFile(ShadowFile&&) noexcept;
  ShadowFile& operator=(ShadowFile&&) noexcept;
  ShadowFile(const ShadowFile&) = delete;
  ShadowFile& operator=(const ShadowFile&) = delete;
  ~ShadowFile();

  // Data path, allocation-free. `bytes` must be the payload size given to map().
  void put(std::uint32_t idx, const void* data, std::size_t bytes) noexcept;
  bool get(std::uint32_t idx, void* out, std::size_t bytes) const noexcept;

  bool reused() const noexcept { return reused_; }
  const std::string& path() const noexcept { return path_; }
  void remove() noexcept;  // deletes the file (nothing is left to redo)

 private:
  ShadowFile(std::string path, std::uint8_t* base, std::size_t size, std::uint32_t entries, std::size_t record,
             bool reused) noexcept
      : path_(std::move(path)), base_(base), size_(size), entries_(entries), record_(record), reused_(reused) {}
  std::uint8_t* record(std::uint32_t idx) const noexcept;

  std::string path_;
  std::uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  std::uint32_t entries_ = 0;
  std::size_t record_ = 0;
  bool reused_ = false;
};

template <class Req>
class ShadowRing {
  static_assert(std::is_trivially_copyable_v<Req>);

 public:
  static ShadowRing create(const std::string& path, std::uint32_t entries) {
    return ShadowRing(ShadowFile::map(path, entries, sizeof(Req), false));
  }
  static ShadowRing open(const std::string& path, std::uint32_t entries) {
    return ShadowRing(ShadowFile::map(path, entries, sizeof(Req), true));
  }

  void put(std::uint32_t idx, const Req& req) noexcept { file_.put(idx, &req, sizeof req); }
  std::optional<Req> get(std::uint32_t idx) const noexcept {
    Req r;
    if (!file_.get(idx, &r, sizeof r)) return std::nullopt;
    return r;
  }

  bool reused() const noexcept { return file_.reused(); }
  const std::string& path() const noexcept { return file_.path(); }
  void remove() noexcept { file_.remove(); }

 private:
  explicit ShadowRing(ShadowFile f) noexcept : file_(std::move(f)) {}
  ShadowFile file_;
};

}  // namespace xpv
