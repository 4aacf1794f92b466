// Kernel payload decompression (gzip, xz, lzma, zstd), bounded: output beyond `limit` bytes is
// refused ("decompression bomb"), so a hostile image cannot make the VMM allocate more than the
// guest's memory size. Guest-facing parser: noexcept, Result.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "xpv/kvm/error.h"

namespace xpv::kvm {

enum class Compression { none, gzip, xz, lzma, zstd, bzip2, lz4, lzo, unknown };

std::string_view to_string(Compression c) noexcept;

// By magic bytes at the start of data.
Compression detect_compression(std::span<const std::uint8_t> data) noexcept;

// Decompresses one stream of the detected format (trailing bytes after the stream are ignored,
// as the kernel's payload carries a 4-byte size after it). Unsupported formats, corrupt or
// truncated input, and output larger than limit → error.
Result<std::vector<std::uint8_t>> decompress(std::span<const std::uint8_t> data, std::uint64_t limit) noexcept;

}  // namespace xpv::kvm
