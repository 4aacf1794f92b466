#include "xpv/blkback/shadow_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "xpv/unique_fd.h"

namespace xpv::blkback {
namespace {

constexpr std::uint64_t kMagic = 0x5844574f44414853ull;  // "SHADOWDX"
constexpr std::uint32_t kVersion = 1;

struct Header {
  std::uint64_t magic;     // 0x00
  std::uint32_t version;   // 0x08
  std::uint32_t entries;   // 0x0c
  std::uint8_t pad[48];    // 0x10
};
static_assert(std::is_standard_layout_v<Header> && sizeof(Header) == 64);

struct Record {
  std::uint64_t tag;            // 0x00: (index << 1) | 1, 0 = empty
  ring::BlkifRequest request;   // 0x08
};
static_assert(std::is_standard_layout_v<Record> && sizeof(Record) == 120);
static_assert(offsetof(Record, request) == 8);

std::size_t file_size(std::uint32_t entries) { return sizeof(Header) + std::size_t{entries} * sizeof(Record); }

Record* record(std::uint8_t* base, std::uint32_t entries, ring::RingIdx idx) noexcept {
  return reinterpret_cast<Record*>(base + sizeof(Header)) + (idx & (entries - 1));
}

std::uint64_t tag_of(ring::RingIdx idx) noexcept { return (std::uint64_t{idx} << 1) | 1; }

}  // namespace

ShadowRing ShadowRing::map(const std::string& path, std::uint32_t entries, bool keep) {
  if (entries == 0 || !std::has_single_bit(entries)) throw std::invalid_argument("shadow ring: entries must be a power of two");
  const std::size_t size = file_size(entries);
  bool reused = false;
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) throw std::system_error(errno, std::generic_category(), "shadow ring " + path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw std::system_error(errno, std::generic_category(), "shadow ring " + path);
  if (keep && static_cast<std::size_t>(st.st_size) == size) {
    Header h{};
    if (::pread(fd.get(), &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h) && h.magic == kMagic &&
        h.version == kVersion && h.entries == entries) {
      reused = true;
    }
  }
  if (!reused) {
    // Truncate to zero first so that no stale record survives.
    if (::ftruncate(fd.get(), 0) != 0 || ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
      throw std::system_error(errno, std::generic_category(), "shadow ring " + path);
    }
    Header h{};
    h.magic = kMagic;
    h.version = kVersion;
    h.entries = entries;
    if (::pwrite(fd.get(), &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) {
      throw std::system_error(errno, std::generic_category(), "shadow ring " + path);
    }
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "shadow ring " + path);
  return ShadowRing(path, static_cast<std::uint8_t*>(p), size, entries, reused);
}

ShadowRing ShadowRing::create(const std::string& path, std::uint32_t entries) { return map(path, entries, false); }
ShadowRing ShadowRing::open(const std::string& path, std::uint32_t entries) { return map(path, entries, true); }

ShadowRing::ShadowRing(ShadowRing&& o) noexcept
    : path_(std::move(o.path_)),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      entries_(o.entries_),
      reused_(o.reused_) {}

ShadowRing& ShadowRing::operator=(ShadowRing&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(base_, size_);
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    entries_ = o.entries_;
    reused_ = o.reused_;
  }
  return *this;
}

ShadowRing::~ShadowRing() {
  if (base_) ::munmap(base_, size_);
}

void ShadowRing::put(ring::RingIdx idx, const ring::BlkifRequest& req) noexcept {
  Record* r = record(base_, entries_, idx);
  std::memcpy(&r->request, &req, sizeof req);
  std::atomic_ref<std::uint64_t>(r->tag).store(tag_of(idx), std::memory_order_release);
}

std::optional<ring::BlkifRequest> ShadowRing::get(ring::RingIdx idx) const noexcept {
  Record* r = record(base_, entries_, idx);
  if (std::atomic_ref<std::uint64_t>(r->tag).load(std::memory_order_acquire) != tag_of(idx)) return std::nullopt;
  ring::BlkifRequest req;
  std::memcpy(&req, &r->request, sizeof req);
  return req;
}

void ShadowRing::remove() noexcept {
  if (!path_.empty()) ::unlink(path_.c_str());
}

}  // namespace xpv::blkback
