#include "xpv/kvm/linux_boot.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "xpv/kvm/boot_params.h"
#include "xpv/kvm/bzimage.h"
#include "xpv/kvm/decompress.h"
#include "xpv/kvm/elf_loader.h"
#include "xpv/kvm/le.h"
#include "xpv/kvm/mptable.h"

namespace xpv::kvm {
namespace {
constexpr std::uint64_t kPteP = 1, kPteRw = 2, kPtePs = 0x80;
constexpr std::uint32_t kDefaultCmdlineMax = 2048;
constexpr std::uint64_t kDefaultInitrdMax = 0x37ffffff;  // boot.rst: when the header has none
}  // namespace

Result<void> write_long_mode_tables(const GuestMemory& mem) noexcept {
  auto tables = mem.translate(kPml4Gpa, 6 * kPageSize);
  auto gdt = mem.translate(kGdtGpa, 4 * 8);
  if (!tables || !gdt) return err("boot: guest RAM does not cover the page tables / GDT below 1 MiB");
  std::span<std::uint8_t> t = *tables;
  std::memset(t.data(), 0, t.size());
  const std::uint64_t pdpt = kPml4Gpa + kPageSize, pd0 = kPml4Gpa + 2 * kPageSize;
  le::store<std::uint64_t>(t, 0, pdpt | kPteP | kPteRw);
  for (std::uint64_t i = 0; i < 4; ++i) {
    le::store<std::uint64_t>(t, kPageSize + i * 8, (pd0 + i * kPageSize) | kPteP | kPteRw);
    for (std::uint64_t j = 0; j < 512; ++j) {
      const std::uint64_t addr = (i << 30) | (j << 21);
      le::store<std::uint64_t>(t, (2 + i) * kPageSize + j * 8, addr | kPteP | kPteRw | kPtePs);
    }
  }
  // Flat descriptors: base 0, limit 4 GiB (G), code: L=1 D=0 type 0xb; data: D/B=1 type 0x3.
  std::span<std::uint8_t> g = *gdt;
  le::store<std::uint64_t>(g, 0, 0);
  le::store<std::uint64_t>(g, 8, 0);
  le::store<std::uint64_t>(g, 16, 0x00af'9b00'0000'ffffull);
  le::store<std::uint64_t>(g, 24, 0x00cf'9300'0000'ffffull);
  return {};
}

Result<LinuxBootEntry> setup_linux_boot(const GuestMemory& mem, const LinuxBootInput& in) noexcept {
  try {
    if (in.low_end < 32 * 1024 * 1024) return err("boot: at least 32 MiB of guest memory are needed");
    const std::uint64_t ram = in.low_end + in.high_size;
    LinuxBootEntry e;
    std::span<const std::uint8_t> setup_header;
    std::uint64_t initrd_max = kDefaultInitrdMax;
    std::uint32_t cmdline_max = kDefaultCmdlineMax;
    std::vector<std::uint8_t> vmlinux;
    std::span<const std::uint8_t> elf = in.kernel;
    if (looks_like_bzimage(in.kernel)) {
      auto bz = parse_bzimage(in.kernel);
      if (!bz) return err("kernel: " + bz.error().message);
      auto dec = decompress(bz->payload, ram);
      if (!dec) return err("kernel: bzImage payload: " + dec.error().message);
      vmlinux = std::move(*dec);
      elf = vmlinux;
      if (!looks_like_elf(elf)) return err("kernel: bzImage payload is not an ELF vmlinux");
      setup_header = bz->setup_header;
      initrd_max = bz->initrd_addr_max;
      if (bz->cmdline_size != 0) cmdline_max = bz->cmdline_size;
      e.from_bzimage = true;
    } else if (!looks_like_elf(in.kernel)) {
      return err("kernel: neither a bzImage nor an ELF vmlinux (bad magic)");
    }
    auto k = load_elf(elf, mem, kKernelWindowLo, in.low_end);
    if (!k) return err("kernel: " + k.error().message);
    e.rip = k->entry;
    e.kernel_start = k->lowest;
    e.kernel_end = k->highest;
    e.kernel_tables = k->tables;

    if (in.cmdline.size() + 1 > cmdline_max) {
      return err(fmt::format("command line is {} bytes; this kernel takes at most {}", in.cmdline.size(), cmdline_max - 1));
    }
    auto cl = mem.translate(kCmdlineGpa, in.cmdline.size() + 1);
    if (!cl) return err("boot: command line area is not in guest RAM");
    std::memcpy(cl->data(), in.cmdline.data(), in.cmdline.size());
    (*cl)[in.cmdline.size()] = 0;

    if (!in.initrd.empty()) {
      const std::uint64_t limit = std::min<std::uint64_t>(in.low_end, initrd_max + 1);
      const std::uint64_t floor = (e.kernel_end + kPageSize - 1) & ~(kPageSize - 1);
      if (in.initrd.size() > limit || ((limit - in.initrd.size()) & ~(kPageSize - 1)) < floor) {
        return err(fmt::format("initrd: {} bytes do not fit between the kernel end {:#x} and {:#x}",
                               in.initrd.size(), floor, limit));
      }
      e.initrd_gpa = (limit - in.initrd.size()) & ~(kPageSize - 1);
      auto dst = mem.translate(e.initrd_gpa, in.initrd.size());
      if (!dst) return err("initrd: placement outside guest RAM");
      std::memcpy(dst->data(), in.initrd.data(), in.initrd.size());
    }

    auto zp = mem.translate(kBootParamsGpa, kZeroPageSize);
    if (!zp) return err("boot: zero page is not in guest RAM");
    BootParamsInput bp;
    bp.setup_header = setup_header;
    bp.cmdline_gpa = kCmdlineGpa;
    bp.cmdline_size = static_cast<std::uint32_t>(in.cmdline.size() + 1);
    bp.initrd_gpa = e.initrd_gpa;
    bp.initrd_size = in.initrd.size();
    bp.e820 = build_e820(in.low_end, in.high_size);
    if (auto r = build_boot_params(*zp, bp); !r) return err(r.error().message);

    MpTableInput mpi;
    mpi.vcpus = in.vcpus;
    mpi.cpu_signature = in.cpu_signature;
    mpi.cpu_features = in.cpu_features;
    mpi.pci_irqs = in.pci_irqs;
    auto mp = mem.translate(kMpTableGpa, mptable_size(mpi));
    if (!mp) return err("boot: MP table area is not in guest RAM");
    if (auto r = build_mptable(*mp, kMpTableGpa, mpi); !r) return err(r.error().message);

    if (auto r = write_long_mode_tables(mem); !r) return err(r.error().message);
    return e;
  } catch (const std::bad_alloc&) {
    return err("boot: out of memory while loading the kernel");
  }
}

}  // namespace xpv::kvm
