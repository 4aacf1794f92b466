// spawn and the checks that a pid is still the process a record names (process.h), on real
// processes: /bin/sh and sleep.
#include <fcntl.h>
#include <signal.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "xpv/toolstack/error.h"
#include "xpv/toolstack/process.h"

namespace xpv::toolstack {
namespace {

using namespace std::chrono_literals;

// The spawned process and what it started (its own session and process group: spawn's
// new_session) go also when an expectation fails — once: a reaped pid may be another's by then.
struct Stopped {
  pid_t pid;
  bool stop() {
    if (pid <= 0) return true;
    ::kill(-pid, SIGKILL);  // sh's sleep too
    const bool gone = stop_process(std::exchange(pid, 0), 2s);
    return gone;
  }
  ~Stopped() { (void)stop(); }
};

std::string cmdline(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline");
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(Process, ARunningProcessIsKnownByItsProgramAndArguments) {
  // sh -c '…' --domid 3: the words after the script are sh's $0 and $1, and stay in its argv.
  const pid_t pid = spawn({{"/bin/sh", "-c", "sleep 30; :", "--domid", "3"}, {}, "", true});
  Stopped stop{pid};
  // posix_spawn returns while the kernel is still inside exec (the vfork is released before the
  // new image's arguments are in place): an empty /proc/<pid>/cmdline for that moment.
  for (int i = 0; i < 500 && cmdline(pid).empty(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(process_is(pid, "sh")) << cmdline(pid);
  EXPECT_TRUE(process_runs(pid, "sh", {"--domid", "3"}));
  EXPECT_TRUE(process_runs(pid, "sh", {}));
  EXPECT_FALSE(process_runs(pid, "sh", {"--domid", "4"})) << "another domain's process";
  EXPECT_FALSE(process_runs(pid, "sh", {"3", "--domid"}));
  EXPECT_FALSE(process_runs(pid, "sh", {"--domid", "3", "x"}));
  EXPECT_FALSE(process_runs(pid, "xpv-front", {"--domid", "3"}));
  EXPECT_TRUE(stop.stop());
  EXPECT_FALSE(process_runs(pid, "sh", {"--domid", "3"})) << "gone (and not yet anyone else's)";
}

TEST(Process, ASpawnedProcessGetsNoDescriptorOfOursButItsOutput) {
  const int leaky = ::open("/dev/null", O_RDONLY);  // no O_CLOEXEC, as a library might open one
  ASSERT_GE(leaky, 3);
  const pid_t pid = spawn({{"/bin/sh", "-c", "exec sleep 30"}, {}, "", true});
  Stopped stop{pid};
  ::close(leaky);
  for (int i = 0; i < 500 && cmdline(pid).rfind("sleep", 0) != 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(cmdline(pid).rfind("sleep", 0), 0u) << "sh did not exec sleep";
  // sleep's dynamic loader opens its libraries as it starts (fd 3 for a moment): looked at until
  // only the three are left, which a descriptor of ours would never be.
  const std::set<std::string> want{"0", "1", "2"};
  std::set<std::string> fds;
  for (int i = 0; i < 500 && fds != want; ++i) {
    if (i > 0) std::this_thread::sleep_for(10ms);
    fds.clear();
    for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
      fds.insert(e.path().filename().string());
    }
  }
  EXPECT_EQ(fds, want);
}

// Ctrl-C during a command that builds something: a flag the command looks at, not the end of
// the process — except for a signal the caller ignores (nohup's SIGHUP), which stays ignored.
TEST(Process, AnInterruptGuardTurnsSignalsIntoAFlagAndLeavesIgnoredOnesAlone) {
  struct sigaction ignore {}, saved_hup {}, saved_int {}, now {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ASSERT_EQ(::sigaction(SIGHUP, &ignore, &saved_hup), 0);
  ASSERT_EQ(::sigaction(SIGINT, nullptr, &saved_int), 0);
  {
    InterruptGuard guard;
    EXPECT_EQ(interrupt_signal(), 0);
    EXPECT_NO_THROW(throw_if_interrupted());
    ASSERT_EQ(::raise(SIGHUP), 0);  // ignored before: still ignored
    EXPECT_EQ(interrupt_signal(), 0);
    ASSERT_EQ(::raise(SIGINT), 0);  // would end this test binary without the guard
    EXPECT_EQ(interrupt_signal(), SIGINT);
    try {
      throw_if_interrupted();
      ADD_FAILURE() << "no exception";
    } catch (const ToolstackError& e) {
      EXPECT_STREQ(e.what(), "interrupted by SIGINT");
    }
  }
  ASSERT_EQ(::sigaction(SIGINT, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, saved_int.sa_handler) << "SIGINT's disposition given back";
  ASSERT_EQ(::sigaction(SIGHUP, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
  ::sigaction(SIGHUP, &saved_hup, nullptr);
}

}  // namespace
}  // namespace xpv::toolstack
