#include "xpv/xenbus/perms.h"

#include <fmt/format.h>

namespace xpv::xenbus {

Expected<Perm, wire::Error> parse_perm(std::string_view s) noexcept {
  if (s.size() < 2) return fail(wire::Error::einval);
  Perm p;
  switch (s.front()) {
    case 'n': p.bits = kPermNone; break;
    case 'r': p.bits = kPermRead; break;
    case 'w': p.bits = kPermWrite; break;
    case 'b': p.bits = kPermRead | kPermWrite; break;
    default: return fail(wire::Error::einval);
  }
  auto id = parse_uint(s.substr(1));
  if (!id || *id >= kDomIdFirstReserved) return fail(wire::Error::einval);
  p.id = static_cast<DomId>(*id);
  return p;
}

std::string format_perm(const Perm& p) {
  static constexpr char kLetters[] = {'n', 'r', 'w', 'b'};
  return fmt::format("{}{}", kLetters[p.bits & 3], p.id);
}

std::uint8_t access_for(const Requester& who, const PermList& perms) noexcept {
  constexpr std::uint8_t kAll = kPermRead | kPermWrite;
  if (who.privileged || perms.empty()) return kAll;
  auto is_me = [&](DomId id) { return id == who.domid || (who.target && id == *who.target); };
  if (is_me(perms[0].id)) return kAll;
  for (std::size_t i = 1; i < perms.size(); ++i)
    if (is_me(perms[i].id)) return perms[i].bits;
  return perms[0].bits;
}

}  // namespace xpv::xenbus
