// PvConsole — the backend of an HVM guest's Xen PV console (Linux's hvc0), served by xpv-vmm
// itself, as QEMU's Xen emulation serves the primary console (under Xen, dom0's xenconsoled does).
//
// The guest finds the ring page and its event channel in HVM_PARAM_CONSOLE_PFN / _EVTCHN (the
// page is io/console.h's struct xencons_interface: `out` guest → host, `in` host → guest). This
// object owns the host end of that channel (a dom0 binding: `to_dom0` becomes readable when the
// guest notifies, a write to `from_dom0` notifies the guest):
//
//   guest writes out[], notifies ──► to_dom0 readable ──► drain(): out → Output, notify guest
//   typed bytes ──► receive(): as many as fit into in[] ──► notify guest
//
// The indexes are the guest's to write: a pair that claims more than the ring holds (out_prod -
// out_cons > 2048, or in_prod - in_cons > 1024) disables the console for good — one error line,
// no more reads or writes of the page, receive() takes nothing — and nothing else of the VMM is
// affected. Output is never parsed.
//
// Threads: the constructor drains once on the caller's thread, before it arms the wait; later
// drains run on the io_context's thread (the XenDomain's); receive() on the caller's (the console
// input thread). The two sides of the page are independent rings (ring/byte_ring.h), so only the
// notification is shared. Destroy it on the io thread (or with the io_context not running) and
// with no receive() in progress.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>

#include "xpv/unique_fd.h"

namespace xpv::vmm {

class PvConsole {
 public:
  using Output = std::function<void(std::span<const std::uint8_t>)>;

  // `page`: the ring page in guest memory (≥ 4 KiB, 4-byte aligned; outlives this object). Drains
  // once at once (the guest may have written before its first notification). Throws
  // std::invalid_argument for a page that cannot hold the interface.
  PvConsole(boost::asio::io_context& io, std::span<std::uint8_t> page, UniqueFd to_dom0, UniqueFd from_dom0,
            Output out);
  ~PvConsole();
  PvConsole(const PvConsole&) = delete;
  PvConsole& operator=(const PvConsole&) = delete;

  // Typed bytes for the guest: copies as many as fit into `in` and notifies; returns how many
  // were taken (0 when the ring is full or the console is disabled). Any thread.
  std::size_t receive(std::span<const std::uint8_t> bytes) noexcept;

  bool disabled() const noexcept { return disabled_.load(std::memory_order_acquire); }
  std::uint64_t bytes_out() const noexcept { return bytes_out_.load(std::memory_order_relaxed); }

 private:
  void wait();
  void drain() noexcept;
  void notify() noexcept;
  void disable(const char* why) noexcept;

  std::span<std::uint8_t> page_;
  boost::asio::posix::stream_descriptor to_dom0_;
  UniqueFd from_dom0_;
  Output out_;
  std::mutex in_mu_;  // receive() callers
  std::atomic<bool> disabled_{false};
  std::atomic<std::uint64_t> bytes_out_{0};
};

}  // namespace xpv::vmm
