// For tests that run a VM on this host's /dev/kvm: whether it can be opened, and why not (the
// test skips with that reason).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace xpv::test {

inline bool kvm_usable(std::string& why) {
  const int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    why = std::string("/dev/kvm: ") + std::strerror(errno);
    return false;
  }
  ::close(fd);
  return true;
}

}  // namespace xpv::test
