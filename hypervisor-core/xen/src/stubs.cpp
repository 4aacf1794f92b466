// Hypercall-stub finder and rewriter, and the hypercall page: see stubs.h for the bytes.
#include "xpv/xen/stubs.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "xpv/xen/abi.h"

namespace xpv::xen {

namespace {

constexpr std::uint8_t kVmmcall[3] = {0x0f, 0x01, 0xd9};  // AMD
constexpr std::uint8_t kVmcall[3] = {0x0f, 0x01, 0xc1};   // Intel
constexpr std::uint8_t kJmpRel32 = 0xe9;
constexpr std::uint8_t kRet = 0xc3;
constexpr std::uint8_t kOutImm8Al = 0xe6;
constexpr std::uint8_t kNop = 0x90;
constexpr std::uint8_t kMovImm32Eax = 0xb8;
constexpr std::uint8_t kInt3 = 0xcc;

// A stub at `at`: the 3-byte instruction, then `jmp rel32` (5 bytes) or `ret`, all inside image.
bool stub_at(std::span<const std::uint8_t> image, std::size_t at, const std::uint8_t (&insn)[3]) {
  if (at > image.size() || image.size() - at < 4) return false;
  if (std::memcmp(image.data() + at, insn, 3) != 0) return false;
  const std::uint8_t tail = image[at + 3];
  if (tail == kRet) return true;
  return tail == kJmpRel32 && image.size() - at >= 8;
}

}  // namespace

Expected<StubSites, std::string> find_hypercall_stubs(std::span<const std::uint8_t> image) {
  std::size_t count = 0;
  StubSites first{}, second{};
  const std::uint8_t* const base = image.data();
  std::size_t pos = 0;
  while (pos < image.size()) {
    const void* hit = std::memchr(base + pos, 0x0f, image.size() - pos);
    if (!hit) break;
    const std::size_t at = static_cast<std::size_t>(static_cast<const std::uint8_t*>(hit) - base);
    pos = at + 1;
    StubSites s{};
    if (stub_at(image, at, kVmmcall) && stub_at(image, at + kStubDistance, kVmcall)) {
      s = {at, at + kStubDistance};
    } else if (stub_at(image, at, kVmcall) && stub_at(image, at + kStubDistance, kVmmcall)) {
      s = {at + kStubDistance, at};
    } else {
      continue;
    }
    if (count == 0) first = s;
    if (count == 1) second = s;
    ++count;
  }
  if (count == 1) return first;
  if (count == 0)
    return fail(std::string(
        "no Xen hypercall stub pair (vmmcall+jmp and vmcall+jmp 16 bytes apart) in the kernel "
        "image"));
  return fail(fmt::format(
      "{} candidate Xen hypercall stub pairs in the kernel image (amd/intel at {:#x}/{:#x} and "
      "{:#x}/{:#x}, ...): refusing to guess which to rewrite",
      count, first.amd, first.intel, second.amd, second.intel));
}

void patch_hypercall_stubs(std::span<std::uint8_t> image, const StubSites& sites,
                           std::uint8_t port) {
  const std::uint8_t rewrite[3] = {kOutImm8Al, port, kNop};
  auto patch = [&](std::size_t at, const std::uint8_t (&insn)[3], const char* what) {
    if (at > image.size() || image.size() - at < 3)
      throw std::invalid_argument(
          fmt::format("hypercall stub ({}) at {:#x} is outside the {}-byte image", what, at,
                      image.size()));
    std::uint8_t* p = image.data() + at;
    if (std::memcmp(p, rewrite, 3) == 0) return;
    if (std::memcmp(p, insn, 3) != 0)
      throw std::invalid_argument(fmt::format(
          "hypercall stub ({}) at {:#x} holds {:02x} {:02x} {:02x}, not the expected instruction",
          what, at, p[0], p[1], p[2]));
    std::memcpy(p, rewrite, 3);
  };
  patch(sites.amd, kVmmcall, "vmmcall");
  patch(sites.intel, kVmcall, "vmcall");
}

namespace {

// Length of the int3 or NOP instruction at p (at most `left` bytes), 0 if it is neither: what an
// assembler pads a function to its alignment with (0x90, 66 90, and the 0f 1f forms).
std::size_t padding_insn(const std::uint8_t* p, std::size_t left) {
  if (left == 0) return 0;
  if (p[0] == kInt3 || p[0] == kNop) return 1;
  std::size_t prefix = 0;
  while (prefix < left && (p[prefix] == 0x66 || p[prefix] == 0x2e)) ++prefix;  // operand size, cs (GNU as)
  if (prefix > 0 && prefix < left && p[prefix] == kNop) return prefix + 1;
  if (left < prefix + 3 || p[prefix] != 0x0f || p[prefix + 1] != 0x1f) return 0;
  const std::uint8_t modrm = p[prefix + 2];
  const std::uint8_t mod = modrm >> 6, rm = modrm & 0x07;
  if (mod == 3) return 0;
  std::size_t n = prefix + 3;
  if (rm == 4) {  // SIB byte; base 101 with mod 00 means a disp32 and no base
    if (left < n + 1) return 0;
    if (mod == 0 && (p[n] & 0x07) == 5) n += 4;
    ++n;
  } else if (mod == 0 && rm == 5) {
    n += 4;  // rip-relative disp32
  }
  if (mod == 1) n += 1;       // disp8
  else if (mod == 2) n += 4;  // disp32
  return n <= left ? n : 0;
}

bool all_padding(const std::uint8_t* p, std::size_t n) {
  while (n > 0) {
    const std::size_t len = padding_insn(p, n);
    if (len == 0) return false;
    p += len;
    n -= len;
  }
  return true;
}

}  // namespace

Expected<void, std::string> patch_hypercall_stubs_fast_send(std::span<std::uint8_t> image, const StubSites& sites,
                                                            std::uint8_t port, std::uint8_t send_port,
                                                            const KernelTables& tables) {
  constexpr std::size_t kRegion = 2 * kStubDistance;
  constexpr std::size_t kRet1 = 20, kRet2 = 27;  // the routine's two returns (stubs.h)
  const std::size_t lo = std::min(sites.amd, sites.intel);
  if (std::max(sites.amd, sites.intel) - lo != kStubDistance || lo > image.size() || image.size() - lo < kRegion) {
    return fail(fmt::format("hypercall stubs at {:#x}/{:#x} are not a pair of 16-byte stubs inside the {}-byte image",
                            sites.amd, sites.intel, image.size()));
  }
  std::uint8_t* const x = image.data() + lo;
  std::optional<std::int64_t> thunk;  // the return thunk, relative to x; none: the stubs return with ret
  auto build = [&](std::uint8_t (&r)[kRegion]) {
    const std::uint8_t head[kRet1] = {
        0x83, 0xf8, 0x20,  // cmp $0x20, %eax
        0x75, 0x14,        // jne X+25
        0x83, 0xff, 0x04,  // cmp $4, %edi
        0x75, 0x0f,        // jne X+25
        0xad,              // lods (%rsi), %eax
        0x99,              // cltd
        0xe7, send_port,   // out %eax, $SS
        0xeb, 0x02,        // jmp X+18
        0xeb, 0xee,        // X+16: jmp X+0
        0x48, 0x92,        // xchg %rax, %rdx
    };
    std::memcpy(r, head, sizeof head);
    auto ret_at = [&](std::size_t at) {
      if (!thunk) {
        const std::uint8_t t[5] = {kRet, kInt3, kInt3, kInt3, kInt3};
        std::memcpy(r + at, t, sizeof t);
        return;
      }
      const auto rel = static_cast<std::int32_t>(*thunk - static_cast<std::int64_t>(at + 5));
      r[at] = kJmpRel32;
      std::memcpy(r + at + 1, &rel, 4);
    };
    ret_at(kRet1);
    r[kRet1 + 5] = kOutImm8Al;  // X+25
    r[kRet1 + 6] = port;
    ret_at(kRet2);
  };
  std::uint8_t routine[kRegion];
  // Already rewritten (idempotent): recognise the routine by its fixed bytes and its return.
  if (x[0] == 0x83 && x[16] == 0xeb && (x[kRet1] == kJmpRel32 || x[kRet1] == kRet)) {
    if (x[kRet1] == kJmpRel32) {
      std::int32_t rel;
      std::memcpy(&rel, x + kRet1 + 1, 4);
      thunk = std::int64_t{rel} + kRet1 + 5;
    }
    build(routine);
    if (std::memcmp(x, routine, kRegion) == 0) return {};
    thunk.reset();
  }
  bool ret = false;
  for (std::size_t at : {std::size_t{0}, kStubDistance}) {
    const std::uint8_t* s = x + at;
    const bool amd = lo + at == sites.amd;
    if (std::memcmp(s, amd ? kVmmcall : kVmcall, 3) != 0) {
      return fail(fmt::format("hypercall stub at {:#x} holds {:02x} {:02x} {:02x}, not {}", lo + at, s[0], s[1], s[2],
                              amd ? "vmmcall" : "vmcall"));
    }
    std::size_t end;  // where the stub's padding starts
    if (s[3] == kRet) {
      if (thunk) return fail("one hypercall stub returns with ret, the other through a return thunk");
      ret = true;
      end = 4;
    } else if (s[3] == kJmpRel32) {
      if (ret) return fail("one hypercall stub returns with ret, the other through a return thunk");
      std::int32_t rel;
      std::memcpy(&rel, s + 4, 4);
      const std::int64_t target = static_cast<std::int64_t>(at) + 8 + rel;
      if (thunk && *thunk != target) return fail("the two hypercall stubs jump to different return thunks");
      thunk = target;
      end = 8;
    } else {
      return fail(fmt::format("hypercall stub at {:#x} is followed by {:02x}, not jmp or ret", lo + at, s[3]));
    }
    if (!all_padding(s + end, kStubDistance - end)) {
      return fail(fmt::format("the 16 bytes of the hypercall stub at {:#x} hold more than the stub and its padding",
                              lo + at));
    }
  }
  // A kernel built with return thunks lists both stubs' jmp in .return_sites and rewrites each
  // listed jmp at boot (it warns about one that is no longer a jmp to the thunk): the entries
  // move to the routine's two returns, which are such jmps again.
  auto in_image = [&](const ImageRange& r, std::size_t unit) {
    return r.offset <= image.size() && r.size <= image.size() - r.offset && r.size % unit == 0;
  };
  // Each int32 entry of a table of offsets (relative to the entry), with where it points,
  // relative to the routine.
  auto for_each_offset = [&](const ImageRange& r, auto&& fn) {
    for (std::size_t e = r.offset; e < r.offset + r.size; e += 4) {
      std::int32_t v;
      std::memcpy(&v, image.data() + e, 4);
      fn(e, static_cast<std::int64_t>(e) + v - static_cast<std::int64_t>(lo));
    }
  };
  const auto& return_sites = tables.return_sites;
  std::size_t entry[2] = {0, 0};  // image offsets of the entries for the lower and upper stub
  if (thunk) {
    if (!return_sites) return fail("the stubs return through a return thunk and the kernel's .return_sites was not found");
    if (!in_image(*return_sites, 4)) return fail("the kernel's .return_sites lies outside its image");
    int found[2] = {0, 0};
    for_each_offset(*return_sites, [&](std::size_t e, std::int64_t target) {
      for (int i = 0; i < 2; ++i) {
        if (target == static_cast<std::int64_t>(i * kStubDistance + 3)) {
          entry[i] = e;
          ++found[i];
        }
      }
    });
    if (found[0] != 1 || found[1] != 1) {
      return fail(fmt::format("the kernel's .return_sites lists the stubs' return jumps {} and {} times, not once each",
                              found[0], found[1]));
    }
  }
  // ORC: the entry that starts at the first stub, and those that start inside the 32 bytes after.
  constexpr std::size_t kOrcEntry = 6;
  std::optional<std::size_t> orc_first;
  std::size_t orc_inside[kRegion];  // indexes; the table is sorted, so at most one per byte
  std::size_t orc_inside_n = 0;
  if (tables.orc_unwind_ip || tables.orc_unwind) {
    if (!tables.orc_unwind_ip || !tables.orc_unwind || !in_image(*tables.orc_unwind_ip, 4) ||
        !in_image(*tables.orc_unwind, kOrcEntry) || tables.orc_unwind_ip->size / 4 != tables.orc_unwind->size / kOrcEntry) {
      return fail("the kernel's ORC tables (.orc_unwind_ip, .orc_unwind) are incomplete or disagree");
    }
    bool too_many = false;
    for_each_offset(*tables.orc_unwind_ip, [&](std::size_t e, std::int64_t target) {
      const std::size_t index = (e - tables.orc_unwind_ip->offset) / 4;
      if (target == 0) orc_first = index;
      else if (target > 0 && target < static_cast<std::int64_t>(kRegion)) {
        if (orc_inside_n == kRegion) too_many = true;
        else orc_inside[orc_inside_n++] = index;
      }
    });
    if (too_many) return fail("the kernel's ORC table has more entries inside the stubs than they have bytes");
    if (!orc_first) return fail("the kernel's ORC table has no entry for the first hypercall stub");
  }
  build(routine);
  std::memcpy(x, routine, kRegion);
  if (orc_first) {
    const std::uint8_t* from = image.data() + tables.orc_unwind->offset + *orc_first * kOrcEntry;
    for (std::size_t i = 0; i < orc_inside_n; ++i) std::memcpy(image.data() + tables.orc_unwind->offset + orc_inside[i] * kOrcEntry, from, kOrcEntry);
  }
  if (thunk) {
    for (int i = 0; i < 2; ++i) {
      const std::int64_t to = static_cast<std::int64_t>(lo + (i == 0 ? kRet1 : kRet2));
      const auto v = static_cast<std::int32_t>(to - static_cast<std::int64_t>(entry[i]));
      std::memcpy(image.data() + entry[i], &v, 4);
    }
  }
  return {};
}

std::array<std::uint8_t, 4096> build_hypercall_page(std::uint8_t port, std::uint8_t send_port) {
  auto page = build_hypercall_page(port);
  const std::uint8_t entry[] = {
      0x83, 0xff, 0x04,              // cmp $4, %edi
      0x75, 0x07,                    // jne +12
      0xad,                          // lods (%rsi), %eax
      0x99,                          // cltd
      0xe7, send_port,               // out %eax, $SS
      0x48, 0x92,                    // xchg %rax, %rdx
      kRet,                          // ret
      kMovImm32Eax, abi::kHcEventChannelOp, 0, 0, 0,  // +12: mov $32, %eax
      kOutImm8Al, port,              // out %al, $PP
      kRet,                          // ret
  };
  static_assert(sizeof entry <= kHypercallPageEntryBytes);
  std::memcpy(page.data() + abi::kHcEventChannelOp * kHypercallPageEntryBytes, entry, sizeof entry);
  return page;
}

std::array<std::uint8_t, 4096> build_hypercall_page(std::uint8_t port) {
  std::array<std::uint8_t, 4096> page;
  page.fill(kInt3);
  for (std::uint32_t i = 0; i < page.size() / kHypercallPageEntryBytes; ++i) {
    std::uint8_t* e = page.data() + i * kHypercallPageEntryBytes;
    e[0] = kMovImm32Eax;
    e[1] = static_cast<std::uint8_t>(i);
    e[2] = static_cast<std::uint8_t>(i >> 8);
    e[3] = static_cast<std::uint8_t>(i >> 16);
    e[4] = static_cast<std::uint8_t>(i >> 24);
    e[5] = kOutImm8Al;
    e[6] = port;
    e[7] = kRet;
  }
  return page;
}

Expected<std::uint64_t, std::string> hypercall_page_address(std::uint64_t value) {
  const std::uint64_t index = value & 0xfff;
  if (index >= kHypercallPages) {
    return fail(fmt::format("hypercall page {} asked for; Xen's CPUID offers {}", index, kHypercallPages));
  }
  return value & ~std::uint64_t{0xfff};
}

std::optional<std::size_t> find_hypercall_page_placeholder(std::span<const std::uint8_t> image) {
  constexpr std::size_t kPage = 4096;
  auto entry_ok = [](const std::uint8_t* e) {
    int rets = 0;
    for (std::size_t i = 0; i < kHypercallPageEntryBytes; ++i) {
      if (e[i] == kRet) ++rets;
      else if (e[i] != kInt3 && e[i] != kNop) return false;
    }
    return rets == 1;
  };
  for (std::size_t at = 0; at + kPage <= image.size(); at += kPage) {
    const std::uint8_t* p = image.data() + at;
    if (!entry_ok(p)) continue;
    bool same = true;
    for (std::size_t e = kHypercallPageEntryBytes; same && e < kPage; e += kHypercallPageEntryBytes) {
      same = std::memcmp(p, p + e, kHypercallPageEntryBytes) == 0;
    }
    if (same) return at;
  }
  return std::nullopt;
}

}  // namespace xpv::xen
