// XenAbi: every struct and constant of xpv/xen/abi.h (and the CPUID constants) against the
// official Xen public headers (libxen-dev, /usr/include/xen), x86_64, latest interface version.
#define __XEN_INTERFACE_VERSION__ 0x00040e00
#include <stdint.h>
extern "C" {
#include <xen/xen.h>
#include <xen/arch-x86/cpuid.h>
#include <xen/event_channel.h>
#include <xen/features.h>
#include <xen/grant_table.h>
#include <xen/hvm/hvm_op.h>
#include <xen/hvm/params.h>
#include <xen/memory.h>
#include <xen/sched.h>
#include <xen/vcpu.h>
#include <xen/version.h>
}

#include <gtest/gtest.h>

#include <cstddef>

#include "xpv/xen/abi.h"
#include "xpv/xen/cpuid.h"

namespace xpv::xen::abi {
namespace {

#define EXPECT_SAME_OFFSET(ours, theirs, field) \
  EXPECT_EQ(offsetof(ours, field), offsetof(theirs, field)) << #field

TEST(XenAbi, HypercallNumbersMatchXenHeader) {
  EXPECT_EQ(kHcMemoryOp, unsigned{__HYPERVISOR_memory_op});
  EXPECT_EQ(kHcXenVersion, unsigned{__HYPERVISOR_xen_version});
  EXPECT_EQ(kHcConsoleIo, unsigned{__HYPERVISOR_console_io});
  EXPECT_EQ(kHcGrantTableOp, unsigned{__HYPERVISOR_grant_table_op});
  EXPECT_EQ(kHcVcpuOp, unsigned{__HYPERVISOR_vcpu_op});
  EXPECT_EQ(kHcSchedOp, unsigned{__HYPERVISOR_sched_op});
  EXPECT_EQ(kHcEventChannelOp, unsigned{__HYPERVISOR_event_channel_op});
  EXPECT_EQ(kHcHvmOp, unsigned{__HYPERVISOR_hvm_op});
  EXPECT_GT(kNrHypercalls, unsigned{__HYPERVISOR_arch_7});
  EXPECT_EQ(kConsoleioWrite, std::uint64_t{CONSOLEIO_write});
  EXPECT_EQ(kConsoleioRead, std::uint64_t{CONSOLEIO_read});
}

TEST(XenAbi, VersionAndFeaturesMatchXenHeader) {
  EXPECT_EQ(kXenverVersion, std::uint64_t{XENVER_version});
  EXPECT_EQ(kXenverExtraversion, std::uint64_t{XENVER_extraversion});
  EXPECT_EQ(kXenverCompileInfo, std::uint64_t{XENVER_compile_info});
  EXPECT_EQ(kXenverCapabilities, std::uint64_t{XENVER_capabilities});
  EXPECT_EQ(kXenverChangeset, std::uint64_t{XENVER_changeset});
  EXPECT_EQ(kXenverPlatformParameters, std::uint64_t{XENVER_platform_parameters});
  EXPECT_EQ(kXenverGetFeatures, std::uint64_t{XENVER_get_features});
  EXPECT_EQ(kXenverPagesize, std::uint64_t{XENVER_pagesize});
  EXPECT_EQ(kXenverGuestHandle, std::uint64_t{XENVER_guest_handle});
  EXPECT_EQ(kExtraversionLen, sizeof(xen_extraversion_t));
  EXPECT_EQ(kCapabilitiesLen, sizeof(xen_capabilities_info_t));
  EXPECT_EQ(kChangesetLen, sizeof(xen_changeset_info_t));
  EXPECT_EQ(kDomainHandleLen, sizeof(xen_domain_handle_t));

  EXPECT_EQ(sizeof(CompileInfo), sizeof(struct xen_compile_info));
  EXPECT_SAME_OFFSET(CompileInfo, struct xen_compile_info, compiler);
  EXPECT_SAME_OFFSET(CompileInfo, struct xen_compile_info, compile_by);
  EXPECT_SAME_OFFSET(CompileInfo, struct xen_compile_info, compile_domain);
  EXPECT_SAME_OFFSET(CompileInfo, struct xen_compile_info, compile_date);
  EXPECT_EQ(sizeof(PlatformParameters), sizeof(struct xen_platform_parameters));
  EXPECT_SAME_OFFSET(PlatformParameters, struct xen_platform_parameters, virt_start);
  EXPECT_EQ(sizeof(FeatureInfo), sizeof(struct xen_feature_info));
  EXPECT_SAME_OFFSET(FeatureInfo, struct xen_feature_info, submap_idx);
  EXPECT_SAME_OFFSET(FeatureInfo, struct xen_feature_info, submap);

  EXPECT_EQ(kFeatAutoTranslatedPhysmap, unsigned{XENFEAT_auto_translated_physmap});
  EXPECT_EQ(kFeatHvmCallbackVector, unsigned{XENFEAT_hvm_callback_vector});
  EXPECT_EQ(kFeatHvmSafePvclock, unsigned{XENFEAT_hvm_safe_pvclock});
  EXPECT_EQ(kFeatHvmPirqs, unsigned{XENFEAT_hvm_pirqs});
  EXPECT_EQ(kFeatNrSubmaps, unsigned{XENFEAT_NR_SUBMAPS});
}

TEST(XenAbi, MemoryOpMatchesXenHeader) {
  EXPECT_EQ(kXenmemAddToPhysmap, std::uint64_t{XENMEM_add_to_physmap});
  EXPECT_EQ(kXenmemAddToPhysmapBatch, std::uint64_t{XENMEM_add_to_physmap_batch});
  EXPECT_EQ(kMapspaceSharedInfo, std::uint32_t{XENMAPSPACE_shared_info});
  EXPECT_EQ(kMapspaceGrantTable, std::uint32_t{XENMAPSPACE_grant_table});
  EXPECT_EQ(kMapidxGrantTableStatus, std::uint64_t{XENMAPIDX_grant_table_status});

  EXPECT_EQ(sizeof(AddToPhysmap), sizeof(struct xen_add_to_physmap));
  EXPECT_SAME_OFFSET(AddToPhysmap, struct xen_add_to_physmap, domid);
  EXPECT_SAME_OFFSET(AddToPhysmap, struct xen_add_to_physmap, size);
  EXPECT_SAME_OFFSET(AddToPhysmap, struct xen_add_to_physmap, space);
  EXPECT_SAME_OFFSET(AddToPhysmap, struct xen_add_to_physmap, idx);
  EXPECT_SAME_OFFSET(AddToPhysmap, struct xen_add_to_physmap, gpfn);
  EXPECT_EQ(sizeof(AddToPhysmap::idx), sizeof(xen_ulong_t));
  EXPECT_EQ(sizeof(AddToPhysmap::gpfn), sizeof(xen_pfn_t));

  EXPECT_EQ(sizeof(AddToPhysmapBatch), sizeof(struct xen_add_to_physmap_batch));
  EXPECT_SAME_OFFSET(AddToPhysmapBatch, struct xen_add_to_physmap_batch, domid);
  EXPECT_SAME_OFFSET(AddToPhysmapBatch, struct xen_add_to_physmap_batch, space);
  EXPECT_SAME_OFFSET(AddToPhysmapBatch, struct xen_add_to_physmap_batch, size);
  EXPECT_EQ(offsetof(AddToPhysmapBatch, foreign_domid),
            offsetof(struct xen_add_to_physmap_batch, u));
  EXPECT_SAME_OFFSET(AddToPhysmapBatch, struct xen_add_to_physmap_batch, idxs);
  EXPECT_SAME_OFFSET(AddToPhysmapBatch, struct xen_add_to_physmap_batch, gpfns);
  EXPECT_SAME_OFFSET(AddToPhysmapBatch, struct xen_add_to_physmap_batch, errs);
  EXPECT_EQ(sizeof(int), 4u);  // errs[] entries

  EXPECT_EQ(kXenmemIncreaseReservation, std::uint64_t{XENMEM_increase_reservation});
  EXPECT_EQ(kXenmemDecreaseReservation, std::uint64_t{XENMEM_decrease_reservation});
  EXPECT_EQ(kXenmemPopulatePhysmap, std::uint64_t{XENMEM_populate_physmap});
  EXPECT_EQ(sizeof(MemoryReservation), sizeof(struct xen_memory_reservation));
  EXPECT_SAME_OFFSET(MemoryReservation, struct xen_memory_reservation, extent_start);
  EXPECT_SAME_OFFSET(MemoryReservation, struct xen_memory_reservation, nr_extents);
  EXPECT_SAME_OFFSET(MemoryReservation, struct xen_memory_reservation, extent_order);
  EXPECT_SAME_OFFSET(MemoryReservation, struct xen_memory_reservation, mem_flags);
  EXPECT_SAME_OFFSET(MemoryReservation, struct xen_memory_reservation, domid);
}

TEST(XenAbi, HvmOpMatchesXenHeader) {
  EXPECT_EQ(kHvmopSetParam, std::uint64_t{HVMOP_set_param});
  EXPECT_EQ(kHvmopGetParam, std::uint64_t{HVMOP_get_param});
  EXPECT_EQ(kHvmopPagetableDying, std::uint64_t{HVMOP_pagetable_dying});
  EXPECT_EQ(kHvmopSetEvtchnUpcallVector, std::uint64_t{HVMOP_set_evtchn_upcall_vector});
  EXPECT_EQ(kParamCallbackIrq, std::uint32_t{HVM_PARAM_CALLBACK_IRQ});
  EXPECT_EQ(kParamStorePfn, std::uint32_t{HVM_PARAM_STORE_PFN});
  EXPECT_EQ(kParamStoreEvtchn, std::uint32_t{HVM_PARAM_STORE_EVTCHN});
  EXPECT_EQ(kParamVm86Tss, std::uint32_t{HVM_PARAM_VM86_TSS});
  EXPECT_EQ(kParamConsolePfn, std::uint32_t{HVM_PARAM_CONSOLE_PFN});
  EXPECT_EQ(kParamConsoleEvtchn, std::uint32_t{HVM_PARAM_CONSOLE_EVTCHN});
  EXPECT_EQ(kParamAcpiIoportsLocation, std::uint32_t{HVM_PARAM_ACPI_IOPORTS_LOCATION});
  EXPECT_EQ(kParamVmGenerationIdAddr, std::uint32_t{HVM_PARAM_VM_GENERATION_ID_ADDR});
  EXPECT_EQ(kParamAltp2m, std::uint32_t{HVM_PARAM_ALTP2M});
  EXPECT_EQ(kParamX87FipWidth, std::uint32_t{HVM_PARAM_X87_FIP_WIDTH});
  EXPECT_EQ(kParamVm86TssSized, std::uint32_t{HVM_PARAM_VM86_TSS_SIZED});
  EXPECT_EQ(kNrParams, std::uint32_t{HVM_NR_PARAMS});
  EXPECT_EQ(std::uint64_t{0xff} << kCallbackTypeShift,
            std::uint64_t{HVM_PARAM_CALLBACK_IRQ_TYPE_MASK});
  EXPECT_EQ(kCallbackTypeGsi, std::uint64_t{HVM_PARAM_CALLBACK_TYPE_GSI});
  EXPECT_EQ(kCallbackTypePciIntx, std::uint64_t{HVM_PARAM_CALLBACK_TYPE_PCI_INTX});
  EXPECT_EQ(kCallbackTypeVector, std::uint64_t{HVM_PARAM_CALLBACK_TYPE_VECTOR});

  EXPECT_EQ(sizeof(HvmParam), sizeof(struct xen_hvm_param));
  EXPECT_SAME_OFFSET(HvmParam, struct xen_hvm_param, domid);
  EXPECT_SAME_OFFSET(HvmParam, struct xen_hvm_param, pad);
  EXPECT_SAME_OFFSET(HvmParam, struct xen_hvm_param, index);
  EXPECT_SAME_OFFSET(HvmParam, struct xen_hvm_param, value);
  EXPECT_EQ(sizeof(HvmEvtchnUpcallVector), sizeof(struct xen_hvm_evtchn_upcall_vector));
  EXPECT_SAME_OFFSET(HvmEvtchnUpcallVector, struct xen_hvm_evtchn_upcall_vector, vcpu);
  EXPECT_SAME_OFFSET(HvmEvtchnUpcallVector, struct xen_hvm_evtchn_upcall_vector, vector);
}

TEST(XenAbi, VcpuOpMatchesXenHeader) {
  EXPECT_EQ(kVcpuopInitialise, std::uint64_t{VCPUOP_initialise});
  EXPECT_EQ(kVcpuopUp, std::uint64_t{VCPUOP_up});
  EXPECT_EQ(kVcpuopDown, std::uint64_t{VCPUOP_down});
  EXPECT_EQ(kVcpuopIsUp, std::uint64_t{VCPUOP_is_up});
  EXPECT_EQ(kVcpuopGetRunstateInfo, std::uint64_t{VCPUOP_get_runstate_info});
  EXPECT_EQ(kVcpuopRegisterRunstateMemoryArea, std::uint64_t{VCPUOP_register_runstate_memory_area});
  EXPECT_EQ(kVcpuopSetPeriodicTimer, std::uint64_t{VCPUOP_set_periodic_timer});
  EXPECT_EQ(kVcpuopStopPeriodicTimer, std::uint64_t{VCPUOP_stop_periodic_timer});
  EXPECT_EQ(kVcpuopSetSingleshotTimer, std::uint64_t{VCPUOP_set_singleshot_timer});
  EXPECT_EQ(kVcpuopStopSingleshotTimer, std::uint64_t{VCPUOP_stop_singleshot_timer});
  EXPECT_EQ(kVcpuopRegisterVcpuInfo, std::uint64_t{VCPUOP_register_vcpu_info});
  EXPECT_EQ(kVcpuopRegisterVcpuTimeMemoryArea,
            std::uint64_t{VCPUOP_register_vcpu_time_memory_area});
  EXPECT_EQ(kRunstateRunning, RUNSTATE_running);

  EXPECT_EQ(sizeof(VcpuRunstateInfo), sizeof(struct vcpu_runstate_info));
  EXPECT_SAME_OFFSET(VcpuRunstateInfo, struct vcpu_runstate_info, state);
  EXPECT_SAME_OFFSET(VcpuRunstateInfo, struct vcpu_runstate_info, state_entry_time);
  EXPECT_SAME_OFFSET(VcpuRunstateInfo, struct vcpu_runstate_info, time);
  EXPECT_EQ(sizeof(VcpuRunstateInfo::time), sizeof(vcpu_runstate_info::time));
  EXPECT_EQ(sizeof(VcpuRegisterMemoryArea), sizeof(struct vcpu_register_runstate_memory_area));
  EXPECT_EQ(sizeof(VcpuRegisterMemoryArea), sizeof(struct vcpu_register_time_memory_area));
  EXPECT_SAME_OFFSET(VcpuRegisterMemoryArea, struct vcpu_register_runstate_memory_area, addr);
  EXPECT_SAME_OFFSET(VcpuRegisterMemoryArea, struct vcpu_register_time_memory_area, addr);
  EXPECT_EQ(sizeof(VcpuRegisterVcpuInfo), sizeof(struct vcpu_register_vcpu_info));
  EXPECT_SAME_OFFSET(VcpuRegisterVcpuInfo, struct vcpu_register_vcpu_info, mfn);
  EXPECT_SAME_OFFSET(VcpuRegisterVcpuInfo, struct vcpu_register_vcpu_info, offset);
  EXPECT_SAME_OFFSET(VcpuRegisterVcpuInfo, struct vcpu_register_vcpu_info, rsvd);
}

TEST(XenAbi, GrantTableOpMatchesXenHeader) {
  EXPECT_EQ(kGnttabopQuerySize, std::uint64_t{GNTTABOP_query_size});
  EXPECT_EQ(kGnttabopSetVersion, std::uint64_t{GNTTABOP_set_version});
  EXPECT_EQ(kGnttabopGetVersion, std::uint64_t{GNTTABOP_get_version});
  EXPECT_EQ(kGntstOkay, GNTST_okay);
  EXPECT_EQ(kGntstPermissionDenied, GNTST_permission_denied);

  EXPECT_EQ(sizeof(GnttabQuerySize), sizeof(struct gnttab_query_size));
  EXPECT_SAME_OFFSET(GnttabQuerySize, struct gnttab_query_size, dom);
  EXPECT_SAME_OFFSET(GnttabQuerySize, struct gnttab_query_size, nr_frames);
  EXPECT_SAME_OFFSET(GnttabQuerySize, struct gnttab_query_size, max_nr_frames);
  EXPECT_SAME_OFFSET(GnttabQuerySize, struct gnttab_query_size, status);
  EXPECT_EQ(sizeof(GnttabSetVersion), sizeof(struct gnttab_set_version));
  EXPECT_SAME_OFFSET(GnttabSetVersion, struct gnttab_set_version, version);
  EXPECT_EQ(sizeof(GnttabGetVersion), sizeof(struct gnttab_get_version));
  EXPECT_SAME_OFFSET(GnttabGetVersion, struct gnttab_get_version, dom);
  EXPECT_SAME_OFFSET(GnttabGetVersion, struct gnttab_get_version, pad);
  EXPECT_SAME_OFFSET(GnttabGetVersion, struct gnttab_get_version, version);
}

TEST(XenAbi, SchedOpMatchesXenHeader) {
  EXPECT_EQ(kSchedopYield, std::uint64_t{SCHEDOP_yield});
  EXPECT_EQ(kSchedopBlock, std::uint64_t{SCHEDOP_block});
  EXPECT_EQ(kSchedopShutdown, std::uint64_t{SCHEDOP_shutdown});
  EXPECT_EQ(kSchedopPoll, std::uint64_t{SCHEDOP_poll});
  EXPECT_EQ(kSchedopRemoteShutdown, std::uint64_t{SCHEDOP_remote_shutdown});
  EXPECT_EQ(kSchedopShutdownCode, std::uint64_t{SCHEDOP_shutdown_code});
  EXPECT_EQ(kShutdownPoweroff, std::uint32_t{SHUTDOWN_poweroff});
  EXPECT_EQ(kShutdownReboot, std::uint32_t{SHUTDOWN_reboot});
  EXPECT_EQ(kShutdownSuspend, std::uint32_t{SHUTDOWN_suspend});
  EXPECT_EQ(kShutdownCrash, std::uint32_t{SHUTDOWN_crash});
  EXPECT_EQ(kShutdownWatchdog, std::uint32_t{SHUTDOWN_watchdog});

  EXPECT_EQ(sizeof(SchedShutdown), sizeof(struct sched_shutdown));
  EXPECT_SAME_OFFSET(SchedShutdown, struct sched_shutdown, reason);
  EXPECT_EQ(sizeof(SchedPoll), sizeof(struct sched_poll));
  EXPECT_SAME_OFFSET(SchedPoll, struct sched_poll, ports);
  EXPECT_SAME_OFFSET(SchedPoll, struct sched_poll, nr_ports);
  EXPECT_SAME_OFFSET(SchedPoll, struct sched_poll, timeout);
  EXPECT_EQ(sizeof(evtchn_port_t), 4u);
}

TEST(XenAbi, CpuidConstantsMatchXenHeader) {
  EXPECT_EQ(kCpuidBase, std::uint32_t{XEN_CPUID_FIRST_LEAF});
  EXPECT_EQ(kHvmCpuidVcpuIdPresent, XEN_HVM_CPUID_VCPU_ID_PRESENT);
  EXPECT_EQ(kHvmCpuidDomidPresent, XEN_HVM_CPUID_DOMID_PRESENT);
  EXPECT_EQ(kHvmCpuidUpcallVector, XEN_HVM_CPUID_UPCALL_VECTOR);
}

}  // namespace
}  // namespace xpv::xen::abi
