#include "xpv/domain/foreign_domain.h"

#include <fmt/core.h>

#include <cerrno>

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
  return d;
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
  return std::make_unique<Dom0Port>(std::move(b.to_dom0), std::move(b.from_dom0));
}

void ForeignDomain::unbind(std::uint32_t dom0_port) { client_.unbind(dom0_port); }

}  // namespace xpv::domain
