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

#include "xpv/ring/xenstore.h"
#include "xpv/xenbus/daemon/connection.h"
#include "xpv/xenbus/wire.h"

namespace xpv::xenbus::daemon {

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
  void resume(const nlohmann::json& saved);
  DomId domid() const noexcept override { return domid_; }
  void deliver(const wire::Header& h, std::string_view payload) override;
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

  Store& store_;
  ring::XenstoreDomainInterface* intf_;
  boost::asio::posix::stream_descriptor kick_in_;
  int kick_out_fd_;
  std::function<bool()> kick_out_;
  DomId domid_;
  ConnId id_ = 0;
  wire::Framer framer_;
  std::deque<std::string> out_;  // encoded messages not yet (fully) on the ring
  std::size_t out_off_ = 0;      // bytes of out_.front() already written
  std::size_t replies_queued_ = 0;
  bool failed_ = false;
  bool closed_ = false;
  bool started_ = false;
  std::uint64_t kicks_sent_ = 0;
};

}  // namespace xpv::xenbus::daemon
