// A writer for the "newc" cpio format (magic 070701), the one the Linux kernel unpacks as an
// initramfs. Written here rather than with cpio(1) so that the archive is reproducible (owner 0,
// mtime 0, inode numbers in order) and can hold /dev/console without privileges.
//
// Record: a 110-byte ASCII header ("070701" + 13 fields of 8 hex digits: ino, mode, uid, gid,
// nlink, mtime, filesize, devmajor, devminor, rdevmajor, rdevminor, namesize incl. NUL, check),
// the name + NUL padded to a multiple of 4, the data padded to a multiple of 4. The archive ends
// with the record "TRAILER!!!". Parent directories must come before their entries (the kernel
// does not create them): the writer adds missing parents itself.
#pragma once

#include <cstdint>
#include <ostream>
#include <set>
#include <string>
#include <string_view>

namespace xpv::image {

class CpioWriter {
 public:
  explicit CpioWriter(std::ostream& out) : out_(out) {}

  // Paths are relative ("bin/busybox"); a leading '/' is dropped. Throws std::invalid_argument
  // on an empty path, a ".." component, or a second entry for the same path.
  void dir(std::string_view path, unsigned perm = 0755);
  void file(std::string_view path, std::string_view data, unsigned perm = 0644);
  void symlink(std::string_view path, std::string_view target);
  void char_dev(std::string_view path, unsigned perm, unsigned major, unsigned minor);
  // Writes the trailer. Nothing may be added afterwards.
  void finish();

 private:
  void entry(std::string_view path, std::uint32_t mode, std::string_view data, unsigned rmajor,
             unsigned rminor);
  std::string normalise(std::string_view path);
  void parents(const std::string& path);
  void record(const std::string& name, std::uint32_t mode, std::uint32_t nlink, std::string_view data,
              unsigned rmajor, unsigned rminor);

  std::ostream& out_;
  std::uint64_t offset_ = 0;
  std::uint32_t ino_ = 1;
  std::set<std::string> paths_;
  bool finished_ = false;
};

}  // namespace xpv::image
