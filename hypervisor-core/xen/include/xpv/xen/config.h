// The configuration of one domain's Xen HVM platform (what the VMM offers the guest), shared by
// the CPUID leaves (cpuid.h) and the hypercall dispatcher (platform.h).
#pragma once

#include <cstdint>

namespace xpv::xen {

// The 8-bit I/O port that the rewritten hypercall stubs (stubs.h) and the hypercall page write
// to: `out %al, $0xe8`. No PC device lives at 0xe8 (0xe9 is the Bochs/Xen debug console, 0x80
// the POST port, 0xed the delay port); the VMM reads all registers on that port-I/O exit and
// writes the result into rax before resuming.
inline constexpr std::uint8_t kHypercallPort = 0xe8;

// The port of the fast event-channel send (stubs.h): `out %eax, $0xe4` with the guest's port in
// eax, 4 bytes (0xe4..0xe7: no PC device). Ports connected to a backend are KVM ioeventfds there
// (datamatch = the port), so those sends never leave the host kernel; any other value exits to
// the VMM, which performs EVTCHNOP_send and writes the result into rdx.
inline constexpr std::uint8_t kEvtchnSendPort = 0xe4;

// How the platform raises an event-channel upcall (XEN-GUEST-ABI.md "Upcalls"):
//   vcpu_vector      per-vCPU vector (CPUID UPCALL_VECTOR + HVMOP_set_evtchn_upcall_vector),
//                    and the global vector below as a fallback;
//   callback_vector  global vector (XENFEAT_hvm_callback_vector + HVM_PARAM_CALLBACK_IRQ type 2);
//   intx             platform-pci INTA only (neither of the above is offered).
enum class UpcallMode { vcpu_vector, callback_vector, intx };

enum class ShutdownReason { poweroff, reboot, suspend, crash, watchdog };

// What XENVER_extraversion and XENVER_capabilities answer (only the 64-bit hypercall ABI is
// implemented); `xpv info` shows the same.
inline constexpr const char* kExtraVersion = ".0";
inline constexpr const char* kCapabilities = "hvm-3.0-x86_64";

struct PlatformConfig {
  std::uint16_t domid = 1;
  unsigned vcpus = 1;
  std::uint16_t version_major = 4, version_minor = 17;
  UpcallMode upcall = UpcallMode::vcpu_vector;  // what is OFFERED (CPUID flag / XENFEAT); the
                                                // guest's own choice via hvm_op is honoured
  std::uint32_t max_grant_frames = 64;
  std::uint64_t grant_frames_gfn = 0;  // frame i lives at gfn grant_frames_gfn + i (platform-pci
                                       // BAR1, fixed)
  std::uint64_t store_gfn = 0;   std::uint32_t store_port = 0;
  std::uint64_t console_gfn = 0; std::uint32_t console_port = 0;  // 0 = no PV console offered
};

}  // namespace xpv::xen
