#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "xpv/domain/control.h"
#include "xpv/domain/seqpacket.h"

namespace xpv::domain {

using namespace control;

ControlClient ControlClient::connect(const std::string& path, const std::string& client_name,
                                     int timeout_ms) {
  ControlClient c(connect_seqpacket(path), timeout_ms);
  HelloRequest req{};
  req.client_domid = 0;
  copy_string(req.client_name, client_name);
  Message m = c.call(MsgType::hello, bytes_of(req));
  auto r = decode_fixed<HelloResponse>(m.payload);
  if (!r || r->kind > static_cast<std::uint32_t>(DomainKind::process)) {
    throw ControlError(EPROTO, path + ": malformed hello answer");
  }
  c.info_ = {r->domid, r->nr_vcpus, static_cast<DomainKind>(r->kind), r->name};
  return c;
}

Message ControlClient::call(MsgType type, std::span<const std::uint8_t> payload,
                            std::vector<UniqueFd>* fds) {
  release_orphans();
  const std::uint32_t seq = ++seq_;
  const auto wire_type = static_cast<std::uint16_t>(type);
  auto out = encode(wire_type, seq, payload);
  if (auto s = send_datagram(sock_.get(), out); !s) {
    throw ControlError(s.error().value(), "control socket send: " + s.error().message());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    auto ready = wait_readable(sock_.get(), static_cast<int>(std::max<std::int64_t>(left, 0)));
    if (!ready || !*ready) {
      throw ControlError(ETIMEDOUT, fmt::format("control socket: no answer within {} ms", timeout_ms_));
    }
    auto d = recv_datagram(sock_.get(), kMaxMessage, kMaxFds);
    if (!d) throw ControlError(d.error().value(), "control socket receive: " + d.error().message());
    if (d->bytes.empty()) throw ControlError(ECONNRESET, "control socket: the domain went away");
    auto m = parse(d->bytes);
    if (!m) throw ControlError(EPROTO, std::string("control socket: ") + to_string(m.error()));
    if (m->header.seq != seq) {
      // The late answer to a call that timed out (an earlier seq) is dropped with its fds; a
      // bind it reports is undone once this call's own answer is in. Anything else (a later
      // seq) is a broken server.
      const auto behind = static_cast<std::int32_t>(seq - m->header.seq);
      if (behind <= 0) throw ControlError(EPROTO, "control socket: answer to another request");
      if (m->header.type == (static_cast<std::uint16_t>(MsgType::bind_interdomain) | kResponseBit)) {
        if (auto b = decode_fixed<BindResponse>(m->payload)) orphans_.push_back(b->port);
      }
      continue;
    }
    release_orphans();  // this call's answer is in hand: the socket is free for the unbinds
    if (m->header.type == kErrorType) {
      auto e = decode_fixed<ErrorPayload>(m->payload);
      if (!e) {
        throw ControlError(EPROTO, "control socket: malformed error answer");
      }
      throw ControlError(e->error, e->message);
    }
    const std::uint16_t expect = wire_type | kResponseBit;
    if (m->header.type != expect || d->fds.size() != fds_for(expect)) {
      throw ControlError(EPROTO, "control socket: unexpected answer type or fds");
    }
    if (fds) *fds = std::move(d->fds);
    return std::move(*m);
  }
}

void ControlClient::release_orphans() noexcept {
  // A bind that timed out but was done all the same: its port is released as soon as its late
  // answer has been seen.
  while (!orphans_.empty()) {
    const std::uint32_t port = orphans_.back();
    orphans_.pop_back();
    try {
      unbind(port);
    } catch (const std::exception&) {
      // The connection is failing; the domain releases the port when it closes.
    }
  }
}

DomainMemory ControlClient::map_memory() {
  std::vector<UniqueFd> fds;
  Message m = call(MsgType::get_memory, {}, &fds);
  auto regions = decode_memory(m.payload);
  if (!regions) throw ControlError(EPROTO, "control socket: malformed memory map");
  std::vector<MemoryRegion> layout;
  for (const RegionWire& r : *regions) layout.push_back({r.gpa, r.size, r.offset});
  return DomainMemory::attach(std::move(fds.at(0)), std::move(layout));
}

GrantTableInfo ControlClient::grant_table() {
  Message m = call(MsgType::get_grant_table, {});
  GrantTableInfo g;
  auto head = decode_grant_table(m.payload, g.gfns);
  if (!head) throw ControlError(EPROTO, "control socket: malformed grant-table answer");
  g.max_frames = head->max_frames;
  return g;
}

Dom0Binding ControlClient::bind_interdomain(std::uint32_t remote_port) {
  BindRequest req{remote_port, 0};
  std::vector<UniqueFd> fds;
  Message m = call(MsgType::bind_interdomain, bytes_of(req), &fds);
  auto r = decode_fixed<BindResponse>(m.payload);
  if (!r) throw ControlError(EPROTO, "control socket: malformed bind answer");
  return {r->port, std::move(fds.at(0)), std::move(fds.at(1))};
}

void ControlClient::unbind(std::uint32_t port) {
  UnbindRequest req{port, 0};
  Message m = call(MsgType::unbind, bytes_of(req));
  if (!m.payload.empty()) throw ControlError(EPROTO, "control socket: malformed unbind answer");
}

void ControlClient::unpause() { (void)call(MsgType::unpause, {}); }
void ControlClient::pause() { (void)call(MsgType::pause, {}); }

std::vector<std::uint32_t> ControlClient::vcpu_threads() {
  Message m = call(MsgType::get_vcpu_threads, {});
  auto tids = decode_vcpu_threads(m.payload);
  // One id per vCPU the domain said it has at hello: a count that is not is a broken server.
  if (!tids || tids->size() != info_.nr_vcpus) throw ControlError(EPROTO, "control socket: malformed vCPU threads answer");
  return std::move(*tids);
}

void ControlClient::set_vcpu_affinity(std::uint32_t vcpu, const ControlHandler::CpuMask& cpus) {
  VcpuAffinityRequest req{vcpu, 0, {}};
  std::copy(cpus.begin(), cpus.end(), req.cpus);
  Message m = call(MsgType::set_vcpu_affinity, bytes_of(req));
  if (!m.payload.empty()) throw ControlError(EPROTO, "control socket: malformed vCPU affinity answer");
}

ControlClient::DirectFds ControlClient::direct_upcall(std::uint32_t vcpu) {
  DirectUpcallRequest req{vcpu, 0};
  std::vector<UniqueFd> fds;
  Message m = call(MsgType::get_direct_upcall, bytes_of(req), &fds);
  auto r = decode_fixed<DirectUpcallResponse>(m.payload);
  if (!r || r->nr_vcpus == 0 || vcpu >= r->nr_vcpus) {
    throw ControlError(EPROTO, "control socket: malformed direct upcall answer");
  }
  return {r->nr_vcpus, std::move(fds.at(0)), std::move(fds.at(1))};
}

XenstoreInfo ControlClient::xenstore() {
  Message m = call(MsgType::get_xenstore, {});
  auto r = decode_fixed<XenstoreResponse>(m.payload);
  if (!r) throw ControlError(EPROTO, "control socket: malformed xenstore answer");
  return {r->gfn, r->port};
}

}  // namespace xpv::domain
