#include "xpv/toolstack/xenstore.h"

#include <fmt/core.h>

#include <boost/asio/io_context.hpp>
#include <exception>
#include <stdexcept>

#include "xpv/toolstack/error.h"

namespace xpv::toolstack {

namespace client = xenbus::client;
using xenbus::wire::Error;

namespace {

constexpr auto kTimeout = std::chrono::seconds(10);

std::string err_name(Error e) { return std::string(xenbus::wire::error_name(e)); }

// EAGAIN from an operation inside a transaction: xenstored ended the transaction under us (a
// conflict, or `live-update -F`); transaction() starts it again rather than failing.
struct TxConflict : ToolstackError {
  using ToolstackError::ToolstackError;
};

[[noreturn]] void op_failed(const char* op, const std::string& path, Error e, TxId tx) {
  const std::string what = fmt::format("xenstore {} {}: {}", op, path, err_name(e));
  if (e == Error::eagain && tx != kNoTx) throw TxConflict(what);
  throw ToolstackError(what);
}

}  // namespace

Xenstore::Xenstore(const std::string& socket) : socket_(socket) {
  try {
    client_ = std::make_unique<client::SyncClient>(socket, kTimeout);
  } catch (const std::exception&) {
    throw ToolstackError(fmt::format("xpv-xenstored is not running (cannot connect to {}); run `xpv up`", socket));
  }
}

std::unique_ptr<Xenstore> Xenstore::try_connect(const std::string& socket) {
  try {
    return std::make_unique<Xenstore>(socket);
  } catch (const ToolstackError&) {
    return nullptr;
  }
}

std::optional<std::string> Xenstore::read(const std::string& path, TxId tx) {
  auto r = client_->read(path, tx);
  if (r) return *r;
  if (r.error() == Error::enoent) return std::nullopt;
  op_failed("read", path, r.error(), tx);
}

std::vector<std::string> Xenstore::list(const std::string& path, TxId tx) {
  auto r = client_->directory(path, tx);
  if (r) return *r;
  if (r.error() == Error::enoent) return {};
  op_failed("directory", path, r.error(), tx);
}

bool Xenstore::exists(const std::string& path, TxId tx) { return read(path, tx).has_value(); }

void Xenstore::write(const std::string& path, const std::string& value, TxId tx) {
  auto r = client_->write(path, value, tx);
  if (!r) op_failed("write", path, r.error(), tx);
}

void Xenstore::set_perms(const std::string& path, const xenbus::PermList& perms, TxId tx) {
  auto r = client_->set_perms(path, perms, tx);
  if (!r) op_failed("set-perms", path, r.error(), tx);
}

void Xenstore::rm(const std::string& path, TxId tx) {
  auto r = client_->rm(path, tx);
  if (!r && r.error() != Error::enoent) {
    op_failed("rm", path, r.error(), tx);
  }
}

void Xenstore::write_nodes(const NodeList& nodes, TxId tx) {
  for (const Node& n : nodes) {
    write(n.path, n.value, tx);
    set_perms(n.path, n.perms, tx);
  }
}

void Xenstore::transaction(const std::function<void(TxId)>& body) {
  std::exception_ptr thrown;
  auto r = client_->transaction([&](TxId tx) -> client::Result<void> {
    try {
      body(tx);
      return {};
    } catch (const TxConflict&) {
      return xpv::fail(Error::eagain);  // the client starts the transaction again
    } catch (...) {
      thrown = std::current_exception();
      return xpv::fail(Error::eio);  // aborts the transaction
    }
  });
  if (thrown) std::rethrow_exception(thrown);
  if (!r) throw ToolstackError(fmt::format("xenstore transaction failed: {}", err_name(r.error())));
}

void Xenstore::raw_request(std::uint32_t type, const std::string& payload, const std::string& what) {
  boost::asio::io_context io(1);
  auto c = client::Client::create(io);
  // Plain flags rather than an optional<Result>: g++ 12 misreads the latter's variant as
  // maybe-uninitialized.
  bool answered = false;
  Error error = Error::eio;
  bool ok = false;
  c->connect(socket_, [&](client::Result<void> r) {
    if (!r) {
      answered = true;
      error = r.error();
      return;
    }
    c->request(static_cast<xenbus::wire::MsgType>(type), payload, client::kNoTx,
               [&](client::Result<std::string> v) {
                 answered = true;
                 ok = v.has_value();
                 if (!ok) error = v.error();
                 c->close();
               });
  });
  io.run_for(kTimeout);
  if (!answered) throw ToolstackError(fmt::format("xenstore {}: no answer from {}", what, socket_));
  if (!ok) throw ToolstackError(fmt::format("xenstore {}: {}", what, err_name(error)));
}

std::string Xenstore::control(const std::vector<std::string>& args, const std::string& what) {
  auto r = client_->control(args);
  if (!r) throw ToolstackError(fmt::format("{}: {}", what, err_name(r.error())));
  return *r;
}

void Xenstore::introduce(DomId domid, std::uint64_t gfn, std::uint32_t port) {
  // xs_wire.h INTRODUCE: "<domid>\0<mfn>\0<event-channel port>\0", decimal as Xen's tools send it.
  std::string payload = fmt::format("{}", domid);
  payload.push_back('\0');
  payload += fmt::format("{}", gfn);
  payload.push_back('\0');
  payload += fmt::format("{}", port);
  payload.push_back('\0');
  raw_request(static_cast<std::uint32_t>(xenbus::wire::MsgType::introduce), payload,
              fmt::format("INTRODUCE dom{}", domid));
}

void Xenstore::release(DomId domid) {
  std::string payload = fmt::format("{}", domid);
  payload.push_back('\0');
  raw_request(static_cast<std::uint32_t>(xenbus::wire::MsgType::release), payload,
              fmt::format("RELEASE dom{}", domid));
}

}  // namespace xpv::toolstack
