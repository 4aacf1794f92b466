// Domain table: INTRODUCE, RELEASE, RESUME, SET_TARGET, IS_DOMAIN_INTRODUCED, GET_DOMAIN_PATH.
//
// INTRODUCE asks Hooks::attach to attach the domain's ring (the daemon connects to the domain's
// control socket, maps the page and binds the port); only if that succeeds is the domain
// recorded with its mfn and event-channel port and @introduceDomain fired. Dom0 is always
// introduced. RELEASE drops the domain's watches and transactions, keeps its nodes (as Xen does),
// and fires @releaseDomain.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "store_impl.h"

namespace xpv::xenbus {

using wire::Error;

namespace {
Expected<DomId, Error> parse_domid(std::string_view s) {
  auto v = parse_uint(s);
  if (!v || *v >= kDomIdFirstReserved) return fail(Error::einval);
  return static_cast<DomId>(*v);
}
}  // namespace

bool Store::is_introduced(DomId domid) const noexcept {
  if (domid == 0) return true;
  auto it = domains_.find(domid);
  return it != domains_.end() && it->second.introduced;
}

Expected<void, Error> Store::introduce(DomId domid, std::uint64_t mfn, std::uint32_t port) {
  if (domid == 0 || domid >= kDomIdFirstReserved) return fail(Error::einval);
  if (auto it = domains_.find(domid); it != domains_.end() && it->second.introduced) {
    // Re-introducing with the same page is accepted and records the port (Xen re-binds the
    // event channel; an attached ring keeps the binding it has); another page is a toolstack bug.
    if (it->second.mfn != mfn) return fail(Error::eexist);
    it->second.port = port;
    if (log_) log_record({{"op", "introduce"}, {"domid", domid}, {"mfn", mfn}, {"port", port}});
    if (!handling_) log_commit();
    return {};
  }
  // Attach first: a domain whose ring cannot be reached is not recorded at all.
  if (hooks_.attach) {
    if (auto r = hooks_.attach(domid, mfn, port); !r) return fail(r.error());
  }
  Domain& d = domains_[domid];
  d.introduced = true;
  d.mfn = mfn;
  d.port = port;
  if (log_) log_record({{"op", "introduce"}, {"domid", domid}, {"mfn", mfn}, {"port", port}});
  if (hooks_.introduced) hooks_.introduced(domid, mfn, port);
  fire(PendingEvent{"@introduceDomain", true, {}, std::nullopt});
  if (!handling_) {  // called directly by the daemon, not through a request
    log_commit();
    flush_events();
  }
  return {};
}

Expected<void, Error> Store::release(DomId domid) {
  if (domid == 0 || domid >= kDomIdFirstReserved) return fail(Error::einval);
  auto it = domains_.find(domid);
  if (it == domains_.end() || !it->second.introduced) return fail(Error::enoent);
  domains_.erase(it);
  if (log_) log_record({{"op", "release"}, {"domid", domid}});
  for (auto& [id, c] : conns_) {
    if (c->domid != domid) continue;
    c->watches.clear();
    c->txns.clear();
  }
  if (hooks_.released) hooks_.released(domid);
  fire(PendingEvent{"@releaseDomain", true, {}, std::nullopt});
  if (!handling_) {  // a domain that died: no request to answer first
    log_commit();
    flush_events();
  }
  return {};
}

Store::Reply Store::op_introduce(const Conn& c, const wire::Args& a) {
  if (!c.privileged) return fail(Error::eacces);
  auto domid = parse_domid(a[0]);
  auto mfn = parse_uint(a[1]);  // Xen's tools send decimal numbers
  auto port = parse_uint(a[2]);
  if (!domid || !mfn || !port) return fail(Error::einval);
  if (auto r = introduce(*domid, *mfn, *port); !r) return fail(r.error());
  return std::string("OK", 3);
}

Store::Reply Store::op_release(const Conn& c, std::string_view s) {
  if (!c.privileged) return fail(Error::eacces);
  auto domid = parse_domid(s);
  if (!domid) return fail(Error::einval);
  if (auto r = release(*domid); !r) return fail(r.error());
  return std::string("OK", 3);
}

Store::Reply Store::op_resume(const Conn& c, std::string_view s) {
  if (!c.privileged) return fail(Error::eacces);
  auto domid = parse_domid(s);
  if (!domid) return fail(Error::einval);
  if (*domid == 0 || !is_introduced(*domid)) return fail(Error::enoent);
  return std::string("OK", 3);
}

Store::Reply Store::op_set_target(const Conn& c, std::string_view s, std::string_view t) {
  if (!c.privileged) return fail(Error::eacces);
  auto domid = parse_domid(s);
  auto target = parse_domid(t);
  if (!domid || !target) return fail(Error::einval);
  if (*domid == 0 || !is_introduced(*domid) || !is_introduced(*target))
    return fail(Error::enoent);
  domains_[*domid].target = *target;
  if (log_) log_record({{"op", "set_target"}, {"domid", *domid}, {"target", *target}});
  for (auto& [id, cc] : conns_)
    if (cc->domid == *domid) cc->target = *target;
  return std::string("OK", 3);
}

Store::Reply Store::op_is_introduced(std::string_view s) {
  auto domid = parse_domid(s);
  if (!domid) return fail(Error::einval);
  return std::string(is_introduced(*domid) ? "T" : "F", 2);
}

Store::Reply Store::op_get_domain_path(std::string_view s) {
  auto domid = parse_domid(s);
  if (!domid) return fail(Error::einval);
  std::string out = domain_path(*domid);
  out.push_back('\0');
  return out;
}

}  // namespace xpv::xenbus
