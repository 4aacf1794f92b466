// Store::save / Store::restore — the state a live update hands to the next binary (store.h).
// Byte strings (paths, values, tokens, child names) are hex-encoded: xenstore allows any byte in
// a value and a token, and JSON text must be UTF-8.
#include <fmt/format.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "store_impl.h"
#include "xpv/xenbus/hex.h"

namespace xpv::xenbus {

using json = nlohmann::json;

namespace {

constexpr int kStateVersion = 1;

std::string unhex(const json& j, const char* what) {
  if (!j.is_string()) throw std::runtime_error(fmt::format("{}: not a string", what));
  try {
    return xenbus::unhex(j.get_ref<const std::string&>());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("{}: {}", what, e.what()));
  }
}

template <class T>
T number(const json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_number_integer() ||
      (!j.at(key).is_number_unsigned() && j.at(key).get<std::int64_t>() < 0)) {
    throw std::runtime_error(fmt::format("'{}' is missing or not an unsigned number", key));
  }
  auto v = j.at(key).get<std::uint64_t>();
  if (v > std::numeric_limits<T>::max()) throw std::runtime_error(fmt::format("'{}' is out of range", key));
  return static_cast<T>(v);
}

json perms_json(const PermList& perms) {
  json a = json::array();
  for (const Perm& p : perms) a.push_back(format_perm(p));
  return a;
}

PermList perms_from(const json& a) {
  if (!a.is_array() || a.empty()) throw std::runtime_error("a node's perms are not a non-empty list");
  PermList out;
  for (const auto& e : a) {
    if (!e.is_string()) throw std::runtime_error("a permission is not a string");
    auto p = parse_perm(e.get_ref<const std::string&>());
    if (!p) throw std::runtime_error(fmt::format("bad permission '{}'", e.get<std::string>()));
    out.push_back(*p);
  }
  return out;
}

}  // namespace

json Store::save() const {
  if (handling_) throw std::logic_error("Store::save inside a request");
  json nodes = json::array();
  for (const auto& [path, n] : nodes_) {
    json children = json::array();
    for (const auto& ch : n.children) children.push_back(hex(ch));
    nodes.push_back({{"path", hex(path)}, {"value", hex(n.value)}, {"perms", perms_json(n.perms)},
                     {"children", std::move(children)}, {"gen", n.gen}});
  }
  json domains = json::array();
  for (const auto& [id, d] : domains_) {
    json e = {{"domid", id}, {"introduced", d.introduced}, {"mfn", d.mfn}, {"port", d.port}};
    if (d.target) e["target"] = *d.target;
    domains.push_back(std::move(e));
  }
  json conns = json::array();
  for (const auto& [id, c] : conns_) {
    json watches = json::array();
    for (const auto& w : c->watches) {
      watches.push_back({{"abs", hex(w.abs)}, {"given", hex(w.given)}, {"token", hex(w.token)},
                         {"relative", w.relative}});
    }
    json aborted = json::array();
    for (auto t : c->aborted_txns) aborted.push_back(t);
    for (const auto& [t, txn] : c->txns) aborted.push_back(t);  // not carried over: ended
    json e = {{"id", id},           {"domid", c->domid},         {"privileged", c->privileged},
              {"next_tx", c->next_tx}, {"aborted_txns", aborted}, {"watches", std::move(watches)}};
    if (c->target) e["target"] = *c->target;
    conns.push_back(std::move(e));
  }
  return {{"version", kStateVersion}, {"gen", gen_},          {"next_conn", next_conn_},
          {"nodes", std::move(nodes)}, {"domains", std::move(domains)}, {"conns", std::move(conns)}};
}

void Store::restore(const json& state) {
  if (!conns_.empty() || next_conn_ != 1) throw std::logic_error("Store::restore on a Store in use");
  if (!state.is_object() || number<int>(state, "version") != kStateVersion) {
    throw std::runtime_error(fmt::format("not a version {} xenstore state", kStateVersion));
  }
  std::unordered_map<std::string, Node> nodes;
  std::unordered_map<DomId, std::uint32_t> owned;
  for (const auto& e : state.at("nodes")) {
    Node n;
    std::string path = unhex(e.at("path"), "node path");
    n.value = unhex(e.at("value"), "node value");
    n.perms = perms_from(e.at("perms"));
    for (const auto& ch : e.at("children")) n.children.push_back(unhex(ch, "child name"));
    n.gen = number<std::uint64_t>(e, "gen");
    owned[n.perms[0].id] += 1;
    if (!nodes.emplace(std::move(path), std::move(n)).second) throw std::runtime_error("a node is listed twice");
  }
  if (!nodes.count("/")) throw std::runtime_error("the state has no root node");
  for (const auto& [path, n] : nodes) {
    for (const auto& ch : n.children) {
      if (!nodes.count(path == "/" ? "/" + ch : path + "/" + ch)) {
        throw std::runtime_error(fmt::format("node {} lists a child {} it does not have", path, ch));
      }
    }
  }
  std::map<DomId, Domain> domains;
  for (const auto& e : state.at("domains")) {
    Domain d;
    d.introduced = e.at("introduced").get<bool>();
    d.mfn = number<std::uint64_t>(e, "mfn");
    d.port = number<std::uint32_t>(e, "port");
    if (e.contains("target")) d.target = number<DomId>(e, "target");
    domains[number<DomId>(e, "domid")] = d;
  }
  std::map<ConnId, std::unique_ptr<Conn>> conns;
  const auto next_conn = number<ConnId>(state, "next_conn");
  for (const auto& e : state.at("conns")) {
    auto c = std::make_unique<Conn>();
    const auto id = number<ConnId>(e, "id");
    if (id == 0 || id >= next_conn) throw std::runtime_error(fmt::format("connection id {} out of range", id));
    c->domid = number<DomId>(e, "domid");
    c->privileged = e.at("privileged").get<bool>();
    if (e.contains("target")) c->target = number<DomId>(e, "target");
    c->next_tx = number<std::uint32_t>(e, "next_tx");
    for (const auto& t : e.at("aborted_txns")) c->aborted_txns.insert(t.get<std::uint32_t>());
    for (const auto& w : e.at("watches")) {
      c->watches.push_back(Watch{unhex(w.at("abs"), "watch path"), unhex(w.at("given"), "watch path"),
                                 unhex(w.at("token"), "watch token"), w.at("relative").get<bool>()});
    }
    if (!conns.emplace(id, std::move(c)).second) throw std::runtime_error("a connection is listed twice");
  }
  nodes_ = std::move(nodes);
  owned_ = std::move(owned);
  domains_ = std::move(domains);
  conns_ = std::move(conns);
  gen_ = number<std::uint64_t>(state, "gen");
  next_conn_ = next_conn;
}

void Store::attach_sink(ConnId id, Sink& sink) {
  auto it = conns_.find(id);
  if (it == conns_.end()) throw std::runtime_error(fmt::format("no connection {} in the restored state", id));
  it->second->sink = &sink;
}

std::vector<ConnId> Store::connection_ids() const {
  std::vector<ConnId> out;
  for (const auto& [id, c] : conns_) out.push_back(id);
  return out;
}

std::size_t Store::open_transactions() const noexcept {
  std::size_t n = 0;
  for (const auto& [id, c] : conns_) n += c->txns.size();
  return n;
}

void Store::abort_transactions() noexcept {
  for (auto& [id, c] : conns_) {
    for (const auto& [t, txn] : c->txns) c->aborted_txns.insert(t);
    c->txns.clear();
  }
}

void Store::answer(ConnId id, const wire::Header& request, std::string_view payload) {
  auto it = conns_.find(id);
  if (it == conns_.end() || !it->second->sink) return;
  wire::Header out{request.type, request.req_id, request.tx_id, static_cast<std::uint32_t>(payload.size())};
  it->second->sink->deliver(out, payload);
}

}  // namespace xpv::xenbus
