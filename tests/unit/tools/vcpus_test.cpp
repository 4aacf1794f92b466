// vcpus.h: a /proc task stat line read, and xl vcpu-list's table.
#include <gtest/gtest.h>

#include "xpv/toolstack/vcpus.h"

namespace xpv::toolstack {
namespace {

// A real line's shape (Linux 6.1, a vCPU thread of xpv-vmm), fields 3.. after the name.
const std::string kLine =
    "4242 (vcpu0) S 4200 4200 4100 0 -1 4194368 1000 0 0 0 1234 567 0 0 20 0 5 0 500 2000000000 3000 "
    "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 -1 3 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

TEST(Vcpus, ReadsStateTimeAndLastCpu) {
  const auto t = read_task_stat(kLine);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->state, 'S');
  EXPECT_EQ(t->ticks, 1234u + 567u);
  EXPECT_EQ(t->cpu, 3);
  // A name with spaces and parentheses: the fields are counted from the last ')'.
  std::string odd = kLine;
  odd.replace(odd.find("(vcpu0)"), 7, "(a) R (b))");
  const auto o = read_task_stat(odd);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->state, 'S');
  EXPECT_EQ(o->cpu, 3);
  EXPECT_FALSE(read_task_stat("4242 (vcpu0) S 1 2 3\n")) << "a line cut short";
  EXPECT_FALSE(read_task_stat("no parenthesis at all"));
  std::string bad = kLine;
  bad.replace(bad.find(" 1234 "), 6, " 12x4 ");
  EXPECT_FALSE(read_task_stat(bad)) << "a field that is not a number";
}

TEST(Vcpus, TableAsXlVcpuList) {
  std::vector<VcpuRow> rows(4);
  rows[0] = {"web1", 3, 0, 4242, TaskStat{'R', 0, 1}, 12.34, false, "1"};
  rows[1] = {"web1", 3, 1, 4243, TaskStat{'S', 0, 0}, 0.5, false, "0-3,5"};
  rows[2] = {"web1", 3, 2, 0, TaskStat{}, 0, false, ""};
  rows[3] = {"db", 4, 0, 4300, TaskStat{'S', 0, 2}, 1, true, "0-7"};
  EXPECT_EQ(format_vcpu_list(rows),
            "Name                                ID  VCPU   CPU State   Time(s)  Affinity (Hard / Soft)\n"
            "web1                                 3     0     1   r--      12.3  1 / all\n"
            "web1                                 3     1     0   -b-       0.5  0-3,5 / all\n"
            "web1                                 3     2     -   ---         -  - / all\n"
            "db                                   4     0     2   --p       1.0  0-7 / all\n");
}

}  // namespace
}  // namespace xpv::toolstack
