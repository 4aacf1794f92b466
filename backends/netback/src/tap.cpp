#include "xpv/netback/tap.h"

#include <fcntl.h>
#include <linux/if.h>
#include <linux/sockios.h>
#include <linux/if_tun.h>
#include <net/if_arp.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "xpv/netback/bridge.h"
#include "xpv/netback/offload.h"

namespace xpv::netback {

namespace {
[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

unsigned offload_bits(const TapOffload& o) {
  unsigned f = 0;
  if (o.csum) f |= TUN_F_CSUM;
  if (o.csum && o.tso4) f |= TUN_F_TSO4;
  if (o.csum && o.tso6) f |= TUN_F_TSO6;
  if (o.csum && (o.tso4 || o.tso6)) f |= TUN_F_TSO_ECN;
  return f;
}

ifreq named(const std::string& name) {
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, name.data(), std::min(name.size(), std::size_t{IFNAMSIZ - 1}));
  return ifr;
}
}  // namespace

void in_netns(const std::string& netns, const std::function<void()>& fn) {
  if (netns.empty()) {
    fn();
    return;
  }
  std::exception_ptr err;
  // A network namespace is per thread: enter it on a throwaway thread, never on the caller's.
  std::thread t([&] {
    try {
      UniqueFd ns(::open(netns.c_str(), O_RDONLY | O_CLOEXEC));
      if (!ns) throw_errno("open network namespace " + netns);
      if (::setns(ns.get(), CLONE_NEWNET) != 0) throw_errno("setns " + netns);
      fn();
    } catch (...) {
      err = std::current_exception();
    }
  });
  t.join();
  if (err) std::rethrow_exception(err);
}

Tap Tap::create(const TapConfig& cfg) {
  if (cfg.name.empty() || cfg.name.size() >= IFNAMSIZ) {
    throw std::invalid_argument("tap: interface name '" + cfg.name + "' is empty or too long");
  }
  if (cfg.queues == 0 || cfg.queues > 64) throw std::invalid_argument("tap: 1..64 queues");
  Tap tap;
  tap.name_ = cfg.name;
  tap.netns_ = cfg.netns;
  in_netns(cfg.netns, [&] {
    for (unsigned q = 0; q < cfg.queues; ++q) {
      UniqueFd fd(::open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK));
      if (!fd) throw_errno("tap " + cfg.name + ": open /dev/net/tun");
      ifreq ifr = named(cfg.name);
      ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
      if (cfg.queues > 1) ifr.ifr_flags |= IFF_MULTI_QUEUE;
      if (::ioctl(fd.get(), TUNSETIFF, &ifr) != 0) throw_errno("tap " + cfg.name + ": TUNSETIFF");
      int hdr = sizeof(VnetHdr);
      if (::ioctl(fd.get(), TUNSETVNETHDRSZ, &hdr) != 0) throw_errno("tap " + cfg.name + ": TUNSETVNETHDRSZ");
      tap.fds_.push_back(std::move(fd));
    }
  });
  tap.set_offload(cfg.offload);
  return tap;
}

void Tap::set_offload(const TapOffload& o) {
  for (auto& fd : fds_) {
    if (::ioctl(fd.get(), TUNSETOFFLOAD, static_cast<unsigned long>(offload_bits(o))) != 0) {
      throw_errno("tap " + name_ + ": TUNSETOFFLOAD");
    }
  }
  offload_ = o;
}

void Tap::set_link(const LinkSettings& s) const {
  in_netns(netns_, [&] {
    UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!sock) throw_errno("socket");
    if (s.mtu) {
      ifreq ifr = named(name_);
      ifr.ifr_mtu = static_cast<int>(*s.mtu);
      if (::ioctl(sock.get(), SIOCSIFMTU, &ifr) != 0) throw_errno("tap " + name_ + ": set MTU");
    }
    if (s.mac) {
      ifreq ifr = named(name_);
      ifr.ifr_hwaddr.sa_family = ARPHRD_ETHER;
      std::memcpy(ifr.ifr_hwaddr.sa_data, s.mac->data(), 6);
      if (::ioctl(sock.get(), SIOCSIFHWADDR, &ifr) != 0) throw_errno("tap " + name_ + ": set MAC");
    }
    if (s.ipv4) {
      auto set = [&](unsigned long req, std::uint32_t v, const char* what) {
        ifreq ifr = named(name_);
        sockaddr_in sin{};
        sin.sin_family = AF_INET;
        sin.sin_addr.s_addr = htonl(v);
        std::memcpy(&ifr.ifr_addr, &sin, sizeof sin);
        if (::ioctl(sock.get(), req, &ifr) != 0) throw_errno("tap " + name_ + ": " + what);
      };
      const std::uint32_t mask = s.ipv4->prefix == 0 ? 0 : ~0u << (32 - s.ipv4->prefix);
      set(SIOCSIFADDR, s.ipv4->addr, "set IPv4 address");
      set(SIOCSIFNETMASK, mask, "set netmask");
    }
    ifreq ifr = named(name_);
    if (::ioctl(sock.get(), SIOCGIFFLAGS, &ifr) != 0) throw_errno("tap " + name_ + ": get flags");
    if (s.up) ifr.ifr_flags |= IFF_UP;
    else ifr.ifr_flags &= ~IFF_UP;
    if (::ioctl(sock.get(), SIOCSIFFLAGS, &ifr) != 0) throw_errno("tap " + name_ + ": set flags");
  });
}

int Tap::ifindex() const {
  int index = 0;
  in_netns(netns_, [&] {
    UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!sock) throw_errno("socket");
    ifreq ifr = named(name_);
    if (::ioctl(sock.get(), SIOCGIFINDEX, &ifr) != 0) throw_errno("tap " + name_ + ": ifindex");
    index = ifr.ifr_ifindex;
  });
  return index;
}

void Tap::join_bridge(const std::string& bridge) const {
  in_netns(netns_, [&] {
    if (const std::string why = bridge_problem(bridge); !why.empty()) throw std::runtime_error(why);
    UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!sock) throw_errno("socket");
    ifreq ifr = named(name_);
    if (::ioctl(sock.get(), SIOCGIFINDEX, &ifr) != 0) throw_errno("tap " + name_ + ": ifindex");
    const int index = ifr.ifr_ifindex;
    ifr = named(bridge);
    ifr.ifr_ifindex = index;
    if (::ioctl(sock.get(), SIOCBRADDIF, &ifr) != 0) throw_errno("tap " + name_ + ": add to bridge " + bridge);
  });
}

std::optional<std::array<std::uint8_t, 6>> parse_mac(const std::string& s) noexcept {
  std::array<std::uint8_t, 6> mac{};
  if (s.size() != 17) return std::nullopt;
  for (int i = 0; i < 6; ++i) {
    if (i > 0 && s[i * 3 - 1] != ':') return std::nullopt;
    unsigned v = 0;
    for (int k = 0; k < 2; ++k) {
      const char c = s[i * 3 + k];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else return std::nullopt;
    }
    mac[i] = static_cast<std::uint8_t>(v);
  }
  return mac;
}

}  // namespace xpv::netback
