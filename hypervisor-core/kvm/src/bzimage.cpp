#include "xpv/kvm/bzimage.h"

#include <fmt/core.h>

#include "xpv/kvm/le.h"

namespace xpv::kvm {
namespace {
constexpr std::size_t kMinHeaderEnd = 0x268;  // through init_size/handover_offset (protocol 2.11)
}

bool looks_like_bzimage(std::span<const std::uint8_t> img) noexcept {
  return img.size() >= 0x206 && le::load<std::uint16_t>(img, 0x1fe) == 0xaa55 &&
         le::load<std::uint32_t>(img, 0x202) == 0x53726448;  // "HdrS"
}

Result<BzImage> parse_bzimage(std::span<const std::uint8_t> img) noexcept {
  if (img.size() < 0x1000) return err(fmt::format("bzImage: {} bytes is too small for a kernel image", img.size()));
  if (!looks_like_bzimage(img)) return err("bzImage: bad magic (no 0xAA55 boot flag / \"HdrS\" header)");
  BzImage bz;
  bz.version = le::load<std::uint16_t>(img, 0x206);
  if (bz.version < 0x020c) {
    return err(fmt::format("bzImage: boot protocol {}.{:02} is too old (64-bit entry needs ≥ 2.12)",
                           bz.version >> 8, bz.version & 0xff));
  }
  const std::size_t header_end = 0x202 + std::size_t{img[0x201]};
  if (header_end < kMinHeaderEnd || header_end > 0x290) {
    return err(fmt::format("bzImage: setup header length {:#x} is out of range", header_end));
  }
  bz.setup_header = img.subspan(kSetupHeaderOffset, header_end - kSetupHeaderOffset);
  const unsigned sects = img[0x1f1] == 0 ? 4u : img[0x1f1];
  bz.setup_size = (sects + 1) * 512;
  if (bz.setup_size >= img.size()) {
    return err(fmt::format("bzImage: setup_sects {} points past the end of the file ({} bytes)", sects, img.size()));
  }
  if (!(img[0x211] & 0x01)) return err("bzImage: not a bzImage (LOADED_HIGH clear: a zImage)");
  bz.initrd_addr_max = le::load<std::uint32_t>(img, 0x22c);
  bz.xloadflags = le::load<std::uint16_t>(img, 0x236);
  bz.cmdline_size = le::load<std::uint32_t>(img, 0x238);
  bz.init_size = le::load<std::uint32_t>(img, 0x260);
  if (!(bz.xloadflags & 0x1)) return err("bzImage: kernel has no 64-bit entry point (XLF_KERNEL_64 clear)");
  const std::uint64_t off = le::load<std::uint32_t>(img, 0x248);
  const std::uint64_t len = le::load<std::uint32_t>(img, 0x24c);
  const std::uint64_t pm_size = img.size() - bz.setup_size;
  if (len == 0 || off > pm_size || len > pm_size - off) {
    return err(fmt::format("bzImage: payload [{:#x}, +{:#x}) lies outside the {:#x}-byte protected-mode image",
                           off, len, pm_size));
  }
  bz.payload = img.subspan(bz.setup_size + off, len);
  return bz;
}

}  // namespace xpv::kvm
