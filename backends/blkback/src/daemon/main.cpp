// xpv-blkback — the blkif backend daemon (one per host, serving every domain's vbds).
//   xpv-blkback [--xenstore PATH] [--run-dir D] [--foreground] [--pid-file F] [--log-level L]
//               [--log-file F] [--max-queues N] [--max-ring-page-order N] [--poll-max-us N]
// Connects to xpv-xenstored as dom0 and runs Backend (backend.h) until SIGTERM/SIGINT. Without
// --foreground it daemonizes first and the launching process waits until the daemon is serving —
// or prints the daemon's startup error and exits 1 — as xpv-xenstored does. On SIGTERM/SIGINT the
// devices are left as they are in xenstore (a new xpv-blkback reconnects to them), every queue is
// stopped after its in-flight I/O, exit 0. The process side is xpv::daemon::run_backend_daemon.
// The same stop, with exit 3, when it lost xpv-xenstored and finds it answering again: its next
// start (the supervisor's) resumes the devices over a new connection (backends/README.md).
#include "xpv/blkback/backend.h"
#include "xpv/xenbus/daemon/backend_main.h"

int main(int argc, char** argv) {
  xpv::blkback::BackendOptions opts;
  return xpv::daemon::run_backend<xpv::blkback::Backend>(
      argc, argv, "xpv-blkback", "blkif backend (io_uring) for every domain's virtual block devices", opts,
      [&](CLI::App& app) {
        app.add_option("--max-ring-page-order", opts.max_ring_page_order, "max-ring-page-order offered")
            ->check(CLI::Range(0u, 4u))
            ->capture_default_str();
        app.add_option("--poll-max-us", opts.poll_max_us,
                       "longest adaptive busy-wait of a queue thread for the next request or completion "
                       "before it sleeps; while it spins the frontend sends no notifications (0: never spin)")
            ->check(CLI::Range(0u, 1000u))
            ->capture_default_str();
      });
}
