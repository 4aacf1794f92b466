// Domain — what one domain process owns, assembled: its memory, its grant table, its event
// channels, and the control socket that exports them to dom0 (DESIGN.md §1). xpv-front (process
// domains) uses it as is; xpv-vmm builds the same pieces around a KVM guest.
//
// Guest-physical layout of a process domain (gfn = 4 KiB frame number):
//   0                  shared_info (event-channel bitmaps, vcpu_info)
//   1                  xenstore ring page (struct xenstore_domain_interface)
//   2 .. 2+G-1         grant-table frames (G = max_grant_frames; all present from the start)
//   2+G ..             free pages, handed out by alloc_pages() to the domain's frontends
//
// Threading: construct, then run the io_context on the domain's control thread. ControlHandler
// calls, dom0-kick servicing and alloc/free of pages happen there or under the page lock;
// EventChannels and GrantTable are safe for the frontends' threads as documented in their headers.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "xpv/domain/control.h"
#include "xpv/domain/event_channels.h"
#include "xpv/domain/memory.h"
#include "xpv/gnttab/granter.h"

namespace xpv::domain {

struct DomainConfig {
  std::uint16_t domid = 0;
  std::string name;
  control::DomainKind kind = control::DomainKind::process;
  unsigned vcpus = 1;
  std::uint64_t memory_bytes = 64 << 20;  // page multiple, >= the fixed pages + 1
  std::uint32_t max_grant_frames = 64;
  std::string run_dir = "/run/xpv";  // where dom<N>.sock lives
};

// An HVM domain's layout (xpv-vmm): its memory is the VM's own (GuestRam's memfd, attached here so
// the control socket exports exactly what KVM maps), its grant frames and xenstore page sit at
// fixed gfns outside RAM (platform-pci BAR1, special pages), and shared_info starts in a host
// placeholder page until the guest chooses a RAM page for it (XENMAPSPACE_shared_info →
// EventChannels::move_shared_info).
struct HvmLayout {
  std::uint64_t grant_frames_gfn = 0;  // frame i at grant_frames_gfn + i
  std::uint64_t xenstore_gfn = 0;
};

class Domain final : public ControlHandler {
 public:
  static constexpr std::uint64_t kSharedInfoGfn = 0;
  static constexpr std::uint64_t kXenstoreGfn = 1;
  static constexpr std::uint64_t kFirstGrantGfn = 2;

  // Creates the memory, grant table and event channels and starts serving the control socket.
  // Throws (setup path) with a message naming what failed; nothing is left behind then.
  Domain(boost::asio::io_context& io, DomainConfig config, UpcallSink& sink);
  // An HVM domain over the VM's memory (see HvmLayout). No page allocator and no host-side
  // granter: the guest kernel owns its grant entries.
  Domain(boost::asio::io_context& io, DomainConfig config, UpcallSink& sink, DomainMemory memory, HvmLayout layout);
  ~Domain() override;
  Domain(const Domain&) = delete;
  Domain& operator=(const Domain&) = delete;

  const DomainConfig& config() const noexcept { return config_; }
  const DomainMemory& mem() const noexcept { return memory_; }
  EventChannels& evtchn() noexcept { return *evtchn_; }
  // The host-side granter of a process domain (an HVM guest grants from its own kernel: none).
  gnttab::GrantTable& grants() noexcept { return *grants_; }
  std::span<std::uint8_t> xenstore_page() const { return memory_.view().page(xenstore_gfn_).value(); }
  std::uint64_t xenstore_gfn() const noexcept { return xenstore_gfn_; }
  // The xenstore event channel port (allocated unbound for dom0 at construction).
  std::uint32_t xenstore_port() const noexcept { return xenstore_port_; }
  const std::string& socket_path() const noexcept { return server_->path(); }

  // Contiguous free guest pages for a frontend (rings, buffers); nullopt when none are left.
  std::optional<std::uint64_t> alloc_pages(std::uint64_t count);
  void free_pages(std::uint64_t gfn, std::uint64_t count);
  std::span<std::uint8_t> pages(std::uint64_t gfn, std::uint64_t count) const {
    return memory_.view().translate(gfn << kPageShift, count << kPageShift).value();
  }

  // ControlHandler (control thread).
  DomainInfo info() override;
  const DomainMemory& memory() override { return memory_; }
  GrantTableInfo grant_table() override;
  Expected<Dom0Binding, int> bind_interdomain(std::uint32_t remote_port) override;
  Expected<void, int> unbind(std::uint32_t port) override;
  Expected<void, int> release(std::uint32_t port) override;
  Expected<XenstoreInfo, int> xenstore() override;
  Expected<void, int> unpause() override;
  // A domain created paused (xpv-vmm --paused): fn starts it; it returns false when the domain
  // runs already. Control thread.
  void set_unpause_handler(std::function<bool()> fn) { unpause_ = std::move(fn); }
  Expected<void, int> pause() override;
  // xl pause: fn stops the vCPUs (an errno as Control::pause says). Unset: EOPNOTSUPP. Control
  // thread.
  void set_pause_handler(std::function<Expected<void, int>()> fn) { pause_ = std::move(fn); }
  Expected<std::vector<std::uint32_t>, int> vcpu_threads() override;
  // xl vcpu-list / vcpu-pin: fn gives each vCPU's thread id (0: none). Unset: EOPNOTSUPP.
  void set_vcpu_threads_handler(std::function<std::vector<std::uint32_t>()> fn) { vcpu_threads_ = std::move(fn); }
  Expected<void, int> set_vcpu_affinity(std::uint32_t vcpu, const CpuMask& cpus) override;
  // xl vcpu-pin: fn places vCPU `vcpu` (or all) as ControlHandler::set_vcpu_affinity says. Unset: EOPNOTSUPP.
  void set_vcpu_affinity_handler(std::function<Expected<void, int>(std::uint32_t, const CpuMask&)> fn) {
    vcpu_affinity_ = std::move(fn);
  }

  // Direct upcalls (direct_upcall.h): one upcall eventfd per vCPU (xpv-vmm: KVM irqfds), and
  // `spans_from`, the GuestMemory the shared_info / vcpu_info spans given to evtchn() come from
  // (it must outlive this Domain). Creates the table, attaches it to the event channels and
  // offers both over the control socket. Call once, before run. Throws (setup path).
  void enable_direct_upcalls(std::vector<UniqueFd> vcpu_fds, const GuestMemory& spans_from);
  Expected<DirectFds, int> direct_upcall(std::uint32_t vcpu) override;

 private:
  Expected<void, int> close_endpoint(std::uint32_t port, bool owner_gone);
  void watch_kicks(std::uint32_t dom0_port);
  void finish_setup();

  boost::asio::io_context& io_;
  DomainConfig config_;
  DomainMemory memory_;
  std::uint64_t xenstore_gfn_ = kXenstoreGfn;
  std::uint64_t grant_frames_gfn_ = kFirstGrantGfn;
  std::vector<std::uint64_t> shared_info_placeholder_;  // HVM: until the guest maps shared_info
  std::unique_ptr<DirectTable> direct_;                  // before evtchn_: outlives it
  std::vector<UniqueFd> direct_fds_;                      // per vCPU
  std::unique_ptr<EventChannels> evtchn_;
  std::unique_ptr<gnttab::GrantTable> grants_;
  std::uint32_t xenstore_port_ = 0;
  // dom0 port → a watcher of its kick eventfd (the backend's notifications toward the guest).
  std::map<std::uint32_t, std::unique_ptr<boost::asio::posix::stream_descriptor>> kick_watch_;
  std::mutex pages_lock_;
  std::vector<bool> page_used_;  // by gfn
  std::function<bool()> unpause_;
  std::function<Expected<void, int>()> pause_;
  std::function<std::vector<std::uint32_t>()> vcpu_threads_;
  std::function<Expected<void, int>(std::uint32_t, const CpuMask&)> vcpu_affinity_;
  std::unique_ptr<ControlServer> server_;  // last: torn down first
};

}  // namespace xpv::domain
