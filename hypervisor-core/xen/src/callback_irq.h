// Private helper of the platform: what an HVM_PARAM_CALLBACK_IRQ value asks for (XEN-GUEST-ABI.md
// "Upcalls"), in one place for the upcall path and the hvm_op that sets it.
#pragma once

#include <cstdint>

#include "xpv/xen/abi.h"

namespace xpv::xen::detail {

inline constexpr std::uint8_t kMinVector = 0x10;  // vectors 0..15 are reserved on x86
// How often a CALLBACK_IRQ write retries when other vCPUs keep writing between its ask and its
// store (then -EAGAIN: only a guest racing itself on many vCPUs gets it).
inline constexpr int kCallbackIrqAttempts = 16;

enum class CallbackKind { none, vector, intx };

constexpr CallbackKind callback_kind(std::uint64_t v) noexcept {
  const std::uint64_t type = v >> abi::kCallbackTypeShift;
  if (type == abi::kCallbackTypeVector) return CallbackKind::vector;
  if (type == abi::kCallbackTypePciIntx) return CallbackKind::intx;
  // GSI: GSI 0 means "no callback" (Xen). Any other GSI is treated as the platform-pci INTx
  // (the only device that raises event-channel upcalls as an interrupt line here).
  if (type == abi::kCallbackTypeGsi && v != 0) return CallbackKind::intx;
  return CallbackKind::none;
}

// The global callback vector `v` asks for, or 0 (another kind, or a vector below 0x10, which is
// stored but never injected).
constexpr std::uint8_t global_callback_vector(std::uint64_t v) noexcept {
  const auto vec = static_cast<std::uint8_t>(v & 0xff);
  return callback_kind(v) == CallbackKind::vector && vec >= kMinVector ? vec : 0;
}

}  // namespace xpv::xen::detail
