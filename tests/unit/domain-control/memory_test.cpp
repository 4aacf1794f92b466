#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include "xpv/domain/memory.h"

namespace xpv::domain {
namespace {

TEST(DomainMemory, CreateLaysRegionsBackToBack) {
  auto m = DomainMemory::create("test", {{0, 0x10000}, {0x100000, 0x2000}});
  ASSERT_EQ(m.layout().size(), 2u);
  EXPECT_EQ(m.layout()[1].offset, 0x10000u);
  EXPECT_EQ(m.file_size(), 0x12000u);
  EXPECT_TRUE(m.view().translate(0x100000, 0x2000));
  EXPECT_FALSE(m.view().translate(0x10000, 1));  // the hole
}

TEST(DomainMemory, AttachSeesTheSamePages) {
  auto owner = DomainMemory::create("test", {{0, 0x4000}, {0x100000, 0x1000}});
  auto peer = DomainMemory::attach(UniqueFd(::dup(owner.fd())), owner.layout());
  auto w = owner.view().translate(0x100010, 5);
  ASSERT_TRUE(w);
  std::memcpy(w->data(), "hello", 5);
  auto r = peer.view().translate(0x100010, 5);
  ASSERT_TRUE(r);
  EXPECT_EQ(std::memcmp(r->data(), "hello", 5), 0);
  EXPECT_NE(r->data(), w->data());  // a mapping of its own, not the owner's pointer
}

TEST(DomainMemory, AttachRefusesRegionsOutsideTheFile) {
  auto owner = DomainMemory::create("test", {{0, 0x4000}});
  EXPECT_THROW(DomainMemory::attach(UniqueFd(::dup(owner.fd())), {{0, 0x5000, 0}}),
               std::invalid_argument);
  EXPECT_THROW(DomainMemory::attach(UniqueFd(::dup(owner.fd())), {{0, 0x1000, 0x4000}}),
               std::invalid_argument);
  EXPECT_THROW(DomainMemory::attach(UniqueFd(::dup(owner.fd())), {{0, 0x1000, UINT64_MAX & ~0xfffull}}),
               std::invalid_argument);
}

TEST(DomainMemory, AttachRefusesMisalignedAndOverlappingRegions) {
  auto owner = DomainMemory::create("test", {{0, 0x4000}});
  EXPECT_THROW(DomainMemory::attach(UniqueFd(::dup(owner.fd())), {{0x10, 0x1000, 0}}),
               std::invalid_argument);
  EXPECT_THROW(DomainMemory::attach(UniqueFd(::dup(owner.fd())), {{0, 0x1000, 0x800}}),
               std::invalid_argument);
  EXPECT_THROW(DomainMemory::attach(UniqueFd(::dup(owner.fd())),
                                    {{0, 0x2000, 0}, {0x1000, 0x1000, 0x2000}}),
               std::invalid_argument);
}

TEST(DomainMemory, CreateRefusesEmptyOrMisalignedRegions) {
  EXPECT_THROW(DomainMemory::create("test", {{0, 0}}), std::invalid_argument);
  EXPECT_THROW(DomainMemory::create("test", {{0, 0x1001}}), std::invalid_argument);
}

TEST(DomainMemory, TheSizeIsSealed) {
  auto owner = DomainMemory::create("test", {{0, 0x4000}});
  // A peer that has mapped the file must never see it shrink (SIGBUS on access).
  EXPECT_NE(::ftruncate(owner.fd(), 0x1000), 0);
  EXPECT_NE(::ftruncate(owner.fd(), 0x8000), 0);
}

TEST(DomainMemory, MovedFromObjectsOwnNothing) {
  auto a = DomainMemory::create("test", {{0, 0x1000}});
  const int fd = a.fd();
  DomainMemory b = std::move(a);
  EXPECT_EQ(b.fd(), fd);
  EXPECT_EQ(a.fd(), -1);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_TRUE(b.view().page(0));
}

}  // namespace
}  // namespace xpv::domain

namespace xpv::domain {
namespace {

TEST(DomainMemory, MapContiguousPutsScatteredPagesBackToBack) {
  auto mem = DomainMemory::create("scatter", {{0, 8 * kPageSize}, {0x100000, 4 * kPageSize}});
  // Tag each page with its gfn, then map gfns 5, 2 and 0x101 (second region) as one range.
  const std::uint64_t gfns[] = {5, 2, 0x101};
  for (auto g : gfns) mem.view().page(g).value()[7] = static_cast<std::uint8_t>(g);
  ContiguousMapping m = mem.map_contiguous(gfns);
  auto b = m.bytes();
  ASSERT_EQ(b.size(), 3 * kPageSize);
  EXPECT_EQ(b[7], 5);
  EXPECT_EQ(b[kPageSize + 7], 2);
  EXPECT_EQ(b[2 * kPageSize + 7], 0x01);
  // Shared with the domain both ways.
  b[kPageSize + 100] = 0xab;
  EXPECT_EQ(mem.view().page(2).value()[100], 0xab);
  mem.view().page(0x101).value()[9] = 0xcd;
  EXPECT_EQ(b[2 * kPageSize + 9], 0xcd);
  ContiguousMapping moved = std::move(m);
  EXPECT_TRUE(m.bytes().empty());
  EXPECT_EQ(moved.bytes().size(), 3 * kPageSize);
}

TEST(DomainMemory, MapContiguousRefusesPagesOutsideTheDomain) {
  auto mem = DomainMemory::create("scatter", {{0, 4 * kPageSize}});
  const std::uint64_t bad[] = {1, 4};
  EXPECT_THROW(mem.map_contiguous(bad), std::invalid_argument);
  const std::uint64_t huge[] = {~std::uint64_t{0}};
  EXPECT_THROW(mem.map_contiguous(huge), std::invalid_argument);
  EXPECT_THROW(mem.map_contiguous({}), std::invalid_argument);
}

}  // namespace
}  // namespace xpv::domain
