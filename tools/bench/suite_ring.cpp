// `xpv bench ring` — Xen shared rings between two threads pinned on two cores.
//
// What is measured (host steady_clock, best of five alternating runs of xpv and reference):
//  - stream round trips: the front end keeps the ring as full as it can (produce up to the free
//    slots, one push per batch), the back end pops every request, answers each and pushes the
//    responses once per batch, the front end pops the responses: completed requests per second,
//    for blkif (112-byte entries, 32 per page) and netif tx (12-byte entries, 256 per page), and
//    netif tx again with at most 8 requests per push (small pushes while the peer is busy: the
//    case event-index suppression is for);
//  - ping-pong: one request outstanding at a time, round-trip time in ns;
//  - notify rate: the fraction of pushes whose event-index check said "notify", with both sides
//    calling final_check (arming their event index) whenever they find nothing to do, as a real
//    front/back end does before it would sleep. Busy-polling keeps them awake here, so this is the
//    notification rate of a fully loaded pair, the case where suppression matters.
// Reference: the same traffic over two plain single-producer/single-consumer queues (requests,
// responses) with std::atomic head/tail indexes on separate cache lines, the same slot counts and
// element sizes, the same batching and the same idle policy; no notification protocol, no index
// validation, no copy-out barrier. ratio = xpv / reference.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "xpv/ring/blkif.h"
#include "xpv/ring/netif.h"
#include "xpv/ring/shared_ring.h"

namespace {

using namespace xpv::ring;
using xpv::bench::Clock;
using xpv::bench::Options;
using xpv::bench::Result;

// ---- machinery ----

struct PageDeleter {
  void operator()(std::uint8_t* p) const { ::operator delete[](p, std::align_val_t{4096}); }
};
struct Pages {
  explicit Pages(std::size_t bytes)
      : size(bytes), p(static_cast<std::uint8_t*>(::operator new[](bytes, std::align_val_t{4096}))) {
    std::memset(p.get(), 0, bytes);
  }
  std::span<std::uint8_t> span() const { return {p.get(), size}; }
  std::size_t size;
  std::unique_ptr<std::uint8_t[], PageDeleter> p;
};

// The two CPUs the threads are pinned to (the first two this process may run on), or none.
struct Cpus {
  int a = -1, b = -1;
  bool pinned() const { return a >= 0 && b >= 0; }
};
Cpus choose_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  Cpus c;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return c;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (!CPU_ISSET(i, &set)) continue;
    if (c.a < 0) {
      c.a = i;
    } else {
      c.b = i;
      break;
    }
  }
  if (c.b < 0) c.a = -1;
  return c;
}
void pin_self(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // best effort: unpinned still runs
}

// Idle policy shared by xpv and reference: spin with a pause, yield now and then (the machine may
// be shared).
inline void relax(unsigned& idle) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
  if (++idle % 64 == 0) std::this_thread::yield();
}

// Runs front() and back() on two pinned threads, released together; returns front()'s seconds.
template <class Front, class Back>
double run_pair(const Cpus& cpus, Front front, Back back) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  double secs = 0;
  std::thread tb([&] {
    pin_self(cpus.b);
    ready.fetch_add(1);
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    back();
  });
  std::thread ta([&] {
    pin_self(cpus.a);
    ready.fetch_add(1);
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    const auto t0 = Clock::now();
    front();
    secs = xpv::bench::seconds_since(t0);
  });
  while (ready.load() < 2) std::this_thread::yield();
  go.store(true, std::memory_order_release);
  ta.join();
  tb.join();
  return secs;
}

// ---- reference: a plain SPSC queue ----

// Layout over its span: [0, 64) head (consumer's index), [64, 128) tail (producer's index), then
// `slots` elements. Producer and consumer halves are separate objects, one per thread.
template <class T>
struct SpscMemory {
  static constexpr std::size_t kSlotsOffset = 128;
  static std::size_t bytes(std::uint32_t slots) { return kSlotsOffset + std::size_t{slots} * sizeof(T); }
  std::span<std::uint8_t> mem;
  std::uint32_t slots;
  std::atomic_ref<std::uint32_t> head() const { return std::atomic_ref(*reinterpret_cast<std::uint32_t*>(mem.data())); }
  std::atomic_ref<std::uint32_t> tail() const { return std::atomic_ref(*reinterpret_cast<std::uint32_t*>(mem.data() + 64)); }
  std::uint8_t* slot(std::uint32_t i) const { return mem.data() + kSlotsOffset + std::size_t{i & (slots - 1)} * sizeof(T); }
};

template <class T>
class SpscProducer {
 public:
  explicit SpscProducer(SpscMemory<T> m) : m_(m) {}
  void put(const T& v) {  // caller guarantees space (in-flight bound)
    std::memcpy(m_.slot(tail_++), &v, sizeof(T));
  }
  void publish() { m_.tail().store(tail_, std::memory_order_release); }

 private:
  SpscMemory<T> m_;
  std::uint32_t tail_ = 0;
};

template <class T>
class SpscConsumer {
 public:
  explicit SpscConsumer(SpscMemory<T> m) : m_(m) {}
  bool get(T& out) {
    if (head_ == tail_seen_) {
      tail_seen_ = m_.tail().load(std::memory_order_acquire);
      if (head_ == tail_seen_) return false;
    }
    std::memcpy(&out, m_.slot(head_++), sizeof(T));
    return true;
  }
  void release() { m_.head().store(head_, std::memory_order_release); }

 private:
  SpscMemory<T> m_;
  std::uint32_t head_ = 0;
  std::uint32_t tail_seen_ = 0;
};

// ---- workloads ----

struct Traffic {
  double secs = 0;
  std::uint64_t req_pushes = 0, req_notifies = 0, rsp_pushes = 0, rsp_notifies = 0;
  bool ok = true;
};

template <class Req, class Rsp, class MakeReq, class MakeRsp>
Traffic xpv_stream(const Cpus& cpus, std::uint64_t total, unsigned batch, MakeReq make_req,
                   MakeRsp make_rsp) {
  Pages page(kXenPageSize);
  FrontRing<Req, Rsp> front = std::move(*FrontRing<Req, Rsp>::init(page.span()));
  BackRing<Req, Rsp> back = std::move(*BackRing<Req, Rsp>::attach(page.span()));
  Traffic t;
  std::atomic<bool> failed{false};
  t.secs = run_pair(
      cpus,
      [&] {
        std::uint64_t sent = 0, received = 0;
        unsigned idle = 0;
        while (received < total && !failed.load(std::memory_order_relaxed)) {
          unsigned produced = 0;
          while (sent < total && produced < batch && !front.full()) {
            (void)front.produce_request(make_req(sent++));
            ++produced;
          }
          if (produced > 0) {
            ++t.req_pushes;
            t.req_notifies += front.push_requests();
          }
          unsigned got = 0;
          for (;;) {
            auto r = front.pop_response();
            if (!r) {
              if (r.error() != RingError::empty) failed = true;
              break;
            }
            ++got;
          }
          received += got;
          if (produced == 0 && got == 0) {
            auto more = front.final_check_for_responses();
            if (!more) failed = true;
            else if (!*more) relax(idle);
          }
        }
      },
      [&] {
        std::uint64_t served = 0;
        unsigned idle = 0;
        while (served < total && !failed.load(std::memory_order_relaxed)) {
          unsigned n = 0;
          while (n < batch) {
            auto r = back.pop_request();
            if (!r) {
              if (r.error() != RingError::empty) failed = true;
              break;
            }
            (void)back.produce_response(make_rsp(*r));
            ++n;
          }
          served += n;
          if (n > 0) {
            ++t.rsp_pushes;
            t.rsp_notifies += back.push_responses();
          } else {
            auto more = back.final_check_for_requests();
            if (!more) failed = true;
            else if (!*more) relax(idle);
          }
        }
      });
  t.ok = !failed;
  return t;
}

template <class Req, class Rsp, class MakeReq, class MakeRsp>
Traffic ref_stream(const Cpus& cpus, std::uint64_t total, std::uint32_t slots, unsigned batch,
                   MakeReq make_req, MakeRsp make_rsp) {
  Pages mem(SpscMemory<Req>::bytes(slots) + SpscMemory<Rsp>::bytes(slots) + 4096);
  SpscMemory<Req> reqm{mem.span().first(SpscMemory<Req>::bytes(slots)), slots};
  const std::size_t rsp_off = (SpscMemory<Req>::bytes(slots) + 63) / 64 * 64;
  SpscMemory<Rsp> rspm{mem.span().subspan(rsp_off, SpscMemory<Rsp>::bytes(slots)), slots};
  SpscProducer<Req> req_out(reqm);
  SpscConsumer<Req> req_in(reqm);
  SpscProducer<Rsp> rsp_out(rspm);
  SpscConsumer<Rsp> rsp_in(rspm);
  Traffic t;
  t.secs = run_pair(
      cpus,
      [&] {
        std::uint64_t sent = 0, received = 0;
        unsigned idle = 0;
        while (received < total) {
          unsigned produced = 0;
          while (sent < total && produced < batch && sent - received < slots) {
            req_out.put(make_req(sent++));
            ++produced;
          }
          if (produced > 0) req_out.publish();
          unsigned got = 0;
          Rsp r;
          while (rsp_in.get(r)) ++got;
          if (got > 0) rsp_in.release();
          received += got;
          if (produced == 0 && got == 0) relax(idle);
        }
      },
      [&] {
        std::uint64_t served = 0;
        unsigned idle = 0;
        while (served < total) {
          unsigned n = 0;
          Req r;
          while (n < batch && req_in.get(r)) {
            rsp_out.put(make_rsp(r));
            ++n;
          }
          served += n;
          if (n > 0) {
            req_in.release();
            rsp_out.publish();
          } else {
            relax(idle);
          }
        }
      });
  return t;
}

template <class Req, class Rsp, class MakeReq, class MakeRsp>
double xpv_pingpong(const Cpus& cpus, std::uint64_t rounds, MakeReq make_req, MakeRsp make_rsp) {
  Pages page(kXenPageSize);
  FrontRing<Req, Rsp> front = std::move(*FrontRing<Req, Rsp>::init(page.span()));
  BackRing<Req, Rsp> back = std::move(*BackRing<Req, Rsp>::attach(page.span()));
  std::atomic<bool> failed{false};
  const double secs = run_pair(
      cpus,
      [&] {
        unsigned idle = 0;
        for (std::uint64_t i = 0; i < rounds && !failed; ++i) {
          (void)front.produce_request(make_req(i));
          front.push_requests();
          for (;;) {
            auto r = front.pop_response();
            if (r) break;
            if (r.error() != RingError::empty) { failed = true; break; }
            relax(idle);
          }
        }
      },
      [&] {
        unsigned idle = 0;
        for (std::uint64_t i = 0; i < rounds && !failed; ++i) {
          for (;;) {
            auto r = back.pop_request();
            if (r) {
              (void)back.produce_response(make_rsp(*r));
              back.push_responses();
              break;
            }
            if (r.error() != RingError::empty) { failed = true; break; }
            relax(idle);
          }
        }
      });
  return failed ? 0 : secs;
}

template <class Req, class Rsp, class MakeReq, class MakeRsp>
double ref_pingpong(const Cpus& cpus, std::uint64_t rounds, std::uint32_t slots, MakeReq make_req,
                    MakeRsp make_rsp) {
  Pages mem(SpscMemory<Req>::bytes(slots) + SpscMemory<Rsp>::bytes(slots) + 4096);
  SpscMemory<Req> reqm{mem.span().first(SpscMemory<Req>::bytes(slots)), slots};
  const std::size_t rsp_off = (SpscMemory<Req>::bytes(slots) + 63) / 64 * 64;
  SpscMemory<Rsp> rspm{mem.span().subspan(rsp_off, SpscMemory<Rsp>::bytes(slots)), slots};
  SpscProducer<Req> req_out(reqm);
  SpscConsumer<Req> req_in(reqm);
  SpscProducer<Rsp> rsp_out(rspm);
  SpscConsumer<Rsp> rsp_in(rspm);
  return run_pair(
      cpus,
      [&] {
        unsigned idle = 0;
        for (std::uint64_t i = 0; i < rounds; ++i) {
          req_out.put(make_req(i));
          req_out.publish();
          Rsp r;
          while (!rsp_in.get(r)) relax(idle);
          rsp_in.release();
        }
      },
      [&] {
        unsigned idle = 0;
        for (std::uint64_t i = 0; i < rounds; ++i) {
          Req r;
          while (!req_in.get(r)) relax(idle);
          req_in.release();
          rsp_out.put(make_rsp(r));
          rsp_out.publish();
        }
      });
}

// ---- the two protocols ----

BlkifRequest blk_req(std::uint64_t i) {
  BlkifRequest r{};
  r.operation = kBlkifOpRead;
  r.nr_segments = 11;
  r.id = i;
  r.sector_number = i * 88;
  for (unsigned s = 0; s < kBlkifMaxSegmentsPerRequest; ++s) {
    r.seg[s] = {static_cast<GrantRef>(i + s), 0, 7, {}};
  }
  return r;
}
BlkifResponse blk_rsp(const BlkifRequest& r) { return {r.id, r.operation, 0, kBlkifRspOkay, {}}; }
NetifTxRequest tx_req(std::uint64_t i) {
  return {static_cast<GrantRef>(i), 0, kNettxfCsumBlank, static_cast<std::uint16_t>(i), 1514};
}
NetifTxResponse tx_rsp(const NetifTxRequest& r) { return {r.id, kNetifRspOkay}; }

// Runs per measurement, xpv and reference alternating; the best of each is kept. The machines this
// runs on are often shared, and the best run is the one least disturbed by other work.
constexpr int kReps = 5;

std::string where(const Cpus& cpus) {
  return cpus.pinned() ? " (threads pinned to cpus " + std::to_string(cpus.a) + "," +
                             std::to_string(cpus.b) + ")"
                       : " (fewer than 2 cpus: threads not pinned)";
}

// Stream round trips with at most `batch` requests per push (and responses per push), plus the
// notify fractions of the best xpv run.
template <class Req, class Rsp, class MakeReq, class MakeRsp>
void measure_stream(const std::string& name, RingIdx slots, unsigned batch, const Cpus& cpus,
                    const Options& opt, MakeReq make_req, MakeRsp make_rsp, std::vector<Result>& out) {
  const auto n = static_cast<std::uint64_t>(std::max(1000.0, 2'000'000 * opt.scale));
  double best_x = 0, best_r = 0;
  Traffic best_t;
  bool ok = true;
  for (int rep = 0; rep < kReps; ++rep) {  // alternate, keep the best of each
    Traffic t = xpv_stream<Req, Rsp>(cpus, n, batch, make_req, make_rsp);
    ok = ok && t.ok;
    if (t.secs > 0 && n / t.secs > best_x) {
      best_x = n / t.secs;
      best_t = t;
    }
    Traffic r = ref_stream<Req, Rsp>(cpus, n, slots, batch, make_req, make_rsp);
    if (r.secs > 0) best_r = std::max(best_r, n / r.secs);
  }
  const std::string shape = std::to_string(slots) + "-slot ring, <= " + std::to_string(batch) +
                            " per push";
  out.push_back({"ring." + name + ".roundtrips", "ops/s", ok ? best_x : 0, best_r,
                 "front pushes requests, back pops+answers+pushes, front pops; " + shape +
                     "; ref: two SPSC queues, same slots/element sizes/batching" + where(cpus)});
  const double req_frac =
      best_t.req_pushes ? double(best_t.req_notifies) / double(best_t.req_pushes) : 0;
  const double rsp_frac =
      best_t.rsp_pushes ? double(best_t.rsp_notifies) / double(best_t.rsp_pushes) : 0;
  out.push_back({"ring." + name + ".req_notify_fraction", "fraction", req_frac, std::nullopt,
                 "request pushes that would notify, of " + std::to_string(best_t.req_pushes) +
                     " (" + shape + "); no reference: an SPSC queue has no notification protocol"});
  out.push_back({"ring." + name + ".rsp_notify_fraction", "fraction", rsp_frac, std::nullopt,
                 "response pushes that would notify, of " + std::to_string(best_t.rsp_pushes) +
                     " (" + shape + "); no reference: an SPSC queue has no notification protocol"});
}

template <class Req, class Rsp, class MakeReq, class MakeRsp>
void measure_pingpong(const std::string& name, RingIdx slots, const Cpus& cpus, const Options& opt,
                      MakeReq make_req, MakeRsp make_rsp, std::vector<Result>& out) {
  const auto n = static_cast<std::uint64_t>(std::max(1000.0, 200'000 * opt.scale));
  double rtt_x = 0, rtt_r = 0;
  for (int rep = 0; rep < kReps; ++rep) {
    const double sx = xpv_pingpong<Req, Rsp>(cpus, n, make_req, make_rsp);
    if (sx > 0) rtt_x = rtt_x == 0 ? sx : std::min(rtt_x, sx);
    const double sr = ref_pingpong<Req, Rsp>(cpus, n, slots, make_req, make_rsp);
    if (sr > 0) rtt_r = rtt_r == 0 ? sr : std::min(rtt_r, sr);
  }
  Result rtt{"ring." + name + ".pingpong_rtt", "ns", rtt_x * 1e9 / n, rtt_r * 1e9 / n,
             "one request outstanding: push, back pops+answers+pushes, front pops; ref: SPSC queues" +
                 where(cpus)};
  rtt.lower_is_better = true;
  out.push_back(rtt);
}

std::vector<Result> run_ring(const Options& opt) {
  const Cpus cpus = choose_cpus();
  std::vector<Result> out;
  const RingIdx blk = blkif_ring_size(0), tx = netif_tx_ring_size(0);
  measure_stream<BlkifRequest, BlkifResponse>("blkif", blk, blk, cpus, opt, blk_req, blk_rsp, out);
  measure_stream<NetifTxRequest, NetifTxResponse>("netif_tx", tx, tx, cpus, opt, tx_req, tx_rsp, out);
  // Small pushes while the peer is busy: where event-index suppression saves notifications.
  measure_stream<NetifTxRequest, NetifTxResponse>("netif_tx.batch8", tx, 8, cpus, opt, tx_req,
                                                  tx_rsp, out);
  measure_pingpong<BlkifRequest, BlkifResponse>("blkif", blk, cpus, opt, blk_req, blk_rsp, out);
  measure_pingpong<NetifTxRequest, NetifTxResponse>("netif_tx", tx, cpus, opt, tx_req, tx_rsp, out);
  return out;
}

}  // namespace

XPV_BENCH_SUITE("ring", "Xen shared ring request/response traffic between two pinned threads", run_ring);
