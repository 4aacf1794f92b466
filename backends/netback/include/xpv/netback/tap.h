// Tap — a Linux TAP interface as a packet port with virtio-net headers (the host side of a vif,
// `vif<N>.<dev>`, and the guest-side "NIC" of a process domain).
//
//   open /dev/net/tun ─► TUNSETIFF IFF_TAP|IFF_NO_PI|IFF_VNET_HDR[|IFF_MULTI_QUEUE] (one fd per
//   queue) ─► TUNSETVNETHDRSZ 10 ─► TUNSETOFFLOAD (what the reader of our packets can take) ─►
//   O_NONBLOCK
//
// Every frame read or written carries a 10-byte VnetHdr (offload.h) in front. The interface is not
// persistent: it disappears when the last fd closes (so a crash leaves nothing behind).
//
// Network namespace: a TAP belongs to the namespace of the thread that creates it. With `netns`
// set (a path such as /run/netns/NAME, or /proc/PID/ns/net) create() does all the ioctls on a
// short-lived thread that setns()'d into it: the caller's thread and namespace are untouched.
// set_link() does the same for MTU / MAC / up (SIOCSIF* on a socket in that namespace).
//
// Setup code: throws std::system_error naming the step. fd(q) is used by one data-plane thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "xpv/unique_fd.h"

namespace xpv::netback {

struct TapOffload {
  bool csum = false;  // TUN_F_CSUM: the reader accepts checksum-partial frames
  bool tso4 = false;  // TUN_F_TSO4 (needs csum)
  bool tso6 = false;  // TUN_F_TSO6 (needs csum)
};

struct TapConfig {
  std::string name;    // interface name (<= 15 characters)
  std::string netns;   // empty: the caller's namespace; else a netns file to create it in
  unsigned queues = 1; // > 1: IFF_MULTI_QUEUE, one fd per queue
  TapOffload offload;
};

struct Ipv4Address {
  std::uint32_t addr = 0;  // host byte order
  unsigned prefix = 24;
};

struct LinkSettings {
  std::optional<unsigned> mtu;
  std::optional<std::array<std::uint8_t, 6>> mac;
  bool up = true;
  std::optional<Ipv4Address> ipv4 = std::nullopt;  // the interface's (primary) IPv4 address and netmask
};

class Tap {
 public:
  static Tap create(const TapConfig& cfg);
  Tap() = default;
  Tap(Tap&&) noexcept = default;
  Tap& operator=(Tap&&) noexcept = default;

  const std::string& name() const noexcept { return name_; }
  const std::string& netns() const noexcept { return netns_; }
  unsigned queues() const noexcept { return static_cast<unsigned>(fds_.size()); }
  int fd(unsigned q = 0) const noexcept { return fds_.at(q).get(); }
  const TapOffload& offload() const noexcept { return offload_; }

  // TUNSETOFFLOAD again (after a renegotiation).
  void set_offload(const TapOffload& o);
  // MTU, MAC, IPv4 address and IFF_UP, in the TAP's namespace.
  void set_link(const LinkSettings& s) const;
  // The interface index in its namespace.
  int ifindex() const;
  // Makes the TAP a port of the bridge `bridge` (SIOCBRADDIF, in the TAP's namespace). The port
  // goes with the TAP. Throws std::runtime_error with bridge_problem()'s words (bridge.h) when
  // `bridge` is not a bridge there.
  void join_bridge(const std::string& bridge) const;

 private:
  std::string name_, netns_;
  std::vector<UniqueFd> fds_;
  TapOffload offload_;
};

// Runs `fn` on a temporary thread inside the network namespace `netns` (empty: inline). Rethrows.
void in_netns(const std::string& netns, const std::function<void()>& fn);

// Parses "00:16:3e:01:02:03"; nullopt if malformed.
std::optional<std::array<std::uint8_t, 6>> parse_mac(const std::string& s) noexcept;

}  // namespace xpv::netback
