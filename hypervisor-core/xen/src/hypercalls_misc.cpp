// xen_version, sched_op and console_io (platform.h; the table is in hypervisor-core/README.md).
// vCPU thread of the caller.
#include <fmt/core.h>

#include <chrono>
#include <thread>

#include "guest_copy.h"
#include "xpv/xen/platform.h"

namespace xpv::xen {

using namespace detail;

namespace {

// SCHEDOP_poll waits at most this long (there is no Xen system time to honour its timeout; pv
// spinlocks and other callers re-check their condition and poll again).
constexpr auto kPollMaxWait = std::chrono::milliseconds(1);
constexpr auto kPollInterval = std::chrono::microseconds(20);
constexpr unsigned kPollMaxRounds = 100;  // bounds the loop even if sleeps return early

}  // namespace

std::int64_t Platform::xen_version(std::uint64_t cmd, std::uint64_t arg, GuestVirt& mem) {
  switch (cmd) {
    case abi::kXenverVersion:
      return static_cast<std::int64_t>(cfg_.version_major) << 16 | cfg_.version_minor;
    case abi::kXenverExtraversion:
      return copy_out(mem, arg, padded<abi::kExtraversionLen>(kExtraVersion)) ? 0 : err(XenErrno::efault);
    case abi::kXenverCompileInfo: {
      abi::CompileInfo ci{};
      const auto compiler = padded<sizeof ci.compiler>("xpv: Xen HVM ABI on KVM, not Xen");
      const auto by = padded<sizeof ci.compile_by>("xpv");
      std::memcpy(ci.compiler, compiler.data(), sizeof ci.compiler);
      std::memcpy(ci.compile_by, by.data(), sizeof ci.compile_by);
      return copy_out(mem, arg, ci) ? 0 : err(XenErrno::efault);
    }
    case abi::kXenverCapabilities:
      return copy_out(mem, arg, padded<abi::kCapabilitiesLen>(kCapabilities))
                 ? 0
                 : err(XenErrno::efault);
    case abi::kXenverChangeset:
      return copy_out(mem, arg, padded<abi::kChangesetLen>("xpv (no Xen changeset)"))
                 ? 0
                 : err(XenErrno::efault);
    case abi::kXenverPlatformParameters:
      // No hypervisor hole in an HVM guest's address space.
      return copy_out(mem, arg, abi::PlatformParameters{0}) ? 0 : err(XenErrno::efault);
    case abi::kXenverGetFeatures: {
      abi::FeatureInfo fi{};
      if (!copy_in(mem, arg, fi)) return err(XenErrno::efault);
      if (fi.submap_idx >= abi::kFeatNrSubmaps) return err(XenErrno::einval);
      fi.submap = 1u << abi::kFeatAutoTranslatedPhysmap;
      if (cfg_.upcall != UpcallMode::intx) fi.submap |= 1u << abi::kFeatHvmCallbackVector;
      return copy_out(mem, arg, fi) ? 0 : err(XenErrno::efault);
    }
    case abi::kXenverPagesize:
      return 4096;
    case abi::kXenverGuestHandle:
      return copy_out(mem, arg, std::array<std::uint8_t, abi::kDomainHandleLen>{})
                 ? 0
                 : err(XenErrno::efault);
    default:
      log_unsupported("xen_version", cmd);
      return err(XenErrno::enosys);
  }
}

std::int64_t Platform::sched_op(std::uint64_t cmd, std::uint64_t arg, GuestVirt& mem) {
  switch (cmd) {
    case abi::kSchedopYield:
    case abi::kSchedopBlock:  // HVM guests halt with hlt; nothing to wait for here
      return 0;
    case abi::kSchedopShutdown: {
      abi::SchedShutdown s{};
      if (!copy_in(mem, arg, s)) return err(XenErrno::efault);
      ShutdownReason why;
      switch (s.reason) {
        case abi::kShutdownPoweroff: why = ShutdownReason::poweroff; break;
        case abi::kShutdownReboot: why = ShutdownReason::reboot; break;
        case abi::kShutdownSuspend: why = ShutdownReason::suspend; break;
        case abi::kShutdownCrash: why = ShutdownReason::crash; break;
        case abi::kShutdownWatchdog: why = ShutdownReason::watchdog; break;
        default: return err(XenErrno::einval);  // incl. SHUTDOWN_soft_reset: not supported
      }
      host_.shutdown(why);
      return 0;
    }
    case abi::kSchedopPoll:
      return sched_poll(arg, mem);
    case abi::kSchedopRemoteShutdown:
      return err(XenErrno::eperm);
    case abi::kSchedopShutdownCode:
      return 0;
    default:
      log_unsupported("sched_op", cmd);
      return err(XenErrno::enosys);
  }
}

std::int64_t Platform::sched_poll(std::uint64_t arg, GuestVirt& mem) {
  abi::SchedPoll p{};
  if (!copy_in(mem, arg, p)) return err(XenErrno::efault);
  if (!evtchn_) return err(XenErrno::enosys);
  if (p.nr_ports > abi::kSchedPollMaxPorts) return err(XenErrno::einval);
  std::array<std::uint32_t, abi::kSchedPollMaxPorts> ports{};
  const std::span<std::uint8_t> bytes(reinterpret_cast<std::uint8_t*>(ports.data()),
                                      p.nr_ports * sizeof(std::uint32_t));
  if (p.nr_ports != 0 && !mem.read(p.ports, bytes)) return err(XenErrno::efault);
  for (std::uint32_t i = 0; i < p.nr_ports; ++i)
    if (ports[i] >= evtchn_->max_ports()) return err(XenErrno::einval);

  const auto deadline = std::chrono::steady_clock::now() + kPollMaxWait;
  for (unsigned round = 0;; ++round) {
    for (std::uint32_t i = 0; i < p.nr_ports; ++i)
      if (evtchn_->port_pending(ports[i])) return 0;
    if (round >= kPollMaxRounds || std::chrono::steady_clock::now() >= deadline) return 0;
    std::this_thread::sleep_for(kPollInterval);
  }
}

std::int64_t Platform::console_io(std::uint64_t cmd, std::uint64_t count, std::uint64_t buf,
                                  GuestVirt& mem) {
  switch (cmd) {
    case abi::kConsoleioWrite: {
      if (count > kConsoleWriteMax) return err(XenErrno::einval);
      if (count == 0) return 0;
      std::array<std::uint8_t, kConsoleWriteMax> text;
      if (!mem.read(buf, std::span(text).first(count))) return err(XenErrno::efault);
      std::uint64_t dropped = 0;
      {
        std::lock_guard lk(console_mu_);
        if (!console_limit_.allow()) return 0;  // written, as far as the guest knows
        dropped = console_limit_.take_suppressed();
      }
      // The host logs it: no escape sequences for a terminal, no carriage returns to overwrite
      // what the host itself wrote.
      for (std::uint64_t i = 0; i < count; ++i) {
        if (text[i] != '\n' && (text[i] < 0x20 || text[i] >= 0x7f)) text[i] = '.';
      }
      if (dropped != 0) {
        try {
          host_.console_write(fmt::format("[xpv: {} console_io writes dropped: more than {} a second]\n", dropped,
                                          kConsoleWritesPerSecond));
        } catch (...) {
        }
      }
      host_.console_write(std::string_view(reinterpret_cast<const char*>(text.data()), count));
      return 0;
    }
    case abi::kConsoleioRead:
      return 0;  // nothing to read: the host console is output-only for the guest
    default:
      log_unsupported("console_io", cmd);
      return err(XenErrno::enosys);
  }
}

}  // namespace xpv::xen
