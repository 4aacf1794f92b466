#include "xpv/toolstack/disk_checks.h"

#include <fmt/core.h>
#include <sys/stat.h>

#include "xpv/toolstack/allocation.h"
#include "xpv/toolstack/devices.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/inventory.h"
#include "xpv/toolstack/nodes.h"
#include "xpv/toolstack/xenstore.h"

namespace xpv::toolstack {
namespace {

// One file by device and inode; one block device by its device number, whichever node names it.
bool same_image(const struct stat& a, const struct stat& b) {
  if (S_ISBLK(a.st_mode) && S_ISBLK(b.st_mode)) return a.st_rdev == b.st_rdev;
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

std::vector<ExistingDisk> existing_disks(Xenstore& xs, const std::vector<DomainSummary>& domains) {
  std::vector<ExistingDisk> out;
  for (const auto& d : domains) {
    const std::string dir = backend_dir(DeviceKind::vbd, d.domid);
    for (const auto& dev : xs.list(dir)) {
      auto params = xs.read(dir + "/" + dev + "/params");
      if (!params || params->empty()) continue;
      ExistingDisk e;
      const auto devid = parse_devid(dev);
      e.owner = fmt::format("{} {}", domain_label(d), devid ? device_label({DeviceKind::vbd, *devid}) : "vbd " + dev);
      e.target = *params;
      // What the backend was told: anything but "r" is opened writable (xpv-blkback's rule).
      e.writable = xs.read(dir + "/" + dev + "/mode").value_or("w") != "r";
      out.push_back(std::move(e));
    }
  }
  return out;
}

void check_new_disk(const std::string& what, const config::DiskSpec& disk, const std::vector<ExistingDisk>& disks) {
  struct stat mine {};
  if (::stat(disk.target.c_str(), &mine) != 0) return;
  const bool writable = disk.access == config::Access::rw;
  for (const auto& e : disks) {
    struct stat theirs {};
    if (::stat(e.target.c_str(), &theirs) != 0 || !same_image(mine, theirs)) continue;
    if (e.writable) {
      throw ToolstackError(fmt::format("{}disk {}: '{}' is written by {} ('{}')", what.empty() ? "" : what + ": ",
                                       disk.vdev.name, disk.target, e.owner, e.target));
    }
    if (writable) {
      throw ToolstackError(fmt::format("{}disk {}: '{}' is read by {} ('{}'): it cannot be given writable",
                                       what.empty() ? "" : what + ": ", disk.vdev.name, disk.target, e.owner, e.target));
    }
  }
}

}  // namespace xpv::toolstack
