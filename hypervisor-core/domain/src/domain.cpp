#include "xpv/domain/domain.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace xpv::domain {

namespace asio = boost::asio;

Domain::Domain(asio::io_context& io, DomainConfig config, UpcallSink& sink)
    : io_(io),
      config_(std::move(config)),
      memory_([&] {
        const std::uint64_t fixed = kFirstGrantGfn + config_.max_grant_frames;
        if (config_.memory_bytes % kPageSize != 0 || (config_.memory_bytes >> kPageShift) <= fixed) {
          throw std::invalid_argument(fmt::format("domain {}: memory {} bytes is not a page multiple above {} pages",
                                                  config_.name, config_.memory_bytes, fixed));
        }
        return DomainMemory::create("xpv-dom" + std::to_string(config_.domid), {{0, config_.memory_bytes}});
      }()) {
  evtchn_ = std::make_unique<EventChannels>(config_.domid, config_.vcpus,
                                            memory_.view().page(kSharedInfoGfn).value(), sink);
  std::vector<std::span<std::uint8_t>> frames;
  for (std::uint32_t i = 0; i < config_.max_grant_frames; ++i) {
    frames.push_back(memory_.view().page(kFirstGrantGfn + i).value());
  }
  grants_ = std::make_unique<gnttab::GrantTable>(std::move(frames), config_.max_grant_frames);
  page_used_.assign(config_.memory_bytes >> kPageShift, false);
  for (std::uint64_t g = 0; g < kFirstGrantGfn + config_.max_grant_frames; ++g) page_used_[g] = true;
  finish_setup();
}

Domain::Domain(asio::io_context& io, DomainConfig config, UpcallSink& sink, DomainMemory memory, HvmLayout layout)
    : io_(io), config_(std::move(config)), memory_(std::move(memory)) {
  xenstore_gfn_ = layout.xenstore_gfn;
  grant_frames_gfn_ = layout.grant_frames_gfn;
  if (!memory_.view().page(xenstore_gfn_)) {
    throw std::invalid_argument(fmt::format("domain {}: xenstore gfn {:#x} is not in the domain's memory", config_.name,
                                            xenstore_gfn_));
  }
  for (std::uint32_t i = 0; i < config_.max_grant_frames; ++i) {
    if (!memory_.view().page(grant_frames_gfn_ + i)) {
      throw std::invalid_argument(fmt::format("domain {}: grant frame {} (gfn {:#x}) is not in the domain's memory",
                                              config_.name, i, grant_frames_gfn_ + i));
    }
  }
  shared_info_placeholder_.assign(kPageSize / sizeof(std::uint64_t), 0);
  evtchn_ = std::make_unique<EventChannels>(
      config_.domid, config_.vcpus,
      std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(shared_info_placeholder_.data()), kPageSize), sink);
  finish_setup();
}

void Domain::finish_setup() {
  auto port = evtchn_->alloc_unbound(0);
  if (!port) throw std::runtime_error(fmt::format("domain {}: no xenstore event channel", config_.name));
  xenstore_port_ = *port;

  std::filesystem::create_directories(config_.run_dir);
  ::chmod(config_.run_dir.c_str(), 0700);
  server_ = std::make_unique<ControlServer>(io_, control::socket_path(config_.domid, config_.run_dir), *this);
}

Domain::~Domain() {
  server_.reset();  // unbinds what dom0 services still hold
  for (auto& [port, sd] : kick_watch_) {
    boost::system::error_code ignored;
    sd->close(ignored);
  }
}

std::optional<std::uint64_t> Domain::alloc_pages(std::uint64_t count) {
  std::lock_guard lock(pages_lock_);
  if (count == 0) return std::nullopt;
  std::uint64_t run = 0;
  for (std::uint64_t g = 0; g < page_used_.size(); ++g) {
    run = page_used_[g] ? 0 : run + 1;
    if (run == count) {
      const std::uint64_t first = g + 1 - count;
      for (std::uint64_t i = first; i <= g; ++i) page_used_[i] = true;
      return first;
    }
  }
  return std::nullopt;
}

void Domain::free_pages(std::uint64_t gfn, std::uint64_t count) {
  std::lock_guard lock(pages_lock_);
  for (std::uint64_t i = gfn; i < gfn + count && i < page_used_.size(); ++i) {
    if (i >= kFirstGrantGfn + config_.max_grant_frames) page_used_[i] = false;
  }
}

DomainInfo Domain::info() {
  return {config_.domid, static_cast<std::uint16_t>(config_.vcpus), config_.kind, config_.name};
}

GrantTableInfo Domain::grant_table() {
  GrantTableInfo g;
  g.max_frames = config_.max_grant_frames;
  for (std::uint32_t i = 0; i < config_.max_grant_frames; ++i) g.gfns.push_back(grant_frames_gfn_ + i);
  return g;
}

Expected<Dom0Binding, int> Domain::bind_interdomain(std::uint32_t remote_port) {
  auto fds = evtchn_->bind_to_dom0(remote_port);
  if (!fds) return fail(static_cast<int>(fds.error()));
  Dom0Binding b;
  b.port = fds->dom0_port;
  b.to_dom0 = std::move(fds->to_dom0);
  b.from_dom0 = std::move(fds->from_dom0);
  try {
    watch_kicks(b.port);
  } catch (const std::exception& e) {
    // No watch, no binding: a port bound without one would never pass the backend's kicks on.
    const auto* sys = dynamic_cast<const std::system_error*>(&e);
    const int error = sys != nullptr && sys->code().category() == std::generic_category() ? sys->code().value() : ENOMEM;
    spdlog::error("dom{}: cannot watch dom0 port {}'s kicks: {}; the bind is undone", config_.domid, b.port,
                  e.what());
    (void)close_endpoint(b.port, /*owner_gone=*/false);
    return fail(error);
  }
  return b;
}

void Domain::watch_kicks(std::uint32_t dom0_port) {
  const int fd = evtchn_->kick_fd(dom0_port);
  if (fd < 0) return;
  UniqueFd copy(::dup(fd));
  if (!copy.valid()) throw std::system_error(errno, std::generic_category(), "dup of the kick eventfd");
  auto sd = std::make_unique<asio::posix::stream_descriptor>(io_, copy.get());
  (void)copy.release();  // the descriptor object owns it now
  auto* raw = sd.get();
  kick_watch_[dom0_port] = std::move(sd);
  // Each wake-up: the backend wrote from_dom0; make the guest's port pending (and upcall).
  struct Waiter {
    Domain* self;
    std::uint32_t port;
    asio::posix::stream_descriptor* sd;
    void operator()(boost::system::error_code ec) const {
      if (ec) return;  // closed by unbind
      spdlog::trace("dom{}: dom0 kicked port {}", self->config_.domid, port);
      (void)self->evtchn_->service_dom0_kick(port);
      sd->async_wait(asio::posix::stream_descriptor::wait_read, *this);
    }
  };
  raw->async_wait(asio::posix::stream_descriptor::wait_read, Waiter{this, dom0_port, raw});
}

Expected<void, int> Domain::unbind(std::uint32_t port) { return close_endpoint(port, /*owner_gone=*/false); }

Expected<void, int> Domain::release(std::uint32_t port) { return close_endpoint(port, /*owner_gone=*/true); }

Expected<void, int> Domain::close_endpoint(std::uint32_t port, bool owner_gone) {
  // A kick the backend wrote before it closed (or died) and the watch has not read yet: the
  // control socket's close can be served first in the same turn of the loop.
  (void)evtchn_->service_dom0_kick(port);
  if (auto it = kick_watch_.find(port); it != kick_watch_.end()) {
    boost::system::error_code ignored;
    it->second->close(ignored);  // before dom0_close: the fd goes away with the endpoint
    kick_watch_.erase(it);
  }
  auto r = evtchn_->dom0_close(port, owner_gone);
  if (!r) return fail(static_cast<int>(r.error()));
  return {};
}

Expected<void, int> Domain::unpause() {
  if (!unpause_ || !unpause_()) return fail(EALREADY);
  return {};
}

Expected<void, int> Domain::pause() {
  if (!pause_) return fail(EOPNOTSUPP);
  return pause_();
}

Expected<std::vector<std::uint32_t>, int> Domain::vcpu_threads() {
  if (!vcpu_threads_) return fail(EOPNOTSUPP);
  return vcpu_threads_();
}

Expected<void, int> Domain::set_vcpu_affinity(std::uint32_t vcpu, const CpuMask& cpus) {
  if (!vcpu_affinity_) return fail(EOPNOTSUPP);
  return vcpu_affinity_(vcpu, cpus);
}

void Domain::enable_direct_upcalls(std::vector<UniqueFd> vcpu_fds, const GuestMemory& spans_from) {
  if (direct_) throw std::logic_error("direct upcalls enabled twice");
  if (vcpu_fds.size() != config_.vcpus) {
    throw std::invalid_argument(fmt::format("domain {}: {} upcall eventfds for {} vCPUs", config_.name,
                                            vcpu_fds.size(), config_.vcpus));
  }
  direct_ = std::make_unique<DirectTable>(config_.vcpus, evtchn_->max_ports());
  direct_fds_ = std::move(vcpu_fds);
  evtchn_->attach_direct(*direct_, spans_from);
}

Expected<ControlHandler::DirectFds, int> Domain::direct_upcall(std::uint32_t vcpu) {
  if (!direct_) return fail(EOPNOTSUPP);
  if (vcpu >= direct_fds_.size()) return fail(ENOENT);
  return DirectFds{static_cast<std::uint32_t>(direct_fds_.size()), direct_->fd(), direct_fds_[vcpu].get()};
}

Expected<XenstoreInfo, int> Domain::xenstore() { return XenstoreInfo{xenstore_gfn_, xenstore_port_}; }

}  // namespace xpv::domain
