#include "xpv/kvm/boot_params.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "xpv/kvm/bzimage.h"
#include "xpv/kvm/guest_ram.h"
#include "xpv/kvm/le.h"

namespace xpv::kvm {

std::vector<E820Entry> build_e820(std::uint64_t low_end, std::uint64_t high_size) {
  constexpr std::uint64_t kEbda = 0x9fc00, kBiosEnd = 0x100000;
  std::vector<E820Entry> map;
  map.push_back({0, std::min(low_end, kEbda), kE820Ram});
  if (low_end > kEbda) map.push_back({kEbda, kBiosEnd - kEbda, kE820Reserved});
  if (low_end > kBiosEnd) map.push_back({kBiosEnd, low_end - kBiosEnd, kE820Ram});
  if (high_size > 0) map.push_back({kHighRamBase, high_size, kE820Ram});
  return map;
}

Result<void> build_boot_params(std::span<std::uint8_t> zp, const BootParamsInput& in) noexcept {
  if (zp.size() != kZeroPageSize) return err(fmt::format("boot_params: page is {} bytes, not 4096", zp.size()));
  if (in.e820.size() > kE820Max) return err(fmt::format("boot_params: {} e820 entries (max {})", in.e820.size(), kE820Max));
  if (in.setup_header.size() > 0x290 - kSetupHeaderOffset) return err("boot_params: setup header too long");
  std::memset(zp.data(), 0, zp.size());
  if (!in.setup_header.empty()) {
    std::memcpy(zp.data() + kSetupHeaderOffset, in.setup_header.data(), in.setup_header.size());
  } else {
    // A bare vmlinux: the fields the kernel reads from a header a boot loader would have had.
    le::store<std::uint16_t>(zp, 0x1fe, 0xaa55);
    le::store<std::uint32_t>(zp, 0x202, 0x53726448);  // "HdrS"
    le::store<std::uint16_t>(zp, 0x206, 0x020c);
    le::store<std::uint32_t>(zp, 0x230, 0x0100'0000);  // kernel_alignment 16 MiB
  }
  le::store<std::uint16_t>(zp, 0x1fa, 0xffff);  // vid_mode: "normal"
  zp[0x210] = 0xff;                              // type_of_loader: undefined boot loader
  zp[0x211] = static_cast<std::uint8_t>(zp[0x211] | 0x01 | 0x80);  // LOADED_HIGH | CAN_USE_HEAP
  le::store<std::uint16_t>(zp, 0x224, 0xfe00);   // heap_end_ptr
  le::store<std::uint32_t>(zp, 0x228, static_cast<std::uint32_t>(in.cmdline_gpa));
  le::store<std::uint32_t>(zp, 0x0c8, static_cast<std::uint32_t>(in.cmdline_gpa >> 32));
  le::store<std::uint32_t>(zp, 0x238, in.cmdline_size);
  le::store<std::uint32_t>(zp, 0x218, static_cast<std::uint32_t>(in.initrd_gpa));
  le::store<std::uint32_t>(zp, 0x0c0, static_cast<std::uint32_t>(in.initrd_gpa >> 32));
  le::store<std::uint32_t>(zp, 0x21c, static_cast<std::uint32_t>(in.initrd_size));
  le::store<std::uint32_t>(zp, 0x0c4, static_cast<std::uint32_t>(in.initrd_size >> 32));
  zp[0x1e8] = static_cast<std::uint8_t>(in.e820.size());
  for (std::size_t i = 0; i < in.e820.size(); ++i) {
    const std::size_t off = 0x2d0 + i * 20;
    le::store<std::uint64_t>(zp, off, in.e820[i].addr);
    le::store<std::uint64_t>(zp, off + 8, in.e820[i].size);
    le::store<std::uint32_t>(zp, off + 16, in.e820[i].type);
  }
  return {};
}

}  // namespace xpv::kvm
