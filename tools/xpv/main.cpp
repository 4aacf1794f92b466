// xpv — the toolstack CLI (xl-like). Subcommands are added as the project grows; one that is not
// built yet is not listed (CLI11 then says so with a clear error).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <exception>
#include <string>

#include "bench/bench.h"
#include "testbed/testbed.h"

namespace {

int run_bench(const std::string& suite_name, const std::string& json_path, bool quick) {
  xpv::bench::Options opts;
  if (quick) opts.scale = 0.1;
  for (const auto& s : xpv::bench::suites()) {
    if (s.name != suite_name) continue;
    auto results = s.run(opts);
    xpv::bench::print_table(s.name, results);
    if (!json_path.empty() && !xpv::bench::write_json(json_path, s.name, results)) return 1;
    return 0;
  }
  std::string known;
  for (const auto& s : xpv::bench::suites()) known += (known.empty() ? "" : ", ") + s.name;
  fmt::print(stderr, "xpv bench: unknown suite '{}' (known: {})\n", suite_name, known);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"xpv — Xen-style paravirtual I/O for HVM guests on Linux/KVM"};
  app.require_subcommand(1);

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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (*bench) return run_bench(suite, json_path, quick);
    if (testbed->selected()) return testbed->run();
  } catch (const std::exception& e) {
    fmt::print(stderr, "xpv: {}\n", e.what());
    return 1;
  }
  return 0;
}
