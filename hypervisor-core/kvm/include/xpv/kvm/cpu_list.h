// Host CPU sets for vCPU placement (xl's `cpus`, `xl vcpu-pin`): the CPU-LIST syntax xl.cfg(5)
// gives, parsed into a set, and the set written back in its shortest form.
//
//   "all"            every CPU
//   "3"              CPU 3
//   "2-5"            CPUs 2, 3, 4 and 5
//   "^4", "^6-7"     not these
//   "0-3,5,^1"       a comma-separated mix, read left to right as xl reads it (each item adds
//                    its CPUs, or with ^ takes them away): CPUs 0, 2, 3 and 5; "^1,0-3" is 0-3
// xl's "node:N" / "nodes:N-M" (a NUMA node's CPUs) are refused with a reason: xpv does not place
// vCPUs by node. CPU numbers are below kMaxCpus (the size of Linux's cpu_set_t).
//
// The parsers are pure; cpus_of_thread and place_thread are the two calls to the host's scheduler
// (sched_getaffinity / sched_setaffinity), for xpv-vmm's vCPU threads and the toolstack alike.
#pragma once

#include <sys/types.h>

#include <bitset>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "xpv/kvm/error.h"

namespace xpv::kvm {

inline constexpr std::size_t kMaxCpus = 1024;
inline constexpr unsigned kMaxPlacedVcpus = 4096;  // parse_vcpu_affinity's bound on `vcpus`

struct CpuList {
  std::bitset<kMaxCpus> cpus;
  bool empty() const noexcept { return cpus.none(); }
  bool operator==(const CpuList&) const = default;
};

// Errors name the item: "'3-1': a range must not run downward", "'x': expected a CPU number, a
// range N-M, ^ to leave CPUs out, or all", "'2000': CPU numbers go up to 1023", "'node:1':
// NUMA node lists are not supported by xpv; name the CPUs", "'^all': ^ and all do not combine
// (as in xl)", "'0,^0' leaves no CPU".
Result<CpuList> parse_cpu_list(std::string_view text);

// "0-3,5" (ranges of three or more CPUs as N-M, two as "N,N+1"); "none" for the empty set.
std::string format_cpu_list(const CpuList& l);

// xpv-vmm's --vcpu-affinity values, "V:CPU-LIST" each (vCPU V, 0-based), into one list per vCPU
// (entries for vCPUs not named stay empty: not placed). Every set must share a CPU with
// `allowed` (what the process may run on: a set without one would stop the vCPU at its start).
// Errors name the value: a V that is not a vCPU of `vcpus`, a vCPU given twice, a bad list.
Result<std::vector<CpuList>> parse_vcpu_affinity(const std::vector<std::string>& specs, unsigned vcpus,
                                                 const CpuList& allowed);

// The CPUs thread `tid` may run on (0: the calling thread). Error: the errno's words.
Result<CpuList> cpus_of_thread(pid_t tid);
// Restricts thread `tid` (0: the calling thread) to `cpus`, as sched_setaffinity does (the
// kernel keeps only what its cpuset allows; none of them → EINVAL).
Result<void> place_thread(pid_t tid, const CpuList& cpus);

}  // namespace xpv::kvm
