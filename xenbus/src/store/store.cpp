// Connections, request dispatch, CONTROL, quotas.
#include <fmt/format.h>

#include <new>
#include <utility>

#include "store_impl.h"

namespace xpv::xenbus {

using wire::Error;
using wire::MsgType;

bool set_quota(Quotas& q, std::string_view key, std::uint64_t value) noexcept {
  if (value == 0 || value > 0xffffffffu) return false;
  auto v = static_cast<std::uint32_t>(value);
  if (key == "nodes") q.nodes = v;
  else if (key == "node-size") q.node_size = v;
  else if (key == "watches") q.watches = v;
  else if (key == "transactions") q.transactions = v;
  else if (key == "outstanding") q.outstanding = v;
  else if (key == "path-max") q.path_max = v;
  else if (key == "perms") q.perms = v;
  else if (key == "pending-events") q.pending_events = v;
  else if (key == "transaction-nodes") q.transaction_nodes = v;
  else return false;
  return true;
}

std::string format_quotas(const Quotas& q) {
  return fmt::format(
      "nodes {}\nnode-size {}\nwatches {}\ntransactions {}\noutstanding {}\npath-max {}\n"
      "perms {}\npending-events {}\ntransaction-nodes {}\n",
      q.nodes, q.node_size, q.watches, q.transactions, q.outstanding, q.path_max, q.perms,
      q.pending_events, q.transaction_nodes);
}

Store::Store(Quotas quotas, Hooks hooks) : quotas_(quotas), hooks_(std::move(hooks)) {
  // The tree Xen's xenstored starts with: "/", "/tool", "/tool/xenstored", owned by dom0, "n0".
  Node root;
  root.perms = {Perm{0, kPermNone}};
  root.children = {"tool"};
  put(nullptr, "/", root);
  Node tool;
  tool.perms = root.perms;
  tool.children = {"xenstored"};
  put(nullptr, "/tool", tool);
  Node xs;
  xs.perms = root.perms;
  put(nullptr, "/tool/xenstored", xs);
}

Store::~Store() = default;

ConnId Store::connect(DomId domid, Sink& sink) {
  auto c = std::make_unique<Conn>();
  c->domid = domid;
  c->privileged = domid == 0;
  c->sink = &sink;
  if (auto it = domains_.find(domid); it != domains_.end()) c->target = it->second.target;
  ConnId id = next_conn_++;
  conns_.emplace(id, std::move(c));
  return id;
}

void Store::disconnect(ConnId id) noexcept { conns_.erase(id); }

const Node* Store::find(std::string_view abs_path) const noexcept {
  auto it = nodes_.find(std::string(abs_path));
  return it == nodes_.end() ? nullptr : &it->second;
}

std::size_t Store::watch_count(ConnId id) const noexcept {
  auto it = conns_.find(id);
  return it == conns_.end() ? 0 : it->second->watches.size();
}

std::size_t Store::transaction_count(ConnId id) const noexcept {
  auto it = conns_.find(id);
  return it == conns_.end() ? 0 : it->second->txns.size();
}

std::uint32_t Store::owned_nodes(DomId domid) const noexcept {
  auto it = owned_.find(domid);
  return it == owned_.end() ? 0 : it->second;
}

Requester Store::requester(const Conn& c) const noexcept {
  return Requester{c.domid, c.privileged, c.target};
}

void Store::handle(ConnId id, const wire::Header& h, std::string_view payload) noexcept {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  Reply r = fail(Error::enomem);
  handling_ = true;
  try {
    r = dispatch(c, id, h, payload);
  } catch (const std::bad_alloc&) {
    r = fail(Error::enomem);
    outbox_.clear();
    // A change may have been made whose record was not: the journal cannot be trusted as it is.
    if (log_) log_->lost("out of memory while handling a request");
  }
  handling_ = false;
  if (std::exchange(deferred_, false)) {  // answered later through answer()
    log_commit();
    flush_events();
    return;
  }
  wire::Header out{h.type, h.req_id, h.tx_id, 0};
  std::string err;
  std::string_view body;
  if (r) {
    body = *r;
  } else {
    err = wire::error_name(r.error());
    err.push_back('\0');
    out.type = static_cast<std::uint32_t>(MsgType::error);
    body = err;
  }
  out.len = static_cast<std::uint32_t>(body.size());
  try {
    if (log_) c.sink->journal_reply(*log_, out, body);
  } catch (const std::bad_alloc&) {
    // The request's changes without its ring's record would be handled again after a crash (the
    // transport does not count the reply as journaled, so the request is not taken as handled).
    log_->lost("out of memory while journaling a reply");
  }
  log_commit();  // before the reply: nothing is acknowledged that the journal does not hold
  try {
    c.sink->deliver(out, body);
  } catch (const std::bad_alloc&) {
    // The sink could not queue it. A journaled reply is then in the journal but not in the
    // transport's queue, and the next one would be journaled at its place: written again from a
    // snapshot of what the transport really holds.
    if (log_) log_->lost("out of memory queueing a reply");
  }
  flush_events();
}

void Store::flush_events() noexcept {
  auto pending = std::move(outbox_);
  outbox_.clear();
  for (auto& [id, payload] : pending) {
    auto it = conns_.find(id);
    if (it == conns_.end() || !it->second->sink) continue;  // a restored one not yet attached
    wire::Header h{static_cast<std::uint32_t>(MsgType::watch_event), 0, 0,
                   static_cast<std::uint32_t>(payload.size())};
    try {
      it->second->sink->deliver(h, payload);
    } catch (const std::bad_alloc&) {
    }
  }
}

Store::Reply Store::dispatch(Conn& c, ConnId id, const wire::Header& h,
                             std::string_view payload) {
  auto args = wire::split_args(h.type, payload);
  if (!args) return fail(args.error());
  const wire::Args& a = *args;
  Txn* t = nullptr;
  if (h.tx_id != 0) {
    if (c.aborted_txns.count(h.tx_id)) {
      if (static_cast<MsgType>(h.type) == MsgType::transaction_end) c.aborted_txns.erase(h.tx_id);
      return fail(Error::eagain);
    }
    auto tt = c.txns.find(h.tx_id);
    if (tt == c.txns.end()) return fail(h.tx_id < c.recovered_below ? Error::eagain : Error::enoent);
    t = &tt->second;
    // A transaction keeps a copy of every node it accessed (Txn::seen): a domain's may access
    // `transaction-nodes` of them (Xen's quota; checked before each request, so one request may
    // go past it by the nodes it touches: a path's depth, or a subtree the domain may remove).
    if (!c.privileged && t->touched.size() >= quotas_.transaction_nodes &&
        static_cast<MsgType>(h.type) != MsgType::transaction_end) {
      return fail(Error::enospc);
    }
  }
  switch (static_cast<MsgType>(h.type)) {
    case MsgType::read: return op_read(t, c, a[0]);
    case MsgType::write: return op_write(t, c, a[0], a[1]);
    case MsgType::mkdir: return op_mkdir(t, c, a[0]);
    case MsgType::rm: return op_rm(t, c, a[0]);
    case MsgType::directory: return op_directory(t, c, a[0]);
    case MsgType::directory_part: return op_directory_part(t, c, a[0], a[1]);
    case MsgType::get_perms: return op_get_perms(t, c, a[0]);
    case MsgType::set_perms: return op_set_perms(t, c, a);
    case MsgType::watch: return op_watch(c, id, a[0], a[1]);
    case MsgType::unwatch: return op_unwatch(c, a[0], a[1]);
    case MsgType::transaction_start: return txn_start(c, t);
    case MsgType::transaction_end: return txn_end(c, h.tx_id, a[0]);
    case MsgType::introduce: return op_introduce(c, a);
    case MsgType::release: return op_release(c, a[0]);
    case MsgType::resume: return op_resume(c, a[0]);
    case MsgType::set_target: return op_set_target(c, a[0], a[1]);
    case MsgType::is_domain_introduced: return op_is_introduced(a[0]);
    case MsgType::get_domain_path: return op_get_domain_path(a[0]);
    case MsgType::reset_watches:
      if (log_ && !c.privileged) log_conn(c, {{"op", "reset_watches"}});
      c.watches.clear();
      c.txns.clear();
      c.aborted_txns.clear();
      return std::string("OK", 3);
    case MsgType::control: return do_control(c, id, h, a);
    default: return fail(Error::enosys);
  }
}

// CONTROL (xenstore-control): privileged only. Commands: print TEXT..., log-level LEVEL,
// quota, help, and live-update when the daemon offers it (Hooks::live_update). Anything else is
// EINVAL.
Store::Reply Store::do_control(Conn& c, ConnId id, const wire::Header& h, const wire::Args& a) {
  if (!c.privileged) return fail(Error::eacces);
  std::string_view cmd = a[0];
  std::string out;
  if (cmd == "live-update" && hooks_.live_update) {
    std::vector<std::string> args;
    for (std::size_t i = 1; i < a.size(); ++i) args.emplace_back(a[i]);
    auto r = hooks_.live_update(id, h, args);
    if (!r) {
      deferred_ = true;
      return std::string();
    }
    return std::move(*r);
  }
  if (cmd == "print") {
    std::string text;
    for (std::size_t i = 1; i < a.size(); ++i) text += (i > 1 ? " " : "") + std::string(a[i]);
    if (hooks_.print) hooks_.print(text);
    return std::string("OK", 3);
  }
  if (cmd == "log-level") {
    if (a.size() != 2 || !hooks_.set_log_level || !hooks_.set_log_level(a[1]))
      return fail(Error::einval);
    return std::string("OK", 3);
  }
  if (cmd == "quota" && a.size() == 1) {
    out = format_quotas(quotas_);
  } else if (cmd == "help" && a.size() == 1) {
    out = "print TEXT...\nlog-level trace|debug|info|warn|error|off\nquota\nhelp\n";
    if (hooks_.live_update) {
      out += "live-update -f BINARY | -c CMDLINE | -s [-t SECONDS] [-F] | -a\n";
    }
  } else {
    return fail(Error::einval);
  }
  out.push_back('\0');
  return out;
}

}  // namespace xpv::xenbus
