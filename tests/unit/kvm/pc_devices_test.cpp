#include <gtest/gtest.h>

#include "xpv/kvm/pc_devices.h"

namespace xpv::kvm {
namespace {

void out8(BusDevice& d, std::uint64_t base, std::uint64_t off, std::uint8_t v) {
  d.write(base, off, std::span<const std::uint8_t>(&v, 1));
}
std::uint8_t in8(BusDevice& d, std::uint64_t base, std::uint64_t off) {
  std::uint8_t v = 0;
  d.read(base, off, std::span(&v, 1));
  return v;
}

TEST(ResetPorts, I8042PulseAndPort92RisingEdgeReset) {
  int resets = 0;
  ResetPorts r([&] { ++resets; });
  EXPECT_EQ(in8(r, 0x64, 0), 0xff);  // no controller: Linux's probe stops at once
  EXPECT_EQ(in8(r, 0x60, 0), 0xff);
  out8(r, 0x64, 0, 0xad);         // other commands: ignored
  EXPECT_EQ(resets, 0);
  out8(r, 0x64, 0, 0xfe);
  EXPECT_EQ(resets, 1);
  out8(r, 0x92, 0, 0x02);  // A20 only
  EXPECT_EQ(resets, 1);
  out8(r, 0x92, 0, 0x03);  // bit 0 rises
  EXPECT_EQ(resets, 2);
  out8(r, 0x92, 0, 0x03);  // no new edge
  EXPECT_EQ(resets, 2);
  EXPECT_EQ(in8(r, 0x92, 0), 0x03);
}

TEST(CmosRtc, ReportsAValidBcdClockWithUipClear) {
  CmosRtc rtc;
  out8(rtc, 0x70, 0, 0x0a);
  EXPECT_EQ(in8(rtc, 0x70, 1) & 0x80, 0);  // UIP clear
  out8(rtc, 0x70, 0, 0x8b);                // NMI-mask bit set: still register B
  EXPECT_EQ(in8(rtc, 0x70, 1), 0x02);      // 24h, BCD
  out8(rtc, 0x70, 0, 0x0d);
  EXPECT_EQ(in8(rtc, 0x70, 1), 0x80);
  out8(rtc, 0x70, 0, 0x08);
  const std::uint8_t month = in8(rtc, 0x70, 1);
  EXPECT_GE(month, 0x01);
  EXPECT_LE(month, 0x12);
  EXPECT_LE(month & 0x0f, 9);  // BCD digit
  out8(rtc, 0x70, 0, 0x40);    // NVRAM keeps what is written
  out8(rtc, 0x70, 1, 0x77);
  EXPECT_EQ(in8(rtc, 0x70, 1), 0x77);
}

TEST(PmTimer, Is24BitsAndMovesForward) {
  PmTimer pm;
  std::uint8_t a[4] = {}, b[4] = {};
  pm.read(0x608, 0, std::span(a, 4));
  EXPECT_EQ(a[3], 0);  // 24-bit counter
  std::uint32_t va = a[0] | (a[1] << 8) | (a[2] << 16);
  std::uint32_t vb = va;
  for (int i = 0; i < 1000000 && vb == va; ++i) {  // bounded: 3.58 MHz moves within microseconds
    pm.read(0x608, 0, std::span(b, 4));
    vb = b[0] | (b[1] << 8) | (b[2] << 16);
  }
  EXPECT_NE(vb, va);
}

}  // namespace
}  // namespace xpv::kvm
