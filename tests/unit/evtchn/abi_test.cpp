// EvtchnAbi: every struct and constant of shared_info.h / evtchn_abi.h against the official Xen
// public headers (libxen-dev, /usr/include/xen), x86_64, latest interface version.
#define __XEN_INTERFACE_VERSION__ 0x00040e00
#include <stdint.h>
extern "C" {
#include <xen/xen.h>
#include <xen/event_channel.h>
#include <xen/errno.h>
}

#include <gtest/gtest.h>

#include <cstddef>

#include "xpv/domain/evtchn_abi.h"
#include "xpv/domain/shared_info.h"

namespace xpv::domain {
namespace {

#define EXPECT_SAME_OFFSET(ours, theirs, field) \
  EXPECT_EQ(offsetof(ours, field), offsetof(theirs, field)) << #field

TEST(EvtchnAbi, VcpuTimeInfoMatchesXenHeader) {
  EXPECT_EQ(sizeof(VcpuTimeInfo), sizeof(struct vcpu_time_info));
  EXPECT_SAME_OFFSET(VcpuTimeInfo, struct vcpu_time_info, version);
  EXPECT_SAME_OFFSET(VcpuTimeInfo, struct vcpu_time_info, pad0);
  EXPECT_SAME_OFFSET(VcpuTimeInfo, struct vcpu_time_info, tsc_timestamp);
  EXPECT_SAME_OFFSET(VcpuTimeInfo, struct vcpu_time_info, system_time);
  EXPECT_SAME_OFFSET(VcpuTimeInfo, struct vcpu_time_info, tsc_to_system_mul);
  EXPECT_SAME_OFFSET(VcpuTimeInfo, struct vcpu_time_info, tsc_shift);
  EXPECT_SAME_OFFSET(VcpuTimeInfo, struct vcpu_time_info, flags);
  EXPECT_SAME_OFFSET(VcpuTimeInfo, struct vcpu_time_info, pad1);
}

TEST(EvtchnAbi, VcpuInfoMatchesXenHeader) {
  EXPECT_EQ(sizeof(ArchVcpuInfo), sizeof(struct arch_vcpu_info));
  EXPECT_SAME_OFFSET(ArchVcpuInfo, struct arch_vcpu_info, cr2);
  EXPECT_SAME_OFFSET(ArchVcpuInfo, struct arch_vcpu_info, pad);
  EXPECT_EQ(sizeof(VcpuInfo), sizeof(struct vcpu_info));
  EXPECT_EQ(sizeof(VcpuInfo), 64u);
  EXPECT_SAME_OFFSET(VcpuInfo, struct vcpu_info, evtchn_upcall_pending);
  EXPECT_SAME_OFFSET(VcpuInfo, struct vcpu_info, evtchn_upcall_mask);
  EXPECT_SAME_OFFSET(VcpuInfo, struct vcpu_info, evtchn_pending_sel);
  EXPECT_SAME_OFFSET(VcpuInfo, struct vcpu_info, arch);
  EXPECT_SAME_OFFSET(VcpuInfo, struct vcpu_info, time);
  EXPECT_EQ(sizeof(VcpuInfo::evtchn_pending_sel), sizeof(xen_ulong_t));
}

TEST(EvtchnAbi, SharedInfoMatchesXenHeader) {
  EXPECT_EQ(sizeof(ArchSharedInfo), sizeof(struct arch_shared_info));
  EXPECT_SAME_OFFSET(ArchSharedInfo, struct arch_shared_info, max_pfn);
  EXPECT_SAME_OFFSET(ArchSharedInfo, struct arch_shared_info, pfn_to_mfn_frame_list_list);
  EXPECT_SAME_OFFSET(ArchSharedInfo, struct arch_shared_info, nmi_reason);
  EXPECT_SAME_OFFSET(ArchSharedInfo, struct arch_shared_info, p2m_cr3);
  EXPECT_SAME_OFFSET(ArchSharedInfo, struct arch_shared_info, p2m_vaddr);
  EXPECT_SAME_OFFSET(ArchSharedInfo, struct arch_shared_info, p2m_generation);

  EXPECT_EQ(sizeof(SharedInfo), sizeof(struct shared_info));
  EXPECT_SAME_OFFSET(SharedInfo, struct shared_info, vcpu_info);
  EXPECT_SAME_OFFSET(SharedInfo, struct shared_info, evtchn_pending);
  EXPECT_SAME_OFFSET(SharedInfo, struct shared_info, evtchn_mask);
  EXPECT_SAME_OFFSET(SharedInfo, struct shared_info, wc_version);
  EXPECT_SAME_OFFSET(SharedInfo, struct shared_info, wc_sec);
  EXPECT_SAME_OFFSET(SharedInfo, struct shared_info, wc_nsec);
  EXPECT_SAME_OFFSET(SharedInfo, struct shared_info, wc_sec_hi);
  EXPECT_SAME_OFFSET(SharedInfo, struct shared_info, arch);
  EXPECT_SAME_OFFSET(SharedInfo, struct shared_info, vcpu_info[31].evtchn_pending_sel);
  EXPECT_EQ(sizeof(SharedInfo::evtchn_pending), sizeof(shared_info::evtchn_pending));
  EXPECT_EQ(sizeof(SharedInfo::evtchn_mask), sizeof(shared_info::evtchn_mask));
}

TEST(EvtchnAbi, EventChannelOpStructsMatchXenHeader) {
  EXPECT_EQ(sizeof(EvtchnAllocUnboundOp), sizeof(struct evtchn_alloc_unbound));
  EXPECT_SAME_OFFSET(EvtchnAllocUnboundOp, struct evtchn_alloc_unbound, dom);
  EXPECT_SAME_OFFSET(EvtchnAllocUnboundOp, struct evtchn_alloc_unbound, remote_dom);
  EXPECT_SAME_OFFSET(EvtchnAllocUnboundOp, struct evtchn_alloc_unbound, port);

  EXPECT_EQ(sizeof(EvtchnBindInterdomainOp), sizeof(struct evtchn_bind_interdomain));
  EXPECT_SAME_OFFSET(EvtchnBindInterdomainOp, struct evtchn_bind_interdomain, remote_dom);
  EXPECT_SAME_OFFSET(EvtchnBindInterdomainOp, struct evtchn_bind_interdomain, remote_port);
  EXPECT_SAME_OFFSET(EvtchnBindInterdomainOp, struct evtchn_bind_interdomain, local_port);

  EXPECT_EQ(sizeof(EvtchnBindVirqOp), sizeof(struct evtchn_bind_virq));
  EXPECT_SAME_OFFSET(EvtchnBindVirqOp, struct evtchn_bind_virq, virq);
  EXPECT_SAME_OFFSET(EvtchnBindVirqOp, struct evtchn_bind_virq, vcpu);
  EXPECT_SAME_OFFSET(EvtchnBindVirqOp, struct evtchn_bind_virq, port);

  EXPECT_EQ(sizeof(EvtchnBindIpiOp), sizeof(struct evtchn_bind_ipi));
  EXPECT_SAME_OFFSET(EvtchnBindIpiOp, struct evtchn_bind_ipi, vcpu);
  EXPECT_SAME_OFFSET(EvtchnBindIpiOp, struct evtchn_bind_ipi, port);

  EXPECT_EQ(sizeof(EvtchnPortOp), sizeof(struct evtchn_close));
  EXPECT_EQ(sizeof(EvtchnPortOp), sizeof(struct evtchn_send));
  EXPECT_EQ(sizeof(EvtchnPortOp), sizeof(struct evtchn_unmask));
  EXPECT_SAME_OFFSET(EvtchnPortOp, struct evtchn_close, port);
  EXPECT_SAME_OFFSET(EvtchnPortOp, struct evtchn_send, port);
  EXPECT_SAME_OFFSET(EvtchnPortOp, struct evtchn_unmask, port);

  EXPECT_EQ(sizeof(EvtchnBindVcpuOp), sizeof(struct evtchn_bind_vcpu));
  EXPECT_SAME_OFFSET(EvtchnBindVcpuOp, struct evtchn_bind_vcpu, port);
  EXPECT_SAME_OFFSET(EvtchnBindVcpuOp, struct evtchn_bind_vcpu, vcpu);

  EXPECT_EQ(sizeof(EvtchnResetOp), sizeof(struct evtchn_reset));
  EXPECT_SAME_OFFSET(EvtchnResetOp, struct evtchn_reset, dom);

  EXPECT_EQ(sizeof(EvtchnStatusOp), sizeof(struct evtchn_status));
  EXPECT_SAME_OFFSET(EvtchnStatusOp, struct evtchn_status, dom);
  EXPECT_SAME_OFFSET(EvtchnStatusOp, struct evtchn_status, port);
  EXPECT_SAME_OFFSET(EvtchnStatusOp, struct evtchn_status, status);
  EXPECT_SAME_OFFSET(EvtchnStatusOp, struct evtchn_status, vcpu);
  EXPECT_SAME_OFFSET(EvtchnStatusOp, struct evtchn_status, u);
  EXPECT_SAME_OFFSET(EvtchnStatusOp, struct evtchn_status, u.unbound.dom);
  EXPECT_SAME_OFFSET(EvtchnStatusOp, struct evtchn_status, u.interdomain.dom);
  EXPECT_SAME_OFFSET(EvtchnStatusOp, struct evtchn_status, u.interdomain.port);
  EXPECT_SAME_OFFSET(EvtchnStatusOp, struct evtchn_status, u.pirq);
  EXPECT_SAME_OFFSET(EvtchnStatusOp, struct evtchn_status, u.virq);
}

TEST(EvtchnAbi, ConstantsMatchXenHeader) {
  EXPECT_EQ(kLegacyMaxVcpus, unsigned{XEN_LEGACY_MAX_VCPUS});
  EXPECT_EQ(kEvtchn2lNrChannels, EVTCHN_2L_NR_CHANNELS);
  EXPECT_EQ(kEvtchn2lNrChannels, 4096u);
  EXPECT_EQ(kEvtchnWordBits, sizeof(xen_ulong_t) * 8);
  EXPECT_EQ(kDomidSelf, DOMID_SELF);
  EXPECT_EQ(kDomidFirstReserved, DOMID_FIRST_RESERVED);
  EXPECT_EQ(kNrVirqs, unsigned{NR_VIRQS});

  EXPECT_EQ(kVirqTimer, unsigned{VIRQ_TIMER});
  EXPECT_EQ(kVirqDebug, unsigned{VIRQ_DEBUG});
  EXPECT_EQ(kVirqConsole, unsigned{VIRQ_CONSOLE});
  EXPECT_EQ(kVirqDomExc, unsigned{VIRQ_DOM_EXC});
  EXPECT_EQ(kVirqTbuf, unsigned{VIRQ_TBUF});
  EXPECT_EQ(kVirqDebugger, unsigned{VIRQ_DEBUGGER});
  EXPECT_EQ(kVirqXenoprof, unsigned{VIRQ_XENOPROF});
  EXPECT_EQ(kVirqConRing, unsigned{VIRQ_CON_RING});
  EXPECT_EQ(kVirqPcpuState, unsigned{VIRQ_PCPU_STATE});
  EXPECT_EQ(kVirqMemEvent, unsigned{VIRQ_MEM_EVENT});
  EXPECT_EQ(kVirqArgo, unsigned{VIRQ_ARGO});
  EXPECT_EQ(kVirqEnomem, unsigned{VIRQ_ENOMEM});
  EXPECT_EQ(kVirqXenpmu, unsigned{VIRQ_XENPMU});
  EXPECT_EQ(kVirqArch0, unsigned{VIRQ_ARCH_0});

  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::bind_interdomain), unsigned{EVTCHNOP_bind_interdomain});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::bind_virq), unsigned{EVTCHNOP_bind_virq});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::bind_pirq), unsigned{EVTCHNOP_bind_pirq});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::close), unsigned{EVTCHNOP_close});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::send), unsigned{EVTCHNOP_send});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::status), unsigned{EVTCHNOP_status});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::alloc_unbound), unsigned{EVTCHNOP_alloc_unbound});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::bind_ipi), unsigned{EVTCHNOP_bind_ipi});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::bind_vcpu), unsigned{EVTCHNOP_bind_vcpu});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::unmask), unsigned{EVTCHNOP_unmask});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::reset), unsigned{EVTCHNOP_reset});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::init_control), unsigned{EVTCHNOP_init_control});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::expand_array), unsigned{EVTCHNOP_expand_array});
  EXPECT_EQ(static_cast<unsigned>(EvtchnOp::set_priority), unsigned{EVTCHNOP_set_priority});

  EXPECT_EQ(static_cast<unsigned>(EvtchnStat::closed), unsigned{EVTCHNSTAT_closed});
  EXPECT_EQ(static_cast<unsigned>(EvtchnStat::unbound), unsigned{EVTCHNSTAT_unbound});
  EXPECT_EQ(static_cast<unsigned>(EvtchnStat::interdomain), unsigned{EVTCHNSTAT_interdomain});
  EXPECT_EQ(static_cast<unsigned>(EvtchnStat::pirq), unsigned{EVTCHNSTAT_pirq});
  EXPECT_EQ(static_cast<unsigned>(EvtchnStat::virq), unsigned{EVTCHNSTAT_virq});
  EXPECT_EQ(static_cast<unsigned>(EvtchnStat::ipi), unsigned{EVTCHNSTAT_ipi});
}

TEST(EvtchnAbi, ErrnoValuesMatchXenHeader) {
  EXPECT_EQ(static_cast<int>(XenErrno::eperm), XEN_EPERM);
  EXPECT_EQ(static_cast<int>(XenErrno::enoent), XEN_ENOENT);
  EXPECT_EQ(static_cast<int>(XenErrno::esrch), XEN_ESRCH);
  EXPECT_EQ(static_cast<int>(XenErrno::enxio), XEN_ENXIO);
  EXPECT_EQ(static_cast<int>(XenErrno::enomem), XEN_ENOMEM);
  EXPECT_EQ(static_cast<int>(XenErrno::efault), XEN_EFAULT);
  EXPECT_EQ(static_cast<int>(XenErrno::eexist), XEN_EEXIST);
  EXPECT_EQ(static_cast<int>(XenErrno::einval), XEN_EINVAL);
  EXPECT_EQ(static_cast<int>(XenErrno::enospc), XEN_ENOSPC);
  EXPECT_EQ(static_cast<int>(XenErrno::enosys), XEN_ENOSYS);
  EXPECT_EQ(to_hypercall_result(XenErrno::einval), -22);
  EXPECT_STREQ(to_string(XenErrno::eexist), "EEXIST");
}

TEST(EvtchnAbi, VirqClassificationFollowsXen) {
  EXPECT_FALSE(virq_is_global(kVirqTimer));
  EXPECT_FALSE(virq_is_global(kVirqDebug));
  EXPECT_FALSE(virq_is_global(kVirqXenoprof));
  EXPECT_FALSE(virq_is_global(kVirqXenpmu));
  EXPECT_TRUE(virq_is_global(kVirqConsole));
  EXPECT_TRUE(virq_is_global(kVirqDomExc));
  EXPECT_TRUE(virq_is_global(kVirqArch0));
}

}  // namespace
}  // namespace xpv::domain
