#include "xpv/kvm/pci_host.h"

#include <fmt/core.h>

#include <cstring>

namespace xpv::kvm {

std::uint32_t PciHostBridge::config_read(unsigned offset, unsigned size) noexcept {
  std::uint32_t dword = 0;
  switch (offset & ~3u) {
    case 0x00: dword = 0x0d57'8086; break;  // device 0x0d57, vendor Intel: a plain host bridge
    case 0x04: dword = 0x0000'0000; break;  // command/status
    case 0x08: dword = 0x0600'0000; break;  // class 06 (bridge) 00 (host), revision 0
    case 0x0c: dword = 0x0000'0000; break;  // header type 0, single function
    default: dword = 0; break;
  }
  const unsigned shift = (offset & 3u) * 8;
  const std::uint32_t mask = size >= 4 ? 0xffffffffu : ((1u << (size * 8)) - 1);
  return (dword >> shift) & mask;
}

PciHost::PciHost() { slots_[0] = &bridge_; }

Result<void> PciHost::plug(unsigned slot, PciFunction* fn) {
  if (slot >= kSlots || fn == nullptr) return err(fmt::format("pci: bad slot {}", slot));
  std::lock_guard lk(mu_);
  if (slots_[slot] != nullptr) return err(fmt::format("pci: slot 00:{:02x}.0 is taken", slot));
  slots_[slot] = fn;
  return {};
}

PciFunction* PciHost::target(unsigned& reg) noexcept {
  if (!(address_ & 0x8000'0000u)) return nullptr;
  const unsigned bus = (address_ >> 16) & 0xff;
  const unsigned dev = (address_ >> 11) & 0x1f;
  const unsigned fn = (address_ >> 8) & 0x7;
  reg = address_ & 0xfc;
  if (bus != 0 || fn != 0) return nullptr;
  return slots_[dev];
}

void PciHost::read(std::uint64_t base, std::uint64_t offset, std::span<std::uint8_t> data) noexcept {
  std::lock_guard lk(mu_);
  std::uint32_t v = 0xffffffffu;
  if (base == kAddressPort) {
    if (offset == 0 && data.size() == 4) v = address_;
  } else {
    unsigned reg = 0;
    if (PciFunction* f = target(reg)) {
      v = f->config_read(reg + static_cast<unsigned>(offset), static_cast<unsigned>(data.size()));
    }
  }
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

void PciHost::write(std::uint64_t base, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept {
  std::lock_guard lk(mu_);
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < data.size() && i < 4; ++i) v |= std::uint32_t{data[i]} << (8 * i);
  if (base == kAddressPort) {
    if (offset == 0 && data.size() == 4) address_ = v;  // byte writes to 0xcf8 are not config cycles
    return;
  }
  unsigned reg = 0;
  if (PciFunction* f = target(reg)) {
    f->config_write(reg + static_cast<unsigned>(offset), static_cast<unsigned>(data.size()), v);
  }
}

}  // namespace xpv::kvm
