// `xpv top`'s pure parts (top.h) and the statistics files the backends publish for it
// (xpv/stats_file.h).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "xpv/stats_file.h"
#include "xpv/toolstack/top.h"

namespace xpv::toolstack {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TempDir {
  fs::path path;
  TempDir() {
    char t[] = "/tmp/xpv-top-test.XXXXXX";
    if (::mkdtemp(t) != nullptr) path = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TEST(StatsFile, FormatAndParseRoundTripAndJunkIsSkipped) {
  const std::string text = stats::format("vbd3.51712", "xpv-blkback", {{"rd_req", 12}, {"wr_sect", 18446744073709551615ull}});
  EXPECT_EQ(text, "# vbd3.51712 xpv-blkback pid " + std::to_string(::getpid()) +
                      "\nrd_req 12\nwr_sect 18446744073709551615\n");
  const auto c = stats::parse(text);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c.at("rd_req"), 12u);
  EXPECT_EQ(c.at("wr_sect"), 18446744073709551615ull);
  // What a reader does not understand it leaves out, and never fails on.
  const auto j = stats::parse("rd_req 1\n\nwr_req x\n noname 3\nf_req -1\nds_req 4 5\nbig 18446744073709551616\nlast 7");
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j.at("rd_req"), 1u);
  EXPECT_EQ(j.at("last"), 7u);
}

TEST(StatsFile, PublisherReplacesWholeFilesAndWithdrawsWhatWasNotPutAgain) {
  TempDir d;
  ASSERT_FALSE(d.path.empty());
  {
    stats::Publisher p(d.path.string(), "xpv-test");
    EXPECT_EQ(p.put("vbd1.51712", {{"rd_req", 1}}), 0);
    EXPECT_EQ(p.put("vbd2.51712", {{"rd_req", 2}}), 0);
    p.sweep();
    EXPECT_EQ(stats::parse(slurp(d.path / "vbd1.51712")).at("rd_req"), 1u);
    EXPECT_EQ(p.put("vbd1.51712", {{"rd_req", 5}}), 0);  // vbd2 disconnected: not put this round
    p.sweep();
    EXPECT_EQ(stats::parse(slurp(d.path / "vbd1.51712")).at("rd_req"), 5u);
    EXPECT_FALSE(fs::exists(d.path / "vbd2.51712"));
    // No temporary file is left behind.
    std::size_t files = 0;
    for (const auto& e : fs::directory_iterator(d.path)) files += e.path().filename() != "vbd1.51712" ? 100 : 1;
    EXPECT_EQ(files, 1u);
  }  // the daemon stops: its files go
  EXPECT_TRUE(fs::is_empty(d.path));
}

TEST(StatsFile, ADaemonStartingRemovesWhatAKilledOneLeftOfItsKind) {
  TempDir d;
  ASSERT_FALSE(d.path.empty());
  for (const char* f : {"vbd1.51712", "vbd1.51712.tmp", "vif1.0", "other"}) std::ofstream(d.path / f) << "rd_req 1\n";
  stats::Publisher p(d.path.string(), "xpv-blkback");
  p.remove_leftovers("vbd");
  EXPECT_FALSE(fs::exists(d.path / "vbd1.51712"));
  EXPECT_FALSE(fs::exists(d.path / "vbd1.51712.tmp"));
  EXPECT_TRUE(fs::exists(d.path / "vif1.0")) << "xpv-netback's";
  EXPECT_TRUE(fs::exists(d.path / "other"));
}

TEST(StatsFile, AFailureIsReportedOnceWithItsErrno) {
  stats::Publisher p("/nonexistent-xpv-dir/stats", "xpv-test");
  EXPECT_EQ(p.put("vbd1.51712", {{"rd_req", 1}}), ENOENT);
  EXPECT_EQ(p.put("vbd1.51712", {{"rd_req", 2}}), 0) << "said once, not every second";
  EXPECT_EQ(stats::publish("/nonexistent-xpv-dir/stats", "x", "y\n"), ENOENT);
}

TEST(Top, ProcStatCpuCountsFromTheLastParenthesis) {
  // utime 250 + stime 50 ticks at 100 per second; the command holds ") (" and spaces.
  const std::string stat =
      "4711 (xpv-front) (x y) S 1 4711 4711 0 -1 4194560 1234 0 0 0 250 50 0 0 20 0 9 0 100 0 0 18446744073709551615\n";
  ASSERT_TRUE(parse_proc_stat_cpu(stat, 100).has_value());
  EXPECT_DOUBLE_EQ(*parse_proc_stat_cpu(stat, 100), 3.0);
  EXPECT_FALSE(parse_proc_stat_cpu("4711 (cut) S 1 2", 100).has_value());
  EXPECT_FALSE(parse_proc_stat_cpu("no parenthesis at all", 100).has_value());
  EXPECT_FALSE(parse_proc_stat_cpu(stat, 0).has_value());
  // Our own process reads back as a number.
  EXPECT_TRUE(process_cpu_seconds(::getpid()).has_value());
  EXPECT_FALSE(process_cpu_seconds(0).has_value());
}

DomainSample running(std::uint16_t domid, const char* name, const char* type, pid_t pid) {
  DomainSample d;
  d.domid = domid;
  d.name = name;
  d.type = type;
  d.state = "running";
  d.pid = pid;
  return d;
}

TopSample sample(double t, double web1_cpu, std::uint64_t rd, pid_t blkback_pid, double blkback_cpu) {
  TopSample s;
  s.time_s = t;
  DomainSample d = running(1, "web1", "process", 4711);
  d.mem_kib = 65536;
  d.vcpus = 1;
  d.cpu_s = web1_cpu;
  d.vbds = {{"vbd1.51712", true, t - 0.5, {{"rd_req", rd}, {"wr_req", 3}, {"rd_sect", rd * 8}, {"wr_sect", 24}}},
            {"vbd1.51728", true, t - 0.5, {{"rd_req", 1}, {"wr_req", 0}, {"rd_sect", 8}, {"wr_sect", 0}}}};
  d.vifs = {{"vif1.0", true, t - 0.5, {{"tx_bytes", 4096}, {"rx_bytes", 10240}}}, {"vif1.1", false, 0, {}}};
  s.domains.push_back(d);
  // An HVM guest whose xpv-vmm publishes its counters (the time stands in for its growth).
  DomainSample h = running(2, "hvm2", "hvm", 4712);
  h.vmm = {"vmm2", true, t - 0.25,
           {{"exits", static_cast<std::uint64_t>(t * 1000)}, {"exit_io", 5}, {"upcalls", 9}, {"ballooned_pages", 7}}};
  s.domains.push_back(h);
  s.daemons = {{"xpv-blkback", blkback_pid, blkback_cpu}, {"xpv-netback", 0, std::nullopt}};
  return s;
}

TEST(Top, TheTableSumsEachDomainsDevicesAndMeasuresCpuOverTheInterval) {
  const TopSample a = sample(100.0, 10.0, 40, 77, 2.0);
  const TopSample b = sample(102.0, 11.0, 1040, 77, 2.5);
  const std::string t = format_top(a, b);
  // 1 s of CPU in 2 s: 50 %; disks summed (1041 reads, 3 writes); vifs 4 KiB out, 10 KiB in, and
  // the one not connected counts as a NIC with nothing on it.
  // No xpv-vmm counters for a process domain: "-" exits.
  EXPECT_NE(t.find("            web1    1 running         11   50.0      65536     1    2          4         10    2"
                   "      1041         3       8328         24         -\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("EXITS/s\n"), std::string::npos) << t;
  // 2000 exits between xpv-vmm's publications 2 s apart.
  EXPECT_NE(t.find("            hvm2    2 running          -      -          0     0    0          0          0    0"
                   "         0         0          0          0      1000\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("dom0 services: xpv-blkback 25.0% CPU, xpv-netback not running\n"), std::string::npos) << t;
  // A process that changed between the samples (a restarted daemon, a rebooted domain): no share.
  const TopSample c = sample(102.0, 0.5, 1040, 78, 0.1);
  const std::string u = format_top(a, c);
  EXPECT_NE(u.find("web1    1 running          0      -      65536"), std::string::npos) << u;  // its CPU went back
  EXPECT_NE(u.find("xpv-blkback -% CPU"), std::string::npos) << u;
}

TEST(Top, JsonGivesCountersAndRatesBetweenTheBackendsPublications) {
  const TopSample a = sample(100.0, 10.0, 40, 77, 2.0);
  TopSample b = sample(102.0, 11.0, 1040, 77, 2.5);
  const auto j = top_json(a, b);
  EXPECT_DOUBLE_EQ(j.at("interval_s").get<double>(), 2.0);
  const auto& d = j.at("domains").at(0);
  EXPECT_DOUBLE_EQ(d.at("cpu_pct").get<double>(), 50.0);
  const auto& v = d.at("vbds").at(0);
  EXPECT_EQ(v.at("counters").at("rd_req").get<std::uint64_t>(), 1040u);
  // 1000 reads between publications 2 s apart (the files' mtimes, not the samples' times).
  EXPECT_DOUBLE_EQ(v.at("per_second").at("rd_req").get<double>(), 500.0);
  EXPECT_DOUBLE_EQ(v.at("per_second").at("wr_req").get<double>(), 0.0);
  EXPECT_FALSE(d.at("vifs").at(1).at("published").get<bool>());
  EXPECT_TRUE(d.at("vifs").at(1).at("per_second").empty());
  // The backend has not published again since the previous sample: no rate rather than zero.
  b.domains[0].vbds[0].published_at = a.domains[0].vbds[0].published_at;
  EXPECT_TRUE(top_json(a, b).at("domains").at(0).at("vbds").at(0).at("per_second").empty());
  EXPECT_TRUE(j.at("dom0_services").at(1).at("cpu_pct").is_null());
  // xpv-vmm's counters, all of them, with their rates; a process domain has no xpv-vmm.
  EXPECT_TRUE(d.at("vmm").is_null()) << d.dump();
  const auto& vmm = j.at("domains").at(1).at("vmm");
  EXPECT_EQ(vmm.at("counters").at("upcalls").get<std::uint64_t>(), 9u);
  EXPECT_DOUBLE_EQ(vmm.at("per_second").at("exits").get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(vmm.at("per_second").at("exit_io").get<double>(), 0.0);
  EXPECT_FALSE(vmm.at("per_second").contains("ballooned_pages")) << "a level, not a count";
  // The domid now belongs to another xpv-vmm (the guest was restarted): its counters are not
  // subtracted from the old one's.
  TopSample restarted = b;
  restarted.domains[1].pid = 4713;
  EXPECT_TRUE(top_json(a, restarted).at("domains").at(1).at("vmm").at("per_second").empty());
  // Only one publication seen (xpv-vmm just started): no rate, and "-" in the table.
  TopSample fresh = a;
  fresh.domains[1].vmm.published = false;
  EXPECT_TRUE(top_json(fresh, b).at("domains").at(1).at("vmm").at("per_second").empty());
  const std::string t = format_top(fresh, b);
  EXPECT_NE(t.find("            hvm2    2 running          -      -          0     0    0          0          0    0"
                   "         0         0          0          0         -\n"),
            std::string::npos)
      << t;
}

}  // namespace
}  // namespace xpv::toolstack
