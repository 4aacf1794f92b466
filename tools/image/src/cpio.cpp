// newc cpio writer: see cpio.h. Pure; used on the `xpv image build` thread.
#include "xpv/image/cpio.h"

#include <fmt/core.h>
#include <sys/stat.h>

#include <stdexcept>

namespace xpv::image {

std::string CpioWriter::normalise(std::string_view path) {
  while (!path.empty() && path.front() == '/') path.remove_prefix(1);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (path.empty()) throw std::invalid_argument("cpio: empty path");
  std::string p(path);
  if (p == ".." || p.rfind("../", 0) == 0 || p.find("/../") != std::string::npos ||
      (p.size() >= 3 && p.compare(p.size() - 3, 3, "/..") == 0)) {
    throw std::invalid_argument("cpio: '..' in path " + p);
  }
  return p;
}

void CpioWriter::record(const std::string& name, std::uint32_t mode, std::uint32_t nlink,
                        std::string_view data, unsigned rmajor, unsigned rminor) {
  if (data.size() > 0xffffffffu) throw std::invalid_argument("cpio: file too large: " + name);
  const std::string hdr = fmt::format(
      "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
      name == "TRAILER!!!" ? 0u : ino_++, mode, 0u, 0u, nlink, 0u, static_cast<std::uint32_t>(data.size()),
      0u, 0u, rmajor, rminor, static_cast<std::uint32_t>(name.size() + 1), 0u);
  static const char kZeros[4] = {0, 0, 0, 0};
  out_ << hdr << name;
  out_.write(kZeros, 1);
  offset_ += hdr.size() + name.size() + 1;
  out_.write(kZeros, static_cast<std::streamsize>((4 - offset_ % 4) % 4));
  offset_ += (4 - offset_ % 4) % 4;
  out_.write(data.data(), static_cast<std::streamsize>(data.size()));
  offset_ += data.size();
  out_.write(kZeros, static_cast<std::streamsize>((4 - offset_ % 4) % 4));
  offset_ += (4 - offset_ % 4) % 4;
  if (!out_) throw std::runtime_error("cpio: write failed at " + name);
}

void CpioWriter::parents(const std::string& path) {
  for (auto slash = path.find('/'); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    const std::string parent = path.substr(0, slash);
    if (paths_.insert(parent).second) record(parent, S_IFDIR | 0755, 2, {}, 0, 0);
  }
}

void CpioWriter::entry(std::string_view path, std::uint32_t mode, std::string_view data,
                       unsigned rmajor, unsigned rminor) {
  if (finished_) throw std::logic_error("cpio: entry after finish()");
  const std::string p = normalise(path);
  parents(p);
  if (!paths_.insert(p).second) throw std::invalid_argument("cpio: duplicate entry " + p);
  record(p, mode, S_ISDIR(mode) ? 2 : 1, data, rmajor, rminor);
}

void CpioWriter::dir(std::string_view path, unsigned perm) { entry(path, S_IFDIR | (perm & 07777), {}, 0, 0); }

void CpioWriter::file(std::string_view path, std::string_view data, unsigned perm) {
  entry(path, S_IFREG | (perm & 07777), data, 0, 0);
}

void CpioWriter::symlink(std::string_view path, std::string_view target) {
  if (target.empty()) throw std::invalid_argument("cpio: empty symlink target");
  entry(path, S_IFLNK | 0777, target, 0, 0);
}

void CpioWriter::char_dev(std::string_view path, unsigned perm, unsigned major, unsigned minor) {
  entry(path, S_IFCHR | (perm & 07777), {}, major, minor);
}

void CpioWriter::finish() {
  if (finished_) return;
  record("TRAILER!!!", 0, 1, {}, 0, 0);
  finished_ = true;
  out_.flush();
}

}  // namespace xpv::image
