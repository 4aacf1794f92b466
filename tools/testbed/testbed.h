// `xpv testbed` — run a command inside a throwaway L1 VM that has a real KVM.
//
// This machine's /dev/kvm emulates guest ring 0 (~1 µs per instruction), so Linux guests crawl
// natively. QEMU's TCG emulates AMD SVM, so Debian's own kernel booted under TCG (L1) can load
// kvm + kvm-amd, and xpv-vmm runs against that genuine KVM (shared/docs/ENVIRONMENT.md).
//
//   host: xpv testbed ── fork/exec ──► nice qemu-system-x86_64 -accel tcg (L1)
//     ~/.cache/xpv/kernel/<kver>/       vmlinuz + the module tree (kernel.h; apt-get download, once)
//     run dir (temp, 9p "xpvctl")       cmd.sh / env in, ready / rc / error out
//     share dir (9p "share", rw)        mounted at the same path inside L1
//   L1: busybox init (l1_init.cpp) → insmod virtio/9p/kvm → mount host root (9p, ro) → chroot
//       → CMD, its stdout+stderr on ttyS1 (a file the host tails to its stdout) → rc → poweroff.
//
// Setup code: throws std::runtime_error with one clear line; caught at main.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "xpv/testbed/kernel.h"  // Kernel, ensure_kernel: the Debian kernel cache

namespace CLI {
class App;
}

namespace xpv::testbed {

struct Options {
  unsigned mem_mib = 3072;        // L1 memory
  std::string share;              // writable share, same path inside L1 (default: a temp dir)
  unsigned timeout_s = 1800;      // whole run, L1 boot included; QEMU is killed after it
  unsigned quiet_s = 0;           // no output from CMD for this long: L1 is killed, exit 124 (0: never)
  unsigned boot_s = 120;          // L1 not ready (its init has not started CMD) after this long:
                                  // killed, exit 124 (0: never). Ready takes 6-9 s here idle, 37 s beside a build.
  bool print_kernel = false;      // fetch/cache the kernel, print its vmlinuz path, exit
  std::vector<std::string> cmd;   // command to run inside L1 (after `--`)
};

// Runs opts.cmd inside L1; returns its exit status (125 when the testbed itself failed, 124 on
// timeout).
int run(const Options& opts);

// The `testbed` subcommand, registered on the `xpv` CLI. main() calls run() when selected().
class Command {
 public:
  explicit Command(CLI::App& app);
  bool selected() const;
  int run() const;

 private:
  CLI::App* sub_ = nullptr;
  Options opts_;
};

std::unique_ptr<Command> add_command(CLI::App& app);

// The L1 /init script (busybox sh), defined in l1_init.cpp.
extern const char* const kL1Init;

}  // namespace xpv::testbed
