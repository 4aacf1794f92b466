// `xpv bench evtchn` — event-channel notification costs, host clock (steady_clock).
//
// 1. Round trip through a dom0 endpoint, between two threads:
//      thread A (backend):      Dom0Port::notify() → from_dom0 eventfd ; Dom0Port::wait() on to_dom0
//      thread B (domain loop +  poll(kick fd) → service_dom0_kick() → port pending, pending_sel,
//                guest handler)  upcall_pending, sink → guest handler clears the bits and sends on
//                                the port → to_dom0 eventfd → A wakes.
//    Reference: a raw eventfd ping-pong between the same two threads with the same syscalls
//    (A: write + poll + read; B: poll + read + write). Ratio = xpv / reference, lower is better.
// 2. The in-shared-memory 2-level delivery path alone (send on an IPI port, one thread): a full
//    delivery (pending → sel → upcall_pending → sink) followed by the guest's clearing, and a
//    coalesced send (port already pending). No reference exists for these: the note says so.
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "bench/bench.h"
#include "xpv/domain/event_channels.h"

namespace {

using xpv::bench::Clock;
using xpv::bench::Result;
using namespace xpv::domain;

struct alignas(4096) SharedPage {
  std::uint8_t bytes[4096] = {};
};

// Called on the servicing thread; the guest handler on that same thread looks at `raised`.
class CountingSink final : public UpcallSink {
 public:
  void upcall(unsigned) noexcept override { raised.fetch_add(1, std::memory_order_relaxed); }
  std::atomic<std::uint64_t> raised{0};
};

// What a guest's 2-level upcall handler does for one known port on vCPU 0.
void guest_clear(SharedInfo& si, Port p) {
  std::atomic_ref<std::uint8_t>(si.vcpu_info[0].evtchn_upcall_pending)
      .store(0, std::memory_order_release);
  std::atomic_ref<std::uint64_t>(si.vcpu_info[0].evtchn_pending_sel)
      .exchange(0, std::memory_order_acq_rel);
  std::atomic_ref<std::uint64_t>(si.evtchn_pending[p / 64])
      .fetch_and(~(std::uint64_t{1} << (p % 64)), std::memory_order_acq_rel);
}

bool wait_readable(int fd) {
  pollfd pfd{fd, POLLIN, 0};
  for (;;) {
    int r = ::poll(&pfd, 1, 1000);
    if (r > 0) return true;
    if (r == 0) return false;  // timeout: let the caller look at its stop flag
    if (errno != EINTR) return false;
  }
}

template <class T>
T must(xpv::Expected<T, XenErrno> e, const char* what) {
  if (!e) throw std::runtime_error(std::string("evtchn bench: ") + what + ": " + to_string(e.error()));
  return std::move(e).value();
}

// Seconds per round trip through EventChannels' dom0 endpoint.
double xpv_round_trip(std::uint64_t warmup, std::uint64_t iters) {
  auto page = std::make_unique<SharedPage>();
  auto& si = *reinterpret_cast<SharedInfo*>(page->bytes);
  CountingSink sink;
  EventChannels ev(1, 1, {page->bytes, sizeof page->bytes}, sink);
  const Port p = must(ev.alloc_unbound(0), "alloc_unbound");
  Dom0Fds fds = must(ev.bind_to_dom0(p), "bind_to_dom0");
  const Port dp = fds.dom0_port;
  const int kick = ev.kick_fd(dp);
  Dom0Port backend(std::move(fds));
  (void)backend.consume();  // the binder's initial pending

  std::atomic<bool> stop{false};
  std::jthread domain([&] {
    std::uint64_t seen = 0;
    while (!stop.load(std::memory_order_acquire)) {
      if (!wait_readable(kick)) continue;
      (void)ev.service_dom0_kick(dp);
      const std::uint64_t r = sink.raised.load(std::memory_order_relaxed);
      if (r == seen) continue;
      seen = r;
      guest_clear(si, p);  // the guest's upcall handler …
      (void)ev.send(p);    // … answers on the same channel
    }
  });

  // A reply lost for 5 s means a broken path: stop rather than hang.
  auto once = [&] {
    (void)backend.notify();
    for (int tries = 0; backend.wait(1000).value_or(0) == 0; ++tries)
      if (tries == 5) {
        stop.store(true, std::memory_order_release);
        throw std::runtime_error("evtchn bench: no reply from the domain thread");
      }
  };
  for (std::uint64_t i = 0; i < warmup; ++i) once();
  const auto t0 = Clock::now();
  for (std::uint64_t i = 0; i < iters; ++i) once();
  const double secs = xpv::bench::seconds_since(t0);
  stop.store(true, std::memory_order_release);
  (void)backend.notify();  // wake the domain thread so it sees `stop`
  return secs / static_cast<double>(iters);
}

// Seconds per round trip of a raw eventfd ping-pong with the same syscalls.
double raw_round_trip(std::uint64_t warmup, std::uint64_t iters) {
  auto a = EventFd::create();
  auto b = EventFd::create();
  if (!a || !b) throw std::runtime_error("evtchn bench: eventfd failed");
  EventFd ping = std::move(*a);
  EventFd pong = std::move(*b);
  std::atomic<bool> stop{false};
  std::jthread peer([&] {
    while (!stop.load(std::memory_order_acquire)) {
      if (ping.wait(1000).value_or(0) == 0) continue;
      (void)pong.notify();
    }
  });
  auto once = [&] {
    (void)ping.notify();
    for (int tries = 0; pong.wait(1000).value_or(0) == 0; ++tries)
      if (tries == 5) {
        stop.store(true, std::memory_order_release);
        throw std::runtime_error("evtchn bench: no reply from the peer thread");
      }
  };
  for (std::uint64_t i = 0; i < warmup; ++i) once();
  const auto t0 = Clock::now();
  for (std::uint64_t i = 0; i < iters; ++i) once();
  const double secs = xpv::bench::seconds_since(t0);
  stop.store(true, std::memory_order_release);
  (void)ping.notify();
  return secs / static_cast<double>(iters);
}

struct DeliveryRates {
  double full_per_s;
  double coalesced_per_s;
};

DeliveryRates delivery_rates(std::uint64_t iters) {
  auto page = std::make_unique<SharedPage>();
  auto& si = *reinterpret_cast<SharedInfo*>(page->bytes);
  CountingSink sink;
  EventChannels ev(1, 1, {page->bytes, sizeof page->bytes}, sink);
  const Port p = must(ev.bind_ipi(0), "bind_ipi");

  auto t0 = Clock::now();
  for (std::uint64_t i = 0; i < iters; ++i) {
    (void)ev.send(p);
    guest_clear(si, p);
  }
  const double full = static_cast<double>(iters) / xpv::bench::seconds_since(t0);
  if (sink.raised.load() != iters) throw std::runtime_error("evtchn bench: lost an upcall");

  (void)ev.send(p);  // now pending: every further send stops at step 1
  t0 = Clock::now();
  for (std::uint64_t i = 0; i < iters; ++i) (void)ev.send(p);
  const double coalesced = static_cast<double>(iters) / xpv::bench::seconds_since(t0);
  return {full, coalesced};
}

std::vector<Result> run(const xpv::bench::Options& opt) {
  const auto scaled = [&](double n) {
    const auto v = static_cast<std::uint64_t>(n * opt.scale);
    return v < 100 ? std::uint64_t{100} : v;
  };
  const std::uint64_t rt_iters = scaled(100000);
  const std::uint64_t warmup = scaled(2000);

  // Reference and xpv alternate twice; the best (lowest) of each is kept, so a burst of noise
  // from other processes on the machine hurts neither side alone.
  double ref = 1e9, ours = 1e9;
  for (int round = 0; round < 2; ++round) {
    ref = std::min(ref, raw_round_trip(warmup, rt_iters));
    ours = std::min(ours, xpv_round_trip(warmup, rt_iters));
  }
  const DeliveryRates d = delivery_rates(scaled(5000000));

  std::vector<Result> rs;
  Result rt;
  rt.metric = "notify round trip (dom0 -> guest -> dom0)";
  rt.unit = "us";
  rt.xpv = ours * 1e6;
  rt.reference = ref * 1e6;
  rt.lower_is_better = true;
  rt.note = "reference: raw eventfd ping-pong between the same two threads, same syscalls; "
            "threads not pinned";
  rs.push_back(rt);

  Result full;
  full.metric = "2-level delivery, full (send + guest clear)";
  full.unit = "sends/s";
  full.xpv = d.full_per_s;
  full.note = "no reference: in-memory bit path only (pending, sel, upcall_pending, sink)";
  rs.push_back(full);

  Result co;
  co.metric = "2-level delivery, coalesced (already pending)";
  co.unit = "sends/s";
  co.xpv = d.coalesced_per_s;
  co.note = "no reference: in-memory bit path only (stops at the pending bit)";
  rs.push_back(co);
  return rs;
}

}  // namespace

XPV_BENCH_SUITE("evtchn", "event-channel notify round trip via dom0 eventfds; 2-level delivery rate",
                run);
