// Domain-ring transport (see ring_connection.h). Calling context: the daemon's io_context
// thread; the domain runs concurrently on the other side of the page, so every index it owns is
// read with an acquire atomic_ref and every byte is copied out before it is looked at.
#include "xpv/xenbus/daemon/ring_connection.h"
#include "xpv/xenbus/hex.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

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
  for (const auto& m : out_) out.push_back(hex(m));
  return {{"id", id_},
          {"in", hex(std::string_view(reinterpret_cast<const char*>(in.data()), in.size()))},
          {"out", std::move(out)},
          {"out_off", out_off_},
          {"failed", failed_}};
}

void RingConnection::resume(const nlohmann::json& saved) {
  id_ = saved.at("id").get<ConnId>();
  store_.attach_sink(id_, *this);
  started_ = true;
  const std::string in = unhex(saved.at("in").get<std::string>());
  const std::size_t used = framer_.feed(std::span<const std::uint8_t>(
      reinterpret_cast<const std::uint8_t*>(in.data()), in.size()));
  if (used != in.size() || framer_.ready() || framer_.violated()) {
    throw std::runtime_error("saved ring input is not the start of one message");
  }
  for (const auto& m : saved.at("out")) {
    out_.push_back(unhex(m.get<std::string>()));
    if (out_.back().size() < wire::kHeaderSize) throw std::runtime_error("saved ring output is not a message");
    auto type = wire::decode_header(std::span<const std::uint8_t, wire::kHeaderSize>(
                                        reinterpret_cast<const std::uint8_t*>(out_.back().data()),
                                        wire::kHeaderSize))
                    .type;
    if (type != static_cast<std::uint32_t>(wire::MsgType::watch_event)) ++replies_queued_;
  }
  out_off_ = saved.at("out_off").get<std::size_t>();
  if (!out_.empty() && out_off_ >= out_.front().size()) throw std::runtime_error("bad saved ring output offset");
  failed_ = saved.at("failed").get<bool>();
  if (failed_) return;  // the domain saw the error field; nothing more is served
  wait_kick();
  service();  // what the domain produced (and consumed) while no daemon watched the ring
  kick();     // and a kick, in case it waits on a reply that was already there
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
  while (!failed_ && !closed_ && replies_queued_ < store_.quotas().outstanding) {
    std::uint32_t cons = intf_->req_cons;  // ours
    std::uint32_t prod = load_acquire(intf_->req_prod);
    if (prod - cons > kXenstoreRingSize) {
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
    store_release(intf_->req_cons, cons + static_cast<std::uint32_t>(used));
    consumed |= used > 0;
    if (framer_.violated()) {
      violation(ring::kXenstoreErrorProto, "message longer than 4096 bytes");
      return consumed;
    }
    if (framer_.ready()) {
      store_.handle(id_, framer_.header(), framer_.payload());
      framer_.consume();
    }
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
    const std::string& msg = out_.front();
    std::uint32_t off = xenstore_mask(prod);
    std::uint32_t n = std::min({space, kXenstoreRingSize - off,
                                static_cast<std::uint32_t>(msg.size() - out_off_)});
    std::memcpy(intf_->rsp + off, msg.data() + out_off_, n);
    store_release(intf_->rsp_prod, prod + n);  // release: bytes before index
    produced = true;
    out_off_ += n;
    if (out_off_ == msg.size()) {
      auto type = wire::decode_header(
                      std::span<const std::uint8_t, wire::kHeaderSize>(
                          reinterpret_cast<const std::uint8_t*>(msg.data()), wire::kHeaderSize))
                      .type;
      if (type != static_cast<std::uint32_t>(wire::MsgType::watch_event)) --replies_queued_;
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
  out_.push_back(wire::encode(h, payload));
  if (reply) ++replies_queued_;
  // Watch events for this domain raised by another connection's request: push them now.
  if (!reply && produce_responses()) kick();
}

}  // namespace xpv::xenbus::daemon
