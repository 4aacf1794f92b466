// `xpv bench hvm` in parts across L1 sessions (tools/bench/hvm_parts.h) and the bench's JSON
// written and read back (results_json.cpp): which part another session measures, which run of a
// part is reported.
#include "bench/hvm_parts.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "xpv/test/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using xpv::bench::Result;
using xpv::test::TempDir;
using xpv::bench::hvm::another_session;
using xpv::bench::hvm::best_run;
using xpv::bench::hvm::check_rows;
using xpv::bench::hvm::join_parts;
using xpv::bench::hvm::missing_figures;
using xpv::bench::hvm::parse_parts;
using xpv::bench::hvm::Part;
using xpv::bench::hvm::part_file;
using xpv::bench::hvm::part_metrics;
using xpv::bench::hvm::part_wanted;
using xpv::bench::hvm::PartRun;

// A part's rows with every figure present: xpv = base + i, reference 1.
std::vector<Result> measured(Part p, double base) {
  auto rows = part_metrics(p);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    rows[i].xpv = base + static_cast<double>(i);
    rows[i].reference = 1.0;
  }
  return rows;
}

TEST(BenchHvmParts, PartsAreNamedOnceEachAndKeptInTheBenchsOrder) {
  EXPECT_EQ(parse_parts("net,disk"), (std::vector<Part>{Part::net, Part::disk}));
  EXPECT_EQ(parse_parts("disk,net"), (std::vector<Part>{Part::net, Part::disk}));
  EXPECT_EQ(parse_parts("disk"), (std::vector<Part>{Part::disk}));
  EXPECT_EQ(join_parts(parse_parts("disk,net")), "net,disk");
  EXPECT_EQ(join_parts({Part::disk}), "disk");
  EXPECT_THROW(parse_parts(""), std::invalid_argument);
  EXPECT_THROW(parse_parts("net,net"), std::invalid_argument);
  EXPECT_THROW(parse_parts("net,"), std::invalid_argument);
  try {
    parse_parts("net,cpu");
    FAIL() << "an unknown part was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'cpu'"), std::string::npos) << e.what();
  }
}

TEST(BenchHvmParts, APartsRowsMustBeItsMetricsInOrder) {
  EXPECT_NO_THROW(check_rows(Part::net, measured(Part::net, 1)));
  EXPECT_NO_THROW(check_rows(Part::disk, measured(Part::disk, 1)));
  EXPECT_THROW(check_rows(Part::net, measured(Part::disk, 1)), std::logic_error);
  auto swapped = measured(Part::disk, 1);
  std::swap(swapped[1], swapped[2]);
  EXPECT_THROW(check_rows(Part::disk, swapped), std::logic_error);
  auto flipped = measured(Part::disk, 1);
  flipped[0].lower_is_better = false;  // bonnie++'s run time: lower is better
  EXPECT_THROW(check_rows(Part::disk, flipped), std::logic_error);
  auto shorter = measured(Part::net, 1);
  shorter.pop_back();
  EXPECT_THROW(check_rows(Part::net, shorter), std::logic_error);
}

TEST(BenchHvmParts, APartWithoutARunOrWithAMissingFigureIsWantedAgain) {
  std::vector<PartRun> runs;
  EXPECT_TRUE(part_wanted(runs));
  EXPECT_EQ(best_run(runs), nullptr);

  auto no_reference = measured(Part::net, 1);
  no_reference[0].reference.reset();  // QEMU's host->guest lost
  runs.push_back({1, no_reference});
  EXPECT_EQ(missing_figures(runs[0].rows), 1);
  EXPECT_TRUE(part_wanted(runs));

  auto no_xpv = measured(Part::net, 1);
  no_xpv[3].xpv = std::nan("");
  EXPECT_EQ(missing_figures(no_xpv), 1);
  auto nan_reference = measured(Part::net, 1);
  nan_reference[4].reference = std::nan("");
  EXPECT_EQ(missing_figures(nan_reference), 1);

  runs.push_back({2, measured(Part::net, 5)});
  EXPECT_FALSE(part_wanted(runs));
  ASSERT_NE(best_run(runs), nullptr);
  EXPECT_EQ(best_run(runs)->session, 2);
}

TEST(BenchHvmParts, TheRunWithFewestMissingFiguresIsReportedAndTheEarliestAmongEquals) {
  auto two_missing = measured(Part::disk, 1);
  two_missing[1].reference.reset();
  two_missing[2].xpv = std::nan("");
  auto one_missing = measured(Part::disk, 2);
  one_missing[3].reference.reset();
  auto one_missing_later = measured(Part::disk, 3);
  one_missing_later[0].xpv = std::nan("");

  std::vector<PartRun> runs = {{1, two_missing}, {2, one_missing}, {3, one_missing_later}};
  ASSERT_NE(best_run(runs), nullptr);
  EXPECT_EQ(best_run(runs)->session, 2);
  EXPECT_TRUE(part_wanted(runs));  // the best still misses a figure

  // A later run that is worse does not replace a better one.
  runs = {{1, measured(Part::disk, 1)}, {2, two_missing}};
  EXPECT_EQ(best_run(runs)->session, 1);
  EXPECT_FALSE(part_wanted(runs));
}

TEST(BenchHvmParts, EachSessionsPartHasAFileOfItsOwn) {
  EXPECT_EQ(part_file(Part::net, 1), "net-session-1.json");
  EXPECT_EQ(part_file(Part::disk, 3), "disk-session-3.json");
}

TEST(BenchHvmParts, AnotherSessionOnlyForAWantedPartAfterANormalEndOrALostL1) {
  const std::vector<PartRun> done = {{1, measured(Part::net, 1)}};
  auto lacking = measured(Part::disk, 1);
  lacking[0].reference.reset();
  const std::vector<std::vector<PartRun>> both_done = {done, {{1, measured(Part::disk, 1)}}};
  const std::vector<std::vector<PartRun>> disk_lost = {done, {}};
  const std::vector<std::vector<PartRun>> disk_lacking = {done, {{1, lacking}}};
  const std::vector<std::vector<PartRun>> nothing = {{}, {}};

  // Nothing wanted: never, whatever the exit.
  for (int rc : {0, 124, 125}) EXPECT_FALSE(another_session(both_done, rc, 1, 10, 3, 2700)) << rc;
  // A part wanted, after a normal end or a lost L1 (124 timeout/silence/lockup, 125 reset).
  for (int rc : {0, 124, 125}) {
    EXPECT_TRUE(another_session(disk_lost, rc, 1, 10, 3, 2700)) << rc;
    EXPECT_TRUE(another_session(disk_lacking, rc, 1, 10, 3, 2700)) << rc;
    EXPECT_TRUE(another_session(nothing, rc, 2, 10, 3, 2700)) << rc;
  }
  // The run's own error, or a signal: no.
  for (int rc : {1, 2, 126, 127, 130, 143}) EXPECT_FALSE(another_session(nothing, rc, 1, 10, 3, 2700)) << rc;
  // The bounds: sessions and the window in which one may start.
  EXPECT_FALSE(another_session(nothing, 125, 3, 10, 3, 2700));
  EXPECT_TRUE(another_session(nothing, 125, 2, 2699, 3, 2700));
  EXPECT_FALSE(another_session(nothing, 125, 2, 2700, 3, 2700));
}

TEST(BenchHvmParts, ResultsComeBackFromTheirJsonAsWritten) {
  TempDir dir;
  auto rows = measured(Part::net, 0.5);
  rows[1].reference.reset();
  rows[1].note = "QEMU: iperf3 -R: the client has terminated";
  rows[2].xpv = std::nan("");
  const std::string file = (dir.path() / "net-session-2.json").string();
  ASSERT_TRUE(xpv::bench::write_json(file, "hvm", rows));

  const auto back = xpv::bench::read_json(file);
  ASSERT_EQ(back.size(), rows.size());
  EXPECT_NO_THROW(check_rows(Part::net, back));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(rows[i].metric);
    EXPECT_EQ(back[i].metric, rows[i].metric);
    EXPECT_EQ(back[i].unit, rows[i].unit);
    EXPECT_EQ(back[i].lower_is_better, rows[i].lower_is_better);
    EXPECT_EQ(back[i].note, rows[i].note);
    EXPECT_EQ(back[i].reference, rows[i].reference);
    if (std::isfinite(rows[i].xpv)) {
      EXPECT_DOUBLE_EQ(back[i].xpv, rows[i].xpv);
    } else {
      EXPECT_TRUE(std::isnan(back[i].xpv));
    }
  }
  EXPECT_EQ(missing_figures(back), 2);
}

TEST(BenchHvmParts, AFileThatIsNotResultsIsRefusedNamingIt) {
  TempDir dir;
  const fs::path cut = dir.path() / "disk-session-1.json";
  std::ofstream(cut) << "{\"suite\": \"hvm\", \"results\": [{\"metric\": \"bonnie++ run (host clock)\", \"un";
  try {
    (void)xpv::bench::read_json(cut.string());
    FAIL() << "a cut file was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(cut.string()), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)xpv::bench::read_json((dir.path() / "absent.json").string()), std::runtime_error);
}

}  // namespace
