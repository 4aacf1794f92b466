// Crash restart of xpv-xenstored: a journal of the store, so that a daemon that died (a crash,
// kill -9, the OOM killer) can be started again under running domains without losing what it had
// acknowledged — something neither of Xen's xenstoreds offers (their state lives in the process;
// only a planned live update carries it over). `xpv-xenstored --journal FILE` (what `xpv up`
// passes: <run-dir>/xenstored.journal) keeps it:
//
//   FILE = one JSON line  {"xpv-xenstored-journal":1,"snapshot":<Store::save()>,
//                          "rings":[{"domid":D, <RingJournalState::to_json()>}...]}
//          then one line per change (store.h ChangeLog; the records: store/journal.cpp, and
//          the rings' own: ring_connection.h)
//
//   start, FILE absent      Store as new; FILE written with its snapshot
//   start, FILE present     (the last daemon did not stop cleanly) Store::recover(snapshot,
//                           changes); each introduced domain attached again through its control
//                           socket and its ring served from where the journal and the domain's
//                           indexes say (Domains::recover), each of its watches fired once; FILE
//                           rewritten with a snapshot of the recovered store and rings
//   each request            its changes (a domain's: and its ring's record with the reply)
//                           appended in one write(2) before its reply is queued
//   FILE past max(4 MiB, twice its snapshot)   a new snapshot (FILE.tmp, renamed over FILE)
//   SIGTERM / SIGINT        FILE removed: a daemon stopped on purpose starts empty next time
//   live update             the next binary restores its state file and writes a new snapshot
//   FILE cannot be written  (a write fails: ENOSPC, EFBIG past RLIMIT_FSIZE, EIO; or a change
//   or a change is lost      could not be recorded for want of memory: ChangeLog::lost) FILE is
//                           removed — a journal that misses a change must not be recovered from
//                           — and written again from a new snapshot: at once after the request
//                           that failed, then after 1 s, doubling up to 32 s, until that works.
//                           Meanwhile a crash cannot be recovered from; nothing else changes.
//                           (A restored or recovered store whose first snapshot fails starts so.)
//
// What a crash restart keeps: every node (values, permissions, generations), the domain table,
// each domain's watches and transaction-id counter. What it cannot keep: socket clients' own
// connections, watches and transactions (the clients — backends, tools — see their connection
// close and must connect again: `xpv`'s supervisor restarts the backends), a domain's open
// transactions (their next request answers EAGAIN, so that the domain retries, as for a
// conflict), and watch events not yet on a domain's ring when the process died (every watch fires
// once to make up for them). What is between a domain's ring and the store is kept: a request
// taken off the ring is answered once — its reply is journaled with it —, a request taken off in
// part is completed from the journal, a message left half on the ring is finished.
// The journal is written, not fsync'd: it protects against the process dying, not the host (the
// domains die with the host anyway).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "xpv/xenbus/daemon/ring_connection.h"
#include "xpv/xenbus/store.h"

namespace xpv::xenbus::daemon {

inline constexpr int kJournalVersion = 1;

class Journal final : public ChangeLog {
 public:
  struct Contents {
    nlohmann::json snapshot;
    nlohmann::json rings = nlohmann::json::array();  // the snapshot's (absent: none)
    std::vector<nlohmann::json> changes;
    bool torn_tail = false;  // a last line cut short (left out: its request was never answered)

    // Each domain ring's state as the journal leaves it: the snapshot's, each "ring" record
    // folded in, a domain introduced or released again starting without one. Throws
    // std::runtime_error naming the change that is not a ring record.
    std::map<DomId, RingJournalState> ring_states() const;
  };
  // Reads a journal. Throws std::runtime_error naming the file and line of anything that is not
  // a journal line (other than a last line cut short).
  static Contents read(const std::string& path);

  // Writes a snapshot of `store` (and of the rings `rings` returns: Domains::journal_state) to
  // `path` (0600; through path.tmp renamed over it) and becomes the store's change log. When the
  // file cannot be written: on a fresh start (`carried_over` false) throws std::runtime_error;
  // for a store carried over from a live update or a crash, which a refusal would lose, starts
  // given up and tries again as after a failed write.
  Journal(boost::asio::io_context& io, Store& store, std::string path,
          std::function<nlohmann::json()> rings = {}, bool carried_over = false);
  ~Journal() override;  // stops recording; the file stays (only remove() takes it away)
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  void record(std::string_view change) override;
  void commit() noexcept override;
  void lost(std::string_view what) noexcept override;
  // A clean stop: the file goes, so that the next daemon starts empty (and is not written again).
  void remove() noexcept;

  const std::string& path() const noexcept { return path_; }
  bool failed() const noexcept { return failed_; }  // given up, not (yet) written again
  std::uint64_t failures() const noexcept { return failures_; }  // times given up
  std::uint64_t changes() const noexcept { return changes_; }
  std::uint64_t snapshots() const noexcept { return snapshots_; }
  std::uint64_t bytes() const noexcept { return bytes_; }  // in the file now

 private:
  void snapshot();  // write_snapshot(), giving the journal up if that fails
  // A new file with the store's snapshot, renamed over the old one; what went wrong, if anything.
  std::optional<std::string> write_snapshot();
  // Gives the journal up (the file removed) and starts trying to write it again; called while
  // given up (a change the file misses), removes a file kept with keep_file (stale_at_change_:
  // a carried-over start's).
  void fail(std::string_view what, bool keep_file = false) noexcept;
  void remove_file(std::string_view why) noexcept;
  void retry_after(std::chrono::milliseconds delay) noexcept;
  void retry() noexcept;

  boost::asio::io_context& io_;
  Store& store_;
  std::string path_;
  std::function<nlohmann::json()> rings_;
  int fd_ = -1;
  std::string pending_;
  std::uint64_t changes_ = 0;
  std::uint64_t snapshots_ = 0;
  std::uint64_t bytes_ = 0;
  std::uint64_t snapshot_bytes_ = 0;
  bool snapshot_posted_ = false;
  bool failed_ = false;
  bool removed_ = false;  // remove(): never written again
  // A carried-over start whose first snapshot failed: the file it was recovered from still
  // matches the store, so it stays until the first change (then it is removed) or a snapshot.
  bool stale_at_change_ = false;
  std::uint64_t failures_ = 0;
  boost::asio::steady_timer retry_timer_;
  // What the handlers this posts hold on to: a handler already queued when the Journal goes
  // (which cancel() cannot take back) finds it expired and touches nothing.
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
  std::chrono::milliseconds retry_delay_{0};  // before the next try; 0: at once
};

}  // namespace xpv::xenbus::daemon
