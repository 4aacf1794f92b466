// Domain-ring transport (see ring_connection.h). Calling context: the daemon's io_context
// thread; the domain runs concurrently on the other side of the page, so every index it owns is
// read with an acquire atomic_ref and every byte is copied out before it is looked at.
#include "xpv/xenbus/daemon/ring_connection.h"
#include "xpv/xenbus/hex.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace xpv::xenbus::daemon {

namespace asio = boost::asio;
using ring::kXenstoreRingSize;
using ring::xenstore_mask;

namespace {
std::uint32_t load_acquire(std::uint32_t& v) {
  return std::atomic_ref<std::uint32_t>(v).load(std::memory_order_acquire);
}
void store_release(std::uint32_t& v, std::uint32_t x) {
  std::atomic_ref<std::uint32_t>(v).store(x, std::memory_order_release);
}
}  // namespace

RingConnection::RingConnection(asio::io_context& io, Store& store, std::span<std::uint8_t> page,
                               int kick_in_fd, int kick_out_fd, DomId domid)
    : store_(store), intf_(nullptr), kick_in_(io), kick_out_fd_(kick_out_fd), domid_(domid) {
  if (kick_in_fd < 0 || kick_out_fd < 0) {
    if (kick_in_fd >= 0) ::close(kick_in_fd);
    if (kick_out_fd >= 0) ::close(kick_out_fd);
    throw std::invalid_argument("xenstore ring: invalid event channel fd");
  }
  kick_in_.assign(kick_in_fd);
  if (page.size() < sizeof(ring::XenstoreDomainInterface) ||
      reinterpret_cast<std::uintptr_t>(page.data()) % alignof(ring::XenstoreDomainInterface)) {
    ::close(kick_out_fd_);
    throw std::invalid_argument("xenstore ring: page too small or misaligned");
  }
  intf_ = reinterpret_cast<ring::XenstoreDomainInterface*>(page.data());
  kick_out_ = [this] {
    std::uint64_t one = 1;
    return ::write(kick_out_fd_, &one, sizeof one) == sizeof one;
  };
}

RingConnection::RingConnection(asio::io_context& io, Store& store, std::span<std::uint8_t> page,
                               int kick_in_fd, std::function<bool()> kick_out, DomId domid)
    : store_(store), intf_(nullptr), kick_in_(io), kick_out_fd_(-1), kick_out_(std::move(kick_out)),
      domid_(domid) {
  if (kick_in_fd < 0 || !kick_out_) {
    if (kick_in_fd >= 0) ::close(kick_in_fd);
    throw std::invalid_argument("xenstore ring: invalid event channel");
  }
  kick_in_.assign(kick_in_fd);
  if (page.size() < sizeof(ring::XenstoreDomainInterface) ||
      reinterpret_cast<std::uintptr_t>(page.data()) % alignof(ring::XenstoreDomainInterface)) {
    throw std::invalid_argument("xenstore ring: page too small or misaligned");
  }
  intf_ = reinterpret_cast<ring::XenstoreDomainInterface*>(page.data());
}

RingConnection::~RingConnection() {
  if (!closed_ && started_) store_.disconnect(id_);
  if (kick_out_fd_ >= 0) ::close(kick_out_fd_);
}

void RingConnection::start() {
  id_ = store_.connect(domid_, *this);
  started_ = true;
  store_release(intf_->server_features, ring::kXenstoreServerFeatureError);
  store_release(intf_->connection, ring::kXenstoreConnected);
  wait_kick();
  service();  // requests may already be on the ring
}

nlohmann::json RingConnection::save() const {
  const auto in = framer_.partial();
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : out_) out.push_back(hex(m.msg));
  return {{"id", id_},
          {"in", hex(std::string_view(reinterpret_cast<const char*>(in.data()), in.size()))},
          {"out", std::move(out)},
          {"out_off", out_off_},
          {"failed", failed_}};
}

namespace {
bool is_reply(const std::string& msg) {
  return wire::decode_header(std::span<const std::uint8_t, wire::kHeaderSize>(
                                 reinterpret_cast<const std::uint8_t*>(msg.data()), wire::kHeaderSize))
             .type != static_cast<std::uint32_t>(wire::MsgType::watch_event);
}
}  // namespace

void RingConnection::restore(const nlohmann::json& saved) {
  id_ = saved.at("id").get<ConnId>();
  const std::string in = unhex(saved.at("in").get<std::string>());
  const std::size_t used = framer_.feed(std::span<const std::uint8_t>(
      reinterpret_cast<const std::uint8_t*>(in.data()), in.size()));
  if (used != in.size() || framer_.ready() || framer_.violated()) {
    throw std::runtime_error("saved ring input is not the start of one message");
  }
  journaled_in_ = in.size();  // the journal's next snapshot has it (the daemon writes one at start)
  for (const auto& m : saved.at("out")) {
    std::string msg = unhex(m.get<std::string>());
    if (msg.size() < wire::kHeaderSize) throw std::runtime_error("saved ring output is not a message");
    unwritten_ += msg.size();
    if (is_reply(msg)) ++replies_queued_;
    out_.push_back({std::move(msg), false});
  }
  out_off_ = saved.at("out_off").get<std::size_t>();
  if (!out_.empty() && out_off_ >= out_.front().msg.size()) throw std::runtime_error("bad saved ring output offset");
  unwritten_ -= out_off_;
  failed_ = saved.at("failed").get<bool>();
  store_.attach_sink(id_, *this);
  started_ = true;
}

void RingConnection::serve() {
  if (failed_ || closed_) return;  // a disabled ring: the domain saw the error field
  wait_kick();
  service();  // what the domain produced (and consumed) while no daemon watched the ring
  kick();     // and a kick, in case it waits on a reply that was already there
}

RingJournalState RingConnection::journal_state() const {
  RingJournalState st;
  st.has_cons = true;
  st.cons = intf_->req_cons;
  const auto in = framer_.partial();
  st.in.assign(reinterpret_cast<const char*>(in.data()), in.size());
  st.rsp = intf_->rsp_prod;
  std::uint32_t at = st.rsp - static_cast<std::uint32_t>(out_off_);
  for (const auto& m : out_) {
    st.out.emplace_back(at, m.msg);
    at += static_cast<std::uint32_t>(m.msg.size());
  }
  st.failed = failed_;
  return st;
}

void RingConnection::recover(ConnId id, const RingJournalState& st) {
  id_ = id;
  failed_ = st.failed;
  if (st.has_cons) {
    const std::uint32_t page = intf_->req_cons;
    if (st.cons - page <= kXenstoreRingSize) {
      // Equal, or the dead daemon had journaled requests up to st.cons without publishing it yet:
      // they were handled (their replies are below), so they are not taken again.
      store_release(intf_->req_cons, st.cons);
      const std::size_t used = framer_.feed(std::span<const std::uint8_t>(
          reinterpret_cast<const std::uint8_t*>(st.in.data()), st.in.size()));
      if (used != st.in.size() || framer_.ready() || framer_.violated()) {
        throw std::runtime_error("the journaled ring input is not the start of one message");
      }
      journaled_in_ = st.in.size();
    } else {
      spdlog::warn("xenstored: dom{}: request index {} is past the journal's {}; served from the page's", domid_,
                   page, st.cons);
    }
  }
  // Each journaled message the page does not show as wholly written goes out again: from where
  // it stopped if the page shows it begun. Watch events that were not journaled and not written
  // are gone (the recovery fires every watch once).
  const std::uint32_t written = intf_->rsp_prod;
  auto msgs = st.out;
  std::stable_sort(msgs.begin(), msgs.end(), [written](const auto& a, const auto& b) {
    return static_cast<std::int32_t>(a.first - written) < static_cast<std::int32_t>(b.first - written);
  });
  for (const auto& [at, msg] : msgs) {
    if (msg.size() < wire::kHeaderSize) throw std::runtime_error("a journaled ring message is shorter than a header");
    const auto done = static_cast<std::int32_t>(written - at);
    if (done >= 0 && static_cast<std::size_t>(done) >= msg.size()) continue;
    if (out_.empty() && done > 0) out_off_ = static_cast<std::size_t>(done);
    unwritten_ += msg.size();
    if (is_reply(msg)) ++replies_queued_;
    out_.push_back({msg, true});
  }
  unwritten_ -= out_off_;
  store_.attach_sink(id_, *this);
  started_ = true;
}

std::string RingConnection::ring_record(nlohmann::json fields) const {
  fields["op"] = "ring";
  fields["domid"] = domid_;
  return fields.dump();
}

template <class Build>
void RingConnection::journal(Build&& build) noexcept {
  ChangeLog* log = store_.change_log();
  if (!log) return;
  try {
    log->record(ring_record(build()));
  } catch (const std::exception&) {
    // Not recorded (out of memory), while this connection goes on as if it were (the index
    // published, the bytes counted as journaled): the journal must be written again from a
    // snapshot, which holds this ring as it is.
    log->lost("out of memory recording a ring's state");
  }
  log->commit();
}

std::uint32_t RingConnection::tail() const noexcept {
  return intf_->rsp_prod + static_cast<std::uint32_t>(unwritten_);
}

void RingConnection::close() noexcept {
  if (closed_) return;
  closed_ = true;
  if (started_) store_.disconnect(id_);
  boost::system::error_code ec;
  kick_in_.close(ec);
}

void RingConnection::wait_kick() {
  auto self = shared_from_this();
  kick_in_.async_wait(asio::posix::stream_descriptor::wait_read,
                      [this, self](boost::system::error_code ec) {
                        if (ec || closed_) return;
                        std::uint64_t v;
                        [[maybe_unused]] auto n = ::read(kick_in_.native_handle(), &v, sizeof v);
                        spdlog::trace("xenstored: dom{}: kicked; req {}..{}, rsp {}..{}", domid_,
                                      load_acquire(intf_->req_cons), load_acquire(intf_->req_prod),
                                      load_acquire(intf_->rsp_cons), load_acquire(intf_->rsp_prod));
                        service();
                        if (!closed_) wait_kick();
                      });
}

void RingConnection::kick() noexcept {
  try {
    if (kick_out_()) ++kicks_sent_;
  } catch (...) {
    // A kick function that throws is a bug in the glue; the domain polls on its next request.
  }
}

void RingConnection::violation(std::uint32_t error_code, const char* what) noexcept {
  failed_ = true;
  journal([] { return nlohmann::json{{"failed", true}}; });
  store_release(intf_->error, error_code);
  spdlog::warn("xenstored: dom{}: ring {}; ring disabled", domid_, what);
  kick();
}

void RingConnection::service() noexcept {
  if (failed_ || closed_) return;
  bool notify = false;
  // Alternate until nothing moves: writing replies frees space the domain waits for, and
  // consuming requests lets it produce more.
  for (int round = 0; round < 64 && !failed_; ++round) {
    bool moved = produce_responses();
    if (replies_queued_ < store_.quotas().outstanding) moved |= consume_requests();
    moved |= produce_responses();
    notify |= moved;
    if (!moved) break;
  }
  if (notify && !failed_) kick();
}

bool RingConnection::consume_requests() noexcept {
  bool consumed = false;
  std::uint32_t published = intf_->req_cons;  // ours
  std::uint32_t cons = published;             // past the bytes given to the framer
  while (!failed_ && !closed_ && replies_queued_ < store_.quotas().outstanding) {
    std::uint32_t prod = load_acquire(intf_->req_prod);
    // The domain's index may not be more than a ring ahead, nor behind what was taken.
    if (prod - published > kXenstoreRingSize || prod - cons > prod - published) {
      violation(ring::kXenstoreErrorRingIdx, "request index out of range");
      return consumed;
    }
    if (prod == cons) break;
    // Copy out at most up to the end of the ring, and no further than the framer wants.
    std::uint32_t avail = prod - cons;
    std::uint32_t off = xenstore_mask(cons);
    std::uint32_t chunk = std::min(avail, kXenstoreRingSize - off);
    std::array<std::uint8_t, kXenstoreRingSize> copy;
    std::memcpy(copy.data(), intf_->req + off, chunk);
    std::size_t used = framer_.feed(std::span<const std::uint8_t>(copy.data(), chunk));
    cons += static_cast<std::uint32_t>(used);
    consumed |= used > 0;
    if (framer_.violated()) {
      store_release(intf_->req_cons, cons);
      violation(ring::kXenstoreErrorProto, "message longer than 4096 bytes");
      return consumed;
    }
    if (framer_.ready()) {
      // The index is published after the request was handled (and journaled with its reply).
      handled_cons_ = cons;
      store_.handle(id_, framer_.header(), framer_.payload());
      framer_.consume();
      journaled_in_ = 0;
      store_release(intf_->req_cons, cons);
      published = cons;
    }
  }
  if (cons != published && !failed_ && !closed_) {
    // The first bytes of a request whose rest is not on the ring yet: taken off (the domain may
    // be waiting for room for the rest), once the journal has them — the bytes taken since the
    // last record only, so that a request fed a byte at a time costs its size, not its square.
    const auto in = framer_.partial();
    journal([&] {
      return nlohmann::json{{"cons", cons},
                            {"in_more", hex(std::string_view(reinterpret_cast<const char*>(in.data()) + journaled_in_,
                                                             in.size() - journaled_in_))},
                            {"rsp", intf_->rsp_prod}};
    });
    journaled_in_ = in.size();
    store_release(intf_->req_cons, cons);
  }
  return consumed;
}

bool RingConnection::produce_responses() noexcept {
  bool produced = false;
  while (!out_.empty() && !failed_) {
    std::uint32_t prod = intf_->rsp_prod;  // ours
    std::uint32_t cons = load_acquire(intf_->rsp_cons);
    if (prod - cons > kXenstoreRingSize) {
      violation(ring::kXenstoreErrorRingIdx, "response index out of range");
      return produced;
    }
    std::uint32_t space = kXenstoreRingSize - (prod - cons);
    if (space == 0) break;
    Out& front = out_.front();
    const std::string& msg = front.msg;
    std::uint32_t off = xenstore_mask(prod);
    std::uint32_t n = std::min({space, kXenstoreRingSize - off,
                                static_cast<std::uint32_t>(msg.size() - out_off_)});
    if (out_off_ + n < msg.size() && !front.journaled) {
      // Part of a message stays off the ring: a recovery must be able to finish it.
      journal([&] {
        return nlohmann::json{{"rsp", prod}, {"at", prod - static_cast<std::uint32_t>(out_off_)}, {"msg", hex(msg)}};
      });
      front.journaled = true;
    }
    std::memcpy(intf_->rsp + off, msg.data() + out_off_, n);
    store_release(intf_->rsp_prod, prod + n);  // release: bytes before index
    produced = true;
    out_off_ += n;
    unwritten_ -= n;
    if (out_off_ == msg.size()) {
      if (is_reply(msg)) --replies_queued_;
      out_.pop_front();
      out_off_ = 0;
    }
  }
  return produced;
}

void RingConnection::deliver(const wire::Header& h, std::string_view payload) {
  if (closed_ || failed_) return;
  bool reply = h.type != static_cast<std::uint32_t>(wire::MsgType::watch_event);
  if (!reply && out_.size() >= store_.quotas().pending_events) return;  // bounded; dropped
  if (reply && std::exchange(reply_journaled_, false)) {
    out_.push_back({std::move(journaled_reply_), true});  // encoded once, by journal_reply()
  } else {
    out_.push_back({wire::encode(h, payload), false});
  }
  unwritten_ += out_.back().msg.size();
  if (reply) ++replies_queued_;
  // Watch events for this domain raised by another connection's request: push them now.
  if (!reply && produce_responses()) kick();
}

void RingConnection::journal_reply(ChangeLog& log, const wire::Header& h, std::string_view payload) {
  reply_journaled_ = false;
  if (closed_ || failed_) return;
  journaled_reply_ = wire::encode(h, payload);
  log.record(ring_record(
      {{"cons", handled_cons_}, {"in", ""}, {"rsp", intf_->rsp_prod}, {"at", tail()}, {"msg", hex(journaled_reply_)}}));
  reply_journaled_ = true;
}

// ---- RingJournalState ----

namespace {
std::uint32_t index_field(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_number_integer() || j.at(key).get<std::int64_t>() < 0 ||
      j.at(key).get<std::uint64_t>() > 0xffffffffu) {
    throw std::runtime_error(std::string("'") + key + "' is not a ring index");
  }
  return j.at(key).get<std::uint32_t>();
}
std::string hex_field(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_string()) throw std::runtime_error(std::string("'") + key + "' is not a string");
  return unhex(j.at(key).get_ref<const std::string&>());
}
}  // namespace

void RingJournalState::apply(const nlohmann::json& r) {
  if (r.contains("cons")) {
    has_cons = true;
    cons = index_field(r, "cons");
    if (r.contains("in_more")) {
      in += hex_field(r, "in_more");
      if (in.size() > wire::kHeaderSize + wire::kPayloadMax) throw std::runtime_error("'in' is longer than a message");
    } else {
      in = r.contains("in") ? hex_field(r, "in") : std::string();
    }
  }
  if (r.contains("rsp")) {
    rsp = index_field(r, "rsp");
    std::erase_if(out, [this](const auto& m) {
      const auto done = static_cast<std::int32_t>(rsp - m.first);
      return done >= 0 && static_cast<std::size_t>(done) >= m.second.size();
    });
  }
  auto add = [this](const nlohmann::json& m) {
    const std::uint32_t at = index_field(m, "at");
    std::string msg = hex_field(m, "msg");
    if (msg.size() < wire::kHeaderSize) throw std::runtime_error("'msg' is shorter than a message header");
    // A message is journaled once more when it is left half on the ring after a snapshot.
    if (std::any_of(out.begin(), out.end(), [at](const auto& o) { return o.first == at; })) return;
    // In the order of the response stream, which is not the order of the records: a watch event
    // queued before a reply is journaled after it when it is left half on the ring.
    auto from_rsp = [this](std::uint32_t a) { return static_cast<std::int32_t>(a - rsp); };
    auto pos = std::find_if(out.begin(), out.end(), [&](const auto& o) { return from_rsp(o.first) > from_rsp(at); });
    out.emplace(pos, at, std::move(msg));
  };
  if (r.contains("msg")) add(r);
  if (r.contains("out")) {
    if (!r.at("out").is_array()) throw std::runtime_error("'out' is not a list");
    for (const auto& m : r.at("out")) add(m);
  }
  if (r.contains("failed")) {
    if (!r.at("failed").is_boolean()) throw std::runtime_error("'failed' is not a boolean");
    failed = r.at("failed").get<bool>();
  }
}

nlohmann::json RingJournalState::to_json() const {
  nlohmann::json j{{"rsp", rsp}, {"failed", failed}};
  if (has_cons) {
    j["cons"] = cons;
    j["in"] = hex(in);
  }
  nlohmann::json msgs = nlohmann::json::array();
  for (const auto& [at, msg] : out) msgs.push_back({{"at", at}, {"msg", hex(msg)}});
  j["out"] = std::move(msgs);
  return j;
}

}  // namespace xpv::xenbus::daemon
