// event_channel_op: the 2-level ABI through domain::EventChannels (which owns the semantics);
// here only the argument structs are copied in and out and DOMID_SELF is checked. The FIFO ABI
// (init_control, expand_array, set_priority) and pirqs are not offered: -ENOSYS, and Linux falls
// back to 2-level. vCPU thread of the caller.
//
// As in Xen, an operation that succeeded but whose result cannot be copied out returns -EFAULT
// (the port stays allocated; the guest has lost track of it).
#include "guest_copy.h"
#include "xpv/xen/platform.h"

namespace xpv::xen {

using namespace detail;
using domain::EvtchnOp;

namespace {

constexpr std::uint64_t op(EvtchnOp o) noexcept { return static_cast<std::uint64_t>(o); }

}  // namespace

std::int64_t Platform::event_channel_op(std::uint64_t cmd, std::uint64_t arg, GuestVirt& mem) {
  if (!evtchn_) return err(XenErrno::enosys);
  domain::EventChannels& ev = *evtchn_;
  auto port_result = [&](auto& s, auto& field, const auto& r) -> std::int64_t {
    if (!r) return err(r.error());
    field = *r;
    return copy_out(mem, arg, s) ? 0 : err(XenErrno::efault);
  };
  auto void_result = [](const auto& r) -> std::int64_t { return r ? 0 : err(r.error()); };

  switch (cmd) {
    case op(EvtchnOp::alloc_unbound): {
      domain::EvtchnAllocUnboundOp s{};
      if (!copy_in(mem, arg, s)) return err(XenErrno::efault);
      if (!is_self(s.dom)) return err(XenErrno::eperm);
      return port_result(s, s.port, ev.alloc_unbound(s.remote_dom));
    }
    case op(EvtchnOp::bind_interdomain): {
      domain::EvtchnBindInterdomainOp s{};
      if (!copy_in(mem, arg, s)) return err(XenErrno::efault);
      return port_result(s, s.local_port, ev.bind_interdomain(s.remote_dom, s.remote_port));
    }
    case op(EvtchnOp::bind_virq): {
      domain::EvtchnBindVirqOp s{};
      if (!copy_in(mem, arg, s)) return err(XenErrno::efault);
      return port_result(s, s.port, ev.bind_virq(s.virq, s.vcpu));
    }
    case op(EvtchnOp::bind_ipi): {
      domain::EvtchnBindIpiOp s{};
      if (!copy_in(mem, arg, s)) return err(XenErrno::efault);
      return port_result(s, s.port, ev.bind_ipi(s.vcpu));
    }
    case op(EvtchnOp::close):
    case op(EvtchnOp::send):
    case op(EvtchnOp::unmask): {
      domain::EvtchnPortOp s{};
      if (!copy_in(mem, arg, s)) return err(XenErrno::efault);
      if (cmd == op(EvtchnOp::close)) return void_result(ev.close(s.port));
      if (cmd == op(EvtchnOp::send)) return void_result(ev.send(s.port));
      return void_result(ev.unmask(s.port));
    }
    case op(EvtchnOp::status): {
      domain::EvtchnStatusOp s{};
      if (!copy_in(mem, arg, s)) return err(XenErrno::efault);
      if (!is_self(s.dom)) return err(XenErrno::eperm);
      const auto r = ev.status(s.port);
      if (!r) return err(r.error());
      s.status = static_cast<std::uint32_t>(r->status);
      s.vcpu = r->vcpu;
      std::memset(&s.u, 0, sizeof s.u);
      switch (r->status) {
        case domain::EvtchnStat::unbound: s.u.unbound.dom = r->remote_dom; break;
        case domain::EvtchnStat::interdomain:
          s.u.interdomain.dom = r->remote_dom;
          s.u.interdomain.port = r->remote_port;
          break;
        case domain::EvtchnStat::virq: s.u.virq = r->virq; break;
        default: break;
      }
      return copy_out(mem, arg, s) ? 0 : err(XenErrno::efault);
    }
    case op(EvtchnOp::bind_vcpu): {
      domain::EvtchnBindVcpuOp s{};
      if (!copy_in(mem, arg, s)) return err(XenErrno::efault);
      return void_result(ev.bind_vcpu(s.port, s.vcpu));
    }
    case op(EvtchnOp::reset): {
      domain::EvtchnResetOp s{};
      if (!copy_in(mem, arg, s)) return err(XenErrno::efault);
      if (!is_self(s.dom)) return err(XenErrno::eperm);
      ev.reset();
      return 0;
    }
    case op(EvtchnOp::bind_pirq):
    case op(EvtchnOp::init_control):
    case op(EvtchnOp::expand_array):
    case op(EvtchnOp::set_priority):
      return err(XenErrno::enosys);
    default:
      log_unsupported("event_channel_op", cmd);
      return err(XenErrno::enosys);
  }
}

}  // namespace xpv::xen
