// Netfront — xpv's own netif frontend for a process domain, the data path (its xenbus negotiation
// is separate). The domain's "NIC" is a TAP interface inside a network namespace the domain owns;
// Netfront moves frames between that TAP and the netif rings shared with the backend:
//
//   TAP ──readv (VnetHdr + frame, straight into granted tx pages)──► tx requests
//        (first slot: whole size + csum flags [+ GSO extra slot], then one slot per page with
//        more_data) ──push (notify if the ring asks)──► backend
//   backend ──rx responses (+ GSO extra)──► VnetHdr + iovec over the rx pages ──writev──► TAP
//        ──► the same buffers are posted again at once (the rx ring stays stocked)
//
// Pages: one granted page per tx id (read-only to the backend, freed by the id's response) and
// one per rx ring slot (writable, posted with id = ring index & mask, as Linux's netfront does).
// Event channels: split (event-channel-tx / -rx) or one for both.
// The backend is not trusted either: a response naming no outstanding id, a bad ring index, or an
// rx slot past its page breaks the device (every later packet is dropped, broken() says so).
//
// Threading: one data thread (start()/stop()); the GuestEvents handler only wakes it.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "xpv/domain/domain.h"
#include "xpv/domain/event_fd.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/netback/offload.h"
#include "xpv/ring/netif.h"

namespace xpv::frontends {

struct NetfrontConfig {
  domain::DomId backend = 0;
  bool split_event_channels = true;  // event-channel-tx/rx, else one event-channel
  // What the backend offers (it decides what may be put on the tx ring):
  bool backend_sg = true;            // feature-sg
  netback::GsoCaps backend_gso{true, true};  // feature-gso-tcpv4/v6
  std::uint32_t batch = 64;          // packets per direction before the other gets a turn
};

struct NetfrontStats {
  std::atomic<std::uint64_t> tx_packets{0}, tx_bytes{0}, tx_errors{0}, tx_dropped{0};
  std::atomic<std::uint64_t> rx_packets{0}, rx_bytes{0}, rx_errors{0}, rx_dropped{0};
  std::atomic<std::uint64_t> notifications{0}, wakeups{0};
  std::atomic<std::uint64_t> rx_foreign_ids{0};  // error responses naming another id than their slot's
};

class Netfront {
 public:
  // Allocates and grants both rings and the buffer pages in `dom`, allocates the event
  // channel(s) unbound for the backend and registers the handler. `tap_fd` (non-blocking, 10-byte
  // vnet headers) is borrowed: it must outlive the Netfront. Throws if the domain has no room.
  Netfront(domain::Domain& dom, GuestEvents& events, int tap_fd, NetfrontConfig config);
  ~Netfront();
  Netfront(const Netfront&) = delete;
  Netfront& operator=(const Netfront&) = delete;

  // What the xenbus negotiation publishes.
  gnttab::GrantRef tx_ring_ref() const noexcept { return tx_ring_ref_; }
  gnttab::GrantRef rx_ring_ref() const noexcept { return rx_ring_ref_; }
  domain::Port tx_port() const noexcept { return tx_port_; }
  domain::Port rx_port() const noexcept { return rx_port_; }  // == tx_port() when not split

  // Posts every rx buffer and starts the data thread (once the backend is connected).
  void start();
  void stop() noexcept;
  bool broken() const noexcept { return broken_.load(std::memory_order_acquire); }
  const NetfrontStats& stats() const noexcept { return stats_; }

  // Test seam: the shared tx ring page, so a test can play a misbehaving guest (after stop()).
  std::span<std::uint8_t> tx_ring_page_for_testing() const { return dom_.pages(tx_ring_gfn_, 1); }
  std::span<std::uint8_t> rx_ring_page_for_testing() const { return dom_.pages(rx_ring_gfn_, 1); }

 private:
  void loop() noexcept;
  bool tx_responses() noexcept;
  bool rx_responses() noexcept;
  bool tx_from_tap() noexcept;  // true: the batch ended with more to do
  void post_rx(std::uint32_t n) noexcept;
  void deliver_rx() noexcept;
  void break_device(const char* why) noexcept;

  domain::Domain& dom_;
  GuestEvents& events_;
  int tap_;
  NetfrontConfig config_;
  std::uint64_t tx_ring_gfn_ = 0, rx_ring_gfn_ = 0, tx_pages_gfn_ = 0, rx_pages_gfn_ = 0;
  gnttab::GrantRef tx_ring_ref_ = 0, rx_ring_ref_ = 0;
  std::vector<gnttab::GrantRef> tx_refs_, rx_refs_;
  domain::Port tx_port_ = 0, rx_port_ = 0;
  std::optional<ring::NetifTxFrontRing> tx_;
  std::optional<ring::NetifRxFrontRing> rx_;
  domain::EventFd kick_, stop_;
  std::thread thread_;
  std::atomic<bool> broken_{false};
  NetfrontStats stats_;

  // Data thread only.
  std::vector<std::uint16_t> tx_free_;  // free tx ids (each owns one page)
  std::vector<bool> tx_busy_;
  bool tap_readable_ = true;
  struct RxSlot {
    std::uint32_t index;
    std::uint16_t offset, len;
  };
  std::vector<RxSlot> rx_pkt_;       // slots of the packet being assembled
  bool rx_in_packet_ = false, rx_expect_extra_ = false, rx_extra_seen_ = false, rx_bad_ = false;
  std::uint16_t rx_first_flags_ = 0;
  netback::NetifOffload rx_off_;
  std::uint32_t rx_to_post_ = 0;     // consumed rx slots waiting to be posted again
};

}  // namespace xpv::frontends
