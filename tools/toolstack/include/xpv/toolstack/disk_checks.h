// Checks before a disk is added (create, block-attach): one image file is never written by two
// disks at once, nor written by one while another reads it — the rule of Xen's block hotplug
// script, which refuses a device "already in use" by another domain. "One image" is one file by
// device and inode, whatever path, link or bind mount names it. Reading one file from several
// disks (read-only everywhere) is fine. Within one configuration the loader checks the same
// (config/domain_config.cpp); these checks are against the disks already on the host.
// Unit-tested in tests/unit/tools/disk_checks_test.cpp.
#pragma once

#include <string>
#include <vector>

#include "xpv/config/device_specs.h"

namespace xpv::toolstack {

class Xenstore;
struct DomainSummary;

// A disk already on the host, as its backend directory shows it.
struct ExistingDisk {
  std::string owner;   // "web1 (id 1) xvda"
  std::string target;  // its `params`
  bool writable = false;
};

// Every vbd of `domains` that has a backend directory with `params`.
std::vector<ExistingDisk> existing_disks(Xenstore& xs, const std::vector<DomainSummary>& domains);

// Throws ToolstackError ("disk xvdb: '/img' is written by web1 (id 1) xvda", "… is read by … : it
// cannot be given writable") — `what` prefixes the message ("web1.cfg"). A target that cannot be
// stat'ed (here or in `disks`) matches nothing: the loader has checked the new one exists.
void check_new_disk(const std::string& what, const config::DiskSpec& disk, const std::vector<ExistingDisk>& disks);

}  // namespace xpv::toolstack
