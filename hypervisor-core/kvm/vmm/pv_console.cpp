#include "xpv/vmm/pv_console.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <stdexcept>

#include "xpv/ring/console.h"

namespace xpv::vmm {

namespace asio = boost::asio;

PvConsole::PvConsole(asio::io_context& io, std::span<std::uint8_t> page, UniqueFd to_dom0, UniqueFd from_dom0,
                     Output out)
    : page_(page), to_dom0_(io), from_dom0_(std::move(from_dom0)), out_(std::move(out)) {
  if (!ring::console_interface(page_)) throw std::invalid_argument("PV console: the ring page is too small or misaligned");
  to_dom0_.assign(to_dom0.release());
  drain();  // before the wait is armed: the output sink is never called concurrently
  wait();
}

PvConsole::~PvConsole() {
  boost::system::error_code ignored;
  to_dom0_.close(ignored);
}

void PvConsole::wait() {
  to_dom0_.async_wait(asio::posix::stream_descriptor::wait_read, [this](boost::system::error_code ec) {
    if (ec) return;  // closed: this object is going away
    std::uint64_t kicks = 0;
    (void)!::read(to_dom0_.native_handle(), &kicks, sizeof kicks);  // an eventfd: resets the count
    drain();
    if (!disabled()) wait();
  });
}

void PvConsole::drain() noexcept {
  if (disabled()) return;
  auto* intf = *ring::console_interface(page_);
  auto out = ring::console_out_ring(*intf);
  if (!out) return disable("the out ring cannot be used");
  std::array<char, ring::kXenconsOutSize> buf;
  std::size_t total = 0;
  // Bounded: at most two ring-fulls per notification; what the guest adds later comes with its
  // next notification.
  for (int round = 0; round < 2; ++round) {
    auto n = out->read(buf);
    if (!n) {
      bytes_out_.fetch_add(total, std::memory_order_relaxed);  // what the first round gave Output
      return disable("out_prod - out_cons is larger than the out ring");
    }
    if (*n == 0) break;
    total += *n;
    try {
      out_(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(buf.data()), *n));
    } catch (...) {
    }
  }
  if (total != 0) {
    bytes_out_.fetch_add(total, std::memory_order_relaxed);
    notify();  // room again: hvc_xen may be waiting to write the rest
  }
}

std::size_t PvConsole::receive(std::span<const std::uint8_t> bytes) noexcept {
  if (disabled() || bytes.empty()) return 0;
  std::lock_guard lk(in_mu_);
  auto* intf = *ring::console_interface(page_);
  auto in = ring::console_in_ring(*intf);
  if (!in) {
    disable("the in ring cannot be used");
    return 0;
  }
  auto n = in->write(std::span<const char>(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (!n) {
    disable("in_prod - in_cons is larger than the in ring");
    return 0;
  }
  if (*n != 0) notify();
  return *n;
}

void PvConsole::notify() noexcept {
  const std::uint64_t one = 1;
  (void)!::write(from_dom0_.get(), &one, sizeof one);
}

void PvConsole::disable(const char* why) noexcept {
  if (disabled_.exchange(true, std::memory_order_acq_rel)) return;
  try {
    spdlog::error("PV console: {}: the guest broke the ring protocol; the PV console is disabled (the serial "
                  "console and everything else go on)",
                  why);
  } catch (...) {
  }
}

}  // namespace xpv::vmm
