#include <gtest/gtest.h>

#include "xpv/toolstack/daemons.h"

namespace xpv::toolstack {
namespace {

Paths sample() {
  Paths p;
  p.run_dir = "/t/run";
  p.log_dir = "/t/log";
  p.xenstore_socket = "/t/xs.sock";
  p.bin_dir = "/b";
  return p;
}

TEST(Daemons, XenstoredCommandLine) {
  EXPECT_EQ(daemon_argv(sample(), "xpv-xenstored"),
            (std::vector<std::string>{"/b/xpv-xenstored", "--socket", "/t/xs.sock", "--foreground", "--pid-file",
                                      "/t/run/xpv-xenstored.pid"}));
  EXPECT_EQ(daemon_argv(sample(), "xpv-xenstored", true),
            (std::vector<std::string>{"/b/xpv-xenstored", "--socket", "/t/xs.sock", "--foreground", "--pid-file",
                                      "/t/run/xpv-xenstored.pid", "--run-dir", "/t/run"}));
  EXPECT_EQ(daemon_argv(sample(), "xpv-xenstored", true, true),
            (std::vector<std::string>{"/b/xpv-xenstored", "--socket", "/t/xs.sock", "--foreground", "--pid-file",
                                      "/t/run/xpv-xenstored.pid", "--run-dir", "/t/run", "--journal",
                                      "/t/run/xpv-xenstored.journal"}));
}

TEST(Daemons, BackendCommandLine) {
  EXPECT_EQ(daemon_argv(sample(), "xpv-blkback"),
            (std::vector<std::string>{"/b/xpv-blkback", "--xenstore", "/t/xs.sock", "--run-dir", "/t/run",
                                      "--foreground", "--pid-file", "/t/run/xpv-blkback.pid"}));
  EXPECT_EQ(daemon_env(sample()), (std::vector<std::string>{"XPV_RUN_DIR=/t/run", "XENSTORED_PATH=/t/xs.sock"}));
  EXPECT_EQ(backend_programs(), (std::vector<std::string>{"xpv-blkback", "xpv-netback"}));
}

TEST(Daemons, SupervisorCommandLine) {
  EXPECT_EQ(supervisor_argv(sample(), "/b/xpv"),
            (std::vector<std::string>{"/b/xpv", "supervise", "--run-dir", "/t/run", "--log-dir", "/t/log",
                                      "--xenstore", "/t/xs.sock", "--bin-dir", "/b"}));
}

TEST(Daemons, Backoff) {
  using std::chrono::milliseconds;
  EXPECT_EQ(backoff_delay(0), milliseconds(200));
  EXPECT_EQ(backoff_delay(1), milliseconds(400));
  EXPECT_EQ(backoff_delay(5), milliseconds(6400));
  EXPECT_EQ(backoff_delay(6), milliseconds(10000));
  EXPECT_EQ(backoff_delay(1000), milliseconds(10000));
}

}  // namespace
}  // namespace xpv::toolstack
