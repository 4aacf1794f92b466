// The domain-ring transport: a domain's xenstore page (struct xenstore_domain_interface, two
// 1 KiB byte rings) plus an event channel, here a pair of eventfds — `kick_in` is signalled by
// the domain (requests produced / responses consumed), `kick_out` by us. Later the domain
// control socket hands the real page (from the domain's memfd) and the event channel's eventfds
// in; the constructor takes exactly that: a page span, two fds, a domid.
//
// Ring discipline (Xen's xenstored domain.c): read the peer's index once (acquire), check
// `prod - cons <= 1024`, copy the bytes out, then parse. A bad index sets error=RINGIDX, a
// message longer than 4096 sets error=PROTO; either stops serving the ring (sticky) while every
// other connection keeps going.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "xpv/ring/xenstore.h"
#include "xpv/xenbus/daemon/connection.h"
#include "xpv/xenbus/wire.h"

namespace xpv::xenbus::daemon {

// Crash restart (journal.h): what the journal holds of one domain's ring. A ring journals, in the
// same commit as a request's changes, the request index just past that request and the reply
// with its position in the ring's response stream; before it publishes the index past the first
// bytes of a request not all on the ring yet, those bytes; before it leaves part of a message on
// the ring, that message. So a daemon recovering from the journal takes no request twice and
// leaves none unanswered, and never leaves a message half-written on the ring.
//
//   {"op":"ring","domid":D, "cons":C,"in":HEX   (request index published; the bytes taken of a
//                                                request not yet complete — or "in_more": those
//                                                taken since the last record)
//                           "rsp":R              (the response index when recorded)
//                           "at":A,"msg":HEX     (a message that starts at response position A)
//                           "failed":true}       (the ring was disabled)      — each part optional
struct RingJournalState {
  bool has_cons = false;
  std::uint32_t cons = 0;
  std::string in;
  std::uint32_t rsp = 0;
  std::vector<std::pair<std::uint32_t, std::string>> out;  // (position, message), by position
  bool failed = false;

  // Folds one "ring" record in; messages known to be wholly on the ring are dropped. Throws
  // std::runtime_error naming a field that is missing or wrong.
  void apply(const nlohmann::json& record);
  nlohmann::json to_json() const;  // the record that apply() turns an empty state into this one
};

class RingConnection final : public Connection,
                             public std::enable_shared_from_this<RingConnection> {
 public:
  // Takes ownership of both fds. Throws std::invalid_argument if the page is smaller than the
  // interface or an fd is invalid. Call start() to begin serving.
  RingConnection(boost::asio::io_context& io, Store& store, std::span<std::uint8_t> page,
                 int kick_in_fd, int kick_out_fd, DomId domid);
  // The same with the outgoing kick as a function (a real domain's event channel: Dom0Port's
  // notify(), which the daemon's domain glue owns). `kick_out` is called on the io thread and
  // returns false if the kick could not be sent. Takes ownership of kick_in_fd.
  RingConnection(boost::asio::io_context& io, Store& store, std::span<std::uint8_t> page,
                 int kick_in_fd, std::function<bool()> kick_out, DomId domid);
  ~RingConnection() override;

  void start();
  // Live update. save(): the connection's id in the Store, the bytes of a request it has taken
  // off the ring but not yet handled, the replies and events not yet on the ring, whether the
  // ring was disabled. resume(): instead of start(), serve the connection of a saved state (the
  // Store already holds it: Store::restore) and whatever the domain put on the ring meanwhile.
  nlohmann::json save() const;
  void resume(const nlohmann::json& saved) {
    restore(saved);
    serve();
  }
  // resume() in two steps: restore() takes the saved state (and throws std::runtime_error if it
  // is not one); serve() starts serving, once every connection of the state has its Sink.
  void restore(const nlohmann::json& saved);
  void serve();
  // Crash restart. journal_state(): this ring for a journal's snapshot. recover(): instead of
  // start(), connection `id` (Store::recover's) with the ring as the journal left it, checked
  // against the page: the request index is set back to the journal's when the dead daemon had
  // recorded a request but not yet published its index; replies the page shows as written are
  // not written again, one it shows half-written is finished. Then serve().
  RingJournalState journal_state() const;
  void recover(ConnId id, const RingJournalState& state);
  DomId domid() const noexcept override { return domid_; }
  void deliver(const wire::Header& h, std::string_view payload) override;
  void journal_reply(ChangeLog& log, const wire::Header& h, std::string_view payload) override;
  void close() noexcept override;

  bool failed() const noexcept { return failed_; }
  std::uint64_t kicks_sent() const noexcept { return kicks_sent_; }

 private:
  void wait_kick();
  void service() noexcept;
  bool consume_requests() noexcept;  // true if any byte was consumed
  bool produce_responses() noexcept;  // true if any byte was produced
  void violation(std::uint32_t error_code, const char* what) noexcept;
  void kick() noexcept;
  std::uint32_t tail() const noexcept;  // the response position the next queued message takes
  // A "ring" record of this connection (journal_state's fields, any of them): its text.
  std::string ring_record(nlohmann::json fields) const;
  // Records the "ring" record whose fields build() returns, and commits at once. The fields are
  // built inside, so that running out of memory while building them, as while recording them,
  // only loses the record (ChangeLog::lost: the journal is written again from a snapshot) and
  // never escapes the noexcept data path that called it (std::terminate).
  template <class Build>
  void journal(Build&& build) noexcept;

  Store& store_;
  ring::XenstoreDomainInterface* intf_;
  boost::asio::posix::stream_descriptor kick_in_;
  int kick_out_fd_;
  std::function<bool()> kick_out_;
  DomId domid_;
  ConnId id_ = 0;
  wire::Framer framer_;
  struct Out {
    std::string msg;         // encoded
    bool journaled = false;  // in the journal (a reply, or a message once left half on the ring)
  };
  std::deque<Out> out_;     // messages not yet (fully) on the ring
  std::size_t out_off_ = 0;  // bytes of out_.front() already written
  std::size_t unwritten_ = 0;  // bytes of out_ not yet on the ring
  std::uint32_t handled_cons_ = 0;  // the request index just past the request being handled
  std::size_t journaled_in_ = 0;    // bytes of the framer's partial request in the journal
  bool reply_journaled_ = false;    // journal_reply() recorded the reply deliver() gets next
  std::string journaled_reply_;     // ... encoded, for deliver() to queue
  std::size_t replies_queued_ = 0;
  bool failed_ = false;
  bool closed_ = false;
  bool started_ = false;
  std::uint64_t kicks_sent_ = 0;
};

}  // namespace xpv::xenbus::daemon
