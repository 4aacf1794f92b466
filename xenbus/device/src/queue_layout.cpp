#include "xpv/xenbus/queue_layout.h"

#include <charconv>

#include "xpv/xenbus/peer_value.h"

namespace xpv::xenbus {

std::string QueueLayout::dir(const std::string& frontend, unsigned q) const {
  return per_queue_dirs ? frontend + "/queue-" + std::to_string(q) : frontend;
}

Expected<QueueLayout, std::string> queue_layout(const std::optional<std::string>& num_queues, unsigned max) {
  QueueLayout l;
  if (!num_queues) return l;
  const std::string& s = *num_queues;
  unsigned n = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (s.empty() || s.size() > 10 || ec != std::errc() || p != s.data() + s.size() || n == 0 || n > max) {
    return fail(shown(s) + ": expected 1.." + std::to_string(max));
  }
  l.queues = n;
  l.per_queue_dirs = n > 1;
  return l;
}

}  // namespace xpv::xenbus
