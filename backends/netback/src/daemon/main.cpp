// xpv-netback — the netif backend daemon (one per host, serving every domain's vifs).
//   xpv-netback [--xenstore PATH] [--run-dir D] [--foreground] [--pid-file F] [--log-level L]
//               [--log-file F] [--max-queues N]
// Connects to xpv-xenstored as dom0 and runs Backend (backend.h) until SIGTERM/SIGINT. Without
// --foreground it daemonizes first and the launching process waits until the daemon is serving —
// or prints the daemon's startup error and exits 1 — as xpv-xenstored does. On SIGTERM/SIGINT the
// devices are left as they are in xenstore (a new xpv-netback reconnects to them), every queue is
// stopped, the host TAPs go, exit 0. The process side is xpv::daemon::run_backend_daemon.
#include <algorithm>
#include <memory>
#include <thread>

#include "xpv/netback/backend.h"
#include "xpv/xenbus/daemon/backend_main.h"

int main(int argc, char** argv) {
  xpv::netback::BackendOptions opts;
  opts.max_queues = std::max(1u, std::min(std::thread::hardware_concurrency(), 64u));
  xpv::daemon::BackendDaemon d;
  d.name = "xpv-netback";
  d.description = "netif backend (host TAP vif<N>.<devid>) for every domain's virtual NICs";
  d.xenstore_path = &opts.xenstore_path;
  d.run_dir = &opts.run_dir;
  d.add_options = [&](CLI::App& app) {
    app.add_option("--max-queues", opts.max_queues, "multi-queue-max-queues offered to frontends")
        ->check(CLI::Range(1u, 64u))
        ->capture_default_str();
  };
  d.start = [&](boost::asio::io_context& io) -> std::function<void()> {
    auto backend = std::make_shared<xpv::netback::Backend>(io, opts);
    return [backend] { backend->shutdown(); };
  };
  return xpv::daemon::run_backend_daemon(argc, argv, d);
}
