// XenDomain — the Xen HVM platform assembled around one Vm (xpv-vmm --xen): the domain (memory
// exported through the control socket, event channels, xenstore page, fixed grant frames), the
// hypercall dispatcher behind the rewritten hypercall stubs, the Xen platform PCI device and the
// unplug ports. DESIGN.md §4, XEN-GUEST-ABI.md.
//
// Guest-physical layout added to the VM (outside RAM, in the 3-4 GiB hole):
//   kPlatformMmio (BAR1 of 00:03.0, 16 MiB)   grant frames 0..G-1 at its start (G = max frames)
//   kSpecialPages                             xenstore ring page
//   kSpecialPages + 4 KiB                     PV console ring page (with XenDomainConfig::pv_console)
// I/O: BAR0 at kPlatformIo (0x100 bytes), unplug ports 0x10..0x13, hypercall trap port
// xen::kHypercallPort. INTx of the platform device: GSI kPlatformGsi (MP table entry).
//
// Threads: construct on the main thread before Vm::run(); hypercalls run on vCPU threads; the
// control socket and the dom0 kick watchers run on this object's own io thread.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "xpv/domain/domain.h"
#include "xpv/log_rate_limit.h"
#include "xpv/kvm/pci_host.h"
#include "xpv/kvm/vm.h"
#include "xpv/platform_pci/bars.h"
#include "xpv/platform_pci/platform_device.h"
#include "xpv/platform_pci/unplug_ports.h"
#include "xpv/stats_file.h"
#include "xpv/vmm/pv_console.h"
#include "xpv/xen/platform.h"
#include "xpv/xen/stubs.h"

namespace xpv::vmm {

inline constexpr std::uint64_t kPlatformMmio = 0xf000'0000;
inline constexpr std::uint16_t kPlatformIo = 0xc000;
inline constexpr std::uint32_t kPlatformGsi = 16;
inline constexpr unsigned kPlatformSlot = 3;
inline constexpr std::uint64_t kSpecialPages = 0xfeff'0000;

struct XenDomainConfig {
  std::uint16_t domid = 1;
  std::string name;
  std::string run_dir = "/run/xpv";
  xen::UpcallMode upcall = xen::UpcallMode::vcpu_vector;
  std::uint32_t max_grant_frames = 64;
  std::uint64_t trace_hypercalls = 0;  // log the first N hypercalls (number, arguments, result)
  // Where the guest's current memory (KiB: RAM less what its balloon gave back) is kept, replaced
  // atomically whenever ballooning changes it; empty: nowhere.
  std::string memory_file;
  // Where the domain's run state is kept, "paused" or "running" (replaced atomically when it
  // changes: created paused, unpaused, `xpv pause`); what `xpv list` shows. Empty: nowhere.
  std::string state_file;
  // The PV console (hvc0): offered (HVM_PARAM_CONSOLE_PFN/_EVTCHN) when set; its output goes here
  // (on the XenDomain's io thread). Unset: the guest finds no PV console, as before.
  std::function<void(std::span<const std::uint8_t>)> pv_console;
};

// VmConfig::device_memory entries the layout needs (call before constructing the Vm).
void add_xen_device_memory(kvm::VmConfig& cfg, const XenDomainConfig& xcfg);

class XenDomain {
 public:
  // Needs a Vm made with add_xen_device_memory; registers its devices, CPUID hook and trap port.
  XenDomain(kvm::Vm& vm, kvm::PciHost& pci, const XenDomainConfig& cfg);
  ~XenDomain();
  XenDomain(const XenDomain&) = delete;
  XenDomain& operator=(const XenDomain&) = delete;

  // Rewrites the guest kernel's hypercall stubs found in guest memory [begin, end) (the loaded
  // kernel image). A kernel without them that carries a hypercall-page placeholder (pre-XSA-466
  // Linux) is left as it is: it gets the page when it writes the hypercall-page MSR. Throws with
  // a clear message when neither is found, or the page is needed and this KVM cannot trap the MSR.
  // `tables`: the kernel's own tables about its code (kvm::LoadedKernel), kept true when the
  // stubs are rewritten (stubs.h, fast sends); absent ones are size 0.
  void patch_kernel(std::uint64_t begin, std::uint64_t end, const kvm::KernelTables& tables = {});

  // Blocks until a dom0 client sends unpause on the control socket (xpv-vmm --paused: the
  // toolstack writes the domain's devices first, as xl does). Main thread.
  void wait_unpaused();
  // Unpauses a domain created paused, as a control-socket unpause does (xpv-vmm without --paused).
  void unpause_now();

  xen::Platform& platform() noexcept { return *platform_; }
  domain::Domain& domain() noexcept { return *domain_; }
  std::uint64_t hypercalls() const noexcept;
  // Whether guest writes of the hypercall-page MSR reach the VMM (this KVM can filter MSRs).
  bool hypercall_page_msr() const noexcept { return msr_trap_; }
  // The platform's counters: hypercalls (all), then per hypercall, EVTCHNOP and SCHEDOP that
  // occurred (memory_op, evtchn.send, sched.poll, ...), upcalls, intx_eois, and once the guest
  // has a balloon ballooned_pages (and ballooned_not_freed when some could not be punched).
  // Any thread (the counters are atomics): xpv-vmm --stats-file publishes them every second.
  stats::Counters counters() const;
  // The same as one line, "hypercalls=N memory_op=… upcalls=… intx_eois=…" (--stats).
  std::string describe_counters() const;
  // Typed bytes for the PV console (see PvConsole::receive); 0 when there is none. Any thread.
  std::size_t pv_console_input(std::span<const std::uint8_t> bytes) noexcept;

 private:
  class Host;
  struct Forward;
  class SendRoutes;
  kvm::Vm& vm_;
  XenDomainConfig cfg_;
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::unique_ptr<Host> host_;
  std::unique_ptr<Forward> forward_;
  std::unique_ptr<domain::Domain> domain_;
  // In-kernel event-channel sends (xen/stubs.h fast send): KVM ioeventfds for the ports connected
  // to backends, made once the kernel's stubs or its hypercall page hold the fast-send routine.
  std::unique_ptr<SendRoutes> send_routes_;
  std::unique_ptr<xen::Platform> platform_;
  std::unique_ptr<platform_pci::XenPlatformDevice> device_;
  std::unique_ptr<platform_pci::UnplugPorts> unplug_;
  std::unique_ptr<platform_pci::PlatformIoBar> bar0_;
  std::unique_ptr<platform_pci::PlatformMmioBar> bar1_;
  std::shared_ptr<std::atomic<xen::Platform*>> live_;
  std::mutex pv_mu_;  // pv_console_ against pv_console_input() while it is torn down
  std::unique_ptr<PvConsole> pv_console_;
  // Hypercall-page MSR (stubs.h): trapped when this KVM can; else why not.
  bool fill_hypercall_page(unsigned vcpu, std::uint64_t value) noexcept;
  // Fast sends (xen/stubs.h): prepare_fast_send (constructor) makes the routes' sink and the
  // trap of port kEvtchnSendPort unless XPV_EVTCHN_FAST_SEND=0; install_fast_send writes the
  // routine over the stubs (false: not installed, and why is logged); fast_send_installed, once a
  // routine is in the guest (the stubs' or the hypercall page's), lets the trap answer and makes
  // the routes, once.
  void prepare_fast_send();
  bool install_fast_send(std::span<std::uint8_t> image, const xen::StubSites& sites, const xen::KernelTables& tables);
  void fast_send_installed();
  bool msr_trap_ = false;
  std::string msr_trap_error_;
  // The lines a guest's WRMSRs of the hypercall page cause: a guest writing it in a loop gets
  // 10 a second (and a count of the rest), not one each.
  std::mutex msr_log_mu_;
  xpv::LogRateLimit msr_log_limit_;
  void publish_state(const char* state) noexcept;
  std::mutex unpause_mu_;  // the unpause and pause handlers, one at a time; guards unpaused_
  std::condition_variable unpause_cv_;
  bool unpaused_ = false;
  std::atomic<std::uint64_t> traced_{0};
  std::thread io_thread_;
  // Level semantics for evtchn_upcall_pending (see reassert_loop in the .cpp).
  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool stopping_ = false;
  std::thread reassert_thread_;
  void reassert_loop();
  void reassert(unsigned vcpu) noexcept;
};

}  // namespace xpv::vmm
