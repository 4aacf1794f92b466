#include "xpv/domain/seqpacket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

namespace xpv::domain {
namespace {

std::error_code last_error() { return {errno, std::generic_category()}; }

sockaddr_un make_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    throw std::system_error(ENAMETOOLONG, std::generic_category(),
                            "unix socket path '" + path + "' is empty or too long");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

Expected<Datagram, std::error_code> recv_datagram(int sock, std::size_t max_bytes,
                                                  std::size_t max_fds) noexcept {
  Datagram d;
  d.bytes.resize(max_bytes);
  // Room for max_fds + 1 so that "too many" is detected rather than silently truncated.
  std::vector<char> control(CMSG_SPACE(sizeof(int) * (max_fds + 1)));
  iovec iov{d.bytes.data(), d.bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return fail(last_error());
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      d.fds.emplace_back(fd);  // owned from here on, closed on every error path below
    }
  }
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || d.fds.size() > max_fds) {
    return fail(std::error_code(EMSGSIZE, std::generic_category()));
  }
  d.bytes.resize(static_cast<std::size_t>(n));
  return d;
}

Expected<void, std::error_code> send_datagram(int sock, std::span<const std::uint8_t> bytes,
                                              std::span<const int> fds) noexcept {
  iovec iov{const_cast<std::uint8_t*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return fail(last_error());
  if (static_cast<std::size_t>(n) != bytes.size()) {
    return fail(std::error_code(EMSGSIZE, std::generic_category()));
  }
  return {};
}

UniqueFd listen_seqpacket(const std::string& path, int backlog) {
  sockaddr_un addr = make_address(path);
  UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s) throw std::system_error(last_error(), "socket");
  // Root-only from the first instant: the umask covers the window between bind and chmod.
  const mode_t old = ::umask(0177);
  const int rc = ::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  const int bind_errno = errno;
  ::umask(old);
  if (rc != 0) throw std::system_error(bind_errno, std::generic_category(), "bind " + path);
  if (::listen(s.get(), backlog) != 0) throw std::system_error(last_error(), "listen " + path);
  return s;
}

UniqueFd connect_seqpacket(const std::string& path) {
  sockaddr_un addr = make_address(path);
  UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!s) throw std::system_error(last_error(), "socket");
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw std::system_error(last_error(), "connect " + path);
  }
  return s;
}

Expected<bool, std::error_code> wait_readable(int sock, int timeout_ms) noexcept {
  pollfd p{sock, POLLIN, 0};
  int n;
  do {
    n = ::poll(&p, 1, timeout_ms);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return fail(last_error());
  return n > 0;
}

Expected<unsigned, std::error_code> peer_uid(int sock) noexcept {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return fail(last_error());
  return static_cast<unsigned>(cred.uid);
}

}  // namespace xpv::domain
