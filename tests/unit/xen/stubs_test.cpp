// Hypercall-stub finder/rewriter on synthetic images, the hypercall page bytes, and the real
// Debian kernel when one is cached on this machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "xpv/kvm/bzimage.h"
#include "xpv/kvm/decompress.h"
#include "xpv/kvm/elf_loader.h"
#include "xpv/xen/config.h"
#include "xpv/xen/stubs.h"

namespace xpv::xen {
namespace {

using Bytes = std::vector<std::uint8_t>;

// Puts amd (vmmcall; jmp rel32) at `at` and intel (vmcall; jmp rel32) at `at + 16`.
void put_pair(Bytes& img, std::size_t at, bool ret_tail = false, bool intel_first = false) {
  const std::uint8_t amd[8] = {0x0f, 0x01, 0xd9, 0xe9, 0xa8, 0xe0, 0x3b, 0x00};
  const std::uint8_t intel[8] = {0x0f, 0x01, 0xc1, 0xe9, 0x98, 0xe0, 0x3b, 0x00};
  const std::size_t a = intel_first ? at + 16 : at, i = intel_first ? at : at + 16;
  std::copy(std::begin(amd), std::end(amd), img.begin() + static_cast<std::ptrdiff_t>(a));
  std::copy(std::begin(intel), std::end(intel), img.begin() + static_cast<std::ptrdiff_t>(i));
  if (ret_tail) img[a + 3] = img[i + 3] = 0xc3;
}

Bytes noise(std::size_t n) {
  Bytes b(n);
  std::uint32_t x = 12345;
  for (auto& v : b) {
    x = x * 1103515245 + 12345;
    v = static_cast<std::uint8_t>(x >> 16);
  }
  return b;
}

TEST(XenStubs, FindsTheOnePair) {
  Bytes img = noise(64 * 1024);
  put_pair(img, 0x4c80);
  auto s = find_hypercall_stubs(img);
  ASSERT_TRUE(s) << s.error();
  EXPECT_EQ(s->amd, 0x4c80u);
  EXPECT_EQ(s->intel, 0x4c90u);
}

TEST(XenStubs, AcceptsIntelFirstAndRetTails) {
  Bytes img(4096, 0xcc);
  put_pair(img, 0x100, /*ret_tail=*/true, /*intel_first=*/true);
  auto s = find_hypercall_stubs(img);
  ASSERT_TRUE(s) << s.error();
  EXPECT_EQ(s->intel, 0x100u);
  EXPECT_EQ(s->amd, 0x110u);
}

TEST(XenStubs, NoPairIsAClearError) {
  Bytes img(4096, 0x90);
  // Lone stubs and pairs at the wrong distance do not count.
  const std::uint8_t amd[4] = {0x0f, 0x01, 0xd9, 0xe9};
  const std::uint8_t intel[4] = {0x0f, 0x01, 0xc1, 0xe9};
  std::copy(std::begin(amd), std::end(amd), img.begin() + 0x200);
  std::copy(std::begin(intel), std::end(intel), img.begin() + 0x218);  // 24 apart
  std::copy(std::begin(intel), std::end(intel), img.begin() + 0x400);
  img[0x410] = 0x0f; img[0x411] = 0x01; img[0x412] = 0xd9; img[0x413] = 0x90;  // no jmp/ret tail
  auto s = find_hypercall_stubs(img);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().find("no Xen hypercall stub pair"), std::string::npos) << s.error();
  EXPECT_FALSE(find_hypercall_stubs({}));
}

TEST(XenStubs, TwoPairsAreRefusedWithBothOffsets) {
  Bytes img(8192, 0);
  put_pair(img, 0x100);
  put_pair(img, 0x1000);
  auto s = find_hypercall_stubs(img);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().find("2 candidate"), std::string::npos) << s.error();
  EXPECT_NE(s.error().find("0x100/0x110"), std::string::npos) << s.error();
  EXPECT_NE(s.error().find("0x1000/0x1010"), std::string::npos) << s.error();
}

TEST(XenStubs, PairTruncatedAtTheEndIsNotFoundAndNothingIsReadPastIt) {
  Bytes img(0x200, 0);
  put_pair(img, 0x1e0);  // intel's jmp rel32 ends exactly at 0x1f8
  ASSERT_TRUE(find_hypercall_stubs(img));
  for (std::size_t cut : {0x1f7u, 0x1f4u, 0x1f3u, 0x1f2u, 0x1f0u, 0x1e8u, 0x1e2u}) {
    // Copy so that ASan catches any read past the shorter buffer.
    Bytes shorter(img.begin(), img.begin() + static_cast<std::ptrdiff_t>(cut));
    auto s = find_hypercall_stubs(shorter);
    EXPECT_FALSE(s) << "cut at " << cut;
  }
  Bytes ret(0x200, 0);  // vmmcall; ret at 0x1ec, vmcall; ret at 0x1fc: ret is the last byte
  const Bytes amd = {0x0f, 0x01, 0xd9, 0xc3}, intel = {0x0f, 0x01, 0xc1, 0xc3};
  std::copy(amd.begin(), amd.end(), ret.begin() + 0x1ec);
  std::copy(intel.begin(), intel.end(), ret.begin() + 0x1fc);
  auto exact = find_hypercall_stubs(ret);
  ASSERT_TRUE(exact);
  EXPECT_EQ(exact->intel, 0x1fcu);
  Bytes ret_cut(ret.begin(), ret.begin() + 0x1ff);
  EXPECT_FALSE(find_hypercall_stubs(ret_cut));
}

TEST(XenStubs, PatchWritesOutAlPortNopAndNothingElse) {
  Bytes img = noise(4096);
  put_pair(img, 0x300);
  const Bytes before = img;
  auto s = find_hypercall_stubs(img);
  ASSERT_TRUE(s);
  patch_hypercall_stubs(img, *s, kHypercallPort);
  for (std::size_t i = 0; i < img.size(); ++i) {
    if (i >= 0x300 && i < 0x303) continue;
    if (i >= 0x310 && i < 0x313) continue;
    ASSERT_EQ(img[i], before[i]) << i;
  }
  EXPECT_EQ((Bytes{img[0x300], img[0x301], img[0x302]}), (Bytes{0xe6, 0xe8, 0x90}));
  EXPECT_EQ((Bytes{img[0x310], img[0x311], img[0x312]}), (Bytes{0xe6, 0xe8, 0x90}));
  EXPECT_EQ(img[0x303], 0xe9);  // the jmp to the return thunk stays
  // Idempotent; the patched image no longer has stubs.
  patch_hypercall_stubs(img, *s, kHypercallPort);
  EXPECT_EQ(img[0x301], 0xe8);
  EXPECT_FALSE(find_hypercall_stubs(img));
}

TEST(XenStubs, PatchRejectsSitesThatAreNotStubs) {
  Bytes img(4096, 0);
  put_pair(img, 0x300);
  EXPECT_THROW(patch_hypercall_stubs(img, StubSites{0x301, 0x310}, 0xe8), std::invalid_argument);
  EXPECT_THROW(patch_hypercall_stubs(img, StubSites{0x310, 0x300}, 0xe8), std::invalid_argument);
  EXPECT_THROW(patch_hypercall_stubs(img, StubSites{0x300, 4094}, 0xe8), std::invalid_argument);
  EXPECT_THROW(patch_hypercall_stubs(img, StubSites{0x300, ~std::size_t{0}}, 0xe8),
               std::invalid_argument);
  patch_hypercall_stubs(img, StubSites{0x300, 0x310}, 0xe8);
  EXPECT_THROW(patch_hypercall_stubs(img, StubSites{0x300, 0x310}, 0xe7), std::invalid_argument);
}

// Debian 12's 6.1.0-57 pair with the padding its assembler wrote: an 8-byte NOP after the amd
// stub, eight int3 after the intel one.
void put_padded_pair(Bytes& img, std::size_t at) {
  put_pair(img, at);
  const std::uint8_t nop8[8] = {0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00};
  std::copy(std::begin(nop8), std::end(nop8), img.begin() + static_cast<std::ptrdiff_t>(at + 8));
  std::fill_n(img.begin() + static_cast<std::ptrdiff_t>(at + 24), 8, 0xcc);
}

// A .return_sites table at `table` with `n` entries: the two stubs' jmps (at pair+3 and
// pair+19) among entries for elsewhere, as the kernel's objtool writes them (int32, relative to
// the entry itself).
ImageRange put_return_sites(Bytes& img, std::size_t table, std::size_t pair) {
  const std::int64_t targets[] = {0x40, static_cast<std::int64_t>(pair + 3), 0x80, static_cast<std::int64_t>(pair + 19),
                                  0x123};
  for (std::size_t i = 0; i < std::size(targets); ++i) {
    const auto v = static_cast<std::int32_t>(targets[i] - static_cast<std::int64_t>(table + 4 * i));
    std::memcpy(&img[table + 4 * i], &v, 4);
  }
  return {table, 4 * std::size(targets)};
}

std::int64_t entry_target(const Bytes& img, std::size_t entry) {
  std::int32_t v;
  std::memcpy(&v, &img[entry], 4);
  return static_cast<std::int64_t>(entry) + v;
}

// Where the rel8 or rel32 jump at `at` (opcode eb, 75 or e9) lands, relative to the region.
std::int64_t jump_target(const Bytes& img, std::size_t base, std::size_t at) {
  if (img[base + at] == 0xeb || img[base + at] == 0x75) return static_cast<std::int64_t>(at) + 2 + static_cast<std::int8_t>(img[base + at + 1]);
  std::int32_t rel;
  std::memcpy(&rel, &img[base + at + 1], 4);
  return static_cast<std::int64_t>(at) + 5 + rel;
}

TEST(XenStubs, FastSendRewritesThePairIntoOneRoutineBothEntriesReach) {
  Bytes img = noise(4096);
  put_padded_pair(img, 0x300);
  const KernelTables rs{put_return_sites(img, 0x800, 0x300), {}, {}};
  const Bytes before = img;
  auto s = find_hypercall_stubs(img);
  ASSERT_TRUE(s);
  auto r = patch_hypercall_stubs_fast_send(img, *s, kHypercallPort, kEvtchnSendPort, rs);
  ASSERT_TRUE(r) << r.error();
  for (std::size_t i = 0; i < img.size(); ++i) {
    if (i >= 0x300 && i < 0x320) continue;
    if (i >= 0x804 && i < 0x808) continue;  // the two stubs' .return_sites entries
    if (i >= 0x80c && i < 0x810) continue;
    ASSERT_EQ(img[i], before[i]) << i;
  }
  const Bytes routine(img.begin() + 0x300, img.begin() + 0x320);
  const Bytes expect_head = {0x83, 0xf8, 0x20, 0x75, 0x14, 0x83, 0xff, 0x04, 0x75, 0x0f, 0xad, 0x99,
                             0xe7, kEvtchnSendPort, 0xeb, 0x02, 0xeb, 0xee, 0x48, 0x92};
  EXPECT_EQ(Bytes(routine.begin(), routine.begin() + 20), expect_head);
  // The control flow, checked as offsets: both entries reach the checks at +0, which branch to
  // the plain trap at +25; the send path's OUT at +12 goes on at +18 (over the second entry);
  // each path leaves through its own jmp to the original return thunk (the amd stub's jmp at +3
  // went to 8 + 0x3be0a8).
  EXPECT_EQ(jump_target(img, 0x300, 16), 0);
  EXPECT_EQ(jump_target(img, 0x300, 3), 25);
  EXPECT_EQ(jump_target(img, 0x300, 8), 25);
  EXPECT_EQ(jump_target(img, 0x300, 14), 18);
  EXPECT_EQ((Bytes{routine[25], routine[26]}), (Bytes{0xe6, kHypercallPort}));
  EXPECT_EQ(routine[20], 0xe9);
  EXPECT_EQ(routine[27], 0xe9);
  EXPECT_EQ(jump_target(img, 0x300, 20), 8 + 0x3be0a8);
  EXPECT_EQ(jump_target(img, 0x300, 27), 8 + 0x3be0a8);
  // The kernel rewrites the jmps its .return_sites lists: those entries now name the routine's
  // two returns, and the others are as they were.
  EXPECT_EQ(entry_target(img, 0x804), 0x300 + 20);
  EXPECT_EQ(entry_target(img, 0x80c), 0x300 + 27);
  EXPECT_EQ(entry_target(img, 0x800), 0x40);
  // Idempotent; the image no longer has stubs to find.
  ASSERT_TRUE(patch_hypercall_stubs_fast_send(img, *s, kHypercallPort, kEvtchnSendPort, rs));
  EXPECT_EQ(Bytes(img.begin() + 0x300, img.begin() + 0x320), routine);
  EXPECT_FALSE(find_hypercall_stubs(img));
}

// An ORC table as objtool writes it around the pair: the stub entries (sp+8, a call frame), their
// padding "undefined" (all zero), and the next function; .orc_unwind_ip at 0xa00, .orc_unwind at
// 0xb00.
KernelTables put_orc(Bytes& img, const ImageRange& return_sites) {
  const std::int64_t at[] = {0x2f0, 0x300, 0x308, 0x310, 0x318, 0x320};
  const std::uint8_t frame[6] = {8, 0, 0, 0, 5, 0}, undefined[6] = {0, 0, 0, 0, 0, 0}, other[6] = {16, 0, 0, 0, 5, 0};
  for (std::size_t i = 0; i < std::size(at); ++i) {
    const auto v = static_cast<std::int32_t>(at[i] - static_cast<std::int64_t>(0xa00 + 4 * i));
    std::memcpy(&img[0xa00 + 4 * i], &v, 4);
    const std::uint8_t* state = (at[i] == 0x300 || at[i] == 0x310) ? frame : (at[i] == 0x308 || at[i] == 0x318) ? undefined : other;
    std::memcpy(&img[0xb00 + 6 * i], state, 6);
  }
  return {return_sites, ImageRange{0xa00, 4 * std::size(at)}, ImageRange{0xb00, 6 * std::size(at)}};
}

TEST(XenStubs, FastSendGivesTheRoutinesOrcEntriesTheFirstStubsState) {
  Bytes img(4096, 0xcc);
  put_padded_pair(img, 0x300);
  const KernelTables t = put_orc(img, put_return_sites(img, 0x800, 0x300));
  const Bytes first_stub(img.begin() + 0xb00 + 6, img.begin() + 0xb00 + 12);
  const Bytes before_pair(img.begin() + 0xb00, img.begin() + 0xb00 + 6);
  const Bytes after_pair(img.begin() + 0xb00 + 30, img.begin() + 0xb00 + 36);
  ASSERT_TRUE(patch_hypercall_stubs_fast_send(img, {0x300, 0x310}, kHypercallPort, kEvtchnSendPort, t));
  for (std::size_t i = 1; i <= 4; ++i) {
    EXPECT_EQ(Bytes(img.begin() + 0xb00 + 6 * i, img.begin() + 0xb00 + 6 * i + 6), first_stub) << "entry " << i;
  }
  EXPECT_EQ(Bytes(img.begin() + 0xb00, img.begin() + 0xb00 + 6), before_pair);
  EXPECT_EQ(Bytes(img.begin() + 0xb00 + 30, img.begin() + 0xb00 + 36), after_pair);
}

TEST(XenStubs, FastSendRefusesOrcTablesItCannotKeepTrue) {
  Bytes img(4096, 0xcc);
  put_padded_pair(img, 0x300);
  const KernelTables t = put_orc(img, put_return_sites(img, 0x800, 0x300));
  auto refused = [&](KernelTables bad, const char* what) {
    Bytes copy = img;
    EXPECT_FALSE(patch_hypercall_stubs_fast_send(copy, {0x300, 0x310}, kHypercallPort, kEvtchnSendPort, bad)) << what;
    EXPECT_EQ(copy, img) << what;
  };
  refused({t.return_sites, t.orc_unwind_ip, std::nullopt}, "no .orc_unwind");
  refused({t.return_sites, ImageRange{0xa00, 20}, t.orc_unwind}, "tables of different lengths");
  refused({t.return_sites, ImageRange{0xa00, 4}, ImageRange{0xb00, 6}}, "no entry for the first stub");
}

TEST(XenStubs, FastSendWithRetTailsAndIntelFirstNeedsNoReturnSites) {
  Bytes img(4096, 0xcc);
  put_pair(img, 0x100, /*ret_tail=*/true, /*intel_first=*/true);
  for (std::size_t at : {0x104, 0x114}) std::fill_n(img.begin() + at, 4, 0xcc);  // int3 after each ret
  auto s = find_hypercall_stubs(img);
  ASSERT_TRUE(s);
  ASSERT_TRUE(patch_hypercall_stubs_fast_send(img, *s, kHypercallPort, kEvtchnSendPort, KernelTables{}));
  EXPECT_EQ(img[0x100], 0x83);  // the routine starts at the lower stub, whichever vendor's it is
  EXPECT_EQ(jump_target(img, 0x100, 16), 0);
  EXPECT_EQ(jump_target(img, 0x100, 3), 25);
  EXPECT_EQ((Bytes(img.begin() + 0x114, img.begin() + 0x119)), (Bytes{0xc3, 0xcc, 0xcc, 0xcc, 0xcc}));
  EXPECT_EQ((Bytes(img.begin() + 0x11b, img.begin() + 0x120)), (Bytes{0xc3, 0xcc, 0xcc, 0xcc, 0xcc}));
  ASSERT_TRUE(patch_hypercall_stubs_fast_send(img, *s, kHypercallPort, kEvtchnSendPort, KernelTables{}));
}

TEST(XenStubs, FastSendTakesTheNopFormsAnAssemblerPadsWith) {
  Bytes img(4096, 0x00);
  put_pair(img, 0x300);
  const Bytes six_two = {0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x66, 0x90};  // 6-byte NOP, xchg %ax,%ax
  const Bytes four_three_one = {0x0f, 0x1f, 0x40, 0x00, 0x0f, 0x1f, 0x00, 0x90};
  std::copy(six_two.begin(), six_two.end(), img.begin() + 0x308);
  std::copy(four_three_one.begin(), four_three_one.end(), img.begin() + 0x318);
  const KernelTables rs{put_return_sites(img, 0x800, 0x300), {}, {}};
  EXPECT_TRUE(patch_hypercall_stubs_fast_send(img, {0x300, 0x310}, kHypercallPort, kEvtchnSendPort, rs));
  // Stubs that end in ret leave 12 bytes: GNU as's 10-byte NOP (66 2e 0f 1f 84 …) and a 2-byte one.
  Bytes ret_img(4096, 0x00);
  put_pair(ret_img, 0x300, /*ret_tail=*/true);
  const Bytes ten_two = {0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00, 0x66, 0x90};
  for (std::size_t at : {0x304, 0x314}) std::copy(ten_two.begin(), ten_two.end(), ret_img.begin() + at);
  EXPECT_TRUE(patch_hypercall_stubs_fast_send(ret_img, {0x300, 0x310}, kHypercallPort, kEvtchnSendPort, KernelTables{}));
  // A NOP whose displacement runs past the stub's 16 bytes is not padding.
  Bytes long_nop(4096, 0x00);
  put_pair(long_nop, 0x300);
  const Bytes cut_nop = {0x90, 0x90, 0x90, 0x0f, 0x1f, 0x80, 0x00, 0x00};  // 0f 1f 80 needs 7 bytes
  std::copy(cut_nop.begin(), cut_nop.end(), long_nop.begin() + 0x308);
  std::fill_n(long_nop.begin() + 0x318, 8, 0xcc);
  put_return_sites(long_nop, 0x800, 0x300);
  EXPECT_FALSE(patch_hypercall_stubs_fast_send(long_nop, {0x300, 0x310}, kHypercallPort, kEvtchnSendPort, rs));
}

TEST(XenStubs, FastSendRefusesWhatIsNotTwoStubsAndPaddingAndLeavesTheImageAlone) {
  auto refused = [](Bytes img, StubSites sites, KernelTables rs, const char* what) {
    const Bytes before = img;
    auto r = patch_hypercall_stubs_fast_send(img, sites, kHypercallPort, kEvtchnSendPort, rs);
    EXPECT_FALSE(r) << what;
    if (!r) {
      EXPECT_FALSE(r.error().empty()) << what;
    }
    EXPECT_EQ(img, before) << what;
  };
  Bytes img(4096, 0xcc);
  put_padded_pair(img, 0x300);
  const KernelTables rs{put_return_sites(img, 0x800, 0x300), {}, {}};
  ASSERT_TRUE(find_hypercall_stubs(img));
  Bytes code_after = img;
  code_after[0x31c] = 0x55;  // push %rbp: something that is not padding after the intel stub
  refused(code_after, {0x300, 0x310}, rs, "code in the padding");
  Bytes other_thunk = img;
  other_thunk[0x314] = 0x99;
  refused(other_thunk, {0x300, 0x310}, rs, "different return thunks");
  Bytes mixed = img;
  mixed[0x303] = 0xc3;
  refused(mixed, {0x300, 0x310}, rs, "ret and jmp");
  refused(img, {0x300, 0x320}, rs, "not 16 bytes apart");
  refused(img, {0x310, 0x300}, rs, "amd and intel swapped");
  refused(img, {0x300, 0x310}, KernelTables{}, "return thunks without .return_sites");
  refused(img, {0x300, 0x310}, KernelTables{ImageRange{0x800, 4}, {}, {}}, ".return_sites without the stubs' entries");
  Bytes twice = img;
  put_return_sites(twice, 0x900, 0x300);
  refused(twice, {0x300, 0x310}, KernelTables{ImageRange{0x800, 0x114}, {}, {}}, "a stub's jmp listed twice");
  refused(img, {0x300, 0x310}, KernelTables{ImageRange{0xff0, 0x20}, {}, {}}, ".return_sites past the image");
  Bytes cut(img.begin(), img.begin() + 0x31f);
  refused(cut, {0x300, 0x310}, KernelTables{}, "the region runs past the image");
  // The plain rewrite still works on what the fast one refused.
  patch_hypercall_stubs(code_after, {0x300, 0x310}, kHypercallPort);
  EXPECT_EQ(code_after[0x300], 0xe6);
}

TEST(XenStubs, HypercallPageEntriesAreMovOutRet) {
  const auto page = build_hypercall_page(0xe8);
  for (std::uint32_t i = 0; i < 128; ++i) {
    const std::uint8_t* e = page.data() + i * 32;
    const Bytes want = {0xb8, static_cast<std::uint8_t>(i), 0, 0, 0, 0xe6, 0xe8, 0xc3};
    ASSERT_EQ(Bytes(e, e + 8), want) << i;
    for (int j = 8; j < 32; ++j) ASSERT_EQ(e[j], 0xcc) << i << "+" << j;
  }
  EXPECT_EQ(build_hypercall_page(0x42)[32 * 7 + 6], 0x42);
}

TEST(XenStubs, AFastSendHypercallPageChangesOnlyEventChannelOp) {
  const auto plain = build_hypercall_page(0xe8);
  const auto fast = build_hypercall_page(0xe8, 0xe4);
  for (std::size_t i = 0; i < 4096; ++i) {
    if (i / 32 == 32) continue;
    ASSERT_EQ(fast[i], plain[i]) << "byte " << i << " of entry " << i / 32;
  }
  const std::uint8_t* e = fast.data() + 32 * 32;
  const Bytes want = {0x83, 0xff, 0x04,              // cmp $4, %edi
                      0x75, 0x07,                    // jne +12
                      0xad, 0x99,                    // lods; cltd
                      0xe7, 0xe4,                    // out %eax, $0xe4
                      0x48, 0x92, 0xc3,              // xchg %rax, %rdx; ret
                      0xb8, 0x20, 0x00, 0x00, 0x00,  // +12: mov $32, %eax
                      0xe6, 0xe8, 0xc3};             // out %al, $0xe8; ret
  EXPECT_EQ(Bytes(e, e + want.size()), want);
  for (std::size_t j = want.size(); j < 32; ++j) EXPECT_EQ(e[j], 0xcc) << "+" << j;
  EXPECT_EQ(build_hypercall_page(0x42, 0x43)[32 * 32 + 8], 0x43);
  EXPECT_EQ(build_hypercall_page(0x42, 0x43)[32 * 32 + 18], 0x42);
}

TEST(XenStubs, HypercallPageMsrValueIsAFrameAndAnIndex) {
  auto a = hypercall_page_address(0x1234'5000);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, 0x1234'5000u);
  auto high = hypercall_page_address(0x7'0000'0000'0000);
  ASSERT_TRUE(high);
  EXPECT_EQ(*high, 0x7'0000'0000'0000u);
  auto bad = hypercall_page_address(0x5000 | 1);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("hypercall page 1"), std::string::npos) << bad.error();
  EXPECT_FALSE(hypercall_page_address(0x5fff));
}

// A page of 128 identical 32-byte entries, each `entry`.
Bytes placeholder_page(const Bytes& entry) {
  Bytes page;
  for (int i = 0; i < 128; ++i) page.insert(page.end(), entry.begin(), entry.end());
  return page;
}

TEST(XenStubs, FindsAnOlderKernelsHypercallPagePlaceholder) {
  Bytes ret_int3(32, 0xcc);  // Linux 6.x before XSA-466: ret, then int3 padding
  ret_int3[0] = 0xc3;
  Bytes nops_ret(32, 0x90);  // older: nop padding, then ret
  nops_ret[31] = 0xc3;
  for (const Bytes& entry : {ret_int3, nops_ret}) {
    Bytes img(3 * 4096, 0x00);
    const Bytes page = placeholder_page(entry);
    std::copy(page.begin(), page.end(), img.begin() + 8192);
    auto at = find_hypercall_page_placeholder(img);
    ASSERT_TRUE(at);
    EXPECT_EQ(*at, 8192u);
  }
}

TEST(XenStubs, NearMissesAreNotAHypercallPagePlaceholder) {
  Bytes ret_int3(32, 0xcc);
  ret_int3[0] = 0xc3;
  const Bytes page = placeholder_page(ret_int3);
  {
    Bytes img(3 * 4096, 0x00);  // not page-aligned
    std::copy(page.begin(), page.end(), img.begin() + 0x800);
    EXPECT_FALSE(find_hypercall_page_placeholder(img));
  }
  {
    Bytes img = page;  // one entry differs
    img[77 * 32 + 5] = 0x90;
    EXPECT_FALSE(find_hypercall_page_placeholder(img));
  }
  {
    Bytes two_rets = ret_int3;  // two rets per entry
    two_rets[16] = 0xc3;
    EXPECT_FALSE(find_hypercall_page_placeholder(placeholder_page(two_rets)));
  }
  EXPECT_FALSE(find_hypercall_page_placeholder(Bytes(4096, 0xcc))) << "int3 only: no ret";
  EXPECT_FALSE(find_hypercall_page_placeholder(Bytes(4095, 0xc3))) << "shorter than a page";
  EXPECT_FALSE(find_hypercall_page_placeholder({}));
  // The page xpv writes is no placeholder (it has code in each entry).
  const auto filled = build_hypercall_page(0xe8);
  EXPECT_FALSE(find_hypercall_page_placeholder(Bytes(filled.begin(), filled.end())));
}

// ---- the real kernel ----

std::filesystem::path find_kernel() {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path("/tmp/kpkg/boot"), ec))
    if (e.path().filename().string().rfind("vmlinuz-", 0) == 0) return e.path();
  if (const char* home = std::getenv("HOME")) {
    for (const auto& e : fs::directory_iterator(fs::path(home) / ".cache/xpv/kernel", ec))
      if (fs::exists(e.path() / "vmlinuz", ec)) return e.path() / "vmlinuz";
  }
  return {};
}

// The cached Debian kernel's vmlinux (decompressed from its bzImage) into *out, or a skip.
void load_cached_vmlinux(std::filesystem::path& path, Bytes& out) {
  path = find_kernel();
  if (path.empty())
    GTEST_SKIP() << "no Debian kernel cached (/tmp/kpkg/boot/vmlinuz-* or "
                    "~/.cache/xpv/kernel/*/vmlinuz); run `xpv testbed` once to fetch it";
  std::ifstream f(path, std::ios::binary);
  ASSERT_TRUE(f) << path;
  const Bytes file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto bz = kvm::parse_bzimage(file);
  ASSERT_TRUE(bz) << bz.error().message;
  auto vmlinux = kvm::decompress(bz->payload, std::uint64_t{1} << 30);
  ASSERT_TRUE(vmlinux) << vmlinux.error().message;
  out = std::move(*vmlinux);
}

// The kernel as xpv-vmm loads it (kvm::load_elf into guest memory), its stubs given the fast-send
// routine with its .return_sites entries moved: what every HVM guest of the testbed runs.
TEST(XenStubsRealKernel, DebianKernelTakesTheFastSendRoutineAndItsReturnSitesMove) {
  std::filesystem::path path;
  Bytes vm_bytes;
  load_cached_vmlinux(path, vm_bytes);
  if (IsSkipped() || HasFatalFailure()) return;
  auto* vmlinux = &vm_bytes;
  constexpr std::uint64_t kRam = std::uint64_t{256} << 20;
  std::vector<std::uint8_t> ram(kRam);
  const GuestMemory mem({{0, kRam, ram.data()}});
  auto k = kvm::load_elf(*vmlinux, mem, 0x100000, kRam);
  ASSERT_TRUE(k) << k.error().message;
  ASSERT_NE(k->tables.return_sites.size, 0u) << "no .return_sites found in " << path;
  ASSERT_NE(k->tables.orc_unwind_ip.size, 0u) << "no .orc_unwind_ip found in " << path;
  ASSERT_NE(k->tables.orc_unwind.size, 0u) << "no .orc_unwind found in " << path;
  std::span<std::uint8_t> image(ram.data() + k->lowest, k->highest - k->lowest);
  auto s = find_hypercall_stubs(image);
  ASSERT_TRUE(s) << s.error();
  auto range = [&](const kvm::KernelSection& sec) {
    return ImageRange{static_cast<std::size_t>(sec.gpa - k->lowest), static_cast<std::size_t>(sec.size)};
  };
  const KernelTables tables{range(k->tables.return_sites), range(k->tables.orc_unwind_ip), range(k->tables.orc_unwind)};
  const ImageRange rs = *tables.return_sites;
  // Before: exactly one entry names each stub's jmp (at +3).
  auto entries_naming = [&](std::size_t at) {
    int n = 0;
    for (std::size_t e = rs.offset; e < rs.offset + rs.size; e += 4) {
      std::int32_t v;
      std::memcpy(&v, image.data() + e, 4);
      if (static_cast<std::int64_t>(e) + v == static_cast<std::int64_t>(at)) ++n;
    }
    return n;
  };
  const std::size_t lo = std::min(s->amd, s->intel);
  EXPECT_EQ(entries_naming(lo + 3), 1);
  EXPECT_EQ(entries_naming(lo + 19), 1);
  // ORC: the states that start inside the 32 bytes (objtool's "undefined" for the padding).
  auto orc_inside = [&] {
    std::vector<Bytes> states;
    const ImageRange ip = *tables.orc_unwind_ip, orc = *tables.orc_unwind;
    for (std::size_t e = ip.offset; e < ip.offset + ip.size; e += 4) {
      std::int32_t v;
      std::memcpy(&v, image.data() + e, 4);
      const std::int64_t at = static_cast<std::int64_t>(e) + v - static_cast<std::int64_t>(lo);
      if (at < 0 || at >= 32) continue;
      const std::size_t i = (e - ip.offset) / 4;
      states.emplace_back(image.begin() + static_cast<std::ptrdiff_t>(orc.offset + 6 * i),
                          image.begin() + static_cast<std::ptrdiff_t>(orc.offset + 6 * i + 6));
    }
    return states;
  };
  const auto orc_before = orc_inside();
  ASSERT_EQ(orc_before.size(), 4u);  // amd stub, its padding, intel stub, its padding
  EXPECT_NE(orc_before[1], orc_before[0]);
  auto fast = patch_hypercall_stubs_fast_send(image, *s, kHypercallPort, kEvtchnSendPort, tables);
  ASSERT_TRUE(fast) << fast.error();
  for (const Bytes& state : orc_inside()) EXPECT_EQ(state, orc_before[0]);
  EXPECT_EQ(image[lo], 0x83);
  EXPECT_EQ(entries_naming(lo + 3), 0);
  EXPECT_EQ(entries_naming(lo + 19), 0);
  EXPECT_EQ(entries_naming(lo + 20), 1);
  EXPECT_EQ(entries_naming(lo + 27), 1);
}

TEST(XenStubsRealKernel, DebianKernelHasExactlyOnePairAndItPatches) {
  std::filesystem::path path;
  Bytes vm_bytes;
  load_cached_vmlinux(path, vm_bytes);
  if (IsSkipped() || HasFatalFailure()) return;
  auto* vmlinux = &vm_bytes;

  auto s = find_hypercall_stubs(*vmlinux);
  ASSERT_TRUE(s) << path << ": " << s.error();
  EXPECT_EQ(s->intel, s->amd + kStubDistance);
  std::printf("%s: vmlinux %zu bytes, xen_hypercall_amd at file offset %#zx, intel at %#zx\n",
              path.c_str(), vmlinux->size(), s->amd, s->intel);
  RecordProperty("amd_offset", std::to_string(s->amd));
  RecordProperty("intel_offset", std::to_string(s->intel));
  if (path.string().find("6.1.0-57") != std::string::npos) {
    EXPECT_EQ(s->amd, 0xc43c80u);  // measured on Debian 12's 6.1.0-57-amd64
    EXPECT_EQ(s->intel, 0xc43c90u);
  }
  patch_hypercall_stubs(*vmlinux, *s, kHypercallPort);
  EXPECT_EQ((*vmlinux)[s->amd], 0xe6);
  EXPECT_EQ((*vmlinux)[s->intel + 1], kHypercallPort);
  EXPECT_FALSE(find_hypercall_stubs(*vmlinux));
}

}  // namespace
}  // namespace xpv::xen
