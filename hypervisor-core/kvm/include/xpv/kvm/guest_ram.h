// GuestRam — a domain's RAM: one shared-memory file, mapped once into this process, exposed to KVM
// as one or two memory slots and to the rest of xpv as an xpv::GuestMemory view.
//
// The file is a tmpfs file with transparent huge pages (huge=within_size, on a tmpfs of its own
// that no mount table shows) where the host allows it, else a memfd. Huge pages matter most under
// nested virtualisation: each 4 KiB page a guest touches for the first time is a nested page
// fault, and KVM maps guest memory with 2 MiB entries only where this process's mapping is a
// huge page. Measured in the testbed (2026-12-01, Linux 6.1 in L1 whose shmem_enabled is "never"):
// 64 MiB written into a fresh guest's page cache took 3.7 s on a memfd, 1.0 s in QEMU's guest
// (anonymous memory with THP). To dom0 services both are the same: an fd of shmem they map.
//
// Guest-physical layout (x86 PC, no firmware):
//   [0, low_end)              RAM, low_end = min(size, 3 GiB)  file offset 0
//   [3 GiB, 4 GiB)            hole: PCI MMIO (platform-pci BAR1 later), IOAPIC, LAPIC, TSS
//   [4 GiB, 4 GiB + rest)     RAM above the hole, when size > 3 GiB  file offset low_end
// The file stays open for the life of the VM so dom0 services can map it (DESIGN.md §1: the
// domain control socket passes fd() and regions() with SCM_RIGHTS).
//
// Thread-safety: fixed after construction; any thread may read regions()/memory().
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
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
    std::uint64_t fd_offset = 0;  // offset of gpa inside the file
    std::uint8_t* host = nullptr;
  };

  // Creates and maps size bytes (a multiple of 2 MiB is not required, 4 KiB is). Throws
  // std::runtime_error with a clear line (setup code).
  // device: extra non-RAM regions {gpa, size} placed in the file after RAM (see VmConfig).
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
  // Bytes of the file (RAM + device memory).
  std::uint64_t file_size() const noexcept { return file_size_; }
  // What backs the RAM, for the VMM's log: "tmpfs huge=within_size", or "memfd (no huge tmpfs: why)".
  const std::string& backing() const noexcept { return backing_; }

  // The file offset of RAM [gpa, gpa + bytes), if all of it is RAM of one region.
  std::optional<std::uint64_t> ram_offset(std::uint64_t gpa, std::uint64_t bytes) const noexcept;
  // Gives the host memory behind RAM [gpa, gpa + bytes) back (a hole punched in the file: the
  // pages read as zeros and are allocated again when touched, by the guest through KVM or by any
  // process that maps the file). Page-aligned RAM only. 0, or the errno of fallocate (the range
  // then keeps its memory). Any thread.
  int discard(std::uint64_t gpa, std::uint64_t bytes) const noexcept;

 private:
  std::uint64_t size_ = 0;
  std::uint64_t file_size_ = 0;
  std::string backing_;
  UniqueFd fd_;
  std::uint8_t* base_ = nullptr;  // whole mapping of the file, file_size_ bytes
  std::vector<Region> regions_;
  GuestMemory memory_;
};

}  // namespace xpv::kvm
