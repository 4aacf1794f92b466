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
// Older kernels instead write the hypercall-page MSR (CPUID leaf 0x40000002 ebx = 0x40000000)
// with a guest page address; the VMM fills that page with build_hypercall_page(): entry i at
// byte i*32 is
//   b8 ii ii ii ii   mov $i, %eax
//   e6 PP            out %al, $PP
//   c3               ret
// followed by 24 bytes of cc (int3), for i = 0..127.
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

// The 4 KiB hypercall page for kernels that use the hypercall-page MSR (layout above).
std::array<std::uint8_t, 4096> build_hypercall_page(std::uint8_t port);

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
