// Console — where the COM1 UART's bytes go, and where typed bytes come from:
//   stdio          output to stdout, input from stdin (when stdin is readable; EOF ends input)
//   socket:PATH    a unix stream socket (`xpv console` attaches to it): one client at a time;
//                  output goes to the attached client, the last 64 KiB are kept and replayed to
//                  a client that attaches later. The guest never waits for a client: one whose
//                  4 MiB socket buffer is full (it reads nothing, or falls that far behind) or
//                  that is gone is let go (no SIGPIPE), and the
//                  next one gets the backlog; a client that hangs up while the guest reads none
//                  of its typing is let go too.
// Threads: write() is called by vCPU threads (under the UART lock); one input thread polls the
// input side every 100 ms so stop() returns promptly. Lock order: uart → console.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "xpv/kvm/fd.h"

namespace xpv::kvm {

class Console {
 public:
  using Input = std::function<std::size_t(std::span<const std::uint8_t>)>;  // returns bytes taken

  // spec: "stdio" or "socket:PATH". Throws std::runtime_error on a bad spec or socket error.
  explicit Console(const std::string& spec);
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  // Also append every output byte to a file (xenconsoled's guest log). Setup only. A guest
  // printing in a loop must not fill the host's disk: past `max_bytes` the file is moved to
  // PATH.1 (replacing the one before) and a new one started — at most twice that is kept.
  static constexpr std::uint64_t kLogMaxBytes = 32ull << 20;
  void set_log(const std::string& path, std::uint64_t max_bytes = kLogMaxBytes);
  void write(std::span<const std::uint8_t> bytes) noexcept;
  void start_input(Input sink);
  void stop() noexcept;

 private:
  void input_loop() noexcept;

  bool socket_mode_ = false;
  std::string path_;
  UniqueFd listen_fd_;
  UniqueFd log_;
  std::string log_path_;
  std::uint64_t log_max_ = kLogMaxBytes, log_bytes_ = 0;  // under log_mu_
  std::mutex log_mu_;
  std::mutex mu_;          // client_ and backlog_
  UniqueFd client_;
  std::string backlog_;
  Input sink_;
  std::atomic<bool> stopping_{false};
  std::thread input_;
};

}  // namespace xpv::kvm
