#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "xpv/toolstack/paths.h"
#include "xpv/toolstack/record.h"

#include "xpv/toolstack/error.h"
#include "xpv/toolstack/inventory.h"

namespace xpv::toolstack {
namespace {

std::vector<DomainSummary> sample() {
  DomainSummary a;
  a.domid = 1;
  a.name = "web1";
  a.type = "process";
  a.memory_mib = 128;
  a.vcpus = 1;
  a.state = "running";
  a.pid = 4242;
  DomainSummary b;
  b.domid = 12;
  b.name = "db";
  b.state = "unknown";
  b.memory_mib = 512;
  return {a, b};
}

std::string error_of(const std::vector<DomainSummary>& d, const std::string& which) {
  try {
    resolve_domain(d, which);
  } catch (const ToolstackError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Inventory, ResolveByNameAndId) {
  const auto d = sample();
  EXPECT_EQ(resolve_domain(d, "web1").domid, 1);
  EXPECT_EQ(resolve_domain(d, "12").name, "db");
  EXPECT_EQ(resolve_domain(d, "db").domid, 12);
}

TEST(Inventory, ResolveErrors) {
  const auto d = sample();
  EXPECT_EQ(error_of(d, "web9"), "no domain named 'web9'");
  EXPECT_EQ(error_of(d, "3"), "no domain with id 3");
  EXPECT_EQ(error_of(d, "0"), "Domain-0 is dom0 (the host): not a domain xpv manages");
  EXPECT_EQ(error_of(d, "Domain-0"), "Domain-0 is dom0 (the host): not a domain xpv manages");
  EXPECT_EQ(error_of(d, "01"), "no domain named '01'");
  EXPECT_EQ(error_of({}, "web1"), "no domain named 'web1'");
}

TEST(Inventory, Label) {
  EXPECT_EQ(domain_label(sample()[0]), "web1 (id 1)");
  DomainSummary anon;
  anon.domid = 5;
  EXPECT_EQ(domain_label(anon), "(unnamed) (id 5)");
}

TEST(Inventory, ListTable) {
  const std::string t = format_list(sample(), {2048, 4});
  const std::string want =
      "Name                       ID  Type        Mem VCPUs  State\n"
      "Domain-0                    0  dom0       2048     4  running\n"
      "web1                        1  process     128     1  running\n"
      "db                         12  -           512     -  unknown\n";
  EXPECT_EQ(t, want);
}

TEST(Inventory, ListJson) {
  const auto j = nlohmann::json::parse(format_list_json(sample(), {2048, 4}));
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["name"], "Domain-0");
  EXPECT_EQ(j[1]["domid"], 1);
  EXPECT_EQ(j[1]["type"], "process");
  EXPECT_EQ(j[1]["pid"], 4242);
  EXPECT_EQ(j[2]["state"], "unknown");
}

}  // namespace
}  // namespace xpv::toolstack

namespace xpv::toolstack {
namespace {

// `xpv list` of an HVM guest that ballooned shows what it holds (xpv-vmm's RUN/dom<N>/memory, in
// KiB), as xl list does; a process domain, a file that does not parse or that claims more than
// the domain was created with keep the memory of its record.
TEST(Inventory, AnHvmGuestThatBalloonedShowsWhatItHolds) {
  char tmpl[] = "/tmp/xpv-inventory-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string run = tmpl;
  Paths p;
  p.run_dir = run;
  auto add = [&](std::uint16_t id, const std::string& type, const char* memory) {
    DomainRecord r;
    r.domid = id;
    r.name = "d" + std::to_string(id);
    r.type = type;
    r.memory_mib = 512;
    std::filesystem::create_directories(p.domain_dir(id));
    write_record(p.domain_dir(id), r);
    if (memory != nullptr) std::ofstream(p.memory_file(id)) << memory;
  };
  add(1, "hvm", "262144\n");
  add(2, "hvm", nullptr);
  add(3, "process", "262144\n");
  add(4, "hvm", "26x\n");
  add(5, "hvm", "1048576\n");
  std::map<std::uint16_t, std::uint64_t> mib;
  for (const auto& d : gather_domains(p, nullptr)) mib[d.domid] = d.memory_mib;
  EXPECT_EQ(mib, (std::map<std::uint16_t, std::uint64_t>{{1, 256}, {2, 512}, {3, 512}, {4, 512}, {5, 512}}));
  std::filesystem::remove_all(run);
}

}  // namespace
}  // namespace xpv::toolstack
