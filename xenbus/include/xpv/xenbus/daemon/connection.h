// What every xenstored transport looks like to the rest of the daemon: one peer that the Store
// talks to through the Sink half, with a domid and a way to be closed. Two implementations:
// SocketServer's connections (unix socket, dom0, libxenstore-compatible) and RingConnection
// (a domain's struct xenstore_domain_interface page plus an event channel).
#pragma once

#include "xpv/xenbus/store.h"

namespace xpv::xenbus::daemon {

class Connection : public Sink {
 public:
  virtual DomId domid() const noexcept = 0;
  // Stops serving the peer and drops it from the Store. Idempotent.
  virtual void close() noexcept = 0;
};

}  // namespace xpv::xenbus::daemon
