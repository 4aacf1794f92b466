// ForeignDomain — everything a dom0 service sees of a domain (DESIGN.md §2): its memory, its
// grant table, its interdomain event channels and its xenstore ring. Backends see domains only
// through this class; whether the domain is an HVM guest under xpv-vmm or a process domain
// (xpv-front) is invisible here (the layering test).
//
// Built on the domain control socket (control.h): connect() says hello, maps the domain's memfd
// and looks up its grant-table frames. A GrantMapper made by make_mapper() belongs to the thread
// that uses it (one per device queue: see grant-table/'s single-mapper rule).
//
// Threading: control-plane object; one thread at a time. The GuestMemory view and the frame
// spans may be used from any thread while the ForeignDomain lives.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "xpv/domain/control.h"
#include "xpv/domain/direct_upcall.h"
#include "xpv/domain/dom0_port.h"
#include "xpv/domain/memory.h"
#include "xpv/gnttab/mapper.h"

namespace xpv::domain {

class ForeignDomain {
 public:
  // Connects to /run/xpv/dom<domid>.sock (or under `run_dir`). Throws ControlError or
  // std::system_error with the socket path in the message.
  static ForeignDomain connect(std::uint16_t domid, const std::string& client_name,
                               const std::string& run_dir = "/run/xpv");

  ForeignDomain(ForeignDomain&&) noexcept = default;
  ForeignDomain& operator=(ForeignDomain&&) noexcept = default;
  ~ForeignDomain();  // logs what its direct upcalls did

  std::uint16_t domid() const noexcept { return client_.domain().domid; }
  const DomainInfo& info() const noexcept { return client_.domain(); }
  const GuestMemory& memory() const noexcept { return memory_.view(); }
  // Scattered pages of the domain mapped back to back (multi-page rings): DomainMemory's.
  ContiguousMapping map_contiguous(std::span<const std::uint64_t> gfns) const {
    return memory_.map_contiguous(gfns);
  }

  // Asks the domain again for its grant-table frames (a guest adds frames as it grows its
  // table); returns how many there are now. Throws ControlError on a frame outside its memory.
  std::size_t refresh_grant_frames();
  const std::vector<std::span<std::uint8_t>>& grant_frames() const noexcept { return frames_; }

  // A mapper of this domain's grants for mapping domain `self` (0: dom0 services).
  std::unique_ptr<gnttab::GrantMapper> make_mapper(gnttab::DomId self = 0,
                                                   std::size_t max_handles = gnttab::GrantMapper::kDefaultMaxHandles) const;

  // Binds the domain's port `remote_port` (unbound for dom0) and returns dom0's end (which
  // delivers through direct() where there is one).
  std::unique_ptr<Dom0Port> bind(std::uint32_t remote_port, std::uint32_t* dom0_port = nullptr);
  void unbind(std::uint32_t dom0_port);

  XenstoreInfo xenstore() { return client_.xenstore(); }

  // Becomes readable (EOF) when the domain process goes away.
  int death_fd() const noexcept { return client_.fd(); }

  // The domain's direct upcalls (direct_upcall.h), shared by every port bind() returns; null
  // where the domain offers none (a process domain) or XPV_DIRECT_UPCALL=0 is set.
  const std::shared_ptr<DirectUpcall>& direct() const noexcept { return direct_; }

 private:
  ForeignDomain(ControlClient client, DomainMemory memory)
      : client_(std::move(client)), memory_(std::move(memory)) {}

  void connect_direct(const std::string& path, const std::string& client_name);

  ControlClient client_;
  DomainMemory memory_;
  std::vector<std::span<std::uint8_t>> frames_;
  std::shared_ptr<DirectUpcall> direct_;
};

}  // namespace xpv::domain
