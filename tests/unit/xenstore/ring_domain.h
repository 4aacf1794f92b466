// One simulated domain of the xenstore ring tests (ring_test.cpp, tests/fuzz/xenstore): its
// xenstore page and its event channel as two eventfds (the daemon's RingConnection gets dups),
// the daemon's connection and the test's RingClient on the same page.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <memory>

#include "ring_client.h"
#include "xpv/ring/xenstore.h"
#include "xpv/unique_fd.h"
#include "xpv/xenbus/daemon/ring_connection.h"

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

}  // namespace xpv::test
