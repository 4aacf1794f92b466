#include "xpv/frontends/guest_events.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstddef>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "xpv/domain/shared_info.h"

namespace xpv::frontends {

using domain::SharedInfo;
using domain::VcpuInfo;

namespace {
template <class T>
std::atomic_ref<T> at(std::span<std::uint8_t> page, std::size_t off) {
  return std::atomic_ref<T>(*reinterpret_cast<T*>(page.data() + off));
}
constexpr std::size_t kVcpu0 = offsetof(SharedInfo, vcpu_info);
constexpr std::size_t kUpcallPending = kVcpu0 + offsetof(VcpuInfo, evtchn_upcall_pending);
constexpr std::size_t kPendingSel = kVcpu0 + offsetof(VcpuInfo, evtchn_pending_sel);
constexpr std::size_t kPending = offsetof(SharedInfo, evtchn_pending);
constexpr std::size_t kMask = offsetof(SharedInfo, evtchn_mask);
constexpr unsigned kWords = sizeof(SharedInfo::evtchn_pending) / sizeof(std::uint64_t);
}  // namespace

GuestEvents::GuestEvents(std::span<std::uint8_t> shared_info) : si_(shared_info) {
  if (si_.size() < sizeof(SharedInfo)) throw std::invalid_argument("shared_info page too small");
  wake_ = domain::EventFd::create().value();
  handlers_.resize(kWords * 64);
}

void GuestEvents::upcall(unsigned) noexcept {
  upcalls_.fetch_add(1, std::memory_order_relaxed);
  (void)wake_.notify();
}

void GuestEvents::enable_direct_upcalls(domain::Domain& dom) {
  if (dom.pages(domain::Domain::kSharedInfoGfn, 1).data() != si_.data()) {
    throw std::invalid_argument("direct upcalls: the domain's shared_info is not this dispatcher's");
  }
  std::vector<UniqueFd> lines;
  for (unsigned v = 0; v < dom.evtchn().nr_vcpus(); ++v) {
    UniqueFd fd(::fcntl(wake_.fd(), F_DUPFD_CLOEXEC, 0));
    if (!fd) throw std::system_error(errno, std::generic_category(), "direct upcalls: dup of the dispatcher's eventfd");
    lines.push_back(std::move(fd));
  }
  dom.enable_direct_upcalls(std::move(lines), dom.mem().view());
  dom.evtchn().set_direct_route(0, true);
}

void GuestEvents::set_handler(domain::Port port, std::function<void()> handler) {
  std::lock_guard l(lock_);
  handlers_.at(port) = std::move(handler);
}

void GuestEvents::clear_handler(domain::Port port) {
  std::lock_guard l(lock_);
  handlers_.at(port) = nullptr;
}

unsigned GuestEvents::dispatch() {
  unsigned handled = 0;
  // Clear upcall_pending first: an event that arrives during the scan raises it (and upcalls)
  // again, so nothing is lost between the scan and the next sleep.
  at<std::uint8_t>(si_, kUpcallPending).store(0, std::memory_order_seq_cst);
  std::uint64_t sel = at<std::uint64_t>(si_, kPendingSel).exchange(0, std::memory_order_acq_rel);
  while (sel != 0) {
    const unsigned w = static_cast<unsigned>(std::countr_zero(sel));
    sel &= sel - 1;
    std::uint64_t bits = at<std::uint64_t>(si_, kPending + w * 8).load(std::memory_order_acquire) &
                         ~at<std::uint64_t>(si_, kMask + w * 8).load(std::memory_order_acquire);
    while (bits != 0) {
      const unsigned b = static_cast<unsigned>(std::countr_zero(bits));
      bits &= bits - 1;
      const std::uint64_t bit = std::uint64_t{1} << b;
      // Clear before handling: an event during the handler sets it again and is seen next time.
      at<std::uint64_t>(si_, kPending + w * 8).fetch_and(~bit, std::memory_order_acq_rel);
      std::function<void()> h;
      {
        std::lock_guard l(lock_);
        h = handlers_[w * 64 + b];
      }
      if (h) h();
      ++handled;
    }
  }
  return handled;
}

void GuestEvents::run() {
  pollfd p{wake_.fd(), POLLIN, 0};
  while (!stopping_.load(std::memory_order_acquire)) {
    dispatch();
    if (::poll(&p, 1, -1) < 0 && errno != EINTR) break;
    (void)wake_.consume();
  }
}

}  // namespace xpv::frontends
