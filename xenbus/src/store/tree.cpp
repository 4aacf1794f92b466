// Nodes, implicit parent creation, removal, permissions, and the transaction overlay.
// Calling context: the daemon's io_context thread, from Store::dispatch.
#include <algorithm>
#include <fmt/format.h>

#include "store_impl.h"

namespace xpv::xenbus {

using wire::Error;

namespace {
constexpr std::uint8_t kRW = kPermRead | kPermWrite;

bool owns(const Requester& who, const PermList& perms) {
  if (who.privileged) return true;
  return !perms.empty() &&
         (perms[0].id == who.domid || (who.target && perms[0].id == *who.target));
}
}  // namespace

const Node* Store::lookup(Txn* t, const std::string& p) {
  if (t) {
    if (auto it = t->overlay.find(p); it != t->overlay.end())
      return it->second ? &*it->second : nullptr;
    auto [s, first] = t->seen.try_emplace(p);
    if (first) {
      auto m = nodes_.find(p);
      if (m != nodes_.end()) s->second = m->second;
      t->touched.try_emplace(p, m == nodes_.end() ? std::nullopt
                                                  : std::optional<std::uint64_t>(m->second.gen));
    }
    return s->second ? &*s->second : nullptr;
  }
  auto m = nodes_.find(p);
  return m == nodes_.end() ? nullptr : &m->second;
}

std::int64_t Store::owned(Txn* t, DomId d) const noexcept {
  std::int64_t n = 0;
  if (auto it = owned_.find(d); it != owned_.end()) n = it->second;
  if (t)
    if (auto it = t->owned_delta.find(d); it != t->owned_delta.end()) n += it->second;
  return n;
}

void Store::put(Txn* t, const std::string& p, Node n) {
  const Node* old = lookup(t, p);
  std::optional<DomId> old_owner;
  if (old && !old->perms.empty()) old_owner = old->perms[0].id;
  DomId new_owner = n.perms.empty() ? 0 : n.perms[0].id;
  if (t) {
    if (old_owner) t->owned_delta[*old_owner] -= 1;
    t->owned_delta[new_owner] += 1;
    t->overlay[p] = std::move(n);
    return;
  }
  if (old_owner) owned_[*old_owner] -= 1;
  owned_[new_owner] += 1;
  n.gen = ++gen_;
  if (log_) log_put(p, old, n);
  nodes_[p] = std::move(n);
}

void Store::erase(Txn* t, const std::string& p) {
  const Node* old = lookup(t, p);
  if (!old) return;
  DomId owner = old->perms.empty() ? 0 : old->perms[0].id;
  if (t) {
    t->owned_delta[owner] -= 1;
    t->overlay[p] = std::nullopt;
    return;
  }
  owned_[owner] -= 1;
  if (log_) log_erase(p);
  nodes_.erase(p);
}

Error Store::missing_error(Txn* t, const Requester& who, const std::string& p) {
  // Xen answers EACCES rather than ENOENT when the caller may not read the nearest existing
  // ancestor, so a domain cannot probe for nodes it cannot see.
  std::string cur = p;
  while (cur != "/") {
    cur = std::string(parent_path(cur));
    if (const Node* n = lookup(t, cur))
      return (access_for(who, n->perms) & kPermRead) ? Error::enoent : Error::eacces;
  }
  return Error::enoent;
}

Expected<std::string, Error> Store::resolve(const Conn& c, std::string_view path) const noexcept {
  return canonicalize(c.domid, path, false, c.privileged ? 0 : quotas_.path_max);
}

void Store::note_event(Txn* t, std::string path, bool exact, PermList perms) {
  PendingEvent ev{std::move(path), exact, std::move(perms), std::nullopt};
  if (!t) {
    fire(ev);
    return;
  }
  // One event per node at the commit, as Xen's xenstored fires them: a transaction that writes
  // one node again and again grows nothing, and its events are bounded by the nodes it touched
  // (the transaction-nodes quota). Merged, the event reaches every watcher either would have
  // (a node's own change reaches the watchers above it too, a removed descendant's only those
  // on it), and a watcher that could read the node by its first or its last permissions.
  auto [it, fresh] = t->event_index.try_emplace(ev.path, t->events.size());
  if (fresh) {
    t->events.push_back(std::move(ev));
    return;
  }
  PendingEvent& merged = t->events[it->second];
  merged.exact = merged.exact && ev.exact;
  if (!merged.earlier_perms && merged.perms != ev.perms) merged.earlier_perms = std::move(merged.perms);
  merged.perms = std::move(ev.perms);
}

Store::Reply Store::op_read(Txn* t, const Conn& c, std::string_view path) {
  auto p = resolve(c, path);
  if (!p) return fail(p.error());
  const Node* n = lookup(t, *p);
  if (!n) return fail(missing_error(t, requester(c), *p));
  if (!(access_for(requester(c), n->perms) & kPermRead)) return fail(Error::eacces);
  return n->value;
}

Expected<void, Error> Store::create(Txn* t, const Conn& c, const std::string& p,
                                    std::string_view value) {
  Requester who = requester(c);
  // Walk up to the nearest existing ancestor; it must be writable.
  std::vector<std::string> missing{p};
  std::string cur = p;
  const Node* anc = nullptr;
  while (true) {
    cur = std::string(parent_path(cur));
    anc = lookup(t, cur);
    if (anc) break;
    missing.push_back(cur);
  }
  if (!(access_for(who, anc->perms) & kPermWrite)) return fail(Error::eacces);
  if (!c.privileged && owned(t, c.domid) + static_cast<std::int64_t>(missing.size()) >
                           static_cast<std::int64_t>(quotas_.nodes))
    return fail(Error::enospc);
  PermList inherited = anc->perms;
  // Unprivileged domains own what they create (Xen); dom0 keeps the parent's owner.
  if (!c.privileged) inherited[0].id = c.domid;
  // Create top-down: link each new node into its parent's child list.
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    std::string parent(parent_path(*it));
    Node pn = *lookup(t, parent);
    pn.children.emplace_back(base_name(*it));
    put(t, parent, std::move(pn));
    Node n;
    n.perms = inherited;
    if (*it == p) n.value = value;
    put(t, *it, std::move(n));
  }
  return {};
}

Store::Reply Store::op_write(Txn* t, const Conn& c, std::string_view path,
                             std::string_view value) {
  auto p = resolve(c, path);
  if (!p) return fail(p.error());
  if (!c.privileged && value.size() > quotas_.node_size) return fail(Error::enospc);
  Requester who = requester(c);
  if (const Node* n = lookup(t, *p)) {
    if (!(access_for(who, n->perms) & kPermWrite)) return fail(Error::eacces);
    Node copy = *n;
    copy.value = value;
    PermList perms = copy.perms;
    put(t, *p, std::move(copy));
    note_event(t, *p, false, std::move(perms));
  } else {
    if (auto r = create(t, c, *p, value); !r) return fail(r.error());
    note_event(t, *p, false, lookup(t, *p)->perms);
  }
  return std::string("OK", 3);
}

Store::Reply Store::op_mkdir(Txn* t, const Conn& c, std::string_view path) {
  auto p = resolve(c, path);
  if (!p) return fail(p.error());
  if (const Node* n = lookup(t, *p)) {
    if (!(access_for(requester(c), n->perms) & kPermWrite)) return fail(Error::eacces);
    return std::string("OK", 3);
  }
  if (auto r = create(t, c, *p, {}); !r) return fail(r.error());
  note_event(t, *p, false, lookup(t, *p)->perms);
  return std::string("OK", 3);
}

Store::Reply Store::op_rm(Txn* t, const Conn& c, std::string_view path) {
  auto p = resolve(c, path);
  if (!p) return fail(p.error());
  Requester who = requester(c);
  const Node* n = lookup(t, *p);
  if (!n) {
    // Removing what is not there is fine if the parent exists (Xen).
    Error e = missing_error(t, who, *p);
    if (e == Error::enoent && *p != "/" && lookup(t, std::string(parent_path(*p))))
      return std::string("OK", 3);
    return fail(e);
  }
  if (!(access_for(who, n->perms) & kPermWrite)) return fail(Error::eacces);
  if (*p == "/") return fail(Error::einval);
  // Collect the subtree depth-first; remember each node's perms for the watchers' read check.
  std::vector<std::pair<std::string, PermList>> doomed;
  std::vector<std::string> stack{*p};
  while (!stack.empty()) {
    std::string cur = std::move(stack.back());
    stack.pop_back();
    const Node* cn = lookup(t, cur);
    if (!cn) continue;
    for (const auto& ch : cn->children) stack.push_back(child_path(cur, ch));
    doomed.emplace_back(cur, cn->perms);
  }
  std::string parent(parent_path(*p));
  // In a transaction the parent can be missing from its view while the node is not: the node was
  // first seen in it, then removed with its parent outside it, and the parent is looked at only
  // now (a guest can arrange this). The node recorded its generation when first seen, so the
  // commit answers EAGAIN; until then there is no parent to update.
  if (const Node* pp = lookup(t, parent)) {
    Node pn = *pp;
    std::string_view name = base_name(*p);
    pn.children.erase(std::remove(pn.children.begin(), pn.children.end(), name), pn.children.end());
    put(t, parent, std::move(pn));
  }
  for (const auto& [dp, perms] : doomed) erase(t, dp);
  for (auto& [dp, perms] : doomed) note_event(t, dp, dp != *p, std::move(perms));
  return std::string("OK", 3);
}

Store::Reply Store::op_directory(Txn* t, const Conn& c, std::string_view path) {
  auto p = resolve(c, path);
  if (!p) return fail(p.error());
  const Node* n = lookup(t, *p);
  if (!n) return fail(missing_error(t, requester(c), *p));
  if (!(access_for(requester(c), n->perms) & kPermRead)) return fail(Error::eacces);
  std::string out;
  for (const auto& ch : n->children) {
    out.append(ch);
    out.push_back('\0');
  }
  if (out.size() > wire::kPayloadMax) return fail(Error::e2big);
  return out;
}

Store::Reply Store::op_directory_part(Txn* t, const Conn& c, std::string_view path,
                                      std::string_view off_s) {
  auto p = resolve(c, path);
  if (!p) return fail(p.error());
  auto off = parse_uint(off_s);
  if (!off) return fail(Error::einval);
  const Node* n = lookup(t, *p);
  if (!n) return fail(missing_error(t, requester(c), *p));
  if (!(access_for(requester(c), n->perms) & kPermRead)) return fail(Error::eacces);
  // Reply: "<generation>\0" then whole child names from byte offset `off` of the NUL-separated
  // child list, as many as fit; an extra "\0" (an empty name) marks the end of the list.
  std::string list;
  for (const auto& ch : n->children) {
    list.append(ch);
    list.push_back('\0');
  }
  std::string out = fmt::format("{}", n->gen);
  out.push_back('\0');
  if (*off >= list.size()) {
    out.push_back('\0');
    return out;
  }
  std::size_t len = 0;
  while (*off + len < list.size()) {
    std::size_t i = list.find('\0', *off + len) - (*off + len) + 1;
    if (out.size() + len + i >= wire::kPayloadMax) break;
    len += i;
  }
  out.append(list, *off, len);
  if (*off + len == list.size()) out.push_back('\0');
  return out;
}

Store::Reply Store::op_get_perms(Txn* t, const Conn& c, std::string_view path) {
  auto p = resolve(c, path);
  if (!p) return fail(p.error());
  const Node* n = lookup(t, *p);
  if (!n) return fail(missing_error(t, requester(c), *p));
  if (!(access_for(requester(c), n->perms) & kPermRead)) return fail(Error::eacces);
  std::string out;
  for (const auto& pm : n->perms) {
    out += format_perm(pm);
    out.push_back('\0');
  }
  return out;
}

Store::Reply Store::op_set_perms(Txn* t, const Conn& c, const wire::Args& a) {
  auto p = resolve(c, a[0]);
  if (!p) return fail(p.error());
  PermList perms;
  for (std::size_t i = 1; i < a.size(); ++i) {
    auto pm = parse_perm(a[i]);
    if (!pm) return fail(pm.error());
    perms.push_back(*pm);
  }
  if (!c.privileged && perms.size() > quotas_.perms) return fail(Error::enospc);
  Requester who = requester(c);
  const Node* n = lookup(t, *p);
  if (!n) return fail(missing_error(t, who, *p));
  if (!(access_for(who, n->perms) & kPermWrite) || !owns(who, n->perms))
    return fail(Error::eacces);
  // Unprivileged domains may not give a node away (Xen).
  if (!c.privileged && perms[0].id != n->perms[0].id) return fail(Error::eperm);
  Node copy = *n;
  copy.perms = perms;
  put(t, *p, std::move(copy));
  note_event(t, *p, false, std::move(perms));
  return std::string("OK", 3);
}

Store::Reply Store::txn_start(Conn& c, Txn* t) {
  if (t) return fail(Error::ebusy);
  if (c.txns.size() >= quotas_.transactions) return fail(Error::enospc);
  std::uint32_t id = c.next_tx;
  while (id == 0 || c.txns.count(id)) ++id;
  c.next_tx = id + 1;
  c.txns.emplace(id, Txn{});
  // A domain's ids stay unique across a crash restart (recover(): older ids answer EAGAIN).
  if (log_ && !c.privileged) log_conn(c, {{"op", "next_tx"}, {"next", c.next_tx}});
  std::string out = fmt::format("{}", id);
  out.push_back('\0');
  return out;
}

Store::Reply Store::txn_end(Conn& c, std::uint32_t tx_id, std::string_view arg) {
  auto it = c.txns.find(tx_id);
  if (it == c.txns.end()) return fail(Error::enoent);
  if (arg != "T" && arg != "F") return fail(Error::einval);
  Txn t = std::move(it->second);
  c.txns.erase(it);
  if (arg == "F") return std::string("OK", 3);
  for (const auto& [p, g] : t.touched) {
    auto m = nodes_.find(p);
    std::optional<std::uint64_t> now;
    if (m != nodes_.end()) now = m->second.gen;
    if (now != g) return fail(Error::eagain);
  }
  // Nodes-per-domain quota is checked when a node is created inside the transaction against
  // the count at that time; a commit does not re-check (documented limitation).
  for (auto& [p, n] : t.overlay) {
    if (n)
      put(nullptr, p, std::move(*n));
    else
      erase(nullptr, p);
  }
  for (const auto& ev : t.events) fire(ev);
  return std::string("OK", 3);
}

}  // namespace xpv::xenbus
