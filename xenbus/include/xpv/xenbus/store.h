// The xenstore core: tree, permissions, transactions, watches, domains and quotas, with the
// request dispatcher on top. I/O-free — transports hand it whole messages and give it a Sink per
// connection to send replies and watch events through. Single-threaded: every call comes from
// the daemon's one io_context thread (or a test), so there is no lock.
//
// Files: tree.cpp (nodes, implicit parents, transaction overlay and commit), watch.cpp (watch
// registry and firing), domain.cpp (INTRODUCE/RELEASE/SET_TARGET/...), store.cpp (connections,
// dispatch, CONTROL).
//
// Transactions (generation-count based, as Xen 4.x): a transaction keeps a copy-on-write overlay
// of the nodes it changed and records, for every path it touched, the generation of the main
// tree's node at first touch (or "absent"). Commit checks each touched path still has that
// generation; any difference answers EAGAIN and drops the transaction. Watches triggered inside
// a transaction fire at commit.
//
//   TRANSACTION_START ──► open ──(op with tx_id)──► open
//                          │  └─ TRANSACTION_END F ──► dropped (OK)
//                          └──── TRANSACTION_END T ──► conflict? ─yes─► dropped (EAGAIN)
//                                                         └─no──► applied, watches fire (OK)
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "xpv/expected.h"
#include "xpv/xenbus/path.h"
#include "xpv/xenbus/perms.h"
#include "xpv/xenbus/wire.h"

namespace xpv::xenbus {

// Xen xenstored's defaults (its -E -S -W -t -A -M and -Q outstanding= / transaction-nodes=
// options).
struct Quotas {
  std::uint32_t nodes = 1000;         // nodes owned per unprivileged domain       → ENOSPC
  std::uint32_t node_size = 2048;     // value bytes per node, unprivileged        → ENOSPC
  std::uint32_t watches = 128;        // watches per connection                    → E2BIG
  std::uint32_t transactions = 10;    // open transactions per connection          → ENOSPC
  std::uint32_t outstanding = 20;     // unanswered requests per connection (transports stop
                                      // reading from a connection over it: backpressure)
  std::uint32_t path_max = 2048;      // path length below a domain's home, unprivileged → EINVAL
  std::uint32_t perms = 5;            // permission entries per node, unprivileged → ENOSPC
  std::uint32_t pending_events = 1024;  // queued watch events per connection; beyond, dropped
  std::uint32_t transaction_nodes = 1024;  // nodes one transaction may access, unprivileged → ENOSPC
};
// Sets one quota by its option name (nodes, node-size, watches, transactions, outstanding,
// path-max, perms, pending-events, transaction-nodes). Returns false for an unknown key or a
// zero value.
bool set_quota(Quotas& q, std::string_view key, std::uint64_t value) noexcept;
std::string format_quotas(const Quotas& q);

using ConnId = std::uint64_t;

// Where a connection's replies and watch events go. Called synchronously from Store::handle();
// an implementation queues the bytes and must not call back into the Store.
class ChangeLog;
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void deliver(const wire::Header& h, std::string_view payload) = 0;
  // Crash restart: the reply that deliver() is about to get, while the request's changes are
  // being journaled, so that the transport can add its own record of it to the same commit (a
  // domain's ring: where its request index is, and the reply itself, which is not on the ring
  // yet). Default: nothing.
  virtual void journal_reply(ChangeLog& /*log*/, const wire::Header& /*h*/, std::string_view /*payload*/) {}
};

// Side effects the core asks of the daemon. Called synchronously; they must not call back into
// the Store (a transport closing a released domain's ring defers that with post()).
struct Hooks {
  // Called by INTRODUCE for a domain not yet introduced, before anything is recorded: the daemon
  // attaches the domain's ring here. An error is the INTRODUCE reply and nothing is recorded
  // (no @introduceDomain). Unset: the domain is recorded without a ring.
  std::function<Expected<void, wire::Error>(DomId, std::uint64_t mfn, std::uint32_t port)> attach;
  // Called after a domain was recorded as introduced (logging).
  std::function<void(DomId, std::uint64_t mfn, std::uint32_t port)> introduced;
  std::function<void(DomId)> released;
  std::function<void(std::string_view)> print;             // CONTROL print
  std::function<bool(std::string_view)> set_log_level;     // CONTROL log-level
  // CONTROL live-update ARGS... (privileged; xenstore-control's protocol): the daemon's answer,
  // or nullopt when the daemon answers later through Store::answer() — after the exec, from the
  // new binary. Unset: live-update is EINVAL like any unknown command.
  std::function<std::optional<Expected<std::string, wire::Error>>(
      ConnId, const wire::Header&, const std::vector<std::string>& args)>
      live_update;
};

// Crash restart (daemon/journal.h): the Store tells a journal every change that a restart after a
// crash must carry over, as it makes it — the tree (each node written or removed in the main
// tree, transactions' commits included), the domain table, and each domain's watches and
// transaction counter (socket clients' state is not recorded: their connections end with the
// process). Records are JSON objects, handed over as their text (one line; Store::recover()
// reads them back). Called synchronously from the Store's thread; an implementation must not call
// back into the Store.
class ChangeLog {
 public:
  virtual ~ChangeLog() = default;
  virtual void record(std::string_view change) = 0;
  // Every change of the request being handled has been recorded; called before its reply goes to
  // its Sink (and after a domain introduced or released outside a request), so that nothing is
  // acknowledged before it is in the journal.
  virtual void commit() noexcept = 0;
  // A change could not be recorded (out of memory while making the record): what the log holds
  // no longer adds up to the store, so it must not be recovered from as it is. The journal gives
  // itself up and is written again from a snapshot of the store (daemon/journal.h).
  virtual void lost(std::string_view what) noexcept = 0;
};

struct Node {
  std::string value;
  PermList perms;
  std::vector<std::string> children;  // creation order, as Xen lists them
  std::uint64_t gen = 0;              // generation of the last change (value, perms, children)
};

class Store {
 public:
  explicit Store(Quotas quotas = {}, Hooks hooks = {});
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // A new connection of `domid`; dom0 connections (socket clients) are privileged.
  ConnId connect(DomId domid, Sink& sink);
  // Drops the connection with its watches and transactions.
  void disconnect(ConnId id) noexcept;

  // Processes one request and sends its reply (then any watch events) through the sinks.
  void handle(ConnId id, const wire::Header& h, std::string_view payload) noexcept;

  // Domain table (also reached through INTRODUCE / RELEASE). introduce fires @introduceDomain;
  // release drops the domain's watches and transactions and fires @releaseDomain. Nodes stay.
  Expected<void, wire::Error> introduce(DomId domid, std::uint64_t mfn, std::uint32_t port);
  Expected<void, wire::Error> release(DomId domid);
  bool is_introduced(DomId domid) const noexcept;

  // Live update (daemon/live_update.h). save(): the tree, the domain table and every
  // connection's identity, watches and transaction counter, as JSON (byte strings hex-encoded).
  // Only between requests. restore(): on a Store that has served nothing yet, replaces all of it
  // with a saved state; each restored connection has no Sink until its transport calls
  // attach_sink() (until then nothing is delivered to it). Throws std::runtime_error naming
  // what is wrong with the state.
  nlohmann::json save() const;
  void restore(const nlohmann::json& state);
  void attach_sink(ConnId id, Sink& sink);
  std::vector<ConnId> connection_ids() const;
  // Open transactions over all connections; abort_transactions() ends them all (live-update -F):
  // the next request in one of them, its TRANSACTION_END included, answers EAGAIN, as for a
  // conflict, so that a client retries.
  std::size_t open_transactions() const noexcept;
  void abort_transactions() noexcept;
  // Sends a reply to `request` (a deferred CONTROL answer) on connection `id`, if it still exists.
  void answer(ConnId id, const wire::Header& request, std::string_view payload);

  // Crash restart (daemon/journal.h). set_change_log(): from now on every change is recorded
  // there (nullptr: no longer). recover(): on a Store that has served nothing yet, the snapshot a
  // journal starts with (save()'s JSON) and then each change recorded after it, in order. Socket
  // clients' connections are dropped (their clients went with the crashed process); each
  // introduced domain keeps or gets one connection, without a Sink, with its watches; a
  // transaction id it was given before (below its counter) answers EAGAIN, so that the domain
  // retries, as for a conflict. Returns what the daemon must attach again. Throws
  // std::runtime_error naming the change that cannot be applied.
  struct RecoveredDomain {
    DomId domid;
    std::uint64_t mfn;
    std::uint32_t port;
    ConnId conn;
  };
  void set_change_log(ChangeLog* log) noexcept { log_ = log; }
  ChangeLog* change_log() const noexcept { return log_; }  // for transports' own records
  std::vector<RecoveredDomain> recover(const nlohmann::json& snapshot, const std::vector<nlohmann::json>& changes);
  // Every watch of connection `id` fires once (after a crash restart: events the crashed process
  // had not yet put on the ring are gone; xenbus drivers read the node again on any event).
  void refire_watches(ConnId id);

  // Introspection (tests, CONTROL, xpv top).
  const Quotas& quotas() const noexcept { return quotas_; }
  std::size_t node_count() const noexcept { return nodes_.size(); }
  const Node* find(std::string_view abs_path) const noexcept;
  std::size_t watch_count(ConnId id) const noexcept;
  std::size_t transaction_count(ConnId id) const noexcept;
  std::uint32_t owned_nodes(DomId domid) const noexcept;
  std::size_t connection_count() const noexcept { return conns_.size(); }

 private:
  struct Txn;
  struct Watch;
  struct Conn;
  struct Domain {
    bool introduced = false;
    std::uint64_t mfn = 0;
    std::uint32_t port = 0;
    std::optional<DomId> target;
  };
  struct PendingEvent {
    std::string path;
    bool exact;      // only watches on exactly this path (descendants of a removed node)
    PermList perms;  // the node's permissions, for the watcher's read check
    // In a transaction, the node's permissions at its first event there when they changed since:
    // a watcher that could read the node by either sees the event (as Xen's xenstored).
    std::optional<PermList> earlier_perms;
  };
  using Reply = Expected<std::string, wire::Error>;

  // store.cpp: dispatch
  Reply dispatch(Conn& c, ConnId id, const wire::Header& h, std::string_view payload);
  Reply do_control(Conn& c, ConnId id, const wire::Header& h, const wire::Args& a);
  Requester requester(const Conn& c) const noexcept;
  void flush_events() noexcept;

  // tree.cpp: nodes through an optional transaction
  const Node* lookup(Txn* t, const std::string& p);
  void put(Txn* t, const std::string& p, Node n);
  void erase(Txn* t, const std::string& p);
  std::int64_t owned(Txn* t, DomId d) const noexcept;
  wire::Error missing_error(Txn* t, const Requester& who, const std::string& p);
  Expected<std::string, wire::Error> resolve(const Conn& c, std::string_view path) const noexcept;
  Reply op_read(Txn* t, const Conn& c, std::string_view path);
  Reply op_write(Txn* t, const Conn& c, std::string_view path, std::string_view value);
  Reply op_mkdir(Txn* t, const Conn& c, std::string_view path);
  Reply op_rm(Txn* t, const Conn& c, std::string_view path);
  Reply op_directory(Txn* t, const Conn& c, std::string_view path);
  Reply op_directory_part(Txn* t, const Conn& c, std::string_view path, std::string_view off);
  Reply op_get_perms(Txn* t, const Conn& c, std::string_view path);
  Reply op_set_perms(Txn* t, const Conn& c, const wire::Args& a);
  Expected<void, wire::Error> create(Txn* t, const Conn& c, const std::string& p,
                                     std::string_view value);
  Reply txn_start(Conn& c, Txn* t);
  Reply txn_end(Conn& c, std::uint32_t tx_id, std::string_view arg);
  void note_event(Txn* t, std::string path, bool exact, PermList perms);

  // watch.cpp
  Reply op_watch(Conn& c, ConnId id, std::string_view path, std::string_view token);
  Reply op_unwatch(Conn& c, std::string_view path, std::string_view token);
  void fire(const PendingEvent& ev);
  void queue_event(ConnId id, const Conn& c, const Watch& w, std::string_view abs_path);

  // journal.cpp: records for the ChangeLog, and their replay by recover()
  void log_put(const std::string& p, const Node* old, const Node& n);
  void log_erase(const std::string& p);
  void log_record(const nlohmann::json& change);
  void log_conn(const Conn& c, nlohmann::json change);
  void log_commit() noexcept;
  void replay(const nlohmann::json& change);
  Conn& conn_of(DomId domid);

  // domain.cpp
  Reply op_introduce(const Conn& c, const wire::Args& a);
  Reply op_release(const Conn& c, std::string_view domid);
  Reply op_resume(const Conn& c, std::string_view domid);
  Reply op_set_target(const Conn& c, std::string_view domid, std::string_view target);
  Reply op_is_introduced(std::string_view domid);
  Reply op_get_domain_path(std::string_view domid);

  Quotas quotas_;
  Hooks hooks_;
  std::unordered_map<std::string, Node> nodes_;
  std::unordered_map<DomId, std::uint32_t> owned_;  // nodes per owner, main tree
  std::uint64_t gen_ = 0;
  std::map<ConnId, std::unique_ptr<Conn>> conns_;  // ordered: events go out in connect order
  ConnId next_conn_ = 1;
  std::map<DomId, Domain> domains_;
  std::vector<std::pair<ConnId, std::string>> outbox_;  // watch events after the reply
  bool handling_ = false;  // inside handle(): events go out after the reply; else at once
  bool deferred_ = false;  // the request being handled is answered later (Hooks::live_update)
  ChangeLog* log_ = nullptr;
};

}  // namespace xpv::xenbus
