// The domain control socket: server (in the domain process) and client (in dom0 services).
// Protocol: control_protocol.h. See DESIGN.md §1.
//
// Server threading: everything runs on the io_context given to the constructor (the domain
// process's control-plane thread); ControlHandler methods are called only from there.
// Client threading: a ControlClient is a blocking control-plane object for one thread at a time;
// it is not used on data paths (backends get memory, grant frames and eventfds from it once).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "xpv/domain/control_protocol.h"
#include "xpv/domain/memory.h"
#include "xpv/unique_fd.h"

namespace xpv::domain {

struct DomainInfo {
  std::uint16_t domid = 0;
  std::uint16_t nr_vcpus = 0;
  control::DomainKind kind = control::DomainKind::process;
  std::string name;
};

struct GrantTableInfo {
  std::vector<std::uint64_t> gfns;  // frame i of the grant table lives at gfns[i]
  std::uint32_t max_frames = 0;
};

struct XenstoreInfo {
  std::uint64_t gfn = 0;
  std::uint32_t port = 0;
};

// An interdomain event channel as dom0 holds it: the guest's sends make to_dom0 readable (eventfd
// counter); writing from_dom0 makes the guest's port pending.
struct Dom0Binding {
  std::uint32_t port = 0;
  UniqueFd to_dom0;
  UniqueFd from_dom0;
};

// What a domain process implements to serve its control socket. Errors are positive errno values
// (EINVAL for a bad port, EBUSY for a port that is not unbound for dom0, ...).
class ControlHandler {
 public:
  virtual ~ControlHandler() = default;
  virtual DomainInfo info() = 0;
  virtual const DomainMemory& memory() = 0;
  virtual GrantTableInfo grant_table() = 0;
  virtual Expected<Dom0Binding, int> bind_interdomain(std::uint32_t remote_port) = 0;
  virtual Expected<void, int> unbind(std::uint32_t port) = 0;
  // A port of a client whose connection dropped without unbinding it: the client died or exited,
  // maybe in the middle of a notification (EventChannels::dom0_close, owner_gone).
  virtual Expected<void, int> release(std::uint32_t port) { return unbind(port); }
  virtual Expected<XenstoreInfo, int> xenstore() = 0;
  // Starts a domain that was created paused, or one paused since (pause); EALREADY when it runs
  // already (a process domain always runs).
  virtual Expected<void, int> unpause() { return fail(EALREADY); }
  // Stops the domain's vCPUs until unpause (xl pause); its event channels, grants and xenstore
  // ring stay as they are. EALREADY when paused already, EBUSY when its vCPUs did not stop,
  // EOPNOTSUPP where the domain cannot be paused (a process domain).
  virtual Expected<void, int> pause() { return fail(EOPNOTSUPP); }
  // Direct upcalls (direct_upcall.h): the table's memfd and vCPU `vcpu`'s upcall eventfd, both
  // borrowed (the server sends copies). EOPNOTSUPP where the domain has none; ENOENT bad vCPU.
  struct DirectFds {
    std::uint32_t nr_vcpus = 0;
    int table = -1;
    int vcpu = -1;
  };
  virtual Expected<DirectFds, int> direct_upcall(std::uint32_t vcpu) {
    (void)vcpu;
    return fail(EOPNOTSUPP);
  }
  // Each vCPU's host thread id (0 while it has none), in vCPU order. EOPNOTSUPP where the domain
  // has no vCPU threads (a process domain).
  virtual Expected<std::vector<std::uint32_t>, int> vcpu_threads() { return fail(EOPNOTSUPP); }
  // Restricts vCPU `vcpu`'s thread (control::kAllVcpus: every vCPU's) to the host CPUs in `cpus`
  // (bit c % 64 of word c / 64), all or none. ENOENT no such vCPU, EINVAL an empty set or one the
  // kernel refuses, EOPNOTSUPP where the domain has no vCPU threads.
  using CpuMask = std::array<std::uint64_t, control::kCpuMaskWords>;
  virtual Expected<void, int> set_vcpu_affinity(std::uint32_t vcpu, const CpuMask& cpus) {
    (void)vcpu;
    (void)cpus;
    return fail(EOPNOTSUPP);
  }
};

class ControlServer {
 public:
  // Listens on `path` (mode 0600; a stale socket file at `path` is replaced). Throws on failure.
  ControlServer(boost::asio::io_context& io, std::string path, ControlHandler& handler);
  ~ControlServer();  // closes every connection (unbinding their ports) and removes the socket file
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  const std::string& path() const noexcept { return path_; }
  std::size_t connections() const noexcept { return conns_.size(); }

 private:
  struct Connection;
  void accept_next();
  void read_next(const std::shared_ptr<Connection>& c);
  // Returns false when the connection must be closed (protocol violation, I/O error, EOF).
  bool serve_one(Connection& c);
  void close(const std::shared_ptr<Connection>& c);

  boost::asio::io_context& io_;
  std::string path_;
  ControlHandler& handler_;
  boost::asio::posix::stream_descriptor listener_;
  // accept() out of fds or memory: the next try waits this long (the listener stays readable).
  static constexpr int kAcceptRetryMs = 100;
  boost::asio::steady_timer accept_retry_;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);  // a retry already due sees it gone
  std::set<std::shared_ptr<Connection>> conns_;
};

class ControlError : public std::runtime_error {
 public:
  ControlError(int error, const std::string& what) : std::runtime_error(what), error_(error) {}
  int error() const noexcept { return error_; }

 private:
  int error_;
};

class ControlClient {
 public:
  // Connects and says hello as `client_name` acting for dom0. Throws ControlError (or
  // std::system_error for a socket that cannot be reached).
  static ControlClient connect(const std::string& path, const std::string& client_name,
                               int timeout_ms = 5000);

  const DomainInfo& domain() const noexcept { return info_; }
  DomainMemory map_memory();
  GrantTableInfo grant_table();
  Dom0Binding bind_interdomain(std::uint32_t remote_port);
  void unbind(std::uint32_t port);
  XenstoreInfo xenstore();
  void unpause();
  // Stops the domain's vCPUs until unpause (xl pause). Throws ControlError: EALREADY paused
  // already, EBUSY its vCPUs did not stop, EOPNOTSUPP a domain that cannot be paused.
  void pause();
  // vCPU `vcpu`'s part of the domain's direct upcalls: {nr_vcpus, table memfd, upcall eventfd}.
  // Throws ControlError (EOPNOTSUPP: the domain has none).
  struct DirectFds {
    std::uint32_t nr_vcpus = 0;
    UniqueFd table;
    UniqueFd vcpu;
  };
  DirectFds direct_upcall(std::uint32_t vcpu);
  // Each vCPU's host thread id, 0 for one that has no thread (not started yet, or ended).
  // Throws ControlError (EOPNOTSUPP: a domain without vCPU threads).
  std::vector<std::uint32_t> vcpu_threads();
  // Restricts vCPU `vcpu` (control::kAllVcpus: every vCPU) to the host CPUs in `cpus`. Throws
  // ControlError: ENOENT no such vCPU, EINVAL an empty set or one the kernel refuses, EOPNOTSUPP
  // a domain without vCPU threads.
  void set_vcpu_affinity(std::uint32_t vcpu, const ControlHandler::CpuMask& cpus);
  // Readable (EOF) once the domain process is gone: a service may watch it.
  int fd() const noexcept { return sock_.get(); }

 private:
  ControlClient(UniqueFd sock, int timeout_ms) : sock_(std::move(sock)), timeout_ms_(timeout_ms) {}
  // Sends a request and waits for its answer; throws ControlError for an error reply, a timeout,
  // a malformed answer or a closed socket.
  control::Message call(control::MsgType type, std::span<const std::uint8_t> payload,
                        std::vector<UniqueFd>* fds = nullptr);

  UniqueFd sock_;
  int timeout_ms_;
  std::uint32_t seq_ = 0;
  // Ports bound by a bind_interdomain whose answer came only after it timed out: unbound once
  // that answer has been read (by a later call).
  void release_orphans() noexcept;
  std::vector<std::uint32_t> orphans_;
  DomainInfo info_;
};

}  // namespace xpv::domain
