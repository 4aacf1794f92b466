// Test doubles for the Xen platform: a PlatformHost that records every call and owns a few guest
// RAM pages, a GuestVirt over one flat buffer (anything outside it faults), and a fixture that
// wires a real domain::EventChannels (over a host placeholder page) to a Platform.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "xpv/domain/event_channels.h"
#include "xpv/xen/platform.h"

namespace xpv::xen::test {

struct alignas(4096) Page {
  std::uint8_t bytes[4096];
  Page() { std::memset(bytes, 0, sizeof bytes); }
  std::span<std::uint8_t> span() { return {bytes, sizeof bytes}; }
};

class FakeHost final : public PlatformHost {
 public:
  void inject_vector(unsigned vcpu, std::uint8_t vector) noexcept override {
    std::lock_guard lk(mu_);
    injected_.emplace_back(vcpu, vector);
  }
  bool set_callback_vector(std::uint8_t vector) noexcept override {
    bool accept = false;
    unsigned delay_us = 0;
    {
      std::lock_guard lk(mu_);
      callback_vectors_.push_back(vector);
      accept = accept_callback_vector_;
      // A host that takes a varying while to answer (races: which caller's answer comes last).
      if (callback_vector_delays_) delay_us = (static_cast<unsigned>(callback_vectors_.size()) * 37u) % 200u;
    }
    if (delay_us != 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    return accept;
  }
  void set_intx(bool asserted) noexcept override {
    std::lock_guard lk(mu_);
    intx_.push_back(asserted);
  }
  void upcall_route(unsigned vcpu, std::uint8_t vector) noexcept override {
    std::lock_guard lk(mu_);
    routes_[vcpu] = vector;
    ++route_calls_;
  }
  // The last route the platform gave each vCPU (absent: never told).
  std::map<unsigned, std::uint8_t> routes() {
    std::lock_guard lk(mu_);
    return routes_;
  }
  unsigned route_calls() {
    std::lock_guard lk(mu_);
    return route_calls_;
  }
  void shutdown(ShutdownReason why) noexcept override {
    std::lock_guard lk(mu_);
    shutdowns_.push_back(why);
  }
  std::span<std::uint8_t> guest_page(std::uint64_t gfn) noexcept override {
    auto it = ram_.find(gfn);
    return it == ram_.end() ? std::span<std::uint8_t>{} : it->second->span();
  }
  bool release_ram(std::uint64_t gfn, std::uint64_t pages) noexcept override {
    return balloon(gfn, pages, released_);
  }
  bool populate_ram(std::uint64_t gfn, std::uint64_t pages) noexcept override {
    return balloon(gfn, pages, populated_);
  }
  // The ranges the platform gave back / took back, in call order: {gfn, pages}.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> released() {
    std::lock_guard lk(mu_);
    return released_;
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> populated() {
    std::lock_guard lk(mu_);
    return populated_;
  }
  void console_write(std::string_view text) noexcept override {
    std::lock_guard lk(mu_);
    console_ += text;
  }

  Page& add_ram(std::uint64_t gfn) {
    auto& p = ram_[gfn];
    if (!p) p = std::make_unique<Page>();
    return *p;
  }
  std::vector<std::pair<unsigned, std::uint8_t>> injected() {
    std::lock_guard lk(mu_);
    return injected_;
  }
  std::vector<std::uint8_t> callback_vectors() {
    std::lock_guard lk(mu_);
    return callback_vectors_;
  }
  void delay_callback_vectors() {
    std::lock_guard lk(mu_);
    callback_vector_delays_ = true;
  }
  void refuse_callback_vectors() {
    std::lock_guard lk(mu_);
    accept_callback_vector_ = false;
  }
  std::vector<bool> intx() {
    std::lock_guard lk(mu_);
    return intx_;
  }
  std::vector<ShutdownReason> shutdowns() {
    std::lock_guard lk(mu_);
    return shutdowns_;
  }
  std::string console() {
    std::lock_guard lk(mu_);
    return console_;
  }
  void clear() {
    std::lock_guard lk(mu_);
    injected_.clear();
    intx_.clear();
  }

 private:
  std::mutex mu_;
  std::map<std::uint64_t, std::unique_ptr<Page>> ram_;
  std::vector<std::pair<unsigned, std::uint8_t>> injected_;
  std::vector<bool> intx_;
  std::map<unsigned, std::uint8_t> routes_;
  unsigned route_calls_ = 0;
  std::vector<std::uint8_t> callback_vectors_;
  bool accept_callback_vector_ = true;
  bool callback_vector_delays_ = false;
  std::vector<ShutdownReason> shutdowns_;
  std::string console_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> released_, populated_;

  // RAM only (every page of the range added with add_ram), all or nothing.
  bool balloon(std::uint64_t gfn, std::uint64_t pages,
               std::vector<std::pair<std::uint64_t, std::uint64_t>>& log) noexcept {
    for (std::uint64_t i = 0; i < pages; ++i) {
      if (!ram_.contains(gfn + i)) return false;
    }
    std::lock_guard lk(mu_);
    log.emplace_back(gfn, pages);
    return true;
  }
};

// Guest-virtual memory: [kBase, kBase + size) is mapped, everything else faults. A range can be
// made read-only to test copy-out faults.
class FakeVirt final : public GuestVirt {
 public:
  static constexpr std::uint64_t kBase = 0xffff'8880'0010'0000;
  explicit FakeVirt(std::size_t size = 64 * 1024) : mem_(size, 0) {}

  bool read(std::uint64_t gva, std::span<std::uint8_t> out) noexcept override {
    if (!inside(gva, out.size())) return false;
    std::memcpy(out.data(), mem_.data() + (gva - kBase), out.size());
    return true;
  }
  bool write(std::uint64_t gva, std::span<const std::uint8_t> in) noexcept override {
    if (!inside(gva, in.size())) return false;
    if (gva < ro_end_ && gva + in.size() > ro_begin_) return false;
    std::memcpy(mem_.data() + (gva - kBase), in.data(), in.size());
    ++writes_;
    return true;
  }

  template <class T>
  void put(std::uint64_t gva, const T& v) {
    ASSERT_TRUE(inside(gva, sizeof v));
    std::memcpy(mem_.data() + (gva - kBase), &v, sizeof v);
  }
  template <class T>
  T get(std::uint64_t gva) const {
    T v{};
    EXPECT_TRUE(inside(gva, sizeof v));
    if (inside(gva, sizeof v)) std::memcpy(&v, mem_.data() + (gva - kBase), sizeof v);
    return v;
  }
  std::vector<std::uint8_t> bytes(std::uint64_t gva, std::size_t n) const {
    return {mem_.begin() + static_cast<std::ptrdiff_t>(gva - kBase),
            mem_.begin() + static_cast<std::ptrdiff_t>(gva - kBase + n)};
  }
  void fill(std::uint8_t b) { std::fill(mem_.begin(), mem_.end(), b); }
  void read_only(std::uint64_t begin, std::uint64_t end) { ro_begin_ = begin; ro_end_ = end; }
  std::uint64_t end() const { return kBase + mem_.size(); }
  unsigned writes() const { return writes_; }

 private:
  bool inside(std::uint64_t gva, std::size_t n) const {
    return gva >= kBase && n <= mem_.size() && gva - kBase <= mem_.size() - n;
  }
  std::vector<std::uint8_t> mem_;
  std::uint64_t ro_begin_ = 0, ro_end_ = 0;
  unsigned writes_ = 0;
};

inline constexpr std::uint64_t kArg = FakeVirt::kBase;           // where tests put a struct
inline constexpr std::uint64_t kArg2 = FakeVirt::kBase + 0x1000;  // a second buffer
inline constexpr std::uint64_t kBad = 0x1000;                     // faults

inline PlatformConfig test_config(UpcallMode mode = UpcallMode::vcpu_vector) {
  PlatformConfig c;
  c.domid = 5;
  c.vcpus = 4;
  c.upcall = mode;
  c.max_grant_frames = 32;
  c.grant_frames_gfn = 0xf0000;
  c.store_gfn = 0xfeffc;
  c.store_port = 1;
  c.console_gfn = 0xfeffd;
  c.console_port = 2;
  return c;
}

class PlatformTest : public ::testing::Test {
 protected:
  explicit PlatformTest(PlatformConfig cfg = test_config())
      : cfg_(cfg),
        placeholder_(std::make_unique<Page>()),
        platform_(std::make_unique<Platform>(cfg_, host_)),
        ev_(std::make_unique<domain::EventChannels>(cfg_.domid, cfg_.vcpus,
                                                     placeholder_->span(), *platform_)) {
    platform_->attach(*ev_);
  }
  ~PlatformTest() override {
    ev_.reset();  // the event channels call into the platform: destroy them first
    platform_.reset();
  }

  std::int64_t call(std::uint64_t nr, std::uint64_t a1 = 0, std::uint64_t a2 = 0,
                    std::uint64_t a3 = 0, std::uint64_t a4 = 0, std::uint64_t a5 = 0,
                    unsigned vcpu = 0) {
    return platform_->hypercall(vcpu, Regs{nr, a1, a2, a3, a4, a5}, mem_);
  }
  std::int64_t call_on(unsigned vcpu, std::uint64_t nr, std::uint64_t a1 = 0,
                       std::uint64_t a2 = 0, std::uint64_t a3 = 0) {
    return platform_->hypercall(vcpu, Regs{nr, a1, a2, a3, 0, 0}, mem_);
  }

  PlatformConfig cfg_;
  FakeHost host_;
  FakeVirt mem_;
  std::unique_ptr<Page> placeholder_;
  std::unique_ptr<Platform> platform_;
  std::unique_ptr<domain::EventChannels> ev_;
};

}  // namespace xpv::xen::test
