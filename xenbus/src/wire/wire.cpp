// xenstore wire framing and argument rules (see wire.h).
#include "xpv/xenbus/wire.h"

#include <cerrno>
#include <cstring>

namespace xpv::xenbus::wire {

namespace {

struct ErrorEntry {
  std::string_view name;
  int errnum;
};

// Same order as xsd_errors in io/xs_wire.h (checked by wire_test against the official table).
constexpr std::array<ErrorEntry, kErrorCount> kErrors = {{
    {"EINVAL", EINVAL},
    {"EACCES", EACCES},
    {"EEXIST", EEXIST},
    {"EISDIR", EISDIR},
    {"ENOENT", ENOENT},
    {"ENOMEM", ENOMEM},
    {"ENOSPC", ENOSPC},
    {"EIO", EIO},
    {"ENOTEMPTY", ENOTEMPTY},
    {"ENOSYS", ENOSYS},
    {"EROFS", EROFS},
    {"EBUSY", EBUSY},
    {"EAGAIN", EAGAIN},
    {"EISCONN", EISCONN},
    {"E2BIG", E2BIG},
    {"EPERM", EPERM},
}};

constexpr std::array<const char*, 23> kTypeNames = {
    "CONTROL",     "DIRECTORY",   "READ",          "GET_PERMS",
    "WATCH",       "UNWATCH",     "TRANSACTION_START", "TRANSACTION_END",
    "INTRODUCE",   "RELEASE",     "GET_DOMAIN_PATH",   "WRITE",
    "MKDIR",       "RM",          "SET_PERMS",     "WATCH_EVENT",
    "ERROR",       "IS_DOMAIN_INTRODUCED", "RESUME", "SET_TARGET",
    "(RESTRICT)",  "RESET_WATCHES", "DIRECTORY_PART",
};

std::uint32_t load_le32(const std::uint8_t* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);  // host order: xenstore peers share the host's endianness
  return v;
}

// Splits `payload` into NUL-terminated strings. Returns false if the last byte is not a NUL.
bool split_strings(std::string_view payload, std::vector<std::string_view>& out) noexcept {
  if (payload.empty() || payload.back() != '\0') return false;
  std::size_t start = 0;
  while (start < payload.size()) {
    std::size_t nul = payload.find('\0', start);
    out.push_back(payload.substr(start, nul - start));
    start = nul + 1;
  }
  return true;
}

}  // namespace

const char* type_name(std::uint32_t type) noexcept {
  if (type < kTypeNames.size()) return kTypeNames[type];
  return "UNKNOWN";
}

std::string_view error_name(Error e) noexcept { return kErrors[static_cast<std::size_t>(e)].name; }
int error_errno(Error e) noexcept { return kErrors[static_cast<std::size_t>(e)].errnum; }

Expected<Error, bool> error_from_name(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kErrors.size(); ++i)
    if (kErrors[i].name == name) return static_cast<Error>(i);
  return fail(false);
}

Header decode_header(std::span<const std::uint8_t, kHeaderSize> b) noexcept {
  return Header{load_le32(b.data()), load_le32(b.data() + 4), load_le32(b.data() + 8),
                load_le32(b.data() + 12)};
}

Expected<Header, Violation> check_header(const Header& h) noexcept {
  if (h.len > kPayloadMax) return fail(Violation::too_long);
  return h;
}

void encode_header(const Header& h, std::span<std::uint8_t, kHeaderSize> out) noexcept {
  std::memcpy(out.data(), &h, kHeaderSize);
}

std::string encode(const Header& h, std::string_view payload) {
  std::string out(kHeaderSize + payload.size(), '\0');
  Header hh = h;
  hh.len = static_cast<std::uint32_t>(payload.size());
  std::memcpy(out.data(), &hh, kHeaderSize);
  if (!payload.empty()) std::memcpy(out.data() + kHeaderSize, payload.data(), payload.size());
  return out;
}

std::string encode(MsgType type, std::uint32_t req_id, std::uint32_t tx_id,
                   std::string_view payload) {
  return encode(Header{static_cast<std::uint32_t>(type), req_id, tx_id, 0}, payload);
}

std::string join_nul(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (auto p : parts) {
    s.append(p);
    s.push_back('\0');
  }
  return s;
}

Expected<Args, Error> split_args(std::uint32_t type, std::string_view payload) noexcept {
  Args a;
  auto exactly = [&](std::size_t n) -> Expected<Args, Error> {
    if (!split_strings(payload, a.v) || a.v.size() != n) return fail(Error::einval);
    return std::move(a);
  };
  auto at_least = [&](std::size_t n) -> Expected<Args, Error> {
    if (!split_strings(payload, a.v) || a.v.size() < n) return fail(Error::einval);
    return std::move(a);
  };
  switch (static_cast<MsgType>(type)) {
    case MsgType::read:
    case MsgType::directory:
    case MsgType::get_perms:
    case MsgType::mkdir:
    case MsgType::rm:
    case MsgType::get_domain_path:
    case MsgType::release:
    case MsgType::resume:
    case MsgType::is_domain_introduced:
    case MsgType::transaction_start:
    case MsgType::transaction_end:
      return exactly(1);
    case MsgType::watch:
    case MsgType::unwatch:
    case MsgType::set_target:
    case MsgType::directory_part:
      return exactly(2);
    case MsgType::introduce:
      return exactly(3);
    case MsgType::set_perms:
      return at_least(2);
    case MsgType::control:
      return at_least(1);
    case MsgType::write: {
      std::size_t nul = payload.find('\0');
      if (nul == std::string_view::npos) return fail(Error::einval);
      a.v.push_back(payload.substr(0, nul));
      a.v.push_back(payload.substr(nul + 1));
      return a;
    }
    case MsgType::reset_watches:
      return a;
    default:
      return fail(Error::enosys);
  }
}

std::size_t Framer::feed(std::span<const std::uint8_t> bytes) noexcept {
  if (ready_ || violated_) return 0;
  std::size_t used = 0;
  if (have_ < kHeaderSize) {
    std::size_t n = std::min(kHeaderSize - have_, bytes.size());
    std::memcpy(buf_.data() + have_, bytes.data(), n);
    have_ += n;
    used += n;
    if (have_ < kHeaderSize) return used;
    hdr_ = decode_header(std::span<const std::uint8_t, kHeaderSize>(buf_.data(), kHeaderSize));
    if (!check_header(hdr_)) {
      violated_ = true;
      return used;
    }
  }
  std::size_t want = kHeaderSize + hdr_.len - have_;
  std::size_t n = std::min(want, bytes.size() - used);
  std::memcpy(buf_.data() + have_, bytes.data() + used, n);
  have_ += n;
  used += n;
  if (have_ == kHeaderSize + hdr_.len) ready_ = true;
  return used;
}

void Framer::consume() noexcept {
  have_ = 0;
  ready_ = false;
}

}  // namespace xpv::xenbus::wire
