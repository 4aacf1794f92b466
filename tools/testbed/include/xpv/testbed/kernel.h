// The cached Debian kernel package: what `xpv testbed` boots as L1 and what `xpv image` puts into
// guest images (vmlinuz and modules from the SAME package, so they always match).
//
//   ~/.cache/xpv/kernel/<kver>/        ($XPV_CACHE/kernel/<kver>/ when XPV_CACHE is set)
//     vmlinuz                          the package's /boot/vmlinuz-<kver>
//     lib/modules/<kver>/              the package's whole module tree + depmod -b output
//     package                          "linux-image-<kver>\n"
//     package-version                  the .deb's Version field, e.g. "6.1.192-3\n"
//     deb.sha256                       sha256 of the downloaded .deb
//     complete                         written last: "layout 2\n"
//
// The tree is ~390 MB; it is extracted once (apt-get download + dpkg-deb, ~5 s) and the .deb is
// not kept. A cache entry is used only if `complete` says layout 2 and vmlinuz and modules.dep
// exist; anything else (an older layout, a half-deleted entry) is fetched again. Concurrent
// `xpv` processes serialise on an flock of <cache>/kernel/.lock.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace xpv::testbed {

struct Kernel {
  std::string version;             // e.g. 6.1.0-57-amd64
  std::string package;             // e.g. linux-image-6.1.0-57-amd64
  std::string package_version;     // e.g. 6.1.192-3
  std::string deb_sha256;          // of the .deb it was extracted from
  std::string dir;                 // cache dir for this version
  std::string vmlinuz;             // bzImage
  std::string modules_dir;         // dir/lib/modules/<version>
  std::vector<std::string> modules;  // the .ko files L1 needs, in load order (dependencies first)
};

// $XPV_CACHE, else $HOME/.cache/xpv (/root/.cache/xpv without HOME).
std::string cache_root();

// Resolves the kernel package (linux-image-amd64's dependency, or $XPV_TESTBED_KERNEL_PKG),
// downloads it with `apt-get download` and extracts it into the cache, once. Throws
// std::runtime_error with one clear line.
Kernel ensure_kernel();

// Module names (as modprobe spells them; '-' and '_' are the same) → absolute paths of their .ko
// files in the kernel's tree, dependencies first (from modules.dep), each once. Throws naming the
// first unknown module (built in, or not in this kernel) and listing what asked for it.
std::vector<std::string> resolve_modules(const Kernel& k, const std::vector<std::string>& names);

// The pure parts, for tests.
struct ModuleDep {
  std::string path;                // relative to the module tree, e.g. kernel/fs/ext4/ext4.ko
  std::vector<std::string> deps;   // relative paths, as modules.dep lists them
};
// modules.dep text → module name ("ext4", "xen_blkfront") → entry.
std::map<std::string, ModuleDep> parse_modules_dep(const std::string& text);
// "kernel/drivers/block/xen-blkfront.ko" → "xen_blkfront".
std::string module_name(const std::string& path);
// Relative paths in load order. Throws on an unknown module or a dependency loop.
std::vector<std::string> order_modules(const std::map<std::string, ModuleDep>& dep,
                                       const std::vector<std::string>& names);

}  // namespace xpv::testbed
