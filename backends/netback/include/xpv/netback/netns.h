// Named network namespaces as files, the way `ip netns add NAME` makes /run/netns/NAME: a file
// on which the namespace is bind-mounted, so it lives without any process in it. xpv uses one per
// domain, `xpv-dom<N>` (docs/PROCESS-DOMAINS.md): the toolstack creates it before the domain
// process starts and removes it when the domain goes; xpv-front puts the domain's NICs in it.
//
// Setup code: throws std::system_error naming the step. Runs the namespace work on a throwaway
// thread (unshare is per thread), so the caller's namespace is never changed. Needs CAP_SYS_ADMIN.
#pragma once

#include <string>

namespace xpv::netback {

// Creates the namespace file `path` (its directory is created 0755 if missing) with a fresh
// network namespace whose `lo` is up. Throws if `path` exists already.
void create_netns(const std::string& path);

// True when `path` is a network namespace (an nsfs file that setns accepts as CLONE_NEWNET).
bool netns_exists(const std::string& path) noexcept;

// Detaches the mount and removes the file; the namespace dies with its last user (its
// interfaces go with it). An absent path is fine. Returns false if something was left.
bool remove_netns(const std::string& path) noexcept;

}  // namespace xpv::netback
