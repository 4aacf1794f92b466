// The guest side of a xenstore ring, played by a test: writes requests into the req ring,
// signals the daemon's kick_in eventfd, waits on kick_out and reads replies from the rsp ring.
// Every wait is bounded (5 s).
#pragma once

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "xpv/ring/xenstore.h"
#include "xpv/xenbus/wire.h"

namespace xpv::test {

class RingClient {
 public:
  // `page` is the shared page; `kick_in` is the fd the daemon waits on; `kick_out` the one it
  // signals. Both are borrowed (the test owns them).
  RingClient(ring::XenstoreDomainInterface* page, int kick_in, int kick_out)
      : p_(page), kick_in_(kick_in), kick_out_(kick_out) {}

  // Sends one request and returns the reply payload, "!ENAME" for an error, or "<timeout>".
  std::string request(xenbus::wire::MsgType t, const std::string& payload, std::uint32_t tx = 0) {
    std::uint32_t id = ++req_id_;
    std::string msg = xenbus::wire::encode(t, id, tx, payload);
    if (!send_raw(msg)) return "<timeout>";
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      while (auto m = take_message()) {
        auto [h, body] = *m;
        if (h.type == static_cast<std::uint32_t>(xenbus::wire::MsgType::watch_event)) {
          events.push_back(event_string(body));
          continue;
        }
        if (h.type == static_cast<std::uint32_t>(xenbus::wire::MsgType::error)) {
          if (!body.empty() && body.back() == '\0') body.pop_back();
          return "!" + body;
        }
        return body;
      }
      wait_kick(50);
    }
    return "<timeout>";
  }

  // Waits until `n` watch events have arrived (bounded).
  bool wait_events(std::size_t n) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (events.size() < n && std::chrono::steady_clock::now() < deadline) {
      while (auto m = take_message()) events.push_back(event_string(m->second));
      if (events.size() < n) wait_kick(50);
    }
    return events.size() >= n;
  }

  // The next message on the response ring, whatever it is, waiting for it up to `ms`.
  std::optional<std::pair<xenbus::wire::Header, std::string>> next(int ms = 5000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      if (auto m = take_message()) return m;
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      wait_kick(20);
    }
  }
  // Takes at most `n` bytes off the response ring (a domain that reads slowly), then kicks.
  void take_bytes(std::size_t n) {
    std::uint32_t prod = load(p_->rsp_prod);
    std::uint32_t cons = p_->rsp_cons;
    for (; cons != prod && n > 0; ++cons, --n) buf_.push_back(p_->rsp[ring::xenstore_mask(cons)]);
    store(p_->rsp_cons, cons);
    kick();
  }
  // Bytes read off the response ring that are not a whole message yet.
  std::size_t buffered() const { return buf_.size(); }

  // Writes raw bytes into the request ring (waiting for space), then kicks.
  bool send_raw(const std::string& bytes) {
    std::size_t off = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (off < bytes.size()) {
      std::uint32_t cons = load(p_->req_cons);
      std::uint32_t prod = p_->req_prod;
      std::uint32_t space = ring::kXenstoreRingSize - (prod - cons);
      if (space == 0) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        kick();
        wait_kick(50);
        drain_rsp_into_buffer();
        continue;
      }
      std::uint32_t idx = ring::xenstore_mask(prod);
      std::uint32_t n = std::min<std::uint32_t>(
          {space, ring::kXenstoreRingSize - idx, static_cast<std::uint32_t>(bytes.size() - off)});
      std::memcpy(p_->req + idx, bytes.data() + off, n);
      store(p_->req_prod, prod + n);
      off += n;
    }
    kick();
    return true;
  }

  void kick() {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(kick_in_, &one, sizeof one);
  }

  std::vector<std::string> events;  // "path|token"

 private:
  static std::uint32_t load(std::uint32_t& v) {
    return std::atomic_ref<std::uint32_t>(v).load(std::memory_order_acquire);
  }
  static void store(std::uint32_t& v, std::uint32_t x) {
    std::atomic_ref<std::uint32_t>(v).store(x, std::memory_order_release);
  }
  static std::string event_string(const std::string& body) {
    auto nul = body.find('\0');
    std::string tok = body.substr(nul + 1);
    if (!tok.empty() && tok.back() == '\0') tok.pop_back();
    return body.substr(0, nul) + "|" + tok;
  }
  void wait_kick(int ms) {
    pollfd p{kick_out_, POLLIN, 0};
    if (::poll(&p, 1, ms) == 1) {
      std::uint64_t v;
      [[maybe_unused]] auto n = ::read(kick_out_, &v, sizeof v);
    }
  }
  void drain_rsp_into_buffer() {
    std::uint32_t prod = load(p_->rsp_prod);
    std::uint32_t cons = p_->rsp_cons;
    bool any = false;
    while (cons != prod) {
      buf_.push_back(p_->rsp[ring::xenstore_mask(cons)]);
      ++cons;
      any = true;
    }
    store(p_->rsp_cons, cons);
    if (any) kick();  // the daemon may be waiting for space
  }
  std::optional<std::pair<xenbus::wire::Header, std::string>> take_message() {
    drain_rsp_into_buffer();
    if (buf_.size() < xenbus::wire::kHeaderSize) return std::nullopt;
    auto h = xenbus::wire::decode_header(std::span<const std::uint8_t, 16>(
        reinterpret_cast<const std::uint8_t*>(buf_.data()), 16));
    if (buf_.size() < xenbus::wire::kHeaderSize + h.len) return std::nullopt;
    std::string body = buf_.substr(xenbus::wire::kHeaderSize, h.len);
    buf_.erase(0, xenbus::wire::kHeaderSize + h.len);
    return std::make_pair(h, body);
  }

  ring::XenstoreDomainInterface* p_;
  int kick_in_;
  int kick_out_;
  std::uint32_t req_id_ = 0;
  std::string buf_;
};

}  // namespace xpv::test
