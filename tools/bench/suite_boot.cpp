// `xpv bench boot` — "boot to init": seconds on the host clock from starting the VMM until the
// guest's init prints its first line, for xpv-vmm and for QEMU 7.2 `-enable-kvm` with the same
// Debian kernel, initramfs, memory and vCPUs, side by side in ONE testbed session (the absolute
// figures are TCG-bound; only the ratio means something, ENVIRONMENT.md).
//
// On the host it prepares the guest initramfs in a share and re-runs itself inside
// `xpv testbed` (XPV_TESTBED set there); inside, it times both VMMs and writes the JSON the outer
// run reads back. "Host clock" inside L1 is L1's steady clock — the clock of the machine running
// both VMMs, never a guest's.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"

namespace fs = std::filesystem;

namespace {

using xpv::bench::Clock;
const char* const kMarker = "XPV-GUEST: init";
const char* const kCmdline = "console=ttyS0 quiet reboot=k panic=1 io_delay=none";

std::string q(const std::string& s) { return "'" + s + "'"; }

// Seconds from start until argv prints a line containing kMarker (or nullopt); the VMM runs on
// to its own exit (killed after timeout_s).
std::optional<double> time_to_marker(const std::vector<std::string>& argv, double timeout_s, std::string& log) {
  const auto t0 = Clock::now();
  std::optional<double> found;
  log.clear();
  xpv::bench::run_streaming(argv, timeout_s, [&](std::string_view chunk, Clock::time_point at) {
    log.append(chunk);
    if (!found && log.find(kMarker) != std::string::npos) found = std::chrono::duration<double>(at - t0).count();
  });
  return found;
}

std::vector<xpv::bench::Result> inner() {
  const char* kernel = std::getenv("XPV_BENCH_KERNEL");
  const char* initrd = std::getenv("XPV_BENCH_INITRD");
  if (kernel == nullptr || initrd == nullptr) throw std::runtime_error("XPV_BENCH_KERNEL/XPV_BENCH_INITRD not set");
  const std::string vmm = (fs::read_symlink("/proc/self/exe").parent_path() / "xpv-vmm").string();
  std::string log_x, log_q;
  const auto x = time_to_marker({vmm, "--kernel", kernel, "--initrd", initrd, "--vcpus", "2", "--memory", "512",
                                 "--cmdline", kCmdline},
                                300, log_x);
  if (!x) throw std::runtime_error("xpv-vmm did not reach init:\n" + log_x);
  const auto r = time_to_marker({"qemu-system-x86_64", "-enable-kvm", "-cpu", "host", "-smp", "2", "-m", "512",
                                 "-nodefaults", "-display", "none", "-no-reboot", "-serial", "stdio", "-kernel",
                                 kernel, "-initrd", initrd, "-append", kCmdline},
                                300, log_q);
  xpv::bench::Result res{"boot to init", "s", *x, r, "", true};
  res.note = r ? "one testbed session (nested KVM under TCG): xpv-vmm vs QEMU 7.2 -enable-kvm -cpu host, same "
                 "kernel, initramfs, 512 MiB, 2 vCPUs; from VMM start to init's first line"
               : "QEMU did not reach init within 300 s";
  return {res};
}

std::vector<xpv::bench::Result> outer() {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  char tmpl[] = "/tmp/xpv-bench-boot.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  const fs::path share = tmpl;
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{share};
  const fs::path kfile = share / "kernel.path";
  if (std::system((q(self) + " testbed --print-kernel > " + q(kfile.string())).c_str()) != 0) {
    throw std::runtime_error("xpv testbed --print-kernel failed");
  }
  std::string kernel;
  std::getline(std::ifstream(kfile), kernel);
  fs::create_directories(share / "stage" / "bin");
  fs::copy_file("/bin/busybox", share / "stage" / "bin" / "busybox");
  std::ofstream(share / "stage" / "init") << "#!/bin/busybox sh\n"
                                             "/bin/busybox echo '"
                                          << kMarker << "'\n/bin/busybox poweroff -f\n";
  fs::permissions(share / "stage" / "init", fs::perms::owner_all);
  if (std::system(("cd " + q((share / "stage").string()) + " && find . | cpio --quiet -o -H newc > ../initramfs.cpio")
                      .c_str()) != 0) {
    throw std::runtime_error("cpio failed");
  }
  setenv("XPV_BENCH_KERNEL", kernel.c_str(), 1);
  setenv("XPV_BENCH_INITRD", (share / "initramfs.cpio").c_str(), 1);
  const fs::path json = share / "inner.json";
  const int rc = std::system((q(self) + " testbed --timeout 900 --share " + q(share.string()) + " -- " + q(self) +
                              " bench boot --json " + q(json.string()))
                                 .c_str());
  if (rc != 0 || !fs::exists(json)) throw std::runtime_error("the boot bench inside the testbed failed");
  const auto j = nlohmann::json::parse(std::ifstream(json));
  std::vector<xpv::bench::Result> out;
  for (const auto& r : j.at("results")) {
    xpv::bench::Result res;
    res.metric = r.at("metric").get<std::string>();
    res.unit = r.at("unit").get<std::string>();
    res.xpv = r.at("xpv").get<double>();
    if (!r.at("reference").is_null()) res.reference = r.at("reference").get<double>();
    res.note = r.value("note", "");
    res.lower_is_better = r.value("lower_is_better", true);
    out.push_back(res);
  }
  return out;
}

std::vector<xpv::bench::Result> run_boot(const xpv::bench::Options&) {
  return std::getenv("XPV_TESTBED") != nullptr ? inner() : outer();
}

}  // namespace

XPV_BENCH_SUITE("boot", "boot to init: xpv-vmm vs QEMU -enable-kvm, same kernel+initramfs, in one testbed session",
                run_boot);
