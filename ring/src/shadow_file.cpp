#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "xpv/shadow_ring.h"
#include "xpv/unique_fd.h"

namespace xpv {
namespace {

constexpr std::uint64_t kMagic = 0x5844574f44414853ull;  // "SHADOWDX"
constexpr std::uint32_t kVersion = 2;                    // 2: the record size in the header (1: blkback's 120 B)

struct Header {
  std::uint64_t magic;         // 0x00
  std::uint32_t version;       // 0x08
  std::uint32_t entries;       // 0x0c
  std::uint32_t record_bytes;  // 0x10: tag + payload, padded to 8
  std::uint8_t pad[44];        // 0x14
};
static_assert(std::is_standard_layout_v<Header> && sizeof(Header) == 64);

std::uint64_t tag_of(std::uint32_t idx) noexcept { return (std::uint64_t{idx} << 1) | 1; }

}  // namespace

ShadowFile ShadowFile::map(const std::string& path, std::uint32_t entries, std::size_t payload, bool keep) {
  if (entries == 0 || !std::has_single_bit(entries)) throw std::invalid_argument("shadow ring: entries must be a power of two");
  if (payload == 0 || payload > 4096) throw std::invalid_argument("shadow ring: a record of 1..4096 bytes");
  const std::size_t record = sizeof(std::uint64_t) + (payload + 7) / 8 * 8;
  const std::size_t size = sizeof(Header) + std::size_t{entries} * record;
  bool reused = false;
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) throw std::system_error(errno, std::generic_category(), "shadow ring " + path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw std::system_error(errno, std::generic_category(), "shadow ring " + path);
  if (keep && static_cast<std::size_t>(st.st_size) == size) {
    Header h{};
    if (::pread(fd.get(), &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h) && h.magic == kMagic &&
        h.entries == entries) {
      // Version 1 (xpv-blkback before session 49) had no record size: 120-byte records only.
      reused = (h.version == kVersion && h.record_bytes == record) ||
               (h.version == 1 && h.record_bytes == 0 && record == 120);
    }
  }
  if (!reused) {
    // Truncate to zero first so that no stale record survives.
    if (::ftruncate(fd.get(), 0) != 0 || ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
      throw std::system_error(errno, std::generic_category(), "shadow ring " + path);
    }
  }
  // Every page backed now: a full file system is an error here, not a SIGBUS at a later put().
  if (const int e = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size)); e != 0) {
    throw std::system_error(e, std::generic_category(), "shadow ring " + path);
  }
  if (!reused) {
    Header h{};
    h.magic = kMagic;
    h.version = kVersion;
    h.entries = entries;
    h.record_bytes = static_cast<std::uint32_t>(record);
    if (::pwrite(fd.get(), &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) {
      throw std::system_error(errno, std::generic_category(), "shadow ring " + path);
    }
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "shadow ring " + path);
  return ShadowFile(path, static_cast<std::uint8_t*>(p), size, entries, record, reused);
}

ShadowFile::ShadowFile(ShadowFile&& o) noexcept
    : path_(std::move(o.path_)),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      entries_(o.entries_),
      record_(o.record_),
      reused_(o.reused_) {}

ShadowFile& ShadowFile::operator=(ShadowFile&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(base_, size_);
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    entries_ = o.entries_;
    record_ = o.record_;
    reused_ = o.reused_;
  }
  return *this;
}

ShadowFile::~ShadowFile() {
  if (base_) ::munmap(base_, size_);
}

std::uint8_t* ShadowFile::record(std::uint32_t idx) const noexcept {
  return base_ + sizeof(Header) + std::size_t{idx & (entries_ - 1)} * record_;
}

void ShadowFile::put(std::uint32_t idx, const void* data, std::size_t bytes) noexcept {
  std::uint8_t* r = record(idx);
  std::memcpy(r + sizeof(std::uint64_t), data, bytes);
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(r)).store(tag_of(idx), std::memory_order_release);
}

bool ShadowFile::get(std::uint32_t idx, void* out, std::size_t bytes) const noexcept {
  std::uint8_t* r = record(idx);
  if (std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(r)).load(std::memory_order_acquire) != tag_of(idx)) {
    return false;
  }
  std::memcpy(out, r + sizeof(std::uint64_t), bytes);
  return true;
}

void ShadowFile::remove() noexcept {
  if (!path_.empty()) ::unlink(path_.c_str());
}

}  // namespace xpv
