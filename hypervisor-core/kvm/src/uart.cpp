#include "xpv/kvm/uart.h"

namespace xpv::kvm {
namespace {
constexpr std::uint8_t kIerRx = 0x01, kIerThre = 0x02;
constexpr std::uint8_t kIirNone = 0x01, kIirThre = 0x02, kIirRx = 0x04, kIirFifo = 0xc0;
constexpr std::uint8_t kLcrDlab = 0x80;
constexpr std::uint8_t kMcrOut2 = 0x08, kMcrLoop = 0x10;
constexpr std::uint8_t kLsrDr = 0x01, kLsrOe = 0x02, kLsrThre = 0x20, kLsrTemt = 0x40;
constexpr std::uint8_t kFcrEnable = 0x01, kFcrClearRx = 0x02;
}  // namespace

void Uart16550::read(std::uint64_t, std::uint64_t offset, std::span<std::uint8_t> data) noexcept {
  std::lock_guard lk(mu_);
  // Byte registers; wider accesses read consecutive registers (Linux only uses byte access).
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = read_reg(static_cast<unsigned>((offset + i) & 7));
}

void Uart16550::write(std::uint64_t, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept {
  std::lock_guard lk(mu_);
  for (std::size_t i = 0; i < data.size(); ++i) write_reg(static_cast<unsigned>((offset + i) & 7), data[i]);
}

std::size_t Uart16550::receive(std::span<const std::uint8_t> bytes) noexcept {
  std::lock_guard lk(mu_);
  std::size_t n = 0;
  for (auto b : bytes) {
    if (rx_.size() >= kFifoSize) break;
    rx_.push_back(b);
    ++n;
  }
  if (n == 0 && !bytes.empty()) lsr_extra_ |= kLsrOe;
  update_irq();
  return n;
}

std::uint8_t Uart16550::read_reg(unsigned reg) noexcept {
  const bool dlab = (lcr_ & kLcrDlab) != 0;
  switch (reg) {
    case 0: {
      if (dlab) return dll_;
      std::uint8_t b = 0;
      if (!rx_.empty()) {
        b = rx_.front();
        rx_.pop_front();
      }
      update_irq();
      return b;
    }
    case 1: return dlab ? dlm_ : ier_;
    case 2: {
      std::uint8_t iir = kIirNone;
      if ((ier_ & kIerRx) && !rx_.empty()) {
        iir = kIirRx;
      } else if ((ier_ & kIerThre) && thre_pending_) {
        iir = kIirThre;
        thre_pending_ = false;  // reading IIR with THRE as the source acknowledges it
      }
      if (fcr_ & kFcrEnable) iir |= kIirFifo;
      update_irq();
      return iir;
    }
    case 3: return lcr_;
    case 4: return mcr_;
    case 5: {
      std::uint8_t lsr = kLsrThre | kLsrTemt | lsr_extra_;
      if (!rx_.empty()) lsr |= kLsrDr;
      lsr_extra_ = 0;  // overrun is cleared by reading LSR
      return lsr;
    }
    case 6:
      if (mcr_ & kMcrLoop) {
        // Loopback: DTR→DSR, RTS→CTS, OUT1→RI, OUT2→DCD.
        return static_cast<std::uint8_t>(((mcr_ & 0x01) << 5) | ((mcr_ & 0x02) << 3) | ((mcr_ & 0x04) << 4) |
                                         ((mcr_ & 0x08) << 4));
      }
      return msr_ | 0xb0;  // CTS, DSR, DCD: a terminal is attached
    default: return scr_;
  }
}

void Uart16550::write_reg(unsigned reg, std::uint8_t v) noexcept {
  const bool dlab = (lcr_ & kLcrDlab) != 0;
  switch (reg) {
    case 0:
      if (dlab) {
        dll_ = v;
        return;
      }
      transmit(v);
      thre_pending_ = true;  // THR empties at once
      break;
    case 1:
      if (dlab) {
        dlm_ = v;
        return;
      }
      // Turning ETBEI on while THR is empty raises THRE (16550 behaviour Linux relies on).
      if ((v & kIerThre) && !(ier_ & kIerThre)) thre_pending_ = true;
      ier_ = v & 0x0f;
      break;
    case 2:
      fcr_ = v;
      if (v & kFcrClearRx) rx_.clear();
      break;
    case 3: lcr_ = v; return;
    case 4: mcr_ = v & 0x1f; break;
    case 5: return;  // LSR is read-only (factory test writes ignored)
    case 6: return;
    default: scr_ = v; return;
  }
  update_irq();
}

void Uart16550::transmit(std::uint8_t b) noexcept {
  if (mcr_ & kMcrLoop) {
    if (rx_.size() < kFifoSize) rx_.push_back(b);
    else lsr_extra_ |= kLsrOe;
    return;
  }
  if (out_) out_(std::span<const std::uint8_t>(&b, 1));
}

void Uart16550::update_irq() noexcept {
  const bool pending = ((ier_ & kIerRx) && !rx_.empty()) || ((ier_ & kIerThre) && thre_pending_);
  const bool level = pending && (mcr_ & kMcrOut2) != 0;
  if (level != irq_level_) {
    irq_level_ = level;
    if (irq_) irq_(level);
  }
}

}  // namespace xpv::kvm
