// Which domains exist: the union of xenstore's /local/domain/<N> (N >= 1) and the run
// directory's dom<N>/ records, one summary per domain id, plus the pure lookup by name or id and
// the `xpv list` table.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "xpv/toolstack/paths.h"
#include "xpv/toolstack/record.h"

namespace xpv::toolstack {

class Xenstore;

struct DomainSummary {
  std::uint16_t domid = 0;
  std::string name;           // xenstore's name, else the record's; "" if neither knows
  std::string type = "-";     // "process" | "hvm" | "-" (no record)
  std::uint64_t memory_mib = 0;
  unsigned vcpus = 0;
  std::string state;          // "running" | "paused" | "dead" (its process is gone) | "unknown" (no record)
  pid_t pid = 0;              // live domain process, 0 if none
  bool paused = false;        // its vCPUs are stopped (HVM: xpv-vmm's state file)
  bool in_xenstore = false;
  std::optional<DomainRecord> record;
};

// The record's domain process / its monitor is running: that program, for that domain (process.h,
// process_runs — not a pid reused by another domain's process or monitor).
bool domain_process_runs(const DomainRecord& r);
bool monitor_runs(const DomainRecord& r);

// `xs` may be null (xenstored not running): then only the run directory is consulted.
std::vector<DomainSummary> gather_domains(const Paths& paths, Xenstore* xs);

// "web1" or "3". Throws ToolstackError: "no domain named 'web9'", "no domain with id 9",
// "Domain-0 is dom0 (the host): not a domain xpv manages".
const DomainSummary& resolve_domain(const std::vector<DomainSummary>& domains, std::string_view which);

// "web1 (id 1)"
std::string domain_label(const DomainSummary& d);

// The `xpv list` table (xl list's columns, plus Type), Domain-0 first.
struct Dom0Facts {
  std::uint64_t memory_mib = 0;
  unsigned vcpus = 0;
};
std::string format_list(const std::vector<DomainSummary>& domains, const Dom0Facts& dom0);
std::string format_list_json(const std::vector<DomainSummary>& domains, const Dom0Facts& dom0);
Dom0Facts host_facts();

}  // namespace xpv::toolstack
