#include "xpv/netback/fair_share.h"

#include <algorithm>
#include <limits>

namespace xpv::netback {

namespace {
constexpr std::uint64_t kNone = std::numeric_limits<std::uint64_t>::max();
}  // namespace

std::uint64_t FairShare::min_other_backlogged(const Account* self) const noexcept {
  std::uint64_t m = kNone;
  for (const Account& a : accounts_) {
    if (&a != self && a.backlog) m = std::min(m, a.served);
  }
  return m;
}

FairShare::Account* FairShare::join(std::uint64_t group) {
  std::lock_guard lock(mu_);
  const std::uint64_t m = min_other_backlogged(nullptr);
  accounts_.push_back(Account{m == kNone ? 0 : m, false, group});
  return &accounts_.back();
}

void FairShare::leave(Account* a) noexcept {
  if (a == nullptr) return;
  {
    std::lock_guard lock(mu_);
    accounts_.remove_if([a](const Account& x) { return &x == a; });
    ++generation_;
  }
  changed_.notify_all();  // a waiter may have been held back by the account that left
}

void FairShare::set_backlog(Account* a, bool backlog) noexcept {
  bool notify = false;
  {
    std::lock_guard lock(mu_);
    if (a->backlog == backlog) return;
    if (backlog) {
      // Idle time banks no credit: start level with the slowest account that has work.
      const std::uint64_t m = min_other_backlogged(a);
      if (m != kNone) a->served = std::max(a->served, m);
    } else {
      ++generation_;
      notify = true;
    }
    a->backlog = backlog;
  }
  if (notify) changed_.notify_all();
}

bool FairShare::may_go(const Account* a) const noexcept {
  std::lock_guard lock(mu_);
  const std::uint64_t m = min_other_backlogged(a);
  return m == kNone || a->served <= m + lead_;
}

void FairShare::charge(Account* a, std::size_t bytes) noexcept {
  if (bytes == 0) return;
  {
    std::lock_guard lock(mu_);
    std::uint64_t busy = 0;  // accounts of a's group with work (a itself included)
    if (a->group != 0) {
      for (const Account& x : accounts_) busy += x.group == a->group && x.backlog ? 1 : 0;
    }
    a->served += static_cast<std::uint64_t>(bytes) * std::max<std::uint64_t>(busy, 1);
    ++generation_;
  }
  changed_.notify_all();
}

std::uint64_t FairShare::generation() const noexcept {
  std::lock_guard lock(mu_);
  return generation_;
}

bool FairShare::wait(std::chrono::microseconds limit, std::uint64_t seen) noexcept {
  std::unique_lock lock(mu_);
  return changed_.wait_for(lock, limit, [&] { return generation_ != seen; });
}

std::size_t FairShare::accounts() const noexcept {
  std::lock_guard lock(mu_);
  return accounts_.size();
}

}  // namespace xpv::netback
