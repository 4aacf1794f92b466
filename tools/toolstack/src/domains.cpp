// xpv create / list / destroy / shutdown (docs/PROCESS-DOMAINS.md "Domain lifecycle").
#include <fmt/core.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <ostream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "domain_ops.h"
#include "xpv/config/domain_config.h"
#include "xpv/config/error.h"
#include "xpv/domain/control.h"
#include "xpv/toolstack/allocation.h"
#include "xpv/toolstack/devices.h"
#include "xpv/toolstack/disk_checks.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/fs.h"
#include "xpv/toolstack/nodes.h"
#include "xpv/toolstack/host_cleanup.h"
#include "xpv/toolstack/process.h"
#include "xpv/toolstack/record.h"
#include "xpv/toolstack/run_lock.h"
#include "xpv/toolstack/vif_checks.h"
#include "xpv/toolstack/xenstore.h"
#include "xpv/netback/netns.h"

namespace xpv::toolstack {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr const char* kFront = "xpv-front";
constexpr const char* kVmm = "xpv-vmm";
constexpr auto kReadyTimeout = 30s;

std::string front_log(const Paths& p, const std::string& name, const char* program = kFront) {
  return p.log_file(fmt::format("{}-{}", program, name));
}

const char* upcall_arg(config::Upcall u) {
  switch (u) {
    case config::Upcall::vector: return "vector";
    case config::Upcall::callback: return "callback";
    case config::Upcall::intx: return "intx";
  }
  return "vector";
}

// Waits for the line "ready" that the domain process prints once its control socket listens.
// The process writes stdout to its log file (never to a pipe we would close: a later log line
// would kill it with SIGPIPE), so the file is scanned from where it was when we started it.
void wait_ready(pid_t pid, const std::string& log, std::uint64_t offset, const char* program) {
  const auto deadline = std::chrono::steady_clock::now() + kReadyTimeout;
  for (;;) {
    const std::string text = read_from(log, offset, 1 << 16);
    std::size_t pos = 0;
    while (pos < text.size()) {
      const auto nl = text.find('\n', pos);
      if (nl == std::string::npos) break;
      std::string_view line(text.data() + pos, nl - pos);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line == "ready") return;
      pos = nl + 1;
    }
    throw_if_interrupted();
    int status = 0;
    if (child_exited(pid, &status)) {
      throw ToolstackError(fmt::format("{} exited ({}) before it was ready: {} (log: {})", program,
                                       describe_status(status), last_line(log), log));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw ToolstackError(fmt::format("{} was not ready within {} s (log: {})", program,
                                       std::chrono::duration_cast<std::chrono::seconds>(kReadyTimeout).count(), log));
    }
    std::this_thread::sleep_for(20ms);
  }
}

std::set<std::uint16_t> used_domids(const Paths& p, const std::vector<DomainSummary>& doms) {
  std::set<std::uint16_t> used;
  for (const auto& d : doms) used.insert(d.domid);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(p.netns_dir, ec)) {
    // A namespace xpv-dom<N> left by anything: not free either.
    const std::string n = e.path().filename().string();
    if (!n.starts_with("xpv-dom")) continue;
    if (auto id = parse_domid(n.substr(7))) used.insert(*id);
  }
  for (const auto& e : fs::directory_iterator(p.run_dir, ec)) {
    // dom<N>/ or dom<N>.sock left by anything: not free.
    std::string n = e.path().filename().string();
    if (!n.starts_with("dom")) continue;
    n = n.substr(3);
    if (n.ends_with(".sock")) n.resize(n.size() - 5);
    if (auto id = parse_domid(n)) used.insert(*id);
  }
  return used;
}

void check_daemon(const Paths& p, DeviceKind k) {
  const std::string prog = backend_program(k);
  if (::access(p.binary(prog).c_str(), X_OK) != 0) {
    throw ToolstackError(fmt::format("{} is not built (no {}): {} devices cannot be served", prog, p.binary(prog),
                                     to_string(k)));
  }
  if (!backend_running(p, k)) throw ToolstackError(fmt::format("{} is not running; run `xpv up`", prog));
}

}  // namespace

bool backend_running(const Paths& paths, DeviceKind k) {
  const std::string prog = backend_program(k);
  return running_pid(paths.pid_file(prog), prog).has_value();
}

DomainSummary live_domain(Context& ctx, Xenstore& xs, const std::string& which) {
  const auto doms = gather_domains(ctx.paths, &xs);
  const DomainSummary& d = resolve_domain(doms, which);
  if (d.pid == 0) throw ToolstackError(fmt::format("domain {} is not running (state {})", domain_label(d), d.state));
  return d;
}

void destroy_domain(Context& ctx, Xenstore* xs, const DomainSummary& d) {
  const Paths& p = ctx.paths;
  const std::string dir = p.domain_dir(d.domid);
  const bool alive = d.record && domain_process_runs(*d.record);
  // A paused guest's frontends cannot answer a close: its devices go at once, as xl destroy's.
  const bool frontends_answer = alive && !d.paused;
  // Its monitor first (unless we are it): the domain process about to be stopped is no reason
  // for on_poweroff / on_crash to act.
  if (d.record && d.record->monitor_pid != ::getpid() && monitor_runs(*d.record)) {
    (void)stop_process(d.record->monitor_pid, 5s);
  }

  for (const auto& line : detach_loops_under(dir)) ctx.err << "warning: " << line << "\n";
  if (xs != nullptr) {
    // A xenstore that fails here (xpv-xenstored gone or not answering: the very failure that may
    // have brought a create to undo itself) leaves its nodes for a later `xpv destroy`; the host
    // side below — the process, its directory, sockets and namespace — goes regardless.
    try {
      const auto devices = devices_of(*xs, d.domid);
      auto warnings = close_and_remove(*xs, d.domid, devices, frontends_answer,
                                       [&](DeviceKind k) { return backend_running(p, k); }, ctx.close_timeout);
      for (const auto& w : warnings) ctx.err << "warning: " << w << "\n";
      try {
        xs->release(d.domid);
      } catch (const ToolstackError&) {
        // Not introduced (a create that failed early, or xenstored restarted): nothing to release.
      }
      auto vm = xs->read(domain_path(d.domid) + "/vm");
      xs->rm(domain_path(d.domid));
      if (vm && vm->starts_with("/vm/") && vm->size() > 4) xs->rm(*vm);
      if (d.record && !d.record->uuid.empty()) xs->rm("/vm/" + d.record->uuid);
    } catch (const std::exception& e) {
      ctx.err << fmt::format("warning: dom{}'s xenstore nodes were not all removed ({}); the host side is cleaned up "
                             "anyway\n", d.domid, e.what());
    }
  }
  if (alive && !stop_process(d.record->pid, 10s)) {
    // Not even SIGKILL ends it (stuck in the kernel, say on a FUSE mount of its own): its record,
    // run directory and namespace stay, or nothing could find or stop it any more.
    throw ToolstackError(fmt::format("domain process {} did not exit, even after SIGKILL (/proc/{}/stack says where it "
                                     "is stuck); dom{}'s record and run directory are kept: `xpv destroy {}` again "
                                     "once it is gone",
                                     d.record->pid, d.record->pid, d.domid, d.domid));
  }
  // Its cgroup (CPU weight and cap), now that its process is gone.
  if (d.record) remove_domain_cgroup(ctx, *d.record);
  remove_domain_dir(dir);
  std::error_code ec;
  fs::remove(p.control_socket(d.domid), ec);
  // Its xpv-vmm removes its counters when the guest stops, not when it is killed (SIGTERM above).
  fs::remove(p.vmm_stats_file(d.domid), ec);
  fs::remove(p.vmm_stats_file(d.domid) + ".tmp", ec);
  // Its network namespace (the interfaces in it go with it), after the process that used it.
  const std::string ns = d.record && !d.record->netns.empty() ? d.record->netns : p.netns(d.domid);
  if ((d.record && !d.record->netns.empty()) || netback::netns_exists(ns)) {
    if (!netback::remove_netns(ns)) ctx.err << fmt::format("warning: cannot remove the network namespace {}\n", ns);
  }
}

void cmd_create(Context& ctx, const std::string& config_path, bool wait, bool lock_held, bool paused) {
  const Paths& p = ctx.paths;
  InterruptGuard interrupts;  // Ctrl-C from here on: the undo below, not a half-made domain
  config::DomainConfig cfg;
  try {
    cfg = config::load_domain_config(config_path, true);
  } catch (const config::ConfigError& e) {
    throw ToolstackError(e.what());
  }
  for (const auto& w : cfg.warnings) ctx.err << "warning: " << w << "\n";
  const bool hvm = cfg.type == config::DomainType::hvm;
  const char* program = hvm ? kVmm : kFront;
  // `cpu_weight` / `cap`: the host must have the cpu controller, found before anything is made.
  std::optional<CpuHierarchy> sched_hierarchy;
  CpuSched sched;
  if (cfg.cpu_weight || cfg.cap) {
    sched_hierarchy = cpu_hierarchy_or_throw(fmt::format("{}: '{}'", config_path, cfg.cpu_weight ? "cpu_weight" : "cap"));
    sched = {cfg.cpu_weight.value_or(kDefaultWeight), cfg.cap.value_or(0)};
  }
  if (hvm && cfg.kernel.empty()) throw ToolstackError(fmt::format("{}: type \"hvm\" needs kernel = \"...\"", config_path));
  if (paused && !hvm) {
    throw ToolstackError(fmt::format("{}: a process domain cannot be created paused (only an HVM guest has vCPUs to hold)",
                                     config_path));
  }
  for (std::size_t i = 0; i < cfg.vifs.size(); ++i) {
    if (!cfg.vifs[i].vifname.empty()) {
      throw ToolstackError(fmt::format("{}: vif {}: vifname is not supported (the host side is always vif<domid>.<devid>)",
                                       config_path, i));
    }
    check_vif_bridge(fmt::format("{}: vif {}", config_path, i), cfg.vifs[i]);
    adopt_bridge_mtu(cfg.vifs[i]);
  }
  if (::access(p.binary(program).c_str(), X_OK) != 0) {
    throw ToolstackError(fmt::format("{} is not built (no {})", program, p.binary(program)));
  }
  Xenstore xs(p.xenstore_socket);
  if (!cfg.disks.empty()) check_daemon(p, DeviceKind::vbd);
  if (!cfg.vifs.empty()) check_daemon(p, DeviceKind::vif);

  make_dirs(p.run_dir, 0700);
  make_dirs(p.log_dir, 0755);
  std::optional<RunLock> lock;
  if (!lock_held) lock.emplace(p.lock_file());
  throw_if_interrupted();  // while the lock was awaited: nothing made yet

  const auto doms = gather_domains(p, &xs);
  for (const auto& d : doms) {
    if (d.name == cfg.name) {
      throw ToolstackError(fmt::format("{}: a domain named '{}' exists already (id {})", config_path, cfg.name, d.domid));
    }
  }
  // MACs in use anywhere: a vif's MAC must be unique on the host.
  std::set<std::string> macs;
  for (const auto& d : doms) {
    for (const auto& dev : xs.list(backend_dir(DeviceKind::vif, d.domid))) {
      if (auto m = xs.read(backend_dir(DeviceKind::vif, d.domid) + "/" + dev + "/mac")) macs.insert(*m);
    }
  }
  for (const auto& v : cfg.vifs) {
    if (v.mac && macs.count(v.mac->str())) {
      throw ToolstackError(fmt::format("{}: MAC {} is used by another domain", config_path, v.mac->str()));
    }
  }
  // Images: none written by a disk already on the host, none read there given writable.
  if (!cfg.disks.empty()) {
    const auto disks = existing_disks(xs, doms);
    for (const auto& disk : cfg.disks) check_new_disk(config_path, disk, disks);
  }
  if (!cfg.vifs.empty()) {
    // Addresses: against every vif on the host, the host's interfaces, and each other.
    auto vifs = existing_vifs(xs, doms);
    const auto host = host_addresses();
    for (std::size_t i = 0; i < cfg.vifs.size(); ++i) {
      check_new_vif(fmt::format("{}: vif {}", config_path, i), cfg.vifs[i], vifs, host);
      vifs.push_back({fmt::format("vif {} of this configuration", i), cfg.vifs[i].mac ? cfg.vifs[i].mac->str() : "",
                      vif_addresses_of(cfg.vifs[i]), cfg.vifs[i].bridge});
    }
  }
  const auto domid = pick_domid(used_domids(p, doms));
  if (!domid) throw ToolstackError("no free domain id");
  const DomId n = *domid;

  DomainRecord rec;
  rec.domid = n;
  rec.name = cfg.name;
  rec.type = hvm ? "hvm" : "process";
  rec.memory_mib = cfg.maxmem_mib;  // the RAM it has (an HVM guest balloons down to `memory`)
  rec.vcpus = cfg.vcpus;
  rec.config = fs::absolute(config_path).lexically_normal().string();
  // The record is JSON, which holds only UTF-8: a path it cannot hold is refused before anything
  // is created (the monitor re-reads the configuration from it to restart the domain).
  try {
    (void)nlohmann::json(rec.config).dump();
  } catch (const nlohmann::json::type_error&) {
    std::string shown;  // the path with its bytes past ASCII as \xNN: the message stays printable
    for (const char ch : rec.config) {
      const auto b = static_cast<unsigned char>(ch);
      shown += b < 0x80 ? std::string(1, ch) : fmt::format("\\x{:02x}", b);
    }
    throw ToolstackError(fmt::format("{}: the configuration file's path is not UTF-8; rename it or its directory", shown));
  }
  rec.uuid = generate_uuid(system_random_byte);
  // The cgroup's parent, before the domain process starts: a host that cannot give it is refused
  // with nothing of the domain made.
  if (sched_hierarchy) DomainCgroup(*sched_hierarchy, rec.uuid).prepare();
  rec.program = program;
  rec.on_poweroff = config::to_string(cfg.on_poweroff);
  rec.on_reboot = config::to_string(cfg.on_reboot);
  rec.on_crash = config::to_string(cfg.on_crash);

  DomainSummary self;
  self.domid = n;
  self.name = cfg.name;
  try {
    const std::string dir = p.domain_dir(n);
    make_dirs(dir, 0700);
    // 0. The network namespace a process domain owns (its vifs' NICs go there); an HVM guest has
    //    its own kernel's network stack.
    if (!hvm) {
      rec.netns = p.netns(n);
      try {
        netback::create_netns(rec.netns);
      } catch (const std::exception& e) {
        rec.netns.clear();
        throw ToolstackError(fmt::format("cannot create the network namespace {}: {}", p.netns(n), e.what()));
      }
    }
    self.record = rec;
    throw_if_interrupted();
    // 1. The domain process; "ready" once dom<N>.sock listens.
    const std::string log = front_log(p, cfg.name, program);
    const std::uint64_t offset = file_size(log);
    std::vector<std::string> argv{p.binary(program), "--domid", std::to_string(n), "--name", cfg.name, "--memory",
                                  std::to_string(cfg.maxmem_mib), "--run-dir", p.run_dir,
                                  // why it stopped, for its monitor (on_poweroff / on_reboot / on_crash)
                                  "--shutdown-file", shutdown_file(p, n)};
    if (hvm) {
      // Created paused (as xl does): unpaused once its nodes and devices are in xenstore.
      std::string cmdline = "console=ttyS0 reboot=k panic=1 io_delay=none acpi=off";
      if (!cfg.extra.empty()) cmdline += " " + cfg.extra;
      const std::vector<std::string> more{"--xen",    "--paused",       "--kernel",  cfg.kernel,
                                          "--vcpus",  std::to_string(cfg.vcpus), "--upcall", upcall_arg(cfg.upcall),
                                          "--cmdline", cmdline,         "--console", "socket:" + p.console_socket(n),
                                          "--console-log", p.log_file("console-" + cfg.name),
                                          // the Xen PV console (hvc0), as libxl gives every HVM guest
                                          "--pv-console", "socket:" + p.pv_console_socket(n),
                                          "--pv-console-log", p.log_file("console-pv-" + cfg.name),
                                          // exit, hypercall and upcall counters in its log at stop
                                          "--stats",
                                          // what the guest holds after ballooning (`xpv list`)
                                          "--memory-file", p.memory_file(n),
                                          // paused or running (`xpv list`, `xpv pause`)
                                          "--state-file", p.state_file(n),
                                          // the same counters every second while it runs (`xpv top`)
                                          "--stats-file", p.vmm_stats_file(n)};
      argv.insert(argv.end(), more.begin(), more.end());
      std::error_code ec;  // the backends make it too; xpv-vmm says so in its log if it is missing
      std::filesystem::create_directories(std::filesystem::path(p.vmm_stats_file(n)).parent_path(), ec);
      if (!cfg.ramdisk.empty()) {
        argv.push_back("--initrd");
        argv.push_back(cfg.ramdisk);
      }
      // `cpus`: each placed vCPU's host CPUs (xl's vCPU pinning)
      for (std::size_t i = 0; i < cfg.vcpu_affinity.size(); ++i) {
        if (cfg.vcpu_affinity[i].empty()) continue;
        argv.push_back("--vcpu-affinity");
        argv.push_back(fmt::format("{}:{}", i, kvm::format_cpu_list(cfg.vcpu_affinity[i])));
      }
    } else {
      // One netif and one blkif queue per vcpu, as Linux's netfront and blkfront have it
      // (bounded by the backend).
      const std::vector<std::string> more{"--netns", rec.netns, "--net-queues",
                                          std::to_string(std::clamp(cfg.vcpus, 1u, 16u)), "--blk-queues",
                                          std::to_string(std::clamp(cfg.vcpus, 1u, 16u))};
      argv.insert(argv.end(), more.begin(), more.end());
    }
    rec.pid = spawn({argv, {"XPV_RUN_DIR=" + p.run_dir, "XENSTORED_PATH=" + p.xenstore_socket}, log, true});
    self.record = rec;  // before anything else can fail: the undo below stops this process
    if (sched_hierarchy) {
      // Its own cgroup for its CPU weight and cap, before its vCPUs are let run (it was created
      // paused) or, for a process domain, moments after it started.
      rec.cgroup = place_in_cgroup(*sched_hierarchy, rec.uuid, rec.pid, sched);
      rec.cpu_weight = sched.weight;
      rec.cap = sched.cap;
      self.record = rec;  // the undo removes the cgroup once the process is gone
    }
    write_record(dir, rec);
    wait_ready(rec.pid, log, offset, program);

    throw_if_interrupted();
    // 2. The domain's nodes, one transaction.
    xs.transaction([&](TxId tx) { xs.write_nodes(domain_nodes({n, cfg.name, cfg.memory_mib, rec.uuid, cfg.maxmem_mib}), tx); });

    // 3. Introduce it: its xenstore ring's frame and event channel, from its control socket.
    domain::XenstoreInfo ring;
    try {
      auto control = domain::ControlClient::connect(p.control_socket(n), "xpv");
      ring = control.xenstore();
    } catch (const std::exception& e) {
      throw ToolstackError(fmt::format("cannot ask dom{} for its xenstore ring ({}): {}", n, p.control_socket(n), e.what()));
    }
    xs.introduce(n, ring.gfn, ring.port);
    throw_if_interrupted();

    // 4. Devices, one transaction each, then (unless --no-wait) until both ends are Connected.
    std::vector<DeviceRef> devices;
    for (const auto& disk : cfg.disks) {
      DeviceRef d{DeviceKind::vbd, disk.vdev.devid};
      add_device(xs, n, d, vbd_nodes(n, disk));
      devices.push_back(d);
    }
    for (std::uint32_t i = 0; i < cfg.vifs.size(); ++i) {
      const auto& v = cfg.vifs[i];
      const config::Mac mac = v.mac ? *v.mac : generate_mac(macs, system_random_byte);
      macs.insert(mac.str());
      DeviceRef d{DeviceKind::vif, i};
      add_device(xs, n, d, vif_nodes(n, i, v, mac));
      devices.push_back(d);
    }
    throw_if_interrupted();
    if (hvm && !paused) {
      try {
        domain::ControlClient::connect(p.control_socket(n), "xpv").unpause();
      } catch (const std::exception& e) {
        throw ToolstackError(fmt::format("cannot unpause dom{} ({}): {}", n, p.control_socket(n), e.what()));
      }
    }
    // An HVM guest's frontends connect once its kernel has booted: as xl, do not wait for them.
    if (wait && !hvm) {
      wait_connected(xs, n, devices, ctx.device_timeout, [&] { return domain_process_runs(rec); },
                     fmt::format("see {} and {}", log, p.log_dir));
    }
    throw_if_interrupted();  // the last chance: from here on the domain is made
    // 5. Its monitor, which acts on on_poweroff / on_reboot / on_crash when the process ends.
    rec.monitor_pid = spawn_monitor(p, rec);
    self.record = rec;  // the undo stops the monitor too
    write_record(dir, rec);
    ctx.out << fmt::format("Created domain {} (id {}, {}, {} MiB{}, pid {})\n", cfg.name, n, rec.type, cfg.memory_mib,
                           cfg.maxmem_mib != cfg.memory_mib ? fmt::format(" of maxmem {}", cfg.maxmem_mib) : "",
                           rec.pid);
    if (hvm) ctx.out << fmt::format("  console: xpv console {} (log: {})\n", cfg.name, log);
    if (paused) ctx.out << fmt::format("  paused: its vCPUs start with `xpv unpause {}`\n", cfg.name);
    for (const auto& disk : cfg.disks) {
      ctx.out << fmt::format("  {}: {}\n", disk.vdev.name, p.vbd_disk(n, disk.vdev.devid));
    }
    for (std::uint32_t i = 0; i < cfg.vifs.size(); ++i) {
      const auto a = vif_addresses_of(cfg.vifs[i]);
      ctx.out << fmt::format("  vif {}: {}, domain {} in network namespace {}\n", i, vif_host_side(n, i, cfg.vifs[i]),
                             a ? fmt::format("{}/{}", netback::ipv4_string(a->domain), a->prefix) : fmt::format("eth{}", i),
                             rec.netns);
    }
  } catch (...) {
    // Undo everything: the same path as destroy, on whatever exists of the domain.
    try {
      destroy_domain(ctx, &xs, self);
    } catch (const std::exception& e) {
      ctx.err << fmt::format("warning: undoing the creation of dom{}: {}\n", n, e.what());
    }
    throw;
  }
}

void cmd_list(Context& ctx, bool json) {
  auto xs = Xenstore::try_connect(ctx.paths.xenstore_socket);
  if (!xs) ctx.err << fmt::format("warning: xpv-xenstored is not running (no {}); showing the run directory only\n", ctx.paths.xenstore_socket);
  const auto doms = gather_domains(ctx.paths, xs.get());
  ctx.out << (json ? format_list_json(doms, host_facts()) : format_list(doms, host_facts()));
}

void cmd_destroy(Context& ctx, const std::string& which) {
  auto xs = Xenstore::try_connect(ctx.paths.xenstore_socket);
  make_dirs(ctx.paths.run_dir, 0700);
  RunLock lock(ctx.paths.lock_file());
  const auto doms = gather_domains(ctx.paths, xs.get());
  const DomainSummary d = resolve_domain(doms, which);
  destroy_domain(ctx, xs.get(), d);
  ctx.out << fmt::format("Destroyed domain {}\n", domain_label(d));
}

void cmd_shutdown(Context& ctx, const std::string& which, std::chrono::milliseconds timeout) {
  auto xs = Xenstore::try_connect(ctx.paths.xenstore_socket);
  make_dirs(ctx.paths.run_dir, 0700);
  RunLock lock(ctx.paths.lock_file());
  const auto doms = gather_domains(ctx.paths, xs.get());
  const DomainSummary d = resolve_domain(doms, which);
  std::string how = "it was not running";
  if (d.pid > 0) {
    // As `xl shutdown`: a domain whose PV drivers advertise control/feature-poweroff (Linux's
    // xen manage code does, so does xpv-front) is asked through control/shutdown and shuts itself
    // down (Linux: an orderly poweroff, file systems unmounted); one without gets SIGTERM to its
    // domain process, which stops it at once (writes it had acknowledged are on disk anyway).
    const std::string control = domain_path(d.domid) + "/control";
    if (xs && xs->read(control + "/feature-poweroff").value_or("") == "1") {
      xs->write(control + "/shutdown", "poweroff");
      how = "the guest was asked through control/shutdown";
    } else {
      ::kill(d.pid, SIGTERM);
      how = "no PV control in the guest: its process got SIGTERM";
    }
    if (!wait_gone(d.pid, timeout)) {
      ctx.err << fmt::format("warning: {} did not shut down within {} s; destroying it\n", domain_label(d),
                             std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
    }
  }
  destroy_domain(ctx, xs.get(), d);
  ctx.out << fmt::format("Shut down domain {} ({})\n", domain_label(d), how);
}

}  // namespace xpv::toolstack
