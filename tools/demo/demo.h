// `xpv demo` — the main job in one command: checks the prerequisites, builds the guest image
// (`xpv image build`), runs `xpv bench hvm` (a stock Linux HVM guest with Xen PV drivers under xpv
// next to QEMU + KVM + virtio, iperf3 and bonnie++, both VMMs in one testbed session per part) and prints a short
// report: the xpv/QEMU table, where the JSON, the chart and the logs are.
// Runs on main's thread; setup failures throw std::runtime_error with one line (main prints it).
#pragma once

#include <memory>
#include <string>

namespace CLI {
class App;
}

namespace xpv::demo {

struct Options {
  std::string out_dir = "xpv-demo";  // hvm.json, hvm-ratios.png, hvm-logs/
  bool quick = false;                // `xpv bench hvm --quick`
};

// Returns the exit status: 0 when every figure measured on L1's clock exists on both sides, 1
// otherwise; every missing figure (also bonnie++'s "+++++") is listed with its reason.
int run(const Options& opts);

class Command {
 public:
  explicit Command(CLI::App& app);
  bool selected() const;
  int run() const { return demo::run(opts_); }

 private:
  CLI::App* sub_ = nullptr;
  Options opts_;
};

std::unique_ptr<Command> add_command(CLI::App& app);

}  // namespace xpv::demo
