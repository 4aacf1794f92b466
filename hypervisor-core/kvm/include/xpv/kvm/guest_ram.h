// GuestRam — a domain's RAM: one memfd, mapped once into this process, exposed to KVM as one or
// two memory slots and to the rest of xpv as an xpv::GuestMemory view.
//
// Guest-physical layout (x86 PC, no firmware):
//   [0, low_end)              RAM, low_end = min(size, 3 GiB)  memfd offset 0
//   [3 GiB, 4 GiB)            hole: PCI MMIO (platform-pci BAR1 later), IOAPIC, LAPIC, TSS
//   [4 GiB, 4 GiB + rest)     RAM above the hole, when size > 3 GiB  memfd offset low_end
// The memfd stays open for the life of the VM so dom0 services can map it (DESIGN.md §1: the
// domain control socket passes fd() and regions() with SCM_RIGHTS).
//
// Thread-safety: fixed after construction; any thread may read regions()/memory().
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "xpv/guest_memory.h"
#include "xpv/kvm/fd.h"

namespace xpv::kvm {

inline constexpr std::uint64_t kLowRamMax = 0xC000'0000;   // 3 GiB: start of the PCI hole
inline constexpr std::uint64_t kHighRamBase = 0x1'0000'0000;  // 4 GiB

class GuestRam {
 public:
  struct Region {
    std::uint64_t gpa = 0;
    std::uint64_t size = 0;
    std::uint64_t fd_offset = 0;  // offset of gpa inside the memfd
    std::uint8_t* host = nullptr;
  };

  // Creates and maps size bytes (a multiple of 2 MiB is not required, 4 KiB is). Throws
  // std::runtime_error with a clear line (setup code).
  // device: extra non-RAM regions {gpa, size} placed in the memfd after RAM (see VmConfig).
  explicit GuestRam(std::uint64_t size, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& device = {});
  ~GuestRam();
  GuestRam(const GuestRam&) = delete;
  GuestRam& operator=(const GuestRam&) = delete;

  std::uint64_t size() const noexcept { return size_; }  // RAM bytes (device memory not counted)
  int fd() const noexcept { return fd_.get(); }
  const std::vector<Region>& regions() const noexcept { return regions_; }
  const GuestMemory& memory() const noexcept { return memory_; }
  // End of the RAM below the hole (the e820 and initrd placement need it).
  std::uint64_t low_end() const noexcept { return regions_.front().size; }
  // Bytes of the memfd (RAM + device memory).
  std::uint64_t file_size() const noexcept { return file_size_; }

 private:
  std::uint64_t size_ = 0;
  std::uint64_t file_size_ = 0;
  UniqueFd fd_;
  std::uint8_t* base_ = nullptr;  // whole memfd mapping, size_ bytes
  std::vector<Region> regions_;
  GuestMemory memory_;
};

}  // namespace xpv::kvm
