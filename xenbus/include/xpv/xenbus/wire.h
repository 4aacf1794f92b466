// xenstore wire protocol (io/xs_wire.h): message header, message types, error names, and the
// per-type argument rules. Pure and noexcept: both transports (unix socket, domain ring) and the
// fuzzer feed untrusted bytes through here before anything else looks at them.
//
// A message is a 16-byte header {type, req_id, tx_id, len} followed by `len` payload bytes
// (len <= kPayloadMax). Arguments are NUL-terminated strings; WRITE's last argument is the raw
// value (no terminator). A reply echoes req_id and tx_id; an error reply has type ERROR and the
// errno name ("ENOENT\0") as payload; watch events have type WATCH_EVENT and "path\0token\0".
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "xpv/expected.h"

namespace xpv::xenbus::wire {

inline constexpr std::uint32_t kPayloadMax = 4096;     // XENSTORE_PAYLOAD_MAX
inline constexpr std::size_t kAbsPathMax = 3072;       // XENSTORE_ABS_PATH_MAX
inline constexpr std::size_t kRelPathMax = 2048;       // XENSTORE_REL_PATH_MAX
inline constexpr std::size_t kHeaderSize = 16;

// enum xsd_sockmsg_type; values are the wire numbers (20 was XS_RESTRICT, removed).
enum class MsgType : std::uint32_t {
  control = 0,
  directory = 1,
  read = 2,
  get_perms = 3,
  watch = 4,
  unwatch = 5,
  transaction_start = 6,
  transaction_end = 7,
  introduce = 8,
  release = 9,
  get_domain_path = 10,
  write = 11,
  mkdir = 12,
  rm = 13,
  set_perms = 14,
  watch_event = 15,
  error = 16,
  is_domain_introduced = 17,
  resume = 18,
  set_target = 19,
  reset_watches = 21,
  directory_part = 22,
  type_count = 23,
  invalid = 0xffff,
};

const char* type_name(std::uint32_t type) noexcept;

// struct xsd_sockmsg
struct Header {
  std::uint32_t type;    // 0x0: MsgType
  std::uint32_t req_id;  // 0x4: echoed in the reply
  std::uint32_t tx_id;   // 0x8: 0 outside a transaction
  std::uint32_t len;     // 0xc: payload bytes that follow
};
static_assert(std::is_standard_layout_v<Header> && sizeof(Header) == kHeaderSize);
static_assert(offsetof(Header, req_id) == 4 && offsetof(Header, tx_id) == 8 &&
              offsetof(Header, len) == 12);

// The error names of xs_wire.h's xsd_errors table, in table order. Only these names may travel
// on the wire; libxenstore maps an unknown name to EINVAL.
enum class Error : std::uint8_t {
  einval,
  eacces,
  eexist,
  eisdir,
  enoent,
  enomem,
  enospc,
  eio,
  enotempty,
  enosys,
  erofs,
  ebusy,
  eagain,
  eisconn,
  e2big,
  eperm,
};
inline constexpr std::size_t kErrorCount = 16;

std::string_view error_name(Error e) noexcept;       // "ENOENT"
int error_errno(Error e) noexcept;                   // ENOENT
Expected<Error, bool> error_from_name(std::string_view name) noexcept;

// Why a header or message is rejected. `too_long` is a protocol violation (the connection is
// closed, or for a ring the error field is set); the others get an error reply.
enum class Violation : std::uint8_t { too_long };

Header decode_header(std::span<const std::uint8_t, kHeaderSize> bytes) noexcept;
// Checks what can be checked on a header alone (len <= kPayloadMax).
Expected<Header, Violation> check_header(const Header& h) noexcept;
void encode_header(const Header& h, std::span<std::uint8_t, kHeaderSize> out) noexcept;

// One complete message: header + payload, as it will be written to a socket or ring.
std::string encode(const Header& h, std::string_view payload);
std::string encode(MsgType type, std::uint32_t req_id, std::uint32_t tx_id,
                   std::string_view payload);

// Arguments of a request after the per-type rules were applied. Views into the payload.
struct Args {
  std::vector<std::string_view> v;
  std::size_t size() const noexcept { return v.size(); }
  std::string_view operator[](std::size_t i) const noexcept { return v[i]; }
};

// Splits a request payload according to its type's rule:
//   exactly one NUL-terminated string: READ DIRECTORY GET_PERMS MKDIR RM GET_DOMAIN_PATH RELEASE
//     RESUME IS_DOMAIN_INTRODUCED TRANSACTION_START TRANSACTION_END
//   exactly two: WATCH UNWATCH SET_TARGET DIRECTORY_PART;  three: INTRODUCE
//   one or more: SET_PERMS (>= 2: path + perms) CONTROL (>= 1)
//   WRITE: one NUL-terminated path, then the raw value (may be empty, may contain NULs)
//   RESET_WATCHES: anything (ignored)
// Errors: EINVAL for a wrong count or a missing terminator; ENOSYS for an unknown type or a
// type a client may not send (WATCH_EVENT, ERROR).
Expected<Args, Error> split_args(std::uint32_t type, std::string_view payload) noexcept;

// Join strings each with a NUL terminator ("a\0b\0").
std::string join_nul(std::initializer_list<std::string_view> parts);

// Reassembles messages from a byte stream (the domain ring delivers arbitrary fragments).
// Bounded: holds at most one header + kPayloadMax bytes.
class Framer {
 public:
  // Appends bytes; returns how many were consumed (stops after one full message is ready).
  std::size_t feed(std::span<const std::uint8_t> bytes) noexcept;
  bool ready() const noexcept { return ready_; }
  bool violated() const noexcept { return violated_; }
  const Header& header() const noexcept { return hdr_; }
  std::string_view payload() const noexcept {
    return {reinterpret_cast<const char*>(buf_.data()) + kHeaderSize, hdr_.len};
  }
  // Drops the ready message; the next feed() starts a new one.
  void consume() noexcept;
  // The bytes of a message begun but not complete (none once it is ready): a new Framer fed
  // with them is in this one's state (a live update carries them to the next binary).
  std::span<const std::uint8_t> partial() const noexcept {
    if (ready_) return {};
    return {buf_.data(), have_};
  }

 private:
  std::array<std::uint8_t, kHeaderSize + kPayloadMax> buf_{};
  std::size_t have_ = 0;
  Header hdr_{};
  bool ready_ = false;
  bool violated_ = false;
};

}  // namespace xpv::xenbus::wire
