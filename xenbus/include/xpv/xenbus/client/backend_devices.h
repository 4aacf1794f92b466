// What a backend daemon's scan reads from xenstore: the devices of one type under
// /local/domain/0/backend/<type>/<domid>/<devid>, and whether the listing is the whole truth.
//
// xpv-blkback and xpv-netback both scan that tree when they start and when a watch event names
// no single device. Only a listing that is complete may be used to decide that a device is gone
// (a backend removes the restart records of devices that are not there): a listing that failed
// for any reason other than a directory that is not there (EACCES, EIO from a stalled
// xpv-xenstored, ...) says nothing about what it could not read.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace xpv::xenbus::client {

class SyncClient;

struct BackendDevices {
  // (domid, devid) of every entry whose names are numbers in range: domid 1..32751 (dom0's own
  // and reserved ids are never a frontend), devid any 32-bit value; other names are skipped.
  std::vector<std::pair<std::uint16_t, std::uint32_t>> keys;
  // Every directory listed, or failed with ENOENT only (a type or a domain with no device).
  bool complete = true;
};

BackendDevices list_backend_devices(SyncClient& xs, const std::string& base);

}  // namespace xpv::xenbus::client
