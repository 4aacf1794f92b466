// `xpv vcpu-list` and `xpv vcpu-pin`, as xl's: where an HVM domain's vCPUs run. Each vCPU is a
// thread of the domain's xpv-vmm; its id comes from the domain's control socket
// (get_vcpu_threads), the rest from the host: /proc/<vmm>/task/<tid>/stat (state, CPU time, the
// CPU it last ran on) and sched_getaffinity / sched_setaffinity (kvm/cpu_list.h). The
// configuration's `cpus` places the threads as they start (xpv-vmm --vcpu-affinity); vcpu-pin
// moves them while the domain runs, until it is created again (a reboot applies `cpus` anew).
//
//   read_task_stat()   one /proc .../stat line → state, CPU time, last CPU (pure: unit-tested)
//   format_vcpu_list() the table (pure: unit-tested)
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xpv::toolstack {

struct TaskStat {
  char state = '?';          // R, S, D, T, ... (proc(5))
  std::uint64_t ticks = 0;   // utime + stime, in clock ticks
  int cpu = -1;              // the CPU it last ran on
};
// The fields of a /proc/<pid>/task/<tid>/stat line (the name in parentheses may hold anything,
// so the fields are counted from its last ')'). nullopt for a line that does not have them.
std::optional<TaskStat> read_task_stat(std::string_view line);

struct VcpuRow {
  std::string name;
  std::uint16_t domid = 0;
  unsigned vcpu = 0;
  pid_t tid = 0;             // 0: no thread (not started yet, or ended)
  TaskStat stat;             // when tid != 0
  double seconds = 0;        // CPU time
  bool paused = false;       // the domain is paused
  std::string affinity;      // "0-3" (format_cpu_list); "" when not known
};
// xl vcpu-list's columns: Name, ID, VCPU, CPU, State (r-- running, -b- blocked, --p paused; ---
// no thread), Time(s), Affinity (Hard / Soft; soft is always "all": Linux has no soft affinity).
std::string format_vcpu_list(const std::vector<VcpuRow>& rows);

}  // namespace xpv::toolstack
