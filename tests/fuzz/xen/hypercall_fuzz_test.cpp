// The Xen hypercall dispatcher (hypervisor-core/xen: Platform) driven by a hostile guest:
// seeded, bounded fuzzing over the unit tests' FakeHost (tests/unit/xen/fakes.h) and a real
// domain::EventChannels, as xpv-vmm wires them.
//
// Each seed is one domain (1, 4 or 34 vCPUs — vCPUs ≥ 32 start without a vcpu_info; any upcall
// mode offered; a host that may refuse the global callback vector) whose guest issues a few
// hundred steps:
//  - hypercalls with every known number and unknown ones, known and random sub-ops (upper halves
//    of 32-bit arguments set), calls from vCPUs that do not exist, argument pointers inside its
//    memory, at and across its end, before it, into a read-only window, 0, ~0 and random; the
//    argument structs filled with hostile values (ports, vCPUs, virqs, domids, gfns, grant-frame
//    indexes, map spaces, HVM param indexes, callback values, counts, extent lists, poll port
//    lists, shutdown reasons) or left as random bytes;
//  - raw writes to its RAM pages (shared_info and vcpu_info bits) and what its upcall handler
//    clears;
//  - host-side traffic: dom0 endpoints allocated, bound, closed, kicked both ways; virqs raised;
//    ports delivered; INTx EOIs; lost-edge scans.
//
// Invariants (each one breaks on a real bug):
//  - every call returns (ASan/UBSan in CI), never the dispatcher's catch-all (-ENOMEM: a handler
//    threw), with exactly the result Xen's ABI and hypervisor-core/README.md give for that input:
//    0, the documented positive value (version, page size, extents done) or a Xen errno; the
//    event-channel table is followed by a reference model of event_channels.h, so every
//    event_channel_op result, every port handed out and every status is exact;
//  - guest memory: each call writes exactly the bytes it documents (the struct copied out, the
//    errs[] of a batch, the runstate record, the version strings) and nothing else — a call that
//    faults writes nothing it should not, and the buffer is a heap block of its exact size, so an
//    access past it is an ASan error;
//  - the host: sched_op shutdown reports exactly the ABI's reason for a valid one (0..4) and
//    nothing for anything else, no other call shuts down; ballooning asks the host for exactly
//    the extents it reports done; console writes pass the guest's bytes whole or not at all, any
//    byte but printable ASCII and '\n' as '.'; upcalls are
//    injected only to vCPUs the guest can see (a vcpu_info it can read), only with a vector
//    ≥ 0x10 and only the one the guest chose for that vCPU (per-vCPU vector, else the global
//    callback vector); INTx is raised only in INTx mode; the host's upcall routes follow the
//    guest's choice; dom0 endpoints see exactly the kicks the guest sent;
//  - afterwards the platform still works: xen_version answers, the event-channel table matches
//    the model port by port, and a well-formed guest (EVTCHNOP_reset, shared_info at a fresh
//    page, a per-vCPU vector, bind_ipi + send, alloc_unbound + a dom0 backend both ways,
//    bind_interdomain to a dom0 endpoint) gets its events and upcalls exactly as the unit tests
//    expect.
// A failure prints its seed (SCOPED_TRACE); XPV_FUZZ_ITERATIONS=N runs seeds 1..N (default 500),
// XPV_FUZZ_SEED=S seed S alone.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fakes.h"
#include "xpv/test/fuzz_seeds.h"
#include "xpv/domain/dom0_port.h"
#include "xpv/domain/shared_info.h"

namespace xpv::xen::test {
namespace {

using namespace abi;
using domain::DomId;
using domain::EvtchnOp;
using domain::EvtchnStat;
using domain::kDomidSelf;
using domain::Port;
using domain::XenErrno;
using Rng = std::mt19937_64;

constexpr std::int64_t E(XenErrno e) noexcept { return domain::to_hypercall_result(e); }
const std::int64_t kEperm = E(XenErrno::eperm), kEnoent = E(XenErrno::enoent),
                   kEsrch = E(XenErrno::esrch), kEnxio = E(XenErrno::enxio),
                   kEnomem = E(XenErrno::enomem), kEfault = E(XenErrno::efault),
                   kEexist = E(XenErrno::eexist), kEinval = E(XenErrno::einval),
                   kEnospc = E(XenErrno::enospc), kEnosys = E(XenErrno::enosys);

constexpr Port kMaxPorts = domain::kEvtchn2lNrChannels;
constexpr unsigned kNrVirqs = domain::kNrVirqs;
constexpr std::uint64_t kRamGfn = 0x100;  // the guest's RAM pages: kRamGfn .. kRamGfn + kRamPages
constexpr std::uint64_t kRamPages = 16;
constexpr std::uint64_t kCheckGfn = 0x7'3c5a'9e1d;  // RAM the fuzzing guest never names
constexpr std::uint8_t kCheckVector = 0xf3;
constexpr std::size_t kMaxEndpoints = 24;  // dom0 endpoints alive at once (2 eventfds each)

using xpv::test::fuzz_seeds;

std::uint64_t u32(std::uint64_t v) { return static_cast<std::uint32_t>(v); }
bool is_xen_errno(std::int64_t rc) {
  for (const std::int64_t e : {kEperm, kEnoent, kEsrch, kEnxio, kEnomem, kEfault, kEexist, kEinval, kEnospc, kEnosys})
    if (rc == e) return true;
  return false;
}

// ---- guest-virtual memory ------------------------------------------------------------------------

struct Write {
  std::uint64_t gva = 0;
  std::vector<std::uint8_t> bytes;
  bool operator==(const Write&) const = default;
};

template <class T>
Write write_of(std::uint64_t gva, const T& v) {
  Write w{gva, std::vector<std::uint8_t>(sizeof v)};
  std::memcpy(w.bytes.data(), &v, sizeof v);
  return w;
}

// Writes as "offset+length" (offset in the guest buffer), with the bytes of short ones.
std::string show(const std::vector<Write>& ws) {
  static const char* const kHex = "0123456789abcdef";
  std::string s = "[";
  for (const Write& w : ws) {
    s += " " + std::to_string(w.gva - 0xffff'8880'0010'0000) + "+" + std::to_string(w.bytes.size());
    if (w.bytes.size() > 32) continue;
    s += ":";
    for (const std::uint8_t b : w.bytes) s += std::string{kHex[b >> 4], kHex[b & 15]};
  }
  return s + " ]";
}

// [kBase, kBase + kSize) is mapped: a heap block of exactly that size, so that a read or write
// past it is an ASan error. [kRoBegin, kRoEnd) is read-only (copy-out faults). Every write the
// platform makes is recorded.
class GuestMem final : public GuestVirt {
 public:
  static constexpr std::uint64_t kBase = 0xffff'8880'0010'0000;
  static constexpr std::size_t kSize = 16 * 1024;
  static constexpr std::uint64_t kRoBegin = kBase + 0x3000, kRoEnd = kBase + 0x3400;

  GuestMem() : bytes_(std::make_unique<std::uint8_t[]>(kSize)) {}

  bool read(std::uint64_t gva, std::span<std::uint8_t> out) noexcept override {
    if (!readable(gva, out.size())) return false;
    std::memcpy(out.data(), bytes_.get() + (gva - kBase), out.size());
    return true;
  }
  bool write(std::uint64_t gva, std::span<const std::uint8_t> in) noexcept override {
    if (!writable(gva, in.size())) return false;
    std::memcpy(bytes_.get() + (gva - kBase), in.data(), in.size());
    try {
      writes.push_back(Write{gva, {in.begin(), in.end()}});
    } catch (...) {
      return false;
    }
    return true;
  }

  static bool readable(std::uint64_t gva, std::size_t n) {
    return gva >= kBase && n <= kSize && gva - kBase <= kSize - n;
  }
  static bool writable(std::uint64_t gva, std::size_t n) {
    return readable(gva, n) && !(gva < kRoEnd && gva + n > kRoBegin);
  }
  template <class T>
  bool peek(std::uint64_t gva, T& out) const {
    if (!readable(gva, sizeof out)) return false;
    std::memcpy(&out, bytes_.get() + (gva - kBase), sizeof out);
    return true;
  }
  template <class T>
  void poke(std::uint64_t gva, const T& v) {  // the guest writing its own memory
    if (readable(gva, sizeof v)) std::memcpy(bytes_.get() + (gva - kBase), &v, sizeof v);
  }
  void copy_from(const GuestMem& o) { std::memcpy(bytes_.get(), o.bytes_.get(), kSize); }
  std::string text(std::uint64_t gva, std::size_t n) const {
    return std::string(reinterpret_cast<const char*>(bytes_.get() + (gva - kBase)), n);
  }
  void randomize(Rng& rng) {
    for (std::size_t i = 0; i < kSize; i += 8) {
      const std::uint64_t v = rng();
      std::memcpy(bytes_.get() + i, &v, 8);
    }
  }

  std::vector<Write> writes;  // since the last clear, in order

 private:
  std::unique_ptr<std::uint8_t[]> bytes_;
};

// ---- the event-channel reference model -----------------------------------------------------------

// event_channels.h's port table and dom0 endpoints, written from its documentation: states,
// peers, notify vCPUs, virq bindings, and the kicks each dom0 endpoint's eventfds count.
class EvtchnModel {
 public:
  enum class St : std::uint8_t { closed, unbound, interdomain, virq, ipi };
  struct Ch {
    St st = St::closed;
    DomId rdom = 0;
    Port rport = 0;
    std::uint32_t vcpu = 0;
    std::uint32_t virq = 0;
  };
  struct Endpoint {
    Port guest_port = 0;       // 0: unbound
    std::uint64_t to_dom0 = 0;  // kicks the backend has not consumed
    std::uint64_t from_dom0 = 0;  // backend kicks the event loop has not serviced
  };

  EvtchnModel(DomId domid, unsigned vcpus) : ports(kMaxPorts), virqs(vcpus), domid_(domid), vcpus_(vcpus) {
    for (auto& t : virqs) t.fill(0);
    dom0.resize(1);
  }

  std::optional<Port> free_port() const {
    for (Port p = 1; p < kMaxPorts; ++p)
      if (ports[p].st == St::closed) return p;
    return std::nullopt;
  }

  std::int64_t alloc_unbound(DomId rdom, Port* out) {
    const auto p = free_port();
    if (!p) return kEnospc;
    ports[*p] = Ch{St::unbound, rdom == kDomidSelf ? domid_ : rdom, 0, 0, 0};
    *out = *p;
    return 0;
  }
  std::int64_t bind_interdomain(DomId rdom_in, Port rport, Port* out) {
    const DomId rdom = rdom_in == kDomidSelf ? domid_ : rdom_in;
    if (rdom != domid_ && rdom != 0) return kEsrch;
    const auto l = free_port();
    if (!l) return kEnospc;
    if (rdom == domid_) {
      if (rport >= kMaxPorts || ports[rport].st != St::unbound || ports[rport].rdom != domid_) return kEinval;
      ports[rport].st = St::interdomain;
      ports[rport].rdom = domid_;
      ports[rport].rport = *l;
    } else {
      if (!endpoint(rport) || dom0[rport]->guest_port != 0) return kEinval;
      dom0[rport]->guest_port = *l;
    }
    ports[*l] = Ch{St::interdomain, rdom, rport, 0, 0};
    *out = *l;
    return 0;
  }
  std::int64_t bind_virq(std::uint32_t virq, std::uint32_t vcpu, Port* out) {
    if (virq >= kNrVirqs) return kEinval;
    if (domain::virq_is_global(virq) && vcpu != 0) return kEinval;
    if (vcpu >= vcpus_) return kEnoent;
    if (virqs[vcpu][virq] != 0) return kEexist;
    const auto p = free_port();
    if (!p) return kEnospc;
    ports[*p] = Ch{St::virq, 0, 0, vcpu, virq};
    virqs[vcpu][virq] = *p;
    *out = *p;
    return 0;
  }
  std::int64_t bind_ipi(std::uint32_t vcpu, Port* out) {
    if (vcpu >= vcpus_) return kEnoent;
    const auto p = free_port();
    if (!p) return kEnospc;
    ports[*p] = Ch{St::ipi, 0, 0, vcpu, 0};
    *out = *p;
    return 0;
  }
  std::int64_t bind_vcpu(Port p, std::uint32_t vcpu) {
    if (vcpu >= vcpus_) return kEnoent;
    if (p >= kMaxPorts) return kEinval;
    Ch& c = ports[p];
    if ((c.st == St::virq && domain::virq_is_global(c.virq)) || c.st == St::unbound || c.st == St::interdomain) {
      c.vcpu = vcpu;
      return 0;
    }
    return kEinval;
  }
  std::int64_t send(Port p) {
    if (p >= kMaxPorts) return kEinval;
    const Ch& c = ports[p];
    if (c.st == St::interdomain) {
      if (c.rdom != domid_) ++dom0[c.rport]->to_dom0;
      return 0;
    }
    return c.st == St::ipi || c.st == St::unbound ? 0 : kEinval;
  }
  std::int64_t unmask(Port p) const { return p < kMaxPorts ? 0 : kEinval; }
  std::int64_t close(Port p) {
    if (p >= kMaxPorts || ports[p].st == St::closed) return kEinval;
    close_port(p);
    return 0;
  }
  void reset() {
    for (Port p = 1; p < kMaxPorts; ++p)
      if (ports[p].st != St::closed) close_port(p);
  }

  // Host side.
  std::int64_t raise_virq(std::uint32_t virq, std::uint32_t vcpu) const {
    if (virq >= kNrVirqs || vcpu >= vcpus_) return kEinval;
    return virqs[domain::virq_is_global(virq) ? 0 : vcpu][virq] != 0 ? 0 : kEnoent;
  }
  std::int64_t deliver(Port p) const { return p < kMaxPorts && ports[p].st != St::closed ? 0 : kEinval; }
  bool endpoint(Port dp) const { return dp != 0 && dp < dom0.size() && dom0[dp].has_value(); }
  Port new_endpoint() {
    for (Port i = 1; i < dom0.size(); ++i) {
      if (!dom0[i]) {
        dom0[i] = Endpoint{};
        return i;
      }
    }
    dom0.emplace_back(Endpoint{});
    return static_cast<Port>(dom0.size() - 1);
  }
  std::int64_t bind_to_dom0(Port gp, Port* dp) {
    if (gp >= kMaxPorts || ports[gp].st != St::unbound || ports[gp].rdom != 0) return kEinval;
    *dp = new_endpoint();
    dom0[*dp]->guest_port = gp;
    dom0[*dp]->to_dom0 = 1;  // the binder's new port starts pending: the backend looks once
    ports[gp].st = St::interdomain;
    ports[gp].rdom = 0;
    ports[gp].rport = *dp;
    return 0;
  }
  std::int64_t dom0_close(Port dp) {
    if (!endpoint(dp)) return kEinval;
    if (const Port gp = dom0[dp]->guest_port; gp != 0) {
      ports[gp].st = St::unbound;  // notify vCPU kept
      ports[gp].rdom = 0;
      ports[gp].rport = 0;
    }
    dom0[dp].reset();
    return 0;
  }

  // What EVTCHNOP_status writes back for `in`.
  domain::EvtchnStatusOp status_op(const domain::EvtchnStatusOp& in) const {
    domain::EvtchnStatusOp s = in;
    const Ch& c = ports[in.port];
    s.vcpu = c.vcpu;
    std::memset(&s.u, 0, sizeof s.u);
    switch (c.st) {
      case St::closed: s.status = static_cast<std::uint32_t>(EvtchnStat::closed); break;
      case St::unbound:
        s.status = static_cast<std::uint32_t>(EvtchnStat::unbound);
        s.u.unbound.dom = c.rdom;
        break;
      case St::interdomain:
        s.status = static_cast<std::uint32_t>(EvtchnStat::interdomain);
        s.u.interdomain.dom = c.rdom;
        s.u.interdomain.port = c.rport;
        break;
      case St::virq:
        s.status = static_cast<std::uint32_t>(EvtchnStat::virq);
        s.u.virq = c.virq;
        break;
      case St::ipi: s.status = static_cast<std::uint32_t>(EvtchnStat::ipi); break;
    }
    return s;
  }

  // Ports in use, for the argument generator.
  std::vector<Port> live() const {
    std::vector<Port> v;
    for (Port p = 1; p < kMaxPorts; ++p)
      if (ports[p].st != St::closed) v.push_back(p);
    return v;
  }

  std::vector<Ch> ports;
  std::vector<std::array<Port, kNrVirqs>> virqs;  // [vcpu][virq]; global virqs on vCPU 0
  std::vector<std::optional<Endpoint>> dom0;       // [dom0 port]; [0] unused

 private:
  void close_port(Port p) {
    Ch& c = ports[p];
    if (c.st == St::virq) {
      for (auto& t : virqs)
        if (t[c.virq] == p) t[c.virq] = 0;
    } else if (c.st == St::interdomain) {
      if (c.rdom == domid_) {
        Ch& peer = ports[c.rport];  // waits for a new connection from us; notify vCPU kept
        peer.st = St::unbound;
        peer.rdom = domid_;
        peer.rport = 0;
      } else {
        dom0[c.rport]->guest_port = 0;
        ++dom0[c.rport]->to_dom0;  // the backend is woken once
      }
    }
    c = Ch{};
  }

  DomId domid_;
  unsigned vcpus_;
};

// ---- one domain and its hostile guest ------------------------------------------------------------

class World {
 public:
  explicit World(std::uint64_t seed) : rng_(seed) {
    static const unsigned kVcpus[] = {1, 4, 34};
    static const UpcallMode kModes[] = {UpcallMode::vcpu_vector, UpcallMode::callback_vector, UpcallMode::intx};
    cfg_ = test_config(kModes[rng_() % 3]);
    cfg_.vcpus = kVcpus[rng_() % 3];
    cfg_.max_grant_frames = std::array<std::uint32_t, 3>{1, 32, 64}[rng_() % 3];
    if (rng_() % 4 == 0) {
      host_.refuse_callback_vectors();
      refusing_ = true;
    }
    for (std::uint64_t g = kRamGfn; g < kRamGfn + kRamPages; ++g) ram_.push_back(&host_.add_ram(g));
    check_page_ = &host_.add_ram(kCheckGfn);
    placeholder_ = std::make_unique<Page>();
    platform_ = std::make_unique<Platform>(cfg_, host_);
    ev_ = std::make_unique<domain::EventChannels>(cfg_.domid, cfg_.vcpus, placeholder_->span(), *platform_);
    platform_->attach(*ev_);
    model_.emplace(cfg_.domid, cfg_.vcpus);
    vcpu_vector_.assign(cfg_.vcpus, 0);
    registered_.assign(cfg_.vcpus, false);
    check_vcpu_ = static_cast<unsigned>(rng_() % std::min(cfg_.vcpus, domain::kLegacyMaxVcpus));
    mem_.randomize(rng_);
  }
  ~World() {
    backends_.clear();
    ev_.reset();  // the event channels call into the platform: destroy them first
    platform_.reset();
  }
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  // The hostile guest (and host traffic) for `steps` steps; stops at the first failure.
  void fuzz(unsigned steps) {
    for (step_ = 0; step_ < steps && !::testing::Test::HasFailure(); ++step_) {
      const unsigned r = static_cast<unsigned>(rng_() % 100);
      if (r < 7) xen_version();
      else if (r < 20) memory_op();
      else if (r < 31) hvm_op();
      else if (r < 40) vcpu_op();
      else if (r < 66) event_channel_op();
      else if (r < 71) grant_table_op();
      else if (r < 76) sched_op();
      else if (r < 79) console_io();
      else if (r < 86) unknown_hypercall();
      else if (r < 92) guest_writes_its_pages();
      else host_traffic();
    }
  }

  void expect_model_matches();
  void expect_still_works();

  // How often each hypercall number (kNrHypercalls: any above) answered 0, > 0 and < 0, over
  // every World: that the fuzzer reaches the successful paths too.
  static inline std::array<std::array<std::uint64_t, 3>, kNrHypercalls + 1> results{};

 private:
  // ---- random values -----------------------------------------------------------------------------
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool one_in(unsigned n) { return rng_() % n == 0; }
  std::uint64_t high_bits() { return one_in(4) ? (rng_() << 32) : 0; }  // for 32-bit arguments

  std::uint32_t any_port() {
    const auto live = model_->live();
    switch (below(10)) {
      case 0: return 0;
      case 1: return static_cast<std::uint32_t>(1 + below(4));
      case 2: return std::array<std::uint32_t, 6>{63, 64, 4095, 4096, 4097, 0x7fffffff}[below(6)];
      case 3: return static_cast<std::uint32_t>(rng_());
      default: return live.empty() ? static_cast<std::uint32_t>(1 + below(8)) : live[below(live.size())];
    }
  }
  std::uint32_t any_vcpu() {
    if (!one_in(6)) return static_cast<std::uint32_t>(below(cfg_.vcpus));
    return std::array<std::uint32_t, 6>{cfg_.vcpus, 31, 32, 33, 0xffffffff, static_cast<std::uint32_t>(rng_())}[below(6)];
  }
  DomId any_domid() {
    if (!one_in(4)) return kDomidSelf;
    return std::array<DomId, 7>{cfg_.domid, 0, static_cast<DomId>(cfg_.domid + 1), static_cast<DomId>(cfg_.domid - 1),
                                0x7ff1, 0xffff, static_cast<DomId>(rng_())}[below(7)];
  }
  std::uint64_t any_gfn() {
    switch (below(8)) {
      case 0: return cfg_.grant_frames_gfn + below(cfg_.max_grant_frames + 2);
      case 1: return std::array<std::uint64_t, 6>{0, cfg_.store_gfn, cfg_.console_gfn, ~0ull, 1ull << 52,
                                                  kRamGfn + kRamPages}[below(6)];
      case 2: return rng_();
      case 3: return kRamGfn - 1 - below(4);
      default: return kRamGfn + below(kRamPages);
    }
  }
  // A guest pointer for an argument of `size` bytes.
  std::uint64_t any_ptr(std::size_t size) {
    constexpr std::uint64_t kBase = GuestMem::kBase;
    constexpr std::uint64_t kEnd = kBase + GuestMem::kSize;
    switch (below(24)) {
      case 0: return kEnd - below(size + 1);  // across the end, or just past it
      case 1: return kBase - 1 - below(32);  // before the start
      case 2: return 0;
      case 3: return ~0ull - below(64);
      case 4: return rng_();
      case 5: return GuestMem::kRoBegin + 8 * below((GuestMem::kRoEnd - GuestMem::kRoBegin - size) / 8);  // read-only
      case 6: return GuestMem::kRoEnd - 1 - below(size);  // ends in the read-only window
      case 7: return kBase + below(GuestMem::kSize - size + 1);  // unaligned
      default: return kBase + 8 * below((GuestMem::kSize - size) / 8 + 1);
    }
  }
  // Writes `v` at `gva` (where it fits) most of the time; else the guest's memory stays as it is.
  template <class T>
  void put(std::uint64_t gva, const T& v) {
    if (!one_in(5)) mem_.poke(gva, v);
  }

  // ---- one hypercall and the checks every call gets ----------------------------------------------
  std::string ctx() const {
    if (host_op_ != nullptr) return "step " + std::to_string(step_) + ": " + host_op_;
    return "step " + std::to_string(step_) + ": hypercall " + std::to_string(regs_.rax) + " (" +
           std::to_string(regs_.rdi) + ", " + std::to_string(regs_.rsi) + ", " + std::to_string(regs_.rdx) +
           ") on vCPU " + std::to_string(vcpu_);
  }
  unsigned caller() { return one_in(40) ? cfg_.vcpus + static_cast<unsigned>(below(3)) : static_cast<unsigned>(below(cfg_.vcpus)); }

  // Issues the call and checks what every call must keep (no catch-all, a Xen errno, the
  // counters, no shutdown); the family then checks its exact result with expect().
  std::int64_t call(std::uint64_t nr, std::uint64_t a1, std::uint64_t a2, std::uint64_t a3, unsigned vcpu) {
    regs_ = Regs{nr, a1, a2, a3, rng_(), rng_()};
    vcpu_ = vcpu;
    host_op_ = nullptr;
    mem_.writes.clear();
    const auto shutdowns = host_.shutdowns().size();
    const std::uint64_t calls = platform_->calls(static_cast<unsigned>(std::min<std::uint64_t>(nr, 64)));
    const std::uint64_t sub = u32(a1);
    const std::uint64_t sub_calls = nr == kHcEventChannelOp ? platform_->evtchn_calls(static_cast<unsigned>(std::min<std::uint64_t>(sub, 99)))
                                    : nr == kHcSchedOp     ? platform_->sched_calls(static_cast<unsigned>(std::min<std::uint64_t>(sub, 99)))
                                                           : 0;
    const std::int64_t rc = platform_->hypercall(vcpu, regs_, mem_);
    if (vcpu < cfg_.vcpus) ++results[nr < kNrHypercalls ? nr : kNrHypercalls][rc == 0 ? 0 : rc > 0 ? 1 : 2];
    EXPECT_NE(rc, kEnomem) << ctx() << ": the dispatcher's catch-all answered (a handler threw)";
    if (rc < 0) {
      EXPECT_TRUE(is_xen_errno(rc)) << ctx() << ": " << rc << " is not a Xen errno";
    }
    if (nr < kNrHypercalls) {
      EXPECT_EQ(platform_->calls(static_cast<unsigned>(nr)), calls + 1) << ctx();
    }
    if ((nr == kHcEventChannelOp || nr == kHcSchedOp) && sub < Platform::kSubOps) {
      EXPECT_EQ(nr == kHcEventChannelOp ? platform_->evtchn_calls(static_cast<unsigned>(sub))
                                        : platform_->sched_calls(static_cast<unsigned>(sub)),
                sub_calls + 1)
          << ctx();
    }
    if (!(nr == kHcSchedOp && sub == kSchedopShutdown && vcpu < cfg_.vcpus)) {
      EXPECT_EQ(host_.shutdowns().size(), shutdowns) << ctx() << ": only sched_op shutdown shuts down";
    }
    return rc;
  }
  bool bad_caller() const { return vcpu_ >= cfg_.vcpus; }
  // The result and the guest-memory writes of the call just made.
  void expect(std::int64_t rc, std::int64_t want, const std::vector<Write>& writes = {}) {
    EXPECT_EQ(rc, want) << ctx();
    EXPECT_TRUE(mem_.writes == writes) << ctx() << ": wrote " << show(mem_.writes) << ", expected " << show(writes);
    expect_upcalls();
  }
  // A call from a vCPU that does not exist: -EINVAL and nothing else.
  bool refused_caller(std::int64_t rc) {
    if (!bad_caller()) return false;
    expect(rc, kEinval);
    return true;
  }

  // ---- upcalls ------------------------------------------------------------------------------------
  // What an HVM_PARAM_CALLBACK_IRQ value asks for (XEN-GUEST-ABI.md "Upcalls").
  static std::uint8_t global_vector(std::uint64_t cb) {
    return (cb >> kCallbackTypeShift) == kCallbackTypeVector && (cb & 0xff) >= 0x10 ? static_cast<std::uint8_t>(cb & 0xff)
                                                                                    : 0;
  }
  static bool intx_mode(std::uint64_t cb) {
    const std::uint64_t type = cb >> kCallbackTypeShift;
    return type == kCallbackTypePciIntx || (type == kCallbackTypeGsi && cb != 0);
  }
  std::uint8_t route(unsigned v) const { return vcpu_vector_[v] != 0 ? vcpu_vector_[v] : global_vector(callback_irq_); }
  bool guest_visible(unsigned v) const { return v < domain::kLegacyMaxVcpus || registered_[v]; }

  // Every injection since the last look went to a vCPU the guest can see, with the vector the
  // guest chose for it; INTx only in INTx mode; the host's routes are the guest's choice.
  void expect_upcalls() {
    for (const auto& [v, vec] : host_.injected()) {
      ASSERT_LT(v, cfg_.vcpus) << ctx();
      EXPECT_TRUE(guest_visible(v)) << ctx() << ": upcall to vCPU " << v << ", which has no vcpu_info the guest can see";
      EXPECT_GE(vec, 0x10) << ctx() << ": vector " << int{vec} << " injected";
      EXPECT_EQ(vec, route(v)) << ctx() << ": vCPU " << v << " got vector " << int{vec};
    }
    for (const bool level : host_.intx())
      EXPECT_TRUE(!level || intx_mode(callback_irq_)) << ctx() << ": INTx raised outside INTx mode";
    host_.clear();
    const auto routes = host_.routes();
    if (routes_published_) {
      ASSERT_EQ(routes.size(), cfg_.vcpus) << ctx();
      for (const auto& [v, vec] : routes) EXPECT_EQ(vec, route(v)) << ctx() << ": route of vCPU " << v;
    } else {
      EXPECT_TRUE(routes.empty()) << ctx();
    }
  }

  // ---- the hypercall families ----------------------------------------------------------------------
  void xen_version() {
    const std::uint64_t sub = one_in(8) ? rng_() : below(10);
    std::uint64_t arg = any_ptr(1024);
    if (sub == kXenverGetFeatures) {
      arg = any_ptr(sizeof(FeatureInfo));
      put(arg, FeatureInfo{static_cast<std::uint32_t>(one_in(3) ? rng_() : below(2)), static_cast<std::uint32_t>(rng_())});
    }
    const std::int64_t rc = call(kHcXenVersion, sub | high_bits(), arg, rng_(), caller());
    if (refused_caller(rc)) return;
    auto out = [&](std::size_t n, const std::string& text) {
      std::vector<std::uint8_t> b(n, 0);
      std::memcpy(b.data(), text.data(), std::min(n, text.size()));
      if (!GuestMem::writable(arg, n)) return expect(rc, kEfault);
      expect(rc, 0, {Write{arg, b}});
    };
    switch (u32(sub)) {
      case kXenverVersion: return expect(rc, (std::int64_t{cfg_.version_major} << 16) | cfg_.version_minor);
      case kXenverPagesize: return expect(rc, 4096);
      case kXenverExtraversion: return out(kExtraversionLen, ".0");
      case kXenverCapabilities: return out(kCapabilitiesLen, "hvm-3.0-x86_64");
      case kXenverChangeset: return out(kChangesetLen, "xpv (no Xen changeset)");
      case kXenverPlatformParameters: return out(sizeof(PlatformParameters), "");
      case kXenverGuestHandle: return out(kDomainHandleLen, "");
      case kXenverCompileInfo: {
        std::string ci = "xpv: Xen HVM ABI on KVM, not Xen";
        ci.resize(64, '\0');
        return out(sizeof(CompileInfo), ci + "xpv");
      }
      case kXenverGetFeatures: {
        FeatureInfo fi{};
        if (!mem_.peek(arg, fi)) return expect(rc, kEfault);
        if (fi.submap_idx >= kFeatNrSubmaps) return expect(rc, kEinval);
        fi.submap = 1u << kFeatAutoTranslatedPhysmap;
        if (cfg_.upcall != UpcallMode::intx) fi.submap |= 1u << kFeatHvmCallbackVector;
        if (!GuestMem::writable(arg, sizeof fi)) return expect(rc, kEfault);
        return expect(rc, 0, {write_of(arg, fi)});
      }
      default: return expect(rc, kEnosys);
    }
  }

  // XENMEM_add_to_physmap's effect for one (space, idx, gpfn): the model's half.
  std::int64_t add_to_physmap(std::uint32_t space, std::uint64_t idx, std::uint64_t gpfn) {
    switch (space) {
      case kMapspaceSharedInfo:
        if (idx != 0 || !ram_gfn(gpfn)) return kEinval;
        shared_info_mapped_ = true;
        return 0;
      case kMapspaceGrantTable:
        if ((idx & kMapidxGrantTableStatus) || idx >= cfg_.max_grant_frames || gpfn != cfg_.grant_frames_gfn + idx)
          return kEinval;
        grant_frames_ = std::max(grant_frames_, static_cast<std::uint32_t>(idx + 1));
        return 0;
      default: return kEnosys;
    }
  }
  bool ram_gfn(std::uint64_t g) const { return (g >= kRamGfn && g < kRamGfn + kRamPages) || g == kCheckGfn; }
  std::uint64_t any_idx() {
    switch (below(6)) {
      case 0: return kMapidxGrantTableStatus | below(4);
      case 1: return rng_();
      case 2: return cfg_.max_grant_frames + below(2);
      default: return below(cfg_.max_grant_frames);
    }
  }
  std::uint32_t any_space() { return one_in(5) ? static_cast<std::uint32_t>(one_in(2) ? rng_() : 2 + below(4)) : static_cast<std::uint32_t>(below(2)); }

  void memory_op() {
    static const std::uint64_t kCmds[] = {kXenmemAddToPhysmap, kXenmemAddToPhysmapBatch, kXenmemDecreaseReservation,
                                          kXenmemPopulatePhysmap, kXenmemIncreaseReservation};
    const std::uint64_t cmd = one_in(8) ? (one_in(2) ? rng_() : (1ull << 32) | kXenmemAddToPhysmap) : kCmds[below(5)];
    const unsigned vcpu = caller();
    if (cmd == kXenmemAddToPhysmap) {
      const std::uint64_t arg = any_ptr(sizeof(AddToPhysmap));
      const bool grant = one_in(2);
      const std::uint64_t idx = grant ? any_idx() : (one_in(6) ? rng_() : 0);
      put(arg, AddToPhysmap{any_domid(), static_cast<std::uint16_t>(rng_()), grant ? kMapspaceGrantTable : any_space(), idx,
                            grant && !one_in(4) ? cfg_.grant_frames_gfn + (idx & 0xffff) : any_gfn()});
      AddToPhysmap a{};
      const bool readable = mem_.peek(arg, a);
      const std::int64_t rc = call(kHcMemoryOp, cmd, arg, rng_(), vcpu);
      if (refused_caller(rc)) return;
      if (!readable) return expect(rc, kEfault);
      if (a.domid != kDomidSelf && a.domid != cfg_.domid) return expect(rc, kEperm);
      return expect(rc, add_to_physmap(a.space, a.idx, a.gpfn));
    }
    if (cmd == kXenmemAddToPhysmapBatch) return add_to_physmap_batch(vcpu);
    if (cmd == kXenmemDecreaseReservation || cmd == kXenmemPopulatePhysmap) return reservation(cmd, vcpu);
    const std::int64_t rc = call(kHcMemoryOp, cmd, any_ptr(32), rng_(), vcpu);
    if (refused_caller(rc)) return;
    expect(rc, kEnosys);
  }

  void add_to_physmap_batch(unsigned vcpu) {
    const std::uint64_t arg = any_ptr(sizeof(AddToPhysmapBatch));
    const std::uint16_t size = static_cast<std::uint16_t>(one_in(10) ? rng_() : below(9));
    const std::uint16_t space = static_cast<std::uint16_t>(one_in(6) ? rng_() : below(2));
    const std::uint64_t idxs = any_ptr(8u * size), gpfns = any_ptr(8u * size);
    const std::uint64_t errs = one_in(8) ? idxs + 8 * below(size + 1) : any_ptr(4u * size);  // may overlap the inputs
    put(arg, AddToPhysmapBatch{any_domid(), space, size, 0, idxs, gpfns, errs});
    for (std::uint64_t i = 0; i < size && i < 64; ++i) {
      const std::uint64_t idx = space == kMapspaceGrantTable ? any_idx() : (one_in(6) ? rng_() : 0);
      put(idxs + 8 * i, idx);
      put(gpfns + 8 * i, space == kMapspaceGrantTable && !one_in(4) ? cfg_.grant_frames_gfn + (idx & 0xffff) : any_gfn());
    }
    // Expected: the loop run on a copy of guest memory (errs[] may overwrite later inputs).
    GuestMem shadow;
    AddToPhysmapBatch b{};
    const bool readable = mem_.peek(arg, b);
    std::vector<Write> want;
    std::int64_t expected = 0;
    shadow.copy_from(mem_);
    const std::int64_t rc = call(kHcMemoryOp, kXenmemAddToPhysmapBatch, arg, rng_(), vcpu);
    if (refused_caller(rc)) return;
    if (!readable) return expect(rc, kEfault);
    if (b.domid != kDomidSelf && b.domid != cfg_.domid) return expect(rc, kEperm);
    if (b.space != kMapspaceSharedInfo && b.space != kMapspaceGrantTable) return expect(rc, kEnosys);
    for (std::uint64_t i = 0; i < b.size; ++i) {
      std::uint64_t idx = 0, gpfn = 0;
      if (!shadow.peek(b.idxs + i * 8, idx) || !shadow.peek(b.gpfns + i * 8, gpfn)) {
        expected = kEfault;
        break;
      }
      const auto r = static_cast<std::int32_t>(add_to_physmap(b.space, idx, gpfn));
      const Write w = write_of(b.errs + i * 4, r);
      if (!shadow.write(w.gva, w.bytes)) {
        expected = kEfault;
        break;
      }
      want.push_back(w);
    }
    expect(rc, expected, want);
  }

  void reservation(std::uint64_t cmd, unsigned vcpu) {
    const std::uint64_t arg = any_ptr(sizeof(MemoryReservation));
    const std::uint32_t order = static_cast<std::uint32_t>(one_in(8) ? rng_() : below(5));
    const std::uint64_t n = one_in(8) ? (one_in(2) ? rng_() : 65537) : below(6);
    const std::uint64_t list = any_ptr(8 * std::min<std::uint64_t>(n, 64));
    put(arg, MemoryReservation{list, n, order, static_cast<std::uint32_t>(rng_()), any_domid()});
    for (std::uint64_t i = 0; i < n && i < 64; ++i) put(list + 8 * i, one_in(3) ? any_gfn() : kRamGfn + (below(kRamPages) & ~((1ull << std::min(order, 4u)) - 1)));
    MemoryReservation r{};
    const bool readable = mem_.peek(arg, r);
    const auto before = (cmd == kXenmemDecreaseReservation ? host_.released() : host_.populated()).size();
    const std::int64_t rc = call(kHcMemoryOp, cmd, arg, rng_(), vcpu);
    if (refused_caller(rc)) return;
    if (!readable) return expect(rc, kEfault);
    if (r.domid != kDomidSelf && r.domid != cfg_.domid) return expect(rc, kEperm);
    // Xen's contract: the number of extents done, stopping at the first one that cannot be.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> done;
    std::int64_t expected = 0;
    if (r.extent_order <= 9) {
      const std::uint64_t pages = std::uint64_t{1} << r.extent_order;
      const std::uint64_t limit = std::min<std::uint64_t>(r.nr_extents, 65536);
      for (std::uint64_t i = 0; i < limit; ++i, ++expected) {
        std::uint64_t g = 0;
        if (!mem_.peek(r.extent_start + i * 8, g) || (g & (pages - 1)) != 0) break;
        bool ram = true;
        for (std::uint64_t p = 0; p < pages && ram; ++p) ram = g + p >= g && ram_gfn(g + p);
        if (!ram) break;
        done.emplace_back(g, pages);
      }
    }
    expect(rc, expected);
    const auto after = cmd == kXenmemDecreaseReservation ? host_.released() : host_.populated();
    ASSERT_EQ(after.size(), before + done.size()) << ctx() << ": the host was asked for other extents than the count says";
    EXPECT_TRUE(std::equal(done.begin(), done.end(), after.begin() + static_cast<std::ptrdiff_t>(before))) << ctx();
  }

  void hvm_op() {
    static const std::uint64_t kOps[] = {kHvmopSetParam, kHvmopGetParam, kHvmopSetEvtchnUpcallVector, kHvmopPagetableDying};
    const std::uint64_t op = one_in(10) ? (one_in(2) ? rng_() : (1ull << 32) | kHvmopSetParam) : kOps[below(4)];
    const unsigned vcpu = caller();
    if (op == kHvmopSetParam || op == kHvmopGetParam) {
      const std::uint64_t arg = any_ptr(sizeof(HvmParam));
      const std::uint32_t index = static_cast<std::uint32_t>(one_in(3) ? (one_in(2) ? rng_() : below(45)) : 0);
      std::uint64_t value = rng_();
      switch (below(6)) {
        case 0: value = (kCallbackTypeVector << kCallbackTypeShift) | below(256); break;
        case 1: value = (kCallbackTypePciIntx << kCallbackTypeShift) | (3u << 3); break;
        case 2: value = below(24); break;  // GSI, 0 = none
        case 3: value = (below(8) << kCallbackTypeShift) | below(256); break;
        default: break;
      }
      put(arg, HvmParam{any_domid(), static_cast<std::uint16_t>(rng_()), index, value});
      HvmParam p{};
      const bool readable = mem_.peek(arg, p);
      const std::uint64_t old = callback_irq_;
      const std::int64_t rc = call(kHcHvmOp, op, arg, rng_(), vcpu);
      if (refused_caller(rc)) return;
      if (!readable) return expect(rc, kEfault);
      if (p.domid != kDomidSelf && p.domid != cfg_.domid) return expect(rc, kEperm);
      if (p.index >= kNrParams) return expect(rc, kEinval);
      if (op == kHvmopSetParam) {
        if (p.index != kParamCallbackIrq) return expect(rc, kEperm);
        const std::uint64_t type = p.value >> kCallbackTypeShift;
        if (type != kCallbackTypeGsi && type != kCallbackTypePciIntx && type != kCallbackTypeVector)
          return expect(rc, kEinval);
        // The global vector needs the host's help: a host that refuses keeps the old choice.
        if (global_vector(p.value) != global_vector(old) && refusing_) return expect(rc, kEnosys);
        callback_irq_ = p.value;
        routes_published_ |= old != p.value;
        const auto lines = host_.intx();
        expect(rc, 0);
        if (intx_mode(old) && !intx_mode(p.value)) {
          ASSERT_FALSE(lines.empty()) << ctx();
          EXPECT_FALSE(lines.back()) << ctx() << ": leaving INTx left the line up";
        }
        return;
      }
      std::optional<std::uint64_t> v;
      switch (p.index) {
        case kParamCallbackIrq: v = callback_irq_; break;
        case kParamStorePfn: v = cfg_.store_gfn; break;
        case kParamStoreEvtchn: v = cfg_.store_port; break;
        case kParamConsolePfn: v = cfg_.console_gfn; break;
        case kParamConsoleEvtchn: v = cfg_.console_port; break;
        case kParamVm86Tss: case kParamVm86TssSized: case kParamAcpiIoportsLocation:
        case kParamVmGenerationIdAddr: case kParamAltp2m: case kParamX87FipWidth: v = 0; break;
        default: return expect(rc, kEperm);
      }
      p.value = *v;
      if (!GuestMem::writable(arg, sizeof p)) return expect(rc, kEfault);
      return expect(rc, 0, {write_of(arg, p)});
    }
    if (op == kHvmopSetEvtchnUpcallVector) {
      const std::uint64_t arg = any_ptr(sizeof(HvmEvtchnUpcallVector));
      put(arg, HvmEvtchnUpcallVector{any_vcpu(), static_cast<std::uint8_t>(one_in(4) ? below(0x10) : 0x10 + below(0xf0)), {}});
      HvmEvtchnUpcallVector u{};
      const bool readable = mem_.peek(arg, u);
      const std::int64_t rc = call(kHcHvmOp, op, arg, rng_(), vcpu);
      if (refused_caller(rc)) return;
      if (!readable) return expect(rc, kEfault);
      if (u.vector < 0x10) return expect(rc, kEinval);
      if (u.vcpu >= cfg_.vcpus) return expect(rc, kEnoent);
      routes_published_ |= vcpu_vector_[u.vcpu] != u.vector;
      vcpu_vector_[u.vcpu] = u.vector;
      return expect(rc, 0);
    }
    const std::int64_t rc = call(kHcHvmOp, op, any_ptr(16), rng_(), vcpu);
    if (refused_caller(rc)) return;
    expect(rc, kEnosys);
  }

  void vcpu_op() {
    static const std::uint64_t kCmds[] = {kVcpuopRegisterVcpuInfo, kVcpuopRegisterRunstateMemoryArea,
                                          kVcpuopRegisterVcpuTimeMemoryArea, kVcpuopStopPeriodicTimer,
                                          kVcpuopStopSingleshotTimer, kVcpuopSetSingleshotTimer, kVcpuopUp,
                                          kVcpuopGetRunstateInfo, kVcpuopInitialise};
    const std::uint64_t cmd = one_in(10) ? rng_() : kCmds[below(std::size(kCmds))];
    std::uint64_t target = any_vcpu() | high_bits();
    // The final check's vCPU keeps its legacy vcpu_info slot.
    if (u32(cmd) == kVcpuopRegisterVcpuInfo && u32(target) == check_vcpu_) target = cfg_.vcpus;
    const unsigned vcpu = caller();
    std::uint64_t arg = any_ptr(16);
    if (u32(cmd) == kVcpuopRegisterVcpuInfo) {
      const std::uint32_t offset = static_cast<std::uint32_t>(one_in(4) ? (one_in(2) ? rng_() : 4032 + below(70)) : 64 * below(64) + (one_in(5) ? below(8) : 0));
      put(arg, VcpuRegisterVcpuInfo{any_gfn(), offset, static_cast<std::uint32_t>(rng_())});
    } else if (u32(cmd) == kVcpuopRegisterRunstateMemoryArea) {
      arg = any_ptr(8);
      put(arg, VcpuRegisterMemoryArea{one_in(5) ? 0 : any_ptr(sizeof(VcpuRunstateInfo))});
    }
    VcpuRegisterVcpuInfo reg{};
    VcpuRegisterMemoryArea area{};
    const bool reg_readable = mem_.peek(arg, reg);
    const bool area_readable = mem_.peek(arg, area);
    const std::int64_t rc = call(kHcVcpuOp, cmd, target, arg, vcpu);
    if (refused_caller(rc)) return;
    if (u32(target) >= cfg_.vcpus) return expect(rc, kEinval);
    const auto v = static_cast<unsigned>(u32(target));
    switch (u32(cmd)) {
      case kVcpuopRegisterVcpuInfo: {
        if (!reg_readable) return expect(rc, kEfault);
        if (reg.offset > domain::kSharedInfoPageBytes - sizeof(domain::VcpuInfo)) return expect(rc, kEnxio);
        if (!ram_gfn(reg.mfn)) return expect(rc, kEinval);
        if (reg.offset % 8 != 0) return expect(rc, kEnxio);  // vcpu_info is 8-byte aligned
        if (registered_[v]) return expect(rc, kEinval);
        registered_[v] = true;
        return expect(rc, 0);
      }
      case kVcpuopRegisterRunstateMemoryArea: {
        if (!area_readable) return expect(rc, kEfault);
        if (area.addr == 0) return expect(rc, 0);
        if (!GuestMem::writable(area.addr, sizeof(VcpuRunstateInfo))) return expect(rc, kEfault);
        return expect(rc, 0, {write_of(area.addr, VcpuRunstateInfo{})});
      }
      case kVcpuopRegisterVcpuTimeMemoryArea: return expect(rc, area_readable ? 0 : kEfault);
      case kVcpuopStopPeriodicTimer:
      case kVcpuopStopSingleshotTimer: return expect(rc, 0);
      default: return expect(rc, kEnosys);
    }
  }

  void event_channel_op() {
    const std::uint64_t cmd = one_in(12) ? (one_in(2) ? rng_() : 11 + below(6)) : (one_in(60) ? 10 : below(10));
    const unsigned vcpu = caller();
    const std::uint64_t arg = any_ptr(sizeof(domain::EvtchnStatusOp));
    // The struct as the guest fills it (or leaves it).
    switch (u32(cmd)) {
      case 0: put(arg, domain::EvtchnBindInterdomainOp{one_in(2) ? DomId{0} : any_domid(), {}, one_in(2) ? static_cast<Port>(below(model_->dom0.size() + 1)) : any_port(), static_cast<Port>(rng_())}); break;
      case 1: put(arg, domain::EvtchnBindVirqOp{static_cast<std::uint32_t>(one_in(8) ? rng_() : below(kNrVirqs + 1)), one_in(2) ? 0 : any_vcpu(), static_cast<Port>(rng_())}); break;
      case 3: case 4: case 9: put(arg, domain::EvtchnPortOp{any_port()}); break;
      case 5: put(arg, domain::EvtchnStatusOp{any_domid(), {}, any_port(), static_cast<std::uint32_t>(rng_()), 0, {}}); break;
      case 6: put(arg, domain::EvtchnAllocUnboundOp{any_domid(), one_in(2) ? DomId{0} : any_domid(), static_cast<Port>(rng_())}); break;
      case 7: put(arg, domain::EvtchnBindIpiOp{any_vcpu(), static_cast<Port>(rng_())}); break;
      case 8: put(arg, domain::EvtchnBindVcpuOp{any_port(), any_vcpu()}); break;
      case 10: put(arg, domain::EvtchnResetOp{any_domid()}); break;
      default: break;
    }
    union {
      domain::EvtchnBindInterdomainOp bi;
      domain::EvtchnBindVirqOp bv;
      domain::EvtchnPortOp po;
      domain::EvtchnStatusOp st;
      domain::EvtchnAllocUnboundOp au;
      domain::EvtchnBindIpiOp ip;
      domain::EvtchnBindVcpuOp bc;
      domain::EvtchnResetOp rs;
    } in{};
    std::size_t size = 0;
    switch (u32(cmd)) {
      case 0: size = sizeof in.bi; break;
      case 1: size = sizeof in.bv; break;
      case 3: case 4: case 9: size = sizeof in.po; break;
      case 5: size = sizeof in.st; break;
      case 6: size = sizeof in.au; break;
      case 7: size = sizeof in.ip; break;
      case 8: size = sizeof in.bc; break;
      case 10: size = sizeof in.rs; break;
      default: break;
    }
    const bool readable = size != 0 && GuestMem::readable(arg, size);
    if (readable) std::ignore = mem_.read(arg, std::span(reinterpret_cast<std::uint8_t*>(&in), size));
    const std::int64_t rc = call(kHcEventChannelOp, cmd | high_bits(), arg, rng_(), vcpu);
    if (refused_caller(rc)) return;
    if (size == 0) return expect(rc, kEnosys);
    if (!readable) return expect(rc, kEfault);
    auto self = [&](DomId d) { return d == kDomidSelf || d == cfg_.domid; };
    // A port handed out: the struct goes back with it; if it cannot, -EFAULT (the port stays).
    auto bound = [&](std::int64_t r, const auto& s) {
      if (r != 0) return expect(rc, r);
      if (!GuestMem::writable(arg, sizeof s)) return expect(rc, kEfault);
      expect(rc, 0, {write_of(arg, s)});
    };
    switch (u32(cmd)) {
      case 0: {
        auto s = in.bi;
        const std::int64_t r = model_->bind_interdomain(s.remote_dom, s.remote_port, &s.local_port);
        return bound(r, s);
      }
      case 1: {
        auto s = in.bv;
        const std::int64_t r = model_->bind_virq(s.virq, s.vcpu, &s.port);
        return bound(r, s);
      }
      case 3: return expect(rc, model_->close(in.po.port));
      case 4: return expect(rc, model_->send(in.po.port));
      case 9: return expect(rc, model_->unmask(in.po.port));
      case 5: {
        if (!self(in.st.dom)) return expect(rc, kEperm);
        if (in.st.port >= kMaxPorts) return expect(rc, kEinval);
        const auto s = model_->status_op(in.st);
        if (!GuestMem::writable(arg, sizeof s)) return expect(rc, kEfault);
        return expect(rc, 0, {write_of(arg, s)});
      }
      case 6: {
        auto s = in.au;
        if (!self(s.dom)) return expect(rc, kEperm);
        const std::int64_t r = model_->alloc_unbound(s.remote_dom, &s.port);
        return bound(r, s);
      }
      case 7: {
        auto s = in.ip;
        const std::int64_t r = model_->bind_ipi(s.vcpu, &s.port);
        return bound(r, s);
      }
      case 8: return expect(rc, model_->bind_vcpu(in.bc.port, in.bc.vcpu));
      case 10:
        if (!self(in.rs.dom)) return expect(rc, kEperm);
        model_->reset();
        return expect(rc, 0);
      default: return expect(rc, kEnosys);
    }
  }

  void grant_table_op() {
    const std::uint64_t cmd = one_in(8) ? rng_() : std::array<std::uint64_t, 4>{kGnttabopQuerySize, kGnttabopSetVersion, kGnttabopGetVersion, 0}[below(4)];
    const std::uint64_t count = one_in(6) ? rng_() : (1 | high_bits());
    const std::uint64_t arg = any_ptr(sizeof(GnttabQuerySize));
    const unsigned vcpu = caller();
    if (u32(cmd) == kGnttabopQuerySize) put(arg, GnttabQuerySize{any_domid(), 0, static_cast<std::uint32_t>(rng_()), static_cast<std::uint32_t>(rng_()), 77, 0});
    if (u32(cmd) == kGnttabopSetVersion) put(arg, GnttabSetVersion{static_cast<std::uint32_t>(one_in(2) ? 1 : below(4))});
    if (u32(cmd) == kGnttabopGetVersion) put(arg, GnttabGetVersion{any_domid(), 0, static_cast<std::uint32_t>(rng_())});
    GnttabQuerySize q{};
    GnttabSetVersion sv{};
    GnttabGetVersion gv{};
    const bool q_ok = mem_.peek(arg, q), sv_ok = mem_.peek(arg, sv), gv_ok = mem_.peek(arg, gv);
    const std::int64_t rc = call(kHcGrantTableOp, cmd, arg, count, vcpu);
    if (refused_caller(rc)) return;
    const bool known = u32(cmd) == kGnttabopQuerySize || u32(cmd) == kGnttabopSetVersion || u32(cmd) == kGnttabopGetVersion;
    if (!known) return expect(rc, kEnosys);
    if (u32(count) != 1) return expect(rc, kEinval);
    auto self = [&](DomId d) { return d == kDomidSelf || d == cfg_.domid; };
    switch (u32(cmd)) {
      case kGnttabopQuerySize:
        if (!q_ok) return expect(rc, kEfault);
        if (self(q.dom)) {
          q.nr_frames = grant_frames_;
          q.max_nr_frames = cfg_.max_grant_frames;
          q.status = kGntstOkay;
        } else {
          q.status = kGntstPermissionDenied;
        }
        if (!GuestMem::writable(arg, sizeof q)) return expect(rc, kEfault);
        return expect(rc, 0, {write_of(arg, q)});
      case kGnttabopSetVersion: {
        if (!sv_ok) return expect(rc, kEfault);
        const std::int64_t r = sv.version == 1 ? 0 : kEinval;
        if (!GuestMem::writable(arg, sizeof sv)) return expect(rc, kEfault);
        return expect(rc, r, {write_of(arg, GnttabSetVersion{1})});
      }
      default:
        if (!gv_ok) return expect(rc, kEfault);
        if (!self(gv.dom)) return expect(rc, kEperm);
        gv.version = 1;
        if (!GuestMem::writable(arg, sizeof gv)) return expect(rc, kEfault);
        return expect(rc, 0, {write_of(arg, gv)});
    }
  }

  void sched_op() {
    // Poll waits up to 1 ms when nothing is pending: rare, so that seeds stay fast.
    const std::uint64_t cmd = one_in(8) ? rng_() : std::array<std::uint64_t, 9>{0, 1, 2, 2, 2, 4, 5, 6, one_in(3) ? 3u : 2u}[below(9)];
    const unsigned vcpu = caller();
    std::uint64_t arg = any_ptr(sizeof(SchedPoll));
    if (u32(cmd) == kSchedopShutdown) put(arg, SchedShutdown{static_cast<std::uint32_t>(one_in(3) ? rng_() : below(7))});
    std::vector<Port> ports;
    if (u32(cmd) == kSchedopPoll) {
      const std::uint32_t n = static_cast<std::uint32_t>(one_in(6) ? (one_in(2) ? rng_() : 129) : below(6));
      const std::uint64_t list = any_ptr(4 * std::min<std::uint32_t>(n, 128));
      put(arg, SchedPoll{list, n, 0, rng_()});
      for (std::uint32_t i = 0; i < n && i < 128; ++i) put(list + 4 * i, any_port());
    }
    SchedShutdown s{};
    SchedPoll p{};
    const bool s_ok = mem_.peek(arg, s), p_ok = mem_.peek(arg, p);
    const auto shutdowns = host_.shutdowns();
    const std::int64_t rc = call(kHcSchedOp, cmd | high_bits(), arg, rng_(), vcpu);
    if (refused_caller(rc)) return;
    switch (u32(cmd)) {
      case kSchedopYield:
      case kSchedopBlock:
      case kSchedopShutdownCode: return expect(rc, 0);
      case kSchedopRemoteShutdown: return expect(rc, kEperm);
      case kSchedopShutdown: {
        // Only the ABI's reasons reach the host, each as itself.
        static const ShutdownReason kReasons[] = {ShutdownReason::poweroff, ShutdownReason::reboot,
                                                  ShutdownReason::suspend, ShutdownReason::crash,
                                                  ShutdownReason::watchdog};
        const auto now = host_.shutdowns();
        if (!s_ok) {
          EXPECT_EQ(now.size(), shutdowns.size()) << ctx();
          return expect(rc, kEfault);
        }
        if (s.reason > kShutdownWatchdog) {
          EXPECT_EQ(now.size(), shutdowns.size()) << ctx() << ": reason " << s.reason << " reached the host";
          return expect(rc, kEinval);
        }
        ASSERT_EQ(now.size(), shutdowns.size() + 1) << ctx();
        EXPECT_EQ(now.back(), kReasons[s.reason]) << ctx() << ": reason " << s.reason;
        return expect(rc, 0);
      }
      case kSchedopPoll: {
        if (!p_ok) return expect(rc, kEfault);
        if (p.nr_ports > kSchedPollMaxPorts) return expect(rc, kEinval);
        for (std::uint32_t i = 0; i < p.nr_ports; ++i) {
          std::uint32_t port = 0;
          if (!mem_.peek(p.ports + 4 * i, port)) return expect(rc, kEfault);
          ports.push_back(port);
        }
        for (const Port q : ports)
          if (q >= kMaxPorts) return expect(rc, kEinval);
        return expect(rc, 0);
      }
      default: return expect(rc, kEnosys);
    }
  }

  void console_io() {
    const std::uint64_t cmd = one_in(8) ? rng_() : below(2);
    const std::uint64_t count = one_in(8) ? rng_() : (one_in(8) ? 4096 + below(3) : below(300)) | high_bits();
    const std::uint64_t buf = any_ptr(std::min<std::uint64_t>(u32(count), 4096));
    const std::size_t before = host_.console().size();
    const std::int64_t rc = call(kHcConsoleIo, cmd | high_bits(), count, buf, caller());
    if (refused_caller(rc)) return;
    if (u32(cmd) == kConsoleioRead) return expect(rc, 0);
    if (u32(cmd) != kConsoleioWrite) return expect(rc, kEnosys);
    const std::uint64_t n = u32(count);
    const std::string now = host_.console();
    if (n > kConsoleWriteMax) {
      EXPECT_EQ(now.size(), before) << ctx();
      return expect(rc, kEinval);
    }
    if (n != 0 && !GuestMem::readable(buf, n)) {
      EXPECT_EQ(now.size(), before) << ctx();
      return expect(rc, kEfault);
    }
    // Passed on whole (after a note of the writes dropped before it) or dropped whole: more
    // than kConsoleWritesPerSecond a second are dropped, and a fuzzer writes faster.
    if (now.size() != before) {
      ASSERT_GE(now.size(), before + n) << ctx();
      if (now.size() > before + n) {
        EXPECT_THAT(now.substr(before, now.size() - before - n),
                    ::testing::MatchesRegex("\\[xpv: [0-9]+ console_io writes dropped: .*\\]\n"))
            << ctx();
      }
      std::string want = mem_.text(buf, n);
      for (char& c : want) {  // what the host may log: printable ASCII and newlines
        const auto b = static_cast<unsigned char>(c);
        if (c != '\n' && (b < 0x20 || b >= 0x7f)) c = '.';
      }
      EXPECT_TRUE(now.compare(now.size() - n, n, want) == 0) << ctx() << ": the console got other bytes";
    }
    expect(rc, 0);
  }

  void unknown_hypercall() {
    static const std::set<std::uint64_t> kKnown = {kHcMemoryOp, kHcXenVersion, kHcConsoleIo, kHcGrantTableOp,
                                                   kHcVcpuOp, kHcSchedOp, kHcEventChannelOp, kHcHvmOp};
    std::uint64_t nr = one_in(2) ? below(70) : rng_();
    if (kKnown.contains(nr)) nr = 13;
    const std::int64_t rc = call(nr, rng_(), any_ptr(64), any_ptr(64), caller());
    if (refused_caller(rc)) return;
    expect(rc, kEnosys);
  }

  // ---- the guest's own writes and the host's traffic -------------------------------------------------
  void guest_writes_its_pages() {
    host_op_ = "the guest writes its RAM pages";
    Page& page = *ram_[below(ram_.size())];
    auto& si = *reinterpret_cast<domain::SharedInfo*>(page.bytes);
    switch (below(5)) {
      case 0: page.bytes[below(4096)] = static_cast<std::uint8_t>(rng_()); break;
      case 1: si.evtchn_mask[below(64)] = one_in(2) ? 0 : rng_(); break;
      case 2: si.evtchn_pending[below(64)] = one_in(2) ? 0 : rng_(); break;
      case 3: {  // the upcall handler of one vCPU's legacy slot
        auto& vi = si.vcpu_info[below(32)];
        vi.evtchn_upcall_pending = 0;
        vi.evtchn_pending_sel = 0;
        break;
      }
      default: std::memset(page.bytes + 8 * below(512), static_cast<int>(rng_()), 8); break;
    }
    expect_upcalls();
  }

  void host_traffic() {
    static const char* const kWhat[] = {"host: raise_virq", "host: deliver", "host: dom0_alloc_unbound",
                                        "host: bind_to_dom0", "host: dom0_close", "host: backends notify, service kicks",
                                        "host: backends consume", "host: INTx EOI", "host: redeliver_lost_edges",
                                        "host: re-assert upcalls"};
    const auto what = below(10);
    host_op_ = kWhat[what];
    switch (what) {
      case 0: {
        const std::uint32_t virq = static_cast<std::uint32_t>(one_in(6) ? rng_() : below(kNrVirqs));
        const std::uint32_t vcpu = any_vcpu();
        const auto r = ev_->raise_virq(virq, vcpu);
        EXPECT_EQ(r ? 0 : E(r.error()), model_->raise_virq(virq, vcpu)) << "raise_virq(" << virq << ", " << vcpu << ")";
        break;
      }
      case 1: {
        const Port p = any_port();
        const auto r = ev_->deliver(p);
        EXPECT_EQ(r ? 0 : E(r.error()), model_->deliver(p)) << "deliver(" << p << ")";
        break;
      }
      case 2: {
        if (backends_.size() >= kMaxEndpoints) break;
        auto fds = ev_->dom0_alloc_unbound();
        ASSERT_TRUE(fds);
        const Port dp = model_->new_endpoint();
        EXPECT_EQ(fds->dom0_port, dp);
        EXPECT_EQ(fds->guest_port, 0u);
        backends_[fds->dom0_port] = std::make_unique<domain::Dom0Port>(std::move(*fds));
        break;
      }
      case 3: {  // a backend binds a guest port offered to dom 0
        if (backends_.size() >= kMaxEndpoints) break;
        Port gp = any_port();
        for (const Port p : model_->live())
          if (one_in(2) && model_->ports[p].st == EvtchnModel::St::unbound && model_->ports[p].rdom == 0) gp = p;
        auto fds = ev_->bind_to_dom0(gp);
        Port dp = 0;
        const std::int64_t want = model_->bind_to_dom0(gp, &dp);
        EXPECT_EQ(fds ? 0 : E(fds.error()), want) << "bind_to_dom0(" << gp << ")";
        if (fds && want == 0) {
          EXPECT_EQ(fds->dom0_port, dp);
          EXPECT_EQ(fds->guest_port, gp);
          backends_[fds->dom0_port] = std::make_unique<domain::Dom0Port>(std::move(*fds));
        }
        break;
      }
      case 4: {
        const Port dp = static_cast<Port>(below(model_->dom0.size() + 2));
        const auto r = ev_->dom0_close(dp);
        EXPECT_EQ(r ? 0 : E(r.error()), model_->dom0_close(dp)) << "dom0_close(" << dp << ")";
        backends_.erase(dp);
        break;
      }
      case 5: {  // backends kick the guest, then the domain's event loop services them
        for (auto& [dp, be] : backends_) {
          if (!one_in(2)) continue;
          ASSERT_TRUE(be->notify());
          ++model_->dom0[dp]->from_dom0;
        }
        const Port dp = static_cast<Port>(below(model_->dom0.size() + 2));
        const auto r = ev_->service_dom0_kick(dp);
        if (model_->endpoint(dp)) {
          ASSERT_TRUE(r) << "service_dom0_kick(" << dp << ")";
          EXPECT_EQ(*r, model_->dom0[dp]->from_dom0) << "service_dom0_kick(" << dp << ")";
          model_->dom0[dp]->from_dom0 = 0;
        } else {
          EXPECT_FALSE(r) << "service_dom0_kick(" << dp << ") of no endpoint";
        }
        if (one_in(2)) {
          std::uint64_t want = 0;
          for (auto& e : model_->dom0) {
            if (!e) continue;
            want += e->from_dom0;
            e->from_dom0 = 0;
          }
          EXPECT_EQ(ev_->service_dom0_kicks(), want);
        }
        break;
      }
      case 6:  // backends look at what the guest sent
        for (auto& [dp, be] : backends_) {
          const auto n = be->consume();
          ASSERT_TRUE(n);
          EXPECT_EQ(*n, model_->dom0[dp]->to_dom0) << "kicks seen by the backend of dom0 port " << dp;
          model_->dom0[dp]->to_dom0 = 0;
        }
        break;
      case 7: platform_->intx_eoi(); break;
      case 8: ev_->redeliver_lost_edges(); break;
      default: {
        // The VMM's re-assertion (xpv-vmm's XenDomain::reassert), or a vCPU that does not exist.
        const unsigned v = one_in(4) ? cfg_.vcpus + static_cast<unsigned>(below(4)) : static_cast<unsigned>(below(cfg_.vcpus));
        if (v < cfg_.vcpus && ev_->upcall_pending(v)) platform_->upcall(v);
        if (v >= cfg_.vcpus) platform_->upcall(v);
        break;
      }
    }
    expect_upcalls();
  }

  Rng rng_;
  PlatformConfig cfg_;
  FakeHost host_;
  GuestMem mem_;
  std::vector<Page*> ram_;
  Page* check_page_ = nullptr;
  std::unique_ptr<Page> placeholder_;
  std::unique_ptr<Platform> platform_;
  std::unique_ptr<domain::EventChannels> ev_;
  std::map<Port, std::unique_ptr<domain::Dom0Port>> backends_;  // by dom0 port

  // The model of what the guest has done.
  std::optional<EvtchnModel> model_;
  std::uint64_t callback_irq_ = 0;
  std::vector<std::uint8_t> vcpu_vector_;
  std::vector<bool> registered_;
  bool routes_published_ = false;
  bool refusing_ = false;  // the host refuses the global callback vector
  bool shared_info_mapped_ = false;
  std::uint32_t grant_frames_ = 0;
  unsigned check_vcpu_ = 0;

  unsigned step_ = 0;
  Regs regs_{};
  unsigned vcpu_ = 0;
  const char* host_op_ = nullptr;  // the step is not a hypercall: what it is
};


// The event-channel table, the dom0 endpoints, grant frames and shared_info, port by port as the
// model has them.
void World::expect_model_matches() {
  const EvtchnModel& m = *model_;
  for (Port p = 0; p < kMaxPorts; ++p) {
    const auto s = ev_->status(p);
    ASSERT_TRUE(s) << "port " << p;
    const EvtchnModel::Ch& c = m.ports[p];
    const auto want = m.status_op(domain::EvtchnStatusOp{kDomidSelf, {}, p, 0, 0, {}});
    EXPECT_EQ(static_cast<std::uint32_t>(s->status), want.status) << "port " << p;
    EXPECT_EQ(s->vcpu, c.vcpu) << "port " << p;
    if (c.st == EvtchnModel::St::unbound || c.st == EvtchnModel::St::interdomain) {
      EXPECT_EQ(s->remote_dom, c.rdom) << "port " << p;
    }
    if (c.st == EvtchnModel::St::interdomain) {
      EXPECT_EQ(s->remote_port, c.rport) << "port " << p;
    }
    if (c.st == EvtchnModel::St::virq) {
      EXPECT_EQ(s->virq, c.virq) << "port " << p;
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_FALSE(ev_->status(kMaxPorts));
  for (Port dp = 0; dp < m.dom0.size() + 2; ++dp) {
    const auto s = ev_->dom0_status(dp);
    if (!m.endpoint(dp)) {
      EXPECT_FALSE(s) << "dom0 port " << dp;
      EXPECT_EQ(ev_->kick_fd(dp), -1) << "dom0 port " << dp;
      continue;
    }
    ASSERT_TRUE(s) << "dom0 port " << dp;
    EXPECT_EQ(s->guest_port, m.dom0[dp]->guest_port) << "dom0 port " << dp;
    EXPECT_EQ(s->status, m.dom0[dp]->guest_port != 0 ? EvtchnStat::interdomain : EvtchnStat::unbound);
    EXPECT_GE(ev_->kick_fd(dp), 0);
  }
  for (auto& [dp, be] : backends_) {
    const auto n = be->consume();
    ASSERT_TRUE(n);
    EXPECT_EQ(*n, model_->dom0[dp]->to_dom0) << "kicks seen by the backend of dom0 port " << dp;
    model_->dom0[dp]->to_dom0 = 0;
  }
  EXPECT_EQ(platform_->grant_frames_mapped(), grant_frames_);
  EXPECT_LE(platform_->grant_frames_mapped(), cfg_.max_grant_frames);
  EXPECT_EQ(platform_->shared_info_mapped(), shared_info_mapped_);
}

// After the fuzzing, a well-formed guest on the vCPU that kept its legacy vcpu_info slot: every
// step as the unit tests (tests/unit/xen) expect it.
void World::expect_still_works() {
  const unsigned cv = check_vcpu_;
  constexpr std::uint64_t kArg = GuestMem::kBase;  // writable
  auto hc = [&](std::uint64_t nr, std::uint64_t a1, std::uint64_t a2 = 0, std::uint64_t a3 = 0) {
    return platform_->hypercall(cv, Regs{nr, a1, a2, a3, 0, 0}, mem_);
  };
  auto evtchn = [&](EvtchnOp op, const auto& s) {
    mem_.poke(kArg, s);
    return hc(kHcEventChannelOp, static_cast<std::uint64_t>(op), kArg);
  };
  using Inj = std::vector<std::pair<unsigned, std::uint8_t>>;
  SCOPED_TRACE("the well-formed guest on vCPU " + std::to_string(cv));

  EXPECT_EQ(hc(kHcXenVersion, kXenverVersion), (std::int64_t{cfg_.version_major} << 16) | cfg_.version_minor);
  ASSERT_EQ(evtchn(EvtchnOp::reset, domain::EvtchnResetOp{kDomidSelf}), 0);
  for (Port p = 1; p < kMaxPorts; ++p) ASSERT_EQ(ev_->status(p)->status, EvtchnStat::closed) << "port " << p;

  // shared_info on a fresh page; the guest starts from clean bitmaps and a handled vCPU.
  mem_.poke(kArg, AddToPhysmap{kDomidSelf, 0, kMapspaceSharedInfo, 0, kCheckGfn});
  ASSERT_EQ(hc(kHcMemoryOp, kXenmemAddToPhysmap, kArg), 0);
  EXPECT_TRUE(platform_->shared_info_mapped());
  auto& si = *reinterpret_cast<domain::SharedInfo*>(check_page_->bytes);
  auto& vi = si.vcpu_info[cv];
  auto handled = [&] {
    vi.evtchn_upcall_pending = 0;
    vi.evtchn_pending_sel = 0;
    for (auto& w : si.evtchn_pending) w = 0;
    host_.clear();
  };
  for (auto& w : si.evtchn_mask) w = 0;
  handled();
  mem_.poke(kArg, HvmEvtchnUpcallVector{cv, kCheckVector, {}});
  ASSERT_EQ(hc(kHcHvmOp, kHvmopSetEvtchnUpcallVector, kArg), 0);
  host_.clear();

  // bind_ipi + send: pending, selector, upcall_pending, and exactly one upcall with cv's vector.
  ASSERT_EQ(evtchn(EvtchnOp::bind_ipi, domain::EvtchnBindIpiOp{cv, 0}), 0);
  domain::EvtchnBindIpiOp ipi{};
  ASSERT_TRUE(mem_.peek(kArg, ipi));
  EXPECT_EQ(ipi.port, 1u);  // the lowest free port after the reset
  ASSERT_EQ(evtchn(EvtchnOp::send, domain::EvtchnPortOp{ipi.port}), 0);
  EXPECT_TRUE(ev_->port_pending(ipi.port));
  EXPECT_EQ(si.evtchn_pending[0], std::uint64_t{1} << ipi.port);
  EXPECT_EQ(vi.evtchn_upcall_pending, 1);
  EXPECT_EQ(vi.evtchn_pending_sel, 1u);
  EXPECT_EQ(host_.injected(), (Inj{{cv, kCheckVector}}));
  handled();

  // A port offered to dom 0, moved to cv, bound by a backend: both directions.
  ASSERT_EQ(evtchn(EvtchnOp::alloc_unbound, domain::EvtchnAllocUnboundOp{kDomidSelf, 0, 0}), 0);
  domain::EvtchnAllocUnboundOp au{};
  ASSERT_TRUE(mem_.peek(kArg, au));
  EXPECT_EQ(au.port, 2u);
  ASSERT_EQ(evtchn(EvtchnOp::bind_vcpu, domain::EvtchnBindVcpuOp{au.port, cv}), 0);
  auto fds = ev_->bind_to_dom0(au.port);
  ASSERT_TRUE(fds);
  const Port dp = fds->dom0_port;
  domain::Dom0Port backend(std::move(*fds));
  EXPECT_EQ(backend.consume().value_or(99), 1u);  // the binder's new port starts pending
  ASSERT_EQ(evtchn(EvtchnOp::send, domain::EvtchnPortOp{au.port}), 0);
  EXPECT_EQ(backend.consume().value_or(99), 1u);
  EXPECT_TRUE(host_.injected().empty());
  ASSERT_TRUE(backend.notify());
  EXPECT_EQ(ev_->service_dom0_kick(dp).value_or(99), 1u);
  EXPECT_TRUE(ev_->port_pending(au.port));
  EXPECT_EQ(host_.injected(), (Inj{{cv, kCheckVector}}));
  handled();

  // The guest binds an endpoint dom 0 offers, masked first (as Linux binds): the new port starts
  // pending without an upcall; moved to cv, its unmask delivers it there. (Unmasked, the bind
  // would signal vCPU 0, whose vcpu_info the fuzzing guest may have put anywhere — even over
  // the bitmaps of the page shared_info moved to — so nothing here depends on it.)
  auto offer = ev_->dom0_alloc_unbound();
  ASSERT_TRUE(offer);
  constexpr Port kNext = 3;  // the lowest free port
  si.evtchn_mask[0] |= std::uint64_t{1} << kNext;
  ASSERT_EQ(evtchn(EvtchnOp::bind_interdomain, domain::EvtchnBindInterdomainOp{0, {}, offer->dom0_port, 0}), 0);
  domain::EvtchnBindInterdomainOp bi{};
  ASSERT_TRUE(mem_.peek(kArg, bi));
  EXPECT_EQ(bi.local_port, kNext);
  EXPECT_TRUE(ev_->port_pending(kNext));
  EXPECT_TRUE(host_.injected().empty());
  EXPECT_EQ(ev_->dom0_status(offer->dom0_port)->guest_port, kNext);
  ASSERT_EQ(evtchn(EvtchnOp::bind_vcpu, domain::EvtchnBindVcpuOp{kNext, cv}), 0);
  ASSERT_EQ(evtchn(EvtchnOp::unmask, domain::EvtchnPortOp{kNext}), 0);
  EXPECT_EQ(si.evtchn_mask[0], 0u);
  EXPECT_EQ(vi.evtchn_upcall_pending, 1);
  EXPECT_EQ(host_.injected(), (Inj{{cv, kCheckVector}}));
  handled();

  // The guest closes its end of the backend's channel: the backend is woken once, unbound.
  ASSERT_EQ(evtchn(EvtchnOp::close, domain::EvtchnPortOp{au.port}), 0);
  EXPECT_EQ(backend.consume().value_or(99), 1u);
  EXPECT_EQ(ev_->dom0_status(dp)->status, EvtchnStat::unbound);

  // Grant frames and the callback parameter as the guest left them.
  mem_.poke(kArg, GnttabQuerySize{kDomidSelf, 0, 0, 0, 0, 0});
  ASSERT_EQ(hc(kHcGrantTableOp, kGnttabopQuerySize, kArg, 1), 0);
  GnttabQuerySize q{};
  ASSERT_TRUE(mem_.peek(kArg, q));
  EXPECT_EQ(q.nr_frames, grant_frames_);
  EXPECT_EQ(q.max_nr_frames, cfg_.max_grant_frames);
  mem_.poke(kArg, HvmParam{kDomidSelf, 0, kParamCallbackIrq, 0});
  ASSERT_EQ(hc(kHcHvmOp, kHvmopGetParam, kArg), 0);
  HvmParam p{};
  ASSERT_TRUE(mem_.peek(kArg, p));
  EXPECT_EQ(p.value, callback_irq_);
  EXPECT_EQ(hc(kHcXenVersion, kXenverPagesize), 4096);
}

TEST(XenHypercallFuzz, AHostileGuestGetsExactAnswersAndLeavesAWorkingPlatform) {
  const auto [first, last] = fuzz_seeds(500);
  spdlog::set_level(spdlog::level::warn);  // the guest's upcall-mode changes, logged at info
  for (std::uint64_t seed = first; seed <= last; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    World w(seed);
    w.fuzz(300);
    if (HasFailure()) break;
    w.expect_model_matches();
    if (HasFailure()) break;
    w.expect_still_works();
    if (HasFailure()) break;
  }
  const std::uint64_t n = last - first + 1;
  if (HasFailure() || n < 50) return;
  // Not a check of the platform: that the fuzzer reached both the successful and the failing
  // paths of every hypercall (else the checks above tested little).
  for (const unsigned nr : {kHcMemoryOp, kHcXenVersion, kHcConsoleIo, kHcGrantTableOp, kHcVcpuOp, kHcSchedOp,
                            kHcEventChannelOp, kHcHvmOp}) {
    EXPECT_GT(World::results[nr][0], n) << "hypercall " << nr << " rarely succeeded";
    EXPECT_GT(World::results[nr][2], n) << "hypercall " << nr << " rarely failed";
  }
  EXPECT_GT(World::results[kHcXenVersion][1], 0u);
  EXPECT_GT(World::results[kHcMemoryOp][1], 0u);  // extents done
}

}  // namespace
}  // namespace xpv::xen::test
