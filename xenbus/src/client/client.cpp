// Async xenstore client (see client.h). Calling context: the io_context thread only.
#include "xpv/xenbus/client/client.h"

#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstring>

namespace xpv::xenbus::client {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;
using wire::Error;
using wire::MsgType;

namespace {
std::string z(std::string_view s) {
  std::string out(s);
  out.push_back('\0');
  return out;
}
ValueHandler to_void(Done h) {
  return [h = std::move(h)](Result<std::string> r) {
    if (r) h({});
    else h(fail(r.error()));
  };
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
}  // namespace

std::shared_ptr<Client> Client::create(asio::io_context& io) {
  return std::shared_ptr<Client>(new Client(io));
}

Client::Client(asio::io_context& io) : io_(io), sock_(io) {}
Client::~Client() = default;

void Client::connect(const std::string& socket_path, Done done) {
  auto self = shared_from_this();
  sock_.async_connect(stream::endpoint(socket_path),
                      [this, self, done = std::move(done)](boost::system::error_code ec) {
                        if (ec) return done(fail(Error::eio));
                        connected_ = true;
                        read_header();
                        done({});
                      });
}

void Client::close() {
  boost::system::error_code ec;
  sock_.close(ec);
  connected_ = false;
  fail_all(Error::eio);
}

void Client::on_broken(std::function<void()> cb) {
  if (broken_) {
    if (cb) cb();
    return;
  }
  on_broken_ = std::move(cb);
}

void Client::broke(boost::system::error_code ec) {
  // Our own close() came first (its aborted reads and writes, or one that had completed before
  // it but ran after), or the other direction's error did: nothing more to report.
  if (!connected_ || ec == boost::asio::error::operation_aborted) return close();
  close();
  broken_ = true;
  if (auto cb = std::move(on_broken_)) {
    on_broken_ = nullptr;
    cb();
  }
}

void Client::fail_all(Error e) {
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [id, h] : pending) h(fail(e));
}

void Client::read_header() {
  auto self = shared_from_this();
  asio::async_read(sock_, asio::buffer(hdr_buf_), [this, self](boost::system::error_code ec,
                                                               std::size_t) {
    if (ec) return broke(ec);
    wire::Header h = wire::decode_header(hdr_buf_);
    if (!wire::check_header(h)) return broke({});
    payload_.resize(h.len);
    asio::async_read(sock_, asio::buffer(payload_), [this, self, h](boost::system::error_code ec2,
                                                                    std::size_t) {
      if (ec2) return broke(ec2);
      std::string body(payload_.data(), payload_.size());
      // A callback or handler that throws is logged and the connection goes on: the next
      // message is still read. A watch callback runs from a copy, so it may replace or remove
      // its own watch.
      try {
        if (h.type == static_cast<std::uint32_t>(MsgType::watch_event)) {
          auto parts = split(body);
          if (parts.size() >= 2) {
            if (auto it = watches_.find(parts[1]); it != watches_.end()) {
              const WatchCallback cb = it->second;
              cb(parts[0], parts[1]);
            }
          }
        } else if (auto it = pending_.find(h.req_id); it != pending_.end()) {
          ValueHandler handler = std::move(it->second);
          pending_.erase(it);
          if (h.type == static_cast<std::uint32_t>(MsgType::error)) {
            if (!body.empty() && body.back() == '\0') body.pop_back();
            auto e = wire::error_from_name(body);
            handler(fail(e ? *e : Error::einval));
          } else {
            handler(std::move(body));
          }
        }
      } catch (const std::exception& e) {
        spdlog::error("xenstore client: a callback threw: {}", e.what());
      }
      if (connected_) read_header();
    });
  });
}

void Client::write_next() {
  if (out_.empty() || !connected_) {
    writing_ = false;
    return;
  }
  writing_ = true;
  auto self = shared_from_this();
  asio::async_write(sock_, asio::buffer(out_.front()),
                    [this, self](boost::system::error_code ec, std::size_t) {
                      out_.pop_front();
                      if (ec) {
                        writing_ = false;
                        return broke(ec);
                      }
                      write_next();
                    });
}

void Client::request(MsgType type, std::string payload, TxId tx, ValueHandler h) {
  if (!connected_) {
    asio::post(io_, [h = std::move(h)] { h(fail(Error::eio)); });
    return;
  }
  if (payload.size() > wire::kPayloadMax) {
    asio::post(io_, [h = std::move(h)] { h(fail(Error::e2big)); });
    return;
  }
  std::uint32_t id = next_req_++;
  if (next_req_ == 0) next_req_ = 1;
  pending_[id] = std::move(h);
  out_.push_back(wire::encode(type, id, tx, payload));
  if (!writing_) write_next();
}

void Client::read(const std::string& path, ValueHandler h, TxId tx) {
  request(MsgType::read, z(path), tx, std::move(h));
}

void Client::write(const std::string& path, std::string_view value, Done h, TxId tx) {
  std::string p = z(path);
  p.append(value);
  request(MsgType::write, std::move(p), tx, to_void(std::move(h)));
}

void Client::mkdir(const std::string& path, Done h, TxId tx) {
  request(MsgType::mkdir, z(path), tx, to_void(std::move(h)));
}

void Client::rm(const std::string& path, Done h, TxId tx) {
  request(MsgType::rm, z(path), tx, to_void(std::move(h)));
}

void Client::directory(const std::string& path, ListHandler h, TxId tx) {
  request(MsgType::directory, z(path), tx, [h = std::move(h)](Result<std::string> r) {
    if (!r) return h(fail(r.error()));
    h(split(*r));
  });
}

void Client::get_perms(const std::string& path, PermsHandler h, TxId tx) {
  request(MsgType::get_perms, z(path), tx, [h = std::move(h)](Result<std::string> r) {
    if (!r) return h(fail(r.error()));
    PermList out;
    for (const auto& s : split(*r)) {
      auto p = parse_perm(s);
      if (!p) return h(fail(Error::eio));
      out.push_back(*p);
    }
    h(std::move(out));
  });
}

void Client::set_perms(const std::string& path, const PermList& perms, Done h, TxId tx) {
  std::string p = z(path);
  for (const auto& pm : perms) p += z(format_perm(pm));
  request(MsgType::set_perms, std::move(p), tx, to_void(std::move(h)));
}

void Client::watch(const std::string& path, const std::string& token, WatchCallback cb, Done h) {
  // Register before sending: the daemon fires once right after its OK.
  watches_[token] = std::move(cb);
  request(MsgType::watch, z(path) + z(token), kNoTx,
          [this, self = shared_from_this(), token, h = std::move(h)](Result<std::string> r) {
            if (!r) {
              watches_.erase(token);
              return h(fail(r.error()));
            }
            h({});
          });
}

void Client::unwatch(const std::string& path, const std::string& token, Done h) {
  request(MsgType::unwatch, z(path) + z(token), kNoTx,
          [this, self = shared_from_this(), token, h = std::move(h)](Result<std::string> r) {
            if (r) watches_.erase(token);
            if (!r) return h(fail(r.error()));
            h({});
          });
}

void Client::transaction_start(std::function<void(Result<TxId>)> h) {
  request(MsgType::transaction_start, z(""), kNoTx, [h = std::move(h)](Result<std::string> r) {
    if (!r) return h(fail(r.error()));
    std::string s = *r;
    if (!s.empty() && s.back() == '\0') s.pop_back();
    auto id = parse_uint(s);
    if (!id || *id == 0) return h(fail(Error::eio));
    h(static_cast<TxId>(*id));
  });
}

void Client::transaction_end(TxId tx, bool commit, Done h) {
  request(MsgType::transaction_end, z(commit ? "T" : "F"), tx, to_void(std::move(h)));
}

void Client::transaction(TxBody body, Done done, int max_retries) {
  run_transaction(std::make_shared<TxBody>(std::move(body)), std::move(done), max_retries);
}

void Client::run_transaction(std::shared_ptr<TxBody> body, Done done, int left) {
  auto self = shared_from_this();
  transaction_start([this, self, body, done, left](Result<TxId> tx) {
    if (!tx) return done(fail(tx.error()));
    TxId id = *tx;
    (*body)(id, [this, self, body, done, left, id](Result<void> r) {
      if (!r) {
        // Abort; report the body's error whatever the abort answers. EAGAIN inside the body (a
        // transaction xenstored ended under it, e.g. `live-update -F`) is a conflict like one
        // at commit: start again.
        return transaction_end(id, false, [this, self, body, done, left, r](Result<void>) {
          if (r.error() == Error::eagain && left > 0) {
            ++retries_;
            return run_transaction(body, done, left - 1);
          }
          done(r);
        });
      }
      transaction_end(id, true, [this, self, body, done, left](Result<void> e) {
        if (!e && e.error() == Error::eagain && left > 0) {
          ++retries_;
          return run_transaction(body, done, left - 1);
        }
        done(e);
      });
    });
  });
}

}  // namespace xpv::xenbus::client
