// One toolstack command at a time changes the host: an exclusive flock on RUN/xpv.lock, taken
// at the start of up, down, create, destroy, shutdown and the attach/detach commands (two
// concurrent creates must not pick the same domid or name). Waits at most `timeout`.
#pragma once

#include <chrono>
#include <string>

#include "xpv/unique_fd.h"

namespace xpv::toolstack {

class RunLock {
 public:
  // Throws ToolstackError "another xpv command holds PATH" after `timeout`.
  explicit RunLock(const std::string& path, std::chrono::milliseconds timeout = std::chrono::seconds(60));

 private:
  UniqueFd fd_;  // the lock goes with the descriptor (O_CLOEXEC: children never inherit it)
};

}  // namespace xpv::toolstack
