#include "xpv/toolstack/cpu_sched.h"

#include <gtest/gtest.h>

namespace xpv::toolstack {
namespace {

bool yes(const std::string&) { return true; }
bool no(const std::string&) { return false; }

// This machine's kind: v1 controllers each on its own mount, a cgroup2 mount without them.
constexpr std::string_view kV1Host =
    "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n"
    "30 22 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "31 30 0:27 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
    "32 30 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "33 30 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";
// Debian 12 with systemd: one cgroup2 mount.
constexpr std::string_view kV2Host =
    "25 22 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";

TEST(CpuSched, TheHierarchyIsWhereTheCpuControllerIs) {
  // v1 wins where it has the controller: it can be bound to one hierarchy only.
  EXPECT_EQ(find_cpu_hierarchy(kV1Host, yes), (CpuHierarchy{CgroupVersion::v1, "/sys/fs/cgroup/cpu"}));
  EXPECT_EQ(find_cpu_hierarchy(kV2Host, yes), (CpuHierarchy{CgroupVersion::v2, "/sys/fs/cgroup"}));
  EXPECT_EQ(find_cpu_hierarchy(kV2Host, no), std::nullopt) << "cgroup2 whose controllers lack cpu";
  EXPECT_EQ(find_cpu_hierarchy("", yes), std::nullopt);
  // cpu co-mounted with cpuacct (the usual v1 layout), not cpuacct or cpuset alone.
  EXPECT_EQ(find_cpu_hierarchy("40 30 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n", no),
            (CpuHierarchy{CgroupVersion::v1, "/sys/fs/cgroup/cpu,cpuacct"}));
  EXPECT_EQ(find_cpu_hierarchy("40 30 0:30 / /c rw - cgroup cgroup rw,cpuacct\n41 30 0:31 / /s rw - cgroup cgroup rw,cpuset\n", no),
            std::nullopt);
  // Optional fields before the separator, and a path with a space (mountinfo writes \\040).
  EXPECT_EQ(find_cpu_hierarchy("40 30 0:30 / /my\\040cgroups rw shared:3 master:1 - cgroup x rw,cpu\n", no),
            (CpuHierarchy{CgroupVersion::v1, "/my cgroups"}));
  // Lines that are not mountinfo's are skipped, not misread (the separator is looked for past the
  // six fixed fields).
  EXPECT_EQ(find_cpu_hierarchy("garbage\n - cgroup\n1 2 3 4 /x - cgroup\n1 2 3 / /x - cgroup c rw,cpu\n", yes),
            std::nullopt);
  // A bind mount of a subtree (root field not "/") is not the hierarchy.
  EXPECT_EQ(find_cpu_hierarchy("40 30 0:30 /lxc/c1 /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", no), std::nullopt);
  EXPECT_EQ(find_cpu_hierarchy("25 22 0:22 /sub /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", yes), std::nullopt);
}

TEST(CpuSched, SettingsAsTheFilesTakeThem) {
  EXPECT_EQ(v1_shares(256), 1024u) << "xl's default is the cgroup's default";
  EXPECT_EQ(v1_shares(1), 4u);
  EXPECT_EQ(v1_shares(65535), 262140u);
  EXPECT_EQ(weight_from_v1_shares(2048), 512u);
  EXPECT_EQ(weight_from_v1_shares(2), 1u) << "below what xpv writes: the least weight";
  EXPECT_EQ(v2_weight(256), 100u);
  EXPECT_EQ(v2_weight(512), 200u);
  EXPECT_EQ(v2_weight(1), 1u);
  EXPECT_EQ(v2_weight(65535), 10000u) << "v2's ceiling";
  EXPECT_EQ(v2_weight(300), 117u);
  EXPECT_EQ(v1_quota(0), "-1");
  EXPECT_EQ(v1_quota(50), "50000");
  EXPECT_EQ(v1_quota(250), "250000");
  EXPECT_EQ(v2_max(0), "max 100000");
  EXPECT_EQ(v2_max(150), "150000 100000");
  EXPECT_EQ(cpu_sched_problem({256, 0}), "");
  EXPECT_EQ(cpu_sched_problem({0, 0}), "weight 0 is out of range 1..65535");
  EXPECT_EQ(cpu_sched_problem({65536, 0}), "weight 65536 is out of range 1..65535");
  EXPECT_EQ(cpu_sched_problem({1, 102401}), "cap 102401 is out of range 0..102400 (% of one CPU)");
}

TEST(CpuSched, OnlyACgroupUnderTheXpvParentIsEverTakenFromARecord) {
  const CpuHierarchy h{CgroupVersion::v1, "/sys/fs/cgroup/cpu"};
  const auto ok = DomainCgroup::at(h, "/sys/fs/cgroup/cpu/xpv/0f1e2d3c");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->path(), "/sys/fs/cgroup/cpu/xpv/0f1e2d3c");
  for (const char* bad : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu/xpv", "/sys/fs/cgroup/cpu/xpv/", "/sys/fs/cgroup/cpu/xpv/..",
                          "/sys/fs/cgroup/cpu/xpv/a/b", "/sys/fs/cgroup/cpu/other/a", "/sys/fs/cgroup/memory/xpv/a"}) {
    EXPECT_FALSE(DomainCgroup::at(h, bad)) << bad;
  }
}

TEST(CpuSched, AProcessCgroupLineForEachVersion) {
  const std::string v1 = "12:memory:/m\n4:cpu,cpuacct:/xpv/ab\n3:cpuset:/\n0::/init.scope\n";
  EXPECT_EQ(cgroup_of(v1, CgroupVersion::v1), "/xpv/ab");
  EXPECT_EQ(cgroup_of(v1, CgroupVersion::v2), "/init.scope");
  EXPECT_EQ(cgroup_of("0::/xpv/a:b\n", CgroupVersion::v2), "/xpv/a:b") << "a ':' in the path is the path's";
  EXPECT_EQ(cgroup_of("3:cpuacct:/x\n", CgroupVersion::v1), std::nullopt) << "cpuacct is not cpu";
  EXPECT_EQ(cgroup_of("", CgroupVersion::v2), std::nullopt);
}

TEST(CpuSched, TheTableHasXlsColumnsAndTheCgroup) {
  EXPECT_EQ(format_sched_credit({{"web1", 1, {512, 50}, "/sys/fs/cgroup/xpv/u1"}, {"db", 12, {}, ""}}),
            "Name                                ID Weight   Cap  Cgroup\n"
            "web1                                 1    512    50  /sys/fs/cgroup/xpv/u1\n"
            "db                                  12      -     -  -\n");
}

}  // namespace
}  // namespace xpv::toolstack
