// A domain's configuration, from an xl-style file:
//   name = "web1"                 required; [A-Za-z0-9_.-], 1..64, not starting with '-'
//   type = "process" | "hvm"      (xl's builder = "hvm" is accepted as type = "hvm")
//   memory = 512                  MiB, 1..1048576 (default 128 for process, 512 for hvm)
//   maxmem = 1024                 hvm: MiB of RAM the guest is given, ≥ memory (default memory); its
//                                 balloon driver gives back all but `memory` at boot, and
//                                 `xpv mem-set` may grow it up to maxmem (as xl's maxmem)
//   vcpus = 2                     1..128 (default 1)
//   cpus = "0-3,^1"               hvm: the host CPUs every vCPU's thread may run on (xl.cfg's
//                                 CPU-LIST, cpu_list.h); as a list, ["2", "3-4"], vCPU i gets
//                                 item i and vCPUs past its end are not placed (items past the
//                                 last vCPU: a warning). Each set must share a CPU with those
//                                 this process may run on (checked with the files)
//   cpu_weight = 512              1..65535: the domain's share of the host's CPU against other
//                                 domains given one (xl's credit-scheduler weight, default 256)
//   cap = 50                      0..102400: at most this % of one host CPU (0: no cap, as xl);
//                                 either setting puts the domain process in a cgroup of its own
//                                 (toolstack/cpu_sched.h)
//   kernel / ramdisk / extra      hvm: direct Linux boot (kernel required, files must exist;
//                                 xl's cmdline replaces extra; relative paths are the
//                                 working directory's, made absolute when the files are checked)
//   disk = [ 'format=raw, vdev=xvda, access=rw, target=/srv/a.img' ]
//   vif = [ 'mac=00:16:3e:00:00:01, ip=10.0.0.2/24' ]
//   upcall = "vector" | "callback" | "intx"   hvm: how event channels interrupt the guest
//   on_poweroff/on_reboot/on_crash = "destroy" | "restart" | "preserve"
// Every error names the file, the line and the setting (a missing required setting: the file).
// A setting given twice, also under its other name (type/builder), is an error; cmdline and
// extra both: cmdline wins, with a warning (as xl). Disk targets must be a regular file whose size
// is a positive multiple of 512 or a block device, and no image may be given to two disks with
// one of them writable. Keys xl knows but xpv has no use for (vnc, sdl, serial, boot, ...) are
// reported as warnings, never silently half-applied; keys nobody knows are errors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "xpv/config/device_specs.h"
#include "xpv/kvm/cpu_list.h"

namespace xpv::config {

enum class DomainType { process, hvm };
enum class Upcall { vector, callback, intx };
enum class LifecycleAction { destroy, restart, preserve };
const char* to_string(LifecycleAction a) noexcept;  // "destroy" | "restart" | "preserve"

struct DomainConfig {
  std::string name;
  DomainType type = DomainType::process;
  std::uint64_t memory_mib = 0;
  std::uint64_t maxmem_mib = 0;  // after parsing: ≥ memory_mib (= memory_mib when not given)
  unsigned vcpus = 1;
  // `cpus`: entry i is vCPU i's host CPUs (xpv-vmm --vcpu-affinity); empty, or no entry: not placed.
  std::vector<kvm::CpuList> vcpu_affinity;
  // `cpu_weight` / `cap`: nullopt when the file does not give it.
  std::optional<std::uint32_t> cpu_weight, cap;
  std::string kernel, ramdisk, extra;
  Upcall upcall = Upcall::vector;
  LifecycleAction on_poweroff = LifecycleAction::destroy;
  LifecycleAction on_reboot = LifecycleAction::restart;
  LifecycleAction on_crash = LifecycleAction::destroy;
  std::vector<DiskSpec> disks;
  std::vector<VifSpec> vifs;
  std::vector<std::string> warnings;  // "vm.cfg:9: 'vnc' has no meaning for xpv; ignored"
};

// Throws ConfigError. `check_files`: whether kernel/ramdisk/disk targets must exist now (the CLI
// sets it; unit tests of pure syntax may not).
DomainConfig parse_domain_config(std::string_view text, const std::string& source,
                                 bool check_files = true);
DomainConfig load_domain_config(const std::string& path, bool check_files = true);

bool valid_domain_name(std::string_view name);

// Why a disk target cannot be served ("does not exist", "is not a regular file or block device",
// "is N bytes, not a positive multiple of 512"), or "" when it can: the checks xpv-blkback makes
// when it opens the target, made before anything of a domain or device is created.
std::string disk_target_problem(const std::string& path);
// `path` made absolute against the working directory (an absolute path or "" as it is).
std::string absolute_path(const std::string& path);

// A memory size as `xl mem-set` takes it: digits with an optional unit, t/g/m/k/b in either case,
// MiB without one ("256", "256m", "1g", "262144k"). In KiB; nullopt for anything else (empty,
// signs, spaces, other units, a value that does not fit).
std::optional<std::uint64_t> parse_memory_kib(std::string_view text);

}  // namespace xpv::config
