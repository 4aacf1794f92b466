// Live update of xpv-xenstored (see live_update.h). io_context thread only.
#include "xpv/xenbus/daemon/live_update.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace xpv::xenbus::daemon {

namespace {

constexpr int kVersion = kLiveUpdateStateVersion;

// Runs `binary --live-update-check` (stdin and stderr on /dev/null) and returns what it printed
// if it exited 0 within 5 s; an error text otherwise. Blocks the io thread meanwhile.
Expected<std::string, std::string> probe(const std::string& binary) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return fail(fmt::format("pipe: {}", std::strerror(errno)));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  std::string arg0 = binary, arg1 = "--live-update-check";
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  char* envp[] = {nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, binary.c_str(), &fa, nullptr, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    return fail(fmt::format("cannot run it: {}", std::strerror(rc)));
  }
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool eof = false;
  while (!eof && got.size() < 256) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{out[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) eof = true;
    else got.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  if (!eof) ::kill(pid, SIGKILL);
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!eof) return fail(std::string("it did not finish --live-update-check within 5 s"));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return fail(std::string("--live-update-check failed"));
  }
  while (!got.empty() && (got.back() == '\n' || got.back() == '\r')) got.pop_back();
  return got;
}

std::string text(std::string s) {  // a CONTROL answer: the text and its NUL
  s.push_back('\0');
  return s;
}

void set_cloexec(const std::vector<int>& fds, bool on) {
  for (int fd : fds) {
    int flags = ::fcntl(fd, F_GETFD);
    if (flags >= 0) ::fcntl(fd, F_SETFD, on ? (flags | FD_CLOEXEC) : (flags & ~FD_CLOEXEC));
  }
}

}  // namespace

std::string live_update_banner() { return fmt::format("xpv-xenstored live-update state {}", kVersion); }

LiveUpdate::LiveUpdate(boost::asio::io_context& io, Store& store, std::string state_file, std::string argv0,
                       std::vector<std::string> args, bool syslog)
    : io_(io),
      store_(store),
      state_file_(std::move(state_file)),
      argv0_(std::move(argv0)),
      args_(std::move(args)),
      syslog_(syslog) {}

void LiveUpdate::attach(SocketServer& server, Domains& domains) noexcept {
  server_ = &server;
  domains_ = &domains;
}

std::optional<Expected<std::string, wire::Error>> LiveUpdate::command(ConnId conn, const wire::Header& h,
                                                                      const std::vector<std::string>& a) {
  if (a.empty()) return fail(wire::Error::einval);
  if (a[0] == "-f" && a.size() == 2) {
    struct stat st {};
    if (::stat(a[1].c_str(), &st) != 0 || !S_ISREG(st.st_mode) || ::access(a[1].c_str(), X_OK) != 0) {
      return text(fmt::format("live-update: {} is not an executable file", a[1]));
    }
    auto answer = probe(a[1]);
    if (!answer) return text(fmt::format("live-update: {}: {}", a[1], answer.error()));
    if (*answer != live_update_banner()) {
      return text(fmt::format("live-update: {} is not an xpv-xenstored that reads this state "
                              "(--live-update-check printed '{}', expected '{}')",
                              a[1], *answer, live_update_banner()));
    }
    binary_ = a[1];
    busy_since_.reset();
    return text("OK");
  }
  if (a[0] == "-c" && a.size() == 2) {
    std::vector<std::string> words;
    std::istringstream in(a[1]);
    for (std::string w; in >> w;) words.push_back(w);
    cmdline_ = std::move(words);
    return text("OK");
  }
  if (a[0] == "-a" && a.size() == 1) {
    binary_.clear();
    cmdline_.reset();
    busy_since_.reset();
    return text("OK");
  }
  if (a[0] != "-s") return fail(wire::Error::einval);
  unsigned timeout = 60;
  bool force = false;
  for (std::size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "-F") {
      force = true;
    } else if (a[i] == "-t" && i + 1 < a.size() && !a[i + 1].empty() && a[i + 1].size() <= 6 &&
               a[i + 1].find_first_not_of("0123456789") == std::string::npos) {
      timeout = static_cast<unsigned>(std::stoul(a[++i]));
    } else {
      return fail(wire::Error::einval);
    }
  }
  if (binary_.empty()) return text("live-update: no binary given (live-update -f BINARY first)");
  if (!server_ || !domains_) return text("live-update: the daemon is not serving yet");
  if (in_progress_) return text("BUSY");
  if (!force && store_.open_transactions() > 0) {
    const auto now = std::chrono::steady_clock::now();
    if (!busy_since_) busy_since_ = now;
    if (now - *busy_since_ < std::chrono::seconds(timeout)) return text("BUSY");
    busy_since_.reset();
    return text(fmt::format("live-update: {} transaction(s) still open after {} s; -F ends them",
                            store_.open_transactions(), timeout));
  }
  busy_since_.reset();
  in_progress_ = true;
  // Not from inside the Store's request: the exec happens once this handler has returned.
  boost::asio::post(io_, [this, conn, h, force] { exec(conn, h, force); });
  return std::nullopt;
}

void LiveUpdate::exec(ConnId conn, wire::Header h, bool force) {
  in_progress_ = false;
  if (force && store_.open_transactions() > 0) {
    spdlog::warn("xenstored: live update: ending {} open transaction(s) (-F)", store_.open_transactions());
    store_.abort_transactions();
  }
  std::string why;
  std::vector<int> fds;
  try {
    nlohmann::json state = {{"version", kVersion},
                            {"store", store_.save()},
                            {"sockets", server_->save()},
                            {"rings", domains_->save()},
                            {"reply", {{"conn", conn}, {"type", h.type}, {"req_id", h.req_id}, {"tx_id", h.tx_id}}},
                            {"syslog", syslog_}};
    const std::string tmp = state_file_ + ".tmp";
    {
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0) throw std::runtime_error(fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
      const std::string bytes = state.dump();
      std::size_t off = 0;
      while (off < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          const int e = errno;
          ::close(fd);
          ::unlink(tmp.c_str());
          throw std::runtime_error(fmt::format("cannot write {}: {}", tmp, std::strerror(e)));
        }
        off += static_cast<std::size_t>(n);
      }
      ::close(fd);
    }
    if (::rename(tmp.c_str(), state_file_.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      throw std::runtime_error(fmt::format("cannot rename {} to {}: {}", tmp, state_file_, std::strerror(e)));
    }
    fds = server_->fds();
    std::vector<std::string> args = cmdline_ ? *cmdline_ : args_;
    args.insert(args.begin(), argv0_);
    args.push_back("--live-update-state");
    args.push_back(state_file_);
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    spdlog::info("xenstored: live update: {} nodes, {} connections, {} ring(s); exec {}", store_.node_count(),
                 store_.connection_count(), domains_->attached(), binary_);
    spdlog::default_logger()->flush();
    // SIGTERM/SIGINT held across the exec (the mask is inherited): the next binary takes them
    // once its handler is in place, instead of dying the default way with the state unread.
    sigset_t term, old_mask;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigaddset(&term, SIGINT);
    ::pthread_sigmask(SIG_BLOCK, &term, &old_mask);
    set_cloexec(fds, false);
    ::execv(binary_.c_str(), argv.data());
    why = fmt::format("cannot execute {}: {}", binary_, std::strerror(errno));
    set_cloexec(fds, true);
    ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    ::unlink(state_file_.c_str());
  } catch (const std::exception& e) {
    why = e.what();
  }
  spdlog::error("xenstored: live update failed: {}; serving on", why);
  store_.answer(conn, h, text("live-update: " + why));
}

nlohmann::json read_live_update_state(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error(fmt::format("cannot read the live-update state {}", file));
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("live-update state {}: {}", file, e.what()));
  }
  ::unlink(file.c_str());
  if (!state.is_object() || state.value("version", 0) != kVersion) {
    throw std::runtime_error(fmt::format("live-update state {}: not version {}", file, kVersion));
  }
  return state;
}

bool live_update_syslog(const nlohmann::json& state) { return state.value("syslog", false); }

void finish_live_update(boost::asio::io_context& io, Store& store, const nlohmann::json& state) {
  const auto& r = state.at("reply");
  wire::Header h{r.at("type").get<std::uint32_t>(), r.at("req_id").get<std::uint32_t>(),
                 r.at("tx_id").get<std::uint32_t>(), 0};
  const auto conn = r.at("conn").get<ConnId>();
  // After the transports' own posted work (the sockets' first drain, the rings' resume).
  boost::asio::post(io, [&io, &store, h, conn] {
    boost::asio::post(io, [&store, h, conn] {
      // Logged before the answer: whoever asked may read the log as soon as it has the answer.
      spdlog::info("xenstored: live update done: {} nodes, {} connections", store.node_count(),
                   store.connection_count());
      store.answer(conn, h, text("OK"));
    });
  });
}

}  // namespace xpv::xenbus::daemon
