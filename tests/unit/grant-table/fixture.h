// Shared test setup: a granting domain with RAM and a grant table in plain page-aligned buffers,
// and a dom0 mapper over the same memory (what a backend sees after mapping the memfds).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "xpv/gnttab/abi.h"
#include "xpv/gnttab/granter.h"
#include "xpv/gnttab/mapper.h"
#include "xpv/guest_memory.h"

namespace xpv::gnttab::test {

// Zeroed, 4 KiB-aligned pages, freed on destruction (also when a test fails).
class Pages {
 public:
  explicit Pages(std::size_t n)
      : n_(n), p_(static_cast<std::uint8_t*>(std::aligned_alloc(kFrameSize, n * kFrameSize))) {
    if (p_ == nullptr) throw std::bad_alloc();
    std::memset(p_.get(), 0, n * kFrameSize);
  }
  std::uint8_t* data() const { return p_.get(); }
  std::size_t bytes() const { return n_ * kFrameSize; }
  std::span<std::uint8_t> page(std::size_t i) const {
    return {p_.get() + i * kFrameSize, kFrameSize};
  }
  std::vector<std::span<std::uint8_t>> pages(std::size_t first, std::size_t count) const {
    std::vector<std::span<std::uint8_t>> v;
    for (std::size_t i = 0; i < count; ++i) v.push_back(page(first + i));
    return v;
  }

 private:
  struct Free {
    void operator()(std::uint8_t* p) const { std::free(p); }
  };
  std::size_t n_;
  std::unique_ptr<std::uint8_t, Free> p_;
};

// Raw view of an entry, read the way a peer would (atomically), for assertions.
inline std::uint16_t flags_of(const Pages& table, GrantRef ref) {
  auto* w = reinterpret_cast<std::uint32_t*>(table.data() + ref * sizeof(GrantEntryV1));
  return header_flags(std::atomic_ref<std::uint32_t>(*w).load());
}
// Writes flag bits the way a misbehaving guest would (atomic, but ignoring the protocol).
inline void poke_flags(const Pages& table, GrantRef ref, std::uint16_t flags) {
  auto* w = reinterpret_cast<std::uint32_t*>(table.data() + ref * sizeof(GrantEntryV1));
  std::atomic_ref<std::uint32_t> a(*w);
  a.store((a.load() & 0xffff0000u) | flags);
}

class GrantFixture : public ::testing::Test {
 protected:
  static constexpr DomId kFront = 5;  // the granting domain
  static constexpr DomId kBack = 0;   // dom0 backend
  static constexpr std::size_t kRamPages = 16;
  static constexpr std::size_t kTableFrames = 4;  // limit of the test table; starts with 1

  GrantFixture() {
    for (std::size_t i = 0; i < kRamPages; ++i) {
      std::memset(ram_.page(i).data(), static_cast<int>(0x10 + i), kFrameSize);
    }
  }

  Pages ram_{kRamPages};
  Pages table_{kTableFrames};
  GuestMemory mem_{{{0, ram_.bytes(), ram_.data()}}};
  GrantTable granter_{table_.pages(0, 1), kTableFrames};
  GrantMapper mapper_{kBack, kFront, granter_.frames(), mem_};

  GrantRef grant(std::uint64_t gfn, bool readonly, DomId to = kBack) {
    auto r = granter_.grant_access(to, gfn, readonly);
    EXPECT_TRUE(r) << to_string(r.error());
    return r ? *r : 0;
  }
};

}  // namespace xpv::gnttab::test
