#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "xpv/kvm/uart.h"

namespace xpv::kvm {
namespace {

class UartTest : public ::testing::Test {
 protected:
  std::string out_;
  std::vector<bool> irq_;
  Uart16550 uart_{[this](std::span<const std::uint8_t> b) { out_.append(b.begin(), b.end()); },
                  [this](bool l) { irq_.push_back(l); }};
  std::uint8_t in(unsigned reg) {
    std::uint8_t b = 0;
    uart_.read(0x3f8, reg, std::span(&b, 1));
    return b;
  }
  void out(unsigned reg, std::uint8_t v) { uart_.write(0x3f8, reg, std::span<const std::uint8_t>(&v, 1)); }
};

TEST_F(UartTest, TransmitsAndReportsAnEmptyTransmitter) {
  out(0, 'h');
  out(0, 'i');
  EXPECT_EQ(out_, "hi");
  EXPECT_EQ(in(5) & 0x60, 0x60);  // THRE | TEMT
  EXPECT_EQ(in(5) & 0x01, 0);     // no data
  EXPECT_EQ(in(2) & 0x0f, 0x01);  // no interrupt (IER = 0)
  EXPECT_TRUE(irq_.empty());
}

TEST_F(UartTest, DivisorLatchDoesNotTransmit) {
  out(3, 0x80);  // DLAB
  out(0, 0x01);
  out(1, 0x00);
  EXPECT_EQ(in(0), 0x01);
  out(3, 0x03);
  EXPECT_TRUE(out_.empty());
  EXPECT_EQ(in(3), 0x03);
}

TEST_F(UartTest, LoopbackProbeLooksLikeA16550) {
  out(4, 0x1a);  // LOOP | OUT2 | RTS: Linux's autoconfig probe
  EXPECT_EQ(in(6) & 0xf0, 0x90);
  out(0, 'x');
  EXPECT_TRUE(out_.empty());  // looped back, not sent
  EXPECT_EQ(in(5) & 0x01, 0x01);
  EXPECT_EQ(in(0), 'x');
  out(7, 0x5a);
  EXPECT_EQ(in(7), 0x5a);  // scratch
}

TEST_F(UartTest, ThreInterruptRaisedOnEnableAndAcknowledgedByIir) {
  out(4, 0x08);  // OUT2: the IRQ is wired
  out(1, 0x02);  // ETBEI with THR empty → THRE pending
  ASSERT_EQ(irq_, std::vector<bool>({true}));
  EXPECT_EQ(in(2) & 0x0f, 0x02);
  EXPECT_EQ(irq_, std::vector<bool>({true, false}));
  EXPECT_EQ(in(2) & 0x0f, 0x01);  // acknowledged
  out(0, 'a');                    // THR empties again → pending again
  EXPECT_EQ(irq_.back(), true);
}

TEST_F(UartTest, ReceiveRaisesRxInterruptUntilDrained) {
  out(4, 0x08);
  out(1, 0x01);  // ERBFI
  const std::uint8_t typed[] = {'l', 's'};
  EXPECT_EQ(uart_.receive(typed), 2u);
  EXPECT_EQ(irq_, std::vector<bool>({true}));
  EXPECT_EQ(in(2) & 0x0f, 0x04);
  EXPECT_EQ(in(0), 'l');
  EXPECT_EQ(in(0), 's');
  EXPECT_EQ(irq_, std::vector<bool>({true, false}));
  EXPECT_EQ(in(5) & 0x01, 0);
}

TEST_F(UartTest, FifoOverflowIsBoundedAndNoIrqWithoutOut2) {
  out(1, 0x01);
  std::vector<std::uint8_t> many(100, 'z');
  EXPECT_EQ(uart_.receive(many), Uart16550::kFifoSize);
  EXPECT_EQ(uart_.receive(many), 0u);
  EXPECT_EQ(in(5) & 0x02, 0x02);  // overrun, cleared by reading LSR
  EXPECT_EQ(in(5) & 0x02, 0);
  EXPECT_TRUE(irq_.empty());  // OUT2 clear: the line is not wired
}

}  // namespace
}  // namespace xpv::kvm
