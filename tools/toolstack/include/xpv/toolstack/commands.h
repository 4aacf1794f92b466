// The toolstack's commands, one function each; tools/xpv/main.cpp only parses the command line
// and calls these. Normal output goes to ctx.out, warnings to ctx.err ("warning: …"); a failure
// throws ToolstackError (one line) after undoing whatever the command had done.
#pragma once

#include <cstdint>
#include <chrono>
#include <iosfwd>
#include <optional>
#include <string>

#include "xpv/toolstack/paths.h"

namespace xpv::toolstack {

struct Context {
  Paths paths;
  std::ostream& out;
  std::ostream& err;
  std::chrono::milliseconds device_timeout{std::chrono::seconds(20)};  // attach: to Connected
  std::chrono::milliseconds close_timeout{std::chrono::seconds(10)};   // detach: to Closed
};

// Daemons (daemons.cpp).
void cmd_up(Context& ctx);
void cmd_down(Context& ctx, bool force);
// `xpv live-update [BINARY]` (daemons.cpp): xpv-xenstored replaces its binary (default: the one
// next to xpv) in place — same process, every domain and client connected on — as
// `xenstore-control live-update` does (xenbus/include/xpv/xenbus/daemon/live_update.h). While
// transactions are open it asks again each second, up to `timeout`; `force` ends them.
void cmd_live_update(Context& ctx, const std::string& binary, std::chrono::seconds timeout, bool force);
// The supervisor loop (`xpv supervise`, started by `xpv up`); returns the exit status.
int cmd_supervise(Context& ctx);

// Domains (domains.cpp).
// `lock_held`: the caller holds the run lock already (a monitor restarting its domain).
// `paused`: leave an HVM domain paused once it is made (xl create -p); `xpv unpause` starts it.
void cmd_create(Context& ctx, const std::string& config_path, bool wait, bool lock_held = false, bool paused = false);
void cmd_list(Context& ctx, bool json);
void cmd_destroy(Context& ctx, const std::string& which);
// `xpv console NAME` (console.cpp): the HVM domain's serial console, until Ctrl-] or its end.
// type: "serial" (COM1, the default) or "pv" (the Xen PV console, hvc0), as `xl console -t`.
void cmd_console(Context& ctx, const std::string& which, const std::string& type = "serial");
void cmd_shutdown(Context& ctx, const std::string& which, std::chrono::milliseconds timeout);
// Lifecycle (lifecycle.cpp). `xpv reboot`: as xl reboot, through control/shutdown = reboot (the
// guest's PV drivers must offer feature-reboot); waits for the domain to stop and, with
// on_reboot = "restart", for its monitor to create it again. `xpv sysrq`: control/sysrq = key.
// `xpv monitor` (internal, started by create): acts on on_poweroff / on_reboot / on_crash when the
// domain process ends; returns the exit status.
void cmd_reboot(Context& ctx, const std::string& which, std::chrono::milliseconds timeout);
void cmd_sysrq(Context& ctx, const std::string& which, const std::string& key);
int cmd_monitor(Context& ctx, std::uint16_t domid, const std::string& uuid);
// `xpv mem-set NAME SIZE` (lifecycle.cpp): as xl mem-set, memory/target = SIZE (xl's units, MiB
// by default); the HVM guest's balloon driver gives the difference back to the host or takes it
// again, up to its maxmem (memory/static-max). Not for process
// domains (no balloon driver). Returns at once: the guest moves to the target in its own time.
void cmd_mem_set(Context& ctx, const std::string& which, const std::string& size);
// `xpv pause NAME` / `xpv unpause NAME` (lifecycle.cpp), as xl pause / unpause: the HVM domain's
// vCPUs stop (its backends, event channels and clock go on) until unpaused; `xpv list` says
// paused. Unpause also starts a domain created paused. Not for process domains (no vCPUs).
void cmd_pause(Context& ctx, const std::string& which);
void cmd_unpause(Context& ctx, const std::string& which);
// `xpv vcpu-list [NAME...]` / `xpv vcpu-pin NAME VCPU|all CPU-LIST` (vcpus.cpp, vcpus.h), as xl's:
// where an HVM domain's vCPU threads run, and moving them while it runs. Not for process domains.
void cmd_vcpu_list(Context& ctx, const std::vector<std::string>& which);
void cmd_vcpu_pin(Context& ctx, const std::string& which, const std::string& vcpu, const std::string& cpus);
// `xpv info` / `xpv uptime [NAME...]` (host_info.cpp, host_info.h), as xl's: what the host offers
// domains; how long each running domain (and Domain-0, the host, when none is named) has run.
void cmd_info(Context& ctx);
void cmd_uptime(Context& ctx, const std::vector<std::string>& which);
// `xpv sched-credit [-d NAME] [-w WEIGHT] [-c CAP]` (sched_credit.cpp, cpu_sched.h), as xl's:
// without -w/-c the weight and cap of the running domains (or of NAME); with them, NAME's set
// while it runs (its process put in a cgroup of its own if it is not in one yet), until it is
// created again (a reboot applies the configuration's cpu_weight / cap anew).
void cmd_sched_credit(Context& ctx, const std::string& which, std::optional<std::int64_t> weight,
                      std::optional<std::int64_t> cap);

// `xpv top` (top.cpp), as xentop: every `delay_s` a table of the domains (CPU, memory, their disks'
// and network interfaces' counters) and dom0's services' CPU; the first after one delay (CPU(%)
// is measured over it). iterations 0: until interrupted. batch: no screen clearing (always so
// when stdout is not a terminal); json: one JSON object per line instead of the table.
struct TopOptions {
  double delay_s = 3;
  unsigned iterations = 0;
  bool batch = false;
  bool json = false;
};
void cmd_top(Context& ctx, const TopOptions& options);

// Devices (device_commands.cpp).
void cmd_block_attach(Context& ctx, const std::string& which, const std::string& spec, bool wait);
void cmd_block_detach(Context& ctx, const std::string& which, const std::string& vdev);
void cmd_network_attach(Context& ctx, const std::string& which, const std::string& spec, bool wait);
void cmd_network_detach(Context& ctx, const std::string& which, const std::string& devid);
// The domain's disks / network interfaces, one row each with both ends' xenbus states (as
// xl block-list / network-list).
void cmd_block_list(Context& ctx, const std::string& which);
void cmd_network_list(Context& ctx, const std::string& which);

}  // namespace xpv::toolstack
