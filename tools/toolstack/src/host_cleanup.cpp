#include "xpv/toolstack/host_cleanup.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "xpv/toolstack/fs.h"
#include "xpv/unique_fd.h"

namespace xpv::toolstack {
namespace {

bool under(const std::string& path, const std::string& dir) {
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

// /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape_mount_path(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      const std::string oct = s.substr(i + 1, 3);
      if (oct.find_first_not_of("01234567") == std::string::npos) {
        out.push_back(static_cast<char>(std::stoi(oct, nullptr, 8)));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace

std::vector<std::string> detach_loops_under(const std::string& dir) {
  std::vector<std::string> done;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/block", ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("loop")) continue;
    auto backing = read_file(e.path().string() + "/loop/backing_file");
    if (!backing) continue;
    std::string b = *backing;
    while (!b.empty() && b.back() == '\n') b.pop_back();
    if (b.ends_with(" (deleted)")) b.resize(b.size() - 10);
    if (!under(b, dir)) continue;
    UniqueFd fd(::open(("/dev/" + name).c_str(), O_RDONLY | O_CLOEXEC));
    if (fd && ::ioctl(fd.get(), LOOP_CLR_FD, 0) == 0) {
      done.push_back(fmt::format("detached /dev/{} from {}", name, b));
    } else {
      done.push_back(fmt::format("/dev/{} (backed by {}) could not be detached: {}", name, b, std::strerror(errno)));
    }
  }
  return done;
}

std::vector<pid_t> processes_mentioning(const std::string& needle) {
  std::vector<pid_t> pids;
  std::error_code ec;
  // increment(ec), not a range-for: its operator++ throws on a read error, and callers clean up
  // with this (destructors among them).
  for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::directory_entry& e = *it;
    const std::string n = e.path().filename().string();
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(n));
    if (pid == ::getpid()) continue;
    // /proc files are small and report size 0: read them as streams. A process that exits while
    // it is read makes the read fail with ESRCH, which libstdc++'s filebuf throws as
    // std::ios_base::failure ("basic_filebuf::underflow error reading the file"): it is gone,
    // so it mentions nothing (a fresh-clone run's TestHost clean-up once failed on exactly that).
    auto slurp = [](const std::filesystem::path& f) {
      try {
        std::ifstream in(f);
        return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      } catch (const std::exception&) {
        return std::string();
      }
    };
    std::string cmd = slurp(e.path() / "cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    const std::string stat = slurp(e.path() / "stat");
    const auto close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z') continue;
    if (cmd.find(needle) != std::string::npos) pids.push_back(pid);
  }
  return pids;
}

std::vector<std::string> unmount_under(const std::string& dir) {
  std::vector<std::string> points;
  auto info = read_file("/proc/self/mountinfo");
  if (info) {
    std::istringstream in(*info);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string id, parent, dev, root, mount_point;
      if (!(f >> id >> parent >> dev >> root >> mount_point)) continue;
      mount_point = unescape_mount_path(mount_point);
      if (under(mount_point, dir)) points.push_back(mount_point);
    }
  }
  std::sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  std::vector<std::string> done;
  for (const auto& p : points) {
    if (::umount2(p.c_str(), MNT_DETACH) == 0) done.push_back("unmounted " + p);
    else done.push_back(fmt::format("cannot unmount {}: {}", p, std::strerror(errno)));
  }
  return done;
}

void remove_domain_dir(const std::string& dir) {
  unmount_under(dir);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace xpv::toolstack
