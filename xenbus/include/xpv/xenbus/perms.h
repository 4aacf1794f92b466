// xenstore node permissions. A node's list is never empty: entry 0 names the owner and the
// default access of every domain not listed; further entries grant one domain its own access.
// On the wire each entry is a letter and a domid: n (none) r (read) w (write) b (both).
// Access (Xen's perm_for_conn): a privileged connection (dom0, socket clients), the owner, or a
// domain whose SET_TARGET target is the owner gets everything; otherwise the first entry naming
// the domain (or its target) decides; otherwise the default.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "xpv/expected.h"
#include "xpv/xenbus/path.h"
#include "xpv/xenbus/wire.h"

namespace xpv::xenbus {

inline constexpr std::uint8_t kPermNone = 0;
inline constexpr std::uint8_t kPermRead = 1;   // XS_PERM_READ
inline constexpr std::uint8_t kPermWrite = 2;  // XS_PERM_WRITE

struct Perm {
  DomId id = 0;
  std::uint8_t bits = kPermNone;
  bool operator==(const Perm&) const = default;
};
using PermList = std::vector<Perm>;

Expected<Perm, wire::Error> parse_perm(std::string_view s) noexcept;
std::string format_perm(const Perm& p);  // "r3"

// Who is asking: its domid, whether it is privileged, and its SET_TARGET target if any.
struct Requester {
  DomId domid = 0;
  bool privileged = true;
  std::optional<DomId> target;
};

std::uint8_t access_for(const Requester& who, const PermList& perms) noexcept;

}  // namespace xpv::xenbus
