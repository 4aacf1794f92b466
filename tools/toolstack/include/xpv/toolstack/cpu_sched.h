// A domain's CPU weight and cap, as xl's credit scheduler has them (xl.cfg `cpu_weight` and
// `cap`, `xl sched-credit -d DOM -w WEIGHT -c CAP`), on a Linux host: the domain process — an HVM
// guest's xpv-vmm with its vCPU threads, or a process domain's xpv-front — goes into a cgroup of
// its own, <hierarchy>/xpv/<uuid>, and the cpu controller does the rest, as libvirt does for a
// QEMU guest (machine.slice/machine-qemu-….scope).
//
//   weight  1..65535, default 256: a domain with twice the weight of another gets twice its CPU
//           when both want more than there is. cgroup v1 cpu.shares = 4 × weight (256 → 1024,
//           the default); v2 cpu.weight = weight × 100 / 256, at least 1, at most 10000 (256 →
//           100, the default; weights above 25600 all map to 10000).
//   cap     0..102400, % of one host CPU (0: none; 150: one and a half CPUs), over periods of
//           100 ms: v1 cpu.cfs_quota_us / cpu.cfs_period_us, v2 cpu.max.
//
// Only a domain whose configuration gives one of them (`cap = 0` too), or that `xpv
// sched-credit` set, is in such a cgroup; the others run as the host's other processes do, and
// `sched-credit` lists them with `-` for weight and cap. Every domain cgroup sits in one parent,
// `xpv`, which takes the host's default share against its siblings (v2: `system.slice`,
// `user.slice`, … at 100 each) or, on v1, against each busy task of the root (1024 each): the
// weights divide between the domains in it what that one share gets, so putting a domain in it —
// a cap alone does — changes its share when the host is busy (a 2-vCPU guest outside counts as
// two tasks on v1, inside the group all its domains count as one). The cap holds whatever else
// runs. Which hierarchy: the one the cpu controller is bound to, found in /proc/self/mountinfo (a
// v1 `cgroup` mount with the `cpu` option, else a `cgroup2` mount whose cgroup.controllers lists
// cpu; only mounts of a hierarchy's root, not bind mounts of a subtree); none: a clear error,
// nothing made. On a systemd host `xpv` is made at the top of the hierarchy, outside what
// systemd delegates (as Docker's cgroupfs driver does), not through systemd-machined as libvirt.
//
//   find_cpu_hierarchy()  mountinfo text → the hierarchy (pure: unit-tested)
//   to_v1 / to_v2 …       the settings as the files take them (pure: unit-tested)
//   DomainCgroup          make, set, move a process in, read back, remove (real cgroupfs:
//                         tests/integration/toolstack)
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xpv::toolstack {

inline constexpr std::uint32_t kDefaultWeight = 256;
inline constexpr std::uint32_t kMaxWeight = 65535;
inline constexpr std::uint32_t kMaxCap = 100 * 1024;
inline constexpr std::uint64_t kCapPeriodUs = 100000;

struct CpuSched {
  std::uint32_t weight = kDefaultWeight;
  std::uint32_t cap = 0;  // % of one CPU; 0 = none
  bool operator==(const CpuSched&) const = default;
};

// "" when `s` is in range, else why not ("weight 0 is out of range 1..65535").
std::string cpu_sched_problem(const CpuSched& s);

enum class CgroupVersion { v1, v2 };
struct CpuHierarchy {
  CgroupVersion version = CgroupVersion::v2;
  std::string mount;  // where it is mounted ("/sys/fs/cgroup", "/sys/fs/cgroup/cpu,cpuacct")
  bool operator==(const CpuHierarchy&) const = default;
};
// From /proc/self/mountinfo's text: the v1 hierarchy with the cpu controller if there is one (the
// controller can be bound to one hierarchy only), else the first cgroup2 mount for which
// `v2_has_cpu(mount)` says its cgroup.controllers lists cpu. nullopt: neither.
std::optional<CpuHierarchy> find_cpu_hierarchy(std::string_view mountinfo,
                                               bool (*v2_has_cpu)(const std::string& mount));
// The same for this host (its /proc/self/mountinfo and cgroup.controllers files).
std::optional<CpuHierarchy> host_cpu_hierarchy();

// The files' values.
std::uint64_t v1_shares(std::uint32_t weight);            // 4 × weight
std::uint32_t weight_from_v1_shares(std::uint64_t shares);  // shares / 4, within 1..65535
std::uint32_t v2_weight(std::uint32_t weight);            // weight × 100 / 256 rounded, 1..10000
std::string v1_quota(std::uint32_t cap);                  // "-1" or cap × 1000 (period 100000)
std::string v2_max(std::uint32_t cap);                    // "max 100000" or "<cap × 1000> 100000"

class DomainCgroup {
 public:
  // <mount>/xpv/<leaf> (leaf: the domain's uuid).
  DomainCgroup(CpuHierarchy h, std::string leaf);
  // The one a record names, if `path` is <h.mount>/xpv/<one name>: nothing else is ever made, so
  // nothing else is ever removed.
  static std::optional<DomainCgroup> at(const CpuHierarchy& h, const std::string& path);
  // Makes the parent (and, v2, lets it and its parent hand the cpu controller down): done before
  // a domain process is started, so a host that refuses it refuses the domain before anything
  // of it is made. Then the domain's own (one left over for this uuid is taken as it is). Each
  // throws ToolstackError naming the file that refused.
  void prepare() const;
  void create() const;
  // Writes the weight, then the cap; a write that is refused puts back every file it had
  // written (weight, quota, period) as it was.
  void apply(const CpuSched& s) const;
  // Moves every thread of `pid` in (cgroup.procs).
  void add_process(pid_t pid) const;
  // What the files hold now, as a weight and cap (v2's weight read back through the same mapping,
  // so a weight that did not map exactly comes back as the nearest one that does).
  CpuSched read() const;
  // Removes it, waiting up to `wait_ms` for an exiting process to leave; false if it is still
  // there (the reason in *why). A cgroup that is not there is removed already: true.
  bool remove(int wait_ms, std::string* why) const;
  const std::string& path() const { return path_; }
  CgroupVersion version() const { return h_.version; }

 private:
  CpuHierarchy h_;
  std::string parent_, path_;
};

// Moves every thread of `pid` into the cgroup at `dir` (its cgroup.procs); throws ToolstackError.
void move_process(const std::string& dir, pid_t pid);

// The path of `pid`'s cgroup relative to `h`'s mount ("/xpv/<uuid>"), from /proc/<pid>/cgroup
// text; nullopt when the text names no line for that hierarchy.
std::optional<std::string> cgroup_of(std::string_view proc_cgroup, CgroupVersion v);

struct SchedRow {
  std::string name;
  std::uint16_t domid = 0;
  CpuSched sched;
  std::string cgroup;  // "" = none: weight and cap shown as "-" (the domain is not weighed)
};
// xl sched-credit's table: Name, ID, Weight, Cap, and then the cgroup ("-" for none).
std::string format_sched_credit(const std::vector<SchedRow>& rows);

}  // namespace xpv::toolstack
