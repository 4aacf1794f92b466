// What L1's kernel console says about L1's health. `xpv testbed` follows it to stop an L1 that
// can no longer finish: nested SVM under TCG sometimes leaves both of L1's CPUs spinning inside
// KVM_RUN, reported as soft lockups that grow until the session's timeout (tools/testbed/README.md)
// — waiting for that timeout only costs time, and whoever runs the session retries a lost L1.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace xpv::testbed {

// One line of Linux's soft-lockup report, "... watchdog: BUG: soft lockup - CPU#1 stuck for 261s!
// [vcpu1:170]": the CPU, how long, the task ("" when the line has none). nullopt for any other line.
struct SoftLockup {
  int cpu = 0;
  int seconds = 0;
  std::string task;
};
std::optional<SoftLockup> parse_soft_lockup(std::string_view line);

// Fed the console's bytes as they come (lines may arrive in pieces); says, once, that a CPU has
// been reported stuck for at least `limit_s` seconds. limit_s <= 0: never.
class ConsoleWatch {
 public:
  explicit ConsoleWatch(int limit_s) : limit_s_(limit_s) {}
  // A one-line description the first time the limit is reached, else nullopt.
  std::optional<std::string> feed(std::string_view bytes);

 private:
  int limit_s_;
  std::string partial_;  // the line not finished yet
  bool fired_ = false;
};

}  // namespace xpv::testbed
