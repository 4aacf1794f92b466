// What the toolstack remembers about a domain it created, in the domain's run directory
// (RUN/dom<N>/): `pid` (the domain process, decimal, as the contract names it) and
// `domain.json` (everything `xpv list` shows that xenstore does not hold, and what `destroy`
// needs after a crash of xenstored or of the domain).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace xpv::toolstack {

struct DomainRecord {
  std::uint16_t domid = 0;
  std::string name;
  std::string type;  // "process" | "hvm"
  std::uint64_t memory_mib = 0;
  unsigned vcpus = 1;
  std::string config;  // absolute path of the configuration file
  pid_t pid = 0;
  std::string uuid;
  std::string program;  // basename of the domain process ("xpv-front"): guards against pid reuse
  std::string netns;    // the network namespace file the toolstack made for it ("" = none)
  // What happens when the domain stops, as the configuration said when it was created (xl's
  // on_poweroff / on_reboot / on_crash): "destroy" | "restart" | "preserve".
  std::string on_poweroff = "destroy", on_reboot = "restart", on_crash = "destroy";
  pid_t monitor_pid = 0;  // its `xpv monitor` (acts on those when the domain process ends); 0 = none
  // The cgroup its process is in for its CPU weight and cap (cpu_sched.h); "" = none. The
  // weight and cap are what was asked for (v2 cannot hold every weight exactly).
  std::string cgroup;
  std::uint32_t cpu_weight = 256, cap = 0;
  bool operator==(const DomainRecord&) const = default;
};

std::string record_to_json(const DomainRecord& r);
// nullopt for text that is not a record (a torn or foreign file).
std::optional<DomainRecord> record_from_json(const std::string& text);

// RUN/dom<N>/domain.json and RUN/dom<N>/pid, each written atomically (temp file + rename).
// RUN/dom<N>/shutdown is the domain process's own word on why it stopped (see shutdown_reason()).
void write_record(const std::string& domain_dir, const DomainRecord& r);
std::optional<DomainRecord> read_record(const std::string& domain_dir);

}  // namespace xpv::toolstack
