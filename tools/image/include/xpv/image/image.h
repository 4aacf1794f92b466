// `xpv image`: guest images for stock Linux HVM guests, from Debian packages only.
//
//   inputs                                       outputs (<cache>/<key>/, renamed into place)
//   Debian kernel package (xpv::testbed kernel   vmlinuz        the package's bzImage
//     cache, apt-get download)                   initrd.cpio    newc: busybox, /init, modules
//   busybox-static, iperf3, bonnie++, fio        root.ext4      sparse ext4 (mke2fs -d, no mount)
//     (installed on the host: scripts/setup)     manifest.json  versions, sha256s, sizes
//   recipes: frontends/guest-image/              inputs.txt     the text the key is hashed from
//     initrd-init.sh, rootfs-init.sh,
//     modules.list, fio/*.fio
//
// key = first 16 hex digits of sha256(inputs.txt): the kernel package, version and .deb sha256,
// the dpkg versions of busybox-static/iperf3/bonnie++/fio, the sha256 of every binary and shared
// library copied, the sha256 of every recipe file, the root disk size and the format version.
// An image is rebuilt only when that text changes (or with force). Built in <cache>/.tmp-*,
// removed on failure, renamed to <cache>/<key> only when complete.
//
// Setup code: throws std::runtime_error with one clear line ("iperf3 not found in PATH ...").
#pragma once

#include <string>
#include <vector>

namespace xpv::image {

struct BuildOptions {
  unsigned size_mib = 1024;  // root.ext4 size
  bool force = false;        // rebuild even if the cache has this key
  std::string out_dir;       // also copy the four files here ("" → no copy)
  std::string recipes;       // "" → $XPV_IMAGE_RECIPES, else the source tree's frontends/guest-image
  std::string cache;         // "" → $XPV_IMAGE_CACHE, else <xpv cache root>/images
};

struct Image {
  std::string key;
  std::string dir;       // <cache>/<key>
  std::string vmlinuz;   // dir/vmlinuz
  std::string initrd;    // dir/initrd.cpio
  std::string root;      // dir/root.ext4 — never boot it in place: copy it (cp --sparse=always)
  std::string manifest;  // dir/manifest.json
  bool built = false;    // the files exist
  bool cached = false;   // build(): they existed already (no rebuild)
};

// Builds (or finds) the image for the current inputs.
Image build(const BuildOptions& opts);

// The image for the current inputs, without building (built tells whether it exists).
Image locate(const BuildOptions& opts);

// The recipe files that are inputs, relative to the recipe dir, sorted.
std::vector<std::string> recipe_files(const std::string& recipes_dir);

// The host programs that go onto the root disk, and the Debian package each comes from.
struct Tool {
  const char* program;
  const char* package;
  const char* guest_path;  // where it goes on the root disk
};
extern const std::vector<Tool> kTools;

}  // namespace xpv::image
