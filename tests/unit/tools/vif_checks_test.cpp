#include <gtest/gtest.h>

#include "xpv/config/device_specs.h"
#include "xpv/config/error.h"
#include "xpv/netback/bridge.h"
#include "xpv/toolstack/error.h"
#include "xpv/toolstack/vif_checks.h"

namespace xpv::toolstack {
namespace {

std::string refusal(const config::VifSpec& v, const std::vector<ExistingVif>& vifs, const std::vector<HostAddress>& host) {
  try {
    check_new_vif("vif", v, vifs, host);
  } catch (const ToolstackError& e) {
    return e.what();
  }
  return "";
}

const std::vector<ExistingVif> kVifs = {
    {"web1 (id 1) vif 0", "00:16:3e:00:00:01", netback::vif_addresses("10.0.1.2/24"), ""},
    {"web2 (id 2) vif 0", "00:16:3e:00:00:02", std::nullopt, ""},
};
const std::vector<HostAddress> kHost = {{"lo", 0x7f000001, 8}, {"eth0", 0xc0a80105, 16}};  // 192.168.1.5/16

TEST(VifChecks, AFreeMacAndSubnetPass) {
  EXPECT_EQ(refusal(config::parse_vif_spec("mac=00:16:3e:00:00:03, ip=10.0.2.2/24"), kVifs, kHost), "");
  EXPECT_EQ(refusal(config::parse_vif_spec("ip=10.0.0.2/24"), kVifs, kHost), "");
  EXPECT_EQ(refusal(config::parse_vif_spec(""), kVifs, kHost), "") << "no MAC, no ip: nothing to clash";
}

TEST(VifChecks, AUsedMacIsRefused) {
  EXPECT_EQ(refusal(config::parse_vif_spec("mac=00:16:3e:00:00:02"), kVifs, kHost),
            "vif: MAC 00:16:3e:00:00:02 is already used by web2 (id 2) vif 0");
}

TEST(VifChecks, OverlappingSubnetsAreRefusedBothWays) {
  EXPECT_EQ(refusal(config::parse_vif_spec("ip=10.0.1.9/24"), kVifs, kHost),
            "vif: address 10.0.1.9/24 clashes with web1 (id 1) vif 0 (10.0.1.2/24): each vif needs a subnet of its own");
  // A wider subnet that contains web1's, and a narrower one inside it.
  EXPECT_NE(refusal(config::parse_vif_spec("ip=10.0.7.7/16"), kVifs, kHost), "");
  EXPECT_NE(refusal(config::parse_vif_spec("ip=10.0.1.130/25"), kVifs, kHost), "");
}

TEST(VifChecks, AnAddressOfTheHostsInterfacesIsRefused) {
  EXPECT_EQ(refusal(config::parse_vif_spec("ip=192.168.7.2/24"), kVifs, kHost),
            "vif: address 192.168.7.2/24 clashes with 192.168.1.5/16 on the host's interface eth0");
  EXPECT_NE(refusal(config::parse_vif_spec("ip=127.0.0.2/24"), kVifs, kHost), "");
}

// Bridge mode: a bridged vif shares its bridge's subnet with the host and other bridged vifs;
// only its address itself must be nobody's, and no routed vif's subnet may hold it.
TEST(VifChecks, ABridgedVifClashesOnlyByItsAddress) {
  const std::vector<ExistingVif> vifs = {
      {"web1 (id 1) vif 0", "00:16:3e:00:00:01", netback::vif_addresses("10.0.1.2/24"), ""},
      {"lan1 (id 3) vif 0", "00:16:3e:00:00:03", netback::vif_addresses("192.168.1.20/16"), "xenbr0"},
  };
  // The host's own address on the bridge (192.168.1.5/16) and another bridged vif in the subnet.
  EXPECT_EQ(refusal(config::parse_vif_spec("bridge=xenbr0, ip=192.168.1.21/16"), vifs, kHost), "");
  EXPECT_EQ(refusal(config::parse_vif_spec("bridge=xenbr0, ip=192.168.1.20/16"), vifs, kHost),
            "vif: address 192.168.1.20/16 is already lan1 (id 3) vif 0's (192.168.1.20/16)");
  EXPECT_EQ(refusal(config::parse_vif_spec("bridge=xenbr0, ip=192.168.1.5/16"), vifs, kHost),
            "vif: address 192.168.1.5/16 clashes with 192.168.1.5/16 on the host's interface eth0");
  // Inside a routed vif's subnet: the host routes that address to the routed vif's TAP.
  EXPECT_EQ(refusal(config::parse_vif_spec("bridge=xenbr0, ip=10.0.1.9/24"), vifs, kHost),
            "vif: address 10.0.1.9/24 clashes with web1 (id 1) vif 0 (10.0.1.2/24): a routed vif's subnet must not "
            "hold a bridged vif's address");
  // And the other way: a routed vif whose subnet holds a bridged vif's address.
  EXPECT_EQ(refusal(config::parse_vif_spec("ip=192.168.1.30/30"), {vifs[1]}, {}), "") << "192.168.1.28/30 misses .20";
  EXPECT_EQ(refusal(config::parse_vif_spec("ip=192.168.1.18/29"), {vifs[1]}, {}),
            "vif: address 192.168.1.18/29 clashes with lan1 (id 3) vif 0 (192.168.1.20/16): a routed vif's subnet must "
            "not hold a bridged vif's address");
  // Routed as before: the host's subnet on the bridge is taken.
  EXPECT_NE(refusal(config::parse_vif_spec("ip=192.168.1.21/16"), vifs, kHost), "");
}

TEST(VifChecks, TheHostSideIsNamedByItsAddressOrItsBridge) {
  EXPECT_EQ(vif_host_side(1, 0, config::parse_vif_spec("ip=10.0.1.7/24")), "host side vif1.0 10.0.1.1/24");
  EXPECT_EQ(vif_host_side(2, 3, config::parse_vif_spec("bridge=xenbr0, ip=10.0.1.7/24")), "host side vif2.3 in bridge xenbr0");
  EXPECT_EQ(vif_host_side(4, 1, config::parse_vif_spec("")), "host side vif4.1");
  EXPECT_THROW(config::parse_vif_spec("bridge="), config::ConfigError);
  EXPECT_NO_THROW(check_vif_bridge("vif", config::parse_vif_spec("ip=10.0.1.7/24"))) << "routed: no bridge to look for";
}

// What makes a vif bridged, for xpv-netback and the toolstack alike: a `bridge` node, unless its
// `script` node is vif-route (libxl writes a bridge beside every script).
TEST(VifChecks, AVifIsBridgedByItsBridgeNodeUnlessItsScriptRoutes) {
  using netback::vif_bridge;
  EXPECT_EQ(vif_bridge(std::string("br0"), std::nullopt), "br0");
  EXPECT_EQ(vif_bridge(std::string("br0"), std::string("vif-bridge")), "br0");
  EXPECT_EQ(vif_bridge(std::string("xenbr0"), std::string("/etc/xen/scripts/vif-route")), "");
  EXPECT_EQ(vif_bridge(std::string("xenbr0"), std::string("vif-route")), "");
  EXPECT_EQ(vif_bridge(std::string("br0"), std::string("my-vif-route")), "br0") << "by its whole name";
  EXPECT_EQ(vif_bridge(std::string(""), std::nullopt), "");
  EXPECT_EQ(vif_bridge(std::nullopt, std::string("vif-bridge")), "");
}

TEST(VifChecks, MtuIsParsedAndBounded) {
  EXPECT_EQ(config::parse_vif_spec("mtu=9000").mtu, 9000u);
  EXPECT_FALSE(config::parse_vif_spec("mac=00:16:3e:00:00:09").mtu.has_value());
  EXPECT_THROW(config::parse_vif_spec("mtu=67"), std::exception);
  EXPECT_THROW(config::parse_vif_spec("mtu=65536"), std::exception);
  EXPECT_THROW(config::parse_vif_spec("mtu=big"), std::exception);
}

}  // namespace
}  // namespace xpv::toolstack
