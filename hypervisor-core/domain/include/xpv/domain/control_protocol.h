// The domain control socket protocol (DESIGN.md §1): how a dom0 service (xenstored, a backend)
// obtains what a domain process owns — its memory (memfd), its grant-table frames, its xenstore
// ring, and interdomain event channels (as eventfds).
//
// Transport: an AF_UNIX SOCK_SEQPACKET socket, root-only, /run/xpv/dom<N>.sock. One datagram per
// message; file descriptors ride along with SCM_RIGHTS. Every message starts with Header; the
// payload is one of the fixed structs below (native byte order: both ends are on one host).
// A request carries type T; its answer carries T | kResponseBit, or kErrorType with ErrorPayload.
// Both are matched by seq. Every field is validated on receipt; a message that does not parse
// closes the connection (the peer is broken or hostile), an op that fails gets an error reply.
//
//   request                       response payload                         fds in response
//   hello(HelloRequest)           HelloResponse                            -
//   get_memory()                  MemoryResponse + nr_regions x RegionWire  memfd
//   get_grant_table()             GrantTableResponse + nr_frames x u64 gfn  -
//   bind_interdomain(BindRequest) BindResponse                             to_dom0, from_dom0
//   unbind(UnbindRequest)         (empty)                                  -
//   get_xenstore()                XenstoreResponse                         -
//   unpause()                     (empty)                                  -
//   pause()                       (empty)                                  -
//   get_direct_upcall(DirectUpcallRequest)
//                                 DirectUpcallResponse                     table memfd, the
//                                                                          vCPU's upcall eventfd
//     (direct_upcall.h; a domain without direct upcalls answers EOPNOTSUPP)
//   get_vcpu_threads()            VcpuThreadsResponse + nr_vcpus x u32 tid  -
//     (each vCPU's host thread id, 0 while it has none; a domain without vCPU threads — a
//     process domain — answers EOPNOTSUPP)
//   set_vcpu_affinity(VcpuAffinityRequest)
//                                 (empty)                                  -
//     (the vCPU's — or with kAllVcpus every vCPU's — thread restricted to those host CPUs, all
//     or none: ENOENT no such vCPU, EINVAL an empty set or one the kernel refuses, EOPNOTSUPP a
//     process domain)
//
// Ports bound by a connection are unbound when it closes: a backend that dies leaves the guest's
// ports unbound again (as Xen does when a domain closes its end), so a restarted backend can bind
// them anew without the guest noticing more than a pause.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "xpv/expected.h"

namespace xpv::domain::control {

inline constexpr std::uint32_t kMagic = 0x44565058;  // "XPVD" little endian
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::uint16_t kResponseBit = 0x8000;
inline constexpr std::uint16_t kErrorType = 0xffff;
inline constexpr std::size_t kMaxMessage = 64 * 1024;
inline constexpr std::size_t kMaxFds = 4;
inline constexpr std::uint32_t kMaxRegions = 64;
inline constexpr std::uint32_t kMaxGrantFrames = 4096;
inline constexpr std::uint32_t kMaxVcpuThreads = 4096;
inline constexpr std::uint32_t kAllVcpus = 0xffffffff;  // VcpuAffinityRequest::vcpu: every vCPU
inline constexpr std::size_t kCpuMaskWords = 16;        // 1024 host CPUs

enum class MsgType : std::uint16_t {
  hello = 1,
  get_memory = 2,
  get_grant_table = 3,
  bind_interdomain = 4,
  unbind = 5,
  get_xenstore = 6,
  unpause = 7,  // no payload, empty answer: a domain created paused starts running (xl unpause)
  get_direct_upcall = 8,  // DirectUpcallRequest → DirectUpcallResponse + the table, the vCPU's eventfd
  pause = 9,  // no payload, empty answer: the domain's vCPUs stop until unpause (xl pause)
  get_vcpu_threads = 10,  // no payload → VcpuThreadsResponse + tids (xl vcpu-list)
  set_vcpu_affinity = 11,  // VcpuAffinityRequest → empty answer (xl vcpu-pin)
};

enum class DomainKind : std::uint32_t { hvm = 0, process = 1 };

struct Header {
  std::uint32_t magic;    // 0x0
  std::uint16_t version;  // 0x4
  std::uint16_t type;     // 0x6: MsgType, | kResponseBit, or kErrorType
  std::uint32_t seq;      // 0x8: chosen by the requester, echoed in the answer
  std::uint32_t length;   // 0xc: payload bytes after the header
};
static_assert(std::is_standard_layout_v<Header> && sizeof(Header) == 16);

struct HelloRequest {
  std::uint16_t client_domid;  // 0x0: the domain the service acts as (0 for dom0 services)
  std::uint16_t pad0;          // 0x2
  std::uint32_t pad1;          // 0x4
  char client_name[32];        // 0x8: NUL-terminated, for the domain's log
};
static_assert(std::is_standard_layout_v<HelloRequest> && sizeof(HelloRequest) == 40);

struct HelloResponse {
  std::uint16_t domid;     // 0x0
  std::uint16_t nr_vcpus;  // 0x2
  std::uint32_t kind;      // 0x4: DomainKind
  char name[64];           // 0x8: NUL-terminated domain name
};
static_assert(std::is_standard_layout_v<HelloResponse> && sizeof(HelloResponse) == 72);

struct RegionWire {
  std::uint64_t gpa;     // 0x0
  std::uint64_t size;    // 0x8
  std::uint64_t offset;  // 0x10: offset in the memfd
};
static_assert(std::is_standard_layout_v<RegionWire> && sizeof(RegionWire) == 24);

struct MemoryResponse {
  std::uint32_t nr_regions;  // 0x0: followed by nr_regions RegionWire
  std::uint32_t pad;         // 0x4
};
static_assert(std::is_standard_layout_v<MemoryResponse> && sizeof(MemoryResponse) == 8);

struct GrantTableResponse {
  std::uint32_t nr_frames;   // 0x0: followed by nr_frames uint64 gfns, in grant-frame order
  std::uint32_t max_frames;  // 0x4
};
static_assert(std::is_standard_layout_v<GrantTableResponse> && sizeof(GrantTableResponse) == 8);

struct BindRequest {
  std::uint32_t remote_port;  // 0x0: the domain's port, unbound for dom0
  std::uint32_t pad;          // 0x4
};
static_assert(std::is_standard_layout_v<BindRequest> && sizeof(BindRequest) == 8);

struct BindResponse {
  std::uint32_t port;  // 0x0: the dom0-side port number (for unbind and logs)
  std::uint32_t pad;   // 0x4
};
static_assert(std::is_standard_layout_v<BindResponse> && sizeof(BindResponse) == 8);

struct UnbindRequest {
  std::uint32_t port;  // 0x0: as returned by bind
  std::uint32_t pad;   // 0x4
};
static_assert(std::is_standard_layout_v<UnbindRequest> && sizeof(UnbindRequest) == 8);

struct XenstoreResponse {
  std::uint64_t gfn;   // 0x0: frame of the xenstore_domain_interface page
  std::uint32_t port;  // 0x8: the domain's xenstore event channel (unbound for dom0)
  std::uint32_t pad;   // 0xc
};
static_assert(std::is_standard_layout_v<XenstoreResponse> && sizeof(XenstoreResponse) == 16);

struct DirectUpcallRequest {
  std::uint32_t vcpu;  // 0x0
  std::uint32_t pad;   // 0x4
};
static_assert(std::is_standard_layout_v<DirectUpcallRequest> && sizeof(DirectUpcallRequest) == 8);

struct DirectUpcallResponse {
  std::uint32_t nr_vcpus;  // 0x0
  std::uint32_t pad;       // 0x4
};
static_assert(std::is_standard_layout_v<DirectUpcallResponse> && sizeof(DirectUpcallResponse) == 8);

struct VcpuThreadsResponse {
  std::uint32_t nr_vcpus;  // 0x0: followed by nr_vcpus uint32 thread ids, in vCPU order
  std::uint32_t pad;       // 0x4
};
static_assert(std::is_standard_layout_v<VcpuThreadsResponse> && sizeof(VcpuThreadsResponse) == 8);

struct VcpuAffinityRequest {
  std::uint32_t vcpu;                   // 0x0: a vCPU, or kAllVcpus
  std::uint32_t pad;                    // 0x4
  std::uint64_t cpus[kCpuMaskWords];    // 0x8: bit c % 64 of word c / 64 = host CPU c
};
static_assert(std::is_standard_layout_v<VcpuAffinityRequest> && sizeof(VcpuAffinityRequest) == 136);

struct ErrorPayload {
  std::int32_t error;  // 0x0: a positive errno value
  std::uint32_t pad;   // 0x4
  char message[120];   // 0x8: NUL-terminated
};
static_assert(std::is_standard_layout_v<ErrorPayload> && sizeof(ErrorPayload) == 128);

enum class ProtoError {
  truncated,        // shorter than a header, or than the payload its type needs
  bad_magic,
  bad_version,
  bad_length,       // header.length disagrees with the datagram
  unknown_type,
  bad_payload,      // counts out of range, trailing bytes, non-NUL-terminated strings, ...
  unexpected_fds,   // fds attached where the type carries none (or too few where it needs some)
};
const char* to_string(ProtoError e) noexcept;

// A received message: the header and the payload bytes (already length-checked).
struct Message {
  Header header{};
  std::vector<std::uint8_t> payload;
};

// Checks magic, version, length and that `type` is known (as a request, a response or an error).
Expected<Message, ProtoError> parse(std::span<const std::uint8_t> datagram) noexcept;

// Number of fds a message of this (wire) type must carry.
std::size_t fds_for(std::uint16_t wire_type) noexcept;

// Builds one datagram.
std::vector<std::uint8_t> encode(std::uint16_t type, std::uint32_t seq,
                                 std::span<const std::uint8_t> payload);

template <class T>
std::span<const std::uint8_t> bytes_of(const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  return {reinterpret_cast<const std::uint8_t*>(&v), sizeof(T)};
}

// A fixed char array holds a NUL within its size.
template <std::size_t N>
bool nul_terminated(const char (&s)[N]) noexcept {
  return std::memchr(s, 0, N) != nullptr;
}

// The field checks every fixed payload passes on receipt, in either direction: padding is zero
// (so that a later version may give it a meaning) and strings end within their arrays.
inline bool well_formed(const HelloRequest& v) noexcept {
  return v.pad0 == 0 && v.pad1 == 0 && nul_terminated(v.client_name);
}
inline bool well_formed(const HelloResponse& v) noexcept { return nul_terminated(v.name); }
inline bool well_formed(const BindRequest& v) noexcept { return v.pad == 0; }
inline bool well_formed(const BindResponse& v) noexcept { return v.pad == 0; }
inline bool well_formed(const UnbindRequest& v) noexcept { return v.pad == 0; }
inline bool well_formed(const XenstoreResponse& v) noexcept { return v.pad == 0; }
inline bool well_formed(const DirectUpcallRequest& v) noexcept { return v.pad == 0; }
inline bool well_formed(const DirectUpcallResponse& v) noexcept { return v.pad == 0; }
inline bool well_formed(const VcpuAffinityRequest& v) noexcept { return v.pad == 0; }
inline bool well_formed(const ErrorPayload& v) noexcept {
  return v.error > 0 && v.pad == 0 && nul_terminated(v.message);
}

// A fixed-size payload: exactly sizeof(T) bytes, copied out, and well_formed.
template <class T>
Expected<T, ProtoError> decode_fixed(std::span<const std::uint8_t> payload) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  if (payload.size() != sizeof(T)) return fail(ProtoError::bad_payload);
  T v;
  std::memcpy(&v, payload.data(), sizeof(T));
  if (!well_formed(v)) return fail(ProtoError::bad_payload);
  return v;
}

// A request as the server acts on it: its payload decoded and checked for its type (none for
// get_memory, get_grant_table, get_xenstore and unpause). A response or error type, or a payload
// that does not fit the type, is a message that does not parse: it closes the connection whether
// or not the client said hello.
struct Request {
  MsgType type{};
  std::uint32_t seq = 0;
  std::variant<std::monostate, HelloRequest, BindRequest, UnbindRequest, DirectUpcallRequest, VcpuAffinityRequest> body;
};
Expected<Request, ProtoError> decode_request(const Message& m) noexcept;

// Variable payloads: a fixed head then `count` items, nothing after them.
Expected<std::vector<RegionWire>, ProtoError> decode_memory(
    std::span<const std::uint8_t> payload) noexcept;
std::vector<std::uint8_t> encode_memory(const std::vector<RegionWire>& regions);
Expected<GrantTableResponse, ProtoError> decode_grant_table(std::span<const std::uint8_t> payload,
                                                           std::vector<std::uint64_t>& gfns) noexcept;
std::vector<std::uint8_t> encode_grant_table(std::uint32_t max_frames,
                                             const std::vector<std::uint64_t>& gfns);
Expected<std::vector<std::uint32_t>, ProtoError> decode_vcpu_threads(std::span<const std::uint8_t> payload) noexcept;
std::vector<std::uint8_t> encode_vcpu_threads(const std::vector<std::uint32_t>& tids);

template <std::size_t N>
void copy_string(char (&dst)[N], const std::string& src) noexcept {
  std::memset(dst, 0, N);
  std::memcpy(dst, src.data(), std::min(src.size(), N - 1));
}

// The path of domain N's control socket under `run_dir` (default /run/xpv).
std::string socket_path(std::uint16_t domid, const std::string& run_dir = "/run/xpv");

}  // namespace xpv::domain::control
