// The toolstack's xenstore connection: SyncClient (xenbus/client) with errors turned into
// ToolstackError lines that name the path, plus INTRODUCE / RELEASE, which SyncClient does not
// offer (sent as raw requests on a short-lived async client of our own).
//
// Threading: the calling thread only (SyncClient runs its io thread internally).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "xpv/toolstack/nodes.h"
#include "xpv/xenbus/client/sync_client.h"

namespace xpv::toolstack {

using xenbus::client::TxId;
inline constexpr TxId kNoTx = xenbus::client::kNoTx;

class Xenstore {
 public:
  // Throws ToolstackError "xpv-xenstored is not running (cannot connect to S); run `xpv up`".
  explicit Xenstore(const std::string& socket);
  // nullptr when nothing listens on `socket`.
  static std::unique_ptr<Xenstore> try_connect(const std::string& socket);

  const std::string& socket() const noexcept { return socket_; }

  std::optional<std::string> read(const std::string& path, TxId tx = kNoTx);  // ENOENT → nullopt
  std::vector<std::string> list(const std::string& path, TxId tx = kNoTx);    // ENOENT → {}
  bool exists(const std::string& path, TxId tx = kNoTx);
  void write(const std::string& path, const std::string& value, TxId tx = kNoTx);
  void set_perms(const std::string& path, const xenbus::PermList& perms, TxId tx = kNoTx);
  void rm(const std::string& path, TxId tx = kNoTx);  // an absent node is fine
  // Each node: write then set_perms, in list order.
  void write_nodes(const NodeList& nodes, TxId tx);
  // Runs body(tx) in a transaction, retried on EAGAIN; an exception from body aborts it and
  // propagates.
  void transaction(const std::function<void(TxId)>& body);

  // CONTROL with its arguments: the daemon's reply text; an error reply throws ToolstackError
  // naming `what`.
  std::string control(const std::vector<std::string>& args, const std::string& what);

  void introduce(DomId domid, std::uint64_t gfn, std::uint32_t port);
  void release(DomId domid);

 private:
  void raw_request(std::uint32_t type, const std::string& payload, const std::string& what);

  std::string socket_;
  std::unique_ptr<xenbus::client::SyncClient> client_;
};

}  // namespace xpv::toolstack
