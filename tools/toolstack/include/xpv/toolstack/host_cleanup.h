// Leaving nothing behind on the host when a domain goes: loop devices attached to its PV disk
// files, FUSE mounts left by a domain process that died, its run directory.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace xpv::toolstack {

// Detaches every loop device whose backing file lies under `dir` (LOOP_CLR_FD; a device still
// in use detaches when its last user closes it). Returns one line per device it acted on.
std::vector<std::string> detach_loops_under(const std::string& dir);

// Lazily unmounts (MNT_DETACH) every mount point at or below `dir`, deepest first. Returns one
// line per mount point.
std::vector<std::string> unmount_under(const std::string& dir);

// Pids of live (not zombie) processes other than this one whose command line contains `needle`:
// what is left of a run that used the directory `needle` (tests and benches kill these).
std::vector<pid_t> processes_mentioning(const std::string& needle);

// unmount_under, then removes `dir` recursively. Never follows a mount (they are gone first).
void remove_domain_dir(const std::string& dir);

}  // namespace xpv::toolstack
