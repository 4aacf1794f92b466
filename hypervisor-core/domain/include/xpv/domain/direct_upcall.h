// Direct upcalls — a dom0 service's notification raises the guest's upcall itself, with no thread
// of the domain process in between (backends/README.md "The event path"):
//
//   classic:  backend notify() ─► from_dom0 eventfd ─► domain's event loop wakes ─► 2-level bits
//             ─► upcall (xpv-vmm: KVM_SIGNAL_MSI)                         two thread wake-ups
//   direct:   backend notify() ─► reads the domain's DirectTable (seqcount) ─► 2-level bits in
//             guest memory, the same steps EventChannels::set_pending takes ─► on the
//             upcall_pending 0 → 1 edge: the vCPU's upcall eventfd, which xpv-vmm registered as
//             a KVM irqfd routed as an MSI to that vCPU's upcall vector: the kernel injects it
//
// DirectTable is a memfd written only by the domain process — by EventChannels under its
// exclusive lock, each change inside a seqcount — and read by dom0 services. It says, per dom0
// endpoint, which guest port it is connected to and that port's notify vCPU; per vCPU, where its
// vcpu_info lives (guest-physical) and whether its upcall eventfd is routed; and where
// shared_info lives. The guest cannot write it (it is not guest memory).
//
// Where the table cannot answer — no table (a process domain), a vCPU whose upcall is not routed
// (INTx mode, no vector chosen yet), an endpoint not connected, a location outside the memory the
// service mapped, a table changing under the reader more than kMaxRetries times — notify() takes
// the classic path. Races with the guest's own changes (mask, rebind, vcpu_info registration)
// are those Xen has: the reader re-reads the table after setting the pending bit and the mask
// check, and delivers to the binding of that moment; a rebind the guest does after it masked the
// port is covered by its unmask, which re-delivers a pending port (EventChannels::unmask).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "xpv/domain/dom0_port.h"
#include "xpv/domain/memory.h"
#include "xpv/unique_fd.h"

namespace xpv::domain {

// ---- the table's layout (one host, native byte order) --------------------------------------
inline constexpr std::uint32_t kDirectTableMagic = 0x54445058;  // "XPDT"
inline constexpr std::uint32_t kDirectTableVersion = 1;
inline constexpr std::uint64_t kNoGpa = ~std::uint64_t{0};

struct DirectTableHeader {
  std::uint32_t magic;            // 0x00
  std::uint32_t version;          // 0x04
  std::uint32_t seq;              // 0x08 odd while the domain writes
  std::uint32_t nr_vcpus;         // 0x0c
  std::uint32_t nr_endpoints;     // 0x10 dom0 endpoint numbers 1 .. nr_endpoints-1
  std::uint32_t pad;              // 0x14
  std::uint64_t shared_info_gpa;  // 0x18 kNoGpa: not in guest memory (yet)
  std::uint64_t reserved[4];      // 0x20
};
static_assert(sizeof(DirectTableHeader) == 64);

struct DirectTableVcpu {
  std::uint64_t vcpu_info_gpa;  // kNoGpa: none the service could use
  std::uint32_t routed;         // 1: the vCPU's upcall eventfd raises its upcall
  std::uint32_t pad;
};
static_assert(sizeof(DirectTableVcpu) == 16);

struct DirectTableEndpoint {
  std::uint32_t guest_port;   // 0: not connected
  std::uint32_t notify_vcpu;  // the guest port's notify vCPU
};
static_assert(sizeof(DirectTableEndpoint) == 8);

std::size_t direct_table_bytes(std::uint32_t nr_vcpus, std::uint32_t nr_endpoints) noexcept;

// The domain's side. Every setter must be called between begin() and end(), by one thread at a
// time (EventChannels holds its exclusive lock).
class DirectTable {
 public:
  // Throws std::system_error (memfd, mmap) or std::invalid_argument (counts).
  DirectTable(std::uint32_t nr_vcpus, std::uint32_t nr_endpoints);
  ~DirectTable();
  DirectTable(const DirectTable&) = delete;
  DirectTable& operator=(const DirectTable&) = delete;

  int fd() const noexcept { return fd_.get(); }
  std::size_t bytes() const noexcept { return bytes_; }
  std::uint32_t nr_vcpus() const noexcept { return nr_vcpus_; }
  std::uint32_t nr_endpoints() const noexcept { return nr_endpoints_; }

  void begin() noexcept;
  void end() noexcept;
  void set_shared_info(std::uint64_t gpa) noexcept;
  void set_vcpu_info(std::uint32_t vcpu, std::uint64_t gpa) noexcept;
  void set_routed(std::uint32_t vcpu, bool routed) noexcept;
  void set_endpoint(std::uint32_t dom0_port, std::uint32_t guest_port, std::uint32_t vcpu) noexcept;

 private:
  UniqueFd fd_;
  std::uint8_t* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::uint32_t nr_vcpus_ = 0;
  std::uint32_t nr_endpoints_ = 0;
};

// A dom0 service's side: a Dom0Notifier for every Dom0Port bound to the domain.
// Thread-safety: kick() from any thread, concurrently.
class DirectUpcall final : public Dom0Notifier {
 public:
  static constexpr int kMaxRetries = 8;

  // table: the domain's DirectTable memfd (validated: size, magic, version, counts);
  // vcpu_fds: the vCPUs' upcall eventfds, one per vCPU; memory: the domain's memfd and layout
  // (mapped again here, so this object may outlive the ForeignDomain that made it).
  // Throws std::invalid_argument / std::system_error on a table that does not check out.
  DirectUpcall(UniqueFd table, std::vector<UniqueFd> vcpu_fds, UniqueFd memfd, std::vector<MemoryRegion> layout);
  ~DirectUpcall() override;

  // The 2-level delivery of dom0 endpoint `dom0_port`'s guest port, as described above.
  // false: not done — the caller takes the classic path.
  bool kick(std::uint32_t dom0_port) noexcept override;

  std::uint32_t nr_vcpus() const noexcept { return static_cast<std::uint32_t>(vcpu_fds_.size()); }
  // Notifications delivered directly / interrupts raised / handed back to the classic path.
  std::uint64_t delivered() const noexcept { return delivered_.load(std::memory_order_relaxed); }
  std::uint64_t interrupts() const noexcept { return interrupts_.load(std::memory_order_relaxed); }
  std::uint64_t declined() const noexcept { return declined_.load(std::memory_order_relaxed); }

  // Tests: runs between kick()'s first table snapshot and its pending bit (the window a guest's
  // rebind can fall into). Not for concurrent use with kick().
  void set_after_snapshot_hook(std::function<void()> f) { after_snapshot_ = std::move(f); }

 private:
  struct Snapshot {
    std::uint32_t seq = 0;
    std::uint32_t guest_port = 0;
    std::uint32_t vcpu = 0;
    bool routed = false;
    std::uint64_t* pending = nullptr;     // the port's word in shared_info.evtchn_pending
    std::uint64_t* mask = nullptr;        // ... in evtchn_mask
    std::uint8_t* vcpu_info = nullptr;    // the notify vCPU's vcpu_info (64 bytes)
  };
  // A consistent, validated view of dom0_port's binding; false: seq odd/changed or unusable
  // (`usable` tells which).
  bool snapshot(std::uint32_t dom0_port, Snapshot& s, bool& usable) const noexcept;
  bool still(std::uint32_t seq) const noexcept;
  std::uint8_t* guest(std::uint64_t gpa, std::size_t len) const noexcept;

  std::uint8_t* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::uint32_t nr_endpoints_ = 0;
  std::vector<UniqueFd> vcpu_fds_;
  DomainMemory memory_;
  std::atomic<std::uint64_t> delivered_{0}, interrupts_{0}, declined_{0};
  std::function<void()> after_snapshot_;
};

}  // namespace xpv::domain
