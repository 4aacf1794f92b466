// xenstore path rules (docs/misc/xenstore.txt): absolute paths start with '/', relative paths
// resolve under /local/domain/<domid>/, special watch paths start with '@'. Allowed characters
// are [A-Za-z0-9-/_@]; no "//", no trailing '/' except the root. Length limits: an absolute path
// at most XENSTORE_ABS_PATH_MAX (3072); the part below a domain's home (or the whole path
// elsewhere) at most the path-length quota (default XENSTORE_REL_PATH_MAX, 2048) for unprivileged
// domains. Pure functions, noexcept apart from allocation.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "xpv/expected.h"
#include "xpv/xenbus/wire.h"

namespace xpv::xenbus {

using DomId = std::uint16_t;
inline constexpr DomId kDomIdFirstReserved = 0x7FF0;  // DOMID_FIRST_RESERVED (xen.h)

std::string domain_path(DomId domid);  // "/local/domain/<domid>"

bool valid_path_chars(std::string_view p) noexcept;

// Resolves `path` for a connection of `domid` and validates it. `allow_special` admits "@name"
// (watches only). `path_max` is the length quota for the part below the domain's home; 0 = no
// quota (privileged). EINVAL on any violation.
Expected<std::string, wire::Error> canonicalize(DomId domid, std::string_view path,
                                                bool allow_special, std::size_t path_max) noexcept;

// "/a/b" → "/a"; "/a" → "/"; "/" → "/".
std::string_view parent_path(std::string_view abs) noexcept;
// "/a/b" → "b"; "/" → "".
std::string_view base_name(std::string_view abs) noexcept;
// "/a" + "b" → "/a/b"; "/" + "b" → "/b".
std::string child_path(std::string_view parent, std::string_view name);
// True if `p` is `ancestor` or lies below it ("/" is everybody's ancestor).
bool is_same_or_below(std::string_view p, std::string_view ancestor) noexcept;
// Parses a decimal domid as Xen's tools write it; rejects signs, junk, overflow, empty.
Expected<std::uint32_t, wire::Error> parse_uint(std::string_view s) noexcept;

}  // namespace xpv::xenbus
