#include "xpv/kvm/console.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace xpv::kvm {
namespace {
constexpr std::size_t kBacklog = 64 * 1024;
constexpr int kClientBuffer = 4 << 20;  // a client's socket: how far behind it may fall

void write_all(int fd, const std::uint8_t* p, std::size_t n) noexcept {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

// To the attached client, never blocking and never raising SIGPIPE: false when it is gone or
// does not keep up (its socket buffer full), and is to be let go — the vCPU or event thread that
// writes must not wait for a client (the backlog keeps the tail for the next one).
bool send_all(int fd, const std::uint8_t* p, std::size_t n) noexcept {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}
}  // namespace

Console::Console(const std::string& spec) {
  if (spec == "stdio") return;
  if (spec.rfind("socket:", 0) != 0 || spec.size() <= 7) {
    throw std::runtime_error(fmt::format("--console {}: expected stdio or socket:PATH", spec));
  }
  socket_mode_ = true;
  path_ = spec.substr(7);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path_.size() >= sizeof(sa.sun_path)) throw std::runtime_error(fmt::format("--console: socket path {} is too long", path_));
  std::memcpy(sa.sun_path, path_.c_str(), path_.size() + 1);
  listen_fd_ = UniqueFd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listen_fd_.valid()) throw std::runtime_error(fmt::format("console socket: {}", std::strerror(errno)));
  ::unlink(path_.c_str());
  if (bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0 || listen(listen_fd_.get(), 1) < 0) {
    throw std::runtime_error(fmt::format("console socket {}: {}", path_, std::strerror(errno)));
  }
}

Console::~Console() {
  stop();
  if (socket_mode_) ::unlink(path_.c_str());
}

void Console::set_log(const std::string& path, std::uint64_t max_bytes) {
  log_ = UniqueFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640));
  if (!log_.valid()) throw std::runtime_error(fmt::format("--console-log {}: {}", path, std::strerror(errno)));
  struct stat st {};
  log_bytes_ = ::fstat(log_.get(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
  log_path_ = path;
  log_max_ = std::max<std::uint64_t>(max_bytes, 1);
}

void Console::write(std::span<const std::uint8_t> bytes) noexcept {
  {
    std::lock_guard lk(log_mu_);
    if (log_.valid() && log_bytes_ >= log_max_) {
      // Full: the file becomes PATH.1 and a new one starts (what cannot be moved or reopened
      // is not logged any more, rather than grown without end).
      const std::string old = log_path_ + ".1";
      UniqueFd fresh;
      if (::rename(log_path_.c_str(), old.c_str()) == 0) {
        fresh = UniqueFd(::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0640));
      }
      log_ = std::move(fresh);
      log_bytes_ = 0;
    }
    if (log_.valid()) {
      write_all(log_.get(), bytes.data(), bytes.size());
      log_bytes_ += bytes.size();
    }
  }
  if (!socket_mode_) {
    write_all(STDOUT_FILENO, bytes.data(), bytes.size());
    return;
  }
  std::lock_guard lk(mu_);
  backlog_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (backlog_.size() > kBacklog) backlog_.erase(0, backlog_.size() - kBacklog);
  // Let go of a client that is gone or does not keep up: shut down, not closed — the input thread
  // may be reading its descriptor; it sees the end and closes it (a number closed here could be
  // reused by any other open of this process under that thread's read).
  if (client_.valid() && !send_all(client_.get(), bytes.data(), bytes.size())) ::shutdown(client_.get(), SHUT_RDWR);
}

void Console::start_input(Input sink) {
  sink_ = std::move(sink);
  input_ = std::thread([this] { input_loop(); });
}

void Console::stop() noexcept {
  stopping_.store(true);
  if (input_.joinable()) input_.join();
}

void Console::input_loop() noexcept {
  bool stdin_open = !socket_mode_;
  std::string pending;
  while (!stopping_.load()) {
    pollfd pfd{-1, POLLIN, 0};
    {
      std::lock_guard lk(mu_);
      if (socket_mode_) pfd.fd = client_.valid() ? client_.get() : listen_fd_.get();
      else if (stdin_open) pfd.fd = STDIN_FILENO;
    }
    if (!pending.empty()) {
      const std::size_t n = sink_(std::span(reinterpret_cast<const std::uint8_t*>(pending.data()), pending.size()));
      pending.erase(0, n);
      if (!pending.empty()) {
        // FIFO full (a guest that does not read its console never drains it): read no more, but
        // keep watching the client, whose hang-up lets it go.
        if (socket_mode_ && pfd.fd >= 0 && pfd.fd != listen_fd_.get()) {
          pollfd hup{pfd.fd, 0, 0};
          if (poll(&hup, 1, 5) > 0 && (hup.revents & (POLLHUP | POLLERR | POLLNVAL))) {
            std::lock_guard lk(mu_);
            if (client_.valid() && client_.get() == hup.fd) client_.reset();
            pending.clear();
          }
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        continue;
      }
    }
    if (pfd.fd < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (poll(&pfd, 1, 100) <= 0) continue;
    if (socket_mode_ && pfd.fd == listen_fd_.get()) {
      UniqueFd c(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!c.valid()) continue;
      // Room for a burst (a dmesg) while the client writes to a slow terminal: only one that
      // falls this far behind is let go. FORCE: past wmem_max (208 KiB by default); we are root.
      const int room = kClientBuffer;
      if (setsockopt(c.get(), SOL_SOCKET, SO_SNDBUFFORCE, &room, sizeof room) != 0) {
        (void)setsockopt(c.get(), SOL_SOCKET, SO_SNDBUF, &room, sizeof room);
      }
      std::lock_guard lk(mu_);
      // One that cannot take even the backlog (its buffer is smaller, or it reads nothing): not
      // attached.
      if (send_all(c.get(), reinterpret_cast<const std::uint8_t*>(backlog_.data()), backlog_.size())) {
        client_ = std::move(c);
      }
      continue;
    }
    char buf[256];
    const ssize_t n = ::read(pfd.fd, buf, sizeof buf);
    if (n <= 0) {
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (socket_mode_) {
        std::lock_guard lk(mu_);
        client_.reset();  // detach; the next client may attach
      } else {
        stdin_open = false;  // EOF on stdin: no more input
      }
      continue;
    }
    pending.append(buf, static_cast<std::size_t>(n));
  }
}

}  // namespace xpv::kvm
