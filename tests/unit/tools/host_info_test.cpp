#include "xpv/toolstack/host_info.h"

#include <gtest/gtest.h>

namespace xpv::toolstack {
namespace {

// Two sockets of 4 cores with 2 threads each (an excerpt: two of the 16 processors).
constexpr std::string_view kCpuinfo =
    "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2994.372\n"
    "physical id\t: 0\nsiblings\t: 8\ncore id\t\t: 0\ncpu cores\t: 4\nflags\t\t: fpu vme svm\n\n"
    "processor\t: 15\ncpu MHz\t\t: 1500.000\nphysical id\t: 1\nsiblings\t: 8\ncpu cores\t: 4\n\n";

TEST(HostInfo, CpuinfoGivesTheTopology) {
  const auto c = parse_cpuinfo(kCpuinfo);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->sockets, 2u);
  EXPECT_EQ(c->cores_per_socket, 4u);
  EXPECT_EQ(c->threads_per_core, 2u);
  EXPECT_DOUBLE_EQ(c->mhz, 2994.372) << "the first processor's";
  EXPECT_EQ(parse_cpuinfo(""), std::nullopt);
  EXPECT_EQ(parse_cpuinfo("processor\t: 0\ncpu cores\t: 0\nsiblings\t: 0\n"), std::nullopt) << "no cores: no topology";
  EXPECT_EQ(parse_cpuinfo("cpu cores\t: 4\nsiblings\t: 2\n"), std::nullopt) << "fewer siblings than cores";
  const auto one = parse_cpuinfo("cpu cores\t: 1\nsiblings\t: 1\n");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->sockets, 1u) << "no physical id (a VM's cpuinfo may have none): one socket";
}

TEST(HostInfo, MeminfoInMib) {
  const auto m = parse_meminfo("MemTotal:       24641988 kB\nMemFree:        23000000 kB\nMemAvailable:   23530844 kB\n");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->total_mib, 24064u);
  EXPECT_EQ(m->available_mib, 22979u);
  EXPECT_EQ(parse_meminfo("MemTotal: 1024 kB\n"), std::nullopt) << "no MemAvailable";
  EXPECT_EQ(parse_meminfo("MemTotal: x kB\nMemAvailable: 1 kB\n"), std::nullopt);
}

TEST(HostInfo, TheStartTimeIsField22CountedPastTheName) {
  const std::string line =
      "4242 (xpv-vmm) S 1 4242 4242 0 -1 4194560 2140 0 0 0 15 7 0 0 20 0 9 0 123456 1234567 890 "
      "18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n";
  EXPECT_EQ(process_start_ticks(line), 123456u);
  // A name with spaces and ')' (a process may call itself anything).
  EXPECT_EQ(process_start_ticks("7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 1 1 1\n"), 99u);
  EXPECT_EQ(process_start_ticks("7 (short) R 1 2 3\n"), std::nullopt);
  EXPECT_EQ(process_start_ticks("no parenthesis"), std::nullopt);
}

TEST(HostInfo, UptimeAsXlPrintsIt) {
  EXPECT_EQ(format_uptime(5), " 0:00:05");
  EXPECT_EQ(format_uptime(2 * 3600 + 3 * 60 + 4), " 2:03:04");
  EXPECT_EQ(format_uptime(86400), "1 day,  0:00:00");
  EXPECT_EQ(format_uptime(3 * 86400 + 12 * 3600 + 1), "3 days, 12:00:01");
  EXPECT_EQ(format_uptime_table({{"Domain-0", 0, 90061}, {"web1", 3, 59}}),
            "Name                                ID Uptime\n"
            "Domain-0                             0 1 day,  1:01:01\n"
            "web1                                 3  0:00:59\n");
}

TEST(HostInfo, InfoLinesArePaddedAsXlInfos) {
  EXPECT_EQ(format_info({{"host", "h1"}, {"xen_commandline", "quiet"}}),
            "host                   : h1\n"
            "xen_commandline        : quiet\n");
}

}  // namespace
}  // namespace xpv::toolstack
