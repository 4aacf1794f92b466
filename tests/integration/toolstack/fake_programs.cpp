// Stand-ins for programs built on other branches, chosen by the name it is run under (argv[0]):
//
//   xpv-front --domid N --name NAME --memory MiB --run-dir D
//       a process domain without frontends: xpv::domain::Domain (memory, grants, event channels,
//       control socket RUN/dom<N>.sock), then "ready" on stdout; runs until SIGTERM/SIGINT.
//       FAKE_FRONT_MODE=exit: print an error and exit 3 before ready.
//       FAKE_FRONT_MODE=no-socket: print ready without any control socket.
//   xpv-blkback / xpv-netback [--pid-file F] ...: idle until SIGTERM/SIGINT; writes and removes F.
#include <signal.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "xpv/domain/domain.h"

namespace {

struct NoUpcalls : xpv::domain::UpcallSink {
  void upcall(unsigned) noexcept override {}
};

std::string arg(int argc, char** argv, const char* name, const char* fallback = "") {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return fallback;
}

void wait_for_term() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  int sig = 0;
  ::sigwait(&set, &sig);
}

int fake_front(int argc, char** argv) {
  const char* mode = std::getenv("FAKE_FRONT_MODE");
  if (mode != nullptr && std::strcmp(mode, "exit") == 0) {
    std::fprintf(stderr, "fake xpv-front: told to fail\n");
    return 3;
  }
  if (mode != nullptr && std::strcmp(mode, "no-socket") == 0) {
    std::printf("ready\n");
    std::fflush(stdout);
    wait_for_term();
    return 0;
  }
  xpv::domain::DomainConfig cfg;
  cfg.domid = static_cast<std::uint16_t>(std::stoul(arg(argc, argv, "--domid", "0")));
  cfg.name = arg(argc, argv, "--name", "fake");
  cfg.memory_bytes = std::stoull(arg(argc, argv, "--memory", "16")) << 20;
  cfg.run_dir = arg(argc, argv, "--run-dir", "/run/xpv");
  boost::asio::io_context io(1);
  NoUpcalls sink;
  xpv::domain::Domain dom(io, cfg, sink);
  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&](auto, int) { io.stop(); });
  std::printf("fake xpv-front: dom%u listening on %s\nready\n", cfg.domid, dom.socket_path().c_str());
  std::fflush(stdout);
  io.run();
  return 0;
}

int fake_daemon(int argc, char** argv) {
  const std::string pid_file = arg(argc, argv, "--pid-file");
  if (!pid_file.empty()) std::ofstream(pid_file) << ::getpid() << "\n";
  std::printf("fake daemon %s: running\n", argv[0]);
  std::fflush(stdout);
  wait_for_term();
  if (!pid_file.empty()) ::unlink(pid_file.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string self = argv[0];
  self = self.substr(self.rfind('/') + 1);
  try {
    if (self == "xpv-front") return fake_front(argc, argv);
    if (self == "xpv-blkback" || self == "xpv-netback") return fake_daemon(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", self.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "toolstack_fake: run me as xpv-front, xpv-blkback or xpv-netback\n");
  return 2;
}
