// Domains — xpv-xenstored's attachment of real domains (PROCESS-DOMAINS.md, "Domain lifecycle"
// step 3): on INTRODUCE(domid, mfn, port) connect to the domain's control socket
// (`<run_dir>/dom<N>.sock`, ForeignDomain), check that the domain's xenstore ring is at gfn `mfn`
// with event channel `port`, take the ring page from its memory, bind the port and serve a
// RingConnection with domain N's permissions. When the domain process goes away (its control
// socket closes: ForeignDomain::death_fd) the domain is released — its watches and transactions
// dropped, @releaseDomain fired — and its ring is no longer served.
//
// This is the daemon's only link to hypervisor-core/domain (library xpv::xenbus_domains): the
// store and the transports stay free of it, as Xen's xenstored keeps its grant/evtchn library
// calls in domain.c.
//
//   INTRODUCE ──attach()──► connect dom<N>.sock ─► check gfn, port ─► map page ─► bind port
//        │ any step fails: INTRODUCE answers the error, nothing is recorded or kept
//        ▼ ok: Store records N, fires @introduceDomain; ring->start() runs next (posted)
//   serving ──death_fd readable──► Store::release(N) (@releaseDomain) ─► drop ─► gone
//   serving ──RELEASE(N)─────────► released(N) (posted) ──────────────► drop ─► gone
//
// Threading: everything on the daemon's io_context thread (the Store's thread). attach() blocks
// that thread while it talks to the domain's control socket (bounded by the control client's
// timeout, 5 s), as Xen's xenstored blocks in its map and bind calls.
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "xpv/expected.h"
#include "xpv/xenbus/daemon/ring_connection.h"
#include "xpv/xenbus/store.h"
#include "xpv/xenbus/wire.h"

namespace xpv::xenbus::daemon {

class Domains {
 public:
  // `store` must be the Store whose hooks call attach()/released(); both outlive this object.
  Domains(boost::asio::io_context& io, Store& store, std::string run_dir);
  ~Domains();
  Domains(const Domains&) = delete;
  Domains& operator=(const Domains&) = delete;

  // Hooks::attach. Errors (what Xen's xenstored answers for an introduce it cannot map or bind,
  // seen through libxenstore): EINVAL for a domain without a control socket, one that does not
  // answer, a gfn or port that is not the domain's xenstore ring, a failed bind.
  Expected<void, wire::Error> attach(DomId domid, std::uint64_t mfn, std::uint32_t port);
  // Hooks::released: the Store already dropped the domain; its ring goes away (posted, since
  // this runs inside a Store call).
  void released(DomId domid);

  // Live update. save(): every attached domain (domid, mfn, port) with its ring's state.
  // restore(): in the next binary, after Store::restore and the socket transport: attach each
  // domain again through its control socket and resume its ring (posted); a domain that cannot be
  // attached any more (it died meanwhile) is released as its death would have released it.
  nlohmann::json save() const;
  void restore(const nlohmann::json& saved);
  // Crash restart (journal.h). journal_state(): each attached domain's ring for the journal's
  // snapshot ([{"domid":D, RingJournalState::to_json()...}]). recover(): after Store::recover,
  // attach each recovered domain again the same way, its ring as the journal left it (`rings`,
  // Journal::Contents::ring_states; a domain without one is served from its page's indexes),
  // and fire each of its watches once.
  nlohmann::json journal_state() const;
  void recover(const std::vector<Store::RecoveredDomain>& domains,
               const std::map<DomId, RingJournalState>& rings = {});

  std::size_t attached() const noexcept { return doms_.size(); }
  bool is_attached(DomId domid) const noexcept { return doms_.count(domid) != 0; }

  struct Attached;

 private:
  // Connects to the domain, checks its ring, maps it, binds the port, makes the RingConnection
  // (not started) and records the domain.
  Expected<std::shared_ptr<Attached>, wire::Error> connect(DomId domid, std::uint64_t mfn, std::uint32_t port);
  // restore()/recover(): attach domain `domid` again, give its new RingConnection connection
  // `conn`'s state (`load`: RingConnection::restore or ::recover) and serve it (posted) — or
  // release the domain when it cannot be attached any more or its state cannot be loaded.
  void reattach(DomId domid, std::uint64_t mfn, std::uint32_t port, ConnId conn,
                const std::function<void(RingConnection&)>& load, bool refire, const char* why);
  void watch_death(const std::shared_ptr<Attached>& a);
  void drop(const std::shared_ptr<Attached>& a);

  boost::asio::io_context& io_;
  Store& store_;
  std::string run_dir_;
  std::map<DomId, std::shared_ptr<Attached>> doms_;
};

}  // namespace xpv::xenbus::daemon
