// VifConnection — the data plane of one connected vif: the host-side TAP `vif<N>.<devid>` (one
// fd per queue, IFF_VNET_HDR, offloads as the frontend negotiated), and for each queue the tx
// and rx rings mapped from the frontend's grants, the event channel(s) bound, a NetbackQueue
// and the thread that runs it (DESIGN.md §3: one data-plane thread per queue).
//
//   frontend queue q: tx-ring-ref, rx-ring-ref, event-channel[-tx/-rx]
//        │ GrantMapper (one per queue, owned by its thread from start on)
//        ▼
//   NetbackQueue q ◄──► TAP vif<N>.<devid> fd q ◄──► host stack (address from the vif's `ip`)
//   (with VifSettings::steer a queue may write a guest-tx packet on another queue's fd: the
//   vif's FlowSteering picks, flow_steering.h)
//
// The host TAP is configured before any queue starts: MTU (the vif's `mtu`), the host address
// of the vif's subnet (vif_address.h), link up. It vanishes with its fds, so a connection that
// goes (or a daemon that dies) leaves no interface behind.
//
// Threading: built and destroyed on the control thread; on_exit(queue index) is called on the
// queue's thread when its run() returned.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "xpv/domain/foreign_domain.h"
#include "xpv/gnttab/mapper.h"
#include "xpv/netback/queue.h"
#include "xpv/netback/tap.h"
#include "xpv/netback/vif_address.h"

namespace xpv::netback {

// What a frontend published for one queue (its directory, or queue-N/ under it).
struct VifQueueRings {
  gnttab::GrantRef tx_ref = 0, rx_ref = 0;
  std::uint32_t tx_evtchn = 0;
  std::optional<std::uint32_t> rx_evtchn;  // split event channels (event-channel-tx/-rx)
};

struct VifSettings {
  std::string tap_name;          // vif<N>.<devid>
  // The host TAP's MAC: the same for every connection of one vif (host_side_mac), so that a
  // restarted xpv-netback's new TAP is, to the domain's neighbour cache, the one it replaced.
  std::optional<std::array<std::uint8_t, 6>> mac;
  unsigned mtu = 1500;
  std::optional<VifAddresses> addresses;  // none: the host TAP gets no address
  // Non-empty: bridge mode (Xen's vif-bridge): the TAP becomes a port of this bridge, in
  // xpv-netback's namespace, and gets no address (`addresses` is then ignored).
  std::string bridge;
  TapOffload offload;            // what the frontend accepts on its rx ring
  NetbackConfig queue;           // sg, rx_gso, rate, resume
  // With more than one queue: netback chooses which queue each busy flow's host->guest packets
  // come back on (flow_steering.h; the daemon's default, XPV_NETBACK_STEER=spread); false (its
  // XPV_NETBACK_STEER=guest): where its guest-tx packets came from, as Linux netback.
  bool steer = false;
  // Non-empty: each queue keeps the rx requests it takes in `<shadow_dir>/<tap_name>-q<k>.rxids`
  // (xpv/shadow_ring.h), so that a restarted xpv-netback gives every buffer back with the
  // frontend's own id; kept across a restart (opened again when `queue.resume`), removed when
  // the vif closes for good (forget_shadows).
  std::string shadow_dir;
};

// The host TAP's MAC for vif <domid>.<devid>: fe:ff, then domid and the low 16 bits of devid,
// each big-endian (locally administered, unicast; Linux netback gives every vif
// fe:ff:ff:ff:ff:ff, which keeps a bridge from taking the vif's address — a routed TAP is a link
// of its own, so two vifs of one domain 65536 devids apart sharing a MAC is harmless; a bridged
// vif's TAP takes kBridgePortMac below instead). A
// TAP otherwise gets a random MAC at each creation, and after a restart the domain's frames to
// the host could go to the old one — its neighbour cache keeps it until the host's own traffic
// (an ARP request) or the entry's timers refresh it — and be dropped.
std::array<std::uint8_t, 6> host_side_mac(std::uint16_t domid, std::uint32_t devid) noexcept;

// The MAC of every bridged vif's TAP, as Linux netback's: the highest locally administered
// unicast address, so a bridge that picks its own address from its ports' lowest takes a vif's
// only when it has no other port and no address set by hand — then the host's frames carry
// fe:ff:ff:ff:ff:ff and the bridge delivers frames to it locally, which works, as under Xen.
inline constexpr std::array<std::uint8_t, 6> kBridgePortMac{0xfe, 0xff, 0xff, 0xff, 0xff, 0xff};

class VifConnection {
 public:
  // Creates the TAP, maps every queue's rings, binds its channels and starts its thread.
  // Throws std::runtime_error (a message for the xenstore error node); nothing is left mapped,
  // bound or created then.
  VifConnection(std::string name, std::shared_ptr<domain::ForeignDomain> dom,
                const std::vector<VifQueueRings>& queues, const VifSettings& settings,
                std::function<void(unsigned)> on_exit);
  // stop(), join, unmap, unbind; the TAP goes.
  ~VifConnection();
  VifConnection(const VifConnection&) = delete;
  VifConnection& operator=(const VifConnection&) = delete;

  void stop() noexcept;
  // The vif closes for good: its rx shadows are deleted at teardown (not after a SIGTERM, whose
  // successor resumes from them).
  void forget_shadows() noexcept { forget_shadows_ = true; }
  bool disabled() const noexcept;  // a queue was disabled (protocol violation)
  std::size_t queues() const noexcept { return queues_.size(); }
  const NetbackQueue& queue(std::size_t i) const noexcept { return *queues_[i]->queue; }
  const std::string& name() const noexcept { return name_; }

 private:
  struct Queue {
    std::unique_ptr<gnttab::GrantMapper> mapper;
    std::vector<gnttab::GrantHandle> ring_handles;
    std::vector<std::uint32_t> dom0_ports;  // bound, to unbind
    std::unique_ptr<RxShadow> rx_shadow;  // before `queue`, which uses it: destroyed after it
    std::unique_ptr<NetbackQueue> queue;
    std::thread thread;
  };
  void add_queue(unsigned index, const VifQueueRings& rings, NetbackConfig cfg, const std::string& shadow_dir);
  void teardown() noexcept;

  std::string name_;
  std::shared_ptr<domain::ForeignDomain> dom_;
  std::function<void(unsigned)> on_exit_;
  Tap tap_;
  std::vector<int> tap_fds_;              // tap_'s fd per queue (the queues' NetbackConfig::tap_fds)
  std::unique_ptr<FlowSteering> steer_;   // with VifSettings::steer and more than one queue
  std::vector<std::unique_ptr<Queue>> queues_;
  bool forget_shadows_ = false;
};

}  // namespace xpv::netback
