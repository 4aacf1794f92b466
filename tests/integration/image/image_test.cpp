// `xpv image` end to end: build into a temp cache, inspect the cpio (cpio -t), the ext4
// (debugfs, no mount) and the manifest; a second build is a cache hit; a recipe change rebuilds;
// missing tools, bad sizes and a failed build are clear errors that leave nothing behind.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Result {
  int rc = -1;
  std::string out, err;
};

// A temp dir removed with everything in it when the test ends (also on failure).
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/xpv-image-test.XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

Result sh(const std::string& cmd, const fs::path& scratch) {
  const fs::path o = scratch / ".out", e = scratch / ".err";
  const int st = std::system(("( " + cmd + " ) > " + quote(o) + " 2> " + quote(e)).c_str());
  Result r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(o);
  r.err = slurp(e);
  fs::remove(o);
  fs::remove(e);
  return r;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// `xpv image ARGS` with the temp cache and recipes.
Result xpv_image(const TempDir& t, const std::string& args, const std::string& env = {}) {
  return sh("XPV_IMAGE_CACHE=" + quote((t.path() / "cache").string()) + " XPV_IMAGE_RECIPES=" +
                quote((t.path() / "recipes").string()) + " " + env + " " + XPV_BIN + " image " + args,
            t.path());
}

void copy_recipes(const TempDir& t) {
  fs::copy(XPV_RECIPES_SRC, t.path() / "recipes", fs::copy_options::recursive);
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

bool has_line(const std::string& text, const std::string& line) {
  for (const auto& l : lines(text)) {
    if (l == line) return true;
  }
  return false;
}

// Names in a debugfs `ls -p DIR` listing (/ino/mode/uid/gid/name/size/).
std::vector<std::string> ext4_ls(const fs::path& img, const std::string& dir, const fs::path& scratch) {
  const auto r = sh("debugfs -R " + quote("ls -p " + dir) + " " + quote(img.string()), scratch);
  std::vector<std::string> names;
  for (const auto& l : lines(r.out)) {
    std::vector<std::string> f;
    std::istringstream in(l);
    for (std::string x; std::getline(in, x, '/');) f.push_back(x);
    if (f.size() >= 6) names.push_back(f[5]);
  }
  return names;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v) {
    if (x == s) return true;
  }
  return false;
}

// DIR/bin with busybox's awk as `awk`: put first on PATH, rootfs-init.sh's functions run with the
// awk the image has.
fs::path busybox_awk_bin(const fs::path& dir) {
  const fs::path bin = dir / "bin";
  fs::create_directories(bin);
  fs::create_symlink("/usr/bin/busybox", bin / "awk");
  return bin;
}

// Cuts the named shell functions out of the image's rootfs-init.sh into `dir`/`file` (so that a
// test can run them with busybox sh as the image does); "" when one of them is missing.
std::string cut_functions(const fs::path& dir, const std::string& file, std::initializer_list<const char*> names) {
  std::string expr;
  for (const char* n : names) expr += std::string("/^") + n + "() {/,/^}/p; ";
  const fs::path out = dir / file;
  const auto r = sh("sed -n " + quote(expr) + " " + quote(std::string(XPV_RECIPES_SRC) + "/rootfs-init.sh") + " > " +
                        quote(out.string()),
                    dir);
  if (r.rc != 0) return "";
  const std::string text = slurp(out);
  for (const char* n : names) {
    if (text.find(std::string(n) + "() {") == std::string::npos) return "";
  }
  return out.string();
}

TEST(Image, BuildInspectCacheHitAndRecipeChange) {
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  copy_recipes(t);
  const auto b1 = xpv_image(t, "build --size 512");
  ASSERT_EQ(b1.rc, 0) << b1.err;
  const fs::path dir = trim(b1.out);
  EXPECT_EQ(dir.parent_path(), t.path() / "cache");
  EXPECT_TRUE(std::regex_match(dir.filename().string(), std::regex("[0-9a-f]{16}"))) << dir;
  for (const char* f : {"vmlinuz", "initrd.cpio", "root.ext4", "manifest.json", "inputs.txt"}) {
    EXPECT_TRUE(fs::is_regular_file(dir / f)) << f;
  }
  EXPECT_EQ(fs::file_size(dir / "root.ext4"), 512ull << 20);
  struct stat st {};
  ASSERT_EQ(stat((dir / "root.ext4").c_str(), &st), 0);
  EXPECT_LT(static_cast<unsigned long long>(st.st_blocks) * 512, 512ull << 20);  // sparse

  // Manifest.
  const auto m = nlohmann::json::parse(slurp(dir / "manifest.json"));
  EXPECT_EQ(m["key"], dir.filename().string());
  const std::string kver = m["kernel"]["version"];
  EXPECT_EQ(m["kernel"]["package"], "linux-image-" + kver);
  EXPECT_EQ(m["kernel"]["deb_sha256"].get<std::string>().size(), 64u);
  for (const char* pkg : {"busybox-static", "iperf3", "bonnie++", "fio"}) {
    const auto v = sh(std::string("dpkg-query -W -f='${Version}' ") + pkg, t.path());
    EXPECT_EQ(m["packages"][pkg], v.out) << pkg;
  }
  for (const char* f : {"vmlinuz", "initrd.cpio", "root.ext4"}) {
    EXPECT_EQ(m["outputs"][f]["size"].get<std::uintmax_t>(), fs::file_size(dir / f)) << f;
    EXPECT_EQ(m["outputs"][f]["sha256"].get<std::string>().size(), 64u) << f;
  }
  EXPECT_EQ(m["root_size_mib"], 512);
  EXPECT_EQ(m["programs"].size(), 4u);

  // The initramfs.
  const auto cp = sh("cpio -t --quiet < " + quote((dir / "initrd.cpio").string()), t.path());
  ASSERT_EQ(cp.rc, 0) << cp.err;
  const std::string mods = "lib/modules/" + kver + "/kernel/";
  for (const std::string& f : std::vector<std::string>{"init", "bin/busybox", "dev/console", "etc/xpv/modules", "etc/xpv/kernel-version",
        mods + "drivers/block/xen-blkfront.ko", mods + "drivers/net/xen-netfront.ko",
        mods + "drivers/block/virtio_blk.ko", mods + "drivers/net/virtio_net.ko",
        mods + "drivers/virtio/virtio_pci.ko", mods + "drivers/virtio/virtio.ko",
        mods + "drivers/virtio/virtio_ring.ko", mods + "fs/ext4/ext4.ko", mods + "fs/jbd2/jbd2.ko",
        mods + "fs/mbcache.ko", mods + "lib/crc16.ko", mods + "crypto/crc32c_generic.ko"}) {
    EXPECT_TRUE(has_line(cp.out, f)) << f << "\n" << cp.out;
  }
  const auto init = sh("cpio -i --quiet --to-stdout init < " + quote((dir / "initrd.cpio").string()), t.path());
  EXPECT_EQ(init.out, slurp(t.path() / "recipes" / "initrd-init.sh"));
  const auto order =
      lines(sh("cpio -i --quiet --to-stdout etc/xpv/modules < " + quote((dir / "initrd.cpio").string()), t.path()).out);
  auto pos = [&](const std::string& name) {
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i].rfind(name + " ", 0) == 0) return static_cast<int>(i);
    }
    return -1;
  };
  for (const char* n : {"xen_blkfront", "xen_netfront", "virtio", "virtio_blk", "virtio_net", "jbd2", "ext4"}) {
    EXPECT_GE(pos(n), 0) << n;
  }
  EXPECT_LT(pos("virtio"), pos("virtio_blk"));
  EXPECT_LT(pos("virtio_ring"), pos("virtio_net"));
  EXPECT_LT(pos("jbd2"), pos("ext4"));
  EXPECT_LT(pos("crc16"), pos("ext4"));

  // The root disk, read without mounting.
  const fs::path root = dir / "root.ext4";
  const auto sbin = sh("debugfs -R 'ls -l /sbin' " + quote(root.string()), t.path());
  EXPECT_NE(sbin.out.find(" init"), std::string::npos) << sbin.out;
  EXPECT_EQ(sh("debugfs -R 'cat /sbin/init' " + quote(root.string()), t.path()).out,
            slurp(t.path() / "recipes" / "rootfs-init.sh"));
  EXPECT_TRUE(contains(ext4_ls(root, "/usr/bin", t.path()), "iperf3"));
  EXPECT_TRUE(contains(ext4_ls(root, "/usr/bin", t.path()), "fio"));
  EXPECT_TRUE(contains(ext4_ls(root, "/usr/sbin", t.path()), "bonnie++"));
  EXPECT_TRUE(contains(ext4_ls(root, "/bin", t.path()), "busybox"));
  EXPECT_TRUE(contains(ext4_ls(root, "/bin", t.path()), "sh"));
  EXPECT_TRUE(contains(ext4_ls(root, "/lib64", t.path()), "ld-linux-x86-64.so.2"));
  const auto libs = ext4_ls(root, "/lib/x86_64-linux-gnu", t.path());
  for (const char* l : {"libc.so.6", "libiperf.so.0", "libstdc++.so.6", "libaio.so.1", "libm.so.6"}) {
    EXPECT_TRUE(contains(libs, l)) << l;
  }
  EXPECT_TRUE(contains(ext4_ls(root, "/etc/xpv/fio", t.path()), "randread-4k.fio"));
  EXPECT_NE(sh("debugfs -R 'cat /etc/passwd' " + quote(root.string()), t.path()).out.find("root:x:0:0:"),
            std::string::npos);
  const auto stat_init = sh("debugfs -R 'stat /sbin/init' " + quote(root.string()), t.path());
  EXPECT_NE(stat_init.out.find("Mode:  0755"), std::string::npos) << stat_init.out;

  // As root: copy the tree out (still no mount) and run each program in a chroot, which proves
  // that every shared library it needs is on the disk.
  if (geteuid() == 0) {
    const fs::path x = t.path() / "x";
    fs::create_directories(x);
    const auto rd = sh("debugfs -R " + quote("rdump / " + x.string()) + " " + quote(root.string()), t.path());
    ASSERT_EQ(rd.rc, 0) << rd.err;
    EXPECT_EQ(sh("chroot " + quote(x.string()) + " /usr/bin/iperf3 --version", t.path()).rc, 0);
    EXPECT_EQ(sh("chroot " + quote(x.string()) + " /usr/bin/fio --version", t.path()).rc, 0);
    const auto bonnie = sh("chroot " + quote(x.string()) + " /usr/sbin/bonnie++ -h", t.path());
    EXPECT_NE(bonnie.err.find("usage"), std::string::npos) << bonnie.err;
    EXPECT_EQ(sh("chroot " + quote(x.string()) + " /bin/sh -n /sbin/init", t.path()).rc, 0);
  }

  // Second build: a cache hit, nothing rewritten.
  const auto mtime = fs::last_write_time(dir / "manifest.json");
  const auto b2 = xpv_image(t, "build --size 512");
  ASSERT_EQ(b2.rc, 0) << b2.err;
  EXPECT_EQ(trim(b2.out), dir.string());
  EXPECT_NE(b2.err.find("xpv image: cached"), std::string::npos) << b2.err;
  EXPECT_EQ(fs::last_write_time(dir / "manifest.json"), mtime);

  // show: the same image, built.
  const auto show = xpv_image(t, "show --size 512");
  ASSERT_EQ(show.rc, 0) << show.err;
  const auto sj = nlohmann::json::parse(show.out);
  EXPECT_EQ(sj["dir"], dir.string());
  EXPECT_EQ(sj["built"], true);
  EXPECT_EQ(sj["manifest"]["key"], dir.filename().string());

  // A recipe change → a new key, a new image with the new script; the old one stays.
  std::ofstream(t.path() / "recipes" / "rootfs-init.sh", std::ios::app) << "# changed by the test\n";
  const auto b3 = xpv_image(t, "build --size 512");
  ASSERT_EQ(b3.rc, 0) << b3.err;
  const fs::path dir3 = trim(b3.out);
  EXPECT_NE(dir3, dir);
  EXPECT_NE(b3.err.find("xpv image: building"), std::string::npos) << b3.err;
  EXPECT_TRUE(fs::exists(dir / "manifest.json"));
  EXPECT_EQ(sh("debugfs -R 'cat /sbin/init' " + quote((dir3 / "root.ext4").string()), t.path()).out,
            slurp(t.path() / "recipes" / "rootfs-init.sh"));
  // No temp dirs left behind.
  for (const auto& e : fs::directory_iterator(t.path() / "cache")) {
    EXPECT_NE(e.path().filename().string().front(), '.') << e.path();
  }
}

TEST(Image, MissingToolIsNamed) {
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  copy_recipes(t);
  // A PATH with every host program except fio.
  const fs::path bin = t.path() / "bin";
  fs::create_directories(bin);
  for (const char* d : {"/usr/local/bin", "/usr/bin", "/usr/sbin", "/bin", "/sbin"}) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec)) {
      const auto name = e.path().filename();
      if (name == "fio" || fs::exists(fs::symlink_status(bin / name))) continue;
      fs::create_symlink(e.path(), bin / name, ec);
    }
  }
  const auto r = xpv_image(t, "build", "PATH=" + quote(bin.string()));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("fio not found in PATH (package fio not installed? run scripts/setup)"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(t.path() / "cache") && !fs::is_empty(t.path() / "cache"));
}

TEST(Image, BadInputsAreClearErrors) {
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  copy_recipes(t);
  const auto small = xpv_image(t, "build --size 10");
  EXPECT_EQ(small.rc, 1);
  EXPECT_NE(small.err.find("--size 10 MiB: must be between 64 and 1048576"), std::string::npos) << small.err;

  fs::remove(t.path() / "recipes" / "initrd-init.sh");
  const auto norecipe = xpv_image(t, "build");
  EXPECT_EQ(norecipe.rc, 1);
  EXPECT_NE(norecipe.err.find("recipe initrd-init.sh is missing in"), std::string::npos) << norecipe.err;

  const auto usage = xpv_image(t, "build --size lots");
  EXPECT_NE(usage.rc, 0);
}

TEST(Image, FailedBuildLeavesNothing) {
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  copy_recipes(t);
  // 64 MiB cannot hold the programs and libraries (~150 MB): mke2fs -d fails mid-build.
  const auto r = xpv_image(t, "build --size 64");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("mke2fs -d failed for a 64 MiB root disk"), std::string::npos) << r.err;
  ASSERT_TRUE(fs::is_directory(t.path() / "cache"));
  EXPECT_TRUE(fs::is_empty(t.path() / "cache")) << "a half-built image was left behind";
}

TEST(Image, TheGuestSpreadsItsNicQueueInterruptsOverItsVcpus) {
  // rootfs-init.sh's spread_nic_irqs, run by the image's own shell (busybox) against a made-up
  // /proc/interrupts and /proc/irq: netfront's vifD-qN-tx/rx and virtio-net's virtioM-*.N lines go
  // to vCPU N mod vCPUs; other lines are left alone; an irq the kernel refuses is said as kept.
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  const fs::path irq = t.path() / "irq";
  for (int n : {24, 25, 26, 27, 29, 30, 31}) fs::create_directories(irq / std::to_string(n));
  // 28 (vif0-q2-rx) has no directory: the write fails, as the kernel's would for an INTx upcall.
  std::ofstream(t.path() / "interrupts") << "           CPU0       CPU1       CPU2\n"
                                            "  1:          9          0          0   IO-APIC   1-edge      i8042\n"
                                            " 24:       1234          0          0  xen-dyn    -edge      vif0-q0-tx\n"
                                            " 25:       5678          0          0  xen-dyn    -edge      vif0-q0-rx\n"
                                            " 26:         12          0          0  xen-dyn    -edge      vif0-q1-tx\n"
                                            " 27:         34          0          0  xen-dyn    -edge      vif0-q1-rx\n"
                                            " 28:         34          0          0  xen-dyn    -edge      vif0-q2-rx\n"
                                            " 29:         34          0          0  xen-dyn    -edge      blkif\n"
                                            " 30:          1          0          0  PCI-MSI 1-edge      virtio1-input.4\n"
                                            " 31:          1          0          0  PCI-MSI 1-edge      virtio1-output.5\n";
  const fs::path fn = cut_functions(t.path(), "spread.sh", {"spread_nic_irqs"});
  ASSERT_FALSE(fn.empty()) << "rootfs-init.sh has no spread_nic_irqs()";
  // The function as the image's busybox runs it, `say` printing to stdout.
  auto spread = [&](int vcpus) {
    return sh("busybox sh -c " + quote("say() { echo \"$*\"; }; . " + fn.string() + "; spread_nic_irqs " +
                                      (t.path() / "interrupts").string() + " " + irq.string() + " " +
                                      std::to_string(vcpus)),
              t.path());
  };
  const auto r = spread(3);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(trim(r.out), "XPV-IRQS spread 24:0 25:0 26:1 27:1 30:1 31:2 (kept: 28)");
  EXPECT_EQ(r.err, "");
  for (auto [n, cpu] : {std::pair{24, "0"}, {25, "0"}, {26, "1"}, {27, "1"}, {30, "1"}, {31, "2"}}) {
    EXPECT_EQ(trim(slurp(irq / std::to_string(n) / "smp_affinity_list")), cpu) << "irq " << n;
  }
  EXPECT_FALSE(fs::exists(irq / "29" / "smp_affinity_list")) << "blkif's interrupt is not the NIC's";

  std::ofstream(t.path() / "interrupts", std::ios::trunc) << "  1:          9   IO-APIC   1-edge      i8042\n";
  const auto none = spread(2);
  EXPECT_EQ(trim(none.out), "XPV-IRQS none (no NIC queue interrupts in " + (t.path() / "interrupts").string() + ")");
}

TEST(Image, TheGuestSaysItsTcpLossAndDropCountersOnOneLine) {
  // rootfs-init.sh's net_counters, run by busybox sh with busybox's awk (as in the image) against
  // made-up /proc/net files: the four TCP loss counters by their names, wherever their columns are,
  // and eth0's rx/tx drops (not another interface's); the header lines name the columns.
  if (sh("command -v busybox", "/tmp").rc != 0) GTEST_SKIP() << "needs busybox (scripts/setup installs it)";
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  const fs::path bin = busybox_awk_bin(t.path());
  std::ofstream(t.path() / "snmp") << "Ip: Forwarding DefaultTTL\nIp: 1 64\n"
                                      "Tcp: RtoAlgorithm ActiveOpens OutSegs RetransSegs InErrs\n"
                                      "Tcp: 1 7 123456 42 0\n";
  std::ofstream(t.path() / "netstat") << "TcpExt: SyncookiesSent TCPSpuriousRTOs TCPLossProbes TCPTimeouts\n"
                                         "TcpExt: 0 1 9 3\n"
                                         "IpExt: InNoRoutes\nIpExt: 0\n";
  std::ofstream(t.path() / "dev")
      << "Inter-|   Receive                                                |  Transmit\n"
         " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
         "    lo:    1000      10    0    7    0     0          0         0     1000      10    0    8    0     0       0          0\n"
         "  eth0: 5000000    4000    0    5    0     0          0         0  6000000    4500    0    6    0     0       0          0\n";
  const fs::path fn = cut_functions(t.path(), "counters.sh", {"net_counters"});
  ASSERT_FALSE(fn.empty()) << "rootfs-init.sh has no net_counters()";
  const auto r = sh("PATH=" + bin.string() + ":$PATH busybox sh -c " +
                        quote(". " + fn.string() + "; net_counters " + t.path().string()),
                    t.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "RetransSegs=42 TCPSpuriousRTOs=1 TCPLossProbes=9 TCPTimeouts=3 eth0_rx_drop=5 eth0_tx_drop=6");
  EXPECT_EQ(r.err, "");
}

TEST(Image, TheGuestSaysWhatItsIperf3SenderSawEachSecond) {
  // rootfs-init.sh's tcp_detail (xpv.tcp_detail=1), run by busybox sh and awk against iperf3 3.12
  // --json logs in its layout (tab-indented, one key a line): per interval the stream's snd_cwnd
  // (bytes, said in KiB), rtt, rttvar and retransmits, in order; the interval's "sum" (which
  // repeats retransmits) and the "end" section (which repeats everything) add nothing. A log of
  // an end that only received is "receiver".
  if (sh("command -v busybox", "/tmp").rc != 0) GTEST_SKIP() << "needs busybox (scripts/setup installs it)";
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  const fs::path bin = busybox_awk_bin(t.path());
  auto interval = [](int end, int retr, long cwnd, int rtt, int rttvar) {
    return fmt::format(
        "\t\t\"streams\":\t[{{\n\t\t\t\t\"socket\":\t5,\n\t\t\t\t\"end\":\t{}.000773,\n"
        "\t\t\t\t\"bits_per_second\":\t4.5e+08,\n\t\t\t\t\"retransmits\":\t{},\n\t\t\t\t\"snd_cwnd\":\t{},\n"
        "\t\t\t\t\"snd_wnd\":\t3145728,\n\t\t\t\t\"rtt\":\t{},\n\t\t\t\t\"rttvar\":\t{},\n"
        "\t\t\t\t\"sender\":\ttrue\n\t\t\t}}],\n\t\t\"sum\":\t{{\n\t\t\t\"end\":\t{}.000773,\n"
        "\t\t\t\"retransmits\":\t{}\n\t\t}}\n",
        end, retr, cwnd, rtt, rttvar, end, retr);
  };
  std::ofstream(t.path() / "sender.json")
      << "{\n\t\"start\":\t{\n\t\t\"version\":\t\"iperf 3.12\"\n\t},\n\t\"intervals\":\t[{\n"
      << interval(1, 0, 102400, 1800, 400) << "\t}, {\n"
      << interval(2, 3, 51200, 2500, 900) << "\t}],\n\t\"end\":\t{\n\t\t\"streams\":\t[{\n"
      << "\t\t\t\"sender\":\t{\n\t\t\t\t\"retransmits\":\t3,\n\t\t\t\t\"max_snd_cwnd\":\t102400,\n"
         "\t\t\t\t\"snd_cwnd\":\t7,\n\t\t\t\t\"rtt\":\t9\n\t\t\t}\n\t\t}]\n\t}\n}\n";
  std::ofstream(t.path() / "receiver.json")
      << "{\n\t\"intervals\":\t[{\n\t\t\"streams\":\t[{\n\t\t\t\t\"bytes\":\t5,\n\t\t\t\t\"sender\":\tfalse\n"
         "\t\t\t}]\n\t}],\n\t\"end\":\t{\n\t\t\"snd_cwnd\":\t1\n\t}\n}\n";
  const fs::path fn = cut_functions(t.path(), "tcp.sh", {"tcp_detail"});
  ASSERT_FALSE(fn.empty()) << "rootfs-init.sh has no tcp_detail()";
  auto run = [&](const std::string& file) {
    return sh("PATH=" + bin.string() + ":$PATH busybox sh -c " + quote(". " + fn.string() + "; tcp_detail " + file),
              t.path());
  };
  const auto s = run((t.path() / "sender.json").string());
  ASSERT_EQ(s.rc, 0) << s.err;
  EXPECT_EQ(s.out, "cwnd_kib=100,50 rtt_us=1800,2500 rttvar_us=400,900 retr=0,3");
  const auto r = run((t.path() / "receiver.json").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "receiver");
}

TEST(Image, TheGuestSaysWhereItsCpuTimeAndNicInterruptsWentBetweenTwoSnapshots) {
  // rootfs-init.sh's load_delta, run by busybox sh and awk against two made-up copies of
  // /proc/stat and /proc/interrupts: each vCPU's share of its own time (user+nice, system, irq,
  // softirq, idle+iowait, steal: rounded percent of that vCPU's delta, not of the machine's), then
  // each NIC queue interrupt's delta per vCPU, netfront's and virtio-net's names only, in the
  // order of the later file; an interrupt that appeared only later counts from 0.
  if (sh("command -v busybox", "/tmp").rc != 0) GTEST_SKIP() << "needs busybox (scripts/setup installs it)";
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  const fs::path bin = busybox_awk_bin(t.path());
  //                                           user nice system idle iowait irq softirq steal guest guest_nice
  std::ofstream(t.path() / "stat0") << "cpu  300 0 300 300 0 0 0 0 0 0\n"
                                       "cpu0 100 0 200 100 0 10 50 0 0 0\n"
                                       "cpu1 200 0 100 200 0 0 0 0 0 0\n"
                                       "intr 12345 0 0\nctxt 999\n";
  std::ofstream(t.path() / "stat1") << "cpu  900 0 900 900 0 0 0 0 0 0\n"
                                       "cpu0 110 10 230 100 0 20 130 0 0 0\n"    // usr +20 sys +30 irq +10 si +80: of 140
                                       "cpu1 300 50 150 250 50 0 0 100 0 0\n"    // usr +150 sys +50 idle +100 steal +100: of 400
                                       "intr 22345 0 0\nctxt 1999\n";
  std::ofstream(t.path() / "intr0") << "           CPU0       CPU1       \n"
                                       "  1:          9          0   IO-APIC   1-edge      i8042\n"
                                       " 38:        100          0  xen-dyn    -edge      vif0-q0-tx\n"
                                       " 39:       1000          5  xen-dyn    -edge      vif0-q0-rx\n"
                                       " 41:          0         20  xen-dyn    -edge      blkif\n"
                                       "NMI:          0          0   Non-maskable interrupts\n";
  std::ofstream(t.path() / "intr1") << "           CPU0       CPU1       \n"
                                       "  1:         19          0   IO-APIC   1-edge      i8042\n"
                                       " 38:        150          0  xen-dyn    -edge      vif0-q0-tx\n"
                                       " 39:       3000          5  xen-dyn    -edge      vif0-q0-rx\n"
                                       " 40:          0        700  xen-dyn    -edge      vif0-q1-rx\n"
                                       " 41:          0        900  xen-dyn    -edge      blkif\n"
                                       " 42:          1          2  PCI-MSI 1-edge      virtio1-input.0\n"
                                       "NMI:          3          3   Non-maskable interrupts\n";
  const fs::path fn = cut_functions(t.path(), "load.sh", {"load_delta"});
  ASSERT_FALSE(fn.empty()) << "rootfs-init.sh has no load_delta()";
  auto p = [&](const char* f) { return (t.path() / f).string(); };
  const auto r = sh("PATH=" + bin.string() + ":$PATH busybox sh -c " +
                        quote(". " + fn.string() + "; load_delta " + p("stat0") + " " + p("intr0") + " " + p("stat1") + " " + p("intr1")),
                    t.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out,
            "cpu0=usr:14,sys:21,irq:7,si:57,idle:0,steal:0 cpu1=usr:38,sys:13,irq:0,si:0,idle:25,steal:25 "
            "vif0-q0-tx=50/0 vif0-q0-rx=2000/0 vif0-q1-rx=0/700 virtio1-input.0=1/2");
  EXPECT_EQ(r.err, "");
}

TEST(Image, TheGuestSaysWhereItsBalloonIs) {
  // rootfs-init.sh's mem_state, run by busybox sh and awk against a made-up xen_memory sysfs
  // directory and meminfo: MemTotal and the balloon's current and target size; a balloon still
  // moving is waited for (bounded, here 1 s) and reported as it is then; no balloon is "none".
  if (sh("command -v busybox", "/tmp").rc != 0) GTEST_SKIP() << "needs busybox (scripts/setup installs it)";
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  const fs::path bin = busybox_awk_bin(t.path());
  const fs::path b = t.path() / "xen_memory0";
  fs::create_directories(b / "info");
  std::ofstream(t.path() / "meminfo") << "MemTotal:         246012 kB\nMemFree:          100000 kB\n";
  std::ofstream(b / "target_kb") << "262000\n";
  std::ofstream(b / "info" / "current_kb") << "262000\n";
  const fs::path fn = cut_functions(t.path(), "mem.sh", {"mem_state"});
  ASSERT_FALSE(fn.empty()) << "rootfs-init.sh has no mem_state()";
  auto run = [&](const fs::path& dir) {
    return sh("PATH=" + bin.string() + ":$PATH busybox sh -c " +
                  quote(". " + fn.string() + "; mem_state " + dir.string() + " " + (t.path() / "meminfo").string() + " 1"),
              t.path());
  };
  auto r = run(b);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "mem_kib=246012 balloon_current_kib=262000 balloon_target_kib=262000\n");
  std::ofstream(b / "info" / "current_kb") << "300000\n";
  r = run(b);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "mem_kib=246012 balloon_current_kib=300000 balloon_target_kib=262000\n");
  r = run(t.path() / "nothing");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "mem_kib=246012 balloon=none\n");

  // With the target the host announced (xpv.mem_target_mib), a balloon that is settled but not
  // yet told is waited for too: here each `sleep` (a shell function standing in for busybox's)
  // is when the host's lower target arrives and the balloon reaches it.
  std::ofstream(b / "info" / "current_kb") << "262000\n";
  const std::string arrive = "sleep() { echo 131072 > " + (b / "target_kb").string() + "; echo 131072 > " +
                             (b / "info" / "current_kb").string() + "; echo s >> " + (t.path() / "sleeps").string() +
                             "; }; ";
  auto run_want = [&](const std::string& want) {
    return sh("PATH=" + bin.string() + ":$PATH busybox sh -c " +
                  quote(". " + fn.string() + "; " + arrive + "mem_state " + b.string() + " " +
                        (t.path() / "meminfo").string() + " 5 " + want),
              t.path());
  };
  r = run_want("262144");  // already at or below it: no wait
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "mem_kib=246012 balloon_current_kib=262000 balloon_target_kib=262000\n");
  EXPECT_FALSE(fs::exists(t.path() / "sleeps"));
  r = run_want("131072");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "mem_kib=246012 balloon_current_kib=131072 balloon_target_kib=131072\n");
  std::ifstream in(t.path() / "sleeps");
  const std::string sleeps((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(sleeps, "s\n") << "one wait, ended when the target came";
}

TEST(Image, TheGuestCountsItsSpuriousAndPutOffEventChannelEoisPerInterrupt) {
  // rootfs-init.sh's eoi_counts (xpv.eoi_trace=1), run by busybox sh and awk against a made-up
  // tracefs: the kprobe's hist (keys irq and flags, in hitcount order) summed per irq with the
  // spurious ones (flags 1) apart, each irq named by its action in the interrupts file and its
  // number (two queues of one device share the name), and the put-off EOI worker's total hits.
  if (sh("command -v busybox", "/tmp").rc != 0) GTEST_SKIP() << "needs busybox (scripts/setup installs it)";
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  const fs::path bin = busybox_awk_bin(t.path());
  const fs::path ev = t.path() / "tracing" / "events" / "xpv";
  fs::create_directories(ev / "eoi");
  fs::create_directories(ev / "eoiw");
  std::ofstream(ev / "eoi" / "hist") << "# event histogram\n#\n"
                                        "# trigger info: hist:keys=irq,flags:vals=hitcount:sort=hitcount:size=2048 [active]\n#\n\n"
                                        "{ irq:         26, flags:          0 } hitcount:        800\n"
                                        "{ irq:         26, flags:          1 } hitcount:        120\n"
                                        "{ irq:         25, flags:          1 } hitcount:         40\n"
                                        "{ irq:         25, flags:          0 } hitcount:          7\n"
                                        "{ irq:         31, flags:          0 } hitcount:          3\n"
                                        "\nTotals:\n    Hits: 970\n    Entries: 5\n    Dropped: 0\n";
  std::ofstream(ev / "eoiw" / "hist") << "# event histogram\n#\n\n{ common_cpu:          0 } hitcount:         12\n"
                                         "{ common_cpu:          1 } hitcount:          5\n\nTotals:\n    Hits: 17\n"
                                         "    Entries: 2\n    Dropped: 0\n";
  std::ofstream(t.path() / "interrupts")
      << "           CPU0       CPU1\n"
         "  1:          9          0   IO-APIC   1-edge      i8042\n"
         " 25:        900          0  xen-dyn-lateeoi    vif0-q0-tx\n"
         " 26:       1500          0  xen-dyn-lateeoi    vif0-q0-rx\n"
         "NMI:          0          0   Non-maskable interrupts\n";
  const fs::path fn = cut_functions(t.path(), "eoi.sh", {"eoi_counts"});
  ASSERT_FALSE(fn.empty()) << "rootfs-init.sh has no eoi_counts()";
  auto run = [&](const fs::path& tracing) {
    return sh("PATH=" + bin.string() + ":$PATH busybox sh -c " +
                  quote(". " + fn.string() + "; eoi_counts " + tracing.string() + " " + (t.path() / "interrupts").string()),
              t.path());
  };
  const auto r = run(t.path() / "tracing");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "vif0-q0-rx/26_eoi=920 vif0-q0-rx/26_spurious=120 vif0-q0-tx/25_eoi=47 vif0-q0-tx/25_spurious=40 "
                   "irq/31_eoi=3 irq/31_spurious=0 delayed=17");
  EXPECT_EQ(r.err, "");

  fs::remove_all(ev / "eoiw");  // no worker probe: no put-off EOIs counted
  const auto w = run(t.path() / "tracing");
  ASSERT_EQ(w.rc, 0) << w.err;
  EXPECT_EQ(w.out, "vif0-q0-rx/26_eoi=920 vif0-q0-rx/26_spurious=120 vif0-q0-tx/25_eoi=47 vif0-q0-tx/25_spurious=40 "
                   "irq/31_eoi=3 irq/31_spurious=0 delayed=0");

  const auto off = run(t.path() / "none");  // not tracing: nothing at all
  ASSERT_EQ(off.rc, 0) << off.err;
  EXPECT_EQ(off.out, "");
}

TEST(Image, TheGuestServesTwoIperf3ProcessesAtOnceForEachPair) {
  // rootfs-init.sh's serve_pairs (xpv.pairs=N), run by busybox sh in a network namespace of its own
  // (loopback only) with the host's iperf3: both servers listen before the marker, two clients at
  // once (5201 and 5202 -R) are served by two processes, the pair is reported with both exit
  // statuses; a deadline that passes with no client kills both servers and finishes 124.
  if (geteuid() != 0) GTEST_SKIP() << "needs root (unshare -n)";
  if (sh("command -v iperf3 && command -v busybox && command -v unshare", "/tmp").rc != 0) {
    GTEST_SKIP() << "needs iperf3, busybox and unshare (scripts/setup installs them)";
  }
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  const fs::path bin = t.path() / "bin";
  fs::create_directories(bin);
  // busybox's awk too: load_delta runs with it in the image.
  for (const char* applet : {"netstat", "usleep", "awk"}) fs::create_symlink("/usr/bin/busybox", bin / applet);
  const fs::path fn =
      cut_functions(t.path(), "funcs.sh", {"wait_listen", "wait_until", "load_delta", "load_mark", "load_since", "serve_pairs"});
  ASSERT_FALSE(fn.empty()) << "rootfs-init.sh lacks wait_listen(), wait_until(), load_*() or serve_pairs()";
  const std::string dir = t.path().string();
  // say/finish/fatal as the image has them, writing to a file; `finish` ends the serving shell.
  const std::string prelude = "export PATH=" + bin.string() + ":$PATH LOGDIR=" + dir + "; busybox ip link set lo up; " +
                              "say() { echo \"$*\" >> " + dir + "/markers; }; finish() { say \"FINISH $1\"; exit \"$1\"; }; " +
                              "fatal() { say \"XPV-FATAL $*\"; finish 1; }; . " + fn.string() + "; ";
  auto markers = [&] { return slurp(t.path() / "markers"); };

  const std::string served =
      prelude + "(serve_pairs 1 $(( $(date +%s) + 60 )); say RETURNED) & srv=$!; i=0; "
                "while [ $i -lt 100 ] && ! grep -q 'pair=1' " + dir + "/markers 2>/dev/null; do usleep 100000; i=$((i+1)); done; "
                "iperf3 -J -c 127.0.0.1 -p 5201 -t 1 > " + dir + "/up.json 2>&1 & a=$!; "
                "iperf3 -J -c 127.0.0.1 -p 5202 -t 1 -R > " + dir + "/down.json 2>&1 & b=$!; "
                "wait $a; wait $b; wait $srv";
  const auto r = sh("timeout 60 unshare -n busybox sh -c " + quote(served), t.path());
  ASSERT_EQ(r.rc, 0) << r.err << markers();
  // After the pair, where this machine's CPUs spent the time (load_delta's own test has the format).
  EXPECT_TRUE(std::regex_match(markers(), std::regex("XPV-IPERF3-LISTENING 5201\\+5202 pair=1\nXPV-IPERF3-SERVED pair 1 rc=0,0\n"
                                                     "XPV-LOAD pair=1 cpu0=usr:[0-9]+,sys:[0-9]+,irq:[0-9]+,si:[0-9]+,idle:[0-9]+,steal:[0-9]+( .*)?\n"
                                                     "RETURNED\n")))
      << markers();
  for (const char* f : {"up.json", "down.json"}) {
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(slurp(t.path() / f))) << f << ": " << slurp(t.path() / f);
    ASSERT_FALSE(j.contains("error")) << f << ": " << j.dump();
    EXPECT_GT(j.at("end").at("sum_received").at("bits_per_second").get<double>(), 0) << f;
  }
  const auto up = nlohmann::json::parse(slurp(t.path() / "up.json"));
  const auto down = nlohmann::json::parse(slurp(t.path() / "down.json"));
  EXPECT_EQ(up.at("start").at("connecting_to").at("port").get<int>(), 5201);
  EXPECT_EQ(down.at("start").at("connecting_to").at("port").get<int>(), 5202);
  EXPECT_EQ(down.at("start").at("test_start").at("reverse").get<int>(), 1);

  // Nobody comes: the deadline ends both servers; finish 124 after the timeout marker.
  fs::remove(t.path() / "markers");
  const auto late = sh("timeout 60 unshare -n busybox sh -c " +
                           quote(prelude + "serve_pairs 2 $(( $(date +%s) + 2 )); say RETURNED"),
                       t.path());
  EXPECT_EQ(late.rc, 124) << late.err;
  EXPECT_EQ(markers(), "XPV-IPERF3-LISTENING 5201+5202 pair=1\nXPV-IPERF3-TIMEOUT after 0 pairs\nFINISH 124\n");
}

}  // namespace
