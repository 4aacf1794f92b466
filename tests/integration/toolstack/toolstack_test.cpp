// `xpv` end to end against a real xpv-xenstored, everything under a temporary directory.
// Programs from other branches are stood in for by toolstack_fake (see fake_programs.cpp); the
// RealFront tests use build/bin/xpv-front and xpv-blkback and skip when those are not built.
#include <fmt/core.h>
#include <gmock/gmock.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/kvm.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "harness.h"
#include "xpv/toolstack/cpu_sched.h"
#include "xpv/toolstack/process.h"
#include "xpv/toolstack/record.h"
#include "xpv/test/loop_device.h"
#include "xpv/unique_fd.h"
#include "xpv/xenbus/client/sync_client.h"

namespace xpv::test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using namespace std::chrono_literals;

const std::string kBin = XPV_BIN_DIR;
const std::string kFake = XPV_FAKE_BIN;

std::optional<pid_t> pid_in(const std::string& file) { return toolstack::read_pid_file(file); }

// Every node below `path`, "path=value" one per line, for before/after comparisons.
void dump(xenbus::client::SyncClient& c, const std::string& path, std::vector<std::string>& out) {
  auto v = c.read(path);
  out.push_back(path + "=" + (v ? *v : std::string("?")));
  auto kids = c.directory(path);
  if (!kids) return;
  for (const auto& k : *kids) dump(c, path == "/" ? "/" + k : path + "/" + k, out);
}
std::vector<std::string> tree(const std::string& socket) {
  xenbus::client::SyncClient c(socket);
  std::vector<std::string> out;
  dump(c, "/", out);
  return out;
}

// Waits (bounded) for cond.
bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds limit = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return cond();
}

std::vector<std::string> domain_dirs(const std::string& run_dir) {
  std::vector<std::string> d;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const auto n = e.path().filename().string();
    if (n.starts_with("dom")) d.push_back(n);
  }
  return d;
}

std::string image(const TestHost& h, const std::string& name, std::size_t mib = 8) {
  const std::string p = h.dir + "/" + name;
  std::ofstream f(p);
  f.close();
  fs::resize_file(p, mib << 20);
  return p;
}

class Toolstack : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (daemons, control sockets)";
  }
};

// ── up / down / supervision ──────────────────────────────────────────────────────────────────

TEST_F(Toolstack, UpIsIdempotentAndDownStopsEverything) {
  TestHost h(kBin, kFake, {"xpv-blkback"});
  auto r = h.run({"up"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto xs_pid = pid_in(h.run_dir + "/xpv-xenstored.pid");
  const auto sup_pid = pid_in(h.run_dir + "/xpv-supervise.pid");
  ASSERT_TRUE(xs_pid && sup_pid);
  ASSERT_TRUE(eventually([&] { return pid_in(h.run_dir + "/xpv-blkback.pid").has_value(); }));
  const auto blk_pid = pid_in(h.run_dir + "/xpv-blkback.pid");
  EXPECT_EQ(r.out, fmt::format("xpv-xenstored: started (pid {}, socket {})\n"
                               "xpv-supervise: started (pid {})\n"
                               "xpv-blkback: running (pid {}), supervised\n"
                               "xpv-netback: not built (no {}/xpv-netback); skipped\n",
                               *xs_pid, h.xs_socket, *sup_pid, *blk_pid, h.bin_dir));
  EXPECT_NO_THROW(xenbus::client::SyncClient c(h.xs_socket));
  EXPECT_TRUE(fs::exists(h.log_dir + "/xpv-xenstored.log"));
  EXPECT_TRUE(fs::exists(h.log_dir + "/xpv-blkback.log"));

  r = h.run({"up"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, fmt::format("xpv-xenstored: already running (pid {})\n"
                               "xpv-supervise: already running (pid {})\n"
                               "xpv-blkback: running (pid {}), supervised\n"
                               "xpv-netback: not built (no {}/xpv-netback); skipped\n",
                               *xs_pid, *sup_pid, *blk_pid, h.bin_dir));

  r = h.run({"down"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, fmt::format("xpv-supervise: stopped (pid {})\nxpv-blkback: stopped (pid {})\n"
                               "xpv-xenstored: stopped (pid {})\n",
                               *sup_pid, *blk_pid, *xs_pid));
  EXPECT_FALSE(toolstack::process_alive(*xs_pid));
  EXPECT_FALSE(toolstack::process_alive(*sup_pid));
  EXPECT_FALSE(toolstack::process_alive(*blk_pid));
  for (const char* f : {"xpv-xenstored.pid", "xpv-supervise.pid", "xpv-blkback.pid"}) {
    EXPECT_FALSE(fs::exists(h.run_dir + "/" + f)) << f;
  }
  EXPECT_FALSE(fs::exists(h.xs_socket));
  EXPECT_TRUE(processes_mentioning(h.dir).empty());

  r = h.run({"down"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "nothing was running\n");
}

TEST_F(Toolstack, SupervisorRestartsAKilledBackend) {
  TestHost h(kBin, kFake, {"xpv-blkback", "xpv-netback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const std::string pf = h.run_dir + "/xpv-blkback.pid";
  ASSERT_TRUE(eventually([&] { return toolstack::running_pid(pf, "xpv-blkback").has_value(); }));
  const pid_t first = *pid_in(pf);
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] {
    auto p = toolstack::running_pid(pf, "xpv-blkback");
    return p && *p != first;
  }));
  EXPECT_THAT(slurp(h.log_dir + "/xpv-supervise.log"),
              HasSubstr(fmt::format("xpv-blkback (pid {}) died (signal 9 (Killed))", first)));
  EXPECT_TRUE(toolstack::running_pid(h.run_dir + "/xpv-netback.pid", "xpv-netback").has_value());
  EXPECT_EQ(h.run({"down"}).rc, 0);
  EXPECT_TRUE(processes_mentioning(h.dir).empty());
}

// The supervisor killed, its backends left running: `xpv up` starts a new one, which stops the
// orphans and runs its own (one of each, named by the pid files) instead of a second beside them.
TEST_F(Toolstack, ANewSupervisorTakesOverFromOrphanedBackends) {
  TestHost h(kBin, kFake, {"xpv-blkback", "xpv-netback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const std::string pf = h.run_dir + "/xpv-blkback.pid";
  ASSERT_TRUE(eventually([&] { return toolstack::running_pid(pf, "xpv-blkback").has_value(); }));
  const pid_t orphan = *pid_in(pf);
  const auto sup = pid_in(h.run_dir + "/xpv-supervise.pid");
  ASSERT_TRUE(sup);
  ASSERT_EQ(::kill(*sup, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return !toolstack::process_alive(*sup); }));
  ASSERT_TRUE(toolstack::process_alive(orphan));
  auto r = h.run({"up"});
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(eventually([&] {
    auto p = toolstack::running_pid(pf, "xpv-blkback");
    return p && *p != orphan && !toolstack::process_alive(orphan);
  }));
  EXPECT_THAT(slurp(h.log_dir + "/xpv-supervise.log"),
              HasSubstr(fmt::format("xpv-blkback (pid {}) was running without a supervisor: stopped", orphan)));
  // Exactly one of each: what the pid files name.
  std::size_t blkbacks = 0;
  for (pid_t p : processes_mentioning(h.dir)) blkbacks += toolstack::process_is(p, "xpv-blkback") ? 1 : 0;
  EXPECT_EQ(blkbacks, 1u);
  EXPECT_EQ(h.run({"down"}).rc, 0);
  EXPECT_TRUE(processes_mentioning(h.dir).empty());
}

// xpv-xenstored killed: the supervisor starts it again from its journal (the store as it was) and
// restarts the backends; killed once more without its journal, it cannot be, and that is fatal
// and said so.
TEST_F(Toolstack, ALostXenstoredIsStartedAgainFromItsJournalOrIsFatal) {
  TestHost h(kBin, kFake, {"xpv-blkback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const pid_t xs = *pid_in(h.run_dir + "/xpv-xenstored.pid");
  const pid_t sup = *pid_in(h.run_dir + "/xpv-supervise.pid");
  ASSERT_TRUE(eventually([&] { return pid_in(h.run_dir + "/xpv-blkback.pid").has_value(); }));
  const pid_t blk = *pid_in(h.run_dir + "/xpv-blkback.pid");
  {
    xenbus::client::SyncClient c(h.xs_socket);
    ASSERT_TRUE(c.write("/local/domain/0/kept", "yes"));
  }
  ASSERT_EQ(::kill(xs, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] {
    return slurp(h.log_dir + "/xpv-supervise.log").find("restarting the backends") != std::string::npos;
  })) << slurp(h.log_dir + "/xpv-supervise.log");
  const pid_t xs2 = *pid_in(h.run_dir + "/xpv-xenstored.pid");
  EXPECT_NE(xs2, xs);
  EXPECT_TRUE(toolstack::process_alive(sup));
  EXPECT_THAT(slurp(h.log_dir + "/xpv-supervise.log"),
              HasSubstr(fmt::format("xpv-xenstored (pid {}) is gone; starting it again from its journal", xs)));
  ASSERT_TRUE(eventually([&] {
    auto now = pid_in(h.run_dir + "/xpv-blkback.pid");
    return now && *now != blk && toolstack::process_alive(*now);
  }));
  EXPECT_FALSE(toolstack::process_alive(blk));
  {
    xenbus::client::SyncClient c(h.xs_socket);
    EXPECT_EQ(c.read("/local/domain/0/kept").value_or("(lost)"), "yes");
  }

  // Without its journal (here: taken away) a lost xenstored is fatal.
  const pid_t blk2 = *pid_in(h.run_dir + "/xpv-blkback.pid");
  ASSERT_TRUE(fs::remove(h.run_dir + "/xpv-xenstored.journal"));
  ASSERT_EQ(::kill(xs2, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return !toolstack::process_alive(sup); }));
  EXPECT_FALSE(toolstack::process_alive(blk2));
  EXPECT_THAT(slurp(h.log_dir + "/xpv-supervise.log"),
              HasSubstr(fmt::format("FATAL: xpv-xenstored (pid {}) is gone and cannot be restarted: it left no "
                                    "journal, so the xenstore of every domain is lost",
                                    xs2)));
  // No domains existed: `up` starts afresh.
  auto r = h.run({"up"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("xpv-xenstored: started"));
  EXPECT_EQ(h.run({"down"}).rc, 0);
}

TEST_F(Toolstack, DownRefusesWhileDomainsExistUnlessForced) {
  TestHost h(kBin, kFake, {});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  {
    xenbus::client::SyncClient c(h.xs_socket);
    ASSERT_TRUE(c.write("/local/domain/5/name", "ghost"));
    ASSERT_TRUE(c.write("/local/domain/0/backend/vbd/5/51712/state", "4"));
  }
  auto r = h.run({"down"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv down: 1 domain(s) still exist (ghost (id 5)): destroy them first, or use `xpv down --force`\n");
  EXPECT_TRUE(toolstack::running_pid(h.run_dir + "/xpv-xenstored.pid", "xpv-xenstored").has_value());

  r = h.run({"list"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_THAT(r.out, MatchesRegex("(.|\n)*\nghost +5  - +- +-  unknown\n"));

  r = h.run({"down", "--force"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("xpv-xenstored: stopped"));
  EXPECT_TRUE(processes_mentioning(h.dir).empty());
}

// ── create: errors leave nothing behind ──────────────────────────────────────────────────────

class CreateErrors : public Toolstack {
 protected:
  void expect_nothing_left(const TestHost& h, const std::vector<std::string>& tree_before) {
    EXPECT_TRUE(domain_dirs(h.run_dir).empty());
    if (!tree_before.empty()) {
      EXPECT_EQ(tree(h.xs_socket), tree_before);
    }
    for (pid_t p : processes_mentioning(h.dir)) {
      const std::string cmd = slurp(fmt::format("/proc/{}/cmdline", p));
      EXPECT_THAT(cmd, ::testing::Not(HasSubstr("xpv-front"))) << "left running: pid " << p;
    }
  }
};

TEST_F(CreateErrors, DaemonsNotRunning) {
  TestHost h(kBin, kFake, {"xpv-front"});
  const auto cfg = h.write("a.cfg", "name = \"web1\"\nmemory = 32\n");
  auto r = h.run({"create", cfg});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: xpv-xenstored is not running (cannot connect to {}); run `xpv up`\n",
                               h.xs_socket));
  EXPECT_EQ(r.out, "");
  expect_nothing_left(h, {});
}

TEST_F(CreateErrors, BackendNotRunning) {
  TestHost h(kBin, kFake, {"xpv-front"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto img = image(h, "a.img");
  const auto cfg = h.write("a.cfg", "name = \"web1\"\ndisk = [ 'vdev=xvda, target=" + img + "' ]\n");
  auto r = h.run({"create", cfg});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: xpv-blkback is not built (no {}/xpv-blkback): vbd devices cannot be served\n",
                               h.bin_dir));
  expect_nothing_left(h, before);
}

TEST_F(CreateErrors, BadConfigNamesFileAndLine) {
  TestHost h(kBin, kFake, {"xpv-front"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto cfg = h.write("bad.cfg", "name = \"web1\"\n\nmemory = \"lots\"\n");
  auto r = h.run({"create", cfg});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: {}:3: 'memory': must be a number\n", cfg));
  const auto cfg2 = h.write("bad2.cfg", "name = \"web1\"\ndisk = [ 'vdev=xvda, access=rx, target=/x' ]\n");
  r = h.run({"create", cfg2});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: {}:2: 'disk': item 0: disk spec 'vdev=xvda, access=rx, target=/x': "
                               "access 'rx' is not one of rw, w, ro, r\n",
                               cfg2));
  r = h.run({"create", h.dir + "/absent.cfg"});
  EXPECT_EQ(r.err, fmt::format("xpv create: {}/absent.cfg: cannot read the configuration file: No such file or directory\n",
                               h.dir));
  expect_nothing_left(h, before);
}

// The domain's record is JSON, which holds only UTF-8, and the monitor re-reads the configuration
// from it to restart the domain: a path it cannot hold is refused before anything is made. (Until
// session 43 the record's write failed after the domain process was started, and the undo, not
// yet knowing that process, left it running.)
TEST_F(CreateErrors, AConfigurationPathThatIsNotUtf8IsRefusedFirst) {
  TestHost h(kBin, kFake, {"xpv-front"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto cfg = h.write("caf\xe9.cfg", "name = \"web1\"\nmemory = 32\n");
  auto r = h.run({"create", cfg});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: {}/caf\\xe9.cfg: the configuration file's path is not UTF-8; rename it or "
                               "its directory\n",
                               h.dir));
  EXPECT_EQ(r.out, "");
  expect_nothing_left(h, before);
}

TEST_F(CreateErrors, MissingImage) {
  TestHost h(kBin, kFake, {"xpv-front", "xpv-blkback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto cfg = h.write("a.cfg", "name = \"web1\"\ndisk = [ 'vdev=xvda, target=" + h.dir + "/nope.img' ]\n");
  auto r = h.run({"create", cfg});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: {}:2: 'disk': disk xvda: '{}/nope.img' does not exist\n", cfg, h.dir));
  expect_nothing_left(h, before);
}

TEST_F(CreateErrors, HvmWithoutAKernelIsRefused) {
  TestHost h(kBin, kFake, {"xpv-front"});
  const auto cfg = h.write("h.cfg", "name = \"g\"\ntype = \"hvm\"\n");
  auto r = h.run({"create", cfg});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: {}: an hvm domain needs 'kernel' (xpv boots Linux directly)\n", cfg));
}

// The real xpv-vmm with a file that is no kernel: it exits before it is ready (the image is
// checked, or /dev/kvm refused, before the control socket listens) and create undoes everything.
TEST_F(CreateErrors, HvmWhoseVmmFailsLeavesNothing) {
  TestHost h(kBin, kFake, {"xpv-front"});
  std::filesystem::create_symlink(std::string(kBin) + "/xpv-vmm", h.bin_dir + "/xpv-vmm");
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto kernel = h.write("vmlinuz", "not a kernel");
  const auto cfg = h.write("h.cfg", "name = \"g\"\ntype = \"hvm\"\nmemory = 64\nkernel = \"" + kernel + "\"\n");
  auto r = h.run({"create", cfg});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, MatchesRegex("xpv create: xpv-vmm exited \\(exit status 1\\) before it was ready: xpv-vmm: .*\n"));
  expect_nothing_left(h, before);
}

// upcall = "callback" needs the host KVM's Hyper-V SynIC (auto-EOI): xpv-vmm refuses to start
// without it, naming the capability, and create undoes everything. With SynIC it gets as far as
// the kernel, which is no kernel here.
TEST_F(CreateErrors, HvmCallbackUpcallNeedsSynic) {
  TestHost h(kBin, kFake, {"xpv-front"});
  std::filesystem::create_symlink(std::string(kBin) + "/xpv-vmm", h.bin_dir + "/xpv-vmm");
  UniqueFd kvm(::open("/dev/kvm", O_RDWR | O_CLOEXEC));
  if (!kvm) GTEST_SKIP() << "no /dev/kvm";
  const bool synic = ::ioctl(kvm.get(), KVM_CHECK_EXTENSION, KVM_CAP_HYPERV_SYNIC) > 0;
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto kernel = h.write("vmlinuz", "not a kernel");
  const auto cfg = h.write("h.cfg", "name = \"g\"\ntype = \"hvm\"\nmemory = 64\nupcall = \"callback\"\nkernel = \"" +
                                        kernel + "\"\n");
  auto r = h.run({"create", cfg});
  EXPECT_EQ(r.rc, 1);
  if (synic) {
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("SynIC"))) << "this KVM has it";
  } else {
    EXPECT_EQ(r.err, fmt::format("xpv create: xpv-vmm exited (exit status 1) before it was ready: xpv-vmm: upcall "
                                 "callback: this KVM has no Hyper-V SynIC (KVM_CAP_HYPERV_SYNIC), which xpv-vmm "
                                 "needs to deliver Xen's global callback vector without an EOI; use upcall vector "
                                 "or intx (log: {}/xpv-vmm-g.log)\n",
                                 h.log_dir));
  }
  expect_nothing_left(h, before);
}

// xpv-vmm's options that contradict each other or are malformed: one line each naming the
// option, exit 1, before it reads the kernel or touches /dev/kvm (the kernel here is no kernel,
// and no socket is left behind).
TEST(VmmCommandLine, ContradictionsAreOneLineEach) {
  TestHost h(kBin, kFake, {});
  const auto kernel = h.write("vmlinuz", "not a kernel");
  const std::string vmm = kBin + "/xpv-vmm";
  const std::string sock = h.dir + "/pv.sock";
  struct Case {
    std::vector<std::string> args;
    std::string err;
  } cases[] = {
      {{"--pv-console", "socket:" + sock}, "xpv-vmm: --pv-console needs --xen (it is Xen's PV console)\n"},
      {{"--xen", "--pv-console-log", h.dir + "/pv.log"}, "xpv-vmm: --pv-console-log needs --pv-console\n"},
      {{"--xen", "--console", "socket:" + sock, "--pv-console", "socket:" + sock},
       "xpv-vmm: --pv-console socket:" + sock + " is the serial console's too: give each its own\n"},
      {{"--xen", "--pv-console", "tty"}, "xpv-vmm: --pv-console tty: expected stdio or socket:PATH\n"},
      {{"--xen", "--pv-console", "socket:"}, "xpv-vmm: --pv-console socket:: expected stdio or socket:PATH\n"},
      {{"--console", "serial"}, "xpv-vmm: --console serial: expected stdio or socket:PATH\n"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv = {vmm, "--kernel", kernel, "--memory", "64"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const auto r = run_command(argv);
    EXPECT_EQ(r.rc, 1) << c.err;
    EXPECT_EQ(r.err, c.err);
    EXPECT_FALSE(std::filesystem::exists(sock)) << c.err;
    EXPECT_FALSE(std::filesystem::exists(h.dir + "/pv.log")) << c.err;
  }
}

TEST_F(CreateErrors, DomainProcessFailsBeforeReady) {
  TestHost h(kBin, kFake, {"xpv-front"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto cfg = h.write("a.cfg", "name = \"web1\"\nmemory = 32\n");
  auto r = h.run({"create", cfg}, {"FAKE_FRONT_MODE=exit"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: xpv-front exited (exit status 3) before it was ready: fake xpv-front: "
                               "told to fail (log: {}/xpv-front-web1.log)\n",
                               h.log_dir));
  expect_nothing_left(h, before);
}

TEST_F(CreateErrors, NoControlSocketUndoesEverything) {
  TestHost h(kBin, kFake, {"xpv-front"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto cfg = h.write("a.cfg", "name = \"web1\"\nmemory = 32\n");
  auto r = h.run({"create", cfg}, {"FAKE_FRONT_MODE=no-socket"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, MatchesRegex(fmt::format("xpv create: cannot ask dom1 for its xenstore ring \\({}/dom1.sock\\): .*\n",
                                              h.run_dir)));
  expect_nothing_left(h, before);
}

// Ctrl-C (or SIGTERM) during `xpv create`: the command undoes what it made and says so, instead
// of dying with a domain process, its namespace and its nodes left behind. Once while it waits for
// the devices to connect (the stand-in backends never connect them), once as soon as the domain's
// directory appears (wherever the command is then).
TEST_F(CreateErrors, AnInterruptedCreateUndoesWhatItMade) {
  TestHost h(kBin, kFake, {"xpv-front", "xpv-blkback", "xpv-netback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto img = image(h, "a.img");
  const auto cfg = h.write("a.cfg", "name = \"web1\"\nmemory = 32\ndisk = [ 'vdev=xvda, target=" + img +
                                        "' ]\nvif = [ 'ip=10.9.0.2/24' ]\n");
  xenbus::client::SyncClient c(h.xs_socket);
  auto r = h.run_signalled({"create", cfg}, SIGINT, [&] { return c.read("/local/domain/0/backend/vif/1/0/state").has_value(); });
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("xpv create: interrupted by SIGINT")) << "said once, after the undo";
  EXPECT_EQ(r.out, "");
  expect_nothing_left(h, before);
  EXPECT_FALSE(fs::exists(h.dir + "/netns/xpv-dom1"));

  r = h.run_signalled({"create", cfg}, SIGTERM, [&] { return fs::exists(h.run_dir + "/dom1"); });
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("xpv create: interrupted by SIGTERM"));
  expect_nothing_left(h, before);
  EXPECT_FALSE(fs::exists(h.dir + "/netns/xpv-dom1"));
  // And the host is as it was: the same configuration creates its domain.
  r = h.run({"create", cfg, "--no-wait"});
  EXPECT_EQ(r.rc, 0) << r.err;
}

// ── the whole cycle with stand-in programs ───────────────────────────────────────────────────

TEST_F(Toolstack, CreateListAttachDetachDestroyWithStandIns) {
  TestHost h(kBin, kFake, {"xpv-front", "xpv-blkback", "xpv-netback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto img_a = image(h, "a.img");
  const auto img_b = image(h, "b.img");
  const auto cfg = h.write("web1.cfg", "name = \"web1\"\nmemory = 32\nvcpus = 2\ndisk = [ 'format=raw, vdev=xvda, "
                                       "access=rw, target=" + img_a + "' ]\nvif = [ 'mac=00:16:3e:00:00:01, ip=10.9.0.2/24' ]\n");
  // The stand-in backends never connect anything: --no-wait.
  auto r = h.run({"create", cfg, "--no-wait"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rec_pid = pid_in(h.run_dir + "/dom1/pid");
  ASSERT_TRUE(rec_pid);
  EXPECT_EQ(r.out, fmt::format("Created domain web1 (id 1, process, 32 MiB, pid {})\n  xvda: {}/dom1/vbd/51712/disk\n"
                               "  vif 0: host side vif1.0 10.9.0.1/24, domain 10.9.0.2/24 in network namespace "
                               "{}/netns/xpv-dom1\n",
                               *rec_pid, h.run_dir, h.dir));
  EXPECT_TRUE(fs::exists(h.dir + "/netns/xpv-dom1")) << "the domain's network namespace";
  EXPECT_TRUE(toolstack::process_is(*rec_pid, "xpv-front"));
  {
    xenbus::client::SyncClient c(h.xs_socket);
    EXPECT_EQ(*c.read("/local/domain/1/name"), "web1");
    EXPECT_EQ(*c.read("/local/domain/1/memory/target"), "32768");
    EXPECT_EQ(*c.read("/local/domain/0/backend/vbd/1/51712/params"), img_a);
    EXPECT_EQ(*c.read("/local/domain/0/backend/vbd/1/51712/mode"), "w");
    EXPECT_EQ(*c.read("/local/domain/1/device/vbd/51712/backend"), "/local/domain/0/backend/vbd/1/51712");
    EXPECT_EQ(*c.read("/local/domain/0/backend/vif/1/0/mac"), "00:16:3e:00:00:01");
    EXPECT_EQ(*c.read("/local/domain/0/backend/vif/1/0/ip"), "10.9.0.2/24");
    auto perms = c.get_perms("/local/domain/1/device/vbd/51712/state");
    ASSERT_TRUE(perms);
    EXPECT_EQ(*perms, (xenbus::PermList{{1, xenbus::kPermNone}, {0, xenbus::kPermRead}}));
    perms = c.get_perms("/local/domain/1");
    EXPECT_EQ(*perms, (xenbus::PermList{{1, xenbus::kPermNone}}));
  }
  EXPECT_THAT(slurp(h.log_dir + "/xpv-xenstored.log"), HasSubstr("dom1 introduced"));

  r = h.run({"list"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_THAT(r.out, MatchesRegex("Name +ID  Type +Mem VCPUs  State\nDomain-0 .*\nweb1 +1  process +32 +2  running\n"));

  // Name in use.
  r = h.run({"create", cfg, "--no-wait"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: {}: a domain named 'web1' exists already (id 1)\n", cfg));
  // An image web1 writes, to another domain (by another name: a hard link): refused before
  // anything is made.
  const auto img_a_link = h.dir + "/a-link.img";
  ASSERT_EQ(::link(img_a.c_str(), img_a_link.c_str()), 0);
  const auto cfg2 = h.write("web2.cfg", "name = \"web2\"\nmemory = 32\ndisk = [ 'format=raw, vdev=xvda, access=ro, target=" +
                                            img_a_link + "' ]\n");
  r = h.run({"create", cfg2, "--no-wait"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: {}: disk xvda: '{}' is written by web1 (id 1) xvda ('{}')\n", cfg2, img_a_link,
                               img_a));
  EXPECT_FALSE(fs::exists(h.run_dir + "/dom2")) << "nothing made";

  // block-attach / detach and their errors.
  r = h.run({"block-attach", "web1", "vdev=xvdb, access=ro, target=" + img_b, "--no-wait"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, fmt::format("xvdb: {}/dom1/vbd/51728/disk\n", h.run_dir));
  r = h.run({"block-attach", "web1", "vdev=xvdc, target=" + img_b, "--no-wait"});
  EXPECT_EQ(r.err, fmt::format("xpv block-attach: disk xvdc: '{}' is read by web1 (id 1) xvdb ('{}'): it cannot be given "
                               "writable\n",
                               img_b, img_b));
  r = h.run({"block-attach", "web1", "vdev=xvdc, access=ro, target=" + img_a, "--no-wait"});
  EXPECT_EQ(r.err, fmt::format("xpv block-attach: disk xvdc: '{}' is written by web1 (id 1) xvda ('{}')\n", img_a, img_a));
  r = h.run({"block-attach", "web1", "vdev=xvdb, target=" + img_b, "--no-wait"});
  EXPECT_EQ(r.err, "xpv block-attach: xvdb is already attached to web1 (id 1)\n");
  r = h.run({"block-attach", "web1", "vdev=xvdq9x, target=" + img_b});
  EXPECT_EQ(r.err, fmt::format("xpv block-attach: disk spec 'vdev=xvdq9x, target={}': 'xvdq9x' is not a virtual disk name "
                               "(xvda, xvdb1, hda, sdc, d0p1)\n",
                               img_b));
  r = h.run({"block-attach", "web1", "vdev=xvdc, target=" + h.dir + "/nope.img"});
  EXPECT_EQ(r.err, fmt::format("xpv block-attach: disk xvdc: '{}/nope.img' does not exist\n", h.dir));
  r = h.run({"block-attach", "nope", "vdev=xvdc, target=" + img_b});
  EXPECT_EQ(r.err, "xpv block-attach: no domain named 'nope'\n");
  // block-list: both disks, both ends' states (the stand-ins leave them where create put them).
  r = h.run({"block-list", "web1"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, fmt::format("Vdev   Devid  Frontend          Backend           Mode Target\n"
                               "xvda   51712  1 (Initialising)  1 (Initialising)  w    {}\n"
                               "xvdb   51728  1 (Initialising)  1 (Initialising)  r    {}\n",
                               img_a, img_b));
  r = h.run({"block-list", "nope"});
  EXPECT_EQ(r.err, "xpv block-list: no domain named 'nope'\n");
  r = h.run({"block-detach", "web1", "xvdb"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "xvdb detached from web1 (id 1)\n");
  r = h.run({"block-detach", "1", "xvdb"});
  EXPECT_EQ(r.err, "xpv block-detach: xvdb is not attached to web1 (id 1)\n");
  r = h.run({"block-detach", "web1", "floppy"});
  EXPECT_EQ(r.err, "xpv block-detach: 'floppy' is not a virtual disk name (xvda, xvdb1, hda, sdc, d0p1)\n");

  // network-attach / detach and their errors.
  r = h.run({"network-attach", "web1", "mac=00:16:3e:00:00:01", "--no-wait"});
  EXPECT_EQ(r.err, "xpv network-attach: vif: MAC 00:16:3e:00:00:01 is already used by web1 (id 1) vif 0\n");
  r = h.run({"network-attach", "web1", "ip=10.9.0.2/24", "--no-wait"});
  EXPECT_EQ(r.err, "xpv network-attach: vif: address 10.9.0.2/24 clashes with web1 (id 1) vif 0 (10.9.0.2/24): each vif "
                   "needs a subnet of its own\n");
  r = h.run({"network-attach", "web1", "mac=01:16:3e:00:00:02"});
  EXPECT_EQ(r.err, "xpv network-attach: vif spec 'mac=01:16:3e:00:00:02': '01:16:3e:00:00:02' is not a unicast MAC "
                   "address (aa:bb:cc:dd:ee:ff)\n");
  r = h.run({"network-attach", "web1", "mac=00:16:3e:00:00:02, ip=10.9.1.2/24", "--no-wait"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, fmt::format("vif 1: mac 00:16:3e:00:00:02, host side vif1.1 10.9.1.1/24, domain eth1 10.9.1.2/24 in "
                               "{}/netns/xpv-dom1\n",
                               h.dir));
  r = h.run({"network-list", "1"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "Idx  Mac               Frontend          Backend           Host side  Bridge          IP\n"
                   "0    00:16:3e:00:00:01 1 (Initialising)  1 (Initialising)  vif1.0     -               10.9.0.2/24\n"
                   "1    00:16:3e:00:00:02 1 (Initialising)  1 (Initialising)  vif1.1     -               10.9.1.2/24\n");
  r = h.run({"network-detach", "web1", "1"});
  EXPECT_EQ(r.out, "vif 1 detached from web1 (id 1)\n");
  r = h.run({"network-detach", "web1", "7"});
  EXPECT_EQ(r.err, "xpv network-detach: vif 7 is not attached to web1 (id 1)\n");

  // Only HVM domains have a serial console.
  r = h.run({"console", "web1"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv console: web1 (id 1) is a process domain: only HVM domains have a console (a "
                               "process domain's log is {})\n",
                               h.log_dir));

  // down refuses while web1 exists.
  r = h.run({"down"});
  EXPECT_EQ(r.err, "xpv down: 1 domain(s) still exist (web1 (id 1)): destroy them first, or use `xpv down --force`\n");

  r = h.run({"destroy", "web1"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "Destroyed domain web1 (id 1)\n");
  EXPECT_TRUE(eventually([&] { return !toolstack::process_alive(*rec_pid); }));
  EXPECT_EQ(tree(h.xs_socket), before);
  EXPECT_TRUE(domain_dirs(h.run_dir).empty());
  EXPECT_FALSE(fs::exists(h.dir + "/netns/xpv-dom1")) << "the namespace goes with the domain";
  r = h.run({"destroy", "web1"});
  EXPECT_EQ(r.err, "xpv destroy: no domain named 'web1'\n");
}

TEST_F(Toolstack, DestroyAfterTheDomainProcessDiedAndShutdown) {
  TestHost h(kBin, kFake, {"xpv-front", "xpv-blkback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto img = image(h, "a.img");
  // on_crash = "preserve": what is left of a domain whose process died stays for `xpv destroy`.
  ASSERT_EQ(h.run({"create", h.write("a.cfg", "name = \"a\"\non_crash = \"preserve\"\ndisk = [ '" + img + ",raw,xvda' ]\n"),
                   "--no-wait"}).rc,
            0);
  ASSERT_EQ(h.run({"create", h.write("b.cfg", "name = \"b\"\nmemory = 16\n")}).rc, 0);
  const pid_t a = *pid_in(h.run_dir + "/dom1/pid");
  const pid_t b = *pid_in(h.run_dir + "/dom2/pid");
  ASSERT_EQ(::kill(a, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return !toolstack::process_alive(a); }));
  auto r = h.run({"list"});
  EXPECT_THAT(r.out, MatchesRegex("(.|\n)*\na +1  process +128 +1  dead\nb +2  process +16 +1  running\n"));
  r = h.run({"destroy", "1"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "Destroyed domain a (id 1)\n");
  r = h.run({"shutdown", "b"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "Shut down domain b (id 2) (no PV control in the guest: its process got SIGTERM)\n");
  EXPECT_FALSE(toolstack::process_alive(b));
  EXPECT_EQ(tree(h.xs_socket), before);
  EXPECT_TRUE(domain_dirs(h.run_dir).empty());
  EXPECT_FALSE(fs::exists(h.run_dir + "/dom1.sock"));
  EXPECT_FALSE(fs::exists(h.run_dir + "/dom2.sock"));
}

// xl's default on_crash = "destroy": a domain process killed outright (no word on why it stopped:
// a crash) is torn down by its monitor, nothing left; the monitor itself is gone afterwards.
TEST_F(Toolstack, ADomainWhoseProcessDiesIsDestroyedByItsMonitor) {
  TestHost h(kBin, kFake, {"xpv-front", "xpv-blkback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto img = image(h, "a.img");
  ASSERT_EQ(h.run({"create", h.write("a.cfg", "name = \"a\"\ndisk = [ '" + img + ",raw,xvda' ]\n"), "--no-wait"}).rc, 0);
  const auto rec = toolstack::read_record(h.run_dir + "/dom1");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->on_crash, "destroy");
  ASSERT_GT(rec->monitor_pid, 0);
  EXPECT_TRUE(toolstack::process_alive(rec->monitor_pid));
  ASSERT_EQ(::kill(rec->pid, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return domain_dirs(h.run_dir).empty(); }, 20s)) << h.run({"list"}).out;
  EXPECT_TRUE(eventually([&] { return !toolstack::process_alive(rec->monitor_pid); }));
  EXPECT_EQ(tree(h.xs_socket), before);
  EXPECT_FALSE(fs::exists(h.run_dir + "/dom1.sock"));
  const std::string log = slurp(h.log_dir + "/monitor-a.log");
  EXPECT_THAT(log, HasSubstr("a (id 1) stopped after"));
  EXPECT_THAT(log, HasSubstr(": crash; on_crash = destroy"));
  EXPECT_THAT(log, HasSubstr("a (id 1) destroyed"));
  // `xpv destroy` stops the monitor first: it does not act on the process destroy ends.
  ASSERT_EQ(h.run({"create", h.write("b.cfg", "name = \"b\"\non_crash = \"restart\"\nmemory = 16\n")}).rc, 0);
  const auto b = toolstack::read_record(h.run_dir + "/dom1");
  ASSERT_TRUE(b);
  auto r = h.run({"destroy", "b"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(toolstack::process_alive(b->monitor_pid));
  EXPECT_TRUE(domain_dirs(h.run_dir).empty());
  EXPECT_THAT(slurp(h.log_dir + "/monitor-b.log"), Not(HasSubstr("stopped after")));
}

// Without PV control (the fake domain process offers none), `xpv reboot` is refused as `xl
// reboot` refuses it, and nothing is asked; a sysrq key must be one character.
TEST_F(Toolstack, RebootNeedsThePvControlProtocolAndSysrqOneKey) {
  TestHost h(kBin, kFake, {"xpv-front", "xpv-blkback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  ASSERT_EQ(h.run({"create", h.write("a.cfg", "name = \"a\"\nmemory = 16\n")}).rc, 0);
  auto r = h.run({"reboot", "a"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv reboot: a (id 1) does not offer reboot through its PV drivers (no control/feature-reboot); "
                   "shut it down and create it again\n");
  xenbus::client::SyncClient c(h.xs_socket);
  EXPECT_EQ(c.read("/local/domain/1/control/shutdown").value_or("?"), "");
  r = h.run({"sysrq", "a", "hh"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv sysrq: sysrq key 'hh': expected one letter or digit\n");
  r = h.run({"reboot", "nosuch"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv reboot: no domain named 'nosuch'\n");
  r = h.run({"sysrq", "a", "s"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "Sent sysrq 's' to a (id 1)\n");
  EXPECT_EQ(c.read("/local/domain/1/control/sysrq").value_or("?"), "s");
}

// `xpv mem-set`: a process domain has no balloon driver; a bad size and an unknown domain are one
// line each; nothing is written. (An HVM guest's balloon is exercised in the testbed:
// tests/testbed/hvm.)
TEST_F(Toolstack, MemSetRefusesWhatNoBalloonCanDo) {
  TestHost h(kBin, kFake, {"xpv-front", "xpv-blkback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  ASSERT_EQ(h.run({"create", h.write("a.cfg", "name = \"a\"\nmemory = 64\n")}).rc, 0);
  xenbus::client::SyncClient c(h.xs_socket);
  EXPECT_EQ(c.read("/local/domain/1/memory/static-max").value_or("?"), "65536");
  auto r = h.run({"mem-set", "a", "32"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv mem-set: a (id 1) is a process domain: it has no balloon driver to give memory back\n");
  r = h.run({"mem-set", "a", "32q"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv mem-set: memory size '32q': expected a number with an optional unit (t, g, m, k, b; MiB "
                   "without one), e.g. 256 or 1g\n");
  r = h.run({"mem-set", "nosuch", "32"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv mem-set: no domain named 'nosuch'\n");
  EXPECT_EQ(c.read("/local/domain/1/memory/target").value_or("?"), "65536");
}

// `xpv pause` / `xpv unpause` / `xpv create -p`: a process domain has no vCPUs to stop, which each
// says in one line, and nothing changes (it is still listed running); an unknown domain is one
// line. (An HVM guest paused and unpaused under its pings: tests/testbed/hvm.)
TEST_F(Toolstack, PauseRefusesWhatHasNoVcpus) {
  TestHost h(kBin, kFake, {"xpv-front", "xpv-blkback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto cfg = h.write("a.cfg", "name = \"a\"\nmemory = 64\n");
  const auto before = tree(h.xs_socket);
  auto r = h.run({"create", "-p", cfg});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: {}: a process domain cannot be created paused (only an HVM guest has "
                               "vCPUs to hold)\n",
                               cfg));
  EXPECT_EQ(tree(h.xs_socket), before);
  ASSERT_EQ(h.run({"create", cfg}).rc, 0);
  r = h.run({"pause", "a"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv pause: a (id 1) is a process domain: it has no vCPUs to pause\n");
  r = h.run({"unpause", "1"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv unpause: a (id 1) is a process domain: it has no vCPUs to unpause\n");
  r = h.run({"pause", "nosuch"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv pause: no domain named 'nosuch'\n");
  r = h.run({"list", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto doms = nlohmann::json::parse(r.out);
  ASSERT_EQ(doms.size(), 2u) << r.out;
  EXPECT_EQ(doms[1]["state"], "running") << r.out;
}

// `xpv vcpu-list` / `xpv vcpu-pin` and `cpus`: a process domain has no vCPU threads to place,
// which each says in one line; a bad CPU list is refused before any domain is looked at; with no
// HVM domain running the list is its header alone. (An HVM guest's vCPUs placed by `cpus` and
// moved by vcpu-pin: tests/testbed/hvm.)
TEST_F(Toolstack, VcpuPlacementRefusesWhatHasNoVcpus) {
  TestHost h(kBin, kFake, {"xpv-front", "xpv-blkback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto bad = h.write("b.cfg", "name = \"b\"\nmemory = 64\ncpus = \"0\"\n");
  const auto before = tree(h.xs_socket);
  auto r = h.run({"create", bad});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: {}:3: 'cpus': makes sense only for type = \"hvm\" (a process domain has no "
                               "vCPU threads to place)\n",
                               bad));
  EXPECT_EQ(tree(h.xs_socket), before) << "a refused configuration leaves nothing";
  const auto cfg = h.write("a.cfg", "name = \"a\"\nmemory = 64\n");
  ASSERT_EQ(h.run({"create", cfg}).rc, 0);
  r = h.run({"vcpu-pin", "a", "0", "0"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv vcpu-pin: a (id 1) is a process domain: it has no vCPUs to place\n");
  r = h.run({"vcpu-list", "a"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv vcpu-list: a (id 1) is a process domain: it has no vCPUs to place\n");
  r = h.run({"vcpu-pin", "a", "0", "3-1"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv vcpu-pin: CPU list '3-1': a range must not run downward\n");
  r = h.run({"vcpu-pin", "nosuch", "0", "0"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv vcpu-pin: no domain named 'nosuch'\n");
  r = h.run({"vcpu-list"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.substr(0, 4), "Name");
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "a process domain has no rows: " << r.out;
}

// `cpu_weight` / `cap` and `xpv sched-credit`, on this host's real cgroup hierarchy with the cpu
// controller (v1 or v2, whichever it has): the domain process is moved into <hierarchy>/xpv/<uuid>
// with the files set as cpu_sched.h maps them; sched-credit lists, changes and places a domain
// that had none; out-of-range values are refused with one line and change nothing; destroy
// removes the cgroup.
TEST_F(Toolstack, CpuWeightAndCapPutTheDomainProcessInACgroupOfItsOwn) {
  const auto hier = toolstack::host_cpu_hierarchy();
  if (!hier) GTEST_SKIP() << "this host has no cgroup hierarchy with the cpu controller";
  if (::access(hier->mount.c_str(), W_OK) != 0) GTEST_SKIP() << hier->mount << " is not writable here";
  const bool v1 = hier->version == toolstack::CgroupVersion::v1;
  const std::string parent = hier->mount + "/xpv";
  // Removed at the end whatever happens (each domain's is gone already when all went well), and
  // the parent too when this test made it.
  std::vector<std::string> made;
  if (!fs::exists(parent)) made.push_back(parent);
  struct Cleanup {
    std::vector<std::string>& dirs;
    ~Cleanup() {
      for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) ::rmdir(it->c_str());
    }
  } cleanup{made};
  auto knob = [](const std::string& dir, const std::string& name) {
    std::ifstream f(dir + "/" + name);
    std::string v;
    std::getline(f, v);
    return v;
  };
  auto weight_file = [&](const std::string& dir) { return knob(dir, v1 ? "cpu.shares" : "cpu.weight"); };
  auto cap_file = [&](const std::string& dir) { return v1 ? knob(dir, "cpu.cfs_quota_us") : knob(dir, "cpu.max"); };
  auto in_cgroup = [&](pid_t pid, const std::string& dir) {
    std::ifstream f(fmt::format("/proc/{}/cgroup", pid));
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto at = toolstack::cgroup_of(text, hier->version);
    return at && hier->mount + *at == dir;
  };

  TestHost h(kBin, kFake, {"xpv-front", "xpv-blkback"});
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const auto bad = h.write("bad.cfg", "name = \"bad\"\nmemory = 64\ncpu_weight = 0\n");
  auto r = h.run({"create", bad});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, fmt::format("xpv create: {}:3: 'cpu_weight': 0 is out of range 1..65535\n", bad));
  EXPECT_EQ(tree(h.xs_socket), before);

  const auto cfg = h.write("a.cfg", "name = \"a\"\nmemory = 64\ncpu_weight = 512\ncap = 50\n");
  r = h.run({"create", cfg});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto rec = toolstack::read_record(h.run_dir + "/dom1");
  ASSERT_TRUE(rec);
  const std::string cg = hier->mount + "/xpv/" + rec->uuid;
  made.push_back(cg);
  EXPECT_EQ(rec->cgroup, cg);
  EXPECT_EQ(rec->cpu_weight, 512u);
  EXPECT_EQ(rec->cap, 50u);
  EXPECT_TRUE(in_cgroup(rec->pid, cg)) << "the domain process is in " << cg;
  EXPECT_EQ(weight_file(cg), v1 ? "2048" : "200");
  EXPECT_EQ(cap_file(cg), v1 ? "50000" : "50000 100000");
  if (v1) {
    EXPECT_EQ(knob(cg, "cpu.cfs_period_us"), "100000");
  }

  // The table, then a change while it runs.
  r = h.run({"sched-credit"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, toolstack::format_sched_credit({{"a", 1, {512, 50}, cg}}));
  r = h.run({"sched-credit", "-d", "a", "-w", "128", "-c", "0"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, fmt::format("a (id 1): weight 128, cap none ({})\n", cg));
  EXPECT_EQ(weight_file(cg), v1 ? "512" : "50");
  EXPECT_EQ(cap_file(cg), v1 ? "-1" : "max 100000");
  r = h.run({"sched-credit", "-d", "a", "-c", "102401"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv sched-credit: cap 102401 is out of range 0..102400 (% of one CPU; 0: none)\n");
  r = h.run({"sched-credit", "-w", "5"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv sched-credit: setting a weight or cap needs a domain: -d NAME (as xl sched-credit)\n");
  EXPECT_EQ(weight_file(cg), v1 ? "512" : "50") << "a refused change changes nothing";
  rec = toolstack::read_record(h.run_dir + "/dom1");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->cpu_weight, 128u);
  EXPECT_EQ(rec->cap, 0u);
  if (v1) {
    // A cap the kernel refuses (v1: a quota above the parent's) leaves every file and the record
    // as they were, the weight written before it too.
    // The parent's quota as it was, put back however the test ends (the host's own domains in
    // `xpv`, if any, are held to half a CPU for these few lines).
    const std::string parent_quota = parent + "/cpu.cfs_quota_us";
    struct Restore {
      std::string f, value;
      ~Restore() { std::ofstream(f) << value; }
    } restore{parent_quota, knob(parent, "cpu.cfs_quota_us")};
    ASSERT_FALSE(restore.value.empty());
    {
      std::ofstream q(parent_quota);
      q << "50000";
      q.close();  // the kernel's answer comes with the write, at the flush
      ASSERT_TRUE(q) << "cannot set " << parent_quota;
    }
    r = h.run({"sched-credit", "-d", "a", "-w", "300", "-c", "100"});
    EXPECT_EQ(r.rc, 1);
    EXPECT_EQ(r.err, fmt::format("xpv sched-credit: cannot set the cap ({}/cpu.cfs_quota_us <- 100000): Invalid "
                                 "argument\n",
                                 cg));
    EXPECT_EQ(weight_file(cg), "512");
    EXPECT_EQ(cap_file(cg), "-1");
    rec = toolstack::read_record(h.run_dir + "/dom1");
    ASSERT_TRUE(rec);
    EXPECT_EQ(rec->cpu_weight, 128u);
    EXPECT_EQ(rec->cap, 0u);
  }

  // A domain created without either is in no cgroup of xpv's until sched-credit gives it one.
  const auto cfg_b = h.write("b.cfg", "name = \"b\"\nmemory = 64\n");
  ASSERT_EQ(h.run({"create", cfg_b}).rc, 0);
  auto rec_b = toolstack::read_record(h.run_dir + "/dom2");
  ASSERT_TRUE(rec_b);
  EXPECT_EQ(rec_b->cgroup, "");
  const std::string cg_b = hier->mount + "/xpv/" + rec_b->uuid;
  made.push_back(cg_b);
  EXPECT_FALSE(fs::exists(cg_b));
  r = h.run({"sched-credit", "-d", "b"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, toolstack::format_sched_credit({{"b", 2, {}, ""}}));
  EXPECT_NE(r.out.find("\nb                                    2      -     -  -\n"), std::string::npos)
      << "not weighed: dashes, not xl's defaults\n" << r.out;
  r = h.run({"sched-credit", "-d", "2", "-c", "25"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, fmt::format("b (id 2): weight 256, cap 25 % of a CPU ({})\n", cg_b));
  EXPECT_TRUE(in_cgroup(rec_b->pid, cg_b));
  EXPECT_EQ(weight_file(cg_b), v1 ? "1024" : "100");
  EXPECT_EQ(cap_file(cg_b), v1 ? "25000" : "25000 100000");

  // Destroy removes each cgroup with its process.
  ASSERT_EQ(h.run({"destroy", "a"}).rc, 0);
  EXPECT_FALSE(fs::exists(cg));
  EXPECT_TRUE(fs::exists(cg_b));
  ASSERT_EQ(h.run({"destroy", "b"}).rc, 0);
  EXPECT_FALSE(fs::exists(cg_b));
}

// `xpv info` and `xpv uptime`, against what the test reads from the host itself: the CPU count,
// the memory, /dev/kvm, the Xen version HVM guests are told, xpv-xenstored's pid, the domains;
// the uptime table with the host as Domain-0 and a running domain, one domain by name, and one
// line for a domain that does not exist.
TEST_F(Toolstack, InfoAndUptimeSayWhatTheHostAndItsDomainsAre) {
  TestHost h(kBin, kFake, {"xpv-front", "xpv-blkback"});
  auto r = h.run({"info"});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto info_of = [](const std::string& out) {
    std::map<std::string, std::string> m;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      const auto colon = line.find(" : ");
      if (colon == std::string::npos) continue;
      std::string k = line.substr(0, colon);
      while (!k.empty() && k.back() == ' ') k.pop_back();
      m[k] = line.substr(colon + 3);
    }
    return m;
  };
  auto m = info_of(r.out);
  EXPECT_EQ(m["xenstored"], "not running (`xpv up` starts it)");
  EXPECT_EQ(m["domains"], "0 running, 0 paused, 0 in all");
  ASSERT_EQ(h.run({"up"}).rc, 0);
  ASSERT_EQ(h.run({"create", h.write("a.cfg", "name = \"a\"\nmemory = 64\n")}).rc, 0);
  r = h.run({"info"});
  ASSERT_EQ(r.rc, 0) << r.err;
  m = info_of(r.out);
  EXPECT_EQ(m["nr_cpus"], std::to_string(::sysconf(_SC_NPROCESSORS_ONLN)));
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  ASSERT_TRUE(meminfo >> key >> kib);
  ASSERT_EQ(key, "MemTotal:");
  EXPECT_EQ(m["total_memory"], std::to_string(kib >> 10));
  const int kvm = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  EXPECT_EQ(m["virt_caps"], kvm >= 0 ? "hvm" : "none");
  if (kvm >= 0) ::close(kvm);
  EXPECT_EQ(m["xen_version"], "4.17.0") << "what xen_version answers an HVM guest";
  EXPECT_EQ(m["xen_caps"], "hvm-3.0-x86_64");
  const auto xs_pid = pid_in(h.run_dir + "/xpv-xenstored.pid");
  ASSERT_TRUE(xs_pid);
  EXPECT_EQ(m["xenstored"], fmt::format("running (pid {}, {})", *xs_pid, h.xs_socket));
  EXPECT_EQ(m["domains"], "1 running, 0 paused, 1 in all");

  r = h.run({"uptime"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, MatchesRegex("Name +ID Uptime\nDomain-0 +0 ([0-9]+ days?, )? ?[0-9]+:[0-5][0-9]:[0-5][0-9]\n"
                                  "a +1  0:0[0-9]:[0-5][0-9]\n"))
      << "a domain made moments ago";
  r = h.run({"uptime", "a", "Domain-0"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, MatchesRegex("Name +ID Uptime\na +1  0:0[0-9]:[0-5][0-9]\n"
                                  "Domain-0 +0 ([0-9]+ days?, )? ?[0-9]+:[0-5][0-9]:[0-5][0-9]\n"));
  r = h.run({"uptime", "nosuch"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv uptime: no domain named 'nosuch'\n");
}

// `xpv bench --json FILE`: the file's directory is made, or refused with one line, before a suite
// runs for minutes (it used to fail only when the results were written); an unknown suite, or a
// suite refusing its settings, leaves nothing made.
TEST_F(Toolstack, BenchJsonDirectoryIsSettledBeforeTheSuiteRuns) {
  TestHost h(kBin, kFake, {});
  const std::string file = h.write("plain", "not a directory\n");
  auto r = h.run({"bench", "ring", "--quick", "--json", file + "/r.json"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv bench: --json " + file + "/r.json: cannot write into " + file + ": Not a directory\n");
  EXPECT_EQ(r.out, "") << "no suite ran";
  r = h.run({"bench", "nosuch", "--json", h.dir + "/new/r.json"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("xpv bench: unknown suite 'nosuch'"));
  EXPECT_FALSE(fs::exists(h.dir + "/new"));
  // A suite that refuses its settings (before any testbed or boot) leaves the directories it
  // was given made for it behind neither.
  r = h.run({"bench", "hvm", "--json", h.dir + "/new/deeper/r.json"}, {"XPV_BENCH_HVM_APPEND=a\"b"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv bench: XPV_BENCH_HVM_APPEND='a\"b': quotes, backslashes and newlines are not allowed\n");
  EXPECT_FALSE(fs::exists(h.dir + "/new"));
  r = h.run({"bench", "hvm", "--json", h.dir + "/new/r.json"}, {"XPV_BENCH_HVM_UPCALL=msi"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "xpv bench: XPV_BENCH_HVM_UPCALL='msi': must be vector, callback or intx\n");
  EXPECT_FALSE(fs::exists(h.dir + "/new"));
  EXPECT_TRUE(fs::exists(h.dir)) << "only what the command made is removed";
}

// ── with the real xpv-front and xpv-blkback ──────────────────────────────────────────────────

// `xpv create` of the process domain web1 (64 MiB) with a 16 MiB PV disk xvda (dom1).
RunResult create_web1_with_disk(TestHost& h) {
  const auto img = image(h, "a.img", 16);
  return h.run({"create", h.write("web1.cfg", "name = \"web1\"\ntype = \"process\"\nmemory = 64\n"
                                              "disk = [ 'format=raw, vdev=xvda, access=rw, target=" + img + "' ]\n")});
}

class RealFront : public Toolstack {
 protected:
  void SetUp() override {
    Toolstack::SetUp();
    if (IsSkipped()) return;
    for (const char* p : {"xpv-front", "xpv-blkback"}) {
      if (::access((kBin + "/" + p).c_str(), X_OK) != 0) GTEST_SKIP() << kBin << "/" << p << " is not built on this branch";
    }
  }
};

TEST_F(RealFront, CreateListBlockAttachDestroy) {
  TestHost h(kBin, kFake, {}, /*use_real_bin=*/true);
  auto r = h.run({"up"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto before = tree(h.xs_socket);
  const auto img_a = image(h, "a.img", 16);
  const auto img_b = image(h, "b.img", 8);
  r = h.run({"create", h.write("web1.cfg", "name = \"web1\"\ntype = \"process\"\nmemory = 64\n"
                                           "disk = [ 'format=raw, vdev=xvda, access=rw, target=" + img_a + "' ]\n")});
  ASSERT_EQ(r.rc, 0) << r.err << slurp(h.log_dir + "/xpv-front-web1.log") << slurp(h.log_dir + "/xpv-blkback.log");
  const std::string disk_a = h.run_dir + "/dom1/vbd/51712/disk";
  EXPECT_THAT(r.out, HasSubstr("  xvda: " + disk_a + "\n"));
  ASSERT_TRUE(eventually([&] { return fs::exists(disk_a); }));
  EXPECT_EQ(fs::file_size(disk_a), 16u << 20);
  {
    xenbus::client::SyncClient c(h.xs_socket);
    EXPECT_EQ(*c.read("/local/domain/1/device/vbd/51712/state"), "4");
    EXPECT_EQ(*c.read("/local/domain/0/backend/vbd/1/51712/state"), "4");
  }
  r = h.run({"list"});
  EXPECT_THAT(r.out, MatchesRegex("(.|\n)*\nweb1 +1  process +64 +1  running\n"));

  r = h.run({"block-attach", "web1", "vdev=xvdb, access=ro, target=" + img_b});
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string disk_b = h.run_dir + "/dom1/vbd/51728/disk";
  EXPECT_EQ(r.out, "xvdb: " + disk_b + "\n");
  ASSERT_TRUE(eventually([&] { return fs::exists(disk_b); }));
  EXPECT_EQ(fs::file_size(disk_b), 8u << 20);
  // Both disks connected at both ends (block-attach waited for that).
  r = h.run({"block-list", "web1"});
  EXPECT_EQ(r.out, fmt::format("Vdev   Devid  Frontend          Backend           Mode Target\n"
                               "xvda   51712  4 (Connected)     4 (Connected)     w    {}\n"
                               "xvdb   51728  4 (Connected)     4 (Connected)     r    {}\n",
                               img_a, img_b));
  r = h.run({"block-detach", "web1", "xvdb"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");  // closed in time: no "removed anyway" warning

  r = h.run({"destroy", "web1"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(tree(h.xs_socket), before);
  EXPECT_TRUE(domain_dirs(h.run_dir).empty());
  for (pid_t p : processes_mentioning(h.dir)) {
    EXPECT_THAT(slurp(fmt::format("/proc/{}/cmdline", p)), ::testing::Not(HasSubstr("xpv-front")));
  }
}

// `xpv top` as xentop: the disk's counters as xpv-blkback publishes them (RUN/stats/vbd1.51712,
// rewritten every second) — exactly the requests made through the PV disk, since each O_DIRECT
// request on the FUSE file is one blkif request here — and the file gone with the device.
TEST_F(RealFront, TopShowsTheDisksRequestsAndSectors) {
  TestHost h(kBin, kFake, {}, /*use_real_bin=*/true);
  ASSERT_EQ(h.run({"up"}).rc, 0);
  auto r = create_web1_with_disk(h);
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string disk = h.run_dir + "/dom1/vbd/51712/disk";
  ASSERT_TRUE(eventually([&] { return fs::exists(disk); }));
  // 100 writes of 4 KiB, then 10 reads of 64 KiB, each straight through (O_DIRECT).
  ASSERT_EQ(std::system(("dd if=/dev/urandom of=" + disk + " bs=4k count=100 oflag=direct conv=notrunc status=none")
                            .c_str()),
            0);
  ASSERT_EQ(std::system(("dd if=" + disk + " of=/dev/null bs=64k count=10 iflag=direct status=none").c_str()), 0);
  nlohmann::json vbd;
  for (int i = 0; i < 40; ++i) {  // bounded: 40 × (0.2 s + the command)
    auto t = h.run({"top", "--json", "-i", "1", "-d", "0.2"});
    ASSERT_EQ(t.rc, 0) << t.err;
    const auto j = nlohmann::json::parse(t.out);
    ASSERT_EQ(j.at("domains").size(), 1u) << t.out;
    EXPECT_EQ(j.at("domains").at(0).value("name", ""), "web1");
    ASSERT_EQ(j.at("domains").at(0).at("vbds").size(), 1u) << t.out;
    vbd = j.at("domains").at(0).at("vbds").at(0);
    if (vbd.at("counters").value("rd_req", 0ull) >= 10) break;
  }
  EXPECT_EQ(vbd.value("name", ""), "vbd1.51712");
  const auto& c = vbd.at("counters");
  EXPECT_EQ(c.value("wr_req", 0ull), 100u) << vbd.dump();
  EXPECT_EQ(c.value("wr_sect", 0ull), 800u) << vbd.dump();
  EXPECT_EQ(c.value("rd_req", 0ull), 10u) << vbd.dump();
  EXPECT_EQ(c.value("rd_sect", 0ull), 1280u) << vbd.dump();
  EXPECT_EQ(c.value("errors", 1ull), 0u) << vbd.dump();
  // The table: the domain's row with those totals in its VBD columns (and no exits: a process
  // domain has no xpv-vmm).
  auto t = h.run({"top", "-b", "-i", "1", "-d", "0.2"});
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_THAT(t.out, MatchesRegex("(.|\n)* +web1 +1 running +[0-9]+ +[0-9.]+ +65536 +1 +0 +0 +0 +1 +10 +100 +1280 +800 +-\n(.|\n)*"))
      << t.out;
  EXPECT_THAT(t.out, HasSubstr("dom0 services: xpv-blkback "));
  r = h.run({"destroy", "web1"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(eventually([&] { return !fs::exists(h.run_dir + "/stats/vbd1.51712"); }, 3s));
}

// web1 created with its PV disk (create_web1_with_disk), and 1 MiB of random bytes (kept in
// `data`) written through the disk's FUSE file `disk`, O_DIRECT and fsync'd.
void create_web1_and_write_its_disk(TestHost& h, const std::string& disk, const std::string& data) {
  auto r = create_web1_with_disk(h);
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(eventually([&] { return fs::exists(disk); }));
  ASSERT_EQ(std::system(("dd if=/dev/urandom of=" + data + " bs=64k count=16 status=none").c_str()), 0);
  ASSERT_EQ(std::system(("dd if=" + data + " of=" + disk + " bs=64k oflag=direct conv=notrunc,fsync status=none").c_str()), 0);
}

// After xpv-xenstored changed under web1 (a live update, a crash restart): a second disk attaches
// and detaches through it — the backend's watches and the domain's xenbus both work —, and
// destroying web1 leaves the tree as `before`.
void hotplug_a_disk_then_destroy(TestHost& h, const std::vector<std::string>& before) {
  const auto img_b = image(h, "b.img", 8);
  auto r = h.run({"block-attach", "web1", "vdev=xvdb, access=ro, target=" + img_b});
  ASSERT_EQ(r.rc, 0) << r.err << slurp(h.log_dir + "/xpv-xenstored.log");
  r = h.run({"block-list", "web1"});
  EXPECT_THAT(r.out, HasSubstr("xvdb   51728  4 (Connected)     4 (Connected)     r"));
  r = h.run({"block-detach", "web1", "xvdb"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  r = h.run({"destroy", "web1"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(tree(h.xs_socket), before);
}

// `xpv live-update`: xpv-xenstored replaced in place under a running process domain with a PV
// disk. The same process serves on; what was written through the disk reads back; blkback's
// watches (a socket client) and the domain's xenbus (its ring) go on through the next binary, so
// a second disk attaches and detaches; destroy leaves the tree as it was before the domain.
TEST_F(RealFront, LiveUpdateOfXenstoredUnderARunningDomain) {
  TestHost h(kBin, kFake, {}, /*use_real_bin=*/true);
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const pid_t xs = *pid_in(h.run_dir + "/xpv-xenstored.pid");
  const std::string disk = h.run_dir + "/dom1/vbd/51712/disk", data = h.dir + "/data";
  create_web1_and_write_its_disk(h, disk, data);
  ASSERT_FALSE(HasFatalFailure());

  auto r = h.run({"live-update"});
  ASSERT_EQ(r.rc, 0) << r.err << slurp(h.log_dir + "/xpv-xenstored.log");
  EXPECT_EQ(r.out, fmt::format("xpv-xenstored: live update done (pid {}, now {}/xpv-xenstored)\n", xs, kBin));
  EXPECT_EQ(pid_in(h.run_dir + "/xpv-xenstored.pid"), xs);
  EXPECT_TRUE(toolstack::process_alive(xs));
  EXPECT_THAT(slurp(h.log_dir + "/xpv-xenstored.log"), HasSubstr("live update done"));
  EXPECT_THAT(slurp(h.log_dir + "/xpv-xenstored.log"), HasSubstr("dom1 ring served again after the live update"));
  ASSERT_EQ(std::system(("cmp -s -n 1048576 " + data + " " + disk).c_str()), 0) << "the disk's data reads back";

  hotplug_a_disk_then_destroy(h, before);
  ASSERT_FALSE(HasFatalFailure());
  // A binary that is not an xpv-xenstored is refused before anything happens.
  r = h.run({"live-update", "/bin/true"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr("/bin/true is not an xpv-xenstored that reads this state"));
  EXPECT_EQ(h.run({"down"}).rc, 0);
}

// A crash of xpv-xenstored (SIGKILL) under a running process domain with a PV disk: the
// supervisor starts it again from its journal and restarts the backends; the store is as it was
// (the domain's nodes and the backends' entries), the disk's data reads back, and the domain's
// xenbus — its ring, re-attached, and its watches, recovered — sees a second disk attached and
// detached; destroy leaves the tree as it was before the domain. `xpv down` removes the journal.
TEST_F(RealFront, ACrashOfXenstoredIsRecoveredUnderARunningDomain) {
  TestHost h(kBin, kFake, {}, /*use_real_bin=*/true);
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  const pid_t xs = *pid_in(h.run_dir + "/xpv-xenstored.pid");
  const std::string journal = h.run_dir + "/xpv-xenstored.journal";
  ASSERT_TRUE(fs::exists(journal));
  const std::string disk = h.run_dir + "/dom1/vbd/51712/disk", data = h.dir + "/data";
  create_web1_and_write_its_disk(h, disk, data);
  ASSERT_FALSE(HasFatalFailure());
  const auto with_domain = tree(h.xs_socket);
  const pid_t blkback = *pid_in(h.run_dir + "/xpv-blkback.pid");

  ASSERT_EQ(::kill(xs, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] {
    auto now = pid_in(h.run_dir + "/xpv-xenstored.pid");
    return now && *now != xs && toolstack::process_alive(*now) &&
           slurp(h.log_dir + "/xpv-supervise.log").find("restarting the backends") != std::string::npos;
  })) << slurp(h.log_dir + "/xpv-supervise.log") << slurp(h.log_dir + "/xpv-xenstored.log");
  EXPECT_THAT(slurp(h.log_dir + "/xpv-xenstored.log"), HasSubstr("dom1 ring served again after the crash restart"));
  ASSERT_TRUE(eventually([&] {
    auto now = pid_in(h.run_dir + "/xpv-blkback.pid");
    return now && *now != blkback && toolstack::process_alive(*now);
  }));
  EXPECT_EQ(tree(h.xs_socket), with_domain) << "the store as it was";
  ASSERT_EQ(std::system(("cmp -s -n 1048576 " + data + " " + disk).c_str()), 0) << "the disk's data reads back";
  EXPECT_THAT(h.run({"list"}).out, HasSubstr("web1"));

  hotplug_a_disk_then_destroy(h, before);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(h.run({"down"}).rc, 0);
  EXPECT_FALSE(fs::exists(journal));
}

// `xpv shutdown` as `xl shutdown`: xpv-front advertises control/feature-poweroff, so it is asked
// through control/shutdown (not signalled); it acknowledges, closes its disk with the backend and
// exits; nothing is left.
TEST_F(RealFront, ShutdownAsksThroughThePvControlProtocol) {
  TestHost h(kBin, kFake, {}, /*use_real_bin=*/true);
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  auto r = create_web1_with_disk(h);
  ASSERT_EQ(r.rc, 0) << r.err;
  const pid_t front = *pid_in(h.run_dir + "/dom1/pid");
  {
    xenbus::client::SyncClient c(h.xs_socket);
    ASSERT_TRUE(eventually([&] { return c.read("/local/domain/1/control/feature-poweroff").value_or("") == "1"; }))
        << slurp(h.log_dir + "/xpv-front-web1.log");
    // Laid out as libxl does: the directory is dom0's, the nodes in it the guest's.
    auto perms = c.get_perms("/local/domain/1/control/shutdown");
    ASSERT_TRUE(perms);
    ASSERT_FALSE(perms->empty());
    EXPECT_EQ(perms->front().id, 1u) << "owned by the guest";
  }
  r = h.run({"shutdown", "web1", "--timeout", "15"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "Shut down domain web1 (id 1) (the guest was asked through control/shutdown)\n");
  // No signal was sent: xpv-front went by itself, in time (else: "did not shut down within",
  // and destroy kills it), and its disk closed with the backend (else: "removed anyway").
  EXPECT_EQ(r.err, "");
  EXPECT_FALSE(toolstack::process_alive(front));
  EXPECT_EQ(tree(h.xs_socket), before);
  EXPECT_TRUE(domain_dirs(h.run_dir).empty());
}

// `xpv reboot` as `xl reboot`: asked through control/shutdown, the domain closes its devices and
// stops saying "reboot"; its monitor destroys it and creates it again from its configuration (a
// new domain: new process, record and uuid, the lowest free id), disk and all; what was written before is read back after. A domain
// stopping by itself (SIGTERM to its process: xpv-front's poweroff) is destroyed (on_poweroff);
// on_reboot = "destroy" ends it. `xpv sysrq` reaches it (xpv-front clears the key, as Linux does, and logs it).
TEST_F(RealFront, RebootRestartsTheDomainThroughItsMonitor) {
  TestHost h(kBin, kFake, {}, /*use_real_bin=*/true);
  ASSERT_EQ(h.run({"up"}).rc, 0);
  const auto before = tree(h.xs_socket);
  auto r = create_web1_with_disk(h);
  ASSERT_EQ(r.rc, 0) << r.err;
  const pid_t first = *pid_in(h.run_dir + "/dom1/pid");
  xenbus::client::SyncClient c(h.xs_socket);
  ASSERT_TRUE(eventually([&] { return c.read("/local/domain/1/control/feature-reboot").value_or("") == "1"; }))
      << slurp(h.log_dir + "/xpv-front-web1.log");
  const std::string pattern(4096, 'R');
  {
    std::ofstream out(h.run_dir + "/dom1/vbd/51712/disk", std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(8192);
    out.write(pattern.data(), static_cast<std::streamsize>(pattern.size()));
    ASSERT_TRUE(out.flush());
  }
  r = h.run({"sysrq", "web1", "h"});
  EXPECT_EQ(r.rc, 0) << r.err;
  // Acknowledged (cleared) by xpv-front, as Linux's sysrq handler clears it.
  EXPECT_TRUE(eventually([&] { return c.read("/local/domain/1/control/sysrq").value_or("?") == ""; }));

  r = h.run({"reboot", "web1", "--timeout", "20"});
  ASSERT_EQ(r.rc, 0) << r.err << slurp(h.log_dir + "/monitor-web1.log");
  EXPECT_THAT(r.out, MatchesRegex("Rebooted domain web1 \\(id 1\\) \\(now id 1, pid [0-9]+\\)\n"));
  EXPECT_EQ(r.err, "");
  EXPECT_FALSE(toolstack::process_alive(first));
  // A new domain (the lowest free id: the old one's), its own record, uuid and monitor.
  const auto second = toolstack::read_record(h.run_dir + "/dom1");
  ASSERT_TRUE(second);
  EXPECT_NE(second->pid, first);
  EXPECT_GT(second->monitor_pid, 0);
  const std::string log = slurp(h.log_dir + "/monitor-web1.log");
  EXPECT_THAT(log, HasSubstr("web1 (id 1) stopped after"));
  EXPECT_THAT(log, HasSubstr(": reboot; on_reboot = restart"));
  EXPECT_THAT(log, HasSubstr("web1 restarted from"));
  // The new domain's disk connects again (create waited for it) and has what was written.
  {
    std::ifstream in(h.run_dir + "/dom1/vbd/51712/disk", std::ios::binary);
    std::string back(pattern.size(), '\0');
    in.seekg(8192);
    ASSERT_TRUE(in.read(back.data(), static_cast<std::streamsize>(back.size())));
    EXPECT_EQ(back, pattern);
  }
  EXPECT_EQ(c.read("/local/domain/1/name").value_or(""), "web1");

  // The domain powers off by itself (its process's own SIGTERM path): on_poweroff = destroy.
  ASSERT_EQ(::kill(second->pid, SIGTERM), 0);
  ASSERT_TRUE(eventually([&] { return domain_dirs(h.run_dir).empty(); }, 30s)) << slurp(h.log_dir + "/monitor-web1.log");
  EXPECT_THAT(slurp(h.log_dir + "/monitor-web1.log"), HasSubstr(": poweroff; on_poweroff = destroy"));
  EXPECT_THAT(slurp(h.log_dir + "/monitor-web1.log"), HasSubstr(": poweroff; on_poweroff = destroy"));
  EXPECT_TRUE(eventually([&] { return !toolstack::process_alive(second->monitor_pid); }));

  // on_reboot = "destroy": rebooted, not restarted, nothing left.
  r = h.run({"create", h.write("web2.cfg", "name = \"web2\"\ntype = \"process\"\nmemory = 64\non_reboot = \"destroy\"\n")});
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(eventually([&] { return c.read("/local/domain/1/control/feature-reboot").value_or("") == "1"; }));
  r = h.run({"reboot", "web2", "--timeout", "20"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, MatchesRegex("Domain web2 \\(id [0-9]+\\) rebooted; on_reboot = destroy: not restarted\n"));
  EXPECT_TRUE(eventually([&] { return domain_dirs(h.run_dir).empty(); }, 20s));
  EXPECT_TRUE(eventually([&] { return tree(h.xs_socket) == before; }));
}

// Issue 4's acceptance path, through the toolstack with every real component: a process domain
// with a PV disk; mkfs.ext4 on a loop device over its FUSE file; files written with fsync;
// destroy; create again; the content is there (sha256).
TEST_F(RealFront, Ext4OnAPvDiskSurvivesDestroyAndCreate) {
  if (std::system("command -v losetup >/dev/null && command -v mkfs.ext4 >/dev/null") != 0) {
    GTEST_SKIP() << "needs losetup and mkfs.ext4";
  }
  TestHost h(kBin, kFake, {}, /*use_real_bin=*/true);
  auto r = h.run({"up"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto img = image(h, "root.img", 64);
  const std::string cfg = h.write("store.cfg", "name = \"store\"\ntype = \"process\"\nmemory = 64\n"
                                               "disk = [ 'format=raw, vdev=xvda, access=rw, target=" + img + "' ]\n");
  const std::string disk = h.run_dir + "/dom1/vbd/51712/disk";
  const std::string mnt = h.dir + "/mnt";
  fs::create_directories(mnt);
  auto sh = [](const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); };
  std::optional<test::LoopDevice> loop;  // declared before `unmount`: unmounted first
  test::UnmountAtExit unmount{mnt};

  r = h.run({"create", cfg});
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(eventually([&] { return fs::exists(disk); }));
  loop.emplace(disk);
  if (loop->empty()) GTEST_SKIP() << "no free loop device";
  ASSERT_EQ(sh("mkfs.ext4 -q -F " + loop->path()), 0);
  ASSERT_EQ(sh("mount " + loop->path() + " " + mnt), 0);
  ASSERT_EQ(sh("dd if=/dev/urandom of=" + mnt + "/a bs=64k count=32 conv=fsync"), 0);
  ASSERT_EQ(sh("sh -c 'echo pv-disk > " + mnt + "/b && sync " + mnt + "/b'"), 0);
  ASSERT_EQ(sh("sh -c 'cd " + mnt + " && sha256sum a b > " + h.dir + "/sums'"), 0);
  ASSERT_EQ(sh("umount " + mnt), 0);
  ASSERT_EQ(loop->detach(), 0);
  r = h.run({"destroy", "store"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(fs::exists(disk));

  r = h.run({"create", cfg});
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(eventually([&] { return fs::exists(disk); }));
  loop.emplace(disk);
  ASSERT_FALSE(loop->empty());
  ASSERT_EQ(sh("mount -o ro " + loop->path() + " " + mnt), 0);
  EXPECT_EQ(sh("sh -c 'cd " + mnt + " && sha256sum -c --quiet " + h.dir + "/sums'"), 0);
  ASSERT_EQ(sh("umount " + mnt), 0);
  ASSERT_EQ(loop->detach(), 0);
  r = h.run({"destroy", "store"});
  EXPECT_EQ(r.rc, 0) << r.err;
}

}  // namespace
}  // namespace xpv::test
