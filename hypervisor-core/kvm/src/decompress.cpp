#include "xpv/kvm/decompress.h"

#include <fmt/core.h>
#include <lzma.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace xpv::kvm {
namespace {

constexpr std::size_t kChunk = 1 << 20;

// Grows out by one chunk, refusing to pass limit. Returns false when the limit is reached.
bool grow(std::vector<std::uint8_t>& out, std::size_t used, std::uint64_t limit) {
  if (used >= limit) return false;
  const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(limit, used + kChunk));
  out.resize(want);
  return true;
}

std::string bomb(std::uint64_t limit) {
  return fmt::format("decompressed kernel exceeds {} bytes (guest memory): refused", limit);
}

Result<std::vector<std::uint8_t>> gunzip(std::span<const std::uint8_t> in, std::uint64_t limit) {
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) return err("gzip: inflateInit2 failed");
  std::vector<std::uint8_t> out;
  std::size_t used = 0;
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(std::min<std::size_t>(in.size(), UINT32_MAX));
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    if (used == out.size() && !grow(out, used, limit)) {
      inflateEnd(&zs);
      return err(bomb(limit));
    }
    zs.next_out = out.data() + used;
    zs.avail_out = static_cast<uInt>(out.size() - used);
    rc = inflate(&zs, Z_NO_FLUSH);
    used = out.size() - zs.avail_out;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) {
      inflateEnd(&zs);
      return err("gzip: truncated stream");
    }
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
      std::string m = fmt::format("gzip: corrupt stream ({})", zs.msg != nullptr ? zs.msg : "?");
      inflateEnd(&zs);
      return err(m);
    }
  }
  inflateEnd(&zs);
  out.resize(used);
  return out;
}

Result<std::vector<std::uint8_t>> unxz(std::span<const std::uint8_t> in, std::uint64_t limit, bool alone) {
  lzma_stream ls = LZMA_STREAM_INIT;
  const lzma_ret init = alone ? lzma_alone_decoder(&ls, UINT64_MAX) : lzma_stream_decoder(&ls, UINT64_MAX, 0);
  if (init != LZMA_OK) return err("xz: decoder init failed");
  std::vector<std::uint8_t> out;
  std::size_t used = 0;
  ls.next_in = in.data();
  ls.avail_in = in.size();
  for (;;) {
    if (used == out.size() && !grow(out, used, limit)) {
      lzma_end(&ls);
      return err(bomb(limit));
    }
    ls.next_out = out.data() + used;
    ls.avail_out = out.size() - used;
    const lzma_ret rc = lzma_code(&ls, ls.avail_in == 0 ? LZMA_FINISH : LZMA_RUN);
    used = out.size() - ls.avail_out;
    if (rc == LZMA_STREAM_END) break;
    if (rc == LZMA_OK) continue;
    lzma_end(&ls);
    if (rc == LZMA_BUF_ERROR) return err(fmt::format("{}: truncated stream", alone ? "lzma" : "xz"));
    return err(fmt::format("{}: corrupt stream (liblzma error {})", alone ? "lzma" : "xz", static_cast<int>(rc)));
  }
  lzma_end(&ls);
  out.resize(used);
  return out;
}

Result<std::vector<std::uint8_t>> unzstd(std::span<const std::uint8_t> in, std::uint64_t limit) {
  ZSTD_DStream* ds = ZSTD_createDStream();
  if (ds == nullptr) return err("zstd: cannot create a decoder");
  // The kernel is compressed with a large window (--long); allow the biggest.
  ZSTD_DCtx_setParameter(ds, ZSTD_d_windowLogMax, 30);
  std::vector<std::uint8_t> out;
  std::size_t used = 0;
  ZSTD_inBuffer ib{in.data(), in.size(), 0};
  for (;;) {
    if (used == out.size() && !grow(out, used, limit)) {
      ZSTD_freeDStream(ds);
      return err(bomb(limit));
    }
    ZSTD_outBuffer ob{out.data(), out.size(), used};
    const std::size_t rc = ZSTD_decompressStream(ds, &ob, &ib);
    used = ob.pos;
    if (ZSTD_isError(rc)) {
      std::string m = fmt::format("zstd: corrupt stream ({})", ZSTD_getErrorName(rc));
      ZSTD_freeDStream(ds);
      return err(m);
    }
    if (rc == 0) break;  // frame complete
    if (ib.pos == ib.size && ob.pos < ob.size) {
      ZSTD_freeDStream(ds);
      return err("zstd: truncated stream");
    }
  }
  ZSTD_freeDStream(ds);
  out.resize(used);
  return out;
}

}  // namespace

std::string_view to_string(Compression c) noexcept {
  switch (c) {
    case Compression::none: return "none";
    case Compression::gzip: return "gzip";
    case Compression::xz: return "xz";
    case Compression::lzma: return "lzma";
    case Compression::zstd: return "zstd";
    case Compression::bzip2: return "bzip2";
    case Compression::lz4: return "lz4";
    case Compression::lzo: return "lzo";
    case Compression::unknown: break;
  }
  return "unknown";
}

Compression detect_compression(std::span<const std::uint8_t> d) noexcept {
  auto starts = [&](std::initializer_list<std::uint8_t> m) {
    return d.size() >= m.size() && std::equal(m.begin(), m.end(), d.begin());
  };
  if (starts({0x7f, 'E', 'L', 'F'})) return Compression::none;
  if (starts({0x1f, 0x8b})) return Compression::gzip;
  if (starts({0xfd, '7', 'z', 'X', 'Z', 0x00})) return Compression::xz;
  if (starts({0x28, 0xb5, 0x2f, 0xfd})) return Compression::zstd;
  if (starts({'B', 'Z', 'h'})) return Compression::bzip2;
  if (starts({0x02, 0x21, 0x4c, 0x18})) return Compression::lz4;
  if (starts({0x89, 'L', 'Z', 'O'})) return Compression::lzo;
  if (starts({0x5d, 0x00, 0x00})) return Compression::lzma;
  return Compression::unknown;
}

Result<std::vector<std::uint8_t>> decompress(std::span<const std::uint8_t> data, std::uint64_t limit) noexcept {
  try {
    const Compression c = detect_compression(data);
    switch (c) {
      case Compression::gzip: return gunzip(data, limit);
      case Compression::xz: return unxz(data, limit, false);
      case Compression::lzma: return unxz(data, limit, true);
      case Compression::zstd: return unzstd(data, limit);
      case Compression::none: {
        if (data.size() > limit) return err(bomb(limit));
        return std::vector<std::uint8_t>(data.begin(), data.end());
      }
      default:
        return err(fmt::format("kernel payload: {} compression is not supported (gzip, xz, lzma, zstd are)",
                               to_string(c)));
    }
  } catch (const std::bad_alloc&) {
    return err("decompression: out of memory");
  }
}

}  // namespace xpv::kvm
