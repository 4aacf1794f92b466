// Hypercall-stub finder and rewriter, and the hypercall page: see stubs.h for the bytes.
#include "xpv/xen/stubs.h"

#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

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
