// Internal: the pieces shared by the domain and device commands.
#pragma once

#include <functional>

#include "xpv/toolstack/commands.h"
#include "xpv/toolstack/inventory.h"
#include "xpv/toolstack/nodes.h"
#include "xpv/toolstack/record.h"

namespace xpv::toolstack {

class Xenstore;

// Tears down whatever exists of domain `d` (docs/PROCESS-DOMAINS.md "xpv destroy"): loop devices
// on its disks, devices Closing → Closed (bounded), device and domain nodes, RELEASE, the domain
// process, FUSE mounts, its run directory and control socket. `xs` null: xenstored is gone, only
// the host side is cleaned. Warnings go to ctx.err. Caller holds the RunLock. Throws
// ToolstackError, keeping the record and run directory, when the domain process outlives SIGKILL.
void destroy_domain(Context& ctx, Xenstore* xs, const DomainSummary& d);

// Whether the daemon serving this kind of device runs (its pid file names a live process).
bool backend_running(const Paths& paths, DeviceKind k);

// A domain that commands may change: resolved, with a live domain process. Throws otherwise.
DomainSummary live_domain(Context& ctx, Xenstore& xs, const std::string& which);

// RUN/dom<N>/shutdown: where the domain process writes why it stopped (poweroff, reboot, crash).
std::string shutdown_file(const Paths& p, DomId n);

// Starts `xpv monitor N UUID` for a domain just created (lifecycle.cpp); returns its pid.
pid_t spawn_monitor(const Paths& p, const DomainRecord& rec);

}  // namespace xpv::toolstack
