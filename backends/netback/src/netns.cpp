#include "xpv/netback/netns.h"

#include <fcntl.h>
#include <linux/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <system_error>
#include <thread>

#include "xpv/unique_fd.h"

namespace xpv::netback {

namespace {
[[noreturn]] void throw_errno(int err, const std::string& what) {
  throw std::system_error(err, std::generic_category(), what);
}
}  // namespace

void create_netns(const std::string& path) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
    if (ec) throw std::system_error(ec, "network namespace directory " + p.parent_path().string());
  }
  {
    UniqueFd f(::open(path.c_str(), O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444));
    if (!f) throw_errno(errno, "network namespace " + path);
  }
  std::exception_ptr err;
  std::thread t([&] {
    try {
      if (::unshare(CLONE_NEWNET) != 0) throw_errno(errno, "unshare(CLONE_NEWNET)");
      if (::mount("/proc/thread-self/ns/net", path.c_str(), "none", MS_BIND, nullptr) != 0) {
        throw_errno(errno, "bind-mount the namespace on " + path);
      }
      // Loopback up, as a fresh host has it (local services in the domain's namespace).
      UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      if (!s) throw_errno(errno, "socket");
      ifreq ifr{};
      std::strcpy(ifr.ifr_name, "lo");
      if (::ioctl(s.get(), SIOCGIFFLAGS, &ifr) != 0) throw_errno(errno, "lo: get flags");
      ifr.ifr_flags |= IFF_UP;
      if (::ioctl(s.get(), SIOCSIFFLAGS, &ifr) != 0) throw_errno(errno, "lo: set flags");
    } catch (...) {
      err = std::current_exception();
    }
  });
  t.join();
  if (err) {
    remove_netns(path);
    std::rethrow_exception(err);
  }
}

bool netns_exists(const std::string& path) noexcept {
  UniqueFd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!f) return false;
  // An nsfs file answers NS_GET_NSTYPE; a plain file does not. Cheaper: setns would change the
  // caller's thread. NS_GET_NSTYPE = _IO(0xb7, 0x3).
  const int type = ::ioctl(f.get(), _IO(0xb7, 0x3));
  return type == CLONE_NEWNET;
}

bool remove_netns(const std::string& path) noexcept {
  if (::umount2(path.c_str(), MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT) return false;
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return false;
  return true;
}

}  // namespace xpv::netback
