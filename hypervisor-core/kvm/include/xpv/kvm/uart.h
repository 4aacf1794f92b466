// Uart16550 — the COM1 console (port 0x3f8, IRQ 4): a 16550A with a 16-byte receive FIFO, enough
// for Linux's 8250 driver (autoconfig probe incl. the loopback test, THRE and RX interrupts).
//
// Register map (offset: DLAB=0 / DLAB=1), PC16550D datasheet:
//   0 RBR(r) THR(w) / DLL    1 IER / DLM    2 IIR(r) FCR(w)    3 LCR    4 MCR    5 LSR    6 MSR  7 SCR
// Interrupt state:
//   THRE pending: set when THR becomes empty with IER.ETBEI, or when ETBEI is turned on while THR
//                 is empty; cleared by reading IIR while it is the reported source, or writing THR.
//   RX pending:   while the RX FIFO is non-empty and IER.ERBFI.
//   IRQ line = (any pending) && MCR.OUT2 (PC wiring), reported to irq(level) on every change.
// Transmit is instant: each THR byte goes to out() (or loops back with MCR.LOOP).
//
// Thread-safety: one mutex; read/write come from vCPU threads, receive() from the console input
// thread. out() and irq() are called with the mutex held (lock order: uart → whatever they take).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>

#include "xpv/kvm/io_bus.h"

namespace xpv::kvm {

class Uart16550 final : public BusDevice {
 public:
  using Output = std::function<void(std::span<const std::uint8_t>)>;
  using IrqLine = std::function<void(bool level)>;
  static constexpr std::size_t kFifoSize = 16;

  Uart16550(Output out, IrqLine irq) : out_(std::move(out)), irq_(std::move(irq)) {}

  void read(std::uint64_t base, std::uint64_t offset, std::span<std::uint8_t> data) noexcept override;
  void write(std::uint64_t base, std::uint64_t offset, std::span<const std::uint8_t> data) noexcept override;

  // Bytes typed on the console. Returns how many fit in the FIFO (the rest are dropped and the
  // overrun bit set only if nothing fit: callers retry later).
  std::size_t receive(std::span<const std::uint8_t> bytes) noexcept;

 private:
  std::uint8_t read_reg(unsigned reg) noexcept;
  void write_reg(unsigned reg, std::uint8_t v) noexcept;
  void update_irq() noexcept;
  void transmit(std::uint8_t b) noexcept;

  std::mutex mu_;
  Output out_;
  IrqLine irq_;
  std::deque<std::uint8_t> rx_;
  std::uint8_t ier_ = 0, lcr_ = 0, mcr_ = 0, lsr_extra_ = 0, scr_ = 0, msr_ = 0, fcr_ = 0;
  std::uint8_t dll_ = 0x0c, dlm_ = 0;  // 9600 baud at reset, as a BIOS would leave it
  bool thre_pending_ = false;
  bool irq_level_ = false;
};

}  // namespace xpv::kvm
