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
