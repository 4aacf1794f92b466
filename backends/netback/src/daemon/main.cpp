// xpv-netback — the netif backend daemon (one per host, serving every domain's vifs).
//   xpv-netback [--xenstore PATH] [--run-dir D] [--foreground] [--pid-file F] [--log-level L]
//               [--log-file F] [--max-queues N]
// Connects to xpv-xenstored as dom0 and runs Backend (backend.h) until SIGTERM/SIGINT. Without
// --foreground it daemonizes first and the launching process waits until the daemon is serving —
// or prints the daemon's startup error and exits 1 — as xpv-xenstored does. On SIGTERM/SIGINT the
// devices are left as they are in xenstore (a new xpv-netback reconnects to them), every queue is
// stopped, the host TAPs go, exit 0. The process side is xpv::daemon::run_backend_daemon.
// The same stop, with exit 3, when it lost xpv-xenstored and finds it answering again: its next
// start (the supervisor's) resumes the devices over a new connection (backends/README.md).
#include "xpv/netback/backend.h"
#include "xpv/xenbus/daemon/backend_main.h"

int main(int argc, char** argv) {
  xpv::netback::BackendOptions opts;
  return xpv::daemon::run_backend<xpv::netback::Backend>(
      argc, argv, "xpv-netback", "netif backend (host TAP vif<N>.<devid>) for every domain's virtual NICs", opts);
}
