// The xenbus device state machine (io/xenbus.h), shared by xpv's backends and frontends.
//
// Each end of a split device publishes its state in its own xenstore directory (`state` node) and
// watches the other end's. The states, and the order in which a stock Linux frontend and xpv's
// backends walk them:
//
//      backend                                   frontend
//   1 Initialising  (toolstack created nodes)  1 Initialising
//   2 InitWait      (features published) ───►  reads features, grants rings, writes ring-ref,
//                                              event-channel, protocol
//   4 Connected ◄── (rings mapped, evtchn    ◄─ 3 Initialised
//                    bound, geometry written)
//                                          ───► 4 Connected
//   ... I/O ...
//   5 Closing   ◄── (rings unmapped)         ◄─ 5 Closing      (or the toolstack asks: backend
//   6 Closed                                 ─► 6 Closed        goes Closing first; a frontend
//                                                              that sees backend Closing stops
//                                                              and goes to Closed directly)
//   2 InitWait  ◄── (frontend reconnects:    ◄─ 1 Initialising
//                    module reload, kexec)
//   4 Connected → 2 InitWait                   ◄─ 1 Initialising (it started over and nobody saw
//                    (old rings let go)             it close: a backend restarted meanwhile)
//
// A frontend that skips a state (two watch events coalesce; Initialised → Connected before the
// backend looked) is handled by acting on the state it is in now, never on the path it took.
// Reconfiguring/Reconfigured (7/8) are netif's XDP headroom handshake and are only entered by
// a backend that offers it.
//
// Pure logic: no I/O. Callers read the peer state, ask what to do, do it, and publish `next`.
#pragma once

#include <optional>
#include <string_view>

namespace xpv::xenbus {

enum class XenbusState : int {
  unknown = 0,
  initialising = 1,
  init_wait = 2,
  initialised = 3,
  connected = 4,
  closing = 5,
  closed = 6,
  reconfiguring = 7,
  reconfigured = 8,
};

const char* to_string(XenbusState s) noexcept;

// The value of a `state` node: a decimal 0..8, nothing else. An absent node reads as unknown
// (the caller passes nullopt); garbage from an untrusted peer yields nullopt.
std::optional<XenbusState> parse_state(std::string_view node) noexcept;

// What a backend does when it observes the frontend's state.
enum class BackendAction {
  none,
  connect,           // map the rings, bind the event channel(s), publish geometry; then `next`
  disconnect,        // unmap rings, unbind; then publish `next`
  disconnect_remove, // frontend vanished / closed for good: disconnect, publish Closed, forget it
};

struct BackendStep {
  BackendAction action = BackendAction::none;
  XenbusState next;  // state to publish after the action succeeded (unchanged if none)
};

// `backend`: our current state; `frontend`: the peer's state (unknown if its node is gone).
// `online`: the toolstack still wants the device (its backend `online` node is 1); a device
// that is not online is removed once the frontend has closed.
BackendStep backend_step(XenbusState backend, XenbusState frontend, bool online) noexcept;

// A device whose backend reported an error (Linux's xenbus_dev_fatal: `error` node, state Closed
// or Closing) is held: nothing happens to it until the frontend acknowledged the error by
// closing, or the device goes away — no retry loop. Two exceptions: a frontend going down
// (Closing) is let through, so that backend_step answers Closing and it goes on to Closed
// instead of waiting out its shutdown timeout; and one that was Closing and is back at
// Initialising without our seeing its Closed (it came and went between two reads) has closed.
class ErrorHold {
 public:
  void hold() noexcept {
    held_ = true;
    acked_ = false;
  }
  bool held() const noexcept { return held_; }
  // Whether the backend acts on this observation (backend_step); ends the hold once it is over.
  bool lets_through(XenbusState frontend, bool online) noexcept;

 private:
  bool held_ = false;
  bool acked_ = false;  // the frontend has been Closing since the error
};

// What a frontend does when it observes the backend's state.
enum class FrontendAction {
  none,
  setup,       // read backend features, allocate/grant rings, publish ring refs; then `next`
  connect,     // backend is ready: start I/O; then `next`
  disconnect,  // stop I/O, end grants; then `next`
};

struct FrontendStep {
  FrontendAction action = FrontendAction::none;
  XenbusState next;
};

FrontendStep frontend_step(XenbusState frontend, XenbusState backend) noexcept;

}  // namespace xpv::xenbus
