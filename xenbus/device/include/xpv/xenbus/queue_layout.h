// Where a multi-queue frontend (blkif, netif) published its per-queue nodes — the rule Linux's
// backends apply, shared by xpv-blkback and xpv-netback:
//
//   multi-queue-num-queues absent or 1  → one queue, its nodes in the frontend directory itself
//                                          (Linux's netfront writes the key = 1 with flat nodes)
//   multi-queue-num-queues = N, 2..max  → N queues, nodes under <frontend>/queue-<i>/
//   anything else (0, > max, not a decimal number)  → refused
//
// Pure: the caller reads the node (a guest may have written anything there) and reports the error.
#pragma once

#include <optional>
#include <string>

#include "xpv/expected.h"

namespace xpv::xenbus {

struct QueueLayout {
  unsigned queues = 1;
  bool per_queue_dirs = false;
  // The directory holding queue `q`'s nodes.
  std::string dir(const std::string& frontend, unsigned q) const;
};

// `num_queues`: the frontend's multi-queue-num-queues node (nullopt: absent); `max`: what the
// backend offered in multi-queue-max-queues. Error: "'<value>': expected 1..<max>".
Expected<QueueLayout, std::string> queue_layout(const std::optional<std::string>& num_queues, unsigned max);

}  // namespace xpv::xenbus
