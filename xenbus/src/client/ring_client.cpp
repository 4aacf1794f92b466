// The xenstore client over a domain's own ring (see ring_client.h).
//
// Lock order: lock_ (io side) and watch_lock_ (watch side) are never held together, except that
// the io thread takes watch_lock_ inside lock_ to queue an event (watch_lock_ is innermost; the
// watch thread never takes lock_ while holding watch_lock_).
#include "xpv/xenbus/client/ring_client.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "xpv/ring/byte_ring.h"
#include "xpv/thread_name.h"

namespace xpv::xenbus::client {

using wire::Error;
using wire::MsgType;

namespace {
std::string z(std::string_view s) {
  std::string out(s);
  out.push_back('\0');
  return out;
}
std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start < s.size()) {
    std::size_t nul = s.find('\0', start);
    if (nul == std::string_view::npos) nul = s.size();
    out.emplace_back(s.substr(start, nul - start));
    start = nul + 1;
  }
  return out;
}
std::string first_arg(std::string_view payload) {
  return std::string(payload.substr(0, std::min(payload.find('\0'), payload.size())));
}
// How often the io thread looks at the ring without a notification: covers a kick that raced
// with the port being bound (xenstored attaching), never needed in the steady state.
constexpr auto kPoll = std::chrono::milliseconds(200);
}  // namespace

RingClient::RingClient(std::span<std::uint8_t> page, std::function<void()> notify, Options options)
    : intf_(nullptr), notify_(std::move(notify)), options_(options),
      timeout_ms_(options.timeout.count()) {
  auto intf = ring::xenstore_interface(page);
  if (!intf) throw std::invalid_argument("xenstore ring client: page too small or misaligned");
  if (!notify_) throw std::invalid_argument("xenstore ring client: no notify function");
  intf_ = *intf;
  io_thread_ = std::thread([this] {
    set_thread_name("xs-ring-io");
    io_loop();
  });
  watch_thread_ = std::thread([this] {
    set_thread_name("xs-watch");
    watch_loop();
  });
}

RingClient::~RingClient() {
  {
    std::lock_guard l(lock_);
    stopping_ = true;
    fail_all_locked();
  }
  io_cv_.notify_all();
  reply_cv_.notify_all();
  {
    std::lock_guard l(watch_lock_);
    watch_stopping_ = true;
  }
  watch_cv_.notify_all();
  io_thread_.join();
  watch_thread_.join();
}

void RingClient::on_event() noexcept {
  {
    std::lock_guard l(lock_);
    kicked_ = true;
  }
  io_cv_.notify_one();
}

RingClient::Stats RingClient::stats() const {
  std::lock_guard l(lock_);
  return stats_;
}

void RingClient::fail_all_locked() {
  for (auto& [id, p] : pending_) {
    p->done = true;
    p->header.type = static_cast<std::uint32_t>(MsgType::error);
    p->payload = z("EIO");
  }
  pending_.clear();
}

// ---- io thread ------------------------------------------------------------------------------

void RingClient::io_loop() {
  std::unique_lock l(lock_);
  while (!stopping_) {
    io_cv_.wait_for(l, kPoll, [this] { return stopping_ || kicked_ || (!out_.empty() && !out_blocked_); });
    if (stopping_) break;
    kicked_ = false;
    if (broken_.load(std::memory_order_relaxed)) {
      out_.clear();
      continue;
    }
    // Move bytes until nothing moves; a notification after each round that moved any.
    for (int round = 0; round < 64; ++round) {
      if (!pump(l)) break;
      ++stats_.notifications;
      l.unlock();
      notify_();
      l.lock();
      if (stopping_) break;
    }
  }
}

bool RingClient::pump(std::unique_lock<std::mutex>&) {
  auto req = ring::xenstore_req_ring(*intf_);
  auto rsp = ring::xenstore_rsp_ring(*intf_);
  bool moved = false;
  const auto broken = [this](const char* what) {
    spdlog::error("xenstore ring client: {}; the ring is unusable", what);
    broken_.store(true, std::memory_order_release);
    fail_all_locked();
    reply_cv_.notify_all();
    return false;
  };
  if (!req || !rsp) return broken("ring layout refused");
  const std::uint32_t err = std::atomic_ref<std::uint32_t>(intf_->error).load(std::memory_order_acquire);
  if (err != ring::kXenstoreErrorNone) return broken("xenstored reported a ring error");
  ++stats_.pumps;
  // Requests out.
  while (!out_.empty()) {
    const std::string& m = out_.front();
    auto n = req->write(std::span<const char>(m.data() + out_off_, m.size() - out_off_));
    if (!n) return broken("request ring index out of range");
    if (*n == 0) break;  // full: xenstored's kick says when it took some
    moved = true;
    out_off_ += *n;
    if (out_off_ == m.size()) {
      out_.pop_front();
      out_off_ = 0;
    }
  }
  out_blocked_ = !out_.empty();
  // Replies and events in.
  for (;;) {
    char buf[ring::kXenstoreRingSize];
    auto n = rsp->read(std::span<char>(buf, sizeof buf));
    if (!n) return broken("response ring index out of range");
    if (*n == 0) break;
    moved = true;
    in_.append(buf, *n);
  }
  std::size_t off = 0;
  while (off < in_.size()) {
    off += framer_.feed(std::span<const std::uint8_t>(
        reinterpret_cast<const std::uint8_t*>(in_.data()) + off, in_.size() - off));
    if (framer_.violated()) return broken("reply longer than 4096 bytes");
    if (!framer_.ready()) break;
    handle_message(framer_.header(), std::string(framer_.payload()));
    framer_.consume();
  }
  in_.erase(0, off);
  return moved;
}

void RingClient::handle_message(const wire::Header& h, std::string payload) {
  if (h.type == static_cast<std::uint32_t>(MsgType::watch_event)) {
    ++stats_.events;
    auto parts = split(payload);
    if (parts.size() < 2) return;  // malformed event: nothing to dispatch
    std::lock_guard w(watch_lock_);
    if (events_.size() >= options_.max_queued_events) {
      ++stats_.dropped_events;
      return;
    }
    events_.push_back([this, path = parts[0], token = parts[1]] {
      WatchCallback cb;
      {
        std::lock_guard w2(watch_lock_);
        auto it = watch_cbs_.find(token);
        if (it == watch_cbs_.end()) return;  // unwatched meanwhile
        cb = it->second;
        running_token_ = token;  // unwatch(token) waits until it has returned
      }
      struct Done {
        RingClient* c;
        ~Done() {
          {
            std::lock_guard w3(c->watch_lock_);
            c->running_token_.reset();
          }
          c->watch_idle_cv_.notify_all();
        }
      } done{this};  // also when cb throws
      // The copy (and what it captured) goes before `done` lets unwatch() return.
      std::exchange(cb, nullptr)(path, token);
    });
    watch_cv_.notify_one();
    return;
  }
  ++stats_.replies;
  if (!connected_.exchange(true, std::memory_order_acq_rel)) reply_cv_.notify_all();
  auto it = pending_.find(h.req_id);
  if (it == pending_.end()) return;  // its caller gave up (timeout) or the probe
  it->second->done = true;
  it->second->header = h;
  it->second->payload = std::move(payload);
  pending_.erase(it);
  reply_cv_.notify_all();
}

// ---- watch thread ---------------------------------------------------------------------------

void RingClient::watch_loop() {
  std::unique_lock l(watch_lock_);
  for (;;) {
    watch_cv_.wait(l, [this] { return watch_stopping_ || !events_.empty(); });
    if (watch_stopping_) return;
    auto fn = std::move(events_.front());
    events_.pop_front();
    l.unlock();
    try {
      fn();
    } catch (const std::exception& e) {
      spdlog::error("xenstore ring client: a watch callback threw: {}", e.what());
    } catch (...) {
      spdlog::error("xenstore ring client: a watch callback threw");
    }
    l.lock();
  }
}

void RingClient::post(std::function<void()> fn) {
  {
    std::lock_guard l(watch_lock_);
    events_.push_back(std::move(fn));
  }
  watch_cv_.notify_one();
}

// ---- requests -------------------------------------------------------------------------------

Result<void> RingClient::wait_connected(std::chrono::milliseconds timeout) {
  if (connected()) return {};
  std::unique_lock l(lock_);
  if (probe_req_ == 0 && !broken()) {
    // One probe for the client's life: it waits on the ring until xenstored serves it. Its
    // reply (the value, or ENOENT / EACCES) only says that somebody answers.
    probe_req_ = next_req_++;
    out_.push_back(wire::encode(MsgType::read, probe_req_, 0, z("domid")));
    ++stats_.requests;
    io_cv_.notify_one();
  }
  reply_cv_.wait_for(l, timeout, [this] { return connected() || broken() || stopping_; });
  if (connected()) return {};
  return fail(Error::eio);
}

Result<std::string> RingClient::request(MsgType type, std::string payload, TxId tx) {
  auto p = std::make_shared<Pending>();
  const auto timeout = std::chrono::milliseconds(timeout_ms_.load());
  std::unique_lock l(lock_);
  if (broken() || stopping_) return fail(Error::eio);
  std::uint32_t id = next_req_++;
  if (id == 0) id = next_req_++;  // 0 is what watch events carry
  out_.push_back(wire::encode(type, id, tx, payload));
  pending_[id] = p;
  ++stats_.requests;
  io_cv_.notify_one();
  if (!reply_cv_.wait_for(l, timeout, [&] { return p->done; })) {
    pending_.erase(id);
    ++stats_.timeouts;
    l.unlock();
    spdlog::warn("xenstore ring client: {} {}: no reply within {} ms",
                 wire::type_name(static_cast<std::uint32_t>(type)), first_arg(payload),
                 timeout.count());
    return fail(Error::eio);
  }
  if (p->header.type == static_cast<std::uint32_t>(MsgType::error)) {
    std::string name = first_arg(p->payload);
    auto e = wire::error_from_name(name);
    return fail(e ? *e : Error::einval);
  }
  return std::move(p->payload);
}

Result<std::string> RingClient::read(const std::string& path, TxId tx) {
  return request(MsgType::read, z(path), tx);
}

Result<void> RingClient::write(const std::string& path, std::string_view value, TxId tx) {
  std::string p = z(path);
  p.append(value);
  auto r = request(MsgType::write, std::move(p), tx);
  if (!r) return fail(r.error());
  return {};
}

Result<void> RingClient::mkdir(const std::string& path, TxId tx) {
  auto r = request(MsgType::mkdir, z(path), tx);
  if (!r) return fail(r.error());
  return {};
}

Result<void> RingClient::rm(const std::string& path, TxId tx) {
  auto r = request(MsgType::rm, z(path), tx);
  if (!r) return fail(r.error());
  return {};
}

Result<std::vector<std::string>> RingClient::directory(const std::string& path, TxId tx) {
  auto r = request(MsgType::directory, z(path), tx);
  if (!r) return fail(r.error());
  return split(*r);
}

Result<PermList> RingClient::get_perms(const std::string& path, TxId tx) {
  auto r = request(MsgType::get_perms, z(path), tx);
  if (!r) return fail(r.error());
  PermList out;
  for (const auto& s : split(*r)) {
    auto p = parse_perm(s);
    if (!p) return fail(Error::einval);
    out.push_back(*p);
  }
  return out;
}

Result<void> RingClient::set_perms(const std::string& path, const PermList& perms, TxId tx) {
  std::string p = z(path);
  for (const auto& pm : perms) p += z(format_perm(pm));
  auto r = request(MsgType::set_perms, std::move(p), tx);
  if (!r) return fail(r.error());
  return {};
}

Result<void> RingClient::watch(const std::string& path, const std::string& token, WatchCallback cb) {
  {
    std::lock_guard w(watch_lock_);
    watch_cbs_[token] = std::move(cb);
  }
  auto r = request(MsgType::watch, z(path) + z(token));
  if (!r) {
    std::lock_guard w(watch_lock_);
    watch_cbs_.erase(token);
    return fail(r.error());
  }
  return {};
}

Result<void> RingClient::unwatch(const std::string& path, const std::string& token) {
  auto r = request(MsgType::unwatch, z(path) + z(token));
  {
    std::unique_lock w(watch_lock_);
    watch_cbs_.erase(token);
    // A firing of it that is running now ends before we return, so that the caller may free what
    // the callback uses (Linux's unregister_xenbus_watch waits the same way) — unless that
    // firing is the caller, which would wait for itself.
    if (std::this_thread::get_id() != watch_thread_.get_id()) {
      watch_idle_cv_.wait(w, [&] { return running_token_ != token; });
    }
  }
  if (!r) return fail(r.error());
  return {};
}

Result<TxId> RingClient::transaction_start() {
  auto r = request(MsgType::transaction_start, z(""));
  if (!r) return fail(r.error());
  const std::string s = first_arg(*r);
  if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos) {
    return fail(Error::einval);
  }
  const unsigned long v = std::stoul(s);
  if (v == 0 || v > UINT32_MAX) return fail(Error::einval);
  return static_cast<TxId>(v);
}

Result<void> RingClient::transaction_end(TxId tx, bool commit) {
  auto r = request(MsgType::transaction_end, z(commit ? "T" : "F"), tx);
  if (!r) return fail(r.error());
  return {};
}

Result<void> RingClient::transaction(const std::function<Result<void>(TxId)>& body, int max_retries) {
  for (int attempt = 0;; ++attempt) {
    auto tx = transaction_start();
    if (!tx) return fail(tx.error());
    auto r = body(*tx);
    if (!r) {
      (void)transaction_end(*tx, false);
      // EAGAIN inside the body (a transaction xenstored ended under it, e.g. `live-update -F`)
      // is a conflict like one at commit: start again.
      if (r.error() == Error::eagain && attempt < max_retries) {
        continue;
      }
      return r;
    }
    auto end = transaction_end(*tx, true);
    if (end) return {};
    if (end.error() != Error::eagain || attempt >= max_retries) return end;
  }
}

}  // namespace xpv::xenbus::client
