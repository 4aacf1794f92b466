// Shared test fixture: a zeroed shared_info page, a recording UpcallSink, and guest-side views of
// the bits (what a guest's upcall handler reads and clears).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "xpv/domain/event_channels.h"

namespace xpv::domain::test {

// Records every upcall. Thread-safe: delivery may run on any thread.
class RecordingSink final : public UpcallSink {
 public:
  void upcall(unsigned vcpu) noexcept override {
    std::lock_guard lk(mu_);
    calls_.push_back(vcpu);
    count_.fetch_add(1, std::memory_order_release);
  }
  std::vector<unsigned> calls() const {
    std::lock_guard lk(mu_);
    return calls_;
  }
  unsigned count() const noexcept { return count_.load(std::memory_order_acquire); }

 private:
  mutable std::mutex mu_;
  std::vector<unsigned> calls_;
  std::atomic<unsigned> count_{0};
};

// A 4 KiB page standing in for guest memory.
struct alignas(4096) Page {
  std::uint8_t bytes[4096];
  Page() { std::memset(bytes, 0, sizeof bytes); }
  std::span<std::uint8_t> span() { return {bytes, sizeof bytes}; }
};

inline constexpr DomId kDomid = 7;

class EvtchnTest : public ::testing::Test {
 protected:
  explicit EvtchnTest(unsigned nr_vcpus = 4, Port max_ports = kEvtchn2lNrChannels)
      : page_(std::make_unique<Page>()),
        ev_(std::make_unique<EventChannels>(kDomid, nr_vcpus, page_->span(), sink_, max_ports)) {}

  SharedInfo& si() { return *reinterpret_cast<SharedInfo*>(page_->bytes); }
  bool pending(Port p) {
    return std::atomic_ref<std::uint64_t>(si().evtchn_pending[p / 64]).load() &
           (std::uint64_t{1} << (p % 64));
  }
  void set_mask(Port p, bool on) {
    std::atomic_ref<std::uint64_t> w(si().evtchn_mask[p / 64]);
    const std::uint64_t bit = std::uint64_t{1} << (p % 64);
    if (on) w.fetch_or(bit); else w.fetch_and(~bit);
  }
  bool masked(Port p) {
    return std::atomic_ref<std::uint64_t>(si().evtchn_mask[p / 64]).load() &
           (std::uint64_t{1} << (p % 64));
  }
  std::uint64_t sel(unsigned v) {
    return std::atomic_ref<std::uint64_t>(si().vcpu_info[v].evtchn_pending_sel).load();
  }
  std::uint8_t upcall_pending(unsigned v) {
    return std::atomic_ref<std::uint8_t>(si().vcpu_info[v].evtchn_upcall_pending).load();
  }
  // What a guest's upcall handler does on vCPU v (Linux's 2-level handler, in order): clear
  // upcall_pending, exchange the selector with 0, then for each word clear the pending bits it
  // handles. Returns the ports it found pending and unmasked.
  std::vector<Port> guest_handle(unsigned v) {
    std::atomic_ref<std::uint8_t>(si().vcpu_info[v].evtchn_upcall_pending).store(0);
    std::uint64_t s = std::atomic_ref<std::uint64_t>(si().vcpu_info[v].evtchn_pending_sel).exchange(0);
    std::vector<Port> found;
    while (s) {
      const unsigned w = static_cast<unsigned>(__builtin_ctzll(s));
      s &= s - 1;
      std::atomic_ref<std::uint64_t> pw(si().evtchn_pending[w]);
      std::uint64_t bits = pw.load() & ~std::atomic_ref<std::uint64_t>(si().evtchn_mask[w]).load();
      while (bits) {
        const unsigned b = static_cast<unsigned>(__builtin_ctzll(bits));
        bits &= bits - 1;
        pw.fetch_and(~(std::uint64_t{1} << b));
        found.push_back(w * 64 + b);
      }
    }
    return found;
  }

  std::unique_ptr<Page> page_;
  RecordingSink sink_;
  std::unique_ptr<EventChannels> ev_;
};

}  // namespace xpv::domain::test
