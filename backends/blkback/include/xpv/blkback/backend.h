// Backend — xpv-blkback's control plane: watches /local/domain/0/backend/vbd in xenstore and
// runs the backend half of the xenbus state machine for every device <domid>/<devid> found
// there, as docs/PROCESS-DOMAINS.md lays it out.
//
//  toolstack writes backend + frontend dirs (state 1)
//        │
//        ▼  probe: open `params` (read-only for mode=r), publish the features
//   ┌────────────┐  missing image ─► error node, state 6 Closed (fatal: sticky until the
//   │ 1 Initial- │                   device is removed or its frontend closes)
//   │   ising    │
//   └─────┬──────┘
//         ▼
//   ┌────────────┐  frontend 3 Initialised or 4 Connected: connect — ForeignDomain (one per
//   │ 2 InitWait │  domain), map ring-ref(s), bind event-channel(s), one BlkifQueue thread per
//   └─────┬──────┘  queue, write sectors/info/sector-size/physical-sector-size
//         ▼                                  failure ─► error node, state 5 Closing
//   ┌────────────┐  a queue disabled (ring protocol violation) ─► error node, 5 Closing
//   │ 4 Connected│  (that device only: every other device and domain keeps running)
//   └─────┬──────┘
//         ▼  frontend 5 Closing: stop the queues (in-flight I/O finishes and is answered,
//   ┌────────────┐  on a thread of its own: below), unmap, unbind; then state 5
//   │ 5 Closing  │
//   └─────┬──────┘
//         ▼  frontend 6 Closed (or its directory gone, or `online` = 0)
//   ┌────────────┐  frontend back to 1 Initialising with online = 1 ─► 2 InitWait again
//   │ 6 Closed   │  backend directory removed ─► the device is forgotten
//   └────────────┘
//
// The transitions are xpv::xenbus::backend_step's (xenbus/device); this class only performs
// the actions and publishes the states it returns.
//
// Restart without a guest reboot: a device found with backend state 4 and frontend state 3 or 4
// for which this process holds no connection was served by an xpv-blkback that died. It is
// reconnected to the published rings with no state change the frontend could see: BlkifQueue
// answers in request order, so the new queues attach at the shared rsp_prod and redo what was
// left unanswered (queue.h, shadow_ring.h, backends/README.md).
//
// Threading: every method runs on the thread that runs the io_context (the control thread).
// Watch events arrive on the xenstore client's thread and are posted here; queue threads post
// their exit here. SIGTERM (main.cpp) calls shutdown(): queues stopped, xenstore left as it is.
//
// A connection's queues end only when their I/O in flight has completed and been answered, and
// a disk whose storage stops answering (a hung NFS server, a stopped FUSE daemon) would hold the
// control thread — every other device's connects and closes — for as long. So that wait
// (VbdConnection::join) runs on a thread of its own, a "reaper"; the rest of the teardown
// (unmap, unbind: the ForeignDomain is the control thread's) follows on the control thread when
// the reaper posts. Until then the device takes no step at all, not even Closing: xpv's own
// blkfront takes Closing or Closed as the end and takes back its pages, which the queues may
// still write responses and read data into; a new connection would meet the old one's disk I/O
// and shadow files. (Linux's blkback answers Closing at once and writes Closed with requests in
// flight, leaving them to a deferred free; Linux's frontends keep a page whose grant is still
// mapped.) The post reconciles the device, which takes the step the frontend asks for then — or
// connects the new rings of a frontend that went on meanwhile (a Linux blkfront reset by a kexec
// kernel gives up waiting after 5 s a step and connects on seeing Connected). shutdown() waits
// for the reapers.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "xpv/blkback/connection.h"
#include "xpv/blkback/disk.h"
#include "xpv/domain/foreign_domain.h"
#include "xpv/stats_file.h"
#include "xpv/xenbus/client/sync_client.h"
#include "xpv/xenbus/client/xenstored_probe.h"
#include "xpv/xenbus/device_state.h"
#include "xpv/xenbus/event_coalescer.h"

namespace xpv::blkback {

struct BackendOptions {
  std::string xenstore_path = "/run/xenstored/socket";
  std::string run_dir = "/run/xpv";   // dom<N>.sock live here; our shadow files in blkback/,
                                      // each connected device's statistics in stats/ (stats_file.h)
  unsigned max_queues = 1;            // multi-queue-max-queues
  unsigned max_ring_page_order = 4;   // max-ring-page-order
  std::uint32_t max_indirect_segments = 256;
  unsigned poll_max_us = 100;         // QueueConfig::poll_max of every queue (0: never spin)
  // Called (on the io_context's thread) when xpv-xenstored, lost, answers again; the daemon then
  // exits for a restart that resumes the devices (backend_main.h, kExitXenstoreBack). Unset: the
  // control plane stays stopped and nothing looks.
  std::function<void()> xenstore_back;
};

class Backend {
 public:
  static constexpr const char* kBase = "/local/domain/0/backend/vbd";

  // Connects to xenstored and watches kBase (the watch fires once at once: the first scan).
  // Throws std::runtime_error when xenstored cannot be reached.
  Backend(boost::asio::io_context& io, BackendOptions options);
  ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // Stops every queue (in-flight I/O completes and is answered), unmaps, unbinds; xenstore is
  // left as it is so that the next xpv-blkback reconnects. Idempotent.
  void shutdown();

  std::size_t devices() const noexcept { return devices_.size(); }
  // The xenstore connection broke (or xenstored stopped answering): the control plane stopped,
  // every connected queue keeps serving its guest; nothing is torn down on a read that failed.
  bool xenstore_lost() const noexcept { return xs_lost_; }

 private:
  using Key = std::pair<std::uint16_t, std::uint32_t>;  // domid, devid
  struct Device {
    Key key;
    std::string name;      // vbd<domid>.<devid>, in every log line
    std::string be_path;   // kBase/<domid>/<devid>
    std::string fe_path;   // from the backend's `frontend` node
    std::string fe_token;  // our watch on <fe_path>/state
    std::shared_ptr<Disk> disk;  // shared with a reaper still tearing down a connection over it
    std::unique_ptr<VbdConnection> conn;
    std::uint64_t generation = 0;  // of conn, to match queue-exit posts
    xenbus::ErrorHold fatal;       // an error was reported; wait for the frontend to close
    bool resume_checked = false;   // the restart check ran once
    bool reaped = false;           // a teardown just ended: the frontend may have gone on meanwhile
    // An error's state (fatal()), written once the connection's teardown is done.
    std::optional<xenbus::XenbusState> state_after_teardown;
  };

  struct XenstoreLost {};
  template <class F>
  void guarded(F&& f);  // runs a control-plane step; XenstoreLost stops the control plane
  // The connection to xpv-xenstored broke, or a call got no answer in time (EIO): the control
  // plane stops (the queues go on) and, with options_.xenstore_back, the probe starts.
  void on_xenstore_lost();
  void on_event(const std::string& path);
  void scan();
  void reconcile(const Key& key);
  Device* adopt(const Key& key);
  void forget(const Key& key, bool removed);
  bool probe(Device& d);  // open the disk and publish the features
  void connect(Device& d, bool resume);
  // Lets go of the device's connection: true when it holds none any more; false while a reaper
  // tears it (or an earlier one) down — reaped() reconciles the device again when it is done.
  bool disconnect(Device& d, bool for_good);
  void reaped(const Key& key);  // a reaper's join is done: the rest of the teardown
  void fatal(Device& d, xenbus::XenbusState state, int err, const std::string& what);
  void on_queue_exit(const Key& key, std::uint64_t generation, unsigned queue);
  std::shared_ptr<domain::ForeignDomain> domain(std::uint16_t domid);

  std::optional<std::string> read(const std::string& path);
  bool write_state(Device& d, xenbus::XenbusState s);
  // Every second: each connected device's counters, summed over its queues, into stats/<name>.
  void publish_stats();

  boost::asio::io_context& io_;
  BackendOptions options_;
  std::string shadow_dir_;
  stats::Publisher stats_;
  boost::asio::steady_timer stats_timer_;
  // Frontend state watches: claimed on xs_'s thread, so it outlives xs_ (declared before it).
  xenbus::EventCoalescer<Key> fe_events_;
  std::unique_ptr<xenbus::client::SyncClient> xs_;
  std::map<Key, Device> devices_;
  std::map<std::uint16_t, std::weak_ptr<domain::ForeignDomain>> domains_;
  struct Reaper {
    std::shared_ptr<Disk> disk;           // under conn's I/O, whatever the device does meanwhile
    std::unique_ptr<VbdConnection> conn;  // its join() runs on `thread`, nothing else touches it
    std::thread thread;                   // joined before a Reaper goes
  };
  std::map<Key, Reaper> reapers_;  // connections being torn down, by device
  std::uint64_t next_generation_ = 1;
  bool shut_down_ = false;
  bool swept_ = false;  // the shadows of disks not in xenstore were removed (scan)
  bool xs_lost_ = false;
  // While xs_lost_: whether xpv-xenstored answers again (options_.xenstore_back).
  xenbus::client::XenstoredProbe xs_probe_;
};

}  // namespace xpv::blkback
