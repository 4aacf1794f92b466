// `xpv console NAME [--type serial|pv]`: attaches the terminal to an HVM domain's serial console
// (xpv-vmm's RUN/dom<N>/console.sock) or its Xen PV console, hvc0 (RUN/dom<N>/console-pv.sock) —
// each replays its last 64 KiB on attach — until the domain goes away or the user types Ctrl-]
// (as `xl console [-t serial|pv]`).
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/core.h>

#include "xpv/toolstack/xenstore.h"
#include "xpv/toolstack/commands.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/inventory.h"
#include "xpv/unique_fd.h"

namespace xpv::toolstack {

namespace {

constexpr char kEscape = 0x1d;  // Ctrl-]

// Raw mode on a terminal for the life of the object (nothing when stdin is not a terminal).
class RawTerminal {
 public:
  RawTerminal() {
    if (::isatty(STDIN_FILENO) && ::tcgetattr(STDIN_FILENO, &saved_) == 0) {
      termios raw = saved_;
      ::cfmakeraw(&raw);
      active_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
  }
  ~RawTerminal() {
    if (active_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;

 private:
  termios saved_{};
  bool active_ = false;
};

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace

void cmd_console(Context& ctx, const std::string& which, const std::string& type) {
  if (type != "serial" && type != "pv") {
    throw ToolstackError(fmt::format("console type '{}': must be serial or pv", type));
  }
  auto xs = Xenstore::try_connect(ctx.paths.xenstore_socket);
  const auto doms = gather_domains(ctx.paths, xs.get());
  const DomainSummary d = resolve_domain(doms, which);
  if (d.type != "hvm") {
    throw ToolstackError(fmt::format("{} is a {} domain: only HVM domains have a console (a process domain's "
                                     "log is {})",
                                     domain_label(d), d.type, ctx.paths.log_dir));
  }
  const std::string path = type == "pv" ? ctx.paths.pv_console_socket(d.domid) : ctx.paths.console_socket(d.domid);
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (!sock.valid() || path.size() >= sizeof sa.sun_path) {
    throw ToolstackError(fmt::format("console of {}: bad socket path {}", domain_label(d), path));
  }
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    throw ToolstackError(fmt::format("cannot attach to the {} console of {} ({}): {}", type, domain_label(d), path,
                                     std::strerror(errno)));
  }
  ctx.err << fmt::format("Connected to the console of {} (Ctrl-] detaches)\r\n", domain_label(d));
  ctx.err.flush();
  RawTerminal raw;
  pollfd fds[2] = {{sock.get(), POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
  bool input_open = true;
  char buf[4096];
  for (;;) {
    if (::poll(fds, input_open ? 2 : 1, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) {
      const ssize_t n = ::read(sock.get(), buf, sizeof buf);
      if (n <= 0) break;  // the domain is gone
      if (!write_all(STDOUT_FILENO, buf, static_cast<std::size_t>(n))) break;
    }
    if (input_open && fds[1].revents != 0) {
      const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
      if (n <= 0) {
        input_open = false;  // keep showing output until the domain goes away
        continue;
      }
      const char* esc = static_cast<const char*>(std::memchr(buf, kEscape, static_cast<std::size_t>(n)));
      const std::size_t len = esc ? static_cast<std::size_t>(esc - buf) : static_cast<std::size_t>(n);
      if (!write_all(sock.get(), buf, len) || esc) break;
    }
  }
}

}  // namespace xpv::toolstack
