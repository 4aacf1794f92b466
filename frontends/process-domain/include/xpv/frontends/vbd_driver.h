// VbdDriver — the blkfront xenbus driver of a process domain: what Linux's xen-blkfront does on
// xenbus, for every device under /local/domain/<N>/device/vbd (PROCESS-DOMAINS.md, "A virtual
// block device"), with xpv's Blkfront as the data path and a FuseDisk as the disk's face:
//
//   backend InitWait  ─setup──► read feature-max-indirect-segments, max-ring-page-order,
//     (we: Initialising)        multi-queue-max-queues (absent: 1), feature-flush-cache,
//                               feature-discard; create the Blkfront with
//                               Q = min(backend's, max_queues) queues; one transaction: remove
//                               ring nodes of an earlier setup; [ring-page-order]; Q = 1:
//                               ring-ref | ring-ref<i>, event-channel; Q > 1:
//                               multi-queue-num-queues = Q, queue-<q>/{ring-ref | ring-ref<i>,
//                               event-channel}; protocol = x86_64-abi, feature-persistent = 0,
//                               state = 3
//   backend Connected ─connect► read sectors, info (bit 2 = read-only), sector-size; mount
//     (we: Initialised)         <run_dir>/dom<N>/vbd/<devid>/disk (FUSE); state = 4
//   backend Closing / Closed ─► unmount, destroy the Blkfront; state = 6
//   device directory removed ─► unmount, destroy; forgotten
//   shutdown() (SIGTERM)     ─► unmount; state = 5; wait (bounded) for the backend to close;
//                               destroy; state = 6
//
// The decisions are xpv::xenbus::frontend_step's (xenbus/device); this class does the I/O.
//
// Threading: every xenstore watch callback and every device action runs on the RingClient's
// watch thread (callbacks and post()ed work, in order), so the device table has no lock.
// start() and shutdown() may be called from any other thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "xpv/domain/domain.h"
#include "xpv/frontends/blkfront.h"
#include "xpv/frontends/fuse_disk.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/xenbus/client/ring_client.h"
#include "xpv/xenbus/device_state.h"

namespace xpv::frontends {

struct VbdDriverConfig {
  std::uint16_t domid = 0;
  std::string run_dir = "/run/xpv";            // disks at <run_dir>/dom<N>/vbd/<devid>/disk
  std::uint32_t max_indirect_segments = 256;   // we ask for min(this, the backend's)
  std::uint32_t max_ring_page_order = 0;       // we use min(this, the backend's)
  std::uint32_t max_queues = 1;                // we use min(this, the backend's multi-queue-max-queues, 16)
  std::chrono::milliseconds close_timeout{5000};  // shutdown: wait for the backend per device
};

class VbdDriver {
 public:
  VbdDriver(domain::Domain& dom, GuestEvents& events, xenbus::client::RingClient& xs,
            VbdDriverConfig config);
  // shutdown() if it was not called.
  ~VbdDriver();
  VbdDriver(const VbdDriver&) = delete;
  VbdDriver& operator=(const VbdDriver&) = delete;

  // Watches the domain's device/vbd directory; devices are handled from the watch thread.
  // Returns the xenstore error of the WATCH request.
  xenbus::client::Result<void> start();
  // Closes every device (see above), each wait bounded by close_timeout; returns false if the
  // whole shutdown did not finish within `bound` (it then keeps going in the background until
  // the destructor).
  bool shutdown(std::chrono::milliseconds bound);

  // Devices whose disk is mounted (any thread).
  std::size_t connected() const noexcept { return connected_.load(); }

 private:
  struct Vbd {
    std::string devid;
    std::string front;    // /local/domain/N/device/vbd/<devid>
    std::string back;     // its `backend` node
    domain::DomId backend_id = 0;
    xenbus::XenbusState state = xenbus::XenbusState::initialising;
    std::unique_ptr<Blkfront> blk;
    std::unique_ptr<FuseDisk> fuse;
    std::string mountpoint;
    bool failed = false;  // setup/connect failed: left Closed until the backend starts over
  };

  // Watch thread only.
  void rescan();
  void step(Vbd& v);
  bool setup(Vbd& v);
  bool connect(Vbd& v);
  void teardown(Vbd& v);
  void close_device(Vbd& v);
  bool publish_state(Vbd& v, xenbus::XenbusState s);
  std::optional<xenbus::XenbusState> backend_state(const Vbd& v);
  std::uint64_t free_pages_estimate() const;
  std::string base() const;

  domain::Domain& dom_;
  GuestEvents& events_;
  xenbus::client::RingClient& xs_;
  VbdDriverConfig config_;
  std::map<std::string, std::unique_ptr<Vbd>> devs_;  // by devid; watch thread only
  std::uint64_t pages_in_use_ = 0;                    // by our Blkfronts; watch thread only
  bool started_ = false;
  bool stopping_ = false;  // watch thread only
  bool shut_down_ = false;
  std::atomic<std::size_t> connected_{0};
};

}  // namespace xpv::frontends
