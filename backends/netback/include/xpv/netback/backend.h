// Backend — xpv-netback's control plane: watches /local/domain/0/backend/vif in xenstore and
// runs the backend half of the xenbus state machine for every vif <domid>/<devid> found there,
// as docs/PROCESS-DOMAINS.md lays it out and Linux's netback does on xenbus.
//
//  toolstack writes backend + frontend dirs (state 1)
//        │
//        ▼  probe: check `bridge` (exists and is one), `ip`, `mtu`, `rate`; publish the features
//   ┌────────────┐  a bad node ─► error node, state 6 Closed (sticky until the frontend closes
//   │ 1 Initial- │                or the device is removed)
//   │   ising    │
//   └─────┬──────┘
//         ▼
//   ┌────────────┐  frontend 3 Initialised or 4 Connected: connect — read the frontend's nodes
//   │ 2 InitWait │  (queues, ring refs, event channels, request-rx-copy, feature-*), create the
//   └─────┬──────┘  TAP vif<N>.<devid>, map, bind, one NetbackQueue thread per queue
//         ▼                                  failure ─► error node, state 5 Closing
//   ┌────────────┐  a queue disabled (ring protocol violation) ─► error node, 5 Closing
//   │ 4 Connected│  (that vif only: every other vif and domain keeps running)
//   └─────┬──────┘
//         ▼  frontend 5 Closing, or our own state set to 5 by the toolstack (detach): stop the
//   ┌────────────┐  queues, unmap, unbind, the TAP goes — before the frontend ends its grants
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
// Restart without a guest reboot: a vif found with backend state 4 and frontend state 3 or 4
// for which this process holds no connection was served by an xpv-netback that died. It is
// reconnected to the published rings with no xenstore write: the TAP is made again, the
// queues attach at the shared rsp_prod and answer, unused, what the dead one left unanswered
// (queue.h, "Resume").
//
// Threading: every method runs on the thread that runs the io_context (the control thread).
// Watch events arrive on the xenstore client's thread and are posted here; queue threads post
// their exit here. SIGTERM (main.cpp) calls shutdown(): queues stopped, xenstore left as it is.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "xpv/domain/foreign_domain.h"
#include "xpv/netback/connection.h"
#include "xpv/netback/fair_share.h"
#include "xpv/stats_file.h"
#include "xpv/xenbus/client/sync_client.h"
#include "xpv/xenbus/client/xenstored_probe.h"
#include "xpv/xenbus/device_state.h"
#include "xpv/xenbus/event_coalescer.h"

namespace xpv::netback {

struct BackendOptions {
  std::string xenstore_path = "/run/xenstored/socket";
  std::string run_dir = "/run/xpv";  // dom<N>.sock live here; each connected vif's statistics
                                     // in stats/ (stats_file.h)
  unsigned max_queues = 1;           // multi-queue-max-queues
  // Called (on the io_context's thread) when xpv-xenstored, lost, answers again; the daemon then
  // exits for a restart that resumes the devices (backend_main.h, kExitXenstoreBack). Unset: the
  // control plane stays stopped and nothing looks.
  std::function<void()> xenstore_back;
};

// What probe() validated from the backend directory (written by the toolstack).
struct VifBackendNodes {
  unsigned mtu = 1500;
  std::optional<VifAddresses> addresses;
  std::string bridge;  // non-empty: bridge mode (the TAP a port of it, no host address)
  std::uint64_t rate_bytes = 0, rate_usec = 0;  // 0: unlimited
  // multi-queue-max-queues offered to this vif: the toolstack's `queues` node (1..64) when it is
  // smaller than the daemon's max_queues, else max_queues.
  unsigned max_queues = 1;
};

// Parses the toolstack's `rate` node ("bytes,usec", Linux netback's format). nullopt: malformed.
std::optional<std::pair<std::uint64_t, std::uint64_t>> parse_rate_node(const std::string& s) noexcept;

class Backend {
 public:
  static constexpr const char* kBase = "/local/domain/0/backend/vif";

  // Connects to xenstored and watches kBase (the watch fires once at once: the first scan).
  // Throws std::runtime_error when xenstored cannot be reached.
  Backend(boost::asio::io_context& io, BackendOptions options);
  ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // Stops every queue, unmaps, unbinds, removes the TAPs; xenstore is left as it is so that the
  // next xpv-netback reconnects. Idempotent.
  void shutdown();

  std::size_t devices() const noexcept { return devices_.size(); }
  bool xenstore_lost() const noexcept { return xs_lost_; }

 private:
  using Key = std::pair<std::uint16_t, std::uint32_t>;  // domid, devid
  struct Device {
    Key key;
    std::string name;      // vif<domid>.<devid>: the TAP's name and every log line's prefix
    std::string be_path;   // kBase/<domid>/<devid>
    std::string fe_path;   // from the backend's `frontend` node
    std::string fe_token;  // our watch on <fe_path>/state
    std::optional<VifBackendNodes> nodes;  // probed
    std::unique_ptr<VifConnection> conn;
    std::uint64_t generation = 0;  // of conn, to match queue-exit posts
    xenbus::ErrorHold fatal;       // an error was reported; wait for the frontend to close
    bool resume_checked = false;   // the restart check ran once
  };

  struct XenstoreLost {};
  template <class F>
  void guarded(F&& f);
  // The connection to xpv-xenstored broke, or a call got no answer in time (EIO): the control
  // plane stops (the queues go on) and, with options_.xenstore_back, the probe starts.
  void on_xenstore_lost();
  void on_event(const std::string& path);
  void scan();
  void reconcile(const Key& key);
  Device* adopt(const Key& key);
  void forget(const Key& key, bool removed);
  // Checks the toolstack's nodes; publishes the features unless `publish` is false (a resumed
  // vif has them already: a restart writes nothing).
  bool probe(Device& d, bool publish = true);
  void connect(Device& d, bool resume);
  void disconnect(Device& d);
  void fatal(Device& d, xenbus::XenbusState state, int err, const std::string& what);
  void on_queue_exit(const Key& key, std::uint64_t generation, unsigned queue);
  std::shared_ptr<domain::ForeignDomain> domain(std::uint16_t domid);

  std::optional<std::string> read(const std::string& path);
  bool write_state(Device& d, xenbus::XenbusState s);
  // Every second: each connected vif's counters, summed over its queues, into stats/<name>.
  void publish_stats();
  // Deletes the rx shadow files of vif `name` (the vif closed for good).
  void remove_shadows(const std::string& name) noexcept;

  boost::asio::io_context& io_;
  BackendOptions options_;
  stats::Publisher stats_;
  std::string shadow_dir_;  // <run_dir>/netback: the queues' rx shadows (connection.h)
  boost::asio::steady_timer stats_timer_;
  // Frontend state watches: claimed on xs_'s thread, so it outlives xs_ (declared before it).
  xenbus::EventCoalescer<Key> fe_events_;
  std::unique_ptr<xenbus::client::SyncClient> xs_;
  // Every queue of every vif shares it (fair_share.h); declared before devices_ so it outlives
  // their queues.
  FairShare share_;
  std::map<Key, Device> devices_;
  std::map<std::uint16_t, std::weak_ptr<domain::ForeignDomain>> domains_;
  std::uint64_t next_generation_ = 1;
  bool shut_down_ = false;
  bool swept_ = false;  // the rx shadows of vifs not in xenstore were removed (scan)
  bool xs_lost_ = false;
  // While xs_lost_: whether xpv-xenstored answers again (options_.xenstore_back).
  xenbus::client::XenstoredProbe xs_probe_;
};

}  // namespace xpv::netback
