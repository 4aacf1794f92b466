#include "xpv/toolstack/run_lock.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/file.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "xpv/toolstack/error.h"
#include "xpv/toolstack/process.h"

namespace xpv::toolstack {

RunLock::RunLock(const std::string& path, std::chrono::milliseconds timeout)
    : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
  if (!fd_) throw ToolstackError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (::flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      throw ToolstackError(fmt::format("cannot lock {}: {}", path, std::strerror(errno)));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw ToolstackError(fmt::format("another xpv command holds {}", path));
    }
    throw_if_interrupted();  // Ctrl-C while waiting (process.h, InterruptGuard): nothing made yet
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace xpv::toolstack
