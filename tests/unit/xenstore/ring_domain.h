// The xenstore ring tests' world (ring_test.cpp, tests/fuzz/xenstore): simulated domains, each
// its xenstore page and its event channel as two eventfds (the daemon's RingConnection gets
// dups) with the test's RingClient on the same page, served by RingConnections of one Store on
// one io thread, as in xpv-xenstored.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "ring_client.h"
#include "xpv/ring/xenstore.h"
#include "xpv/unique_fd.h"
#include "xpv/xenbus/daemon/ring_connection.h"
#include "xpv/test/io_thread.h"

namespace xpv::test {

struct RingDomain {
  alignas(4096) std::array<std::uint8_t, 4096> page{};
  UniqueFd kick_in{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};   // the domain → xenstored
  UniqueFd kick_out{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};  // xenstored → the domain
  std::shared_ptr<xenbus::daemon::RingConnection> conn;
  std::unique_ptr<RingClient> client;
  xenbus::DomId domid = 0;

  ring::XenstoreDomainInterface* intf() { return reinterpret_cast<ring::XenstoreDomainInterface*>(page.data()); }
  void kick() {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(kick_in.get(), &one, sizeof one);
  }
};

// xenstored's side: `store` (which must outlive it) served on its own thread.
class RingDaemon {
 public:
  explicit RingDaemon(xenbus::Store& store) : store_(store) {}
  ~RingDaemon() {
    on_io([this] {
      for (auto& d : doms_) d->conn->close();
    });
    io_.stop();
  }
  RingDaemon(const RingDaemon&) = delete;
  RingDaemon& operator=(const RingDaemon&) = delete;

  // Runs fn on the daemon's thread and waits for it (the Store is single-threaded).
  template <class F>
  auto on_io(F f) -> decltype(f()) {
    return io_.run(std::move(f));
  }

  // A new domain whose ring the daemon serves from now on.
  RingDomain& attach(xenbus::DomId domid) {
    auto d = std::make_unique<RingDomain>();
    RingDomain* dp = d.get();
    dp->domid = domid;
    on_io([&] {
      dp->conn = std::make_shared<xenbus::daemon::RingConnection>(
          io_.io(), store_, std::span<std::uint8_t>(dp->page), ::dup(dp->kick_in.get()), ::dup(dp->kick_out.get()), domid);
      dp->conn->start();
    });
    dp->client = std::make_unique<RingClient>(dp->intf(), dp->kick_in.get(), dp->kick_out.get());
    doms_.push_back(std::move(d));
    return *dp;
  }

 private:
  xenbus::Store& store_;
  IoThread io_;
  std::vector<std::unique_ptr<RingDomain>> doms_;
};

}  // namespace xpv::test
