// EventChannels — the 2-level event-channel ABI of one domain (Xen's xen/common/event_channel.c
// and event_2l.c semantics, public/event_channel.h), over the domain's shared_info page in guest
// memory, plus the dom0-side endpoints through which dom0 services (backends, xenstored) reach
// the domain's ports as eventfds.
//
// ── Who calls what ───────────────────────────────────────────────────────────────────────────
//  guest ops     alloc_unbound … reset, register_vcpu_info: the vCPU thread that took the
//                hypercall (HVM), or the frontend code of a process domain.
//  host ops      raise_virq, deliver: any host thread (timer, console, VMM devices).
//  dom0 side     bind_to_dom0, dom0_alloc_unbound, dom0_close, dom0_status: the domain control
//                socket (control-plane thread). service_dom0_kick(s): the domain's event loop,
//                when a from_dom0 eventfd (kick_fd) is readable.
//
// ── Locking ──────────────────────────────────────────────────────────────────────────────────
//  One std::shared_mutex (table_mu_) guards the port table, the virq table, the vcpu_info
//  locations and the dom0 endpoints. Operations that change them take it exclusively; the hot
//  paths (send, unmask, deliver, raise_virq, service_dom0_kick, status) take it shared, so vCPUs
//  and the event loop deliver concurrently. The hot paths do not allocate. The pending / mask /
//  pending_sel / upcall_pending bits themselves are changed lock-free with std::atomic_ref on
//  guest memory (the guest changes them concurrently on other CPUs). Lock order: table_mu_ is
//  the only lock; UpcallSink::upcall is called with it held (shared on the hot paths, exclusive
//  from bind_interdomain / register_vcpu_info / dom0_close), so a sink must not call back into EventChannels
//  and should be short (an eventfd write, an interrupt injection). The shared_mutex is glibc's
//  rwlock (readers preferred): a guest flooding sends can delay a bind, never corrupt it.
//
// ── Delivery (XEN-GUEST-ABI.md "Upcalls", event_2l.c set_pending) ────────────────────────────
//   1. test-and-set the port's bit in shared_info.evtchn_pending; already set → stop.
//   2. port's bit in shared_info.evtchn_mask set → stop (the guest's unmask re-delivers).
//   3. test-and-set bit (port / 64) in the target vCPU's vcpu_info.evtchn_pending_sel; already
//      set → stop.
//   4. exchange vcpu_info.evtchn_upcall_pending with 1; it was already 1 → stop.
//   5. sink.upcall(vcpu).
//  evtchn_upcall_mask is NOT consulted: Xen also records pending regardless of it, and for HVM
//  the upcall is an interrupt that the guest holds off with its own interrupt flag. A sink that
//  needs the PV-style mask (e.g. a process domain) may read upcall_masked(vcpu) itself.
//  The target vCPU is the port's notify vCPU (vCPU 0 unless bound elsewhere).
//
// ── Port states (guest side) ──────────────────────────────────────────────────────────────────
//
//     closed ──alloc_unbound(r)──► unbound(r) ──peer binds (bind_interdomain / bind_to_dom0)──┐
//       │  │                          ▲                                                       ▼
//       │  └──bind_interdomain(r,p)───┼───────────────────────────────────────────► interdomain
//       ├──bind_virq──► virq          └───── peer closes (guest close / dom0_close) ──────────┘
//       └──bind_ipi───► ipi
//     any state ──close / reset──► closed (pending bit cleared, notify vCPU back to 0)
//
//  Interdomain peers are either another port of this domain (loopback, remote_dom == own id or
//  DOMID_SELF, as Xen allows) or a dom0-side endpoint (remote_dom == 0). Other domains are not
//  reachable from this process: bind_interdomain to them fails with ESRCH.
//
// ── Dom0-side endpoints ───────────────────────────────────────────────────────────────────────
//
//     (none) ──dom0_alloc_unbound──► unbound ──guest bind_interdomain(0, dom0_port)──► connected
//     (none) ──bind_to_dom0(guest port unbound for dom 0)─────────────────────────────► connected
//     connected ──guest close(port) / reset──► unbound (to_dom0 kicked once to wake the backend)
//     any ──dom0_close──► (none); a connected guest port goes back to unbound(remote 0)
//
//  Each endpoint owns two eventfds: to_dom0 (written when the guest sends on the port) and
//  from_dom0 (the backend writes it; the event loop turns it into delivery on the guest port).
//  As in Xen's bind_interdomain, the binding side's new port is set pending once: bind_to_dom0
//  notifies to_dom0; the guest's bind_interdomain(0, …) makes the guest port pending.
//
// ── Errors ────────────────────────────────────────────────────────────────────────────────────
//  Every operation returns Xen's errno (XenErrno; the hypercall result is its negation):
//   EINVAL port ≥ max_ports, or a port in the wrong state; ENOENT bad vCPU; EEXIST virq already
//   bound on that vCPU; ENOSPC no free port; ESRCH remote domain not reachable.
//  Exactly as Xen: port 0 is never allocated, but it is a valid index (status(0) = closed,
//  unmask(0) succeeds); send/close/bind_vcpu on it fail with EINVAL. send on an *unbound* port
//  succeeds and drops the event (Xen: "silently drop the notification"); send on a closed, virq
//  or out-of-range port is EINVAL.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <span>
#include <vector>

#include "xpv/domain/direct_upcall.h"
#include "xpv/domain/dom0_port.h"
#include "xpv/domain/event_fd.h"
#include "xpv/domain/evtchn_abi.h"
#include "xpv/domain/shared_info.h"
#include "xpv/expected.h"
#include "xpv/guest_memory.h"

namespace xpv::domain {

// How a domain tells a vCPU "look at your vcpu_info": xpv-vmm injects the upcall vector or
// raises the platform-pci INTx; a process domain writes an eventfd; tests record calls.
// Called on the delivering thread with EventChannels' lock held: must not call back into
// EventChannels.
class UpcallSink {
 public:
  virtual ~UpcallSink() = default;
  virtual void upcall(unsigned vcpu) noexcept = 0;
};

// Where the guest's sends on a port connected to a dom0 endpoint can go without this process:
// xpv-vmm registers the endpoint's to_dom0 eventfd with KVM for that port (an ioeventfd on the
// fast-send port, xen/stubs.h), so such a send signals the backend inside the host kernel —
// exactly what send() does for it (to_dom0.notify()), minus the exit to user space. Called with
// EventChannels' lock held exclusively: must not call back into EventChannels.
class SendRouteSink {
 public:
  virtual ~SendRouteSink() = default;
  // Sends on guest_port now signal to_dom0_fd. False: not routed (they keep reaching send()).
  virtual bool route(Port guest_port, int to_dom0_fd) noexcept = 0;
  // Undoes a route() that returned true, with the same arguments.
  virtual void unroute(Port guest_port, int to_dom0_fd) noexcept = 0;
};

struct EvtchnStatus {
  EvtchnStat status = EvtchnStat::closed;
  std::uint32_t vcpu = 0;         // notify vCPU
  DomId remote_dom = 0;           // unbound: who may bind; interdomain: the peer domain
  Port remote_port = 0;           // interdomain: the peer's port (dom0 endpoint number for dom 0)
  std::uint32_t virq = 0;         // virq
};

// Dom0-side view of one endpoint (what dom0's EVTCHNOP_status would say).
struct Dom0EndpointStatus {
  EvtchnStat status = EvtchnStat::closed;  // unbound or interdomain
  Port guest_port = 0;                     // interdomain: the domain's port
};

class EventChannels {
 public:
  // shared_info: the domain's shared info page (kSharedInfoPageBytes, 8-byte aligned) in guest
  // memory, which must outlive this object. vCPU v < 32 starts with its vcpu_info in the legacy
  // slot shared_info.vcpu_info[v]; vCPUs ≥ 32 have none until register_vcpu_info (events for
  // them are recorded in a host-side placeholder without upcalls, as Xen's dummy vcpu_info).
  // max_ports: ports are 1 … max_ports-1 (≤ 4096, the 2-level limit). Throws
  // std::invalid_argument on bad arguments (setup code).
  EventChannels(DomId domid, unsigned nr_vcpus, std::span<std::uint8_t> shared_info,
                UpcallSink& sink, Port max_ports = kEvtchn2lNrChannels);
  ~EventChannels();
  EventChannels(const EventChannels&) = delete;
  EventChannels& operator=(const EventChannels&) = delete;

  DomId domid() const noexcept { return domid_; }
  unsigned nr_vcpus() const noexcept { return nr_vcpus_; }
  Port max_ports() const noexcept { return max_ports_; }

  // ---- guest operations (EVTCHNOP_*) ----
  Expected<Port, XenErrno> alloc_unbound(DomId remote_dom) noexcept;
  Expected<Port, XenErrno> bind_interdomain(DomId remote_dom, Port remote_port) noexcept;
  Expected<Port, XenErrno> bind_virq(std::uint32_t virq, std::uint32_t vcpu) noexcept;
  Expected<Port, XenErrno> bind_ipi(std::uint32_t vcpu) noexcept;
  // Xen's rules: unbound, interdomain and *global* virq ports may move; ipi and per-vCPU virq
  // ports are fixed to their bind-time vCPU (EINVAL). A bad vCPU is ENOENT (checked first).
  // Nothing is re-delivered: Linux masks, rebinds, then unmasks (which re-delivers).
  Expected<void, XenErrno> bind_vcpu(Port port, std::uint32_t vcpu) noexcept;
  Expected<void, XenErrno> send(Port port) noexcept;
  // Clears the mask bit; if it was set and the port is pending, does steps 3–5 of delivery.
  Expected<void, XenErrno> unmask(Port port) noexcept;
  Expected<void, XenErrno> close(Port port) noexcept;
  Expected<EvtchnStatus, XenErrno> status(Port port) const noexcept;
  void reset() noexcept;  // closes every port (EVTCHNOP_reset for DOMID_SELF)

  // VCPUOP_register_vcpu_info. `at` is the new vcpu_info in guest memory (≥ 64 bytes; the first
  // 64 are used). It must be 8-byte aligned and must not cross a 4 KiB page (guest RAM is mapped
  // page-aligned, so the host page offset is the guest page offset): else ENXIO. A vCPU can
  // register once (EINVAL afterwards, as Xen ≤ 4.17); bad vCPU ENOENT. As Xen does, the current
  // contents are copied over (zeroes for a vCPU ≥ 32 that had only the placeholder), pending_sel
  // is set to all ones and upcall_pending to 1 (with an upcall if it was 0), so nothing pending is
  // lost. Called on the registering vCPU's own thread (Xen allows only the vCPU itself or an
  // offline one; the dispatcher checks that).
  Expected<void, XenErrno> register_vcpu_info(unsigned vcpu, std::span<std::uint8_t> at) noexcept;
  // The hypercall form: (gfn, offset) translated through the domain's memory. offset > 4096-64 →
  // ENXIO; a gfn outside guest RAM → EINVAL.
  Expected<void, XenErrno> register_vcpu_info(unsigned vcpu, const GuestMemory& mem,
                                              std::uint64_t gfn, std::uint32_t offset) noexcept;

  // HVM: the guest chose where shared_info lives (XENMEM_add_to_physmap, XENMAPSPACE_shared_info)
  // after the VMM created this object over a host placeholder page. `page` (kSharedInfoPageBytes,
  // 8-byte aligned, guest memory that must outlive this object) becomes the shared_info page:
  // it is overwritten with the current state — the evtchn_pending and evtchn_mask bitmaps, the
  // legacy vcpu_info slots of vCPUs that still use them (and any registered vcpu_info that lay in
  // the old page, at the same offset), everything else zero — and every vcpu_info that pointed
  // into the old page is re-pointed into the new one. A registered vcpu_info that lies inside the
  // new page keeps its contents (it stays where the guest put it). No upcall is raised: nothing
  // new became pending. The old page is no longer referenced afterwards (the caller may free it).
  // Same page again → no-op. Errors: EINVAL for a short, misaligned, or partially overlapping
  // page. Exclusive lock; guest updates to the *old* page racing with the move may be lost (the
  // guest cannot see a host placeholder; a guest moving its own live page gets Xen's "undefined").
  // Called on the vCPU thread that took the hypercall.
  Expected<void, XenErrno> move_shared_info(std::span<std::uint8_t> page) noexcept;

  // ---- host-side delivery ----
  // Raises a virtual IRQ: per-vCPU virqs on `vcpu`'s binding, global ones on the vCPU-0 binding
  // (delivered to that port's notify vCPU; `vcpu` is ignored). EINVAL bad virq/vCPU; ENOENT not
  // bound (the event is dropped, as in Xen).
  Expected<void, XenErrno> raise_virq(std::uint32_t virq, std::uint32_t vcpu = 0) noexcept;
  // Makes a bound port pending from the host side (what a peer's send does). EINVAL if the port
  // is out of range or closed.
  Expected<void, XenErrno> deliver(Port port) noexcept;

  // ---- dom0 side (domain control socket) ----
  // dom0's EVTCHNOP_bind_interdomain(this domain, guest_port): the guest port must be unbound
  // for remote dom 0 (else EINVAL, as Xen). Returns dup'd fds the caller owns. EMFILE/ENFILE on
  // eventfd creation → ENOMEM.
  Expected<Dom0Fds, XenErrno> bind_to_dom0(Port guest_port) noexcept;
  // dom0's EVTCHNOP_alloc_unbound(dom0, remote = this domain): an unbound dom0 endpoint the guest
  // can bind with bind_interdomain(0, dom0_port) (e.g. a console or xenstore channel that dom0
  // offers). ENOSPC when max_ports endpoints exist.
  Expected<Dom0Fds, XenErrno> dom0_alloc_unbound() noexcept;
  // dom0's EVTCHNOP_close on its endpoint. EINVAL for an unknown endpoint. The fds already
  // handed out stay open (their owners close them) but no longer reach the guest.
  // owner_gone: the service that held the endpoint is gone without closing it (its control
  // connection dropped). Then, with a direct table attached and the endpoint connected, every
  // vCPU the guest sees gets an upcall (upcall_pending set, the sink called), and the guest port
  // its selector bit if it is pending and unmasked. A service killed in the middle of
  // DirectUpcall::kick can leave any prefix of steps 1–5 done — the port pending, a selector bit
  // with no upcall_pending, upcall_pending with no interrupt — while the guest's own scan clears
  // what it meets; each of those stops every later delivery to that port, that selector word or
  // that vCPU at "already set". At worst one spurious upcall per vCPU, and only when a service
  // died or exited without unbinding: a live one closes its endpoints after its threads stopped
  // kicking, and a guest shutting its devices down is left alone.
  Expected<void, XenErrno> dom0_close(Port dom0_port, bool owner_gone = false) noexcept;
  Expected<Dom0EndpointStatus, XenErrno> dom0_status(Port dom0_port) const noexcept;

  // The endpoint's from_dom0 eventfd, borrowed for the event loop's poll set; valid until
  // dom0_close(dom0_port) or destruction. -1 for an unknown endpoint.
  int kick_fd(Port dom0_port) const noexcept;
  // Event loop thread, when kick_fd(dom0_port) is readable: consumes the kicks and, if the
  // endpoint is connected, delivers its guest port. With a direct table attached, a port it finds
  // already pending and unmasked is signalled again (steps 3–5: at most a spurious upcall), so
  // that a direct delivery that set the pending bit and then handed over to this path
  // (DirectUpcall::kick) loses nothing. Returns the number of kicks consumed (0 if
  // none; kicks to an unbound endpoint are consumed and dropped, as Xen drops a send on an
  // unbound port). EINVAL for an unknown endpoint (the loop should drop that fd).
  Expected<std::uint64_t, XenErrno> service_dom0_kick(Port dom0_port) noexcept;
  // Services every endpoint (non-blocking reads); for simple loops and tests. Returns the total
  // number of kicks consumed.
  std::uint64_t service_dom0_kicks() noexcept;

  // ---- lost edges ----
  // A guest that unmasks a 2-level port on its own vCPU without a hypercall after it saw the
  // port not pending — older Linux kernels tested the pending bit, then cleared the mask bit
  // (6.1's evtchn_2l_unmask clears first, then tests, and has no such window) — loses an event
  // that arrives between the two: it finds the port masked, so no selector bit and no upcall
  // (step 2), and the guest then unmasks without looking again: the port stays pending and
  // unmasked, and — the port being pending — later sends do not signal it either (step 1).
  // Xen has the same window; its HVM guests leave it at the next PV timer event (a
  // VIRQ_TIMER in the same selector word makes the guest scan the word). xpv offers no PV
  // timers, so a quiet guest would wait for that port for ever. This finds such ports: a port
  // pending and unmasked whose notify vCPU has no selector bit for its word, seen so on two calls
  // in a row (one sighting can be a delivery or the guest's own scan under way), gets steps 3–5
  // again — at worst one spurious upcall. Call it periodically from one thread (it keeps the
  // previous sightings); shared lock. Returns the number of ports signalled again and the first
  // of them in *first (if not null).
  std::size_t redeliver_lost_edges(Port* first = nullptr) noexcept;

  // ---- direct upcalls (direct_upcall.h) ----
  // From now on, keep `table` up to date with every dom0 endpoint's guest port and notify vCPU,
  // every vCPU's vcpu_info and shared_info — as guest-physical addresses, found by looking the
  // host addresses this object works on up in `spans_from` (the GuestMemory the shared_info and
  // vcpu_info spans given to it come from; a span outside it is published as kNoGpa). Both must
  // outlive this object. No vCPU is routed until set_direct_route says so. Exclusive lock.
  void attach_direct(DirectTable& table, const GuestMemory& spans_from) noexcept;
  // Whether `vcpu`'s upcall eventfd raises its upcall now (the VMM routed it to the vCPU's vector).
  void set_direct_route(unsigned vcpu, bool routed) noexcept;

  // ---- in-kernel sends (SendRouteSink) ----
  // Routes every port connected to a dom0 endpoint now, and from now on each one as it connects;
  // unroutes each as it leaves (guest close or reset, dom0_close). nullptr unroutes everything
  // and stops. The sink must stay alive until it is replaced. Exclusive lock.
  void set_send_route_sink(SendRouteSink* sink) noexcept;

  // ---- guest-state inspection (tests, process domains, debugging) ----
  bool upcall_masked(unsigned vcpu) const noexcept;
  // vcpu_info.evtchn_upcall_pending of `vcpu` (false for a bad vCPU, and for a vCPU ≥ 32 that
  // has no vcpu_info the guest can see: the host placeholder is never an upcall to raise). For
  // the HVM platform: the platform-pci INTx line stays asserted while vCPU 0's is set, and a
  // guest that picks its upcall mode late gets one upcall if an event is already waiting. Takes
  // the lock shared: not from an UpcallSink.
  bool upcall_pending(unsigned vcpu) const noexcept;
  // The port's bit in shared_info.evtchn_pending (false for a port ≥ max_ports). For
  // SCHEDOP_poll, which waits for a (typically masked) port to become pending. Shared lock.
  bool port_pending(Port port) const noexcept;

 private:
  enum class State : std::uint8_t { closed, unbound, interdomain, virq, ipi };
  struct Channel {
    State state = State::closed;
    DomId remote_dom = 0;       // unbound: who may bind; interdomain: peer domain
    Port remote_port = 0;       // interdomain: peer port (loopback) or dom0 endpoint number
    std::uint32_t notify_vcpu = 0;
    std::uint32_t virq = 0;
  };
  struct Dom0Endpoint {
    Port guest_port = 0;  // 0 = unbound (accepting this domain)
    Port routed = 0;      // the guest port the SendRouteSink routed to to_dom0 (0: none)
    EventFd to_dom0;
    EventFd from_dom0;
  };
  struct VcpuSlot {
    std::span<std::uint8_t> info;  // kVcpuInfoBytes of guest memory (or of placeholder_)
    bool guest_visible = false;    // false: the host-side placeholder (no upcalls)
    bool registered = false;       // register_vcpu_info done
  };
  static constexpr std::size_t kVcpuInfoBytes = sizeof(VcpuInfo);

  // All *_locked helpers require table_mu_ (shared suffices for the delivery ones).
  bool port_valid(Port p) const noexcept { return p < max_ports_; }
  Expected<Port, XenErrno> find_free_port_locked() const noexcept;
  bool vcpu_valid(std::uint32_t v) const noexcept { return v < nr_vcpus_; }
  void free_channel_locked(Port p) noexcept;
  void close_locked(Port p) noexcept;  // p is not closed
  void send_locked(const Channel& c, Port p) noexcept;
  Expected<Dom0Fds, XenErrno> make_dom0_fds(Port dom0_port, const Dom0Endpoint& e) const noexcept;
  Expected<Port, XenErrno> new_dom0_endpoint_locked() noexcept;

  // Lock-free delivery on guest memory.
  // resignal: a port already pending (and not masked) still gets steps 3–5.
  void set_pending(Port p, std::uint32_t vcpu, bool resignal = false) noexcept;
  void dom0_kick_locked(Port guest_port) noexcept;  // resignals only with a direct table
  void mark_sel_and_upcall(std::uint32_t vcpu, unsigned word) noexcept;
  void mark_upcall_pending(std::uint32_t vcpu) noexcept;
  void raise_after_torn_kick_locked(Port p) noexcept;  // dom0_close with a direct table
  void clear_pending(Port p) noexcept;
  std::uint64_t* pending_word(Port p) const noexcept;
  std::uint64_t* mask_word(Port p) const noexcept;

  // Direct table upkeep (table_mu_ exclusive; no-ops without a table).
  std::uint64_t gpa_of(std::span<std::uint8_t> s) const noexcept;
  void publish_endpoint_locked(Port dom0_port) noexcept;
  void route_endpoint_locked(Port dom0_port) noexcept;  // make the sink's route match guest_port
  void publish_port_locked(Port guest_port) noexcept;  // its dom0 endpoint, if it has one
  void publish_locations_locked() noexcept;            // shared_info and every vcpu_info
  struct DirectWrite;                                  // begin()/end() as RAII

  const DomId domid_;
  const unsigned nr_vcpus_;
  const Port max_ports_;
  std::span<std::uint8_t> shared_info_;
  UpcallSink& sink_;

  mutable std::shared_mutex table_mu_;
  std::vector<Channel> ports_;                               // index = port
  std::vector<std::array<Port, kNrVirqs>> virq_to_port_;     // [vcpu][virq]; globals on vCPU 0
  std::vector<VcpuSlot> vcpus_;
  std::unique_ptr<VcpuInfo[]> placeholder_;                  // one per vCPU ≥ 32
  std::vector<std::unique_ptr<Dom0Endpoint>> dom0_;          // index = dom0 port; [0] unused
  SendRouteSink* route_sink_ = nullptr;
  DirectTable* direct_ = nullptr;
  const GuestMemory* direct_mem_ = nullptr;
  std::vector<std::uint64_t> lost_suspects_;                 // redeliver_lost_edges: [word]
};

}  // namespace xpv::domain
