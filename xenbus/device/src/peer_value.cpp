#include "xpv/xenbus/peer_value.h"

#include <fmt/format.h>

namespace xpv::xenbus {

std::string shown(std::string_view value, std::size_t max) {
  if (value.size() <= max) return fmt::format("{:?}", value);
  return fmt::format("{:?}... ({} bytes)", value.substr(0, max), value.size());
}

}  // namespace xpv::xenbus
