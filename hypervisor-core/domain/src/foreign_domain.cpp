#include "xpv/domain/foreign_domain.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string_view>

namespace xpv::domain {

ForeignDomain ForeignDomain::connect(std::uint16_t domid, const std::string& client_name,
                                     const std::string& run_dir) {
  ControlClient client = ControlClient::connect(control::socket_path(domid, run_dir), client_name);
  if (client.domain().domid != domid) {
    throw ControlError(EPROTO, fmt::format("{}: the domain there says it is {}",
                                           control::socket_path(domid, run_dir), client.domain().domid));
  }
  DomainMemory memory = client.map_memory();
  ForeignDomain d(std::move(client), std::move(memory));
  d.refresh_grant_frames();
  d.connect_direct(control::socket_path(domid, run_dir), client_name);
  return d;
}

ForeignDomain::~ForeignDomain() {
  if (!direct_) return;
  try {
    spdlog::info("dom{}: direct upcalls: {} notifications delivered, {} interrupts raised, {} through the domain",
                 domid(), direct_->delivered(), direct_->interrupts(), direct_->declined());
  } catch (...) {
  }
}

void ForeignDomain::connect_direct(const std::string& path, const std::string& client_name) {
  // XPV_DIRECT_UPCALL=0: every notification through the domain's event loop (measurements).
  if (const char* env = std::getenv("XPV_DIRECT_UPCALL"); env != nullptr && std::string_view(env) == "0") return;
  try {
    // On a connection of its own: a domain process older than the request closes the connection
    // that sent it (an unknown message type), and this one must survive that.
    ControlClient probe = ControlClient::connect(path, client_name + " (direct upcalls)");
    std::vector<UniqueFd> vcpu_fds;
    UniqueFd table;
    const std::uint32_t n = client_.domain().nr_vcpus;
    for (std::uint32_t v = 0; v < n; ++v) {
      auto f = probe.direct_upcall(v);
      if (f.nr_vcpus != n) throw ControlError(EPROTO, fmt::format("{} vCPUs in the direct upcall answer, {} in hello", f.nr_vcpus, n));
      if (v == 0) table = std::move(f.table);
      vcpu_fds.push_back(std::move(f.vcpu));
    }
    direct_ = std::make_shared<DirectUpcall>(std::move(table), std::move(vcpu_fds), UniqueFd(::dup(memory_.fd())),
                                             memory_.layout());
    spdlog::info("dom{}: direct upcalls ({} vCPUs): notifications raise the guest's upcall from this process", domid(), n);
  } catch (const ControlError& e) {
    if (e.error() != EOPNOTSUPP) spdlog::warn("dom{}: no direct upcalls: {}", domid(), e.what());
  } catch (const std::exception& e) {
    spdlog::warn("dom{}: no direct upcalls: {}", domid(), e.what());
  }
}

std::size_t ForeignDomain::refresh_grant_frames() {
  GrantTableInfo g = client_.grant_table();
  std::vector<std::span<std::uint8_t>> frames;
  frames.reserve(g.gfns.size());
  for (std::size_t i = 0; i < g.gfns.size(); ++i) {
    auto page = memory_.view().page(g.gfns[i]);
    if (!page) {
      throw ControlError(EPROTO, fmt::format("dom{}: grant frame {} at gfn {:#x} is outside its memory",
                                             domid(), i, g.gfns[i]));
    }
    frames.push_back(*page);
  }
  frames_ = std::move(frames);
  return frames_.size();
}

std::unique_ptr<gnttab::GrantMapper> ForeignDomain::make_mapper(gnttab::DomId self,
                                                                std::size_t max_handles) const {
  return std::make_unique<gnttab::GrantMapper>(self, domid(), frames_, memory_.view(), max_handles);
}

std::unique_ptr<Dom0Port> ForeignDomain::bind(std::uint32_t remote_port, std::uint32_t* dom0_port) {
  Dom0Binding b = client_.bind_interdomain(remote_port);
  if (dom0_port) *dom0_port = b.port;
  return std::make_unique<Dom0Port>(std::move(b.to_dom0), std::move(b.from_dom0), direct_, b.port);
}

void ForeignDomain::unbind(std::uint32_t dom0_port) { client_.unbind(dom0_port); }

}  // namespace xpv::domain
