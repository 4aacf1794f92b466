// The Store's side of crash restart (store.h: ChangeLog, recover): the records it makes of each
// change, and their replay. Byte strings are hex-encoded, as in save() (persist.cpp).
//
//   {"op":"put","path":P,"value":V,"perms":[..],"gen":G, and the children as one of
//        "children":[..] (a new node, or a list changed otherwise), "add":C (C appended),
//        "remove":C (C taken out), or nothing (unchanged)}
//   {"op":"erase","path":P}
//   {"op":"introduce","domid":D,"mfn":M,"port":N}   {"op":"release","domid":D}
//   {"op":"set_target","domid":D,"target":T}
//   a domain's connection ("domid":D): {"op":"watch","abs","given","token","relative"},
//        {"op":"unwatch","abs","token"}, {"op":"reset_watches"}, {"op":"next_tx","next":N}
//   {"op":"ring",...}: a domain ring's own record (daemon/ring_connection.h); not the Store's
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "store_impl.h"
#include "xpv/xenbus/hex.h"

namespace xpv::xenbus {

using json = nlohmann::json;

namespace {

std::string unhex_field(const json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_string()) throw std::runtime_error(fmt::format("'{}' is missing or not a string", key));
  return unhex(j.at(key).get_ref<const std::string&>());
}

template <class T>
T number_field(const json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_number_integer() ||
      (!j.at(key).is_number_unsigned() && j.at(key).get<std::int64_t>() < 0)) {
    throw std::runtime_error(fmt::format("'{}' is missing or not an unsigned number", key));
  }
  const auto v = j.at(key).get<std::uint64_t>();
  if (v > std::numeric_limits<T>::max()) throw std::runtime_error(fmt::format("'{}' is out of range", key));
  return static_cast<T>(v);
}

}  // namespace

void Store::log_put(const std::string& p, const Node* old, const Node& n) {
  // The one record of the write path, so formatted directly: every string in it is hex digits or
  // a permission ("n0", "r5": a letter and digits), none needs escaping.
  fmt::memory_buffer b;
  auto out = std::back_inserter(b);
  fmt::format_to(out, R"({{"op":"put","path":"{}","value":"{}","perms":[)", hex(p), hex(n.value));
  for (std::size_t i = 0; i < n.perms.size(); ++i) fmt::format_to(out, R"({}"{}")", i ? "," : "", format_perm(n.perms[i]));
  fmt::format_to(out, R"(],"gen":{})", n.gen);
  auto list = [&] {
    fmt::format_to(out, R"(,"children":[)");
    for (std::size_t i = 0; i < n.children.size(); ++i) fmt::format_to(out, R"({}"{}")", i ? "," : "", hex(n.children[i]));
    fmt::format_to(out, "]");
  };
  // The one child added at the end, or the one taken out, when that is all that changed.
  auto removed_one = [&](const std::vector<std::string>& was) -> const std::string* {
    if (n.children.size() + 1 != was.size()) return nullptr;
    auto [now_it, was_it] = std::mismatch(n.children.begin(), n.children.end(), was.begin());
    return std::equal(now_it, n.children.end(), was_it + 1) ? &*was_it : nullptr;
  };
  if (!old) {
    list();  // a new node
  } else if (const auto& was = old->children; n.children == was) {
    // unchanged
  } else if (n.children.size() == was.size() + 1 && std::equal(was.begin(), was.end(), n.children.begin())) {
    fmt::format_to(out, R"(,"add":"{}")", hex(n.children.back()));
  } else if (const std::string* gone = removed_one(was)) {
    fmt::format_to(out, R"(,"remove":"{}")", hex(*gone));
  } else {
    list();
  }
  b.push_back('}');
  log_->record(std::string_view(b.data(), b.size()));
}

void Store::log_erase(const std::string& p) { log_->record(fmt::format(R"({{"op":"erase","path":"{}"}})", hex(p))); }

void Store::log_record(const json& change) { log_->record(change.dump()); }

void Store::log_conn(const Conn& c, json change) {
  change["domid"] = c.domid;
  log_record(change);
}

void Store::log_commit() noexcept {
  if (log_) log_->commit();
}

Store::Conn& Store::conn_of(DomId domid) {
  for (auto& [id, c] : conns_)
    if (c->domid == domid && !c->privileged) return *c;
  auto c = std::make_unique<Conn>();
  c->domid = domid;
  c->privileged = false;
  if (auto it = domains_.find(domid); it != domains_.end()) c->target = it->second.target;
  Conn& ref = *c;
  conns_.emplace(next_conn_++, std::move(c));
  return ref;
}

void Store::replay(const json& r) {
  if (!r.is_object() || !r.contains("op") || !r.at("op").is_string()) throw std::runtime_error("not a change record");
  const std::string& op = r.at("op").get_ref<const std::string&>();
  if (op == "put") {
    const std::string p = unhex_field(r, "path");
    Node n;
    n.value = unhex_field(r, "value");
    if (!r.contains("perms") || !r.at("perms").is_array() || r.at("perms").empty()) {
      throw std::runtime_error("'perms' is not a non-empty list");
    }
    for (const auto& e : r.at("perms")) {
      if (!e.is_string()) throw std::runtime_error("a permission is not a string");
      auto pm = parse_perm(e.get_ref<const std::string&>());
      if (!pm) throw std::runtime_error(fmt::format("bad permission '{}'", e.get<std::string>()));
      n.perms.push_back(*pm);
    }
    n.gen = number_field<std::uint64_t>(r, "gen");
    auto old = nodes_.find(p);
    if (r.contains("children")) {
      if (!r.at("children").is_array()) throw std::runtime_error("'children' is not a list");
      for (const auto& ch : r.at("children")) {
        if (!ch.is_string()) throw std::runtime_error("a child name is not a string");
        n.children.push_back(unhex(ch.get<std::string>()));
      }
    } else if (old == nodes_.end()) {
      throw std::runtime_error(fmt::format("node {} changed before it was created", p));
    } else {
      n.children = old->second.children;
      if (r.contains("add")) n.children.push_back(unhex_field(r, "add"));
      if (r.contains("remove")) {
        const std::string gone = unhex_field(r, "remove");
        auto it = std::find(n.children.begin(), n.children.end(), gone);
        if (it == n.children.end()) throw std::runtime_error(fmt::format("node {} has no child {} to remove", p, gone));
        n.children.erase(it);
      }
    }
    if (old != nodes_.end()) owned_[old->second.perms[0].id] -= 1;
    owned_[n.perms[0].id] += 1;
    gen_ = std::max(gen_, n.gen);
    nodes_[p] = std::move(n);
  } else if (op == "erase") {
    const std::string p = unhex_field(r, "path");
    auto it = nodes_.find(p);
    if (it == nodes_.end()) throw std::runtime_error(fmt::format("no node {} to remove", p));
    owned_[it->second.perms[0].id] -= 1;
    nodes_.erase(it);
  } else if (op == "introduce") {
    Domain& d = domains_[number_field<DomId>(r, "domid")];
    d.introduced = true;
    d.mfn = number_field<std::uint64_t>(r, "mfn");
    d.port = number_field<std::uint32_t>(r, "port");
  } else if (op == "release") {
    const auto domid = number_field<DomId>(r, "domid");
    domains_.erase(domid);
    for (auto it = conns_.begin(); it != conns_.end();) {
      it = (it->second->domid == domid && !it->second->privileged) ? conns_.erase(it) : std::next(it);
    }
  } else if (op == "set_target") {
    const auto domid = number_field<DomId>(r, "domid");
    const auto target = number_field<DomId>(r, "target");
    domains_[domid].target = target;
    for (auto& [id, c] : conns_)
      if (c->domid == domid) c->target = target;
  } else if (op == "watch") {
    Conn& c = conn_of(number_field<DomId>(r, "domid"));
    if (!r.contains("relative") || !r.at("relative").is_boolean()) throw std::runtime_error("'relative' is not a boolean");
    c.watches.push_back(Watch{unhex_field(r, "abs"), unhex_field(r, "given"), unhex_field(r, "token"),
                              r.at("relative").get<bool>()});
  } else if (op == "unwatch") {
    Conn& c = conn_of(number_field<DomId>(r, "domid"));
    const std::string abs = unhex_field(r, "abs"), token = unhex_field(r, "token");
    auto it = std::find_if(c.watches.begin(), c.watches.end(), [&](const Watch& w) { return w.abs == abs && w.token == token; });
    if (it == c.watches.end()) throw std::runtime_error("no such watch to remove");
    c.watches.erase(it);
  } else if (op == "reset_watches") {
    conn_of(number_field<DomId>(r, "domid")).watches.clear();
  } else if (op == "next_tx") {
    conn_of(number_field<DomId>(r, "domid")).next_tx = number_field<std::uint32_t>(r, "next");
  } else if (op == "ring") {
    // A domain ring's own record (daemon/ring_connection.h): the daemon folds those.
  } else {
    throw std::runtime_error(fmt::format("unknown change '{}'", op));
  }
}

std::vector<Store::RecoveredDomain> Store::recover(const json& snapshot, const std::vector<json>& changes) {
  restore(snapshot);
  // The snapshot's socket clients are gone with the process that served them.
  for (auto it = conns_.begin(); it != conns_.end();) it = it->second->privileged ? conns_.erase(it) : std::next(it);
  for (std::size_t i = 0; i < changes.size(); ++i) {
    try {
      replay(changes[i]);
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("change {} of the journal: {}", i + 1, e.what()));
    }
  }
  if (!nodes_.count("/")) throw std::runtime_error("the journal removes the root node");
  std::vector<RecoveredDomain> out;
  for (auto it = conns_.begin(); it != conns_.end();) {
    // A connection whose domain is no longer introduced has no ring to serve it.
    if (!is_introduced(it->second->domid)) {
      it = conns_.erase(it);
      continue;
    }
    ++it;
  }
  for (const auto& [domid, d] : domains_) {
    if (!d.introduced) continue;
    Conn& c = conn_of(domid);
    c.txns.clear();
    c.aborted_txns.clear();
    c.recovered_below = c.next_tx;
    ConnId id = 0;
    for (const auto& [cid, cp] : conns_)
      if (cp.get() == &c) id = cid;
    out.push_back({domid, d.mfn, d.port, id});
  }
  return out;
}

void Store::refire_watches(ConnId id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  for (const auto& w : it->second->watches) queue_event(id, *it->second, w, w.abs);
  if (!handling_) flush_events();
}

}  // namespace xpv::xenbus
