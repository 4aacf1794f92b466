#include "xpv/toolstack/cpu_sched.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "xpv/toolstack/error.h"
#include "xpv/toolstack/fs.h"
#include "xpv/toolstack/text.h"

namespace xpv::toolstack {
namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t at = 0;
  while (true) {
    const std::size_t next = s.find(sep, at);
    out.push_back(s.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at));
    if (next == std::string_view::npos) return out;
    at = next + 1;
  }
}

// mountinfo writes space, tab, newline and backslash in a path as \ooo.
std::string unescape_octal(std::string_view s) {
  std::string out;
  const auto octal = [&](std::size_t k) { return s[k] >= '0' && s[k] <= '7'; };
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
      continue;
    }
    out.push_back(s[i]);
  }
  return out;
}

bool lists(std::string_view comma_list, std::string_view word) {
  for (auto w : split(comma_list, ',')) {
    if (w == word) return true;
  }
  return false;
}

bool host_v2_has_cpu(const std::string& mount) {
  const auto text = read_file(mount + "/cgroup.controllers");
  if (!text) return false;
  std::istringstream in(*text);
  for (std::string w; in >> w;) {
    if (w == "cpu") return true;
  }
  return false;
}

// Writes `value` to an existing cgroup file; "" or why not.
std::string write_knob(const std::string& path, const std::string& value) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return std::strerror(errno);
  const ssize_t n = ::write(fd, value.data(), value.size());
  const int err = errno;
  ::close(fd);
  if (n < 0) return std::strerror(err);
  if (static_cast<std::size_t>(n) != value.size()) return "short write";
  return "";
}

}  // namespace

std::string cpu_sched_problem(const CpuSched& s) {
  if (s.weight < 1 || s.weight > kMaxWeight) return fmt::format("weight {} is out of range 1..{}", s.weight, kMaxWeight);
  if (s.cap > kMaxCap) return fmt::format("cap {} is out of range 0..{} (% of one CPU)", s.cap, kMaxCap);
  return "";
}

std::optional<CpuHierarchy> find_cpu_hierarchy(std::string_view mountinfo, bool (*v2_has_cpu)(const std::string&)) {
  std::optional<CpuHierarchy> v2;
  for (auto line : split(mountinfo, '\n')) {
    const auto f = split(line, ' ');
    // id parent dev root mountpoint options [optional…] - fstype source superoptions
    if (f.size() < 10) continue;  // 6 fields, "-", 3 fields
    const auto dash = std::find(f.begin() + 6, f.end(), std::string_view("-"));
    if (dash == f.end() || f.end() - dash < 4) continue;
    const std::string_view fstype = dash[1], super = dash[3];
    // A mount of a subtree (a bind mount, a container's view) is not the hierarchy's root:
    // its top may hold processes, and /proc/<pid>/cgroup paths are not relative to it.
    if (f[3] != "/") continue;
    const std::string mount = unescape_octal(f[4]);
    if (fstype == "cgroup" && lists(super, "cpu")) return CpuHierarchy{CgroupVersion::v1, mount};
    if (fstype == "cgroup2" && !v2 && v2_has_cpu(mount)) v2 = CpuHierarchy{CgroupVersion::v2, mount};
  }
  return v2;
}

std::optional<CpuHierarchy> host_cpu_hierarchy() {
  const auto text = read_file("/proc/self/mountinfo");
  if (!text) return std::nullopt;
  return find_cpu_hierarchy(*text, host_v2_has_cpu);
}

std::uint64_t v1_shares(std::uint32_t weight) { return std::uint64_t{weight} * 4; }
std::uint32_t weight_from_v1_shares(std::uint64_t shares) {
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(shares / 4, 1, kMaxWeight));
}
std::uint32_t v2_weight(std::uint32_t weight) {
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>((std::uint64_t{weight} * 100 + 128) / 256, 1, 10000));
}
std::string v1_quota(std::uint32_t cap) {
  return cap == 0 ? std::string("-1") : std::to_string(std::uint64_t{cap} * kCapPeriodUs / 100);
}
std::string v2_max(std::uint32_t cap) {
  return fmt::format("{} {}", cap == 0 ? std::string("max") : std::to_string(std::uint64_t{cap} * kCapPeriodUs / 100),
                     kCapPeriodUs);
}

DomainCgroup::DomainCgroup(CpuHierarchy h, std::string leaf)
    : h_(std::move(h)), parent_(h_.mount + "/xpv"), path_(parent_ + "/" + leaf) {}

std::optional<DomainCgroup> DomainCgroup::at(const CpuHierarchy& h, const std::string& path) {
  const std::string prefix = h.mount + "/xpv/";
  if (!path.starts_with(prefix)) return std::nullopt;
  const std::string leaf = path.substr(prefix.size());
  if (leaf.empty() || leaf == "." || leaf == ".." || leaf.find('/') != std::string::npos) return std::nullopt;
  return DomainCgroup(h, leaf);
}

void DomainCgroup::prepare() const {
  auto enable_cpu = [&](const std::string& dir) {
    // v2: a cgroup's children get the cpu controller's files only once it hands it down.
    const std::string f = dir + "/cgroup.subtree_control";
    if (const auto now = read_file(f)) {
      std::istringstream in(*now);
      for (std::string w; in >> w;) {
        if (w == "cpu") return;
      }
    }
    if (auto why = write_knob(f, "+cpu"); !why.empty()) {
      throw ToolstackError(fmt::format("cannot hand the cpu controller down ({} <- +cpu): {}", f, why));
    }
  };
  if (h_.version == CgroupVersion::v2) enable_cpu(h_.mount);
  if (::mkdir(parent_.c_str(), 0755) != 0 && errno != EEXIST) {
    throw ToolstackError(fmt::format("cannot make the cgroup {}: {}", parent_, std::strerror(errno)));
  }
  if (h_.version == CgroupVersion::v2) enable_cpu(parent_);
}

void DomainCgroup::create() const {
  prepare();
  // EEXIST: one a failed step left for this very domain (uuids are not reused); its files are
  // all written below.
  if (::mkdir(path_.c_str(), 0755) != 0 && errno != EEXIST) {
    throw ToolstackError(fmt::format("cannot make the cgroup {}: {}", path_, std::strerror(errno)));
  }
}

void DomainCgroup::apply(const CpuSched& s) const {
  if (auto why = cpu_sched_problem(s); !why.empty()) throw ToolstackError(why);
  const bool v1 = h_.version == CgroupVersion::v1;
  const std::string wfile = path_ + (v1 ? "/cpu.shares" : "/cpu.weight");
  const std::string wvalue = std::to_string(v1 ? v1_shares(s.weight) : v2_weight(s.weight));
  // What each file held, put back in reverse order if a later write is refused (v1: a quota
  // above the parent's, below 1 ms, …), so that the files never disagree with the record.
  std::vector<std::pair<std::string, std::string>> undo;
  auto set = [&](const std::string& file, const std::string& value, const char* what) {
    const auto old = read_file(file);
    if (auto why = write_knob(file, value); !why.empty()) {
      for (auto it = undo.rbegin(); it != undo.rend(); ++it) (void)write_knob(it->first, it->second);
      throw ToolstackError(fmt::format("cannot set the {} ({} <- {}): {}", what, file, value, why));
    }
    if (old) undo.emplace_back(file, std::string(trim_text(*old)));
  };
  set(wfile, wvalue, "weight");
  if (v1) {
    // The period xpv uses is also the kernel's default; written only where it differs.
    const std::string period = path_ + "/cpu.cfs_period_us";
    if (const auto now = read_file(period); !now || trim_text(*now) != std::to_string(kCapPeriodUs)) {
      set(period, std::to_string(kCapPeriodUs), "cap");
    }
    set(path_ + "/cpu.cfs_quota_us", v1_quota(s.cap), "cap");
  } else {
    set(path_ + "/cpu.max", v2_max(s.cap), "cap");
  }
}

void move_process(const std::string& dir, pid_t pid) {
  const std::string f = dir + "/cgroup.procs";
  if (auto why = write_knob(f, std::to_string(pid)); !why.empty()) {
    throw ToolstackError(fmt::format("cannot move process {} into {}: {}", pid, f, why));
  }
}

void DomainCgroup::add_process(pid_t pid) const { move_process(path_, pid); }

CpuSched DomainCgroup::read() const {
  auto get = [&](const std::string& name) {
    const auto t = read_file(path_ + "/" + name);
    if (!t) throw ToolstackError(fmt::format("cannot read {}/{}", path_, name));
    return std::string(trim_text(*t));
  };
  auto bad = [&](const std::string& name, const std::string& v) {
    return ToolstackError(fmt::format("{}/{} holds '{}', not what xpv writes there", path_, name, v));
  };
  CpuSched s;
  if (h_.version == CgroupVersion::v1) {
    const std::string shares = get("cpu.shares"), quota = get("cpu.cfs_quota_us"), period = get("cpu.cfs_period_us");
    const auto sh = parse_number<std::uint64_t>(shares);
    if (!sh) throw bad("cpu.shares", shares);
    s.weight = weight_from_v1_shares(*sh);
    const auto pe = parse_number<std::uint64_t>(period);
    if (!pe || *pe == 0) throw bad("cpu.cfs_period_us", period);
    if (quota != "-1") {
      const auto q = parse_number<std::uint64_t>(quota);
      if (!q) throw bad("cpu.cfs_quota_us", quota);
      s.cap = static_cast<std::uint32_t>(std::clamp<std::uint64_t>((*q * 100 + *pe / 2) / *pe, 1, kMaxCap));
    }
  } else {
    const std::string w = get("cpu.weight"), max = get("cpu.max");
    const auto wv = parse_number<std::uint32_t>(w);
    if (!wv) throw bad("cpu.weight", w);
    s.weight = static_cast<std::uint32_t>(std::clamp<std::uint64_t>((std::uint64_t{*wv} * 256 + 50) / 100, 1, kMaxWeight));
    const auto parts = split(max, ' ');
    if (parts.size() != 2) throw bad("cpu.max", max);
    const auto pe = parse_number<std::uint64_t>(parts[1]);
    if (!pe || *pe == 0) throw bad("cpu.max", max);
    if (parts[0] != "max") {
      const auto q = parse_number<std::uint64_t>(parts[0]);
      if (!q) throw bad("cpu.max", max);
      s.cap = static_cast<std::uint32_t>(std::clamp<std::uint64_t>((*q * 100 + *pe / 2) / *pe, 1, kMaxCap));
    }
  }
  return s;
}

bool DomainCgroup::remove(int wait_ms, std::string* why) const {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  while (true) {
    if (::rmdir(path_.c_str()) == 0 || errno == ENOENT) return true;
    const int err = errno;
    // EBUSY: a task is still in it (a process on its way out leaves it as it exits).
    if (err != EBUSY || std::chrono::steady_clock::now() >= until) {
      if (why) *why = fmt::format("cannot remove the cgroup {}: {}", path_, std::strerror(err));
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::optional<std::string> cgroup_of(std::string_view proc_cgroup, CgroupVersion v) {
  for (auto line : split(proc_cgroup, '\n')) {
    // hierarchy-id:controllers:path (the path may itself hold ':')
    const std::size_t a = line.find(':');
    if (a == std::string_view::npos) continue;
    const std::size_t b = line.find(':', a + 1);
    if (b == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const std::string_view path = line.substr(b + 1);
    if (v == CgroupVersion::v2 ? (id == "0" && controllers.empty()) : lists(controllers, "cpu")) return std::string(path);
  }
  return std::nullopt;
}

std::string format_sched_credit(const std::vector<SchedRow>& rows) {
  std::string out = fmt::format("{:<32} {:>5} {:>6} {:>5}  {}\n", "Name", "ID", "Weight", "Cap", "Cgroup");
  for (const auto& r : rows) {
    const bool none = r.cgroup.empty();
    out += fmt::format("{:<32} {:>5} {:>6} {:>5}  {}\n", r.name, r.domid, none ? "-" : std::to_string(r.sched.weight),
                       none ? "-" : std::to_string(r.sched.cap), none ? "-" : r.cgroup);
  }
  return out;
}

}  // namespace xpv::toolstack
