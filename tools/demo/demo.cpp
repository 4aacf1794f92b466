// `xpv demo`: prerequisites → `xpv image build` → the `hvm` bench suite → a report (demo.h).
#include "demo/demo.h"

#include <fmt/core.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench.h"

namespace fs = std::filesystem;

namespace xpv::demo {

namespace {

bool have_command(const std::string& name) {
  return std::system(("command -v " + name + " >/dev/null 2>&1").c_str()) == 0;
}

// Everything the bench needs on this machine, each missing piece named; throws with the fix.
void check_prerequisites(const fs::path& bin_dir) {
  if (::geteuid() != 0) throw std::runtime_error("run it as root (the testbed, TAPs and the backends need it)");
  std::vector<std::string> missing;
  // qemu: the testbed's L1 and the reference; the others: the image and the workloads.
  for (const char* c : {"qemu-system-x86_64", "iperf3", "bonnie++", "fio", "gnuplot", "cpio", "mke2fs", "ip"}) {
    if (!have_command(c)) missing.push_back(c);
  }
  if (!fs::exists("/bin/busybox")) missing.push_back("busybox (busybox-static)");
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    throw std::runtime_error("missing " + list + ": run scripts/setup (as root)");
  }
  for (const char* p : {"xpv-vmm", "xpv-xenstored", "xpv-blkback", "xpv-netback", "xpv-front"}) {
    if (!fs::exists(bin_dir / p)) {
      throw std::runtime_error((bin_dir / p).string() + " is not built: build every program (cmake --build " +
                               bin_dir.parent_path().string() + ")");
    }
  }
}

std::string figure(double v) { return std::isfinite(v) ? fmt::format("{:.4g}", v) : "FAILED"; }

}  // namespace

Command::Command(CLI::App& app) {
  sub_ = app.add_subcommand("demo", "the main job: build the guest image, run `xpv bench hvm` (HVM guest with Xen "
                                    "PV drivers under xpv vs QEMU+KVM virtio) and print a report");
  sub_->add_option("--out", opts_.out_dir, "where hvm.json, hvm-ratios.png and hvm-logs/ go")->capture_default_str();
  sub_->add_flag("--quick", opts_.quick, "shorter runs (iperf3 -t 2, bonnie++ 256 MiB)");
}

bool Command::selected() const { return sub_->parsed(); }

std::unique_ptr<Command> add_command(CLI::App& app) { return std::make_unique<Command>(app); }

int run(const Options& opts) {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  fmt::print("xpv demo: 1/3 prerequisites\n");
  check_prerequisites(self.parent_path());

  fmt::print("xpv demo: 2/3 guest image (xpv image build; cached after the first time)\n");
  std::fflush(stdout);
  if (std::system(("'" + self.string() + "' image build").c_str()) != 0) {
    throw std::runtime_error("xpv image build failed (its message is above)");
  }

  fmt::print("xpv demo: 3/3 xpv bench hvm{} (one testbed session when L1 lives through it: 15-20 minutes)\n", opts.quick ? " --quick" : "");
  std::fflush(stdout);
  const bench::Suite* suite = nullptr;
  for (const auto& s : bench::suites()) {
    if (s.name == "hvm") suite = &s;
  }
  if (suite == nullptr) throw std::runtime_error("the hvm bench suite is not compiled in");
  fs::create_directories(opts.out_dir);
  bench::Options bopts;
  bopts.scale = opts.quick ? 0.1 : 1.0;
  bopts.json_path = (fs::absolute(opts.out_dir) / "hvm.json").string();
  const auto results = suite->run(bopts);
  if (!bench::write_json(bopts.json_path, suite->name, results)) return 1;
  const std::string png = bench::plot_path(bopts, suite->name, "ratios");
  const bool chart = bench::write_ratio_chart(png, suite->name, results);

  // The report.
  fmt::print("\nxpv demo: a stock Debian kernel as an HVM guest, Xen PV drivers (xpv) vs virtio (QEMU 7.2 + KVM)\n");
  fmt::print("  {:<28} {:>10} {:>10} {:>9}  {}\n", "metric", "xpv", "QEMU", "xpv/QEMU", "unit");
  std::size_t missing = 0;
  for (const auto& r : results) {
    const bool both = std::isfinite(r.xpv) && r.reference && *r.reference != 0;
    if (!both) ++missing;
    fmt::print("  {:<28} {:>10} {:>10} {:>9}  {}{}\n", r.metric, figure(r.xpv),
               r.reference ? figure(*r.reference) : "FAILED", both ? fmt::format("{:.2f}", r.xpv / *r.reference) : "-",
               r.unit, r.lower_is_better ? " (lower is better)" : "");
  }
  fmt::print("\n  ratio > 1: xpv ahead (for 'lower is better': behind). Nested KVM under TCG: only ratios mean "
             "something.\n");
  fmt::print("  JSON:  {}\n", bopts.json_path);
  fmt::print("  chart: {}\n", chart ? png : std::string("(not drawn: see above)"));
  const fs::path logs = fs::path(bopts.json_path).parent_path() / "hvm-logs";
  if (fs::exists(logs)) fmt::print("  logs:  {}\n", logs.string());
  if (missing == 0) return 0;
  // bonnie++'s own CSV figures (KiB/s, the guest's clock) may be "+++++" (too fast to time): a
  // gap there is reported but is no failure; a gap in a figure L1 measured (every other metric:
  // a bonnie++ failure shows in its host-clock run time too) is.
  std::size_t failed = 0;
  fmt::print(stderr, "xpv demo: {} of {} figures missing:\n", missing, results.size());
  for (const auto& r : results) {
    if (std::isfinite(r.xpv) && r.reference) continue;
    if (r.unit != "KiB/s") ++failed;
    fmt::print(stderr, "  {}: {}\n", r.metric, r.note);
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace xpv::demo
