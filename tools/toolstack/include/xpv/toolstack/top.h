// `xpv top` — what xentop shows for Xen, for xpv's domains: per domain its state, the CPU time of
// its process (an HVM domain's xpv-vmm, guest time included; a process domain's xpv-front) and
// the share of a CPU it used over the last interval, its memory and vCPUs, and the counters of
// its disks and network interfaces as the backends publish them (stats_file.h: RUN/stats/vbd<N>.<devid>,
// vif<N>.<devid>, rewritten every second while a device is connected), and an HVM domain's exits
// per second as its xpv-vmm publishes its counters (RUN/stats/vmm<N>: exits by KVM exit reason,
// hypercalls, upcalls; all of them in --json); under the table the backend daemons' own CPU share
// (Xen's Domain-0 row carries that).
//
//   sample_top()  reads /proc, the run directory, xenstore's backend directories and the stats files
//   format_top()  the table of one interval, from two samples (pure: unit-tested)
//   top_json()    the same as one JSON object (pure)
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "xpv/toolstack/paths.h"

namespace xpv::toolstack {

class Xenstore;

struct DeviceSample {
  std::string name;       // vbd<N>.<devid> / vif<N>.<devid> (vmm<N>: the domain's xpv-vmm)
  bool published = false; // its backend publishes counters (the device is connected to it)
  double published_at = 0; // the file's mtime (s since the epoch): when the counters were read
  std::map<std::string, std::uint64_t> counters;
};

struct DomainSample {
  std::uint16_t domid = 0;
  std::string name, type, state;
  std::uint64_t mem_kib = 0;
  unsigned vcpus = 0;
  pid_t pid = 0;
  std::optional<double> cpu_s;  // user + system time of the domain's process
  std::vector<DeviceSample> vbds, vifs;
  DeviceSample vmm;  // an HVM domain's xpv-vmm counters (not published: none written yet)
};

struct DaemonSample {
  std::string program;
  pid_t pid = 0;                // 0: not running
  std::optional<double> cpu_s;
};

struct TopSample {
  double time_s = 0;  // steady clock
  std::vector<DomainSample> domains;
  std::vector<DaemonSample> daemons;  // xpv-blkback, xpv-netback, xpv-xenstored
};

// `xs` may be null (xenstored not running): no devices then.
TopSample sample_top(const Paths& paths, Xenstore* xs);

// User + system CPU seconds of `pid` from /proc/<pid>/stat (all its threads); nullopt if gone.
std::optional<double> process_cpu_seconds(pid_t pid);
// The CPU seconds in the text of a /proc/<pid>/stat (fields 14 and 15 after the command, which may
// itself hold spaces and parentheses); nullopt if the text is not one.
std::optional<double> parse_proc_stat_cpu(const std::string& text, long ticks_per_second);

// The table for the interval prev → cur: CPU(%) is the CPU time used over the wall time between the
// two (a domain or daemon whose process changed or is missing in either gets "-"); EXITS/s is the
// `exits` counter's rate between xpv-vmm's two publications the samples read ("-" when both read
// the same one, or xpv-vmm's process changed).
std::string format_top(const TopSample& prev, const TopSample& cur);
nlohmann::json top_json(const TopSample& prev, const TopSample& cur);

}  // namespace xpv::toolstack
