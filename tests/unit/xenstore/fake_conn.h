// What the store unit tests give the Store as a connection's Sink: it records each reply (its
// payload, or "!ENAME" for an error) and each watch event ("path|token").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "xpv/xenbus/store.h"

namespace xpv::xenbus::test {

struct FakeConn : Sink {
  std::vector<std::string> replies;
  std::vector<std::string> events;
  std::vector<wire::Header> headers;
  void deliver(const wire::Header& h, std::string_view payload) override {
    headers.push_back(h);
    if (h.type == static_cast<std::uint32_t>(wire::MsgType::watch_event)) {
      auto nul = payload.find('\0');
      std::string path(payload.substr(0, nul));
      std::string token(payload.substr(nul + 1));
      if (!token.empty() && token.back() == '\0') token.pop_back();
      events.push_back(path + "|" + token);
    } else if (h.type == static_cast<std::uint32_t>(wire::MsgType::error)) {
      std::string e(payload);
      if (!e.empty() && e.back() == '\0') e.pop_back();
      replies.push_back("!" + e);
    } else {
      replies.emplace_back(payload);
    }
  }
};

inline std::string z(std::string_view v) { return std::string(v) + std::string(1, '\0'); }
inline const std::string kOK("OK\0", 3);

// One request on connection `c` of `st`; returns its reply as `p` recorded it ("<no reply>" if
// none came).
inline std::string req(Store& st, ConnId c, FakeConn& p, wire::MsgType t, const std::string& payload,
                       std::uint32_t tx = 0) {
  static std::uint32_t id = 0;
  wire::Header h{static_cast<std::uint32_t>(t), ++id, tx, static_cast<std::uint32_t>(payload.size())};
  const std::size_t before = p.replies.size();
  st.handle(c, h, payload);
  if (p.replies.size() != before + 1) return "<no reply>";
  return p.replies.back();
}

}  // namespace xpv::xenbus::test
