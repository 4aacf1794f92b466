#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "xpv/config/domain_config.h"
#include "xpv/config/error.h"

namespace xpv::config {
namespace {

std::string error_of(std::string_view text, bool check_files = false) {
  try {
    parse_domain_config(text, "vm.cfg", check_files);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(DomainConfig, ProcessDomainWithDevices) {
  auto c = parse_domain_config(
      "name = 'store1'\ntype = 'process'\nmemory = 64\n"
      "disk = [ 'format=raw, vdev=xvda, access=rw, target=/srv/a.img', '/srv/b.img,raw,xvdb,ro' ]\n"
      "vif = [ 'mac=00:16:3e:00:00:01, ip=10.0.0.2/24' ]\n",
      "vm.cfg", false);
  EXPECT_EQ(c.name, "store1");
  EXPECT_EQ(c.type, DomainType::process);
  EXPECT_EQ(c.memory_mib, 64u);
  ASSERT_EQ(c.disks.size(), 2u);
  EXPECT_EQ(c.disks[1].access, Access::ro);
  ASSERT_EQ(c.vifs.size(), 1u);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(DomainConfig, HvmDefaultsAndXlSpellings) {
  auto c = parse_domain_config(
      "name = 'g'\nbuilder = 'hvm'\nkernel = '/boot/vmlinuz'\nvcpus = 2\nvnc = 1\nupcall = 'intx'\n"
      "on_reboot = 'destroy'\n",
      "vm.cfg", false);
  EXPECT_EQ(c.type, DomainType::hvm);
  EXPECT_EQ(c.memory_mib, 512u);
  EXPECT_EQ(c.maxmem_mib, 512u);  // no maxmem: memory
  EXPECT_EQ(c.vcpus, 2u);
  EXPECT_EQ(c.upcall, Upcall::intx);
  EXPECT_EQ(c.on_reboot, LifecycleAction::destroy);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_EQ(c.warnings[0], "vm.cfg:5: 'vnc' has no meaning for xpv; ignored");
  for (const auto& [text, mode] : {std::pair{"vector", Upcall::vector}, std::pair{"callback", Upcall::callback},
                                   std::pair{"intx", Upcall::intx}}) {
    EXPECT_EQ(parse_domain_config(std::string("name = 'g'\ntype = 'hvm'\nkernel = '/k'\nupcall = '") + text + "'\n",
                                  "vm.cfg", false)
                  .upcall,
              mode)
        << text;
  }
}

// xl's maxmem: an HVM guest given more RAM than its memory target, which its balloon driver
// gives back at boot (and `xpv mem-set` may take again).
TEST(DomainConfig, MaxmemIsTheHvmGuestsCeiling) {
  const auto c = parse_domain_config("name = 'g'\ntype = 'hvm'\nkernel = '/k'\nmemory = 384\nmaxmem = 1024\n", "vm.cfg", false);
  EXPECT_EQ(c.memory_mib, 384u);
  EXPECT_EQ(c.maxmem_mib, 1024u);
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(parse_domain_config("name = 'g'\ntype = 'hvm'\nkernel = '/k'\nmaxmem = 512\n", "vm.cfg", false).maxmem_mib,
            512u);  // memory's default (512) = maxmem
  EXPECT_EQ(error_of("name = 'g'\ntype = 'hvm'\nkernel = '/k'\nmemory = 512\nmaxmem = 256\n"),
            "vm.cfg:5: 'maxmem': 256 MiB is below 'memory' (512 MiB)");
  EXPECT_EQ(error_of("name = 'a'\nmemory = 64\nmaxmem = 128\n"),
            "vm.cfg:3: 'maxmem': makes sense only for type = \"hvm\" (a process domain has no balloon driver)");
  EXPECT_EQ(error_of("name = 'g'\ntype = 'hvm'\nkernel = '/k'\nmaxmem = 0\n"), "vm.cfg:4: 'maxmem': 0 is out of range 1..1048576");
}

TEST(DomainConfig, ErrorsNameFileLineAndSetting) {
  EXPECT_EQ(error_of("type = 'process'\n"), "vm.cfg: 'name' is required");
  EXPECT_EQ(error_of("name = 'a b'\n"),
            "vm.cfg:1: 'name': 'a b' is not a valid domain name (1..64 of A-Z a-z 0-9 _ . -, not all digits)");
  EXPECT_EQ(error_of("name = '42'\n").substr(0, 18), "vm.cfg:1: 'name': ");
  EXPECT_EQ(error_of("name = 'a'\nmemory = 0\n"), "vm.cfg:2: 'memory': 0 is out of range 1..1048576");
  EXPECT_EQ(error_of("name = 'a'\nmemory = '512'\n"), "vm.cfg:2: 'memory': must be a number");
  EXPECT_EQ(error_of("name = 'a'\nvcpus = 129\n"), "vm.cfg:2: 'vcpus': 129 is out of range 1..128");
  EXPECT_EQ(error_of("name = 'a'\ntype = 'pv'\n"),
            "vm.cfg:2: 'type': 'pv' guests are not supported by xpv (use \"hvm\" or \"process\")");
  EXPECT_EQ(error_of("name = 'a'\ntype = 'hvm'\n"), "vm.cfg: an hvm domain needs 'kernel' (xpv boots Linux directly)");
  EXPECT_EQ(error_of("name = 'a'\nkernel = '/k'\n"), "vm.cfg:2: 'kernel': makes sense only for type = \"hvm\"");
  EXPECT_EQ(error_of("name = 'a'\nfrobnicate = 1\n"), "vm.cfg:2: 'frobnicate': unknown setting");
  EXPECT_EQ(error_of("name = 'a'\ndisk = 'x'\n"),
            "vm.cfg:2: 'disk': must be a list of quoted strings: [ '...', '...' ]");
  EXPECT_EQ(error_of("name = 'a'\ndisk = [ 'vdev=xvda' ]\n"),
            "vm.cfg:2: 'disk': item 0: disk spec 'vdev=xvda': no target (the image file or block device)");
  EXPECT_EQ(error_of("name = 'a'\ndisk = [ '/a,raw,xvda', '/b,raw,xvda' ]\n"), "vm.cfg:2: 'disk': disk xvda is given twice");
  EXPECT_EQ(error_of("name = 'a'\nvif = [ 'mac=00:16:3e:00:00:01', 'mac=00:16:3e:00:00:01' ]\n"),
            "vm.cfg:2: 'vif': MAC 00:16:3e:00:00:01 is given to two vifs");
  EXPECT_EQ(error_of("name = 'a'\nupcall = 'smoke'\n"), "vm.cfg:2: 'upcall': 'smoke' is not one of vector, callback, intx");
}

// xl's other names for a setting count as the setting: both in one file is a contradiction (xl
// refuses type + builder too), not last-one-wins. cmdline and extra both: as xl, cmdline wins and
// the file is told so.
TEST(DomainConfig, OtherNamesOfASettingAreNotASecondChance) {
  EXPECT_EQ(error_of("name = 'a'\ntype = 'process'\nbuilder = 'hvm'\n"),
            "vm.cfg:3: 'builder': is another name for 'type' (line 2): give one of them");
  EXPECT_EQ(parse_domain_config("name = 'g'\ntype = 'hvm'\nkernel = '/k'\ncmdline = 'quiet'\n", "vm.cfg", false).extra,
            "quiet");
  for (const auto& [text, warning] :
       {std::pair{"name = 'g'\ntype = 'hvm'\nkernel = '/k'\ncmdline = 'quiet'\nextra = 'loud'\n",
                  "vm.cfg:5: 'extra' ignored in favour of 'cmdline' (line 4), as xl does"},
        std::pair{"name = 'g'\ntype = 'hvm'\nkernel = '/k'\nextra = 'loud'\ncmdline = 'quiet'\n",
                  "vm.cfg:4: 'extra' ignored in favour of 'cmdline' (line 5), as xl does"}}) {
    const auto c = parse_domain_config(text, "vm.cfg", false);
    EXPECT_EQ(c.extra, "quiet") << text;
    EXPECT_EQ(c.warnings, std::vector<std::string>{warning}) << text;
  }
}

// What only an hvm guest's kernel reads is refused for a process domain, with its line, not
// dropped.
TEST(DomainConfig, HvmOnlySettingsAreRefusedForAProcessDomain) {
  EXPECT_EQ(error_of("name = 'a'\nextra = 'quiet'\n"), "vm.cfg:2: 'extra': makes sense only for type = \"hvm\"");
  EXPECT_EQ(error_of("name = 'a'\ncmdline = 'quiet'\n"), "vm.cfg:2: 'cmdline': makes sense only for type = \"hvm\"");
  EXPECT_EQ(error_of("name = 'a'\nupcall = 'intx'\ntype = 'process'\n"),
            "vm.cfg:2: 'upcall': makes sense only for type = \"hvm\"");
  EXPECT_EQ(error_of("name = 'a'\nramdisk = '/r'\n"), "vm.cfg:2: 'ramdisk': makes sense only for type = \"hvm\"");
  EXPECT_EQ(error_of("name = 'a'\nkernel = ''\nextra = ''\n"), "") << "an empty string says nothing";
}

// Files made for one test, removed with it.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/xpv-cfgdir-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name, std::size_t bytes) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary) << std::string(bytes, 'x');
    return p;
  }

 private:
  std::string path_;
};

// The checks xpv-blkback makes when it opens a target, made when the file is read: what it would
// refuse after the domain was created is refused before.
TEST(DomainConfig, DiskTargetsAreCheckedAsTheBackendWouldOpenThem) {
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  const std::string good = t.file("good.img", 4096), odd = t.file("odd.img", 1000), empty = t.file("empty.img", 0);
  auto disk = [](const std::string& target) { return "name = 'a'\ndisk = [ '" + target + ",raw,xvda' ]\n"; };
  EXPECT_EQ(error_of(disk(good), true), "");
  EXPECT_EQ(error_of(disk(odd), true), "vm.cfg:2: 'disk': disk xvda: '" + odd + "' is 1000 bytes, not a positive multiple of 512");
  EXPECT_EQ(error_of(disk(empty), true), "vm.cfg:2: 'disk': disk xvda: '" + empty + "' is 0 bytes, not a positive multiple of 512");
  EXPECT_EQ(error_of(disk(t.path()), true),
            "vm.cfg:2: 'disk': disk xvda: '" + t.path() + "' is not a regular file or block device");
  EXPECT_EQ(disk_target_problem("/dev/null"), "is not a regular file or block device");
  EXPECT_EQ(disk_target_problem(good), "");
  // One image to two disks, one of them writable: a writer would corrupt the other's view, two
  // writers the image; read-only twice is fine.
  const std::string two = "name = 'a'\ndisk = [ '" + good + ",raw,xvda', '" + t.path() + "/./good.img,raw,xvdb' ]\n";
  EXPECT_EQ(error_of(two, true), "vm.cfg:2: 'disk': disk xvdb: '" + t.path() + "/./good.img' is given to two disks, both writable");
  EXPECT_EQ(error_of("name = 'a'\ndisk = [ '" + good + ",raw,xvda,ro', '" + good + ",raw,xvdb,ro' ]\n", true), "");
  EXPECT_EQ(error_of("name = 'a'\ndisk = [ '" + good + ",raw,xvda,ro', '" + good + ",raw,xvdb' ]\n", true),
            "vm.cfg:2: 'disk': disk xvdb: '" + good + "' is given to two disks, one of them writable");
  EXPECT_EQ(error_of("name = 'a'\ndisk = [ '" + good + ",raw,xvda', '" + good + ",raw,xvdb,ro' ]\n", true),
            "vm.cfg:2: 'disk': disk xvdb: '" + good + "' is given to two disks, one of them writable");
  const std::string link = t.path() + "/link.img";  // the same file by another name
  ASSERT_EQ(::link(good.c_str(), link.c_str()), 0);
  EXPECT_EQ(error_of("name = 'a'\ndisk = [ '" + good + ",raw,xvda', '" + link + ",raw,xvdb' ]\n", true),
            "vm.cfg:2: 'disk': disk xvdb: '" + link + "' is given to two disks, both writable");
  EXPECT_EQ(error_of("name = 'a'\ntype = 'hvm'\nkernel = '" + t.path() + "'\n", true),
            "vm.cfg:3: 'kernel': '" + t.path() + "' is not a regular file");
}

// A relative path is the working directory's: made absolute when the files are checked, since
// the processes that open them (xpv-vmm, xpv-blkback, the monitor that restarts the domain) run
// elsewhere.
TEST(DomainConfig, RelativePathsBecomeAbsolute) {
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  t.file("d.img", 512);
  t.file("vmlinuz", 10);
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(t.path());
  DomainConfig c;
  std::string error;
  try {
    c = parse_domain_config("name = 'g'\ntype = 'hvm'\nkernel = 'vmlinuz'\ndisk = [ 'd.img,raw,xvda' ]\n", "vm.cfg", true);
  } catch (const ConfigError& e) {
    error = e.what();
  }
  std::filesystem::current_path(cwd);
  ASSERT_EQ(error, "");
  EXPECT_EQ(c.kernel, t.path() + "/vmlinuz");
  ASSERT_EQ(c.disks.size(), 1u);
  EXPECT_EQ(c.disks[0].target, t.path() + "/d.img");
  // Without the file check (syntax only) the paths stay as written.
  EXPECT_EQ(parse_domain_config("name = 'g'\ntype = 'hvm'\nkernel = 'vmlinuz'\n", "vm.cfg", false).kernel, "vmlinuz");
}

// Found by tests/fuzz/config: values quoted in a message keep it one line ("\n" in a string).
TEST(DomainConfig, CpusPlacesTheVcpusAsXlDoes) {
  const std::string hvm = "name = 'g'\ntype = 'hvm'\nkernel = '/k'\nvcpus = 3\n";
  auto canon = [](const DomainConfig& c) {
    std::string s;
    for (const auto& l : c.vcpu_affinity) s += (s.empty() ? "" : " | ") + (l.empty() ? std::string("-") : kvm::format_cpu_list(l));
    return s;
  };
  // One list: every vCPU; a list of lists: vCPU i gets item i, the rest are not placed.
  EXPECT_EQ(canon(parse_domain_config(hvm + "cpus = '0-3,5,^1'\n", "vm.cfg", false)), "0,2,3,5 | 0,2,3,5 | 0,2,3,5");
  EXPECT_EQ(canon(parse_domain_config("cpus = '1'\n" + hvm, "vm.cfg", false)), "1 | 1 | 1") << "vcpus given after cpus";
  EXPECT_EQ(canon(parse_domain_config(hvm + "cpus = ['3-4', '2-6,^4']\n", "vm.cfg", false)), "3,4 | 2,3,5,6");
  EXPECT_EQ(canon(parse_domain_config(hvm + "cpus = 2\n", "vm.cfg", false)), "2 | 2 | 2") << "a number, as xl takes it";
  EXPECT_EQ(canon(parse_domain_config(hvm, "vm.cfg", false)), "") << "no cpus: nothing placed";
  auto extra = parse_domain_config(hvm + "cpus = ['0', '1', '0', '1', '0']\n", "vm.cfg", false);
  EXPECT_EQ(canon(extra), "0 | 1 | 0");
  ASSERT_EQ(extra.warnings.size(), 1u);
  EXPECT_EQ(extra.warnings[0], "vm.cfg:5: 'cpus': 5 CPU lists for 3 vCPU(s); the last 2 ignored");
  // Soft affinity has no Linux counterpart: said, not applied.
  auto soft = parse_domain_config(hvm + "cpus_soft = '0'\n", "vm.cfg", false);
  ASSERT_EQ(soft.warnings.size(), 1u);
  EXPECT_EQ(soft.warnings[0], "vm.cfg:5: 'cpus_soft' has no meaning for xpv; ignored");

  EXPECT_EQ(error_of(hvm + "cpus = '3-1'\n"), "vm.cfg:5: 'cpus': '3-1': a range must not run downward");
  EXPECT_EQ(error_of(hvm + "cpus = ['0', 'nodes:1']\n"),
            "vm.cfg:5: 'cpus': item 1: 'nodes:1': NUMA node lists are not supported by xpv; name the CPUs");
  EXPECT_EQ(error_of(hvm + "cpus = []\n"), "vm.cfg:5: 'cpus': an empty list places no vCPU: leave 'cpus' out");
  EXPECT_EQ(error_of(hvm + "cpus = -2\n"), "vm.cfg:5: 'cpus': '-2': expected a CPU number, a range N-M, ^ to leave CPUs out, or all");
  EXPECT_EQ(error_of("name = 'p'\ncpus = '0'\n"),
            "vm.cfg:2: 'cpus': makes sense only for type = \"hvm\" (a process domain has no vCPU threads to place)");
}

TEST(DomainConfig, CpuWeightAndCapAsXlTakesThem) {
  const auto c = parse_domain_config("name = 'a'\ncpu_weight = 512\ncap = 150\n", "vm.cfg", false);
  EXPECT_EQ(c.cpu_weight, 512u);
  EXPECT_EQ(c.cap, 150u);
  EXPECT_TRUE(c.warnings.empty());
  const auto none = parse_domain_config("name = 'a'\n", "vm.cfg", false);
  EXPECT_EQ(none.cpu_weight, std::nullopt) << "not given: no cgroup is made";
  EXPECT_EQ(none.cap, std::nullopt);
  EXPECT_EQ(parse_domain_config("name = 'a'\ncap = 0\n", "vm.cfg", false).cap, 0u) << "0: no cap, but given";
  EXPECT_EQ(error_of("name = 'a'\ncpu_weight = 0\n"), "vm.cfg:2: 'cpu_weight': 0 is out of range 1..65535");
  EXPECT_EQ(error_of("name = 'a'\ncpu_weight = 65536\n"), "vm.cfg:2: 'cpu_weight': 65536 is out of range 1..65535");
  EXPECT_EQ(error_of("name = 'a'\ncap = -1\n"), "vm.cfg:2: 'cap': -1 is out of range 0..102400");
  EXPECT_EQ(error_of("name = 'a'\ncap = '50'\n"), "vm.cfg:2: 'cap': must be a number");
}

TEST(DomainConfig, CpusThisHostCannotGiveAreRefusedWithTheFiles) {
  // CPU 1023 (the last cpu_set_t holds) is on no host this runs on: with the host checks on, the
  // line is refused; a list that also names an allowed CPU passes (the kernel keeps what it can).
  const auto allowed = kvm::cpus_of_thread(0);
  ASSERT_TRUE(allowed);
  ASSERT_FALSE(allowed->cpus.test(kvm::kMaxCpus - 1)) << "a host with 1024 CPUs: pick another CPU for this test";
  const std::string hvm = "name = 'g'\ntype = 'hvm'\nkernel = '/proc/self/exe'\nvcpus = 2\n";
  EXPECT_EQ(error_of(hvm + "cpus = ['" + kvm::format_cpu_list(*allowed) + "', '1023']\n", true),
            "vm.cfg:5: 'cpus': vCPU 1: none of CPUs 1023 may be used by xpv here (it may use " +
                kvm::format_cpu_list(*allowed) + ")");
  EXPECT_EQ(error_of(hvm + "cpus = '1023'\n", true),
            "vm.cfg:5: 'cpus': none of CPUs 1023 may be used by xpv here (it may use " + kvm::format_cpu_list(*allowed) +
                ")") << "one list for every vCPU names none";
  EXPECT_EQ(error_of(hvm + "cpus = '1023'\n", false), "") << "without the host checks the syntax alone counts";
  EXPECT_EQ(error_of(hvm + "cpus = 'all'\n", true), "");
}

TEST(DomainConfig, ErrorsQuotingValuesStayOnOneLine) {
  EXPECT_EQ(error_of("name = 'a\\nb'\n"),
            "vm.cfg:1: 'name': 'a\\nb' is not a valid domain name (1..64 of A-Z a-z 0-9 _ . -, not all digits)");
  EXPECT_EQ(error_of("name = 'a'\ndisk = [ 'vdev=xvda\\n, target=/a' ]\n"),
            "vm.cfg:2: 'disk': item 0: disk spec 'vdev=xvda\\n, target=/a': "
            "'xvda\\n' is not a virtual disk name (xvda, xvdb1, hda, sdc, d0p1)");
  EXPECT_EQ(error_of("name = 'a'\nupcall = '\tx'\n"), "vm.cfg:2: 'upcall': '\\tx' is not one of vector, callback, intx");
}

TEST(DomainConfig, MissingFilesAreNamed) {
  EXPECT_EQ(error_of("name = 'a'\ndisk = [ '/nonexistent/x.img,raw,xvda' ]\n", true),
            "vm.cfg:2: 'disk': disk xvda: '/nonexistent/x.img' does not exist");
  EXPECT_EQ(error_of("name = 'a'\ntype = 'hvm'\nkernel = '/nonexistent/vmlinuz'\n", true),
            "vm.cfg:3: 'kernel': '/nonexistent/vmlinuz' does not exist");
}

TEST(DomainConfig, LoadFromFile) {
  char tmpl[] = "/tmp/xpv-cfg-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ::close(fd);
  {
    std::ofstream(tmpl) << "name = \"f\"\nmemory = 32\n";
  }
  auto c = load_domain_config(tmpl);
  EXPECT_EQ(c.name, "f");
  EXPECT_EQ(c.memory_mib, 32u);
  std::filesystem::remove(tmpl);
  try {
    load_domain_config(tmpl);
    FAIL() << "a missing file loaded";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), std::string(tmpl) + ": cannot read the configuration file: No such file or directory");
  }
}

// No more of a file than the limit is read (/dev/zero was read for ever); a directory, which
// reads as empty, is refused as such (it was reported as "'name' is required").
TEST(DomainConfig, LoadReadsABoundedFileAndNoDirectory) {
  auto load_error = [](const std::string& path) -> std::string {
    try {
      load_domain_config(path, false);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(load_error("/dev/zero"), "/dev/zero: larger than 1 MiB; not a domain configuration");
  EXPECT_EQ(load_error("/tmp"), "/tmp: a directory; not a domain configuration");
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  const std::string big = t.path() + "/big.cfg";
  {
    std::ofstream f(big);
    f << "name = 'a'\n" << std::string((1 << 20), '#');
  }
  EXPECT_EQ(load_error(big), big + ": larger than 1 MiB; not a domain configuration");
}

}  // namespace
}  // namespace xpv::config

namespace xpv::config {
namespace {

TEST(MemorySize, XlMemSetUnits) {
  EXPECT_EQ(parse_memory_kib("256"), 256u * 1024);  // MiB without a unit, as xl
  EXPECT_EQ(parse_memory_kib("256m"), 256u * 1024);
  EXPECT_EQ(parse_memory_kib("256M"), 256u * 1024);
  EXPECT_EQ(parse_memory_kib("2g"), 2u * 1024 * 1024);
  EXPECT_EQ(parse_memory_kib("1T"), std::uint64_t{1} << 30);
  EXPECT_EQ(parse_memory_kib("262144k"), 262144u);
  EXPECT_EQ(parse_memory_kib("1048576b"), 1024u);
  EXPECT_EQ(parse_memory_kib("0"), 0u);
  for (const char* bad : {"", "m", "-1", "+5", " 5", "5 ", "5mb", "5x", "1.5g", "0x10",
                          "99999999999999999999", "18014398509481984g"}) {
    EXPECT_EQ(parse_memory_kib(bad), std::nullopt) << bad;
  }
}

}  // namespace
}  // namespace xpv::config
