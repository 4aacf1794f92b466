// One datagram with file descriptors over an AF_UNIX SOCK_SEQPACKET socket (SCM_RIGHTS).
// Received fds are always owned (UniqueFd) and close-on-exec; a datagram or its control data that
// does not fit is an error, and any fds that did arrive with it are closed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "xpv/unique_fd.h"
#include "xpv/expected.h"

namespace xpv::domain {

struct Datagram {
  std::vector<std::uint8_t> bytes;
  std::vector<UniqueFd> fds;
};

// Returns 0-byte datagram with no fds at orderly EOF (peer closed); errno-style error otherwise.
// `max_bytes` and `max_fds` bound what is accepted.
Expected<Datagram, std::error_code> recv_datagram(int sock, std::size_t max_bytes,
                                                  std::size_t max_fds) noexcept;

// Sends one datagram; the fds are duplicated into the peer (the caller keeps its own).
Expected<void, std::error_code> send_datagram(int sock, std::span<const std::uint8_t> bytes,
                                              std::span<const int> fds = {}) noexcept;

// Setup helpers (throw std::system_error).
UniqueFd listen_seqpacket(const std::string& path, int backlog = 16);  // mode 0600
UniqueFd connect_seqpacket(const std::string& path);

// Waits up to timeout_ms for `sock` to become readable: true if readable, false on timeout.
Expected<bool, std::error_code> wait_readable(int sock, int timeout_ms) noexcept;

// uid of the process at the other end of a unix socket.
Expected<unsigned, std::error_code> peer_uid(int sock) noexcept;

}  // namespace xpv::domain
