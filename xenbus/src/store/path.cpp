#include "xpv/xenbus/path.h"

#include <fmt/format.h>

namespace xpv::xenbus {

std::string domain_path(DomId domid) { return fmt::format("/local/domain/{}", domid); }

bool valid_path_chars(std::string_view p) noexcept {
  for (char c : p) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '/' || c == '_' || c == '@';
    if (!ok) return false;
  }
  return true;
}

Expected<std::uint32_t, wire::Error> parse_uint(std::string_view s) noexcept {
  if (s.empty() || s.size() > 10) return fail(wire::Error::einval);
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return fail(wire::Error::einval);
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (v > 0xffffffffu) return fail(wire::Error::einval);
  return static_cast<std::uint32_t>(v);
}

Expected<std::string, wire::Error> canonicalize(DomId domid, std::string_view path,
                                                bool allow_special, std::size_t path_max) noexcept {
  if (path.empty()) return fail(wire::Error::einval);
  if (path.front() == '@') {
    if (!allow_special || path.size() > wire::kAbsPathMax || !valid_path_chars(path))
      return fail(wire::Error::einval);
    return std::string(path);
  }
  std::string abs;
  if (path.front() == '/') {
    abs = path;
  } else {
    abs = domain_path(domid);
    abs.push_back('/');
    abs.append(path);
  }
  if (abs.size() > wire::kAbsPathMax) return fail(wire::Error::einval);
  if (abs.size() > 1 && abs.back() == '/') return fail(wire::Error::einval);
  if (abs.find("//") != std::string::npos) return fail(wire::Error::einval);
  if (!valid_path_chars(abs) || abs.find('@') != std::string::npos) return fail(wire::Error::einval);
  if (path_max != 0) {
    // The quota counts only the part below a domain's home (Xen: "/local/domain/%u/").
    std::size_t local_off = 0;
    constexpr std::string_view kLocal = "/local/domain/";
    if (abs.starts_with(kLocal)) {
      std::size_t slash = abs.find('/', kLocal.size());
      if (slash != std::string::npos && slash > kLocal.size() && slash - kLocal.size() <= 5)
        local_off = slash + 1;
    }
    if (abs.size() - local_off > path_max) return fail(wire::Error::einval);
  }
  return abs;
}

std::string_view parent_path(std::string_view abs) noexcept {
  std::size_t slash = abs.rfind('/');
  if (slash == 0 || slash == std::string_view::npos) return "/";
  return abs.substr(0, slash);
}

std::string_view base_name(std::string_view abs) noexcept {
  if (abs == "/") return {};
  return abs.substr(abs.rfind('/') + 1);
}

std::string child_path(std::string_view parent, std::string_view name) {
  std::string s(parent);
  if (s != "/") s.push_back('/');
  s.append(name);
  return s;
}

bool is_same_or_below(std::string_view p, std::string_view ancestor) noexcept {
  if (ancestor == "/") return !p.empty() && p.front() == '/';
  if (!p.starts_with(ancestor)) return false;
  return p.size() == ancestor.size() || p[ancestor.size()] == '/';
}

}  // namespace xpv::xenbus
