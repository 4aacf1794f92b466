#include "xpv/toolstack/paths.h"

#include <fmt/core.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "xpv/stats_file.h"

namespace xpv::toolstack {
namespace {

std::string pick(const std::string& cli, const char* env, const std::string& fallback) {
  if (!cli.empty()) return cli;
  if (const char* e = std::getenv(env); e != nullptr && *e != '\0') return e;
  return fallback;
}

}  // namespace

Paths Paths::resolve(const PathOptions& from_cli, const std::string& self_exe) {
  const Paths defaults;
  Paths p;
  p.run_dir = pick(from_cli.run_dir, "XPV_RUN_DIR", defaults.run_dir);
  p.log_dir = pick(from_cli.log_dir, "XPV_LOG_DIR", defaults.log_dir);
  p.xenstore_socket = pick(from_cli.xenstore_socket, "XENSTORED_PATH", defaults.xenstore_socket);
  const std::string exe_dir =
      self_exe.empty() ? std::string(".") : std::filesystem::path(self_exe).parent_path().string();
  p.bin_dir = pick(from_cli.bin_dir, "XPV_BIN_DIR", exe_dir);
  p.netns_dir = pick(from_cli.netns_dir, "XPV_NETNS_DIR", defaults.netns_dir);
  return p;
}

std::string Paths::domain_dir(std::uint16_t domid) const { return fmt::format("{}/dom{}", run_dir, domid); }
std::string Paths::console_socket(std::uint16_t domid) const { return domain_dir(domid) + "/console.sock"; }
std::string Paths::pv_console_socket(std::uint16_t domid) const { return domain_dir(domid) + "/console-pv.sock"; }
std::string Paths::memory_file(std::uint16_t domid) const { return domain_dir(domid) + "/memory"; }
std::string Paths::state_file(std::uint16_t domid) const { return domain_dir(domid) + "/state"; }
std::string Paths::vmm_stats_file(std::uint16_t domid) const { return stats::stats_dir(run_dir) + "/vmm" + std::to_string(domid); }
std::string Paths::control_socket(std::uint16_t domid) const {
  return fmt::format("{}/dom{}.sock", run_dir, domid);
}
std::string Paths::pid_file(const std::string& program) const { return run_dir + "/" + program + ".pid"; }
std::string Paths::log_file(const std::string& program) const { return log_dir + "/" + program + ".log"; }
std::string Paths::binary(const std::string& program) const { return bin_dir + "/" + program; }
std::string Paths::lock_file() const { return run_dir + "/xpv.lock"; }
std::string Paths::xenstored_journal() const { return run_dir + "/xpv-xenstored.journal"; }
std::string Paths::vbd_disk(std::uint16_t domid, std::uint32_t devid) const {
  return fmt::format("{}/vbd/{}/disk", domain_dir(domid), devid);
}

std::string Paths::netns(std::uint16_t domid) const { return fmt::format("{}/xpv-dom{}", netns_dir, domid); }

std::string self_executable() {
  std::error_code ec;
  std::string p = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return {};
  // Replaced since we started (a rebuild, an upgrade): the kernel's link says so after the name,
  // which is still where `xpv` is (and what other processes' argv[0] says).
  constexpr std::string_view kDeleted = " (deleted)";
  if (p.ends_with(kDeleted)) p.resize(p.size() - kDeleted.size());
  return p;
}

}  // namespace xpv::toolstack
