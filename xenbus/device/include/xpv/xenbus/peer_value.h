// How a value read from the other end's xenstore nodes — an untrusted frontend's, up to 4 KiB of
// anything — appears in a log line or in the `error` node a backend writes: quoted, with quotes,
// control characters and bytes that are not UTF-8 escaped (fmt's "{:?}"), and at most `max`
// bytes of it followed by how long it was. So a guest can neither forge log lines (a newline in
// a node) nor fill the log and its own error node with its garbage.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace xpv::xenbus {

inline constexpr std::size_t kShownBytes = 64;

// "\"abc\"" (quotes included), or "\"abcd\"... (4096 bytes)" past `max`.
std::string shown(std::string_view value, std::size_t max = kShownBytes);

}  // namespace xpv::xenbus
