// Where the toolstack finds and puts things (docs/PROCESS-DOMAINS.md "Run-time directories").
// Each path has a default, an environment override and a command-line override, in that order of
// increasing precedence, so tests never touch the global /run and /var/log:
//   run_dir          /run/xpv                 XPV_RUN_DIR       --run-dir
//   log_dir          /var/log/xpv             XPV_LOG_DIR       --log-dir
//   xenstore_socket  /run/xenstored/socket    XENSTORED_PATH    --xenstore
//   bin_dir          directory of `xpv`       XPV_BIN_DIR       --bin-dir   (xpv-xenstored, …)
//   netns_dir        /run/netns               XPV_NETNS_DIR     --netns-dir (domains' namespaces)
#pragma once

#include <cstdint>
#include <string>

namespace xpv::toolstack {

// What the command line gave; empty = not given.
struct PathOptions {
  std::string run_dir, log_dir, xenstore_socket, bin_dir, netns_dir;
};

struct Paths {
  std::string run_dir = "/run/xpv";
  std::string log_dir = "/var/log/xpv";
  std::string xenstore_socket = "/run/xenstored/socket";
  std::string bin_dir;
  std::string netns_dir = "/run/netns";  // where `ip netns` keeps its namespaces

  // Each field from the command line, else the environment, else the default. `self_exe` is the
  // running executable (its directory is the default bin_dir).
  static Paths resolve(const PathOptions& from_cli, const std::string& self_exe);

  std::string domain_dir(std::uint16_t domid) const;      // RUN/dom<N>
  std::string control_socket(std::uint16_t domid) const;  // RUN/dom<N>.sock
  std::string console_socket(std::uint16_t domid) const;  // RUN/dom<N>/console.sock (HVM: xpv-vmm's serial)
  std::string pv_console_socket(std::uint16_t domid) const;  // RUN/dom<N>/console-pv.sock (HVM: its hvc0)
  std::string memory_file(std::uint16_t domid) const;  // RUN/dom<N>/memory (HVM: KiB held after ballooning)
  std::string state_file(std::uint16_t domid) const;   // RUN/dom<N>/state (HVM: paused or running)
  std::string vmm_stats_file(std::uint16_t domid) const;  // RUN/stats/vmm<N> (HVM: xpv-vmm's counters, `xpv top`)
  std::string pid_file(const std::string& program) const;  // RUN/<program>.pid
  std::string log_file(const std::string& program) const;  // LOG/<program>.log
  std::string binary(const std::string& program) const;    // BIN/<program>
  std::string lock_file() const;                           // RUN/xpv.lock
  std::string xenstored_journal() const;                   // RUN/xpv-xenstored.journal
  // Where a process domain's PV disk appears (the FUSE file of xpv-front).
  std::string vbd_disk(std::uint16_t domid, std::uint32_t devid) const;
  // The network namespace a process domain owns: NETNS/xpv-dom<N> (`ip netns exec xpv-dom<N> …`).
  std::string netns(std::uint16_t domid) const;
};

// Path of the running executable (/proc/self/exe), empty if unknown.
std::string self_executable();

}  // namespace xpv::toolstack
