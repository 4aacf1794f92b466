// EventChannels: see the header for semantics, threading and lock order.
#include "xpv/domain/event_channels.h"

#include <atomic>
#include <bit>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

namespace xpv::domain {

namespace {

constexpr unsigned kMaxVcpus = 4096;  // sanity bound for the constructor (setup input)
constexpr std::size_t kPendingOffset = offsetof(SharedInfo, evtchn_pending);
constexpr std::size_t kMaskOffset = offsetof(SharedInfo, evtchn_mask);
constexpr std::size_t kUpcallPendingOffset = offsetof(VcpuInfo, evtchn_upcall_pending);
constexpr std::size_t kUpcallMaskOffset = offsetof(VcpuInfo, evtchn_upcall_mask);
constexpr std::size_t kPendingSelOffset = offsetof(VcpuInfo, evtchn_pending_sel);

constexpr std::uint64_t port_bit(Port p) noexcept {
  return std::uint64_t{1} << (p % kEvtchnWordBits);
}
constexpr unsigned port_word(Port p) noexcept { return p / kEvtchnWordBits; }

// Guest memory: the guest changes these words concurrently, so every access is atomic.
std::atomic_ref<std::uint64_t> u64_at(std::span<std::uint8_t> s, std::size_t off) noexcept {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(s.data() + off));
}
std::atomic_ref<std::uint8_t> u8_at(std::span<std::uint8_t> s, std::size_t off) noexcept {
  return std::atomic_ref<std::uint8_t>(s[off]);
}

bool aligned8(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p) % 8 == 0; }

}  // namespace

const char* to_string(XenErrno e) noexcept {
  switch (e) {
    case XenErrno::eperm: return "EPERM";
    case XenErrno::enoent: return "ENOENT";
    case XenErrno::esrch: return "ESRCH";
    case XenErrno::enxio: return "ENXIO";
    case XenErrno::enomem: return "ENOMEM";
    case XenErrno::efault: return "EFAULT";
    case XenErrno::eexist: return "EEXIST";
    case XenErrno::einval: return "EINVAL";
    case XenErrno::enospc: return "ENOSPC";
    case XenErrno::eagain: return "EAGAIN";
    case XenErrno::enosys: return "ENOSYS";
  }
  return "E?";
}

EventChannels::EventChannels(DomId domid, unsigned nr_vcpus, std::span<std::uint8_t> shared_info,
                             UpcallSink& sink, Port max_ports)
    : domid_(domid), nr_vcpus_(nr_vcpus), max_ports_(max_ports), shared_info_(shared_info),
      sink_(sink) {
  // dom0 is the host; a domain process is never domain 0 or a reserved id.
  if (domid == 0 || domid >= kDomidFirstReserved)
    throw std::invalid_argument("event channels: bad domain id " + std::to_string(domid));
  if (nr_vcpus == 0 || nr_vcpus > kMaxVcpus)
    throw std::invalid_argument("event channels: bad vCPU count " + std::to_string(nr_vcpus));
  if (shared_info.size() < kSharedInfoPageBytes || !aligned8(shared_info.data()))
    throw std::invalid_argument("event channels: shared_info must be a 4 KiB, 8-byte aligned span");
  if (max_ports == 0 || max_ports > kEvtchn2lNrChannels)
    throw std::invalid_argument("event channels: max_ports must be 1..4096");

  ports_.resize(max_ports_);
  lost_suspects_.resize((max_ports_ + kEvtchnWordBits - 1) / kEvtchnWordBits);
  virq_to_port_.resize(nr_vcpus_);
  for (auto& a : virq_to_port_) a.fill(0);
  vcpus_.resize(nr_vcpus_);
  const unsigned extra = nr_vcpus_ > kLegacyMaxVcpus ? nr_vcpus_ - kLegacyMaxVcpus : 0;
  if (extra) placeholder_.reset(new VcpuInfo[extra]());
  for (unsigned v = 0; v < nr_vcpus_; ++v) {
    if (v < kLegacyMaxVcpus) {
      vcpus_[v].info = shared_info_.subspan(v * kVcpuInfoBytes, kVcpuInfoBytes);
      vcpus_[v].guest_visible = true;
    } else {
      vcpus_[v].info = std::span<std::uint8_t>(
          reinterpret_cast<std::uint8_t*>(&placeholder_[v - kLegacyMaxVcpus]), kVcpuInfoBytes);
    }
  }
  dom0_.resize(1);  // dom0 endpoint numbers start at 1, like ports
}

EventChannels::~EventChannels() = default;

// ---- lock-free delivery on guest memory --------------------------------------------------------

std::uint64_t* EventChannels::pending_word(Port p) const noexcept {
  return reinterpret_cast<std::uint64_t*>(shared_info_.data() + kPendingOffset) + port_word(p);
}
std::uint64_t* EventChannels::mask_word(Port p) const noexcept {
  return reinterpret_cast<std::uint64_t*>(shared_info_.data() + kMaskOffset) + port_word(p);
}

void EventChannels::set_pending(Port p, std::uint32_t vcpu, bool resignal) noexcept {
  const std::uint64_t bit = port_bit(p);
  // 1. pending; an already pending port has already been signalled (unless told to resignal).
  if ((std::atomic_ref<std::uint64_t>(*pending_word(p)).fetch_or(bit, std::memory_order_acq_rel) &
       bit) &&
      !resignal)
    return;
  // 2. masked: the edge is recorded in pending only; unmask() delivers it.
  if (std::atomic_ref<std::uint64_t>(*mask_word(p)).load(std::memory_order_acquire) & bit) return;
  mark_sel_and_upcall(vcpu, port_word(p));
}

void EventChannels::dom0_kick_locked(Port p) noexcept {
  // Without a direct table, Xen's rule exactly (a pending port is not signalled again).
  set_pending(p, ports_[p].notify_vcpu, /*resignal=*/direct_ != nullptr);
}

void EventChannels::mark_sel_and_upcall(std::uint32_t vcpu, unsigned word) noexcept {
  // 3. selector bit for the word in the target vCPU's vcpu_info.
  const std::uint64_t sel_bit = std::uint64_t{1} << word;
  if (u64_at(vcpus_[vcpu].info, kPendingSelOffset).fetch_or(sel_bit, std::memory_order_acq_rel) &
      sel_bit)
    return;
  mark_upcall_pending(vcpu);
}

void EventChannels::mark_upcall_pending(std::uint32_t vcpu) noexcept {
  // 4. upcall_pending; 5. upcall only on its 0 → 1 edge.
  const VcpuSlot& s = vcpus_[vcpu];
  if (u8_at(s.info, kUpcallPendingOffset).exchange(1, std::memory_order_acq_rel) != 0) return;
  if (s.guest_visible) sink_.upcall(vcpu);
}

void EventChannels::raise_after_torn_kick_locked(Port p) noexcept {
  // The selector bit only for a port still pending and unmasked (steps 2–3); the upcall always,
  // on every vCPU the guest sees: the torn kick may have left a selector bit with no
  // upcall_pending, or upcall_pending with no interrupt, on the vCPU the port pointed at then.
  const std::uint64_t bit = port_bit(p);
  const bool live = (std::atomic_ref<std::uint64_t>(*pending_word(p)).load(std::memory_order_acquire) & bit) &&
                    !(std::atomic_ref<std::uint64_t>(*mask_word(p)).load(std::memory_order_acquire) & bit);
  if (live && vcpu_valid(ports_[p].notify_vcpu)) {
    u64_at(vcpus_[ports_[p].notify_vcpu].info, kPendingSelOffset)
        .fetch_or(std::uint64_t{1} << port_word(p), std::memory_order_acq_rel);
  }
  for (std::uint32_t v = 0; v < nr_vcpus_; ++v) {
    const VcpuSlot& s = vcpus_[v];
    if (!s.guest_visible) continue;
    u8_at(s.info, kUpcallPendingOffset).store(1, std::memory_order_release);
    sink_.upcall(v);
  }
}

void EventChannels::clear_pending(Port p) noexcept {
  std::atomic_ref<std::uint64_t>(*pending_word(p)).fetch_and(~port_bit(p),
                                                             std::memory_order_acq_rel);
}

// ---- the direct table (table_mu_ held exclusively) ---------------------------------------------

struct EventChannels::DirectWrite {
  explicit DirectWrite(DirectTable* t) noexcept : t_(t) {
    if (t_) t_->begin();
  }
  ~DirectWrite() {
    if (t_) t_->end();
  }
  DirectTable* t_;
};

std::uint64_t EventChannels::gpa_of(std::span<std::uint8_t> s) const noexcept {
  if (direct_mem_ == nullptr) return kNoGpa;
  const auto* p = s.data();
  for (const auto& r : direct_mem_->regions()) {
    if (p >= r.host && p + s.size() <= r.host + r.size) return r.gpa + static_cast<std::uint64_t>(p - r.host);
  }
  return kNoGpa;
}

void EventChannels::publish_endpoint_locked(Port dom0_port) noexcept {
  if (direct_ == nullptr || dom0_port == 0 || dom0_port >= dom0_.size()) return;
  const Port gp = dom0_[dom0_port] ? dom0_[dom0_port]->guest_port : 0;
  direct_->set_endpoint(dom0_port, gp, gp != 0 ? ports_[gp].notify_vcpu : 0);
}

void EventChannels::publish_port_locked(Port guest_port) noexcept {
  if (direct_ == nullptr || !port_valid(guest_port)) return;
  const Channel& c = ports_[guest_port];
  if (c.state == State::interdomain && c.remote_dom == 0) publish_endpoint_locked(c.remote_port);
}

void EventChannels::publish_locations_locked() noexcept {
  if (direct_ == nullptr) return;
  direct_->set_shared_info(gpa_of(shared_info_));
  for (unsigned v = 0; v < nr_vcpus_; ++v)
    direct_->set_vcpu_info(v, vcpus_[v].guest_visible ? gpa_of(vcpus_[v].info) : kNoGpa);
}

void EventChannels::attach_direct(DirectTable& table, const GuestMemory& spans_from) noexcept {
  std::unique_lock lk(table_mu_);
  direct_ = &table;
  direct_mem_ = &spans_from;
  DirectWrite w(direct_);
  publish_locations_locked();
  for (Port e = 1; e < dom0_.size(); ++e) publish_endpoint_locked(e);
}

void EventChannels::set_direct_route(unsigned vcpu, bool routed) noexcept {
  std::unique_lock lk(table_mu_);
  if (direct_ == nullptr || !vcpu_valid(vcpu)) return;
  DirectWrite w(direct_);
  direct_->set_routed(vcpu, routed);
}

// ---- port table helpers (table_mu_ held) -------------------------------------------------------

Expected<Port, XenErrno> EventChannels::find_free_port_locked() const noexcept {
  for (Port p = 1; p < max_ports_; ++p)
    if (ports_[p].state == State::closed) return p;
  return fail(XenErrno::enospc);
}

void EventChannels::free_channel_locked(Port p) noexcept {
  // Xen clears the pending bit so that a re-bound port does not start with a stale event, and
  // resets the notify vCPU to 0.
  clear_pending(p);
  ports_[p] = Channel{};
}

void EventChannels::close_locked(Port p) noexcept {
  Channel& c = ports_[p];
  switch (c.state) {
    case State::closed:
      return;
    case State::unbound:
    case State::ipi:
      break;
    case State::virq:
      for (auto& table : virq_to_port_)
        if (table[c.virq] == p) table[c.virq] = 0;
      break;
    case State::interdomain:
      if (c.remote_dom == domid_) {
        // Loopback: the peer waits for a new connection from us (Xen: remote → unbound).
        Channel& peer = ports_[c.remote_port];
        peer.state = State::unbound;
        peer.remote_dom = domid_;
        peer.remote_port = 0;
      } else {
        // dom0 endpoint: back to unbound (accepting this domain). Kick to_dom0 once so a backend
        // blocked in wait() wakes up and finds (through xenbus) that the frontend went away.
        Dom0Endpoint& e = *dom0_[c.remote_port];
        e.guest_port = 0;
        route_endpoint_locked(c.remote_port);
        {
          DirectWrite w(direct_);
          publish_endpoint_locked(c.remote_port);
        }
        (void)e.to_dom0.notify();
      }
      break;
  }
  free_channel_locked(p);
}

void EventChannels::send_locked(const Channel& c, Port p) noexcept {
  switch (c.state) {
    case State::interdomain:
      if (c.remote_dom == domid_) {
        set_pending(c.remote_port, ports_[c.remote_port].notify_vcpu);
      } else {
        (void)dom0_[c.remote_port]->to_dom0.notify();
      }
      return;
    case State::ipi:
      set_pending(p, c.notify_vcpu);
      return;
    default:
      return;
  }
}

// ---- guest operations --------------------------------------------------------------------------

Expected<Port, XenErrno> EventChannels::alloc_unbound(DomId remote_dom) noexcept {
  std::unique_lock lk(table_mu_);
  auto p = find_free_port_locked();
  if (!p) return p;
  Channel& c = ports_[*p];
  c = Channel{};
  c.state = State::unbound;
  c.remote_dom = remote_dom == kDomidSelf ? domid_ : remote_dom;
  return p;
}

Expected<Port, XenErrno> EventChannels::bind_interdomain(DomId remote_dom,
                                                         Port remote_port) noexcept {
  const DomId rdom = remote_dom == kDomidSelf ? domid_ : remote_dom;
  // Only this domain (loopback) and dom0 live where this process can reach them.
  if (rdom != domid_ && rdom != 0) return fail(XenErrno::esrch);

  std::unique_lock lk(table_mu_);
  // Xen allocates the local port before looking at the remote one (ENOSPC wins over EINVAL).
  auto lport = find_free_port_locked();
  if (!lport) return lport;

  if (rdom == domid_) {
    if (!port_valid(remote_port)) return fail(XenErrno::einval);
    Channel& r = ports_[remote_port];
    if (r.state != State::unbound || r.remote_dom != domid_) return fail(XenErrno::einval);
    r.state = State::interdomain;
    r.remote_dom = domid_;
    r.remote_port = *lport;
  } else {
    if (remote_port == 0 || remote_port >= dom0_.size() || !dom0_[remote_port] ||
        dom0_[remote_port]->guest_port != 0)
      return fail(XenErrno::einval);
    dom0_[remote_port]->guest_port = *lport;
  }
  Channel& l = ports_[*lport];
  l = Channel{};
  l.state = State::interdomain;
  l.remote_dom = rdom;
  l.remote_port = remote_port;
  if (rdom == 0) {
    route_endpoint_locked(remote_port);
    DirectWrite w(direct_);
    publish_endpoint_locked(remote_port);
  }
  // The remote may have sent while it was unbound (and that was dropped): as Xen, always make
  // the new local port pending once.
  set_pending(*lport, l.notify_vcpu);
  return lport;
}

Expected<Port, XenErrno> EventChannels::bind_virq(std::uint32_t virq, std::uint32_t vcpu) noexcept {
  if (virq >= kNrVirqs) return fail(XenErrno::einval);
  if (virq_is_global(virq) && vcpu != 0) return fail(XenErrno::einval);
  if (!vcpu_valid(vcpu)) return fail(XenErrno::enoent);

  std::unique_lock lk(table_mu_);
  if (virq_to_port_[vcpu][virq] != 0) return fail(XenErrno::eexist);
  auto p = find_free_port_locked();
  if (!p) return p;
  Channel& c = ports_[*p];
  c = Channel{};
  c.state = State::virq;
  c.notify_vcpu = vcpu;
  c.virq = virq;
  virq_to_port_[vcpu][virq] = *p;
  return p;
}

Expected<Port, XenErrno> EventChannels::bind_ipi(std::uint32_t vcpu) noexcept {
  if (!vcpu_valid(vcpu)) return fail(XenErrno::enoent);
  std::unique_lock lk(table_mu_);
  auto p = find_free_port_locked();
  if (!p) return p;
  Channel& c = ports_[*p];
  c = Channel{};
  c.state = State::ipi;
  c.notify_vcpu = vcpu;
  return p;
}

Expected<void, XenErrno> EventChannels::bind_vcpu(Port port, std::uint32_t vcpu) noexcept {
  if (!vcpu_valid(vcpu)) return fail(XenErrno::enoent);
  std::unique_lock lk(table_mu_);
  if (!port_valid(port)) return fail(XenErrno::einval);
  Channel& c = ports_[port];
  switch (c.state) {
    case State::virq:
      if (!virq_is_global(c.virq)) return fail(XenErrno::einval);
      c.notify_vcpu = vcpu;
      return {};
    case State::unbound:
    case State::interdomain: {
      c.notify_vcpu = vcpu;
      DirectWrite w(direct_);
      publish_port_locked(port);
      return {};
    }
    default:
      return fail(XenErrno::einval);
  }
}

Expected<void, XenErrno> EventChannels::send(Port port) noexcept {
  if (!port_valid(port)) return fail(XenErrno::einval);
  std::shared_lock lk(table_mu_);
  const Channel& c = ports_[port];
  switch (c.state) {
    case State::interdomain:
    case State::ipi:
      send_locked(c, port);
      return {};
    case State::unbound:
      return {};  // Xen: silently dropped
    default:
      return fail(XenErrno::einval);
  }
}

Expected<void, XenErrno> EventChannels::unmask(Port port) noexcept {
  if (!port_valid(port)) return fail(XenErrno::einval);
  std::shared_lock lk(table_mu_);
  const std::uint64_t bit = port_bit(port);
  // Same order as set_pending: only a 1 → 0 mask edge with the port pending re-delivers.
  if (!(std::atomic_ref<std::uint64_t>(*mask_word(port))
            .fetch_and(~bit, std::memory_order_acq_rel) &
        bit))
    return {};
  if (!(std::atomic_ref<std::uint64_t>(*pending_word(port)).load(std::memory_order_acquire) & bit))
    return {};
  mark_sel_and_upcall(ports_[port].notify_vcpu, port_word(port));
  return {};
}

std::size_t EventChannels::redeliver_lost_edges(Port* first) noexcept {
  std::shared_lock lk(table_mu_);
  std::size_t n = 0;
  for (unsigned w = 0; w < lost_suspects_.size(); ++w) {
    const Port base = static_cast<Port>(w * kEvtchnWordBits);
    const std::uint64_t live = std::atomic_ref<std::uint64_t>(*pending_word(base)).load(std::memory_order_acquire) &
                               ~std::atomic_ref<std::uint64_t>(*mask_word(base)).load(std::memory_order_acquire);
    std::uint64_t suspects = 0;
    for (std::uint64_t bits = live; bits != 0; bits &= bits - 1) {
      const Port p = base + static_cast<Port>(std::countr_zero(bits));
      if (!port_valid(p) || ports_[p].state == State::closed) continue;
      const std::uint32_t v = ports_[p].notify_vcpu;
      if (!vcpu_valid(v) || !vcpus_[v].guest_visible) continue;
      if (!(u64_at(vcpus_[v].info, kPendingSelOffset).load(std::memory_order_acquire) & (std::uint64_t{1} << w)))
        suspects |= port_bit(p);
    }
    const std::uint64_t lost = suspects & lost_suspects_[w];
    lost_suspects_[w] = suspects & ~lost;  // a port signalled again starts over
    for (std::uint64_t bits = lost; bits != 0; bits &= bits - 1) {
      const Port p = base + static_cast<Port>(std::countr_zero(bits));
      if (n++ == 0 && first != nullptr) *first = p;
      mark_sel_and_upcall(ports_[p].notify_vcpu, w);
    }
  }
  return n;
}

Expected<void, XenErrno> EventChannels::close(Port port) noexcept {
  if (!port_valid(port)) return fail(XenErrno::einval);
  std::unique_lock lk(table_mu_);
  if (ports_[port].state == State::closed) return fail(XenErrno::einval);
  close_locked(port);
  return {};
}

Expected<EvtchnStatus, XenErrno> EventChannels::status(Port port) const noexcept {
  if (!port_valid(port)) return fail(XenErrno::einval);
  std::shared_lock lk(table_mu_);
  const Channel& c = ports_[port];
  EvtchnStatus s;
  s.vcpu = c.notify_vcpu;
  switch (c.state) {
    case State::closed:
      s.status = EvtchnStat::closed;
      break;
    case State::unbound:
      s.status = EvtchnStat::unbound;
      s.remote_dom = c.remote_dom;
      break;
    case State::interdomain:
      s.status = EvtchnStat::interdomain;
      s.remote_dom = c.remote_dom;
      s.remote_port = c.remote_port;
      break;
    case State::virq:
      s.status = EvtchnStat::virq;
      s.virq = c.virq;
      break;
    case State::ipi:
      s.status = EvtchnStat::ipi;
      break;
  }
  return s;
}

void EventChannels::reset() noexcept {
  std::unique_lock lk(table_mu_);
  for (Port p = 1; p < max_ports_; ++p) close_locked(p);
}

Expected<void, XenErrno> EventChannels::register_vcpu_info(unsigned vcpu,
                                                           std::span<std::uint8_t> at) noexcept {
  if (!vcpu_valid(vcpu)) return fail(XenErrno::enoent);
  if (at.size() < kVcpuInfoBytes || !aligned8(at.data()) ||
      reinterpret_cast<std::uintptr_t>(at.data()) % kPageSize + kVcpuInfoBytes > kPageSize)
    return fail(XenErrno::enxio);
  at = at.first(kVcpuInfoBytes);

  std::unique_lock lk(table_mu_);
  VcpuSlot& s = vcpus_[vcpu];
  if (s.registered) return fail(XenErrno::einval);
  // Copy the current contents word by word (the old and new areas may overlap; the guest may be
  // looking at either), so nothing already recorded is lost. A vCPU that had only the host-side
  // placeholder starts from zeroes (Xen does the same for its dummy vcpu_info).
  constexpr std::size_t kWords = kVcpuInfoBytes / sizeof(std::uint64_t);
  std::uint64_t tmp[kWords] = {};
  if (s.guest_visible) {
    for (std::size_t i = 0; i < kWords; ++i)
      tmp[i] = u64_at(s.info, i * sizeof(std::uint64_t)).load(std::memory_order_acquire);
  }
  for (std::size_t i = 0; i < kWords; ++i)
    u64_at(at, i * sizeof(std::uint64_t)).store(tmp[i], std::memory_order_release);
  s.info = at;
  s.guest_visible = true;
  s.registered = true;
  if (direct_ != nullptr) {
    DirectWrite w(direct_);
    direct_->set_vcpu_info(vcpu, gpa_of(s.info));
  }
  // As Xen: mark every word as possibly pending and raise an upcall; the guest copes with a
  // spurious one.
  u64_at(s.info, kPendingSelOffset).store(~std::uint64_t{0}, std::memory_order_release);
  mark_upcall_pending(vcpu);
  return {};
}

Expected<void, XenErrno> EventChannels::register_vcpu_info(unsigned vcpu, const GuestMemory& mem,
                                                           std::uint64_t gfn,
                                                           std::uint32_t offset) noexcept {
  if (!vcpu_valid(vcpu)) return fail(XenErrno::enoent);
  if (offset > kPageSize - kVcpuInfoBytes) return fail(XenErrno::enxio);
  if (gfn > (UINT64_MAX >> kPageShift)) return fail(XenErrno::einval);
  auto span = mem.translate((gfn << kPageShift) + offset, kVcpuInfoBytes);
  if (!span) return fail(XenErrno::einval);
  return register_vcpu_info(vcpu, *span);
}

Expected<void, XenErrno> EventChannels::move_shared_info(std::span<std::uint8_t> page) noexcept {
  if (page.size() < kSharedInfoPageBytes || !aligned8(page.data())) return fail(XenErrno::einval);
  page = page.first(kSharedInfoPageBytes);

  std::unique_lock lk(table_mu_);
  const std::uintptr_t old_lo = reinterpret_cast<std::uintptr_t>(shared_info_.data());
  const std::uintptr_t new_lo = reinterpret_cast<std::uintptr_t>(page.data());
  if (old_lo == new_lo) return {};
  if (new_lo < old_lo + kSharedInfoPageBytes && old_lo < new_lo + kSharedInfoPageBytes)
    return fail(XenErrno::einval);
  auto in_page = [](std::uintptr_t lo, std::span<std::uint8_t> s) noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(s.data());
    return a >= lo && a + s.size() <= lo + kSharedInfoPageBytes;
  };

  // Backends' direct kicks see the table being written from before the copy to the new place's
  // publication: a kick that set a pending bit in the old page after the copy read it then
  // finds the table changed and hands over to the classic path (DirectUpcall::kick).
  DirectWrite w(direct_);
  // Build the new contents in a host buffer (word by word from guest memory, atomically, as the
  // guest may still change bits), then store it into the new page.
  constexpr std::size_t kWords = kSharedInfoPageBytes / sizeof(std::uint64_t);
  std::uint64_t img[kWords] = {};
  auto copy_words = [&](std::span<std::uint8_t> from, std::size_t to_off, std::size_t bytes) {
    for (std::size_t i = 0; i < bytes / sizeof(std::uint64_t); ++i)
      img[to_off / sizeof(std::uint64_t) + i] =
          u64_at(from, i * sizeof(std::uint64_t)).load(std::memory_order_acquire);
  };
  copy_words(shared_info_.subspan(kPendingOffset), kPendingOffset,
             sizeof(SharedInfo::evtchn_pending));
  copy_words(shared_info_.subspan(kMaskOffset), kMaskOffset, sizeof(SharedInfo::evtchn_mask));
  for (const VcpuSlot& s : vcpus_)
    if (in_page(old_lo, s.info))
      copy_words(s.info, reinterpret_cast<std::uintptr_t>(s.info.data()) - old_lo, kVcpuInfoBytes);
  // A vcpu_info the guest registered inside the new page stays live where it is.
  for (const VcpuSlot& s : vcpus_)
    if (s.registered && in_page(new_lo, s.info))
      copy_words(s.info, reinterpret_cast<std::uintptr_t>(s.info.data()) - new_lo, kVcpuInfoBytes);
  for (std::size_t i = 0; i < kWords; ++i)
    u64_at(page, i * sizeof(std::uint64_t)).store(img[i], std::memory_order_release);

  for (VcpuSlot& s : vcpus_)
    if (in_page(old_lo, s.info))
      s.info = page.subspan(reinterpret_cast<std::uintptr_t>(s.info.data()) - old_lo, kVcpuInfoBytes);
  shared_info_ = page;
  publish_locations_locked();
  return {};
}

// ---- host-side delivery ------------------------------------------------------------------------

Expected<void, XenErrno> EventChannels::raise_virq(std::uint32_t virq,
                                                   std::uint32_t vcpu) noexcept {
  if (virq >= kNrVirqs || !vcpu_valid(vcpu)) return fail(XenErrno::einval);
  std::shared_lock lk(table_mu_);
  const Port p = virq_to_port_[virq_is_global(virq) ? 0 : vcpu][virq];
  if (p == 0) return fail(XenErrno::enoent);
  set_pending(p, ports_[p].notify_vcpu);
  return {};
}

Expected<void, XenErrno> EventChannels::deliver(Port port) noexcept {
  if (!port_valid(port)) return fail(XenErrno::einval);
  std::shared_lock lk(table_mu_);
  const Channel& c = ports_[port];
  if (c.state == State::closed) return fail(XenErrno::einval);
  set_pending(port, c.notify_vcpu);
  return {};
}

bool EventChannels::upcall_masked(unsigned vcpu) const noexcept {
  if (!vcpu_valid(vcpu)) return false;
  std::shared_lock lk(table_mu_);
  return u8_at(vcpus_[vcpu].info, kUpcallMaskOffset).load(std::memory_order_acquire) != 0;
}

bool EventChannels::upcall_pending(unsigned vcpu) const noexcept {
  if (!vcpu_valid(vcpu)) return false;
  std::shared_lock lk(table_mu_);
  // A vCPU ≥ 32 without a registered vcpu_info records its events in the host placeholder,
  // which the guest cannot see or clear: nothing there is an upcall it could take. Reporting it
  // made the platform inject one when the guest chose an upcall mode, and xpv-vmm's re-assertion
  // every 20 ms for ever. register_vcpu_info raises the upcall in the real vcpu_info.
  if (!vcpus_[vcpu].guest_visible) return false;
  return u8_at(vcpus_[vcpu].info, kUpcallPendingOffset).load(std::memory_order_acquire) != 0;
}

bool EventChannels::port_pending(Port port) const noexcept {
  if (!port_valid(port)) return false;
  std::shared_lock lk(table_mu_);
  return (std::atomic_ref<std::uint64_t>(*pending_word(port)).load(std::memory_order_acquire) &
          port_bit(port)) != 0;
}

// ---- dom0 side ---------------------------------------------------------------------------------

Expected<Port, XenErrno> EventChannels::new_dom0_endpoint_locked() noexcept {
  auto to = EventFd::create();
  auto from = EventFd::create();
  if (!to || !from) return fail(XenErrno::enomem);
  try {
    auto e = std::make_unique<Dom0Endpoint>();
    e->to_dom0 = std::move(*to);
    e->from_dom0 = std::move(*from);
    for (Port i = 1; i < dom0_.size(); ++i) {
      if (!dom0_[i]) {
        dom0_[i] = std::move(e);
        return i;
      }
    }
    if (dom0_.size() >= max_ports_) return fail(XenErrno::enospc);
    dom0_.push_back(std::move(e));
    return static_cast<Port>(dom0_.size() - 1);
  } catch (const std::bad_alloc&) {
    return fail(XenErrno::enomem);
  }
}

Expected<Dom0Fds, XenErrno> EventChannels::make_dom0_fds(Port dom0_port,
                                                         const Dom0Endpoint& e) const noexcept {
  auto to = e.to_dom0.dup();
  auto from = e.from_dom0.dup();
  if (!to || !from) return fail(XenErrno::enomem);
  Dom0Fds fds;
  fds.dom0_port = dom0_port;
  fds.guest_port = e.guest_port;
  fds.to_dom0 = std::move(*to);
  fds.from_dom0 = std::move(*from);
  return fds;
}

Expected<Dom0Fds, XenErrno> EventChannels::bind_to_dom0(Port guest_port) noexcept {
  if (!port_valid(guest_port)) return fail(XenErrno::einval);
  std::unique_lock lk(table_mu_);
  Channel& c = ports_[guest_port];
  if (c.state != State::unbound || c.remote_dom != 0) return fail(XenErrno::einval);
  auto dp = new_dom0_endpoint_locked();
  if (!dp) return fail(dp.error());
  Dom0Endpoint& e = *dom0_[*dp];
  e.guest_port = guest_port;
  auto fds = make_dom0_fds(*dp, e);
  if (!fds) {
    dom0_[*dp].reset();
    return fds;
  }
  c.state = State::interdomain;
  c.remote_dom = 0;
  c.remote_port = *dp;
  route_endpoint_locked(*dp);
  {
    DirectWrite w(direct_);
    publish_endpoint_locked(*dp);
  }
  // The binder's new port starts pending (Xen's bind_interdomain): the backend looks once.
  (void)e.to_dom0.notify();
  return fds;
}

Expected<Dom0Fds, XenErrno> EventChannels::dom0_alloc_unbound() noexcept {
  std::unique_lock lk(table_mu_);
  auto dp = new_dom0_endpoint_locked();
  if (!dp) return fail(dp.error());
  auto fds = make_dom0_fds(*dp, *dom0_[*dp]);
  if (!fds) dom0_[*dp].reset();
  return fds;
}

Expected<void, XenErrno> EventChannels::dom0_close(Port dom0_port, bool owner_gone) noexcept {
  std::unique_lock lk(table_mu_);
  if (dom0_port == 0 || dom0_port >= dom0_.size() || !dom0_[dom0_port])
    return fail(XenErrno::einval);
  if (const Port gp = dom0_[dom0_port]->guest_port; gp != 0) {
    // Xen: the remote end of a closed interdomain channel waits for a new connection from the
    // closer (dom 0). Its pending bit and notify vCPU are left as they are.
    Channel& c = ports_[gp];
    c.state = State::unbound;
    c.remote_dom = 0;
    c.remote_port = 0;
    dom0_[dom0_port]->guest_port = 0;
    route_endpoint_locked(dom0_port);
    // A direct kick torn by the backend's death (see the header).
    if (owner_gone && direct_ != nullptr) raise_after_torn_kick_locked(gp);
  }
  dom0_[dom0_port].reset();
  {
    DirectWrite w(direct_);
    publish_endpoint_locked(dom0_port);
  }
  return {};
}

void EventChannels::route_endpoint_locked(Port dom0_port) noexcept {
  Dom0Endpoint& e = *dom0_[dom0_port];
  if (e.routed == e.guest_port) return;
  if (e.routed != 0) {
    if (route_sink_ != nullptr) route_sink_->unroute(e.routed, e.to_dom0.fd());
    e.routed = 0;
  }
  if (e.guest_port != 0 && route_sink_ != nullptr && route_sink_->route(e.guest_port, e.to_dom0.fd())) {
    e.routed = e.guest_port;
  }
}

void EventChannels::set_send_route_sink(SendRouteSink* sink) noexcept {
  std::unique_lock lk(table_mu_);
  for (Port p = 1; p < dom0_.size(); ++p) {
    if (!dom0_[p] || dom0_[p]->routed == 0) continue;
    if (route_sink_ != nullptr) route_sink_->unroute(dom0_[p]->routed, dom0_[p]->to_dom0.fd());
    dom0_[p]->routed = 0;
  }
  route_sink_ = sink;
  for (Port p = 1; p < dom0_.size(); ++p) {
    if (dom0_[p]) route_endpoint_locked(p);
  }
}

Expected<Dom0EndpointStatus, XenErrno> EventChannels::dom0_status(Port dom0_port) const noexcept {
  std::shared_lock lk(table_mu_);
  if (dom0_port == 0 || dom0_port >= dom0_.size() || !dom0_[dom0_port])
    return fail(XenErrno::einval);
  Dom0EndpointStatus s;
  s.guest_port = dom0_[dom0_port]->guest_port;
  s.status = s.guest_port ? EvtchnStat::interdomain : EvtchnStat::unbound;
  return s;
}

int EventChannels::kick_fd(Port dom0_port) const noexcept {
  std::shared_lock lk(table_mu_);
  if (dom0_port == 0 || dom0_port >= dom0_.size() || !dom0_[dom0_port]) return -1;
  return dom0_[dom0_port]->from_dom0.fd();
}

Expected<std::uint64_t, XenErrno> EventChannels::service_dom0_kick(Port dom0_port) noexcept {
  std::shared_lock lk(table_mu_);
  if (dom0_port == 0 || dom0_port >= dom0_.size() || !dom0_[dom0_port])
    return fail(XenErrno::einval);
  const Dom0Endpoint& e = *dom0_[dom0_port];
  const std::uint64_t n = e.from_dom0.consume().value_or(0);
  if (n != 0 && e.guest_port != 0) dom0_kick_locked(e.guest_port);
  return n;
}

std::uint64_t EventChannels::service_dom0_kicks() noexcept {
  std::shared_lock lk(table_mu_);
  std::uint64_t total = 0;
  for (const auto& e : dom0_) {
    if (!e) continue;
    const std::uint64_t n = e->from_dom0.consume().value_or(0);
    if (n != 0 && e->guest_port != 0) dom0_kick_locked(e->guest_port);
    total += n;
  }
  return total;
}

}  // namespace xpv::domain
