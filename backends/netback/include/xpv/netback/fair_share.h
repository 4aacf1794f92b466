// FairShare — fairness *between* data-plane threads: every direction of every queue of every vif
// that xpv-netback serves (DESIGN.md §3 "Fairness").
//
// FairScheduler (fair_scheduler.h) makes the two directions of one queue take turns on that
// queue's thread. But a vif with several queues — Linux's netfront opens one per vCPU — has its
// flows spread over several threads: with iperf3 --bidir one direction can land on queue 0 and the
// other on queue 1, and then which one moves more is decided by the CPU scheduler, not by us
// (measured: `xpv bench net`, 2 queues, 0.58 min/max under --bidir; 1 queue 0.95). The same holds
// between vifs. FairShare is the ledger the threads share so that none runs ahead:
//
//   account  = one direction of one queue (join() per queue: two accounts)
//   group    = the accounts of one vif (join(group)); 0: an account of its own
//   served   = what that account's turns cost (its virtual time): the bytes they moved, but at
//              least 4 KiB a packet (turn_cost, fair_scheduler.h), each counted k times where k is
//              how many accounts of its group have work at the time: a vif whose traffic is on
//              four queues then moves, all four together, what a vif on one queue moves
//              (weights: each vif one share, split among its busy accounts)
//   backlog  = the account has work right now (the queue thread says so before each turn)
//
//   before a turn, for each backlogged direction:   may_go(a) ⇔ served(a) ≤ min served of the
//                                                   *other* backlogged accounts + lead
//   no direction of this queue may go, but one has work ──► wait() (≤ 1 ms, or until any account
//                                                           is charged or goes idle), then retry
//   after a turn:                                   charge(a, turn_cost(bytes, packets of the turn))
//   an account that becomes backlogged after idling starts at max(its served, that minimum):
//   idle time banks no credit (the same rule as FairScheduler's forfeited credit).
//
// So an account is never more than `lead` bytes (plus one turn of FairScheduler::quantum) ahead of
// another that has work, whichever threads they run on; a lone busy account never waits. An
// account that says it has work but then moves nothing in its turn must say so (set_backlog false)
// or it would hold the others back — NetbackQueue does, and every wait is bounded anyway.
//
// Threads: any number of data-plane threads, each using only its own accounts; one mutex guards
// the ledger (held for a few loads and stores; taken once per turn, not per packet). join/leave
// on the threads that create and destroy queues.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>

namespace xpv::netback {

class FairShare {
 public:
  struct Account {
    std::uint64_t served = 0;
    bool backlog = false;
    std::uint64_t group = 0;
  };

  // `lead`: how many bytes one account may be ahead of the slowest other backlogged one.
  explicit FairShare(std::uint64_t lead_bytes = 512 * 1024) noexcept : lead_(lead_bytes) {}
  FairShare(const FairShare&) = delete;
  FairShare& operator=(const FairShare&) = delete;

  // A new account (stable address until leave()), idle, starting at the current minimum; the
  // accounts of one `group` (nonzero) share one weight (see `served` above).
  Account* join(std::uint64_t group = 0);
  void leave(Account* a) noexcept;

  // The owning thread reports whether `a` has work now; see the activation rule above.
  void set_backlog(Account* a, bool backlog) noexcept;
  // May `a` (backlogged) take a turn now?
  bool may_go(const Account* a) const noexcept;
  // What `a`'s turn cost, in bytes (turn_cost: bytes moved, at least 4 KiB a packet): its served
  // grows by that × the busy accounts of its group; waiters look again.
  void charge(Account* a, std::size_t bytes) noexcept;
  // The ledger's version: changes with every charge and every account going idle.
  std::uint64_t generation() const noexcept;
  // Blocks until the ledger changed since `seen` — generation() read BEFORE the may_go() looks
  // that decided to wait, so that a charge between those looks and this wait ends it at once
  // (read inside, it would sleep through that charge until the limit) — or `limit` passed.
  // Returns false on timeout.
  bool wait(std::chrono::microseconds limit, std::uint64_t seen) noexcept;

  std::uint64_t lead() const noexcept { return lead_; }
  std::size_t accounts() const noexcept;

 private:
  // The smallest `served` among backlogged accounts other than `self`; nullopt-like: UINT64_MAX.
  std::uint64_t min_other_backlogged(const Account* self) const noexcept;

  const std::uint64_t lead_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::list<Account> accounts_;  // list: addresses stay valid across join/leave
  std::uint64_t generation_ = 0;  // bumped by every charge and every backlog → idle
};

}  // namespace xpv::netback
