#include <gtest/gtest.h>
#include <stdlib.h>

#include "xpv/test/scoped_env.h"
#include "xpv/toolstack/paths.h"

namespace xpv::toolstack {
namespace {

using xpv::test::ScopedEnv;

TEST(Paths, DefaultsThenEnvThenCli) {
  ScopedEnv a("XPV_RUN_DIR", nullptr), b("XPV_LOG_DIR", nullptr), c("XENSTORED_PATH", nullptr), d("XPV_BIN_DIR", nullptr);
  Paths p = Paths::resolve({}, "/opt/xpv/bin/xpv");
  EXPECT_EQ(p.run_dir, "/run/xpv");
  EXPECT_EQ(p.log_dir, "/var/log/xpv");
  EXPECT_EQ(p.xenstore_socket, "/run/xenstored/socket");
  EXPECT_EQ(p.bin_dir, "/opt/xpv/bin");
  {
    ScopedEnv e("XPV_RUN_DIR", "/e/run"), f("XENSTORED_PATH", "/e/xs");
    p = Paths::resolve({}, "/opt/xpv/bin/xpv");
    EXPECT_EQ(p.run_dir, "/e/run");
    EXPECT_EQ(p.xenstore_socket, "/e/xs");
    PathOptions cli;
    cli.run_dir = "/c/run";
    p = Paths::resolve(cli, "/opt/xpv/bin/xpv");
    EXPECT_EQ(p.run_dir, "/c/run");
    EXPECT_EQ(p.xenstore_socket, "/e/xs");
  }
}

TEST(Paths, Derived) {
  Paths p;
  p.run_dir = "/r";
  p.log_dir = "/l";
  p.bin_dir = "/b";
  EXPECT_EQ(p.domain_dir(3), "/r/dom3");
  EXPECT_EQ(p.control_socket(3), "/r/dom3.sock");
  EXPECT_EQ(p.pid_file("xpv-blkback"), "/r/xpv-blkback.pid");
  EXPECT_EQ(p.log_file("xpv-blkback"), "/l/xpv-blkback.log");
  EXPECT_EQ(p.binary("xpv-front"), "/b/xpv-front");
  EXPECT_EQ(p.vbd_disk(3, 51712), "/r/dom3/vbd/51712/disk");
  EXPECT_EQ(p.lock_file(), "/r/xpv.lock");
}

}  // namespace
}  // namespace xpv::toolstack
