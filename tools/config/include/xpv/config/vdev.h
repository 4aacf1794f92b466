// Virtual disk names ↔ xenstore device ids, as Xen's xen-vbd-interface(7) numbers them:
//   xvdX[N], disk < 16, partition < 16:  (202 << 8) | (disk << 4) | partition   xvda = 51712
//   xvdX[N], larger:                      (1 << 28) | (disk << 8) | partition   (partition < 256)
//   hdX[N] (disk < 4, partition < 64):    hda/hdb major 3, hdc/hdd major 22, (disk%2 << 6) | partition
//   sdX[N] (disk < 16, partition < 16):   (8 << 8) | (disk << 4) | partition
//   dDpP:                                 as xvd with disk D, partition P
// Disk letters: a..z, then aa..zz, ... (a = 0, z = 25, aa = 26).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace xpv::config {

struct Vdev {
  std::uint32_t devid = 0;   // the xenstore device id (…/device/vbd/<devid>)
  std::uint32_t disk = 0;
  std::uint32_t partition = 0;
  std::string name;          // canonical xvd name for logs: xvda, xvdb3, xvdaa
};

// nullopt if `name` is not a valid virtual disk name.
std::optional<Vdev> parse_vdev(std::string_view name);

// "xvdb" for 51728; nullopt if devid is not an xvd-style id.
std::optional<std::string> xvd_name(std::uint32_t devid);

}  // namespace xpv::config
