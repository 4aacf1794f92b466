// Internal: the pieces shared by the domain and device commands.
#pragma once

#include <functional>

#include "xpv/toolstack/commands.h"
#include "xpv/toolstack/cpu_sched.h"
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

// CPU weight and cap (sched_credit.cpp, cpu_sched.h). The host's cpu hierarchy, or a
// ToolstackError saying `what` needs one; a domain process put in <hierarchy>/xpv/<uuid> with `s`
// (its path; nothing left behind when it fails); the cgroup a record names removed (a warning
// when it cannot be).
CpuHierarchy cpu_hierarchy_or_throw(const std::string& what);
std::string place_in_cgroup(const CpuHierarchy& h, const std::string& uuid, pid_t pid, const CpuSched& s);
void remove_domain_cgroup(Context& ctx, const DomainRecord& r);

}  // namespace xpv::toolstack
