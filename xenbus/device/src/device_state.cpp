#include "xpv/xenbus/device_state.h"

namespace xpv::xenbus {

const char* to_string(XenbusState s) noexcept {
  switch (s) {
    case XenbusState::unknown: return "Unknown";
    case XenbusState::initialising: return "Initialising";
    case XenbusState::init_wait: return "InitWait";
    case XenbusState::initialised: return "Initialised";
    case XenbusState::connected: return "Connected";
    case XenbusState::closing: return "Closing";
    case XenbusState::closed: return "Closed";
    case XenbusState::reconfiguring: return "Reconfiguring";
    case XenbusState::reconfigured: return "Reconfigured";
  }
  return "Invalid";
}

std::optional<XenbusState> parse_state(std::string_view node) noexcept {
  if (node.size() != 1 || node[0] < '0' || node[0] > '8') return std::nullopt;
  return static_cast<XenbusState>(node[0] - '0');
}

BackendStep backend_step(XenbusState backend, XenbusState frontend, bool online) noexcept {
  using S = XenbusState;
  using A = BackendAction;
  switch (frontend) {
    case S::initialising:
      // A frontend starting over after we closed: offer the device again.
      if (backend == S::closed && online) return {A::none, S::init_wait};
      // One that started over without our seeing it Closed (its Closed came and went between
      // two reads, or a reset that skipped it): finish closing, and the step above follows.
      if (backend == S::closing && online) return {A::disconnect, S::closed};
      // One that started over while we were Connected: its old rings are gone (a kdump or kexec
      // kernel resets its frontends, waiting 5 s at most for the backend at each step, while no
      // backend daemon ran to follow). Linux's netfront waits at Initialising for InitWait (its
      // blkfront sets up on seeing Connected instead), and Closing or Closed would close either
      // for good, so let go of the old rings and offer the device again at once.
      if (backend == S::connected) return {A::disconnect, online ? S::init_wait : S::closed};
      return {A::none, backend};
    case S::initialised:
    case S::connected:
      // Connect as soon as the frontend has published its rings, whichever of the two states we
      // catch it in. Only from InitWait: after a close we wait for the frontend to start over.
      if (backend == S::init_wait) return {A::connect, S::connected};
      return {A::none, backend};
    case S::closing:
      if (backend == S::connected || backend == S::init_wait) return {A::disconnect, S::closing};
      // Already closed (the frontend closed it before and came back to Closing): answer
      // Closing, as Linux's backends do, so the frontend moves on to Closed instead of waiting
      // out its shutdown timeout for a backend state change that would never come.
      if (backend == S::closed) return {A::none, S::closing};
      return {A::none, backend};
    case S::closed:
      if (!online) return {A::disconnect_remove, S::closed};
      if (backend == S::closed) return {A::none, backend};
      return {A::disconnect, S::closed};
    case S::unknown:
      // The frontend's directory is gone: the device is being destroyed.
      return {A::disconnect_remove, S::closed};
    case S::init_wait:
    case S::reconfiguring:
    case S::reconfigured:
      // InitWait is a backend state; the XDP handshake is not offered by this state machine.
      return {A::none, backend};
  }
  return {A::none, backend};
}

bool ErrorHold::lets_through(XenbusState frontend, bool online) noexcept {
  if (!held_) return true;
  using S = XenbusState;
  const bool closing = frontend == S::closing;
  if (closing) acked_ = true;
  const bool over = frontend == S::closed || frontend == S::unknown || !online || (acked_ && frontend == S::initialising);
  if (over) held_ = acked_ = false;
  return over || closing;
}

FrontendStep frontend_step(XenbusState frontend, XenbusState backend) noexcept {
  using S = XenbusState;
  using A = FrontendAction;
  switch (backend) {
    case S::init_wait:
      if (frontend == S::initialising) return {A::setup, S::initialised};
      return {A::none, frontend};
    case S::connected:
      if (frontend == S::initialised) return {A::connect, S::connected};
      // A backend that restarted straight into Connected while we were still setting up: set up
      // first; the next observation connects.
      if (frontend == S::initialising) return {A::setup, S::initialised};
      return {A::none, frontend};
    case S::closing:
      // The backend is going away (toolstack detach, or it answered our own Closing): stop and
      // go straight to Closed, as Linux's xenbus_frontend_closed does. Stopping at Closing would
      // leave both ends in Closing, since a backend moves on only when it sees Closed.
      if (frontend == S::connected || frontend == S::initialised || frontend == S::closing) {
        return {A::disconnect, S::closed};
      }
      return {A::none, frontend};
    case S::closed:
      if (frontend == S::closing || frontend == S::connected || frontend == S::initialised) {
        return {A::disconnect, S::closed};
      }
      return {A::none, frontend};
    case S::unknown:
    case S::initialising:
    case S::initialised:
    case S::reconfiguring:
    case S::reconfigured:
      return {A::none, frontend};
  }
  return {A::none, frontend};
}

}  // namespace xpv::xenbus
