// Hypercall numbers, sub-command numbers and argument structs of the Xen guest ABI that the HVM
// platform answers (x86_64 layout, latest interface version), from the public headers
// public/xen.h, version.h, features.h, memory.h, hvm/hvm_op.h, hvm/params.h, vcpu.h,
// grant_table.h, sched.h. The evtchn_* structs live in xpv/domain/evtchn_abi.h and are reused.
// Every struct is checked field by field against /usr/include/xen in tests/unit/xen/abi_test.cpp.
//
// Guest pointers inside structs (XEN_GUEST_HANDLE) are 64-bit guest-virtual addresses here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace xpv::xen::abi {

// ---- __HYPERVISOR_* (public/xen.h) ----
inline constexpr unsigned kHcMemoryOp = 12;
inline constexpr unsigned kHcXenVersion = 17;
inline constexpr unsigned kHcConsoleIo = 18;
inline constexpr unsigned kHcGrantTableOp = 20;
inline constexpr unsigned kHcVcpuOp = 24;
inline constexpr unsigned kHcSchedOp = 29;
inline constexpr unsigned kHcEventChannelOp = 32;
inline constexpr unsigned kHcHvmOp = 34;
// One past the highest hypercall number (__HYPERVISOR_arch_7 = 55): the counter table size.
inline constexpr unsigned kNrHypercalls = 64;

// ---- XENVER_* (version.h) ----
inline constexpr std::uint64_t kXenverVersion = 0;
inline constexpr std::uint64_t kXenverExtraversion = 1;
inline constexpr std::uint64_t kXenverCompileInfo = 2;
inline constexpr std::uint64_t kXenverCapabilities = 3;
inline constexpr std::uint64_t kXenverChangeset = 4;
inline constexpr std::uint64_t kXenverPlatformParameters = 5;
inline constexpr std::uint64_t kXenverGetFeatures = 6;
inline constexpr std::uint64_t kXenverPagesize = 7;
inline constexpr std::uint64_t kXenverGuestHandle = 8;
inline constexpr std::size_t kExtraversionLen = 16;    // xen_extraversion_t
inline constexpr std::size_t kCapabilitiesLen = 1024;  // xen_capabilities_info_t
inline constexpr std::size_t kChangesetLen = 64;       // xen_changeset_info_t
inline constexpr std::size_t kDomainHandleLen = 16;    // xen_domain_handle_t

struct CompileInfo {          // struct xen_compile_info
  char compiler[64];          // 0x00
  char compile_by[16];        // 0x40
  char compile_domain[32];    // 0x50
  char compile_date[32];      // 0x70
};
static_assert(std::is_standard_layout_v<CompileInfo> && sizeof(CompileInfo) == 144);
static_assert(offsetof(CompileInfo, compile_by) == 0x40 &&
              offsetof(CompileInfo, compile_domain) == 0x50 &&
              offsetof(CompileInfo, compile_date) == 0x70);

struct PlatformParameters {   // struct xen_platform_parameters
  std::uint64_t virt_start;   // 0x0  xen_ulong_t
};
static_assert(std::is_standard_layout_v<PlatformParameters> && sizeof(PlatformParameters) == 8);

struct FeatureInfo {          // struct xen_feature_info
  std::uint32_t submap_idx;   // 0x0  IN
  std::uint32_t submap;       // 0x4  OUT
};
static_assert(std::is_standard_layout_v<FeatureInfo> && sizeof(FeatureInfo) == 8);
static_assert(offsetof(FeatureInfo, submap) == 4);

// ---- XENFEAT_* (features.h): bit numbers in submap 0 ----
inline constexpr unsigned kFeatAutoTranslatedPhysmap = 2;
inline constexpr unsigned kFeatHvmCallbackVector = 8;
inline constexpr unsigned kFeatHvmSafePvclock = 9;  // NOT offered (no pvclock)
inline constexpr unsigned kFeatHvmPirqs = 10;       // NOT offered
inline constexpr unsigned kFeatNrSubmaps = 1;

// ---- XENMEM_* (memory.h) ----
inline constexpr std::uint64_t kXenmemIncreaseReservation = 0;
inline constexpr std::uint64_t kXenmemDecreaseReservation = 1;
inline constexpr std::uint64_t kXenmemPopulatePhysmap = 6;
inline constexpr std::uint64_t kXenmemAddToPhysmap = 7;
inline constexpr std::uint64_t kXenmemAddToPhysmapBatch = 23;
inline constexpr std::uint32_t kMapspaceSharedInfo = 0;
inline constexpr std::uint32_t kMapspaceGrantTable = 1;
inline constexpr std::uint64_t kMapidxGrantTableStatus = 0x80000000;

struct AddToPhysmap {         // struct xen_add_to_physmap
  std::uint16_t domid;        // 0x00
  std::uint16_t size;         // 0x02  gmfn_range only
  std::uint32_t space;        // 0x04  XENMAPSPACE_*
  std::uint64_t idx;          // 0x08  xen_ulong_t
  std::uint64_t gpfn;         // 0x10  xen_pfn_t
};
static_assert(std::is_standard_layout_v<AddToPhysmap> && sizeof(AddToPhysmap) == 24);
static_assert(offsetof(AddToPhysmap, size) == 2 && offsetof(AddToPhysmap, space) == 4 &&
              offsetof(AddToPhysmap, idx) == 8 && offsetof(AddToPhysmap, gpfn) == 16);

struct AddToPhysmapBatch {    // struct xen_add_to_physmap_batch (interface ≥ 0x00040700)
  std::uint16_t domid;        // 0x00
  std::uint16_t space;        // 0x02
  std::uint16_t size;         // 0x04  number of entries
  std::uint16_t foreign_domid;// 0x06  union u { foreign_domid; res0 }
  std::uint64_t idxs;         // 0x08  guest handle: xen_ulong_t[size]
  std::uint64_t gpfns;        // 0x10  guest handle: xen_pfn_t[size]
  std::uint64_t errs;         // 0x18  guest handle: int[size] (OUT)
};
static_assert(std::is_standard_layout_v<AddToPhysmapBatch> && sizeof(AddToPhysmapBatch) == 32);
static_assert(offsetof(AddToPhysmapBatch, space) == 2 && offsetof(AddToPhysmapBatch, size) == 4 &&
              offsetof(AddToPhysmapBatch, foreign_domid) == 6 &&
              offsetof(AddToPhysmapBatch, idxs) == 8 && offsetof(AddToPhysmapBatch, gpfns) == 16 &&
              offsetof(AddToPhysmapBatch, errs) == 24);

struct MemoryReservation {    // struct xen_memory_reservation (XENMEM_{increase,decrease}_reservation, populate_physmap)
  std::uint64_t extent_start; // 0x00  guest handle: xen_pfn_t[nr_extents] (GPFN bases for an HVM guest)
  std::uint64_t nr_extents;   // 0x08  xen_ulong_t
  std::uint32_t extent_order; // 0x10  each extent is 2^extent_order pages
  std::uint32_t mem_flags;    // 0x14  XENMEMF_* (address bits, NUMA node)
  std::uint16_t domid;        // 0x18
};
static_assert(std::is_standard_layout_v<MemoryReservation> && sizeof(MemoryReservation) == 32);
static_assert(offsetof(MemoryReservation, nr_extents) == 8 && offsetof(MemoryReservation, extent_order) == 16 &&
              offsetof(MemoryReservation, mem_flags) == 20 && offsetof(MemoryReservation, domid) == 24);

// ---- HVMOP_* (hvm/hvm_op.h) and HVM_PARAM_* (hvm/params.h) ----
inline constexpr std::uint64_t kHvmopSetParam = 0;
inline constexpr std::uint64_t kHvmopGetParam = 1;
inline constexpr std::uint64_t kHvmopPagetableDying = 9;
inline constexpr std::uint64_t kHvmopSetEvtchnUpcallVector = 23;

inline constexpr std::uint32_t kParamCallbackIrq = 0;
inline constexpr std::uint32_t kParamStorePfn = 1;
inline constexpr std::uint32_t kParamStoreEvtchn = 2;
inline constexpr std::uint32_t kParamVm86Tss = 15;
inline constexpr std::uint32_t kParamConsolePfn = 17;
inline constexpr std::uint32_t kParamConsoleEvtchn = 18;
inline constexpr std::uint32_t kParamAcpiIoportsLocation = 19;
inline constexpr std::uint32_t kParamVmGenerationIdAddr = 34;
inline constexpr std::uint32_t kParamAltp2m = 35;
inline constexpr std::uint32_t kParamX87FipWidth = 36;
inline constexpr std::uint32_t kParamVm86TssSized = 37;
inline constexpr std::uint32_t kNrParams = 39;  // HVM_NR_PARAMS
// HVM_PARAM_CALLBACK_IRQ: type in bits 63:56.
inline constexpr unsigned kCallbackTypeShift = 56;
inline constexpr std::uint64_t kCallbackTypeGsi = 0;      // bits 55:0 = GSI (0 = disabled)
inline constexpr std::uint64_t kCallbackTypePciIntx = 1;  // bits 31:0 = domain:bus:devfn:intx
inline constexpr std::uint64_t kCallbackTypeVector = 2;   // bits 7:0 = vector

struct HvmParam {             // struct xen_hvm_param
  std::uint16_t domid;        // 0x00
  std::uint16_t pad;          // 0x02
  std::uint32_t index;        // 0x04
  std::uint64_t value;        // 0x08  IN (set) / OUT (get)
};
static_assert(std::is_standard_layout_v<HvmParam> && sizeof(HvmParam) == 16);
static_assert(offsetof(HvmParam, index) == 4 && offsetof(HvmParam, value) == 8);

struct HvmEvtchnUpcallVector {  // struct xen_hvm_evtchn_upcall_vector
  std::uint32_t vcpu;           // 0x0
  std::uint8_t vector;          // 0x4
  std::uint8_t pad[3];          // 0x5  implicit tail padding in the C struct
};
static_assert(std::is_standard_layout_v<HvmEvtchnUpcallVector> &&
              sizeof(HvmEvtchnUpcallVector) == 8);
static_assert(offsetof(HvmEvtchnUpcallVector, vector) == 4);

// ---- VCPUOP_* (vcpu.h) ----
inline constexpr std::uint64_t kVcpuopInitialise = 0;
inline constexpr std::uint64_t kVcpuopUp = 1;
inline constexpr std::uint64_t kVcpuopDown = 2;
inline constexpr std::uint64_t kVcpuopIsUp = 3;
inline constexpr std::uint64_t kVcpuopGetRunstateInfo = 4;
inline constexpr std::uint64_t kVcpuopRegisterRunstateMemoryArea = 5;
inline constexpr std::uint64_t kVcpuopSetPeriodicTimer = 6;
inline constexpr std::uint64_t kVcpuopStopPeriodicTimer = 7;
inline constexpr std::uint64_t kVcpuopSetSingleshotTimer = 8;
inline constexpr std::uint64_t kVcpuopStopSingleshotTimer = 9;
inline constexpr std::uint64_t kVcpuopRegisterVcpuInfo = 10;
inline constexpr std::uint64_t kVcpuopRegisterVcpuTimeMemoryArea = 13;
inline constexpr std::int32_t kRunstateRunning = 0;

struct VcpuRunstateInfo {         // struct vcpu_runstate_info
  std::int32_t state;             // 0x00  RUNSTATE_*
  std::uint32_t pad0;             // 0x04  implicit padding in the C struct
  std::uint64_t state_entry_time; // 0x08
  std::uint64_t time[4];          // 0x10
};
static_assert(std::is_standard_layout_v<VcpuRunstateInfo> && sizeof(VcpuRunstateInfo) == 48);
static_assert(offsetof(VcpuRunstateInfo, state_entry_time) == 8 &&
              offsetof(VcpuRunstateInfo, time) == 16);

struct VcpuRegisterMemoryArea {  // struct vcpu_register_runstate_memory_area and
  std::uint64_t addr;            // 0x0  vcpu_register_time_memory_area: union { h; v; p }
};
static_assert(std::is_standard_layout_v<VcpuRegisterMemoryArea> &&
              sizeof(VcpuRegisterMemoryArea) == 8);

struct VcpuRegisterVcpuInfo {  // struct vcpu_register_vcpu_info
  std::uint64_t mfn;           // 0x00  gfn for an HVM guest
  std::uint32_t offset;        // 0x08
  std::uint32_t rsvd;          // 0x0c
};
static_assert(std::is_standard_layout_v<VcpuRegisterVcpuInfo> &&
              sizeof(VcpuRegisterVcpuInfo) == 16);
static_assert(offsetof(VcpuRegisterVcpuInfo, offset) == 8 &&
              offsetof(VcpuRegisterVcpuInfo, rsvd) == 12);

// ---- GNTTABOP_* (grant_table.h) ----
inline constexpr std::uint64_t kGnttabopQuerySize = 6;
inline constexpr std::uint64_t kGnttabopSetVersion = 8;
inline constexpr std::uint64_t kGnttabopGetVersion = 10;
inline constexpr std::int16_t kGntstOkay = 0;
inline constexpr std::int16_t kGntstPermissionDenied = -8;

struct GnttabQuerySize {       // struct gnttab_query_size
  std::uint16_t dom;           // 0x00  IN
  std::uint16_t pad0;          // 0x02  implicit padding
  std::uint32_t nr_frames;     // 0x04  OUT
  std::uint32_t max_nr_frames; // 0x08  OUT
  std::int16_t status;         // 0x0c  OUT GNTST_*
  std::uint16_t pad1;          // 0x0e  implicit tail padding
};
static_assert(std::is_standard_layout_v<GnttabQuerySize> && sizeof(GnttabQuerySize) == 16);
static_assert(offsetof(GnttabQuerySize, nr_frames) == 4 &&
              offsetof(GnttabQuerySize, max_nr_frames) == 8 &&
              offsetof(GnttabQuerySize, status) == 12);

struct GnttabSetVersion {  // struct gnttab_set_version
  std::uint32_t version;   // 0x0  IN/OUT
};
static_assert(std::is_standard_layout_v<GnttabSetVersion> && sizeof(GnttabSetVersion) == 4);

struct GnttabGetVersion {  // struct gnttab_get_version
  std::uint16_t dom;       // 0x0  IN
  std::uint16_t pad;       // 0x2
  std::uint32_t version;   // 0x4  OUT
};
static_assert(std::is_standard_layout_v<GnttabGetVersion> && sizeof(GnttabGetVersion) == 8);
static_assert(offsetof(GnttabGetVersion, version) == 4);

// ---- SCHEDOP_* and SHUTDOWN_* (sched.h) ----
inline constexpr std::uint64_t kSchedopYield = 0;
inline constexpr std::uint64_t kSchedopBlock = 1;
inline constexpr std::uint64_t kSchedopShutdown = 2;
inline constexpr std::uint64_t kSchedopPoll = 3;
inline constexpr std::uint64_t kSchedopRemoteShutdown = 4;
inline constexpr std::uint64_t kSchedopShutdownCode = 5;
inline constexpr std::uint32_t kShutdownPoweroff = 0;
inline constexpr std::uint32_t kShutdownReboot = 1;
inline constexpr std::uint32_t kShutdownSuspend = 2;
inline constexpr std::uint32_t kShutdownCrash = 3;
inline constexpr std::uint32_t kShutdownWatchdog = 4;
inline constexpr std::uint32_t kSchedPollMaxPorts = 128;  // Xen's limit

struct SchedShutdown {   // struct sched_shutdown
  std::uint32_t reason;  // 0x0  SHUTDOWN_*
};
static_assert(std::is_standard_layout_v<SchedShutdown> && sizeof(SchedShutdown) == 4);

struct SchedPoll {          // struct sched_poll
  std::uint64_t ports;      // 0x00  guest handle: evtchn_port_t[nr_ports]
  std::uint32_t nr_ports;   // 0x08
  std::uint32_t pad0;       // 0x0c  implicit padding
  std::uint64_t timeout;    // 0x10  absolute Xen system time (ns), 0 = none
};
static_assert(std::is_standard_layout_v<SchedPoll> && sizeof(SchedPoll) == 24);
static_assert(offsetof(SchedPoll, nr_ports) == 8 && offsetof(SchedPoll, timeout) == 16);

// ---- CONSOLEIO_* (xen.h) ----
inline constexpr std::uint64_t kConsoleioWrite = 0;
inline constexpr std::uint64_t kConsoleioRead = 1;

}  // namespace xpv::xen::abi
