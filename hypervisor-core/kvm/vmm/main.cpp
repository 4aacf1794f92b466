// xpv-vmm — one HVM domain on KVM: boots a Linux kernel (bzImage or vmlinux) directly.
//
//   xpv-vmm --kernel K [--initrd I] [--cmdline S] [--vcpus N] [--memory MiB]
//           [--console stdio|socket:PATH] [--stats] [--stats-file PATH] [--vcpu-affinity V:CPUS]...
//           [--xen --domid N --name NAME [--run-dir DIR] [--upcall vector|callback|intx]
//            [--max-grant-frames N] [--pv-console stdio|socket:PATH [--pv-console-log FILE]]]
//
// --xen presents the Xen HVM platform (xen_domain.h): the guest's PV drivers find Xen, its
// hypercalls trap to xpv, and dom0 services reach it through /run/xpv/dom<N>.sock.
//
// --stats-file PATH: the exit counters (and with --xen the hypercall and upcall counters), as a
// statistics file (xpv/stats_file.h) rewritten about once a second while the guest runs and
// removed when it stops (not when xpv-vmm is killed: `xpv destroy` removes it then); the
// toolstack passes RUN/stats/vmm<N>, which `xpv top` reads.
//
// --vcpu-affinity V:CPU-LIST (repeatable; xl's `cpus`, cpu_list.h): vCPU V's thread runs only on
// those host CPUs, placed before it first enters the guest.
//
// Exit status: 0 guest powered off (or halted), 2 guest asked for a reboot, 3 triple fault,
// 1 VMM error (bad arguments, bad image, KVM failure; one line on stderr saying which).
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <memory>
#include <span>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "xpv/kvm/console.h"
#include "xpv/kvm/linux_boot.h"
#include "xpv/kvm/pc_devices.h"
#include "xpv/kvm/pci_host.h"
#include "xpv/kvm/uart.h"
#include "xpv/kvm/vm.h"
#include "xpv/replace_file.h"
#include "xpv/stats_file.h"
#include "xpv/vmm/xen_domain.h"

namespace {

std::vector<std::uint8_t> read_file(const std::string& path, const char* what, std::uint64_t limit) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error(fmt::format("{} {}: cannot open", what, path));
  const auto size = static_cast<std::uint64_t>(in.tellg());
  if (size == 0) throw std::runtime_error(fmt::format("{} {}: empty file", what, path));
  if (size > limit) throw std::runtime_error(fmt::format("{} {}: {} bytes is larger than guest memory", what, path, size));
  std::vector<std::uint8_t> data(size);
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(size))) {
    throw std::runtime_error(fmt::format("{} {}: read error", what, path));
  }
  return data;
}

int exit_code(xpv::kvm::StopReason r) {
  switch (r) {
    case xpv::kvm::StopReason::poweroff: return 0;
    case xpv::kvm::StopReason::reboot: return 2;
    case xpv::kvm::StopReason::triple_fault: return 3;
    default: return 1;
  }
}

// The word `--shutdown-file` records: why the domain stopped, as Xen keeps a domain's shutdown
// reason for the toolstack (xl acts on it: on_poweroff / on_reboot / on_crash).
const char* shutdown_word(xpv::kvm::StopReason r) {
  switch (r) {
    case xpv::kvm::StopReason::poweroff: return "poweroff";
    case xpv::kvm::StopReason::reboot: return "reboot";
    default: return "crash";  // a triple fault, a crash the guest reported, an error
  }
}

// --stats-file: `read`'s counters written to `path` at once and then about once a second, on a thread
// of its own (the counters are atomics), until destroyed; then the file is removed, as a backend
// withdraws a device's file. A file that cannot be written is said once and the guest runs on.
class StatsFilePublisher {
 public:
  StatsFilePublisher(std::string path, std::function<xpv::stats::Counters()> read)
      : path_(std::move(path)),
        name_(std::filesystem::path(path_).filename().string()),
        read_(std::move(read)),
        thread_([this](std::stop_token stop) { loop(stop); }) {}
  ~StatsFilePublisher() {
    thread_.request_stop();
    thread_.join();
    (void)::unlink(path_.c_str());
  }
  StatsFilePublisher(const StatsFilePublisher&) = delete;
  StatsFilePublisher& operator=(const StatsFilePublisher&) = delete;

 private:
  void loop(std::stop_token stop) {
    std::mutex m;
    std::condition_variable_any cv;
    std::unique_lock lock(m);
    bool said = false;
    while (!stop.stop_requested()) {
      // Nothing here may end the process (an exception leaving a thread would): the guest runs
      // on without its counters.
      std::string error;
      try {
        if (const int e = xpv::replace_file(path_, xpv::stats::format(name_, "xpv-vmm", read_())); e != 0) {
          error = std::strerror(e);
        }
      } catch (const std::exception& ex) {
        error = ex.what();
      }
      if (!error.empty() && !said) {
        said = true;
        spdlog::warn("--stats-file {}: cannot write it: {}; no counters for `xpv top`", path_, error);
      }
      cv.wait_for(lock, stop, std::chrono::seconds(1), [] { return false; });
    }
  }

  std::string path_, name_;
  std::function<xpv::stats::Counters()> read_;
  std::jthread thread_;
};

int run(int argc, char** argv) {
  CLI::App app{"xpv-vmm — a KVM VMM that boots Linux directly (bzImage or vmlinux)"};
  std::string kernel, initrd, console_spec = "stdio", console_log, pv_console_spec, pv_console_log;
  std::string shutdown_file, stats_file;
  std::string cmdline = "console=ttyS0 reboot=k panic=1 io_delay=none acpi=off";
  unsigned vcpus = 1, memory_mib = 512;
  bool stats = false;
  bool xen = false, paused = false;
  xpv::vmm::XenDomainConfig xcfg;
  std::string upcall = "vector";
  std::vector<std::string> affinity_specs;
  app.add_option("--kernel", kernel, "bzImage or vmlinux ELF")->required();
  app.add_option("--initrd", initrd, "initial ramdisk");
  app.add_option("--cmdline", cmdline, "kernel command line")->capture_default_str();
  app.add_option("--vcpus", vcpus, "number of vCPUs")->capture_default_str();
  app.add_option("--memory", memory_mib, "guest memory in MiB")->capture_default_str();
  app.add_option("--vcpu-affinity", affinity_specs,
                 "V:CPU-LIST: vCPU V runs only on these host CPUs (\"0-3,^2\"; repeat for each vCPU placed)");
  app.add_option("--console", console_spec, "stdio or socket:PATH")->capture_default_str();
  app.add_option("--console-log", console_log, "also append the guest's console output to this file");
  app.add_flag("--stats", stats, "print exit counters on stderr when the VM stops");
  app.add_option("--stats-file", stats_file,
                 "keep the exit (and with --xen hypercall and upcall) counters in this file while the guest runs, "
                 "rewritten about once a second, removed when it stops (what `xpv top` shows)");
  app.add_flag("--xen", xen, "present the Xen HVM platform (hypercalls, event channels, grant frames, platform-pci)");
  app.add_option("--domid", xcfg.domid, "domain id (--xen)")->check(CLI::Range(1, 0x7fef));
  app.add_option("--name", xcfg.name, "domain name (--xen)");
  app.add_option("--run-dir", xcfg.run_dir, "where dom<N>.sock is created (--xen)")->capture_default_str();
  app.add_option("--upcall", upcall,
                 "event upcall offered to the guest: vector (per-vCPU upcall vector), callback (Xen's global "
                 "callback vector only; needs KVM's Hyper-V SynIC for its no-EOI delivery) or intx (platform-pci INTx)")
      ->check(CLI::IsMember({"vector", "callback", "intx"}))
      ->capture_default_str();
  app.add_option("--pv-console", pv_console_spec,
                 "with --xen: offer the Xen PV console (the guest's hvc0) and connect it to stdio or socket:PATH "
                 "(as --console does for the serial port)");
  app.add_option("--pv-console-log", pv_console_log, "also append the PV console's output to this file");
  app.add_option("--trace-hypercalls", xcfg.trace_hypercalls, "log the first N hypercalls (debugging)")
      ->envname("XPV_TRACE_HYPERCALLS");
  app.add_option("--shutdown-file", shutdown_file,
                 "when the guest stops, write why into this file: poweroff, reboot or crash (what the toolstack's "
                 "on_poweroff / on_reboot / on_crash act on)");
  app.add_option("--memory-file", xcfg.memory_file,
                 "with --xen: keep the guest's current memory in this file, in KiB (what its balloon has not "
                 "given back; written when that changes; what `xpv list` shows)");
  app.add_option("--state-file", xcfg.state_file,
                 "with --xen: keep the domain's run state in this file: paused or running (what `xpv list` "
                 "shows)");
  app.add_flag("--paused", paused, "with --xen: print 'ready' and wait for unpause on the control socket");
  app.add_option("--max-grant-frames", xcfg.max_grant_frames, "grant-table frames (--xen)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  spdlog::set_pattern("xpv-vmm: %l: %v");
  if (const char* lvl = std::getenv("XPV_VMM_LOG_LEVEL")) spdlog::set_level(spdlog::level::from_str(lvl));
  if (memory_mib == 0) throw std::runtime_error("--memory 0: a guest needs memory");
  // Options that are malformed or contradict each other: refused before anything is read or created.
  auto check_console = [](const char* opt, const std::string& spec) {
    if (spec != "stdio" && (spec.rfind("socket:", 0) != 0 || spec.size() == 7)) {
      throw std::runtime_error(fmt::format("{} {}: expected stdio or socket:PATH", opt, spec));
    }
  };
  check_console("--console", console_spec);
  if (!pv_console_spec.empty()) check_console("--pv-console", pv_console_spec);
  if (!pv_console_spec.empty() && !xen) throw std::runtime_error("--pv-console needs --xen (it is Xen's PV console)");
  if (!pv_console_log.empty() && pv_console_spec.empty()) throw std::runtime_error("--pv-console-log needs --pv-console");
  if (!pv_console_spec.empty() && pv_console_spec == console_spec) {
    throw std::runtime_error("--pv-console " + pv_console_spec + " is the serial console's too: give each its own");
  }
  const std::uint64_t mem = std::uint64_t{memory_mib} << 20;
  const auto kernel_img = read_file(kernel, "kernel", mem);
  std::vector<std::uint8_t> initrd_img;
  if (!initrd.empty()) initrd_img = read_file(initrd, "initrd", mem);

  const auto t0 = std::chrono::steady_clock::now();
  xpv::kvm::VmConfig cfg;
  cfg.vcpus = vcpus;
  cfg.memory_bytes = mem;
  if (!affinity_specs.empty()) {
    const auto allowed = xpv::kvm::cpus_of_thread(0);
    if (!allowed) throw std::runtime_error("--vcpu-affinity: the CPUs this process may use: " + allowed.error().message);
    auto placed = xpv::kvm::parse_vcpu_affinity(affinity_specs, vcpus, *allowed);
    if (!placed) throw std::runtime_error("--vcpu-affinity " + placed.error().message);
    cfg.affinity = std::move(*placed);
  }
  if (xen) {
    xcfg.upcall = upcall == "intx"       ? xpv::xen::UpcallMode::intx
                  : upcall == "callback" ? xpv::xen::UpcallMode::callback_vector
                                         : xpv::xen::UpcallMode::vcpu_vector;
    if (xcfg.name.empty()) xcfg.name = "dom" + std::to_string(xcfg.domid);
    xpv::vmm::add_xen_device_memory(cfg, xcfg);
  }
  xpv::kvm::Vm vm(cfg);
  xpv::kvm::Console console(console_spec);
  if (!console_log.empty()) console.set_log(console_log);
  std::unique_ptr<xpv::kvm::Console> pv_console;
  if (!pv_console_spec.empty()) {
    pv_console = std::make_unique<xpv::kvm::Console>(pv_console_spec);
    if (!pv_console_log.empty()) pv_console->set_log(pv_console_log);
    xcfg.pv_console = [c = pv_console.get()](std::span<const std::uint8_t> b) { c->write(b); };
  }
  xpv::kvm::Uart16550 uart([&](std::span<const std::uint8_t> b) { console.write(b); },
                           [&](bool level) { vm.set_irq(4, level); });
  xpv::kvm::ResetPorts reset([&] { vm.request_stop(xpv::kvm::StopReason::reboot, "guest reset (i8042 / port 0x92)"); });
  xpv::kvm::PostPort post;
  xpv::kvm::CmosRtc rtc;
  xpv::kvm::PciHost pci;
  auto add = [&](std::uint64_t base, std::uint64_t len, xpv::kvm::BusDevice* d, const char* what) {
    if (auto r = vm.pio().add(base, len, d, what); !r) throw std::runtime_error(r.error().message);
  };
  add(0x3f8, 8, &uart, "com1");
  add(0x60, 1, &reset, "i8042 data");
  add(0x64, 1, &reset, "i8042 command");
  add(0x92, 1, &reset, "port 0x92");
  add(0x80, 1, &post, "post");
  add(0x70, 2, &rtc, "cmos");
  add(xpv::kvm::PciHost::kAddressPort, 4, &pci, "pci address");
  add(xpv::kvm::PciHost::kDataPort, 4, &pci, "pci data");
  std::unique_ptr<xpv::vmm::XenDomain> xendom;
  if (xen) xendom = std::make_unique<xpv::vmm::XenDomain>(vm, pci, xcfg);

  if (xendom && cmdline.find("tsc_early_khz=") == std::string::npos) {
    // A Xen HVM guest has no kvmclock (Linux picks Xen over KVM) and xpv offers no Xen pvclock
    // yet, so Linux would calibrate the TSC against the PIT, which fails under nested
    // virtualisation (jiffies clocksource, seconds-long stalls). Tell it the frequency KVM runs
    // the guest's TSC at, as the boot parameter meant for this.
    // KVM keeps the vCPUs' TSCs in step (one offset for the VM), so the boot-time TSC sync check,
    // which nested virtualisation's jitter fails, is skipped too.
    if (const auto khz = vm.tsc_khz(); khz != 0) cmdline += fmt::format(" tsc_early_khz={} tsc=reliable", khz);
  }
  if (xendom && xcfg.upcall == xpv::xen::UpcallMode::intx && cmdline.find("xen_no_vector_callback") == std::string::npos) {
    // Linux 6.1 sets up Xen event-channel IPIs before it learns that no callback vector is
    // offered, then BUGs on the first IPI; its way to the platform-pci INTx path is this boot
    // parameter (QEMU's Xen INTx test passes it too).
    cmdline += " xen_no_vector_callback";
  }
  xpv::kvm::LinuxBootInput in;
  in.kernel = kernel_img;
  in.initrd = initrd_img;
  in.cmdline = cmdline;
  in.vcpus = vcpus;
  in.low_end = vm.ram().low_end();
  in.high_size = vm.ram().size() - vm.ram().low_end();
  in.cpu_signature = vm.cpu_signature();
  in.cpu_features = vm.cpu_features();
  if (xendom) in.pci_irqs.push_back({xpv::vmm::kPlatformSlot, 1, xpv::vmm::kPlatformGsi});
  auto entry = xpv::kvm::setup_linux_boot(vm.memory(), in);
  if (!entry) throw std::runtime_error(entry.error().message);
  if (xendom) xendom->patch_kernel(entry->kernel_start, entry->kernel_end, entry->kernel_tables);
  vm.boot_cpu_long_mode(*entry);
  spdlog::debug("entry {:#x}, kernel end {:#x}, initrd at {:#x}", entry->rip, entry->kernel_end, entry->initrd_gpa);

  if (xendom) {
    // The toolstack waits for this line (the control socket listens), as for xpv-front.
    fmt::print("ready\n");
    std::fflush(stdout);
    if (paused) {
      xendom->wait_unpaused();
      spdlog::info("dom{} unpaused", xcfg.domid);
    } else {
      xendom->unpause_now();
    }
  }
  console.start_input([&](std::span<const std::uint8_t> b) { return uart.receive(b); });
  if (pv_console) pv_console->start_input([&](std::span<const std::uint8_t> b) { return xendom->pv_console_input(b); });
  std::optional<StatsFilePublisher> stats_publisher;
  if (!stats_file.empty()) {
    stats_publisher.emplace(stats_file, [&vm, &xendom] {
      // The platform's counters first: a hypercall is counted after its port-I/O exit, so the
      // exits read after them are never fewer than the hypercalls they carried.
      const xpv::stats::Counters x = xendom ? xendom->counters() : xpv::stats::Counters{};
      xpv::stats::Counters c = xpv::kvm::exit_counters(vm.stats());
      c.insert(c.end(), x.begin(), x.end());
      return c;
    });
  }
  const auto reason = vm.run();
  stats_publisher.reset();
  console.stop();
  if (pv_console) pv_console->stop();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (stats) {
    const auto s = vm.stats();
    fmt::print(stderr, "xpv-vmm: exits:");
    for (std::size_t i = 0; i < s.by_reason.size(); ++i) {
      if (s.by_reason[i] != 0) fmt::print(stderr, " {}={}", xpv::kvm::exit_reason_name(i), s.by_reason[i]);
    }
    fmt::print(stderr, " (unclaimed pio={} mmio={})", s.pio_unclaimed, s.mmio_unclaimed);
    if (xendom) fmt::print(stderr, " {}", xendom->describe_counters());
    fmt::print(stderr, "\n");
  }
  const std::string msg = vm.stop_message();
  fmt::print(stderr, "xpv-vmm: guest stopped: {}{}{} after {:.2f} s\n", xpv::kvm::to_string(reason),
             msg.empty() ? "" : ": ", msg, secs);
  if (!shutdown_file.empty()) {
    std::ofstream out(shutdown_file, std::ios::trunc);
    out << shutdown_word(reason) << "\n";
    if (!out.flush()) fmt::print(stderr, "xpv-vmm: cannot write the shutdown reason to {}\n", shutdown_file);
  }
  return exit_code(reason);
}

}  // namespace

int main(int argc, char** argv) {
  // A peer that goes away (a console client, a control-socket client, a backend) is an error on
  // that descriptor, never the end of the guest.
  std::signal(SIGPIPE, SIG_IGN);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "xpv-vmm: {}\n", e.what());
    return 1;
  }
}
