// vcpu_op: vcpu_info placement, runstate/time areas, timers. vCPU thread of the caller.
//
// What is NOT emulated, on purpose:
//  - no PV timers (set_singleshot_timer / set_periodic_timer → -ENOSYS): XENFEAT_hvm_safe_pvclock
//    is not offered, so Linux keeps the LAPIC timer and only calls the stop_* ops (→ 0);
//  - the runstate area gets one initial record (state = running, all times 0) at registration
//    and is never updated (no steal time is reported);
//  - the vcpu_time_info area is accepted and never written (no pvclock);
//  - vCPU bring-up (initialise/up/down/is_up → -ENOSYS): HVM vCPUs start with INIT/SIPI.
#include "guest_copy.h"
#include "xpv/xen/platform.h"

namespace xpv::xen {

using namespace detail;

std::int64_t Platform::vcpu_op(unsigned /*caller*/, std::uint64_t cmd, std::uint64_t vcpu,
                               std::uint64_t arg, GuestVirt& mem) {
  if (vcpu >= cfg_.vcpus) return err(XenErrno::einval);
  const auto v = static_cast<unsigned>(vcpu);
  switch (cmd) {
    case abi::kVcpuopRegisterVcpuInfo: {
      // Any valid vCPU: Linux registers a secondary vCPU's vcpu_info from the boot vCPU before
      // starting it (Xen allows that for an offline vCPU).
      abi::VcpuRegisterVcpuInfo r{};
      if (!copy_in(mem, arg, r)) return err(XenErrno::efault);
      if (!evtchn_) return err(XenErrno::enosys);
      if (r.offset > domain::kSharedInfoPageBytes - sizeof(domain::VcpuInfo))
        return err(XenErrno::enxio);
      const std::span<std::uint8_t> page = host_.guest_page(r.mfn);
      if (page.size() < domain::kSharedInfoPageBytes) return err(XenErrno::einval);
      if (auto rc = evtchn_->register_vcpu_info(v, page.subspan(r.offset, sizeof(domain::VcpuInfo)));
          !rc)
        return err(rc.error());
      return 0;
    }
    case abi::kVcpuopRegisterRunstateMemoryArea: {
      abi::VcpuRegisterMemoryArea a{};
      if (!copy_in(mem, arg, a)) return err(XenErrno::efault);
      if (a.addr != 0 && !copy_out(mem, a.addr, abi::VcpuRunstateInfo{}))  // running, times 0
        return err(XenErrno::efault);
      runstate_gva_[v].store(a.addr, std::memory_order_release);
      return 0;
    }
    case abi::kVcpuopRegisterVcpuTimeMemoryArea: {
      abi::VcpuRegisterMemoryArea a{};
      if (!copy_in(mem, arg, a)) return err(XenErrno::efault);
      return 0;
    }
    case abi::kVcpuopStopPeriodicTimer:
    case abi::kVcpuopStopSingleshotTimer:
      return 0;
    case abi::kVcpuopSetSingleshotTimer:
    case abi::kVcpuopSetPeriodicTimer:
    case abi::kVcpuopInitialise:
    case abi::kVcpuopUp:
    case abi::kVcpuopDown:
    case abi::kVcpuopIsUp:
      return err(XenErrno::enosys);
    default:
      log_unsupported("vcpu_op", cmd);
      return err(XenErrno::enosys);
  }
}

}  // namespace xpv::xen
