// VifDriver — the netfront xenbus driver of a process domain: what Linux's xen-netfront does on
// xenbus, for every device under /local/domain/<N>/device/vif (PROCESS-DOMAINS.md, "A virtual
// network interface"), with xpv's Netfront as the data path (one per queue) and a TAP `eth<devid>`
// inside the domain's network namespace as the NIC the domain's programs use:
//
//   backend InitWait  ─setup──► read feature-rx-copy (must be 1), feature-sg, feature-gso-tcpv4/6,
//     (we: Initialising)        feature-split-event-channels, multi-queue-max-queues, the vif's
//                               `mtu` and `ip`; the TAP eth<devid> in the namespace (one fd per
//                               queue); one Netfront per queue; publish (one transaction)
//                               [multi-queue-num-queues + queue-<i>/]{tx-ring-ref, rx-ring-ref,
//                               event-channel-tx/-rx | event-channel}, request-rx-copy = 1,
//                               feature-rx-notify = 1, feature-sg = 1, feature-gso-tcpv4 = 1,
//                               feature-gso-tcpv6 = 1, feature-ipv6-csum-offload = 1, state = 3
//   backend Connected ─connect► the TAP gets the vif's MAC, MTU and address (`ip`), link up;
//     (we: Initialised)         the Netfronts start; state = 4
//   backend Closing / Closed ─► stop, destroy the Netfronts (grants ended), the TAP goes; state 6
//   backend InitWait again after we closed ─► set up anew (re-attach)
//   device directory removed ─► stop, destroy; forgotten
//   shutdown() (SIGTERM)     ─► state = 5; wait (bounded) for the backend to close; destroy; 6
//
// A backend that dies and is restarted reattaches to the same rings without a state change
// (backends/README.md, "xpv-netback restart"): nothing to do here; a few packets are lost.
// The decisions are xpv::xenbus::frontend_step's (xenbus/device); this class does the I/O.
//
// Threading: every xenstore watch callback and every device action runs on the RingClient's
// watch thread, so the device table has no lock. start() and shutdown() from any other thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "xpv/domain/domain.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/frontends/netfront.h"
#include "xpv/netback/tap.h"
#include "xpv/netback/vif_address.h"
#include "xpv/xenbus/client/ring_client.h"
#include "xpv/xenbus/device_state.h"

namespace xpv::frontends {

struct VifDriverConfig {
  std::uint16_t domid = 0;
  std::string netns;             // the domain's network namespace file (/run/netns/xpv-dom<N>)
  unsigned max_queues = 1;       // we ask for min(this, the backend's multi-queue-max-queues)
  std::chrono::milliseconds close_timeout{5000};  // shutdown: wait for the backend per device
};

class VifDriver {
 public:
  VifDriver(domain::Domain& dom, GuestEvents& events, xenbus::client::RingClient& xs, VifDriverConfig config);
  ~VifDriver();
  VifDriver(const VifDriver&) = delete;
  VifDriver& operator=(const VifDriver&) = delete;

  xenbus::client::Result<void> start();
  bool shutdown(std::chrono::milliseconds bound);
  std::size_t connected() const noexcept { return connected_.load(); }

 private:
  struct Vif {
    std::string devid;
    std::string front, back;
    domain::DomId backend_id = 0;
    xenbus::XenbusState state = xenbus::XenbusState::initialising;
    std::array<std::uint8_t, 6> mac{};
    unsigned mtu = 1500;
    std::optional<netback::VifAddresses> addresses;
    netback::Tap tap;
    std::vector<std::unique_ptr<Netfront>> queues;
    bool running = false;
    bool failed = false;
  };

  void rescan();
  void step(Vif& v);
  bool setup(Vif& v);
  bool connect(Vif& v);
  void teardown(Vif& v);
  void close_device(Vif& v);
  bool publish_state(Vif& v, xenbus::XenbusState s);
  std::optional<xenbus::XenbusState> backend_state(const Vif& v);
  std::string base() const;

  domain::Domain& dom_;
  GuestEvents& events_;
  xenbus::client::RingClient& xs_;
  VifDriverConfig config_;
  std::map<std::string, std::unique_ptr<Vif>> devs_;  // watch thread only
  bool started_ = false;
  bool stopping_ = false;
  bool shut_down_ = false;
  std::atomic<std::size_t> connected_{0};
};

}  // namespace xpv::frontends
