// Hypercall-stub rewriting (DESIGN.md §4 "Hypercall delivery").
//
// Since XSA-466 Linux calls Xen through two stubs and picks one by CPU vendor:
//   xen_hypercall_amd:    0f 01 d9  vmmcall      then  e9 rel32  jmp <return thunk>
//   xen_hypercall_intel:  0f 01 c1  vmcall       then  e9 rel32  jmp <return thunk>
// 16 bytes apart (amd first in Debian 12's 6.1.0-57). Without KVM_CAP_XEN_HVM the host KVM
// answers vmmcall/vmcall itself, so the VMM rewrites each 3-byte instruction into
//   e6 PP   out %al, $PP     (PP = kHypercallPort; a port-I/O exit reaches the VMM)
//   90      nop
// before the guest runs. Also accepted as the stub tail: c3 (ret), for kernels built without
// return thunks. The pair may appear in either order.
//
// Fast event-channel sends (patch_hypercall_stubs_fast_send): the two stubs and their padding are
// 32 bytes that only this routine uses, so they can hold one that handles EVTCHNOP_send itself.
// With X the lower stub, both entries (X and X+16) reach X+0:
//   X+0   83 f8 20      cmp $0x20, %eax         HYPERVISOR_event_channel_op?
//   X+3   75 14         jne X+25
//   X+5   83 ff 04      cmp $4, %edi            EVTCHNOP_send?
//   X+8   75 0f         jne X+25
//   X+10  ad            lods (%rsi), %eax       the port (struct evtchn_send); rsi += 4
//   X+11  99            cltd                    edx = 0 (a port is below 2^31): the result...
//   X+12  e7 SS         out %eax, $SS           ...unless the VMM writes another. SS =
//   X+14  eb 02         jmp X+18                kEvtchnSendPort, 4 bytes: the port
//   X+16  eb ee         jmp X+0                 the second entry
//   X+18  48 92         xchg %rax, %rdx         rax = the result
//   X+20  e9 rel32      jmp <return thunk>      (or c3 cc cc cc cc)
//   X+25  e6 PP         out %al, $PP            every other hypercall, as above
//   X+27  e9 rel32      jmp <return thunk>      (or c3 cc cc cc cc)
// A 4-byte OUT to SS whose value is a port the VMM registered as a KVM ioeventfd (a port
// connected to a backend) signals that backend's eventfd inside the host kernel: no exit to the
// VMM at all. Any other port exits to the VMM, which performs the send and writes the result in
// rdx. rdx, rsi and rax may be clobbered: Linux's two-argument hypercalls declare rdx clobbered
// and rdi/rsi in/out (arch/x86/include/asm/xen/hypercall.h, __HYPERCALL_CLOBBER2); privcmd's
// five-argument call declares them all.
// A kernel built with return thunks (CONFIG_RETHUNK) lists each stub's `jmp <return thunk>` in
// its .return_sites and rewrites every listed one at boot (into `ret` or a jmp to the thunk it
// chose), warning about a listed instruction that is no longer such a jmp. So the routine keeps
// two such jmps (X+20, X+27) and the two entries are moved to them.
//
// Older kernels instead write the hypercall-page MSR (CPUID leaf 0x40000002 ebx = 0x40000000)
// with a guest page address; the VMM fills that page with build_hypercall_page(): entry i at
// byte i*32 is
//   b8 ii ii ii ii   mov $i, %eax
//   e6 PP            out %al, $PP
//   c3               ret
// followed by 24 bytes of cc (int3), for i = 0..127. With fast sends (the second overload of
// build_hypercall_page), entry 32, HYPERVISOR_event_channel_op, is the routine's equivalent:
//   +0   83 ff 04      cmp $4, %edi            EVTCHNOP_send?
//   +3   75 07         jne +12
//   +5   ad            lods (%rsi), %eax       the port; rsi += 4 (rsi is in/out there too)
//   +6   99            cltd                    edx = 0, the result unless the VMM writes another
//   +7   e7 SS         out %eax, $SS           a KVM ioeventfd, or the same trap as the stubs'
//   +9   48 92         xchg %rax, %rdx         rax = the result
//   +11  c3            ret
//   +12  b8 20 00 00 00  mov $32, %eax         every other command, as the other entries
//   +17  e6 PP         out %al, $PP
//   +19  c3            ret
// and int3 up to 32 bytes. Linux's callers of the page (_hypercall2, privcmd_call) use the
// same convention as its stubs' (rdi/rsi in/out, rdx clobbered), so the same trap serves both;
// the VMM accepts no other kernel with a hypercall page (find_hypercall_page_placeholder). 64-bit guests
// only, as the hypercall trap itself (a 32-bit kernel passes arguments in ebx, ecx, ...).
//
// Such a kernel carries its own placeholder for that page — page-aligned, 128 identical 32-byte
// entries of one `ret` (c3) padded with int3 (cc) or nop (90) bytes, in whatever order — which
// find_hypercall_page_placeholder() recognises, so that the VMM can tell "uses the hypercall
// page" from "has no way to call Xen that xpv can trap".
//
// All functions are pure (no guest, no KVM) and run on the main thread while loading the kernel.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "xpv/expected.h"

namespace xpv::xen {

struct StubSites {
  std::size_t amd = 0;    // offset of 0f 01 d9 (vmmcall) in the image
  std::size_t intel = 0;  // offset of 0f 01 c1 (vmcall) in the image
};

inline constexpr std::size_t kStubDistance = 16;
inline constexpr std::size_t kHypercallPageEntryBytes = 32;

// Scans the whole image (a decompressed vmlinux, or the loaded kernel in guest RAM) for
// exactly one amd/intel stub pair. Zero pairs or more than one → an error message naming the
// count (and the first two offsets). Never reads outside `image`.
Expected<StubSites, std::string> find_hypercall_stubs(std::span<const std::uint8_t> image);

// Rewrites both sites to `e6 port 90`. Idempotent (a site already rewritten for the same port is
// left alone). Throws std::invalid_argument if a site is out of range or holds neither the
// expected instruction nor the rewrite (setup code: the sites must come from
// find_hypercall_stubs on the same image).
void patch_hypercall_stubs(std::span<std::uint8_t> image, const StubSites& sites,
                           std::uint8_t port);

// Where a table of the kernel lies in `image` (absent: the kernel has none).
struct ImageRange {
  std::size_t offset = 0;
  std::size_t size = 0;
};
// The kernel's tables about the code the routine replaces (kvm::LoadedKernel::tables):
//  return_sites   int32 offsets, each relative to its entry, to the `jmp <return thunk>`
//                 instructions the kernel rewrites at boot;
//  orc_unwind_ip  int32 offsets likewise, sorted, and orc_unwind the 6-byte unwind state that
//                 holds from each of those addresses on (ORC unwinder).
struct KernelTables {
  std::optional<ImageRange> return_sites, orc_unwind_ip, orc_unwind;
};

// Rewrites the pair and the padding after each stub into the fast-send routine above (send_port
// = SS, port = PP) and keeps the kernel's tables true: the stubs' .return_sites entries move to
// the routine's two returns, and the ORC entries inside the 32 bytes (objtool marked the padding
// "undefined", which stops a stack walk) take the state of the first stub's entry (a function
// entered by call, nothing pushed: true of every instruction of the routine). Leaves the image
// unchanged and says why when the 32 bytes are not exactly the two stubs and their padding (int3
// or NOP instructions up to each stub's 16 bytes), when the two jump to different return thunks,
// when stubs that return through a thunk are not each listed once in return_sites (or it is
// missing), when ORC tables are given and disagree in length or have no entry for the first
// stub, or when a site or table is out of range. Idempotent. The caller then falls back to
// patch_hypercall_stubs.
Expected<void, std::string> patch_hypercall_stubs_fast_send(std::span<std::uint8_t> image, const StubSites& sites,
                                                            std::uint8_t port, std::uint8_t send_port,
                                                            const KernelTables& tables);

// The 4 KiB hypercall page for kernels that use the hypercall-page MSR (layout above); the
// second form with the fast-send entry for event_channel_op (send_port = SS).
std::array<std::uint8_t, 4096> build_hypercall_page(std::uint8_t port);
std::array<std::uint8_t, 4096> build_hypercall_page(std::uint8_t port, std::uint8_t send_port);

// The MSR Xen's CPUID leaf 0x40000002 names (ebx) and how many pages it offers (eax).
inline constexpr std::uint32_t kHypercallPageMsr = 0x4000'0000;
inline constexpr std::uint32_t kHypercallPages = 1;

// A write of `value` to kHypercallPageMsr: bits 63:12 are the page's guest frame, bits 11:0 the
// index of the hypercall page wanted (Xen's rule). Returns the page's guest-physical address, or
// why the write must fault (index ≥ kHypercallPages).
Expected<std::uint64_t, std::string> hypercall_page_address(std::uint64_t value);

// Offset of the first hypercall-page placeholder (layout above) in `image`, whose offset 0 is
// page-aligned in guest memory; nullopt when there is none.
std::optional<std::size_t> find_hypercall_page_placeholder(std::span<const std::uint8_t> image);

}  // namespace xpv::xen
