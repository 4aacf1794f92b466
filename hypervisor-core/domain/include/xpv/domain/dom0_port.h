// What a dom0 service (backend, xenstored) holds of one interdomain event channel to a domain.
//
// A domain process owns its event channels (EventChannels). When a dom0 service binds one of the
// domain's ports (through the domain control socket, the equivalent of the backend's
// EVTCHNOP_bind_interdomain), it receives two eventfds:
//
//     guest send(port) ──► to_dom0   ──► backend: wait()/consume()   (guest → dom0)
//     backend notify() ──► from_dom0 ──► domain event loop: service_dom0_kick() → port pending,
//                                        upcall to the guest          (dom0 → guest)
//
// Where the domain offers it (xpv-vmm), notify() delivers by itself instead: Dom0Notifier,
// implemented by direct_upcall.h's DirectUpcall; from_dom0 stays the fallback.
//
// Dom0Port wraps the two fds; it is the eventfd-backed `EventChannel` of DESIGN.md §2 (notify /
// wait), and what backends include — header-only, no link dependency on the domain library
// (CMake target xpv::domain_port).
//
// Threading: notify() may be called from any thread; wait()/consume() from one consumer thread
// at a time (typically the device's data-plane thread, which may instead put wait_fd() in its
// io_uring/epoll set and call consume() when it is readable).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "xpv/domain/event_fd.h"
#include "xpv/unique_fd.h"
#include "xpv/expected.h"

namespace xpv::domain {

// notify / wait: one end of an event channel as a backend sees it. Errors are positive errno.
class EventChannel {
 public:
  virtual ~EventChannel() = default;
  // Kick the other end (the guest): its port becomes pending and it gets an upcall.
  virtual Expected<void, int> notify() noexcept = 0;
  // Non-blocking: how many times the other end sent since the last consume (0 = none; sends may
  // coalesce, as event channels do).
  virtual Expected<std::uint64_t, int> consume() noexcept = 0;
  // Blocks up to timeout_ms (-1 = forever) for a send; returns the count, 0 on timeout.
  virtual Expected<std::uint64_t, int> wait(int timeout_ms) noexcept = 0;
  // Readable while a send is unconsumed (for epoll / io_uring poll).
  virtual int wait_fd() const noexcept = 0;
};

// The fds a domain hands out for one dom0-side endpoint (EventChannels::bind_to_dom0 /
// dom0_alloc_unbound). Both fds are dup'd for the receiver, who owns them; they are what the
// control socket passes with SCM_RIGHTS.
struct Dom0Fds {
  std::uint32_t dom0_port = 0;   // the dom0-side port number (what status() reports as remote)
  std::uint32_t guest_port = 0;  // the domain's port, 0 while the endpoint is unbound
  UniqueFd to_dom0;              // readable when the guest sent
  UniqueFd from_dom0;            // write to kick the guest
};

// Delivery without the domain's event loop (direct_upcall.h: DirectUpcall). kick() returns false
// when it cannot deliver; the port then writes from_dom0 as usual. Any thread.
class Dom0Notifier {
 public:
  virtual ~Dom0Notifier() = default;
  virtual bool kick(std::uint32_t dom0_port) noexcept = 0;
};

class Dom0Port final : public EventChannel {
 public:
  Dom0Port(UniqueFd to_dom0, UniqueFd from_dom0) noexcept
      : to_dom0_(std::move(to_dom0)), from_dom0_(std::move(from_dom0)) {}
  explicit Dom0Port(Dom0Fds&& fds) noexcept
      : Dom0Port(std::move(fds.to_dom0), std::move(fds.from_dom0)) {}
  // With a direct path: notify() tries direct->kick(dom0_port) first.
  Dom0Port(UniqueFd to_dom0, UniqueFd from_dom0, std::shared_ptr<Dom0Notifier> direct,
           std::uint32_t dom0_port) noexcept
      : to_dom0_(std::move(to_dom0)), from_dom0_(std::move(from_dom0)), direct_(std::move(direct)),
        dom0_port_(dom0_port) {}

  Expected<void, int> notify() noexcept override {
    if (direct_ && direct_->kick(dom0_port_)) return {};
    return from_dom0_.notify(1);
  }
  Expected<std::uint64_t, int> consume() noexcept override { return to_dom0_.consume(); }
  Expected<std::uint64_t, int> wait(int timeout_ms) noexcept override {
    return to_dom0_.wait(timeout_ms);
  }
  int wait_fd() const noexcept override { return to_dom0_.fd(); }

 private:
  EventFd to_dom0_;
  EventFd from_dom0_;
  std::shared_ptr<Dom0Notifier> direct_;
  std::uint32_t dom0_port_ = 0;
};

}  // namespace xpv::domain
