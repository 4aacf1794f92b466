#include "xpv/config/domain_config.h"

#include <fmt/core.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "xpv/config/error.h"
#include "xpv/config/xl_parser.h"

namespace xpv::config {
namespace {

// xl settings that describe emulated hardware or display xpv does not provide.
const std::set<std::string_view> kIgnoredXlKeys = {
    "vnc", "vnclisten", "vncpasswd", "sdl", "opengl", "serial", "boot", "stdvga", "vga",
    "videoram", "usb", "usbdevice", "acpi", "apic", "pae", "hap", "viridian", "device_model_version",
    "localtime", "rtc_timeoffset", "xen_platform_pci", "cpus_soft", "uuid"};

// Why `p` cannot be booted from (kernel, ramdisk), or "" when it can.
std::string boot_file_problem(const std::string& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return "does not exist";
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  return "";
}

// The names xl accepts for one setting: the second of them in a file is as much a repeat as the
// same key twice (xl: "Contradicting \"builder\" and \"type\" options specified"). Not
// cmdline/extra: xl takes both and lets cmdline win, with a warning; so does this parser.
std::string_view canonical_key(std::string_view key) {
  if (key == "builder") return "type";
  return key;
}

}  // namespace

std::string disk_target_problem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "does not exist";
  if (S_ISBLK(st.st_mode)) return "";
  if (!S_ISREG(st.st_mode)) return "is not a regular file or block device";
  if (st.st_size <= 0 || st.st_size % 512 != 0) {
    return fmt::format("is {} bytes, not a positive multiple of 512", static_cast<long long>(st.st_size));
  }
  return "";
}

std::string absolute_path(const std::string& path) {
  if (path.empty() || path.front() == '/') return path;
  // Not normalised: "dir/../x" with dir a symbolic link names what the checks looked at only as
  // written. Throws ConfigError when the working directory is gone.
  std::error_code ec;
  const auto cwd = std::filesystem::current_path(ec);
  if (ec) throw ConfigError(fmt::format("'{}' is relative and the working directory is unknown: {}", path, ec.message()));
  return (cwd / path).string();
}

std::optional<std::uint64_t> parse_memory_kib(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 19 || text.size() - digits > 1) return std::nullopt;
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < digits; ++i) v = v * 10 + static_cast<std::uint64_t>(text[i] - '0');
  const char unit = digits < text.size() ? static_cast<char>(text[digits] | 0x20) : 'm';
  unsigned shift = 0;  // KiB = v << shift (or v >> 10 for bytes)
  switch (unit) {
    case 'b': return v >> 10;
    case 'k': shift = 0; break;
    case 'm': shift = 10; break;
    case 'g': shift = 20; break;
    case 't': shift = 30; break;
    default: return std::nullopt;
  }
  if (shift != 0 && v > (UINT64_MAX >> shift)) return std::nullopt;
  return v << shift;
}

bool valid_domain_name(std::string_view name) {
  if (name.empty() || name.size() > 64 || name[0] == '-') return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  // Domain-0 is dom0's name; an all-digit name would be taken for a domain id by the CLI.
  if (name == "Domain-0" || name.find_first_not_of("0123456789") == std::string_view::npos) return false;
  return true;
}

const char* to_string(LifecycleAction a) noexcept {
  switch (a) {
    case LifecycleAction::restart: return "restart";
    case LifecycleAction::preserve: return "preserve";
    case LifecycleAction::destroy: break;
  }
  return "destroy";
}

DomainConfig parse_domain_config(std::string_view text, const std::string& source, bool check_files) {
  DomainConfig c;
  const auto entries = parse_xl(text, source);
  bool have_memory = false;
  // Each setting's key and line as the file gives them, under its canonical name (type for
  // builder): for the checks after the loop, which name the line too.
  std::map<std::string, std::pair<std::string, int>, std::less<>> given;
  // `cpus` as given: one list for every vCPU, or one per vCPU (vcpus may come later in the file).
  std::optional<kvm::CpuList> cpus_all;
  std::vector<kvm::CpuList> cpus_each;
  for (const XlEntry& e : entries) {
    auto where = [&]() { return fmt::format("{}:{}: '{}'", source, e.line, e.key); };
    auto err = [&](const std::string& why) { return ConfigError(where() + ": " + why); };
    auto str = [&]() -> const std::string& {
      if (!e.value.is_string()) throw err("must be a quoted string");
      return std::get<std::string>(e.value.v);
    };
    auto num = [&](std::int64_t lo, std::int64_t hi) {
      if (!e.value.is_int()) throw err("must be a number");
      auto v = std::get<std::int64_t>(e.value.v);
      if (v < lo || v > hi) throw err(fmt::format("{} is out of range {}..{}", v, lo, hi));
      return v;
    };
    auto list = [&]() -> const std::vector<std::string>& {
      if (!e.value.is_list()) throw err("must be a list of quoted strings: [ '...', '...' ]");
      return std::get<std::vector<std::string>>(e.value.v);
    };
    auto action = [&]() {
      const std::string& s = str();
      if (s == "destroy") return LifecycleAction::destroy;
      if (s == "restart") return LifecycleAction::restart;
      if (s == "preserve") return LifecycleAction::preserve;
      throw err(fmt::format("'{}' is not one of destroy, restart, preserve", s));
    };

    const std::string_view canon = canonical_key(e.key);
    if (auto [it, fresh] = given.try_emplace(std::string(canon), e.key, e.line); !fresh) {
      // parse_xl refused the same key twice; this is the other name of one already given.
      throw err(fmt::format("is another name for '{}' (line {}): give one of them", it->second.first, it->second.second));
    }
    if (e.key == "name") {
      c.name = str();
      if (!valid_domain_name(c.name)) {
        throw err(fmt::format("'{}' is not a valid domain name (1..64 of A-Z a-z 0-9 _ . -, not all digits)", c.name));
      }
    } else if (e.key == "type" || e.key == "builder") {
      const std::string& t = str();
      if (t == "process") c.type = DomainType::process;
      else if (t == "hvm") c.type = DomainType::hvm;
      else if (t == "pv" || t == "pvh" || t == "generic" || t == "linux") {
        throw err(fmt::format("'{}' guests are not supported by xpv (use \"hvm\" or \"process\")", t));
      } else {
        throw err(fmt::format("'{}' is not one of process, hvm", t));
      }
    } else if (e.key == "memory") {
      c.memory_mib = static_cast<std::uint64_t>(num(1, 1 << 20));
      have_memory = true;
    } else if (e.key == "maxmem") {
      c.maxmem_mib = static_cast<std::uint64_t>(num(1, 1 << 20));
    } else if (e.key == "vcpus") {
      c.vcpus = static_cast<unsigned>(num(1, 128));
    } else if (e.key == "cpus") {
      auto cpu_list = [&](const std::string& spec, const std::string& what) {
        auto l = kvm::parse_cpu_list(spec);
        if (!l) throw err(what + l.error().message);
        return *l;
      };
      if (e.value.is_string()) {
        cpus_all = cpu_list(str(), "");
      } else if (e.value.is_int()) {  // cpus = 2, as xl takes it
        cpus_all = cpu_list(std::to_string(std::get<std::int64_t>(e.value.v)), "");
      } else if (e.value.is_list()) {
        const auto& items = list();
        if (items.empty()) throw err("an empty list places no vCPU: leave 'cpus' out");
        for (std::size_t i = 0; i < items.size(); ++i) cpus_each.push_back(cpu_list(items[i], fmt::format("item {}: ", i)));
      } else {
        throw err("must be a CPU list (\"0-3,^1\") or a list of them, one per vCPU ([\"2\", \"3\"])");
      }
    } else if (e.key == "cpu_weight") {
      c.cpu_weight = static_cast<std::uint32_t>(num(1, 65535));  // xl's range
    } else if (e.key == "cap") {
      c.cap = static_cast<std::uint32_t>(num(0, 100 * 1024));  // % of one CPU; 0 = none
    } else if (e.key == "kernel") {
      c.kernel = str();
    } else if (e.key == "ramdisk") {
      c.ramdisk = str();
    } else if (e.key == "cmdline") {
      c.extra = str();
    } else if (e.key == "extra") {
      if (!given.contains("cmdline")) c.extra = str();  // cmdline, given first, wins
    } else if (e.key == "upcall") {
      const std::string& u = str();
      if (u == "vector") c.upcall = Upcall::vector;
      else if (u == "callback") c.upcall = Upcall::callback;
      else if (u == "intx") c.upcall = Upcall::intx;
      else throw err(fmt::format("'{}' is not one of vector, callback, intx", u));
    } else if (e.key == "on_poweroff") {
      c.on_poweroff = action();
    } else if (e.key == "on_reboot") {
      c.on_reboot = action();
    } else if (e.key == "on_crash") {
      c.on_crash = action();
    } else if (e.key == "disk") {
      const auto& items = list();
      for (std::size_t i = 0; i < items.size(); ++i) {
        try {
          c.disks.push_back(parse_disk_spec(items[i]));
        } catch (const ConfigError& ex) {
          throw err(fmt::format("item {}: {}", i, ex.what()));
        }
      }
    } else if (e.key == "vif") {
      const auto& items = list();
      for (std::size_t i = 0; i < items.size(); ++i) {
        try {
          c.vifs.push_back(parse_vif_spec(items[i]));
        } catch (const ConfigError& ex) {
          throw err(fmt::format("item {}: {}", i, ex.what()));
        }
      }
    } else if (kIgnoredXlKeys.count(e.key)) {
      c.warnings.push_back(where() + " has no meaning for xpv; ignored");
    } else {
      throw err("unknown setting");
    }
  }

  auto fail_at = [&](const std::string& why) { return ConfigError(fmt::format("{}: {}", source, why)); };
  // An error about a setting the file gives: its line and key.
  auto fail_on = [&](std::string_view canon, const std::string& why) {
    const auto it = given.find(canon);
    if (it == given.end()) return fail_at(why);
    return ConfigError(fmt::format("{}:{}: '{}': {}", source, it->second.second, it->second.first, why));
  };
  if (c.name.empty()) throw fail_at("'name' is required");
  if (!have_memory) c.memory_mib = c.type == DomainType::hvm ? 512 : 128;
  if (c.maxmem_mib != 0 && c.type != DomainType::hvm) {
    throw fail_on("maxmem", "makes sense only for type = \"hvm\" (a process domain has no balloon driver)");
  }
  if (c.maxmem_mib != 0 && c.maxmem_mib < c.memory_mib) {
    throw fail_on("maxmem", fmt::format("{} MiB is below 'memory' ({} MiB)", c.maxmem_mib, c.memory_mib));
  }
  if (c.maxmem_mib == 0) c.maxmem_mib = c.memory_mib;
  if (given.contains("cmdline") && given.contains("extra")) {
    // As xl: the whole command line given wins over what would be appended (c.extra is
    // cmdline's already, whichever came first).
    c.warnings.push_back(fmt::format("{}:{}: 'extra' ignored in favour of 'cmdline' (line {}), as xl does", source,
                                     given.find("extra")->second.second, given.find("cmdline")->second.second));
  }
  if (c.type == DomainType::hvm) {
    if (c.kernel.empty()) throw fail_at("an hvm domain needs 'kernel' (xpv boots Linux directly)");
  } else {
    // What only an hvm guest's kernel reads, when it says something: refused rather than ignored
    // for a process domain (an empty string says nothing).
    for (auto [k, v] : {std::pair{"kernel", &c.kernel}, std::pair{"ramdisk", &c.ramdisk}, std::pair{"extra", &c.extra}}) {
      if (!v->empty()) throw fail_on(given.contains(k) ? std::string_view(k) : std::string_view("cmdline"),
                                     "makes sense only for type = \"hvm\"");
    }
    if (given.contains("upcall")) throw fail_on("upcall", "makes sense only for type = \"hvm\"");
    if (given.contains("cpus")) {
      throw fail_on("cpus", "makes sense only for type = \"hvm\" (a process domain has no vCPU threads to place)");
    }
  }
  if (cpus_all) c.vcpu_affinity.assign(c.vcpus, *cpus_all);
  if (!cpus_each.empty()) {
    if (cpus_each.size() > c.vcpus) {
      const auto& at = given.find("cpus")->second;
      c.warnings.push_back(fmt::format("{}:{}: 'cpus': {} CPU lists for {} vCPU(s); the last {} ignored", source,
                                       at.second, cpus_each.size(), c.vcpus, cpus_each.size() - c.vcpus));
      cpus_each.resize(c.vcpus);
    }
    c.vcpu_affinity = std::move(cpus_each);
  }
  std::set<std::uint32_t> devids;
  for (const DiskSpec& d : c.disks) {
    if (!devids.insert(d.vdev.devid).second) throw fail_on("disk", fmt::format("disk {} is given twice", d.vdev.name));
  }
  std::set<std::string> macs;
  for (const VifSpec& v : c.vifs) {
    if (v.mac && !macs.insert(v.mac->str()).second) {
      throw fail_on("vif", fmt::format("MAC {} is given to two vifs", v.mac->str()));
    }
  }
  if (check_files && !c.vcpu_affinity.empty()) {
    // A set this process (and so xpv-vmm, which inherits its placement) may not run on would stop
    // the vCPU as it starts: refused here, with the line.
    const auto allowed = kvm::cpus_of_thread(0);
    if (!allowed) throw fail_on("cpus", "cannot read the CPUs this process may use: " + allowed.error().message);
    for (std::size_t i = 0; i < c.vcpu_affinity.size(); ++i) {
      const kvm::CpuList& l = c.vcpu_affinity[i];
      if (l.empty() || (l.cpus & allowed->cpus).any()) continue;
      throw fail_on("cpus", fmt::format("{}none of CPUs {} may be used by xpv here (it may use {})",
                                        cpus_all ? "" : fmt::format("vCPU {}: ", i), kvm::format_cpu_list(l),
                                        kvm::format_cpu_list(*allowed)));
    }
  }
  if (check_files) {
    // Relative paths are the caller's working directory's, made absolute here: xpv-blkback, a
    // daemon, opens disk targets from "/", and a record should not depend on where it was made.
    for (auto [key, path] : {std::pair{"kernel", &c.kernel}, std::pair{"ramdisk", &c.ramdisk}}) {
      if (path->empty()) continue;
      if (auto why = boot_file_problem(*path); !why.empty()) throw fail_on(key, fmt::format("'{}' {}", *path, why));
      try {
        *path = absolute_path(*path);
      } catch (const ConfigError& e) {
        throw fail_on(key, e.what());
      }
    }
    // Two disks of one image in one domain, one of them writable, corrupt it (a writer under a
    // reader's cache, or two writers): the same file by any name (a link, another path), the same
    // block device by any node. Across domains the toolstack checks (disk_checks.h).
    std::map<std::tuple<bool, dev_t, ino_t>, bool> targets;  // (block device, device, inode) → given writable
    for (DiskSpec& d : c.disks) {
      if (auto why = disk_target_problem(d.target); !why.empty()) {
        throw fail_on("disk", fmt::format("disk {}: '{}' {}", d.vdev.name, d.target, why));
      }
      struct stat st {};
      if (::stat(d.target.c_str(), &st) == 0) {
        const bool rw = d.access == Access::rw;
        const bool blk = S_ISBLK(st.st_mode);
        const auto key = std::tuple{blk, blk ? st.st_rdev : st.st_dev, blk ? ino_t{0} : st.st_ino};
        const auto [it, fresh] = targets.emplace(key, rw);
        if (!fresh && (rw || it->second)) {
          throw fail_on("disk", fmt::format("disk {}: '{}' is given to two disks, {}", d.vdev.name, d.target,
                                            rw && it->second ? "both writable" : "one of them writable"));
        }
      }
      try {
        d.target = absolute_path(d.target);
      } catch (const ConfigError& e) {
        throw fail_on("disk", fmt::format("disk {}: {}", d.vdev.name, e.what()));
      }
    }
  }
  return c;
}

DomainConfig load_domain_config(const std::string& path, bool check_files) {
  constexpr std::size_t kMax = 1 << 20;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw ConfigError(fmt::format("{}: cannot read the configuration file: {}", path, std::strerror(errno)));
  }
  // A directory reads as empty ("'name' is required" was the message); a pipe or a device is
  // read, but no more than the limit (/dev/zero: "larger than 1 MiB").
  if (S_ISDIR(st.st_mode)) throw ConfigError(fmt::format("{}: a directory; not a domain configuration", path));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(fmt::format("{}: cannot read the configuration file", path));
  std::string text(kMax + 1, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));  // at most one byte past the limit
  if (f.bad()) throw ConfigError(fmt::format("{}: cannot read the configuration file", path));
  text.resize(static_cast<std::size_t>(f.gcount()));
  if (text.size() > kMax) throw ConfigError(fmt::format("{}: larger than 1 MiB; not a domain configuration", path));
  return parse_domain_config(text, path, check_files);
}

}  // namespace xpv::config
