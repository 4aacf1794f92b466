// xpv — the toolstack CLI (xl-like). This file only parses the command line; every command is a
// function of xpv::toolstack (tools/toolstack/, commands.h) so it can be tested without a shell.
// A command's failure is one line on stderr, "xpv COMMAND: what went wrong", and exit status 1;
// bad usage is CLI11's message and exit status 2 (106 for CLI11's own codes, as it reports them).
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>

#include "bench/bench.h"
#include "demo/demo.h"
#include "testbed/testbed.h"
#include "xpv/image/command.h"
#include "xpv/toolstack/commands.h"
#include "xpv/toolstack/error.h"

namespace {

int run_bench(const std::string& suite_name, const std::string& json_path, bool quick) {
  xpv::bench::Options opts;
  if (quick) opts.scale = 0.1;
  opts.json_path = json_path;
  for (const auto& s : xpv::bench::suites()) {
    if (s.name != suite_name) continue;
    // Where the JSON goes is settled before a suite runs for minutes: its directory is made (as
    // `xpv demo --out DIR` is) and must be writable.
    std::vector<std::filesystem::path> made;  // directories made here, deepest first
    if (!json_path.empty()) {
      std::filesystem::path dir = std::filesystem::path(json_path).parent_path();
      if (dir.empty()) dir = ".";
      for (auto d = dir; !d.empty() && !std::filesystem::exists(d); d = d.parent_path()) made.push_back(d);
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec || ::access(dir.c_str(), W_OK) != 0) {
        fmt::print(stderr, "xpv bench: --json {}: cannot write into {}: {}\n", json_path, dir.string(),
                   ec ? ec.message() : std::strerror(errno));
        return 1;
      }
    }
    std::vector<xpv::bench::Result> results;
    try {
      results = s.run(opts);
    } catch (...) {
      // A suite that failed (a bad setting, before it measured anything) leaves no directory it
      // did not write into; one holding logs stays.
      for (const auto& d : made) {
        std::error_code ignored;
        if (!std::filesystem::remove(d, ignored)) break;
      }
      throw;
    }
    xpv::bench::print_table(s.name, results);
    if (!json_path.empty()) {
      if (!xpv::bench::write_json(json_path, s.name, results)) return 1;
      const std::string png = xpv::bench::plot_path(opts, s.name, "ratios");
      if (xpv::bench::write_ratio_chart(png, s.name, results)) fmt::print("chart: {}\n", png);
    }
    return 0;
  }
  std::string known;
  for (const auto& s : xpv::bench::suites()) known += (known.empty() ? "" : ", ") + s.name;
  fmt::print(stderr, "xpv bench: unknown suite '{}' (known: {})\n", suite_name, known);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  namespace ts = xpv::toolstack;
  CLI::App app{"xpv — Xen-style paravirtual I/O for HVM guests on Linux/KVM"};
  app.require_subcommand(1);
  app.fallthrough();  // the path options below may follow the subcommand: `xpv up --run-dir D`

  ts::PathOptions cli_paths;
  app.add_option("--run-dir", cli_paths.run_dir, "run-time directory (default /run/xpv; env XPV_RUN_DIR)");
  app.add_option("--log-dir", cli_paths.log_dir, "daemon and domain logs (default /var/log/xpv; env XPV_LOG_DIR)");
  app.add_option("--xenstore", cli_paths.xenstore_socket,
                 "xpv-xenstored's socket (default /run/xenstored/socket; env XENSTORED_PATH)");
  app.add_option("--netns-dir", cli_paths.netns_dir, "where domains' network namespaces are made (default /run/netns; env XPV_NETNS_DIR)");
  app.add_option("--bin-dir", cli_paths.bin_dir, "where xpv-xenstored, xpv-front, … are (default: next to xpv)");

  auto* up = app.add_subcommand("up", "start xpv-xenstored and the backends (supervised)");
  auto* down = app.add_subcommand("down", "stop everything `xpv up` started");
  bool force = false;
  down->add_flag("--force", force, "destroy every domain first");
  auto* supervise = app.add_subcommand("supervise", "(internal) restart backends that die; started by `xpv up`");
  supervise->group("");

  auto* live_update = app.add_subcommand(
      "live-update", "replace xpv-xenstored's binary in place, domains and clients connected on (xenstore-control live-update)");
  std::string lu_binary;
  int lu_timeout_s = 60;
  bool lu_force = false;
  live_update->add_option("binary", lu_binary, "the new xpv-xenstored (default: the one next to xpv)");
  live_update->add_option("-t,--timeout", lu_timeout_s, "seconds to wait for open transactions to end")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600));
  live_update->add_flag("-F,--force", lu_force, "end open transactions (their clients see EAGAIN and retry)");

  bool no_wait = false;
  auto* create = app.add_subcommand("create", "create a domain from an xl-style configuration file");
  std::string cfg;
  create->add_option("config", cfg, "configuration file")->required();
  create->add_flag("--no-wait", no_wait, "do not wait for the devices to connect");
  bool create_paused = false;
  create->add_flag("-p,--paused", create_paused, "leave the (HVM) domain paused once it is made; `xpv unpause` starts it, as xl create -p");

  auto* list = app.add_subcommand("list", "list domains");
  bool json = false;
  list->add_flag("--json", json, "machine-readable output");

  ts::TopOptions top_opts;
  auto* top = app.add_subcommand("top", "the domains' CPU, memory, disk and network counters every few seconds, as xentop");
  top->add_option("-d,--delay", top_opts.delay_s, "seconds between updates (0.1-3600)")->capture_default_str();
  top->add_option("-i,--iterations", top_opts.iterations, "number of updates, then exit (0: until interrupted)")
      ->capture_default_str();
  top->add_flag("-b,--batch", top_opts.batch, "batch mode: print each update below the last (no screen clearing)");
  top->add_flag("--json", top_opts.json, "one JSON object per update, one per line (counters and their rates)");

  std::string which;
  auto* destroy = app.add_subcommand("destroy", "tear a domain down now");
  destroy->add_option("domain", which, "name or id")->required();
  auto* console = app.add_subcommand("console", "attach to an HVM domain's serial or PV console (Ctrl-] detaches)");
  console->add_option("domain", which, "name or id")->required();
  std::string console_type = "serial";
  console->add_option("-t,--type", console_type, "serial (COM1) or pv (the Xen PV console, hvc0), as xl console -t")
      ->check(CLI::IsMember({"serial", "pv"}))
      ->capture_default_str();
  auto* shutdown = app.add_subcommand(
      "shutdown", "ask a domain to shut down (control/shutdown = poweroff if its PV drivers offer it, else SIGTERM), wait, destroy it");
  shutdown->add_option("domain", which, "name or id")->required();
  int shutdown_timeout_s = 20;
  shutdown->add_option("--timeout", shutdown_timeout_s, "seconds to wait before destroying it anyway")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();

  auto* reboot = app.add_subcommand(
      "reboot", "ask a domain to reboot (control/shutdown = reboot; its PV drivers must offer it), wait until its "
                "monitor has created it again (on_reboot = \"restart\")");
  reboot->add_option("domain", which, "name or id")->required();
  int reboot_timeout_s = 60;
  reboot->add_option("--timeout", reboot_timeout_s, "seconds to wait for it to stop")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  std::string sysrq_key;
  auto* sysrq = app.add_subcommand("sysrq", "send a magic SysRq key to a domain (control/sysrq), as xl sysrq");
  sysrq->add_option("domain", which, "name or id")->required();
  sysrq->add_option("key", sysrq_key, "one letter or digit")->required();
  std::string mem_size;
  auto* mem_set = app.add_subcommand("mem-set", "set an HVM domain's memory target (memory/target); its balloon driver gives memory back or takes it again, up to its maxmem, as xl mem-set");
  mem_set->add_option("domain", which, "name or id")->required();
  mem_set->add_option("size", mem_size, "new target: MiB, or with a unit t, g, m, k, b (e.g. 256, 1g)")->required();
  auto* pause = app.add_subcommand("pause", "stop an HVM domain's vCPUs until `xpv unpause` (its devices, event channels and clock go on), as xl pause");
  pause->add_option("domain", which, "name or id")->required();
  auto* unpause = app.add_subcommand("unpause", "let a paused HVM domain's vCPUs run again (or start one created paused), as xl unpause");
  unpause->add_option("domain", which, "name or id")->required();
  std::vector<std::string> vcpu_domains;
  auto* vcpu_list = app.add_subcommand("vcpu-list", "where HVM domains' vCPUs run: host CPU, state, CPU time, the CPUs each may use, as xl vcpu-list");
  vcpu_list->add_option("domain", vcpu_domains, "names or ids (default: every running HVM domain)");
  std::string pin_vcpu, pin_cpus;
  auto* vcpu_pin = app.add_subcommand("vcpu-pin", "restrict an HVM domain's vCPU (or all) to host CPUs while it runs, as xl vcpu-pin (the config's `cpus` does it at start)");
  vcpu_pin->add_option("domain", which, "name or id")->required();
  vcpu_pin->add_option("vcpu", pin_vcpu, "vCPU number, or all")->required();
  vcpu_pin->add_option("cpus", pin_cpus, "host CPUs, xl's CPU-LIST: \"0-3,^1\", \"2\", all")->required();
  auto* info = app.add_subcommand("info", "what the host offers domains: CPUs, memory, KVM, the Xen version guests are told, the daemons, as xl info");
  std::vector<std::string> uptime_domains;
  auto* uptime = app.add_subcommand("uptime", "how long each running domain has run (and the host, as Domain-0), as xl uptime");
  uptime->add_option("domain", uptime_domains, "names or ids (default: every running domain and Domain-0)");
  std::optional<std::int64_t> sched_weight, sched_cap;
  std::string sched_domain;
  auto* sched_credit = app.add_subcommand("sched-credit", "a domain's CPU weight and cap (a cgroup of its own), listed or set while it runs, as xl sched-credit (the config's cpu_weight / cap do it at start)");
  sched_credit->add_option("-d,--domain", sched_domain, "name or id (default: list every running domain)");
  sched_credit->add_option("-w,--weight", sched_weight, "1..65535 (default 256): its share of the CPU against other domains");
  sched_credit->add_option("-c,--cap", sched_cap, "% of one host CPU it may use at most (0: no cap)");
  auto* monitor = app.add_subcommand("monitor", "(internal) act on a domain's on_poweroff/on_reboot/on_crash; started by `xpv create`");
  monitor->group("");
  unsigned monitor_domid = 0;
  std::string monitor_uuid;
  monitor->add_option("domid", monitor_domid, "domain id")->required()->check(CLI::Range(1, 32751));
  monitor->add_option("uuid", monitor_uuid, "the domain's uuid (from its record)")->required();

  auto* block_list = app.add_subcommand("block-list", "list a domain's disks and both ends' states, as xl block-list");
  block_list->add_option("domain", which, "name or id")->required();
  auto* net_list = app.add_subcommand("network-list", "list a domain's network interfaces and both ends' states, as xl network-list");
  net_list->add_option("domain", which, "name or id")->required();
  std::string spec;
  auto* block_attach = app.add_subcommand("block-attach", "add a disk to a domain");
  block_attach->add_option("domain", which, "name or id")->required();
  block_attach->add_option("spec", spec, "disk spec: 'format=raw, vdev=xvdb, access=rw, target=/path/img'")->required();
  block_attach->add_flag("--no-wait", no_wait, "do not wait for the device to connect");
  auto* block_detach = app.add_subcommand("block-detach", "remove a disk from a domain");
  block_detach->add_option("domain", which, "name or id")->required();
  block_detach->add_option("vdev", spec, "virtual disk, e.g. xvdb")->required();
  auto* net_attach = app.add_subcommand("network-attach", "add a network interface to a domain");
  net_attach->add_option("domain", which, "name or id")->required();
  net_attach->add_option("spec", spec, "vif spec: 'mac=00:16:3e:00:00:01, ip=10.0.0.2/24'")->required();
  net_attach->add_flag("--no-wait", no_wait, "do not wait for the device to connect");
  auto* net_detach = app.add_subcommand("network-detach", "remove a network interface from a domain");
  net_detach->add_option("domain", which, "name or id")->required();
  net_detach->add_option("devid", spec, "vif device id (0, 1, …)")->required();

  auto* bench = app.add_subcommand("bench", "run a benchmark suite against its reference");
  std::string suite;
  std::string json_path;
  bool quick = false;
  std::string suite_help = "suite:";
  for (const auto& s : xpv::bench::suites()) suite_help += "\n  " + s.name + ": " + s.description;
  bench->add_option("suite", suite, suite_help)->required();
  bench->add_option("--json", json_path, "write results in the shared JSON shape to this file");
  bench->add_flag("--quick", quick, "one tenth of the default iterations");

  auto testbed = xpv::testbed::add_command(app);
  auto image = xpv::image::add_command(app);
  auto demo = xpv::demo::add_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  std::string command = "xpv";
  for (auto* sub : app.get_subcommands()) command += " " + sub->get_name();
  try {
    if (*bench) return run_bench(suite, json_path, quick);
    if (testbed->selected()) return testbed->run();
    if (image->selected()) return image->run();
    if (demo->selected()) return demo->run();
    ts::Context ctx{ts::Paths::resolve(cli_paths, ts::self_executable()), std::cout, std::cerr};
    if (*up) ts::cmd_up(ctx);
    else if (*down) ts::cmd_down(ctx, force);
    else if (*live_update) ts::cmd_live_update(ctx, lu_binary, std::chrono::seconds(lu_timeout_s), lu_force);
    else if (*supervise) return ts::cmd_supervise(ctx);
    else if (*create) ts::cmd_create(ctx, cfg, !no_wait, /*lock_held=*/false, create_paused);
    else if (*pause) ts::cmd_pause(ctx, which);
    else if (*unpause) ts::cmd_unpause(ctx, which);
    else if (*vcpu_list) ts::cmd_vcpu_list(ctx, vcpu_domains);
    else if (*vcpu_pin) ts::cmd_vcpu_pin(ctx, which, pin_vcpu, pin_cpus);
    else if (*sched_credit) ts::cmd_sched_credit(ctx, sched_domain, sched_weight, sched_cap);
    else if (*info) ts::cmd_info(ctx);
    else if (*uptime) ts::cmd_uptime(ctx, uptime_domains);
    else if (*list) ts::cmd_list(ctx, json);
    else if (*top) ts::cmd_top(ctx, top_opts);
    else if (*destroy) ts::cmd_destroy(ctx, which);
    else if (*console) ts::cmd_console(ctx, which, console_type);
    else if (*shutdown) ts::cmd_shutdown(ctx, which, std::chrono::seconds(shutdown_timeout_s));
    else if (*reboot) ts::cmd_reboot(ctx, which, std::chrono::seconds(reboot_timeout_s));
    else if (*sysrq) ts::cmd_sysrq(ctx, which, sysrq_key);
    else if (*mem_set) ts::cmd_mem_set(ctx, which, mem_size);
    else if (*monitor) return ts::cmd_monitor(ctx, static_cast<std::uint16_t>(monitor_domid), monitor_uuid);
    else if (*block_list) ts::cmd_block_list(ctx, which);
    else if (*net_list) ts::cmd_network_list(ctx, which);
    else if (*block_attach) ts::cmd_block_attach(ctx, which, spec, !no_wait);
    else if (*block_detach) ts::cmd_block_detach(ctx, which, spec);
    else if (*net_attach) ts::cmd_network_attach(ctx, which, spec, !no_wait);
    else if (*net_detach) ts::cmd_network_detach(ctx, which, spec);
  } catch (const std::exception& e) {
    std::cout.flush();
    fmt::print(stderr, "{}: {}\n", command, e.what());
    return 1;
  }
  return 0;
}
