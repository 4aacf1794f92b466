// GuestEvents — the guest kernel's half of 2-level event channels, for a process domain: what a
// Linux guest's upcall handler does (the 2-level scan of drivers/xen/events), so that xpv's own
// frontends receive events exactly the way a stock guest does, through shared_info.
//
//   EventChannels (host side) sets pending → pending_sel → upcall_pending, then upcall()
//   upcall() only wakes the dispatcher (it runs under the EventChannels lock: no callbacks there)
//   dispatcher: upcall_pending := 0; sel := xchg(pending_sel, 0);
//               for each word in sel: bits := pending & ~mask; for each bit: clear pending, handler()
//
// Direct upcalls (enable_direct_upcalls): dom0 services set the pending bits in shared_info
// themselves and write the dispatcher's eventfd on the upcall_pending 0 → 1 edge
// (xpv/domain/direct_upcall.h), as they raise an HVM guest's upcall through KVM. A notification
// then wakes one thread of the domain process, the dispatcher, instead of two (the control
// thread that reads the kick, then the dispatcher).
//
// Threading: handlers run on the dispatcher thread (run()); bind/unbind from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include "xpv/domain/domain.h"
#include "xpv/domain/event_channels.h"
#include "xpv/domain/event_fd.h"

namespace xpv::frontends {

class GuestEvents final : public domain::UpcallSink {
 public:
  // shared_info: the domain's shared_info page (vcpu 0's legacy vcpu_info inside it).
  explicit GuestEvents(std::span<std::uint8_t> shared_info);

  void upcall(unsigned vcpu) noexcept override;

  // Lets dom0 services raise this domain's upcall themselves from now on (see above): hands `dom`
  // this dispatcher's eventfd as the upcall line of every vCPU and routes vCPU 0 to it (the only
  // vCPU whose events the dispatcher scans). `dom` must be the domain whose shared_info this
  // object reads. Call it before `dom`'s control thread runs, or on it. Throws what
  // Domain::enable_direct_upcalls throws, or std::system_error when no fd is left.
  void enable_direct_upcalls(domain::Domain& dom);

  // Handlers for ports; a port without a handler is cleared and dropped, as Linux does for an
  // event on an unbound irq.
  void set_handler(domain::Port port, std::function<void()> handler);
  void clear_handler(domain::Port port);

  // Runs until stop(); wakes on upcalls. dispatch() is one scan (tests call it directly).
  void run();
  void stop() noexcept { stopping_ = true; (void)wake_.notify(); }
  unsigned dispatch();

  // Upcalls that came through upcall() (EventChannels in this process); a direct upcall writes
  // the eventfd without passing here and is not counted.
  std::uint64_t upcalls() const noexcept { return upcalls_.load(std::memory_order_relaxed); }

 private:
  std::span<std::uint8_t> si_;
  domain::EventFd wake_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> upcalls_{0};
  std::mutex lock_;
  std::vector<std::function<void()>> handlers_;  // by port
};

}  // namespace xpv::frontends
