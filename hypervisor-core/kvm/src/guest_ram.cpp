#include "xpv/kvm/guest_ram.h"

#include <fmt/core.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xpv::kvm {

GuestRam::GuestRam(std::uint64_t size) : size_(size) {
  if (size == 0 || size % kPageSize != 0) {
    throw std::runtime_error(fmt::format("guest memory size {} is not a positive multiple of 4 KiB", size));
  }
  fd_ = UniqueFd(memfd_create("xpv-guest-ram", MFD_CLOEXEC));
  if (!fd_.valid()) throw std::runtime_error(fmt::format("memfd_create: {}", std::strerror(errno)));
  if (ftruncate(fd_.get(), static_cast<off_t>(size)) != 0) {
    throw std::runtime_error(fmt::format("guest memory: ftruncate({} bytes): {}", size, std::strerror(errno)));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_.get(), 0);
  if (p == MAP_FAILED) {
    throw std::runtime_error(fmt::format("guest memory: mmap({} bytes): {}", size, std::strerror(errno)));
  }
  base_ = static_cast<std::uint8_t*>(p);
  const std::uint64_t low = size < kLowRamMax ? size : kLowRamMax;
  regions_.push_back(Region{0, low, 0, base_});
  if (size > low) regions_.push_back(Region{kHighRamBase, size - low, low, base_ + low});
  std::vector<GuestMemory::Region> view;
  for (const auto& r : regions_) view.push_back({r.gpa, r.size, r.host});
  memory_ = GuestMemory(std::move(view));
}

GuestRam::~GuestRam() {
  if (base_ != nullptr) munmap(base_, size_);
}

}  // namespace xpv::kvm
