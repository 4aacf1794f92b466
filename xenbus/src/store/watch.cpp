// Watch registry and firing. A watch on W fires with the changed path P when P is W or lies below
// it; for a removed subtree, watches on exactly a removed descendant fire with that descendant's
// path (Xen's delete_node). A watcher only sees events on nodes it may read. Relative watches
// report paths relative to the watcher's home. @introduceDomain / @releaseDomain go to
// privileged watchers only.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "store_impl.h"
#include "xpv/xenbus/hex.h"

namespace xpv::xenbus {

using wire::Error;

Store::Reply Store::op_watch(Conn& c, ConnId id, std::string_view path, std::string_view token) {
  auto abs = canonicalize(c.domid, path, true, c.privileged ? 0 : quotas_.path_max);
  if (!abs) return fail(abs.error());
  for (const auto& w : c.watches)
    if (w.abs == *abs && w.token == token) return fail(Error::eexist);
  if (c.watches.size() >= quotas_.watches) return fail(Error::e2big);
  Watch w;
  w.abs = *abs;
  w.given = path;
  w.token = token;
  w.relative = path.front() != '/' && path.front() != '@';
  c.watches.push_back(w);
  if (log_ && !c.privileged) {
    log_conn(c, {{"op", "watch"}, {"abs", hex(w.abs)}, {"given", hex(w.given)}, {"token", hex(w.token)},
                 {"relative", w.relative}});
  }
  // Every watch fires once on registration, after the OK (the outbox is flushed after it).
  queue_event(id, c, w, w.abs);
  return std::string("OK", 3);
}

Store::Reply Store::op_unwatch(Conn& c, std::string_view path, std::string_view token) {
  auto abs = canonicalize(c.domid, path, true, c.privileged ? 0 : quotas_.path_max);
  if (!abs) return fail(abs.error());
  auto it = std::find_if(c.watches.begin(), c.watches.end(),
                         [&](const Watch& w) { return w.abs == *abs && w.token == token; });
  if (it == c.watches.end()) return fail(Error::enoent);
  if (log_ && !c.privileged) log_conn(c, {{"op", "unwatch"}, {"abs", hex(it->abs)}, {"token", hex(it->token)}});
  c.watches.erase(it);
  return std::string("OK", 3);
}

void Store::queue_event(ConnId id, const Conn& c, const Watch& w, std::string_view abs_path) {
  std::string payload;
  if (w.relative) {
    std::string home = domain_path(c.domid) + "/";
    payload = abs_path.starts_with(home) ? abs_path.substr(home.size()) : abs_path;
  } else {
    payload = abs_path;
  }
  // A message longer than the protocol allows is a protocol error to its reader (Linux's xenbus
  // and libxenstore drop the connection's sync): such an event is not sent, as in Xen's xenstored.
  // Only a watcher's own long token (or a path near the limit under its watch) makes one.
  if (payload.size() + 1 + w.token.size() + 1 > wire::kPayloadMax) return;
  payload.push_back('\0');
  payload += w.token;
  payload.push_back('\0');
  outbox_.emplace_back(id, std::move(payload));
}

void Store::fire(const PendingEvent& ev) {
  bool special = !ev.path.empty() && ev.path.front() == '@';
  for (auto& [id, c] : conns_) {
    if (special) {
      if (!c->privileged) continue;
    } else if (!(access_for(requester(*c), ev.perms) & kPermRead) &&
               !(ev.earlier_perms && (access_for(requester(*c), *ev.earlier_perms) & kPermRead))) {
      continue;
    }
    for (const auto& w : c->watches) {
      bool match = (ev.exact || special) ? w.abs == ev.path : is_same_or_below(ev.path, w.abs);
      if (match) queue_event(id, *c, w, ev.path);
    }
  }
}

}  // namespace xpv::xenbus
