#include "xpv/domain/control_protocol.h"

#include <algorithm>

namespace xpv::domain::control {

const char* to_string(ProtoError e) noexcept {
  switch (e) {
    case ProtoError::truncated: return "truncated message";
    case ProtoError::bad_magic: return "bad magic";
    case ProtoError::bad_version: return "unsupported protocol version";
    case ProtoError::bad_length: return "length field disagrees with the message";
    case ProtoError::unknown_type: return "unknown message type";
    case ProtoError::bad_payload: return "malformed payload";
    case ProtoError::unexpected_fds: return "wrong number of file descriptors";
  }
  return "unknown protocol error";
}

namespace {
bool known_request(std::uint16_t t) noexcept {
  return t >= static_cast<std::uint16_t>(MsgType::hello) &&
         t <= static_cast<std::uint16_t>(MsgType::set_vcpu_affinity);
}
}  // namespace

Expected<Message, ProtoError> parse(std::span<const std::uint8_t> datagram) noexcept {
  if (datagram.size() < sizeof(Header)) return fail(ProtoError::truncated);
  Message m;
  std::memcpy(&m.header, datagram.data(), sizeof(Header));
  if (m.header.magic != kMagic) return fail(ProtoError::bad_magic);
  if (m.header.version != kVersion) return fail(ProtoError::bad_version);
  if (datagram.size() > kMaxMessage || m.header.length != datagram.size() - sizeof(Header)) {
    return fail(ProtoError::bad_length);
  }
  const std::uint16_t t = m.header.type;
  if (t != kErrorType && !known_request(static_cast<std::uint16_t>(t & ~kResponseBit))) {
    return fail(ProtoError::unknown_type);
  }
  auto payload = datagram.subspan(sizeof(Header));
  m.payload.assign(payload.begin(), payload.end());
  return m;
}

Expected<Request, ProtoError> decode_request(const Message& m) noexcept {
  const std::uint16_t t = m.header.type;
  if ((t & kResponseBit) != 0 || !known_request(t)) return fail(ProtoError::unknown_type);
  Request r{static_cast<MsgType>(t), m.header.seq, {}};
  auto take = [&]<class T>(std::type_identity<T>) -> Expected<Request, ProtoError> {
    auto v = decode_fixed<T>(m.payload);
    if (!v) return fail(v.error());
    r.body = *v;
    return r;
  };
  switch (r.type) {
    case MsgType::hello: return take(std::type_identity<HelloRequest>{});
    case MsgType::bind_interdomain: return take(std::type_identity<BindRequest>{});
    case MsgType::unbind: return take(std::type_identity<UnbindRequest>{});
    case MsgType::get_direct_upcall: return take(std::type_identity<DirectUpcallRequest>{});
    case MsgType::set_vcpu_affinity: return take(std::type_identity<VcpuAffinityRequest>{});
    case MsgType::get_memory:
    case MsgType::get_grant_table:
    case MsgType::get_xenstore:
    case MsgType::unpause:
    case MsgType::pause:
    case MsgType::get_vcpu_threads:
      if (!m.payload.empty()) return fail(ProtoError::bad_payload);
      return r;
  }
  return fail(ProtoError::unknown_type);
}

std::size_t fds_for(std::uint16_t wire_type) noexcept {
  if (wire_type == (static_cast<std::uint16_t>(MsgType::get_memory) | kResponseBit)) return 1;
  if (wire_type == (static_cast<std::uint16_t>(MsgType::bind_interdomain) | kResponseBit)) return 2;
  if (wire_type == (static_cast<std::uint16_t>(MsgType::get_direct_upcall) | kResponseBit)) return 2;
  return 0;
}

std::vector<std::uint8_t> encode(std::uint16_t type, std::uint32_t seq,
                                 std::span<const std::uint8_t> payload) {
  Header h{kMagic, kVersion, type, seq, static_cast<std::uint32_t>(payload.size())};
  std::vector<std::uint8_t> out(sizeof(Header) + payload.size());
  std::memcpy(out.data(), &h, sizeof h);
  if (!payload.empty()) std::memcpy(out.data() + sizeof h, payload.data(), payload.size());
  return out;
}

Expected<std::vector<RegionWire>, ProtoError> decode_memory(
    std::span<const std::uint8_t> payload) noexcept {
  if (payload.size() < sizeof(MemoryResponse)) return fail(ProtoError::bad_payload);
  MemoryResponse head;
  std::memcpy(&head, payload.data(), sizeof head);
  if (head.pad != 0 || head.nr_regions == 0 || head.nr_regions > kMaxRegions ||
      payload.size() != sizeof head + std::size_t{head.nr_regions} * sizeof(RegionWire)) {
    return fail(ProtoError::bad_payload);
  }
  std::vector<RegionWire> regions(head.nr_regions);
  std::memcpy(regions.data(), payload.data() + sizeof head, regions.size() * sizeof(RegionWire));
  return regions;
}

std::vector<std::uint8_t> encode_memory(const std::vector<RegionWire>& regions) {
  MemoryResponse head{static_cast<std::uint32_t>(regions.size()), 0};
  std::vector<std::uint8_t> out(sizeof head + regions.size() * sizeof(RegionWire));
  std::memcpy(out.data(), &head, sizeof head);
  if (!regions.empty()) {
    std::memcpy(out.data() + sizeof head, regions.data(), regions.size() * sizeof(RegionWire));
  }
  return out;
}

Expected<GrantTableResponse, ProtoError> decode_grant_table(std::span<const std::uint8_t> payload,
                                                           std::vector<std::uint64_t>& gfns) noexcept {
  if (payload.size() < sizeof(GrantTableResponse)) return fail(ProtoError::bad_payload);
  GrantTableResponse head;
  std::memcpy(&head, payload.data(), sizeof head);
  if (head.max_frames > kMaxGrantFrames || head.nr_frames > head.max_frames ||
      payload.size() != sizeof head + std::size_t{head.nr_frames} * sizeof(std::uint64_t)) {
    return fail(ProtoError::bad_payload);
  }
  gfns.resize(head.nr_frames);
  if (head.nr_frames) {
    std::memcpy(gfns.data(), payload.data() + sizeof head, gfns.size() * sizeof(std::uint64_t));
  }
  return head;
}

std::vector<std::uint8_t> encode_grant_table(std::uint32_t max_frames,
                                             const std::vector<std::uint64_t>& gfns) {
  GrantTableResponse head{static_cast<std::uint32_t>(gfns.size()), max_frames};
  std::vector<std::uint8_t> out(sizeof head + gfns.size() * sizeof(std::uint64_t));
  std::memcpy(out.data(), &head, sizeof head);
  if (!gfns.empty()) {
    std::memcpy(out.data() + sizeof head, gfns.data(), gfns.size() * sizeof(std::uint64_t));
  }
  return out;
}

std::string socket_path(std::uint16_t domid, const std::string& run_dir) {
  return run_dir + "/dom" + std::to_string(domid) + ".sock";
}

Expected<std::vector<std::uint32_t>, ProtoError> decode_vcpu_threads(std::span<const std::uint8_t> payload) noexcept {
  if (payload.size() < sizeof(VcpuThreadsResponse)) return fail(ProtoError::bad_payload);
  VcpuThreadsResponse head;
  std::memcpy(&head, payload.data(), sizeof head);
  if (head.pad != 0 || head.nr_vcpus == 0 || head.nr_vcpus > kMaxVcpuThreads ||
      payload.size() != sizeof head + std::size_t{head.nr_vcpus} * sizeof(std::uint32_t)) {
    return fail(ProtoError::bad_payload);
  }
  std::vector<std::uint32_t> tids(head.nr_vcpus);
  std::memcpy(tids.data(), payload.data() + sizeof head, tids.size() * sizeof(std::uint32_t));
  return tids;
}

std::vector<std::uint8_t> encode_vcpu_threads(const std::vector<std::uint32_t>& tids) {
  VcpuThreadsResponse head{static_cast<std::uint32_t>(tids.size()), 0};
  std::vector<std::uint8_t> out(sizeof head + tids.size() * sizeof(std::uint32_t));
  std::memcpy(out.data(), &head, sizeof head);
  if (!tids.empty()) std::memcpy(out.data() + sizeof head, tids.data(), tids.size() * sizeof(std::uint32_t));
  return out;
}

}  // namespace xpv::domain::control
