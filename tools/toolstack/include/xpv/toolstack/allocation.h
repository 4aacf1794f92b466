// Picking free identifiers (pure): domain ids, vif device ids, generated MAC addresses.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "xpv/config/device_specs.h"

namespace xpv::toolstack {

// Domain ids for guests: 1 .. DOMID_FIRST_RESERVED - 1 (xen.h: 0x7FF0).
inline constexpr std::uint16_t kFirstDomid = 1;
inline constexpr std::uint16_t kLastDomid = 0x7FF0 - 1;

// The lowest id in kFirstDomid..kLastDomid not in `used`; nullopt when all are taken.
std::optional<std::uint16_t> pick_domid(const std::set<std::uint16_t>& used);

// A plain decimal domain id 0..kLastDomid ("7"; not "07", "+7", "7x"); nullopt otherwise.
std::optional<std::uint16_t> parse_domid(std::string_view s);

// A plain decimal device id (no sign, no leading zero, < 2^31); nullopt otherwise.
std::optional<std::uint32_t> parse_devid(std::string_view s);

// The lowest vif device id (0, 1, …) not in `used`.
std::uint32_t pick_vif_devid(const std::set<std::uint32_t>& used);

// A MAC in Xen's OUI 00:16:3e with three bytes from `random_byte`, not in `used` (strings as
// Mac::str() writes them). Throws ToolstackError after 1000 clashes (`random_byte` is not random).
config::Mac generate_mac(const std::set<std::string>& used, const std::function<std::uint8_t()>& random_byte);

// A random (version 4) UUID, lower-case 8-4-4-4-12, from `random_byte`.
std::string generate_uuid(const std::function<std::uint8_t()>& random_byte);

// Bytes from the kernel's random source (getrandom); the default for the two above.
std::uint8_t system_random_byte();

}  // namespace xpv::toolstack
