// Direct upcalls: see the header. The delivery steps are EventChannels::set_pending's (event_2l).
#include "xpv/domain/direct_upcall.h"

#include <fmt/core.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include "xpv/domain/shared_info.h"

namespace xpv::domain {

namespace {

constexpr std::size_t kHeaderBytes = sizeof(DirectTableHeader);
constexpr std::size_t kPageBytes = 4096;

std::size_t vcpu_offset(std::uint32_t v) noexcept { return kHeaderBytes + v * sizeof(DirectTableVcpu); }
std::size_t endpoint_offset(std::uint32_t nr_vcpus, std::uint32_t e) noexcept {
  return vcpu_offset(nr_vcpus) + e * sizeof(DirectTableEndpoint);
}

template <class T>
std::atomic_ref<T> at(std::uint8_t* base, std::size_t off) noexcept {
  return std::atomic_ref<T>(*reinterpret_cast<T*>(base + off));
}

constexpr std::size_t kSeq = offsetof(DirectTableHeader, seq);
constexpr std::size_t kSharedInfoGpa = offsetof(DirectTableHeader, shared_info_gpa);

}  // namespace

std::size_t direct_table_bytes(std::uint32_t nr_vcpus, std::uint32_t nr_endpoints) noexcept {
  const std::size_t raw = endpoint_offset(nr_vcpus, nr_endpoints);
  return (raw + kPageBytes - 1) / kPageBytes * kPageBytes;
}

// ---- the domain's side -------------------------------------------------------------------------

DirectTable::DirectTable(std::uint32_t nr_vcpus, std::uint32_t nr_endpoints)
    : nr_vcpus_(nr_vcpus), nr_endpoints_(nr_endpoints) {
  if (nr_vcpus == 0 || nr_vcpus > 4096 || nr_endpoints == 0 || nr_endpoints > kEvtchn2lNrChannels) {
    throw std::invalid_argument(fmt::format("direct upcall table: {} vCPUs, {} endpoints", nr_vcpus, nr_endpoints));
  }
  bytes_ = direct_table_bytes(nr_vcpus, nr_endpoints);
  fd_ = UniqueFd(::memfd_create("xpv-direct-upcall", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd_.valid()) throw std::system_error(errno, std::generic_category(), "memfd_create (direct upcall table)");
  if (::ftruncate(fd_.get(), static_cast<off_t>(bytes_)) != 0) {
    throw std::system_error(errno, std::generic_category(), "ftruncate (direct upcall table)");
  }
  // The size is fixed: a reader's bounds check on it stays true.
  (void)::fcntl(fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (p == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "mmap (direct upcall table)");
  base_ = static_cast<std::uint8_t*>(p);
  auto* h = reinterpret_cast<DirectTableHeader*>(base_);
  h->magic = kDirectTableMagic;
  h->version = kDirectTableVersion;
  h->nr_vcpus = nr_vcpus;
  h->nr_endpoints = nr_endpoints;
  h->shared_info_gpa = kNoGpa;
  for (std::uint32_t v = 0; v < nr_vcpus; ++v) {
    reinterpret_cast<DirectTableVcpu*>(base_ + vcpu_offset(v))->vcpu_info_gpa = kNoGpa;
  }
  std::atomic_thread_fence(std::memory_order_release);
}

DirectTable::~DirectTable() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

void DirectTable::begin() noexcept {
  auto seq = at<std::uint32_t>(base_, kSeq);
  seq.store(seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  // seq_cst, not release: what the writer then reads of guest memory (move_shared_info's copy)
  // must come after the odd count is visible, as well as what it writes (against the fence
  // after DirectUpcall::kick's step 1).
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void DirectTable::end() noexcept {
  auto seq = at<std::uint32_t>(base_, kSeq);
  seq.store(seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

void DirectTable::set_shared_info(std::uint64_t gpa) noexcept {
  at<std::uint64_t>(base_, kSharedInfoGpa).store(gpa, std::memory_order_relaxed);
}

void DirectTable::set_vcpu_info(std::uint32_t vcpu, std::uint64_t gpa) noexcept {
  if (vcpu >= nr_vcpus_) return;
  at<std::uint64_t>(base_, vcpu_offset(vcpu) + offsetof(DirectTableVcpu, vcpu_info_gpa))
      .store(gpa, std::memory_order_relaxed);
}

void DirectTable::set_routed(std::uint32_t vcpu, bool routed) noexcept {
  if (vcpu >= nr_vcpus_) return;
  at<std::uint32_t>(base_, vcpu_offset(vcpu) + offsetof(DirectTableVcpu, routed))
      .store(routed ? 1 : 0, std::memory_order_relaxed);
}

void DirectTable::set_endpoint(std::uint32_t dom0_port, std::uint32_t guest_port, std::uint32_t vcpu) noexcept {
  if (dom0_port >= nr_endpoints_) return;
  const std::size_t off = endpoint_offset(nr_vcpus_, dom0_port);
  at<std::uint32_t>(base_, off + offsetof(DirectTableEndpoint, guest_port)).store(guest_port, std::memory_order_relaxed);
  at<std::uint32_t>(base_, off + offsetof(DirectTableEndpoint, notify_vcpu)).store(vcpu, std::memory_order_relaxed);
}

// ---- a dom0 service's side ---------------------------------------------------------------------

DirectUpcall::DirectUpcall(UniqueFd table, std::vector<UniqueFd> vcpu_fds, UniqueFd memfd,
                           std::vector<MemoryRegion> layout)
    : vcpu_fds_(std::move(vcpu_fds)), memory_(DomainMemory::attach(std::move(memfd), std::move(layout))) {
  struct stat st {};
  if (!table.valid() || ::fstat(table.get(), &st) != 0 || st.st_size < static_cast<off_t>(kHeaderBytes)) {
    throw std::invalid_argument("direct upcall table: not a file of at least a header");
  }
  bytes_ = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, table.get(), 0);
  if (p == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "mmap (direct upcall table)");
  base_ = static_cast<std::uint8_t*>(p);
  DirectTableHeader h{};
  std::memcpy(&h, base_, sizeof h);
  if (h.magic != kDirectTableMagic || h.version != kDirectTableVersion || h.nr_vcpus != vcpu_fds_.size() ||
      h.nr_endpoints == 0 || h.nr_endpoints > kEvtchn2lNrChannels ||
      direct_table_bytes(h.nr_vcpus, h.nr_endpoints) > bytes_) {
    ::munmap(base_, bytes_);
    base_ = nullptr;
    throw std::invalid_argument(fmt::format("direct upcall table: bad header (magic {:#x} version {}, {} vCPUs for {} "
                                            "eventfds, {} endpoints, {} bytes)",
                                            h.magic, h.version, h.nr_vcpus, vcpu_fds_.size(), h.nr_endpoints, bytes_));
  }
  nr_endpoints_ = h.nr_endpoints;
  for (const auto& fd : vcpu_fds_) {
    if (!fd.valid()) {
      ::munmap(base_, bytes_);
      base_ = nullptr;
      throw std::invalid_argument("direct upcall table: a vCPU without an upcall eventfd");
    }
  }
}

DirectUpcall::~DirectUpcall() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

std::uint8_t* DirectUpcall::guest(std::uint64_t gpa, std::size_t len) const noexcept {
  if (gpa == kNoGpa || gpa % 8 != 0) return nullptr;
  auto s = memory_.view().translate(gpa, len);
  return s ? s->data() : nullptr;
}

bool DirectUpcall::still(std::uint32_t seq) const noexcept {
  std::atomic_thread_fence(std::memory_order_acquire);
  return at<std::uint32_t>(base_, kSeq).load(std::memory_order_relaxed) == seq;
}

bool DirectUpcall::snapshot(std::uint32_t dom0_port, Snapshot& s, bool& usable) const noexcept {
  usable = false;
  const auto nr_vcpus = static_cast<std::uint32_t>(vcpu_fds_.size());
  s.seq = at<std::uint32_t>(base_, kSeq).load(std::memory_order_acquire);
  if (s.seq & 1) return false;
  const std::size_t ep = endpoint_offset(nr_vcpus, dom0_port);
  s.guest_port = at<std::uint32_t>(base_, ep + offsetof(DirectTableEndpoint, guest_port)).load(std::memory_order_relaxed);
  s.vcpu = at<std::uint32_t>(base_, ep + offsetof(DirectTableEndpoint, notify_vcpu)).load(std::memory_order_relaxed);
  const std::uint64_t si = at<std::uint64_t>(base_, kSharedInfoGpa).load(std::memory_order_relaxed);
  std::uint64_t vi = kNoGpa;
  if (s.vcpu < nr_vcpus) {
    vi = at<std::uint64_t>(base_, vcpu_offset(s.vcpu) + offsetof(DirectTableVcpu, vcpu_info_gpa))
             .load(std::memory_order_relaxed);
    s.routed = at<std::uint32_t>(base_, vcpu_offset(s.vcpu) + offsetof(DirectTableVcpu, routed))
                   .load(std::memory_order_relaxed) != 0;
  }
  if (!still(s.seq)) return false;
  // Consistent. Usable only if everything is where this process can reach it.
  if (s.guest_port == 0 || s.guest_port >= kEvtchn2lNrChannels || s.vcpu >= nr_vcpus || !s.routed) return true;
  std::uint8_t* info = guest(si, kSharedInfoPageBytes);
  s.vcpu_info = guest(vi, sizeof(VcpuInfo));
  if (info == nullptr || s.vcpu_info == nullptr) return true;
  const unsigned word = s.guest_port / kEvtchnWordBits;
  s.pending = reinterpret_cast<std::uint64_t*>(info + offsetof(SharedInfo, evtchn_pending)) + word;
  s.mask = reinterpret_cast<std::uint64_t*>(info + offsetof(SharedInfo, evtchn_mask)) + word;
  usable = true;
  return true;
}

bool DirectUpcall::kick(std::uint32_t dom0_port) noexcept {
  if (dom0_port == 0 || dom0_port >= nr_endpoints_) {
    declined_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  Snapshot s;
  bool usable = false;
  bool pending_set = false;
  const std::uint64_t* pending_at = nullptr;  // where step 1 set the bit, for which port
  std::uint32_t pending_port = 0;
  for (int attempt = 0; attempt < kMaxRetries; ++attempt) {
    if (!snapshot(dom0_port, s, usable)) continue;  // the domain is writing: read again
    if (!usable) {
      if (s.guest_port == 0) {
        // Not connected (any more): an event on an unbound port is dropped, as Xen does.
        if (pending_set) return true;
      }
      break;
    }
    // The bit set in step 1 is not where the table now points (shared_info moved, or another
    // port): it may have missed the move's copy, so the classic path sets it again, there.
    if (pending_set && (s.pending != pending_at || s.guest_port != pending_port)) break;
    const std::uint64_t bit = std::uint64_t{1} << (s.guest_port % kEvtchnWordBits);
    if (after_snapshot_ && !pending_set) after_snapshot_();
    // 1. pending: an already pending port has been signalled (unless we set it a moment ago).
    if (!pending_set) {
      pending_set = true;
      pending_at = s.pending;
      pending_port = s.guest_port;
      const std::uint64_t was = std::atomic_ref<std::uint64_t>(*s.pending).fetch_or(bit, std::memory_order_seq_cst);
      // Against DirectTable::begin's fence: either a shared_info move's copy sees this bit, or
      // the checks below see the move's table write and hand over.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (was & bit) {
        delivered_.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
    }
    // 2. masked: the guest's unmask delivers it.
    const bool masked = (std::atomic_ref<std::uint64_t>(*s.mask).load(std::memory_order_acquire) & bit) != 0;
    // The binding this is delivered to must be the one of this moment.
    if (!still(s.seq)) continue;
    if (masked) {
      delivered_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    // 3. selector bit; 4. upcall_pending; 5. the interrupt on its 0 → 1 edge (raised whatever
    // follows: a spare interrupt costs the guest one scan, a missing one loses the event, since
    // upcall_pending now says one is on its way). The kick ends only with the table still as
    // read: a move of shared_info or vcpu_info since then may have copied these bits before
    // they were set here, and the classic path sets them again where the guest looks now.
    const std::uint64_t sel_bit = std::uint64_t{1} << (s.guest_port / kEvtchnWordBits);
    auto sel = std::atomic_ref<std::uint64_t>(
        *reinterpret_cast<std::uint64_t*>(s.vcpu_info + offsetof(VcpuInfo, evtchn_pending_sel)));
    auto up = std::atomic_ref<std::uint8_t>(*(s.vcpu_info + offsetof(VcpuInfo, evtchn_upcall_pending)));
    const bool raise = (sel.fetch_or(sel_bit, std::memory_order_acq_rel) & sel_bit) == 0 &&
                       up.exchange(1, std::memory_order_acq_rel) == 0;
    const std::uint64_t one = 1;
    const bool raised = raise && ::write(vcpu_fds_[s.vcpu].get(), &one, sizeof one) == sizeof one;
    if (raised) interrupts_.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);  // the bits above before the check, as in step 1
    if (!still(s.seq)) break;
    if (raise && !raised) break;  // the interrupt could not be raised: let the domain do it
    delivered_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  declined_.fetch_add(1, std::memory_order_relaxed);
  // Also after step 1: the classic path re-signals a kicked port it finds pending and unmasked
  // (EventChannels::service_dom0_kick), so nothing is lost.
  return false;
}

}  // namespace xpv::domain
