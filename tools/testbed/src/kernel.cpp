// The Debian kernel cache: see kernel.h. Setup code on the caller's thread; throws
// std::runtime_error with one line (plus the tail of a failing tool's output).
#include "xpv/testbed/kernel.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "xpv/testbed/process.h"

namespace fs = std::filesystem;

namespace xpv::testbed {
namespace {

// The modules L1 needs (ENVIRONMENT.md): virtio transport + 9p for the shares, kvm + kvm-amd,
// tun/tap/vhost-net for TAP networks of L2 guests (QEMU `-netdev tap,vhost=on`), and bridge for
// bridged vifs (the testbed HVM test's callback mode). Their dependencies are added from
// modules.dep.
const std::vector<std::string> kL1Modules = {
    "virtio", "virtio_ring", "virtio_pci", "virtio_pci_legacy_dev", "virtio_pci_modern_dev",
    "9pnet", "9pnet_virtio", "netfs", "fscache", "9p", "irqbypass", "ccp", "kvm", "kvm_amd",
    "tun", "tap", "vhost", "vhost_iotlb", "vhost_net", "bridge"};

constexpr const char* kLayout = "layout 2\n";

[[noreturn]] void die(const std::string& msg) { throw std::runtime_error(msg); }

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string first_line(const std::string& s) {
  std::string l = s.substr(0, s.find('\n'));
  while (!l.empty() && (l.back() == ' ' || l.back() == '\r')) l.pop_back();
  return l;
}

void write_text(const fs::path& p, const std::string& content) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) die(fmt::format("cannot write {}", p.string()));
}

// "linux-image-6.1.0-57-amd64" from `apt-cache depends linux-image-amd64`, or the env override.
std::string resolve_package() {
  if (const char* p = std::getenv("XPV_TESTBED_KERNEL_PKG"); p != nullptr && *p != '\0') return p;
  auto c = capture({"apt-cache", "depends", "linux-image-amd64"});
  if (c.status == 0) {
    std::istringstream in(c.out);
    for (std::string line; std::getline(in, line);) {
      auto pos = line.find("Depends: linux-image-");
      if (pos == std::string::npos) continue;
      std::string pkg = first_line(line.substr(pos + 9));
      if (pkg.find('<') == std::string::npos) return pkg;
    }
  }
  return {};
}

// Holds an exclusive flock on <root>/.lock for its lifetime: two `xpv` processes never fetch
// into the same cache at once (the second waits, then finds the entry complete).
class CacheLock {
 public:
  explicit CacheLock(const fs::path& root) {
    fs::create_directories(root);
    fd_ = open((root / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0 || flock(fd_, LOCK_EX) != 0) die(fmt::format("cannot lock {}/.lock", root.string()));
  }
  ~CacheLock() {
    if (fd_ >= 0) close(fd_);  // releases the flock
  }
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

 private:
  int fd_ = -1;
};

// A complete entry of the current layout, with its files present; else nullopt-like empty dir.
bool entry_valid(const fs::path& dir) {
  const std::string ver = dir.filename().string();
  std::error_code ec;
  return read_text(dir / "complete") == kLayout && fs::file_size(dir / "vmlinuz", ec) > 0 && !ec &&
         fs::exists(dir / "lib" / "modules" / ver / "modules.dep") && fs::exists(dir / "package");
}

// Layout 1 (before the whole tree was kept) had modules/<name>.ko + modules.order for L1 only, and
// `xpv` binaries built from older checkouts still read those from the same ~/.cache. Keep them
// present so such a binary sharing this cache still boots L1 (they only check `complete`).
void write_layout1_compat(const fs::path& dir, const Kernel& k) {
  if (fs::exists(dir / "modules.order")) return;
  fs::create_directories(dir / "modules");
  std::string order;
  for (const auto& m : k.modules) {
    const std::string base = fs::path(m).filename().string();
    fs::copy_file(m, dir / "modules" / base, fs::copy_options::overwrite_existing);
    order += base + "\n";
  }
  write_text(dir / "modules.order.tmp", order);
  fs::rename(dir / "modules.order.tmp", dir / "modules.order");
}

Kernel load_cached(const fs::path& dir) {
  Kernel k;
  k.dir = dir.string();
  k.version = dir.filename().string();
  k.vmlinuz = (dir / "vmlinuz").string();
  k.modules_dir = (dir / "lib" / "modules" / k.version).string();
  k.package = first_line(read_text(dir / "package"));
  k.package_version = first_line(read_text(dir / "package-version"));
  k.deb_sha256 = first_line(read_text(dir / "deb.sha256"));
  k.modules = resolve_modules(k, kL1Modules);
  for (const auto& m : k.modules) {
    if (!fs::exists(m)) die(fmt::format("kernel cache {}: {} is missing", k.dir, m));
  }
  write_layout1_compat(dir, k);
  return k;
}

void fetch(const std::string& pkg, const std::string& version, const fs::path& root,
           const fs::path& dir) {
  fmt::print(stderr, "xpv: fetching {} with apt-get download (once; cached in {})\n", pkg,
             dir.string());
  const fs::path work = root / (version + ".partial");
  fs::remove_all(work);
  fs::create_directories(work);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{work};
  auto dl = capture({"apt-get", "download", "-q", pkg}, work.string());
  fs::path deb;
  for (const auto& e : fs::directory_iterator(work)) {
    if (e.path().extension() == ".deb") deb = e.path();
  }
  if (dl.status != 0 || deb.empty()) {
    die(fmt::format("`apt-get download {}` failed (exit {}):\n{}", pkg, dl.status,
                    last_lines(dl.err + dl.out, 8)));
  }
  auto ver = capture({"dpkg-deb", "-f", deb.string(), "Version"});
  auto sum = capture({"sha256sum", deb.string()});
  if (ver.status != 0 || sum.status != 0) die(fmt::format("cannot read {} (dpkg-deb, sha256sum)", deb.string()));
  const fs::path stage = work / "stage";
  fs::create_directories(stage);
  auto ex = capture({"sh", "-c",
                     fmt::format("dpkg-deb --fsys-tarfile {} | tar -x -C {} ./boot ./lib/modules",
                                 shell_quote(deb.string()), shell_quote(stage.string()))});
  const fs::path vmlinuz = stage / "boot" / ("vmlinuz-" + version);
  if (ex.status != 0 || !fs::exists(vmlinuz)) {
    die(fmt::format("cannot extract {} (exit {}):\n{}", deb.string(), ex.status, last_lines(ex.err, 8)));
  }
  auto dep = capture({"depmod", "-b", stage.string(), version});
  if (dep.status != 0 || !fs::exists(stage / "lib" / "modules" / version / "modules.dep")) {
    die(fmt::format("`depmod -b` failed for {} (is kmod installed?):\n{}", version,
                    last_lines(dep.err, 8)));
  }
  fs::rename(vmlinuz, stage / "vmlinuz");
  fs::remove_all(stage / "boot");
  fs::remove(deb);
  write_text(stage / "package", pkg + "\n");
  write_text(stage / "package-version", first_line(ver.out) + "\n");
  write_text(stage / "deb.sha256", first_line(sum.out).substr(0, 64) + "\n");
  write_text(stage / "complete", kLayout);
  // Replace the old entry (e.g. an older layout, or one whose vmlinuz went missing) atomically
  // enough: a reader holds the same lock.
  fs::remove_all(dir);
  fs::rename(stage, dir);
}

}  // namespace

std::string cache_root() {
  if (const char* c = std::getenv("XPV_CACHE"); c != nullptr && *c != '\0') return c;
  const char* home = std::getenv("HOME");
  return (fs::path(home != nullptr && *home != '\0' ? home : "/root") / ".cache" / "xpv").string();
}

std::string module_name(const std::string& path) {
  std::string base = fs::path(path).filename().string();
  if (auto dot = base.find(".ko"); dot != std::string::npos) base.resize(dot);
  for (auto& ch : base) {
    if (ch == '-') ch = '_';
  }
  return base;
}

std::map<std::string, ModuleDep> parse_modules_dep(const std::string& text) {
  std::map<std::string, ModuleDep> mods;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto colon = line.find(':');
    if (colon == std::string::npos || colon == 0) continue;
    ModuleDep mi;
    mi.path = line.substr(0, colon);
    std::istringstream rest(line.substr(colon + 1));
    for (std::string d; rest >> d;) mi.deps.push_back(d);
    mods[module_name(mi.path)] = std::move(mi);
  }
  return mods;
}

std::vector<std::string> order_modules(const std::map<std::string, ModuleDep>& dep,
                                       const std::vector<std::string>& names) {
  // Dependencies first (depth-first, post-order), each module once. modules.dep already lists the
  // transitive closure, but walking it keeps the order right for any input.
  std::vector<std::string> order;
  std::set<std::string> done;
  std::set<std::string> active;
  std::function<void(const std::string&, const std::string&)> visit =
      [&](const std::string& name, const std::string& wanted_by) {
        if (done.count(name) != 0) return;
        if (active.count(name) != 0) die("module dependency loop at " + name);
        auto it = dep.find(name);
        if (it == dep.end()) {
          die(fmt::format("module {} is not in the kernel's modules.dep (built in? renamed?){}", name,
                          wanted_by.empty() ? "" : " — needed by " + wanted_by));
        }
        active.insert(name);
        for (const auto& d : it->second.deps) visit(module_name(d), name);
        active.erase(name);
        done.insert(name);
        order.push_back(it->second.path);
      };
  for (const auto& n : names) visit(module_name(n), "");
  return order;
}

std::vector<std::string> resolve_modules(const Kernel& k, const std::vector<std::string>& names) {
  const fs::path depfile = fs::path(k.modules_dir) / "modules.dep";
  if (!fs::exists(depfile)) die(fmt::format("{} is missing (kernel cache incomplete)", depfile.string()));
  std::vector<std::string> out;
  for (const auto& rel : order_modules(parse_modules_dep(read_text(depfile)), names)) {
    out.push_back((fs::path(k.modules_dir) / rel).string());
  }
  return out;
}

Kernel ensure_kernel() {
  const fs::path root = fs::path(cache_root()) / "kernel";
  const std::string pkg = resolve_package();
  CacheLock lock(root);
  if (pkg.empty()) {
    // Offline fallback: exactly one complete cached kernel is unambiguous.
    std::vector<fs::path> cached;
    if (fs::is_directory(root)) {
      for (const auto& e : fs::directory_iterator(root)) {
        if (e.is_directory() && entry_valid(e.path())) cached.push_back(e.path());
      }
    }
    if (cached.size() == 1) return load_cached(cached.front());
    die("cannot resolve the Debian kernel package: `apt-cache depends linux-image-amd64` gave no "
        "linux-image-* dependency (run `apt-get update`, or set XPV_TESTBED_KERNEL_PKG)");
  }
  const std::string prefix = "linux-image-";
  if (pkg.rfind(prefix, 0) != 0) die(fmt::format("kernel package {}: expected linux-image-<version>", pkg));
  const std::string version = pkg.substr(prefix.size());
  const fs::path dir = root / version;
  if (!entry_valid(dir)) {
    if (fs::exists(dir)) {
      fmt::print(stderr, "xpv: kernel cache {} is incomplete or of an older layout; fetching again\n",
                 dir.string());
    }
    fetch(pkg, version, root, dir);
  }
  return load_cached(dir);
}

}  // namespace xpv::testbed
