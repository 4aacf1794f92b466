// Private parts of Store shared by tree.cpp, watch.cpp, domain.cpp and store.cpp.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xpv/xenbus/store.h"

namespace xpv::xenbus {

struct Store::Txn {
  // Copy-on-write view: nullopt = removed in this transaction.
  std::unordered_map<std::string, std::optional<Node>> overlay;
  // Main-tree generation at first touch; nullopt = the node was absent then.
  std::unordered_map<std::string, std::optional<std::uint64_t>> touched;
  // The main tree's node as the transaction first saw it (nullopt = absent): later reads in the
  // transaction see it, not a change made meanwhile outside it — as Xen's xenstored copies a node
  // into the transaction at its first access, read or write. Never committed.
  std::unordered_map<std::string, std::optional<Node>> seen;
  std::vector<PendingEvent> events;  // fired at the commit, in order; one per path
  std::unordered_map<std::string, std::size_t> event_index;  // path → its place in events
  std::map<DomId, std::int64_t> owned_delta;
};

struct Store::Watch {
  std::string abs;    // canonical path (or @special)
  std::string given;  // as registered (relative watches report relative paths)
  std::string token;
  bool relative = false;
};

struct Store::Conn {
  DomId domid = 0;
  bool privileged = true;
  std::optional<DomId> target;
  Sink* sink = nullptr;
  std::uint32_t next_tx = 1;
  std::map<std::uint32_t, Txn> txns;
  std::set<std::uint32_t> aborted_txns;  // ended by a forced live update: answer EAGAIN
  std::uint32_t recovered_below = 0;     // crash restart: an unknown id below this answers EAGAIN
  std::vector<Watch> watches;
};

}  // namespace xpv::xenbus
