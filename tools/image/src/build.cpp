// `xpv image build`: see image.h for the picture. Runs on the caller's thread; host tools run as
// child processes (xpv::testbed::capture). Throws std::runtime_error with one clear line.
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "xpv/image/cpio.h"
#include "xpv/image/image.h"
#include "xpv/image/ldd.h"
#include "xpv/testbed/kernel.h"
#include "xpv/testbed/process.h"

#ifndef XPV_IMAGE_RECIPES_DIR
#error "XPV_IMAGE_RECIPES_DIR must name frontends/guest-image in the source tree"
#endif

namespace fs = std::filesystem;
using xpv::testbed::capture;
using xpv::testbed::last_lines;

namespace xpv::image {

const std::vector<Tool> kTools = {
    {"busybox", "busybox-static", "/bin/busybox"},
    {"iperf3", "iperf3", "/usr/bin/iperf3"},
    {"bonnie++", "bonnie++", "/usr/sbin/bonnie++"},
    {"fio", "fio", "/usr/bin/fio"},
};

namespace {

constexpr int kFormat = 1;  // bump when the layout of the outputs changes

// Host programs the build itself runs, and where they come from.
const std::pair<const char*, const char*> kHostTools[] = {
    {"mke2fs", "e2fsprogs"}, {"ldd", "libc-bin"}, {"sha256sum", "coreutils"},
    {"dpkg-query", "dpkg"},  {"cp", "coreutils"},
};

const char* const kRequiredRecipes[] = {"initrd-init.sh", "rootfs-init.sh", "modules.list"};

[[noreturn]] void die(const std::string& msg) { throw std::runtime_error(msg); }

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) die(fmt::format("cannot read {}", p.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const fs::path& p, const std::string& content, fs::perms perms = fs::perms::none) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) die(fmt::format("cannot write {}", p.string()));
  if (perms != fs::perms::none) fs::permissions(p, perms);
}

// The first executable called `name` in $PATH, or "".
std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream in(path != nullptr ? path : "");
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty()) continue;
    const fs::path p = fs::path(dir) / name;
    std::error_code ec;
    if (fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0) return p.string();
  }
  return {};
}

std::string need_in_path(const std::string& name, const std::string& package) {
  std::string p = find_in_path(name);
  if (p.empty()) {
    die(fmt::format("{} not found in PATH (package {} not installed? run scripts/setup)", name, package));
  }
  return p;
}

// sha256sum over many files at once → path → hex digest.
std::map<std::string, std::string> sha256_files(const std::vector<std::string>& files) {
  std::map<std::string, std::string> out;
  if (files.empty()) return out;
  std::vector<std::string> argv = {"sha256sum", "--"};
  argv.insert(argv.end(), files.begin(), files.end());
  auto c = capture(argv);
  if (c.status != 0) die(fmt::format("sha256sum failed:\n{}", last_lines(c.err, 4)));
  std::istringstream in(c.out);
  for (std::string line; std::getline(in, line);) {
    if (line.size() > 66 && line[64] == ' ') out[line.substr(66)] = line.substr(0, 64);
  }
  for (const auto& f : files) {
    if (out.count(f) == 0) die(fmt::format("sha256sum gave no digest for {}", f));
  }
  return out;
}

std::string sha256_text(const std::string& text, const fs::path& scratch) {
  write_text(scratch, text);
  const auto sums = sha256_files({scratch.string()});
  fs::remove(scratch);
  return sums.begin()->second;
}

std::vector<std::string> module_names(const std::string& list) {
  std::vector<std::string> names;
  std::istringstream in(list);
  for (std::string line; std::getline(in, line);) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    for (std::string w; words >> w;) names.push_back(w);
  }
  return names;
}

fs::path recipes_dir(const BuildOptions& opts) {
  if (!opts.recipes.empty()) return opts.recipes;
  if (const char* r = std::getenv("XPV_IMAGE_RECIPES"); r != nullptr && *r != '\0') return r;
  return XPV_IMAGE_RECIPES_DIR;
}

fs::path cache_dir(const BuildOptions& opts) {
  if (!opts.cache.empty()) return opts.cache;
  if (const char* c = std::getenv("XPV_IMAGE_CACHE"); c != nullptr && *c != '\0') return c;
  return fs::path(testbed::cache_root()) / "images";
}

// Everything the image is made of, resolved on the host.
struct Inputs {
  fs::path recipes;
  fs::path cache;
  unsigned size_mib = 0;
  std::map<std::string, std::string> recipe_sha;     // relative name → sha256
  std::map<std::string, std::string> tool_path;      // program → host path
  std::map<std::string, std::string> pkg_version;    // Debian package → version
  std::vector<std::string> libs;                     // host paths (ld-linux included)
  std::map<std::string, std::string> file_sha;       // tool/lib host path → sha256
  testbed::Kernel kernel;
  std::vector<std::string> module_names;             // from modules.list
  std::vector<std::string> modules;                  // relative to the module tree, load order
  std::string text;                                  // inputs.txt
  std::string key;
};

Inputs gather(const BuildOptions& opts) {
  Inputs in;
  in.size_mib = opts.size_mib;
  if (in.size_mib < 64 || in.size_mib > 1024 * 1024) {
    die(fmt::format("--size {} MiB: must be between 64 and 1048576", in.size_mib));
  }
  in.recipes = recipes_dir(opts);
  in.cache = cache_dir(opts);
  for (const char* r : kRequiredRecipes) {
    if (!fs::is_regular_file(in.recipes / r)) {
      die(fmt::format("recipe {} is missing in {} (set XPV_IMAGE_RECIPES or --recipes to "
                      "frontends/guest-image)", r, in.recipes.string()));
    }
  }
  for (const auto& [prog, pkg] : kHostTools) need_in_path(prog, pkg);
  for (const auto& t : kTools) in.tool_path[t.program] = need_in_path(t.program, t.package);

  // Package versions (part of the key and the manifest).
  for (const auto& t : kTools) {
    auto q = capture({"dpkg-query", "-W", "-f=${Status}|${Version}", t.package});
    const auto bar = q.out.find('|');
    if (q.status != 0 || bar == std::string::npos || q.out.find("install ok installed") == std::string::npos) {
      die(fmt::format("{} not installed: run scripts/setup", t.package));
    }
    in.pkg_version[t.package] = q.out.substr(bar + 1);
  }

  // busybox must be the static one: /init runs it before any library exists.
  {
    auto l = capture({"ldd", in.tool_path["busybox"]});
    if (l.status == 0 && l.out.find("statically linked") == std::string::npos) {
      die(fmt::format("{} is dynamically linked: install busybox-static (scripts/setup)",
                      in.tool_path["busybox"]));
    }
  }
  std::set<std::string> seen;
  for (const auto& t : kTools) {
    if (std::string(t.program) == "busybox") continue;
    auto l = capture({"ldd", in.tool_path[t.program]});
    if (l.status != 0) die(fmt::format("ldd {} failed:\n{}", in.tool_path[t.program], last_lines(l.err + l.out, 4)));
    const auto r = parse_ldd(l.out);
    if (!r.missing.empty()) {
      die(fmt::format("{} needs {} which ldd cannot find on this host", t.program, r.missing.front()));
    }
    for (const auto& p : r.paths) {
      if (seen.insert(p).second) in.libs.push_back(p);
    }
  }

  in.kernel = testbed::ensure_kernel();
  in.module_names = module_names(read_text(in.recipes / "modules.list"));
  if (in.module_names.empty()) die(fmt::format("{}/modules.list names no module", in.recipes.string()));
  for (const auto& abs : testbed::resolve_modules(in.kernel, in.module_names)) {
    in.modules.push_back(fs::path(abs).lexically_relative(in.kernel.modules_dir).string());
  }

  std::vector<std::string> files;
  for (const auto& [prog, path] : in.tool_path) files.push_back(path);
  files.insert(files.end(), in.libs.begin(), in.libs.end());
  in.file_sha = sha256_files(files);
  std::vector<std::string> recipe_paths;
  for (const auto& r : recipe_files(in.recipes.string())) recipe_paths.push_back((in.recipes / r).string());
  const auto rsha = sha256_files(recipe_paths);
  for (const auto& r : recipe_files(in.recipes.string())) in.recipe_sha[r] = rsha.at((in.recipes / r).string());

  std::string t = fmt::format("xpv-image format {}\nroot-size-mib {}\n", kFormat, in.size_mib);
  t += fmt::format("kernel {} {} {}\n", in.kernel.package, in.kernel.package_version, in.kernel.deb_sha256);
  for (const auto& [pkg, ver] : in.pkg_version) t += fmt::format("package {} {}\n", pkg, ver);
  for (const auto& [path, sha] : in.file_sha) t += fmt::format("file {} {}\n", path, sha);
  for (const auto& [name, sha] : in.recipe_sha) t += fmt::format("recipe {} {}\n", name, sha);
  for (const auto& m : in.modules) t += fmt::format("module {}\n", m);
  in.text = t;
  fs::create_directories(in.cache);
  in.key = sha256_text(t, in.cache / fmt::format(".inputs-{}.txt", getpid())).substr(0, 16);
  return in;
}

Image image_at(const fs::path& dir, const std::string& key) {
  Image im;
  im.key = key;
  im.dir = dir.string();
  im.vmlinuz = (dir / "vmlinuz").string();
  im.initrd = (dir / "initrd.cpio").string();
  im.root = (dir / "root.ext4").string();
  im.manifest = (dir / "manifest.json").string();
  im.built = fs::exists(im.manifest) && fs::exists(im.vmlinuz) && fs::exists(im.initrd) && fs::exists(im.root);
  return im;
}

void build_initrd(const Inputs& in, const fs::path& out) {
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  if (!f) die(fmt::format("cannot create {}", out.string()));
  CpioWriter w(f);
  for (const char* d : {"dev", "proc", "sys", "newroot", "bin", "sbin", "usr/bin", "usr/sbin", "etc/xpv"}) w.dir(d);
  w.char_dev("dev/console", 0600, 5, 1);  // the kernel opens it for PID 1's stdio
  w.file("bin/busybox", read_text(in.tool_path.at("busybox")), 0755);
  w.file("init", read_text(in.recipes / "initrd-init.sh"), 0755);
  w.file("etc/xpv/kernel-version", in.kernel.version + "\n");
  std::string list;
  const fs::path moddir = fs::path("lib/modules") / in.kernel.version;
  for (const auto& rel : in.modules) {
    list += testbed::module_name(rel) + " " + rel + "\n";
    w.file((moddir / rel).string(), read_text(fs::path(in.kernel.modules_dir) / rel), 0644);
  }
  w.file("etc/xpv/modules", list);
  w.finish();
  f.close();
  if (!f) die(fmt::format("cannot write {}", out.string()));
}

void copy_into(const fs::path& host, const fs::path& stage, const std::string& guest, fs::perms perms) {
  const fs::path dst = stage / fs::path(guest).relative_path();
  fs::create_directories(dst.parent_path());
  fs::copy_file(host, dst, fs::copy_options::overwrite_existing);  // follows symlinks: real content
  fs::permissions(dst, perms);
}

void build_root(const Inputs& in, const fs::path& stage, const fs::path& out) {
  const auto exec_perms = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                          fs::perms::others_read | fs::perms::others_exec;
  const auto file_perms = fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                          fs::perms::others_read;
  for (const char* d : {"bin", "sbin", "usr/bin", "usr/sbin", "lib", "lib64", "etc/xpv/fio", "proc",
                        "sys", "dev", "run", "mnt", "root", "tmp", "var/tmp"}) {
    fs::create_directories(stage / d);
  }
  fs::permissions(stage / "root", fs::perms::owner_all);
  fs::permissions(stage / "tmp", fs::perms::all | fs::perms::sticky_bit);
  fs::permissions(stage / "var/tmp", fs::perms::all | fs::perms::sticky_bit);
  for (const auto& t : kTools) copy_into(in.tool_path.at(t.program), stage, t.guest_path, exec_perms);
  for (const auto& lib : in.libs) copy_into(lib, stage, lib, exec_perms);
  copy_into(in.recipes / "rootfs-init.sh", stage, "/sbin/init", exec_perms);
  if (fs::is_directory(in.recipes / "fio")) {
    for (const auto& r : recipe_files(in.recipes.string())) {
      if (r.rfind("fio/", 0) == 0) copy_into(in.recipes / r, stage, "/etc/xpv/" + r, file_perms);
    }
  }
  // busybox applets as symlinks, except where a real program or our init lives.
  auto list = capture({in.tool_path.at("busybox"), "--list-full"});
  if (list.status != 0) die("busybox --list-full failed");
  std::istringstream applets(list.out);
  for (std::string a; std::getline(applets, a);) {
    if (a.empty() || a.find('/') == std::string::npos) continue;  // "linuxrc"
    const fs::path link = stage / a;
    std::error_code ec;
    if (fs::exists(fs::symlink_status(link, ec))) continue;
    fs::create_directories(link.parent_path());
    fs::create_symlink("/bin/busybox", link);
  }
  write_text(stage / "etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", file_perms);
  write_text(stage / "etc/group", "root:x:0:\n", file_perms);
  write_text(stage / "etc/shadow", "root:*:19000:0:99999:7:::\n", fs::perms::owner_read | fs::perms::owner_write);
  write_text(stage / "etc/nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files\n", file_perms);
  write_text(stage / "etc/hosts", "127.0.0.1 localhost\n127.0.1.1 xpv-guest\n", file_perms);
  write_text(stage / "etc/hostname", "xpv-guest\n", file_perms);
  write_text(stage / "etc/xpv/image", fmt::format("key {}\nkernel {}\n", in.key, in.kernel.version), file_perms);

  auto m = capture({"mke2fs", "-t", "ext4", "-F", "-q", "-L", "xpv-root", "-E", "root_owner=0:0", "-d",
                    stage.string(), out.string(), fmt::format("{}M", in.size_mib)});
  if (m.status != 0) {
    die(fmt::format("mke2fs -d failed for a {} MiB root disk (too small? use --size):\n{}", in.size_mib,
                    last_lines(m.err + m.out, 6)));
  }
}

void write_manifest(const Inputs& in, const fs::path& dir) {
  using nlohmann::ordered_json;
  ordered_json j;
  j["format"] = kFormat;
  j["key"] = in.key;
  j["kernel"] = {{"package", in.kernel.package},
                 {"version", in.kernel.version},
                 {"package_version", in.kernel.package_version},
                 {"deb_sha256", in.kernel.deb_sha256}};
  j["packages"] = ordered_json::object();
  for (const auto& [pkg, ver] : in.pkg_version) j["packages"][pkg] = ver;
  j["programs"] = ordered_json::array();
  for (const auto& t : kTools) {
    const auto& p = in.tool_path.at(t.program);
    j["programs"].push_back({{"name", t.program}, {"package", t.package}, {"host_path", p},
                             {"guest_path", t.guest_path}, {"sha256", in.file_sha.at(p)}});
  }
  j["libraries"] = ordered_json::array();
  for (const auto& l : in.libs) j["libraries"].push_back({{"path", l}, {"sha256", in.file_sha.at(l)}});
  j["recipes"] = ordered_json::object();
  j["recipes"]["dir"] = in.recipes.string();
  for (const auto& [name, sha] : in.recipe_sha) j["recipes"]["files"][name] = sha;
  j["initrd_modules"] = in.modules;
  j["root_size_mib"] = in.size_mib;
  const char* outs[] = {"vmlinuz", "initrd.cpio", "root.ext4"};
  std::vector<std::string> paths;
  for (const char* o : outs) paths.push_back((dir / o).string());
  const auto sums = sha256_files(paths);
  for (const char* o : outs) {
    const fs::path p = dir / o;
    j["outputs"][o] = {{"size", fs::file_size(p)}, {"sha256", sums.at(p.string())}};
  }
  j["cmdline_example"] =
      "console=ttyS0 root=/dev/xvda panic=-1 xpv.run=selftest xpv.ip=10.0.0.2/24 xpv.wait=20";
  write_text(dir / "manifest.json", j.dump(2) + "\n");
}

void copy_out(const Image& im, const fs::path& out) {
  fs::create_directories(out);
  for (const auto& f : {im.vmlinuz, im.initrd, im.manifest}) {
    fs::copy_file(f, out / fs::path(f).filename(), fs::copy_options::overwrite_existing);
  }
  auto c = capture({"cp", "--sparse=always", im.root, (out / "root.ext4").string()});
  if (c.status != 0) die(fmt::format("cannot copy root.ext4 to {}:\n{}", out.string(), last_lines(c.err, 4)));
}

// Removes a directory tree on scope exit (the half-built image, on any failure).
struct RemoveOnExit {
  fs::path p;
  ~RemoveOnExit() {
    std::error_code ec;
    if (!p.empty()) fs::remove_all(p, ec);
  }
};

}  // namespace

std::vector<std::string> recipe_files(const std::string& recipes_dir) {
  std::vector<std::string> out;
  const fs::path d = recipes_dir;
  for (const char* r : kRequiredRecipes) {
    if (fs::is_regular_file(d / r)) out.push_back(r);
  }
  if (fs::is_directory(d / "fio")) {
    for (const auto& e : fs::directory_iterator(d / "fio")) {
      if (e.is_regular_file() && e.path().extension() == ".fio") out.push_back("fio/" + e.path().filename().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

Image locate(const BuildOptions& opts) {
  const Inputs in = gather(opts);
  return image_at(in.cache / in.key, in.key);
}

Image build(const BuildOptions& opts) {
  const Inputs in = gather(opts);
  const fs::path final_dir = in.cache / in.key;
  Image im = image_at(final_dir, in.key);
  if (im.built && !opts.force) {
    fmt::print(stderr, "xpv image: cached {} (kernel {})\n", final_dir.string(), in.kernel.version);
    im.cached = true;
    if (!opts.out_dir.empty()) copy_out(im, opts.out_dir);
    return im;
  }
  fmt::print(stderr, "xpv image: building {} (kernel {}, {} MiB root disk)\n", final_dir.string(),
             in.kernel.version, in.size_mib);
  const fs::path tmp = in.cache / fmt::format(".tmp-{}-{}", in.key, getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  RemoveOnExit guard{tmp};
  fs::copy_file(in.kernel.vmlinuz, tmp / "vmlinuz");
  build_initrd(in, tmp / "initrd.cpio");
  build_root(in, tmp / "stage", tmp / "root.ext4");
  fs::remove_all(tmp / "stage");
  write_text(tmp / "inputs.txt", in.text);
  write_manifest(in, tmp);

  // Into place: an existing (forced) entry is moved aside first, then removed.
  const fs::path old = in.cache / fmt::format(".old-{}-{}", in.key, getpid());
  RemoveOnExit old_guard{old};
  std::error_code ec;
  if (fs::exists(final_dir)) fs::rename(final_dir, old);
  fs::rename(tmp, final_dir, ec);
  if (ec) {
    // Another `xpv image build` of the same key won the race: use its result.
    if (!image_at(final_dir, in.key).built) die(fmt::format("cannot rename {} to {}: {}", tmp.string(), final_dir.string(), ec.message()));
  } else {
    guard.p.clear();
  }
  im = image_at(final_dir, in.key);
  if (!opts.out_dir.empty()) copy_out(im, opts.out_dir);
  return im;
}

}  // namespace xpv::image
