// The xenstore nodes the toolstack writes, held against docs/PROCESS-DOMAINS.md line by line.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "xpv/config/device_specs.h"
#include "xpv/toolstack/nodes.h"

namespace xpv::toolstack {
namespace {

using xenbus::kPermNone;
using xenbus::kPermRead;
using xenbus::PermList;

const PermList kDom0OwnedFor3 = {{0, kPermNone}, {3, kPermRead}};  // n0 r3
const PermList kDom3Owned = {{3, kPermNone}, {0, kPermRead}};      // n3 r0

TEST(Nodes, Paths) {
  EXPECT_EQ(domain_path(3), "/local/domain/3");
  EXPECT_EQ(backend_path(DeviceKind::vbd, 3, 51712), "/local/domain/0/backend/vbd/3/51712");
  EXPECT_EQ(frontend_path(DeviceKind::vbd, 3, 51712), "/local/domain/3/device/vbd/51712");
  EXPECT_EQ(backend_path(DeviceKind::vif, 3, 1), "/local/domain/0/backend/vif/3/1");
  EXPECT_EQ(frontend_path(DeviceKind::vif, 3, 1), "/local/domain/3/device/vif/1");
  EXPECT_EQ(backend_dir(DeviceKind::vbd, 7), "/local/domain/0/backend/vbd/7");
  EXPECT_EQ(frontend_dir(DeviceKind::vif, 7), "/local/domain/7/device/vif");
}

TEST(Nodes, DomainExactly) {
  const auto n = domain_nodes({3, "web1", 128, "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"});
  const NodeList want = {
      {"/local/domain/3", "", {{3, kPermNone}}},
      // libxl's layout: control/ is dom0's (the guest reads it), the nodes in it the guest's.
      {"/local/domain/3/control", "", kDom0OwnedFor3},
      {"/local/domain/3/control/shutdown", "", {{3, kPermNone}}},
      {"/local/domain/3/control/feature-poweroff", "", {{3, kPermNone}}},
      {"/local/domain/3/control/feature-reboot", "", {{3, kPermNone}}},
      {"/local/domain/3/control/feature-suspend", "", {{3, kPermNone}}},
      {"/local/domain/3/control/sysrq", "", {{3, kPermNone}}},
      {"/local/domain/3/data", "", {{3, kPermNone}}},
      {"/local/domain/3/drivers", "", {{3, kPermNone}}},
      {"/local/domain/3/feature", "", {{3, kPermNone}}},
      {"/local/domain/3/attr", "", {{3, kPermNone}}},
      {"/local/domain/3/error", "", {{3, kPermNone}}},
      {"/local/domain/3/name", "web1", kDom0OwnedFor3},
      {"/local/domain/3/domid", "3", kDom0OwnedFor3},
      {"/local/domain/3/vm", "/vm/0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", kDom0OwnedFor3},
      {"/local/domain/3/memory", "", kDom0OwnedFor3},
      {"/local/domain/3/memory/target", "131072", kDom0OwnedFor3},  // KiB
      {"/local/domain/3/memory/static-max", "131072", kDom0OwnedFor3},
      {"/vm/0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", "", kDom0OwnedFor3},
      {"/vm/0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9/name", "web1", kDom0OwnedFor3},
      {"/vm/0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9/uuid", "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", kDom0OwnedFor3},
  };
  EXPECT_EQ(n, want);
}

// An HVM guest with maxmem: the target is its memory, the balloon's ceiling maxmem (KiB).
TEST(Nodes, MaxmemIsStaticMax) {
  const auto n = domain_nodes({3, "g", 384, "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", 1024});
  std::map<std::string, std::string> v;
  for (const auto& node : n) v[node.path] = node.value;
  EXPECT_EQ(v["/local/domain/3/memory/target"], "393216");
  EXPECT_EQ(v["/local/domain/3/memory/static-max"], "1048576");
}

TEST(Nodes, Dom0Skeleton) {
  const PermList n0 = {{0, kPermNone}};
  const NodeList want = {
      {"/local", "", n0},
      {"/local/domain", "", n0},
      {"/local/domain/0", "", n0},
      {"/local/domain/0/name", "Domain-0", n0},
      {"/local/domain/0/domid", "0", n0},
      {"/local/domain/0/backend", "", n0},
      {"/local/domain/0/backend/vbd", "", n0},
      {"/local/domain/0/backend/vif", "", n0},
      {"/vm", "", n0},
  };
  EXPECT_EQ(dom0_nodes(), want);
}

TEST(Nodes, VbdExactly) {
  const auto disk = config::parse_disk_spec("format=raw, vdev=xvda, access=rw, target=/srv/a,b.img");
  const auto n = vbd_nodes(3, disk);
  const std::string be = "/local/domain/0/backend/vbd/3/51712";
  const std::string fe = "/local/domain/3/device/vbd/51712";
  const NodeList want = {
      {be, "", kDom0OwnedFor3},
      {be + "/frontend", fe, kDom0OwnedFor3},
      {be + "/frontend-id", "3", kDom0OwnedFor3},
      {be + "/online", "1", kDom0OwnedFor3},
      {be + "/removable", "0", kDom0OwnedFor3},
      {be + "/bootable", "1", kDom0OwnedFor3},
      {be + "/state", "1", kDom0OwnedFor3},
      {be + "/dev", "xvda", kDom0OwnedFor3},
      {be + "/type", "xpv", kDom0OwnedFor3},
      {be + "/mode", "w", kDom0OwnedFor3},
      {be + "/device-type", "disk", kDom0OwnedFor3},
      {be + "/params", "/srv/a,b.img", kDom0OwnedFor3},
      {be + "/discard-enable", "1", kDom0OwnedFor3},
      {fe, "", kDom3Owned},
      {fe + "/backend", be, kDom3Owned},
      {fe + "/backend-id", "0", kDom3Owned},
      {fe + "/state", "1", kDom3Owned},
      {fe + "/virtual-device", "51712", kDom3Owned},
      {fe + "/device-type", "disk", kDom3Owned},
  };
  EXPECT_EQ(n, want);
}

TEST(Nodes, VbdReadOnlyAndSecondDisk) {
  const auto n = vbd_nodes(9, config::parse_disk_spec("/img/b.raw,raw,xvdb,ro"));
  ASSERT_EQ(n.size(), 19u);
  EXPECT_EQ(n[0].path, "/local/domain/0/backend/vbd/9/51728");
  EXPECT_EQ(n[7], (Node{"/local/domain/0/backend/vbd/9/51728/dev", "xvdb", {{0, kPermNone}, {9, kPermRead}}}));
  EXPECT_EQ(n[9].value, "r");
  EXPECT_EQ(n[17], (Node{"/local/domain/9/device/vbd/51728/virtual-device", "51728", {{9, kPermNone}, {0, kPermRead}}}));
}

TEST(Nodes, VifMinimal) {
  const auto spec = config::parse_vif_spec("mac=00:16:3e:01:02:03");
  const auto n = vif_nodes(3, 0, spec, *spec.mac);
  const std::string be = "/local/domain/0/backend/vif/3/0";
  const std::string fe = "/local/domain/3/device/vif/0";
  const NodeList want = {
      {be, "", kDom0OwnedFor3},
      {be + "/frontend", fe, kDom0OwnedFor3},
      {be + "/frontend-id", "3", kDom0OwnedFor3},
      {be + "/online", "1", kDom0OwnedFor3},
      {be + "/state", "1", kDom0OwnedFor3},
      {be + "/handle", "0", kDom0OwnedFor3},
      {be + "/mac", "00:16:3e:01:02:03", kDom0OwnedFor3},
      {fe, "", kDom3Owned},
      {fe + "/backend", be, kDom3Owned},
      {fe + "/backend-id", "0", kDom3Owned},
      {fe + "/state", "1", kDom3Owned},
      {fe + "/handle", "0", kDom3Owned},
      {fe + "/mac", "00:16:3e:01:02:03", kDom3Owned},
  };
  EXPECT_EQ(n, want);
}

TEST(Nodes, VifOptionalNodes) {
  const auto spec = config::parse_vif_spec("ip=10.1.2.3/24, rate=8Mb/s@20ms, bridge=xenbr0, mtu=9000, queues=1");
  config::Mac mac;
  mac.bytes = {0x00, 0x16, 0x3e, 0xaa, 0xbb, 0xcc};
  const auto n = vif_nodes(4, 2, spec, mac);
  ASSERT_EQ(n.size(), 18u);
  const std::string be = "/local/domain/0/backend/vif/4/2";
  EXPECT_EQ(n[5], (Node{be + "/handle", "2", {{0, kPermNone}, {4, kPermRead}}}));
  EXPECT_EQ(n[6].value, "00:16:3e:aa:bb:cc");
  EXPECT_EQ(n[7], (Node{be + "/bridge", "xenbr0", {{0, kPermNone}, {4, kPermRead}}}));
  EXPECT_EQ(n[8], (Node{be + "/rate", "20000,20000", {{0, kPermNone}, {4, kPermRead}}}));  // 1 MB/s × 20 ms
  EXPECT_EQ(n[9], (Node{be + "/ip", "10.1.2.3/24", {{0, kPermNone}, {4, kPermRead}}}));
  EXPECT_EQ(n[10], (Node{be + "/mtu", "9000", {{0, kPermNone}, {4, kPermRead}}}));
  EXPECT_EQ(n[11], (Node{be + "/queues", "1", {{0, kPermNone}, {4, kPermRead}}}));
  EXPECT_EQ(n[12].path, "/local/domain/4/device/vif/2");
  EXPECT_EQ(n[17], (Node{"/local/domain/4/device/vif/2/mac", "00:16:3e:aa:bb:cc", {{4, kPermNone}, {0, kPermRead}}}));
}

TEST(Nodes, EveryDirectoryPrecedesItsChildren) {
  for (const NodeList& list : {domain_nodes({1, "a", 1, "u"}), vbd_nodes(1, config::parse_disk_spec("/x,raw,xvdc")),
                               vif_nodes(1, 0, config::VifSpec{}, config::Mac{{0, 0x16, 0x3e, 0, 0, 1}})}) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto& path = list[i].path;
      const auto parent = path.substr(0, path.rfind('/'));
      for (std::size_t j = i + 1; j < list.size(); ++j) EXPECT_NE(list[j].path, parent) << path;
    }
  }
}

}  // namespace
}  // namespace xpv::toolstack
