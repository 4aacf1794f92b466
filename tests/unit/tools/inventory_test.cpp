#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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
