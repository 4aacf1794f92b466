// `xpv info` and `xpv uptime`, as xl's: what the host offers domains, and how long each domain
// has run. xl's keys where they mean something here (host, release, nr_cpus, total_memory,
// xen_version — the Xen version HVM guests are told, xen_scheduler — what enforces `cpu_weight`
// and `cap`, …), a few of xpv's own (kvm, hypervisor, xenstored, domains), none that would
// have to be made up (sharing_freed_memory, build_id, …).
//
//   parse_cpuinfo() / parse_meminfo() / process_start_ticks()   the /proc texts (pure: unit-tested)
//   format_info() / format_uptime() / format_uptime_table()     the output (pure: unit-tested)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xpv::toolstack {

struct CpuInfo {
  unsigned sockets = 0;           // distinct "physical id"s (at least 1)
  unsigned cores_per_socket = 0;  // "cpu cores"
  unsigned threads_per_core = 0;  // "siblings" / "cpu cores"
  double mhz = 0;                 // the first "cpu MHz"
};
// /proc/cpuinfo (x86's fields); nullopt when it has no processor with those fields.
std::optional<CpuInfo> parse_cpuinfo(std::string_view text);

struct MemInfo {
  std::uint64_t total_mib = 0;
  std::uint64_t available_mib = 0;  // MemAvailable: what a new domain could get without swapping
};
// /proc/meminfo; nullopt without MemTotal and MemAvailable.
std::optional<MemInfo> parse_meminfo(std::string_view text);

// Field 22 of a /proc/<pid>/stat line (clock ticks after boot when it started); nullopt if absent.
std::optional<std::uint64_t> process_start_ticks(std::string_view stat_line);

// "key                    : value" lines, keys padded as xl info pads them.
std::string format_info(const std::vector<std::pair<std::string, std::string>>& rows);

// As xl uptime ("%2d:%02d:%02d"): " 0:00:05", "12:03:04", "1 day,  0:00:00", "3 days, 12:00:01".
std::string format_uptime(std::uint64_t seconds);
struct UptimeRow {
  std::string name;
  std::uint16_t domid = 0;
  std::uint64_t seconds = 0;
};
// Name, ID, Uptime; Domain-0 (the host) first when the caller put it there.
std::string format_uptime_table(const std::vector<UptimeRow>& rows);

}  // namespace xpv::toolstack
