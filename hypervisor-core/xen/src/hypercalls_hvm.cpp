// hvm_op: HVM_PARAM_* get/set and the per-vCPU upcall vector. vCPU thread of the caller.
#include <fmt/format.h>

#include "callback_irq.h"
#include "guest_copy.h"
#include "xpv/xen/platform.h"

namespace xpv::xen {

using namespace detail;


std::int64_t Platform::hvm_op(std::uint64_t op, std::uint64_t arg, GuestVirt& mem) {
  switch (op) {
    case abi::kHvmopSetParam:
    case abi::kHvmopGetParam: {
      abi::HvmParam p{};
      if (!copy_in(mem, arg, p)) return err(XenErrno::efault);
      if (!is_self(p.domid)) return err(XenErrno::eperm);
      if (p.index >= abi::kNrParams) return err(XenErrno::einval);
      if (op == abi::kHvmopSetParam) return set_param(p.index, p.value);
      if (const auto rc = get_param(p.index, p.value); rc != 0) return rc;
      return copy_out(mem, arg, p) ? 0 : err(XenErrno::efault);
    }
    case abi::kHvmopSetEvtchnUpcallVector: {
      abi::HvmEvtchnUpcallVector u{};
      if (!copy_in(mem, arg, u)) return err(XenErrno::efault);
      if (u.vector < kMinVector) return err(XenErrno::einval);
      if (u.vcpu >= cfg_.vcpus) return err(XenErrno::enoent);
      if (vcpu_vector_[u.vcpu].exchange(u.vector, std::memory_order_acq_rel) != u.vector) {
        log_upcall_mode(fmt::format("per-vCPU vector {:#x} on vCPU {}", u.vector, u.vcpu));
        publish_upcall_routes();
      }
      deliver_if_pending(u.vcpu);
      return 0;
    }
    case abi::kHvmopPagetableDying:  // Linux's shadow-paging hint: meaningless with EPT/NPT
      return err(XenErrno::enosys);
    default:
      log_unsupported("hvm_op", op);
      return err(XenErrno::enosys);
  }
}

std::int64_t Platform::set_param(std::uint32_t index, std::uint64_t value) {
  switch (index) {
    case abi::kParamCallbackIrq: {
      const std::uint64_t type = value >> abi::kCallbackTypeShift;
      if (type != abi::kCallbackTypeGsi && type != abi::kCallbackTypePciIntx &&
          type != abi::kCallbackTypeVector)
        return err(XenErrno::einval);
      // The global callback vector needs the host's help (no EOI): ask before anything changes.
      // Two vCPUs writing at once: each stores its value only over the one it asked the host
      // against (compare-exchange), and asks again when another came between, so the host ends
      // told the vector the parameter holds. No lock: the host's change may wait for every vCPU
      // to reach the top of its loop (xpv-vmm's auto-EOI vector), which a vCPU blocked here never
      // would.
      const std::uint8_t want = global_callback_vector(value);
      std::uint64_t old = callback_irq_.load(std::memory_order_acquire);
      bool asked = false;
      // Giving up after an earlier ask: the host goes back to the vector the parameter holds.
      const auto give_up = [&](XenErrno e) {
        if (asked) (void)host_.set_callback_vector(global_callback_vector(callback_irq_.load(std::memory_order_acquire)));
        return err(e);
      };
      for (int attempt = 0;; ++attempt) {
        if (attempt == kCallbackIrqAttempts) return give_up(XenErrno::eagain);
        if (want != global_callback_vector(old)) {
          if (!host_.set_callback_vector(want)) {
            log_upcall_mode(fmt::format("callback vector {:#x} refused: the VMM cannot deliver it", want));
            return give_up(XenErrno::enosys);
          }
          asked = true;
        }
        if (callback_irq_.compare_exchange_strong(old, value, std::memory_order_acq_rel)) break;
      }
      if (old != value) {
        if (const std::uint8_t vec = global_callback_vector(value); vec != 0) {
          log_upcall_mode(fmt::format("callback vector {:#x} (global: every vCPU, no EOI)", vec));
        } else if (type == abi::kCallbackTypeVector) {
          log_upcall_mode(fmt::format("callback vector {:#x}: below 0x10, stored but never injected", value & 0xff));
        } else if (value == 0) {
          log_upcall_mode("no callback (CALLBACK_IRQ 0)");
        } else if (type == abi::kCallbackTypeGsi) {
          // Linux with per-vCPU vectors writes GSI 1 as a marker ("to trick the toolstack").
          log_upcall_mode(fmt::format("GSI {} (served as the platform-pci INTx where no per-vCPU vector is set)", value));
        } else {
          log_upcall_mode(fmt::format("platform-pci INTx (CALLBACK_IRQ {:#x})", value));
        }
      }
      if (callback_kind(old) == CallbackKind::intx && callback_kind(value) != CallbackKind::intx) host_.set_intx(false);
      if (old != value) publish_upcall_routes();
      if (type == abi::kCallbackTypeVector) {
        for (unsigned v = 0; v < cfg_.vcpus; ++v) deliver_if_pending(v);
      } else {
        deliver_if_pending(0);
      }
      return 0;
    }
    // The toolstack's values: the guest reads them, it does not choose them.
    case abi::kParamStorePfn:
    case abi::kParamStoreEvtchn:
    case abi::kParamConsolePfn:
    case abi::kParamConsoleEvtchn:
      return err(XenErrno::eperm);
    default:
      return err(XenErrno::eperm);  // as Xen for parameters a guest may not set
  }
}

std::int64_t Platform::get_param(std::uint32_t index, std::uint64_t& value) const {
  switch (index) {
    case abi::kParamCallbackIrq: value = callback_irq_.load(std::memory_order_acquire); return 0;
    case abi::kParamStorePfn: value = cfg_.store_gfn; return 0;
    case abi::kParamStoreEvtchn: value = cfg_.store_port; return 0;
    case abi::kParamConsolePfn: value = cfg_.console_gfn; return 0;
    case abi::kParamConsoleEvtchn: value = cfg_.console_port; return 0;
    // Readable by a guest in Xen, never set here.
    case abi::kParamVm86Tss:
    case abi::kParamVm86TssSized:
    case abi::kParamAcpiIoportsLocation:
    case abi::kParamVmGenerationIdAddr:
    case abi::kParamAltp2m:
    case abi::kParamX87FipWidth:
      value = 0;
      return 0;
    default:
      return err(XenErrno::eperm);  // as Xen for parameters a guest may not read
  }
}

}  // namespace xpv::xen
