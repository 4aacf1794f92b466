// BlkifQueue (xpv-blkback's data plane) against a hostile frontend: seeded, bounded fuzzing of
// everything a guest controls on a blkif ring — the request slots, its producer index, its
// grant-table entries and the pages it grants. The guest is a memfd with the real granter-side
// GrantTable, the backend the real GrantMapper and BlkifQueue over its own mapping of that memfd,
// the disk a real image file served by real io_uring (O_DIRECT or buffered, by seed), as in
// tests/unit/blkback/queue_test.cpp.
//
// What the guest sends: random operations (valid and not), ids, nr_segments 0..255, segments
// naming grants that are valid, read-only, another domain's, revoked, never made, beyond the
// table or (some iterations) the ring's own pages; first/last_sect anything; sectors inside,
// across and past the end of the disk and near UINT64_MAX; indirect requests whose pages hold
// random descriptors; discards of any range; whole slots of random bytes. Between passes it
// rewrites grant entries (domid, readonly, type, frame, raw words) and scribbles its pages.
//
// Three modes (and a read-only disk under the first two):
//   protocol  the ring indexes stay consistent and the ring is not scribbled, so every response
//             is matched to its request: same id, the operation echoed, and the status the
//             request's form decides (statically malformed → -1, unknown op → -2, flush → 0,
//             a well-formed read/write through grants nobody touched → 0). The queue is never
//             disabled. Now and then the backend is killed and restarted on the same ring (a new
//             queue attached at the shared rsp_prod, with or without the shadow file, with a torn
//             response where the shadow must win): it redoes exactly what was unanswered.
//   chaos     as protocol, plus random producer indexes, random bytes over the ring page(s) and
//             over grant entries. Half of the iterations also break the producer index (far
//             ahead, behind, anything): the queue must be disabled exactly when the index it
//             reads breaks RING_REQUEST_PROD_OVERFLOW or goes backwards, and from then on stay
//             silent: no response, no notification, no I/O. A quarter let reads land in the ring
//             pages themselves; there only the invariants that need no model are checked.
//   racing    the queue runs its own thread (run(), with or without polling) while a second
//             guest "vCPU" rewrites grant entries, frames and the data and descriptor pages
//             under it, and the guest pushes requests with real event-index kicks and (half of
//             the iterations) sleeps on the event channel for its answers: time of check against
//             time of use (under ASan in CI), and no notification owed is missing. Responses
//             still match their requests; a quarter end with a broken index, after which run()
//             must return by itself and the queue stay silent.
//
// After every iteration: a queue that is not disabled answered everything it took, and a
// well-formed write then read of the same sectors through fresh grants (direct and indirect)
// round-trips byte-exact; the image never changes size; sectors no write or discard could have
// reached keep their pattern (a read-only disk: not one byte changes); and once the queue is
// destroyed only the ring stays mapped, and once the mapper is too no grant entry the guest did
// not mark itself still carries GTF_reading/GTF_writing. Between passes, end_access succeeds
// exactly for the grants the queue does not hold.
//
// A failure prints its seed (SCOPED_TRACE): XPV_FUZZ_SEED=S with the test's --gtest_filter
// replays it — the same decisions, except where I/O timing changed what was possible (a revoke
// refused while a grant was pinned); racing replays the setup, not the interleaving.
// XPV_FUZZ_ITERATIONS=N runs N seeds per test.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "xpv/test/temp_dir.h"
#include "xpv/test/fuzz_seeds.h"
#include "xpv/blkback/queue.h"
#include "xpv/domain/memory.h"
#include "xpv/gnttab/granter.h"
#include "xpv/gnttab/mapper.h"

namespace xpv::blkback {
namespace {

using namespace xpv::ring;
using namespace std::chrono_literals;
using gnttab::GrantRef;
using gnttab::header_domid;
using gnttab::header_flags;
namespace gtf = gnttab::gtf;

// ---- the guest -------------------------------------------------------------------------------

// Guest memory: gfn 0 the grant table (one frame), 1..4 the ring (up to ring-page-order 2),
// 8..15 indirect descriptor pages, 16..223 the pages the fuzzer grants, 224..255 fresh pages for
// the final round trip (224..239 written from, 240..255 read into). Frames are never pointed at
// gfn 0: a read landing in the grant table would leave invariant 5 nothing to check.
constexpr gnttab::DomId kGuest = 5;
constexpr gnttab::DomId kStranger = 9;  // another domain: its grants are not ours to map
constexpr std::uint64_t kGuestPages = 256;
constexpr std::uint64_t kRingGfn = 1;
constexpr std::uint64_t kIndirectGfn = 8;
constexpr unsigned kIndirectPages = 8;
constexpr std::uint64_t kDataGfn = 16;
constexpr std::uint64_t kDataPages = 208;
constexpr std::uint64_t kCheckGfn = 224;
constexpr unsigned kCheckPages = 16;
constexpr GrantRef kTableRefs = static_cast<GrantRef>(gnttab::kEntriesPerFrame);
constexpr std::uint64_t kDiskBytes = 2 << 20;
constexpr std::uint64_t kDiskSectors = kDiskBytes / kBlkifSectorSize;
constexpr std::uint16_t kMapperBits = gtf::reading | gtf::writing;
constexpr std::size_t kSlotBytes = sizeof(BlkifEntry);
constexpr std::size_t kHeaderBytes = sizeof(SharedRingHeader);

class Guest {
 public:
  Guest()
      : mem_(domain::DomainMemory::create("fuzz-guest", {{0, kGuestPages * kPageSize}})),
        table_({mem_.view().page(0).value()}),
        backend_mem_(domain::DomainMemory::attach(UniqueFd(::dup(mem_.fd())), mem_.layout())),
        vcpu2_mem_(domain::DomainMemory::attach(UniqueFd(::dup(mem_.fd())), mem_.layout())),
        to_dom0_(domain::EventFd::create().value()),
        from_dom0_(domain::EventFd::create().value()) {}

  std::span<std::uint8_t> page(std::uint64_t gfn) const { return mem_.view().page(gfn).value(); }
  std::span<std::uint8_t> pages(std::uint64_t gfn, std::uint64_t n) const {
    return mem_.view().translate(gfn * kPageSize, n * kPageSize).value();
  }
  // The same pages as a second vCPU sees them (racing mode): its own mapping of the memfd, so its
  // writes race the backend's and the first vCPU's the way a guest's do, not as C++ data races.
  std::span<std::uint8_t> vcpu2_page(std::uint64_t gfn) const { return vcpu2_mem_.view().page(gfn).value(); }
  gnttab::GrantTable& table() { return table_; }

  // A shared entry's header word (flags | domid << 16) and frame, as `view` maps them.
  static std::atomic_ref<std::uint32_t> header(std::span<std::uint8_t> table_page, GrantRef ref) {
    return word(table_page, ref, offsetof(gnttab::GrantEntryV1, flags));
  }
  static std::atomic_ref<std::uint32_t> frame(std::span<std::uint8_t> table_page, GrantRef ref) {
    return word(table_page, ref, offsetof(gnttab::GrantEntryV1, frame));
  }
  std::atomic_ref<std::uint32_t> header(GrantRef ref) const { return header(page(0), ref); }
  std::atomic_ref<std::uint32_t> frame(GrantRef ref) const { return frame(page(0), ref); }

  // The backend's view: its own mapping of the guest's memfd, as over the control socket.
  std::unique_ptr<gnttab::GrantMapper> make_mapper() const {
    return std::make_unique<gnttab::GrantMapper>(0, kGuest, std::vector{backend_mem_.view().page(0).value()},
                                                 backend_mem_.view());
  }
  std::unique_ptr<domain::EventChannel> make_channel() const {
    return std::make_unique<domain::Dom0Port>(UniqueFd(::dup(to_dom0_.fd())), UniqueFd(::dup(from_dom0_.fd())));
  }
  void kick() const { (void)to_dom0_.notify(); }
  std::uint64_t notifications() const { return from_dom0_.consume().value_or(0); }
  // Sleeps until the backend notifies (or timeout_ms): the notifications it sent, 0 on timeout.
  std::uint64_t wait_notification(int timeout_ms) const { return from_dom0_.wait(timeout_ms).value_or(0); }

 private:
  static std::atomic_ref<std::uint32_t> word(std::span<std::uint8_t> table_page, GrantRef ref, std::size_t off) {
    return std::atomic_ref<std::uint32_t>(
        *reinterpret_cast<std::uint32_t*>(table_page.data() + std::size_t{ref} * sizeof(gnttab::GrantEntryV1) + off));
  }

  domain::DomainMemory mem_;
  gnttab::GrantTable table_;
  domain::DomainMemory backend_mem_;
  domain::DomainMemory vcpu2_mem_;
  domain::EventFd to_dom0_, from_dom0_;
};

// ---- helpers ---------------------------------------------------------------------------------

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}


// Whether O_DIRECT I/O of a single 512-byte sector works where the image is (a disk with 4 KiB
// logical blocks refuses it): the predictions take sub-page segments to be served.
bool sector_direct_io_works(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
  if (!fd.valid()) return false;
  alignas(kPageSize) std::uint8_t buf[kPageSize];
  const ssize_t n = ::pread(fd.get(), buf + kBlkifSectorSize, kBlkifSectorSize, kBlkifSectorSize);
  return n == static_cast<ssize_t>(kBlkifSectorSize);
}

// Totals over one test's iterations: printed, and checked so that a generator that stopped
// reaching the interesting paths fails instead of passing vacuously.
struct Stats {
  std::uint64_t iterations = 0, requests = 0, okay = 0, error = 0, unsupported = 0;
  std::uint64_t matched = 0;        // responses checked against their request (id, op, status)
  std::uint64_t predicted_ok = 0;   // of those, requests that had to succeed
  std::uint64_t disabled = 0, round_trips = 0, flips = 0, restarts = 0;
  std::uint64_t vcpu2_writes = 0;  // racing: what the second vCPU rewrote while the queue served
};

enum class Mode { protocol, chaos, racing };
const char* to_string(Mode m) {
  switch (m) {
    case Mode::protocol: return "protocol";
    case Mode::chaos: return "chaos";
    case Mode::racing: return "racing";
  }
  return "?";
}

// What the response to a request must say, from the request alone.
enum class Expect : std::uint8_t { any, okay, error, unsupported, okay_or_unsupported };

// What the fuzzer knows about the request it put at one ring index.
struct Record {
  bool live = false;
  bool trusted = false;  // the slot still held exactly this request when the queue took it
  RingIdx idx = 0;
  std::uint64_t id = 0;
  std::uint8_t op = 0;   // what the response must echo
  Expect expect = Expect::any;
  std::vector<GrantRef> grefs;  // every grant it names (segments, indirect pages, descriptors)
  BlkifRequest req{};           // the request itself (failure messages, a restart's redo)
};

// What a grant ref is, as far as the fuzzer knows.
enum class Grant : std::uint8_t { none, rw, ro, stranger, revoked, ring, indirect, dirty, check };

std::string describe(const BlkifRequest& r) {
  std::string s = "op " + std::to_string(r.operation) + " nr " + std::to_string(r.nr_segments) + " id " +
                  std::to_string(r.id) + " sector " + std::to_string(r.sector_number) + " segs";
  for (unsigned i = 0; i < std::min<unsigned>(r.nr_segments, kBlkifMaxSegmentsPerRequest); ++i) {
    s += " " + std::to_string(r.seg[i].gref) + ":" + std::to_string(r.seg[i].first_sect) + "-" +
         std::to_string(r.seg[i].last_sect);
  }
  return s;
}

// ---- one iteration ---------------------------------------------------------------------------

class Fuzzer {
 public:
  Fuzzer(Mode mode, bool readonly, std::uint64_t seed, const test::TempDir& dir, Stats& stats)
      : mode_(mode), readonly_(readonly), seed_(seed), rng_(seed), dir_(dir), stats_(stats) {}
  ~Fuzzer() {
    // Long runs make thousands of images: each goes with its iteration (unlinked while open is
    // fine; the members close it after this).
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove(path_, ignored);
    if (!shadow_path_.empty()) std::filesystem::remove(shadow_path_, ignored);
  }
  Fuzzer(const Fuzzer&) = delete;
  Fuzzer& operator=(const Fuzzer&) = delete;

  void run() {
    setup();
    if (failed()) return;
    ++stats_.iterations;
    if (mode_ == Mode::racing) {
      run_racing();
    } else {
      run_polled();
    }
    if (!failed()) finish();
  }

 private:
  static bool failed() { return ::testing::Test::HasFailure(); }
  std::uint64_t pick(std::uint64_t lo, std::uint64_t hi) {  // inclusive
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng_);
  }
  bool chance(unsigned percent) { return pick(0, 99) < percent; }
  std::uint8_t byte() { return static_cast<std::uint8_t>(rng_()); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(rng_()); }

  // ---- setup ----

  void setup() {
    order_ = static_cast<unsigned>(pick(0, mode_ == Mode::racing ? 1 : 2));
    pages_ = 1u << order_;
    size_ = blkif_ring_size(order_);
    static constexpr std::uint32_t kIndirectMax[] = {0, 32, 256, 256};
    cfg_.max_indirect_segments = (order_ == 0 && chance(20)) ? static_cast<std::uint32_t>(IOV_MAX)
                                                             : kIndirectMax[pick(0, 3)];
    cfg_.flush = chance(85);
    cfg_.discard = chance(85);
    static constexpr std::chrono::nanoseconds kPoll[] = {0ns, 20us, 100us};
    cfg_.poll_max = mode_ == Mode::racing ? kPoll[pick(0, 2)] : 0ns;
    // Only chaos lets reads land in the ring pages (then the model checks are off).
    exposed_ = mode_ == Mode::chaos && chance(25);
    // Half of the chaos iterations break the producer index (the queue must then go silent);
    // the other half only move it in ways the ring allows, so that their queues live on.
    breaks_index_ = mode_ == Mode::chaos && chance(50);

    // The image: a pattern every sector of which is known.
    path_ = dir_.file("disk-" + std::to_string(seed_) + ".img");
    const std::uint64_t salt = rng_();
    image_.resize(kDiskBytes);
    for (std::size_t w = 0; w < kDiskBytes / 8; ++w) {
      const std::uint64_t v = splitmix(salt + w);
      std::memcpy(image_.data() + w * 8, &v, 8);
    }
    {
      UniqueFd fd(::open(path_.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600));
      ASSERT_TRUE(fd.valid());
      ASSERT_EQ(::pwrite(fd.get(), image_.data(), image_.size(), 0), static_cast<ssize_t>(image_.size()));
    }
    direct_ = chance(50) && sector_direct_io_works(path_);
    disk_ = std::make_unique<Disk>(Disk::open(path_, readonly_, direct_));
    touched_.assign(kDiskSectors, 0);
    window_len_ = pick(64, 768);
    window_ = pick(0, kDiskSectors - window_len_);

    guest_ = std::make_unique<Guest>();
    gstate_.assign(kTableRefs, Grant::none);
    gfn_.assign(kTableRefs, 0);
    tainted_.assign(kTableRefs, 0);
    switch (pick(0, 2)) {  // where the free-running indexes start (wrap-around included)
      case 0: start_ = 0; break;
      case 1: start_ = u32(); break;
      default: start_ = static_cast<RingIdx>(UINT32_MAX - pick(0, size_)); break;
    }
    ring_span_ = guest_->pages(kRingGfn, pages_);
    ASSERT_TRUE(BlkifFrontRing::init(ring_span_, start_).has_value());  // SHARED_RING_INIT
    ring_refs_.clear();
    for (unsigned i = 0; i < pages_; ++i) ring_refs_.push_back(grant(kRingGfn + i, false, Grant::ring));
    indirect_refs_.clear();
    for (unsigned i = 0; i < kIndirectPages; ++i) indirect_refs_.push_back(grant(kIndirectGfn + i, true, Grant::indirect));
    for (std::uint64_t d = 0; d < kDataPages; ++d) {
      const std::uint64_t r = pick(0, 99);
      if (r < 60) {
        grant(kDataGfn + d, false, Grant::rw);
      } else if (r < 85) {
        grant(kDataGfn + d, true, Grant::ro);
      } else if (r < 93) {
        grant(kDataGfn + d, false, Grant::stranger, kStranger);
      } else {
        const GrantRef g = grant(kDataGfn + d, false, Grant::revoked);
        ASSERT_TRUE(guest_->table().end_access(g).has_value());
      }
    }
    if (failed()) return;

    mapper_ = guest_->make_mapper();
    std::uint8_t* first = nullptr;
    for (unsigned i = 0; i < pages_; ++i) {
      auto m = mapper_->map(ring_refs_[i], false);
      ASSERT_TRUE(m.has_value());
      if (i == 0) first = m->writable().data();
      // One memfd mapping: the guest's consecutive ring pages are consecutive for the backend too
      // (what VbdConnection checks before it uses the mapping as is).
      ASSERT_EQ(m->writable().data(), first + std::size_t{i} * kPageSize);
    }
    backend_ring_ = first;
    // Protocol mode also kills and restarts the backend (below); half of the time with the
    // shadow file that makes the restart safe against a torn response.
    if (mode_ == Mode::protocol && chance(50)) {
      shadow_path_ = dir_.file("shadow-" + std::to_string(seed_));
      shadow_ = std::make_unique<ShadowRing>(ShadowRing::create(shadow_path_, size_));
    }
    queue_ = make_queue();
    ASSERT_TRUE(queue_);
    seen_ = cons_ = prod_ = published_ = rsp_cons_ = last_produced_ = start_;
    records_.assign(size_, Record{});
  }

  std::unique_ptr<BlkifQueue> make_queue() {
    auto back = BlkifBackRing::attach(std::span<std::uint8_t>(backend_ring_, std::size_t{pages_} * kPageSize));
    EXPECT_TRUE(back.has_value()) << "attach at rsp_prod refused";
    if (!back) return nullptr;
    return std::make_unique<BlkifQueue>("vbd5.51712", *disk_, *mapper_, std::move(*back), guest_->make_channel(),
                                        cfg_, shadow_.get());
  }

  GrantRef grant(std::uint64_t gfn, bool readonly, Grant state, gnttab::DomId to = 0) {
    auto r = guest_->table().grant_access(to, gfn, readonly);
    // A free ref whose entry the guest itself marked mapped is refused (and moved to the back of
    // the free list): take the next one.
    for (int i = 0; i < 64 && !r && r.error() == gnttab::Status::eagain; ++i) {
      r = guest_->table().grant_access(to, gfn, readonly);
    }
    EXPECT_TRUE(r.has_value()) << "grant_access: " << gnttab::to_string(r.error());
    if (!r) return kTableRefs;
    gstate_[*r] = state;
    gfn_[*r] = gfn;
    return *r;
  }

  // ---- the ring, as the guest sees it ----

  std::atomic_ref<RingIdx> index(std::size_t offset) const {
    return std::atomic_ref<RingIdx>(*reinterpret_cast<RingIdx*>(ring_span_.data() + offset));
  }
  std::atomic_ref<RingIdx> req_prod() const { return index(offsetof(SharedRingHeader, req_prod)); }
  std::atomic_ref<RingIdx> req_event() const { return index(offsetof(SharedRingHeader, req_event)); }
  std::atomic_ref<RingIdx> rsp_prod() const { return index(offsetof(SharedRingHeader, rsp_prod)); }
  std::atomic_ref<RingIdx> rsp_event() const { return index(offsetof(SharedRingHeader, rsp_event)); }
  std::size_t slot_offset(RingIdx i) const { return kHeaderBytes + std::size_t{i & (size_ - 1)} * kSlotBytes; }
  std::uint8_t* slot(RingIdx i) const { return ring_span_.data() + slot_offset(i); }
  Record& record(RingIdx i) { return records_[i & (size_ - 1)]; }

  // ---- requests ----

  bool clean_for(GrantRef g, bool write) const {
    if (g >= kTableRefs) return false;
    switch (gstate_[g]) {
      case Grant::rw:
      case Grant::ring: return true;
      case Grant::ro:
      case Grant::indirect: return write;  // a write to the disk only reads the page
      default: return false;
    }
  }

  template <class Pred>
  std::optional<GrantRef> probe(Pred pred) {
    // One draw whatever the outcome, so that what I/O timing changed (a revoke refused while a
    // grant was still pinned) does not shift every later decision of the seed.
    const std::uint64_t base = rng_();
    for (std::uint64_t i = 0; i < 64; ++i) {
      const auto g = static_cast<GrantRef>(splitmix(base + i) % kTableRefs);
      if (pred(g)) return g;
    }
    return std::nullopt;
  }

  GrantRef out_of_table() {
    switch (pick(0, 2)) {
      case 0: return kTableRefs + static_cast<GrantRef>(pick(0, 64));
      case 1: return UINT32_MAX;
      default: return u32() | 0x1000u;
    }
  }

  // A grant for a data segment: mostly one that works for the direction, else anything a
  // hostile guest could name. The ring's own grants only where reads may land in the ring.
  GrantRef pick_gref(bool write, bool wellformed) {
    if (wellformed || chance(50)) {
      auto g = probe([&](GrantRef r) { return gstate_[r] == Grant::rw || (write && gstate_[r] == Grant::ro); });
      if (g) return *g;
    }
    std::optional<GrantRef> g;
    switch (pick(0, 8)) {
      case 0: g = probe([&](GrantRef r) { return gstate_[r] == Grant::stranger; }); break;
      case 1: g = probe([&](GrantRef r) { return gstate_[r] == Grant::revoked; }); break;
      case 2: g = probe([&](GrantRef r) { return gstate_[r] == Grant::none; }); break;  // never granted
      case 3: return out_of_table();
      case 4:
        if (exposed_) return ring_refs_[pick(0, pages_ - 1)];
        break;
      case 5: g = probe([&](GrantRef r) { return gstate_[r] == Grant::dirty; }); break;
      case 6: g = probe([&](GrantRef r) { return gstate_[r] == Grant::ro; }); break;
      case 7: return indirect_refs_[pick(0, kIndirectPages - 1)];
      default: g = probe([&](GrantRef r) { return exposed_ || gstate_[r] != Grant::ring; }); break;
    }
    return g ? *g : out_of_table();
  }

  BlkifRequestSegment make_seg(bool write, bool wellformed) {
    BlkifRequestSegment s{};
    s.gref = pick_gref(write, wellformed);
    if (wellformed || chance(75)) {
      s.first_sect = static_cast<std::uint8_t>(pick(0, 7));
      s.last_sect = static_cast<std::uint8_t>(pick(s.first_sect, 7));
      return s;
    }
    switch (pick(0, 2)) {
      case 0:  // last before first
        s.first_sect = static_cast<std::uint8_t>(pick(1, 7));
        s.last_sect = static_cast<std::uint8_t>(pick(0, s.first_sect - 1u));
        break;
      case 1:  // past the page
        s.first_sect = static_cast<std::uint8_t>(pick(0, 7));
        s.last_sect = static_cast<std::uint8_t>(pick(8, 255));
        break;
      default:
        s.first_sect = byte();
        s.last_sect = byte();
        break;
    }
    return s;
  }

  // A first sector for `len` sectors: mostly inside this iteration's window (so that most of the
  // image stays untouched and invariant 3 has something to check), else at, across and past the
  // end of the disk, where sector * 512 overflows, and anything.
  std::uint64_t pick_sector(std::uint64_t len) {
    const std::uint64_t base = kDiskSectors - std::min(len, kDiskSectors);
    switch (pick(0, 9)) {
      case 0: return base - std::min<std::uint64_t>(base, pick(0, 2)) + pick(0, 3);  // at / across the end
      case 1: return kDiskSectors + pick(0, 64);
      case 2: return UINT64_MAX - pick(0, 64);
      case 3: return UINT64_MAX / kBlkifSectorSize - pick(0, 8) + pick(0, 16);
      case 4: return rng_();
      default: return window_ + pick(0, window_len_ - 1);
    }
  }
  // Inside the disk for a request of `len` sectors, in the window where it fits.
  std::uint64_t sector_that_fits(std::uint64_t len) {
    return std::min(window_ + pick(0, window_len_ - 1), kDiskSectors - len);
  }

  BlkifRequest make_request(unsigned& indirect_next) {
    const std::uint64_t id = chance(85) ? rng_() : (chance(50) ? 0 : UINT64_MAX);
    const std::uint64_t kind = pick(0, 99);
    const bool wellformed = kind >= 82 || chance(40);
    if (kind < 30 || (kind >= 82 && kind < 92) ||
        ((kind < 52 || kind >= 92) && indirect_next >= kIndirectPages)) {
      return make_rw(id, wellformed);
    }
    if (kind < 52 || kind >= 92) return make_indirect(id, wellformed, indirect_next);
    BlkifRequest req{};
    if (kind < 58) {  // flush (a hostile guest sends segments with it: an error, no data written)
      req.operation = kBlkifOpFlushDiskcache;
      req.id = id;
      if (chance(20)) req.nr_segments = byte();
      return req;
    }
    if (kind < 70) {
      BlkifRequestDiscard d{};
      d.operation = kBlkifOpDiscard;
      d.id = id;
      d.flag = chance(85) ? 0 : (chance(50) ? kBlkifDiscardSecure : byte());
      switch (pick(0, 9)) {
        case 0: d.nr_sectors = 0; break;
        case 1: d.nr_sectors = kDiskSectors + pick(0, 1); break;
        case 2: d.nr_sectors = UINT64_MAX - pick(0, 8); break;
        case 3: d.nr_sectors = rng_(); break;
        default: d.nr_sectors = pick(1, 64); break;
      }
      d.sector_number = pick_sector(d.nr_sectors);
      return blkif_pack(d);
    }
    if (kind < 76) {  // operations nobody offers: barrier, the reserved one, the unknown
      for (auto& b : std::span(reinterpret_cast<std::uint8_t*>(&req), sizeof req)) b = byte();
      const std::uint8_t ops[] = {kBlkifOpWriteBarrier, kBlkifOpReserved1, static_cast<std::uint8_t>(pick(7, 255))};
      req.operation = ops[pick(0, 2)];
      req.id = id;
      return req;
    }
    // A slot of random bytes, the operation among the real ones half of the time.
    for (auto& b : std::span(reinterpret_cast<std::uint8_t*>(&req), sizeof req)) b = byte();
    if (chance(50)) req.operation = static_cast<std::uint8_t>(pick(0, kBlkifOpIndirect));
    if (!exposed_) scrub_ring_refs(req);
    return req;
  }

  BlkifRequest make_rw(std::uint64_t id, bool wellformed) {
    BlkifRequest req{};
    const bool write = chance(50);
    req.operation = write ? kBlkifOpWrite : kBlkifOpRead;
    req.id = id;
    unsigned nr = static_cast<unsigned>(pick(1, kBlkifMaxSegmentsPerRequest));
    if (!wellformed) {
      const std::uint64_t r = pick(0, 9);
      if (r == 0) nr = 0;
      if (r >= 8) nr = static_cast<unsigned>(pick(kBlkifMaxSegmentsPerRequest + 1, 255));
    }
    req.nr_segments = static_cast<std::uint8_t>(nr);
    std::uint64_t sectors = 0;
    for (unsigned i = 0; i < std::min(nr, kBlkifMaxSegmentsPerRequest); ++i) {
      req.seg[i] = make_seg(write, wellformed);
      sectors += req.seg[i].last_sect >= req.seg[i].first_sect ? req.seg[i].last_sect - req.seg[i].first_sect + 1u : 0u;
    }
    req.sector_number = wellformed ? sector_that_fits(sectors) : pick_sector(sectors);
    return req;
  }

  BlkifRequest make_indirect(std::uint64_t id, bool wellformed, unsigned& indirect_next) {
    BlkifRequestIndirect ind{};
    ind.operation = kBlkifOpIndirect;
    ind.id = id;
    const bool write = chance(50);
    ind.indirect_op = (wellformed || chance(85)) ? (write ? kBlkifOpWrite : kBlkifOpRead) : byte();
    const std::uint32_t max = cfg_.max_indirect_segments;
    // Mostly what Linux's blkfront sends (up to 256), sometimes all the queue offers.
    const std::uint32_t most = max == 0 ? 16 : (chance(10) ? max : std::min(max, 256u));
    std::uint32_t nr = static_cast<std::uint32_t>(pick(1, most));
    bool good = wellformed;  // descriptors, pages and sector as a correct frontend makes them
    if (!wellformed) {
      switch (pick(0, 9)) {
        case 0: nr = 0; break;
        case 1:  // a correct request, but a few segments more than the backend offered
          nr = max + static_cast<std::uint32_t>(pick(1, 16));
          good = true;
          break;
        case 2: nr = static_cast<std::uint32_t>(pick(0, UINT16_MAX)); break;
        case 3: nr = static_cast<std::uint32_t>(pick(1, std::max(max, 1u))); break;
        default: break;
      }
    }
    ind.nr_segments = static_cast<std::uint16_t>(nr);
    const std::uint32_t pages = std::min(blkif_indirect_pages(ind.nr_segments), kBlkifMaxIndirectPagesPerRequest);
    std::uint64_t sectors = 0;
    for (std::uint32_t p = 0; p < pages; ++p) {
      if (indirect_next < kIndirectPages && (good || chance(85))) {
        const unsigned k = indirect_next++;
        ind.indirect_grefs[p] = indirect_refs_[k];
        auto page = guest_->page(kIndirectGfn + k);
        const std::uint32_t n = std::min(ind.nr_segments - p * kBlkifSegsPerIndirectFrame, kBlkifSegsPerIndirectFrame);
        for (std::uint32_t j = 0; j < n; ++j) {
          const BlkifRequestSegment s = make_seg(ind.indirect_op == kBlkifOpWrite, good);
          std::memcpy(page.data() + j * sizeof s, &s, sizeof s);
          sectors += s.last_sect >= s.first_sect ? s.last_sect - s.first_sect + 1u : 0u;
        }
      } else {
        ind.indirect_grefs[p] = pick_gref(/*write=*/true, false);
      }
    }
    for (std::uint32_t p = pages; p < kBlkifMaxIndirectPagesPerRequest; ++p) {
      if (chance(20)) ind.indirect_grefs[p] = u32();  // past nr_segments: must be ignored
    }
    ind.sector_number = good ? sector_that_fits(std::min(sectors, kDiskSectors))
                             : pick_sector(std::uint64_t{nr} * kBlkifSectorsPerPage);
    BlkifRequest req = blkif_pack(ind);
    if (!exposed_) scrub_ring_refs(req);
    return req;
  }

  // No grant of the ring's own pages where reads must not land in the ring.
  void scrub_ring_refs(BlkifRequest& req) const {
    auto is_ring = [&](GrantRef g) { return std::find(ring_refs_.begin(), ring_refs_.end(), g) != ring_refs_.end(); };
    if (req.operation == kBlkifOpIndirect) {
      auto ind = blkif_view<BlkifRequestIndirect>(req);
      for (auto& g : ind.indirect_grefs) {
        if (is_ring(g)) g = UINT32_MAX;
      }
      std::memcpy(&req, &ind, sizeof ind);
      return;
    }
    for (auto& s : req.seg) {
      if (is_ring(s.gref)) s.gref = UINT32_MAX;
    }
  }

  // The response a request must get, from its bytes (and, in protocol mode, its descriptor
  // pages, which nothing else writes there): the validation order of BlkifQueue::admit.
  Record predict(const BlkifRequest& req, RingIdx idx, bool descriptors_known = true) const {
    Record rec;
    rec.live = true;
    rec.trusted = true;
    rec.idx = idx;
    rec.id = req.id;
    rec.op = req.operation;
    rec.req = req;
    const std::uint64_t disk = kDiskSectors;
    switch (req.operation) {
      case kBlkifOpRead:
      case kBlkifOpWrite: {
        const bool write = req.operation == kBlkifOpWrite;
        rec.expect = Expect::error;
        if (write && readonly_) break;
        if (req.nr_segments == 0 || req.nr_segments > kBlkifMaxSegmentsPerRequest) break;
        bool clean = true;
        std::uint64_t sectors = 0;
        for (unsigned i = 0; i < req.nr_segments; ++i) {
          const BlkifRequestSegment s = req.seg[i];
          if (s.first_sect > s.last_sect || s.last_sect >= kBlkifSectorsPerPage) return rec;
          sectors += s.last_sect - s.first_sect + 1u;
          rec.grefs.push_back(s.gref);
          clean = clean && clean_for(s.gref, write);
        }
        if (req.sector_number > disk || sectors > disk - req.sector_number) break;
        rec.expect = clean ? Expect::okay : Expect::any;
        break;
      }
      case kBlkifOpIndirect: {
        const auto ind = blkif_view<BlkifRequestIndirect>(req);
        if (ind.indirect_op == kBlkifOpRead || ind.indirect_op == kBlkifOpWrite) rec.op = ind.indirect_op;
        if (cfg_.max_indirect_segments == 0) {
          rec.expect = Expect::unsupported;
          break;
        }
        const bool write = ind.indirect_op == kBlkifOpWrite;
        rec.expect = Expect::error;
        if (write && readonly_) break;
        if (ind.indirect_op != kBlkifOpRead && !write) break;
        if (ind.nr_segments == 0 || ind.nr_segments > cfg_.max_indirect_segments) break;
        const std::uint32_t pages = blkif_indirect_pages(ind.nr_segments);
        for (std::uint32_t p = 0; p < pages; ++p) rec.grefs.push_back(ind.indirect_grefs[p]);
        rec.expect = Expect::any;
        // Outside protocol mode the descriptors may change before the queue reads them.
        if (mode_ != Mode::protocol || !descriptors_known) break;
        bool clean = true;
        std::uint64_t sectors = 0;
        for (std::uint32_t p = 0; p < pages; ++p) {
          const GrantRef g = ind.indirect_grefs[p];
          if (g >= kTableRefs || gstate_[g] != Grant::indirect) return rec;  // descriptors unknown
          const auto page = guest_->page(gfn_[g]);
          const std::uint32_t n = std::min(ind.nr_segments - p * kBlkifSegsPerIndirectFrame, kBlkifSegsPerIndirectFrame);
          for (std::uint32_t j = 0; j < n; ++j) {
            BlkifRequestSegment s;
            std::memcpy(&s, page.data() + j * sizeof s, sizeof s);
            if (s.first_sect > s.last_sect || s.last_sect >= kBlkifSectorsPerPage) {
              rec.expect = Expect::error;
              return rec;
            }
            sectors += s.last_sect - s.first_sect + 1u;
            rec.grefs.push_back(s.gref);
            clean = clean && clean_for(s.gref, write);
          }
        }
        if (ind.sector_number > disk || sectors > disk - ind.sector_number) {
          rec.expect = Expect::error;
          break;
        }
        rec.expect = clean ? Expect::okay : Expect::any;
        break;
      }
      case kBlkifOpFlushDiskcache:
        rec.expect = !cfg_.flush ? Expect::unsupported : req.nr_segments != 0 ? Expect::error : Expect::okay;
        break;
      case kBlkifOpDiscard: {
        const auto d = blkif_view<BlkifRequestDiscard>(req);
        if (!cfg_.discard || !disk_->info().discard || (d.flag & kBlkifDiscardSecure) != 0) {
          rec.expect = Expect::unsupported;
        } else if (d.nr_sectors == 0 || d.sector_number > disk || d.nr_sectors > disk - d.sector_number) {
          rec.expect = Expect::error;
        } else {
          rec.expect = Expect::okay_or_unsupported;  // a file system without punch-hole says so
        }
        break;
      }
      default:
        rec.expect = Expect::unsupported;
        break;
    }
    return rec;
  }

  // The sectors a request could change, from its bytes alone: a superset (an indirect write is
  // bounded by 8 sectors per descriptor, whatever its pages hold by the time they are read).
  void mark_written(const BlkifRequest& req) {
    std::uint64_t first = 0, count = 0;
    switch (req.operation) {
      case kBlkifOpWrite: {
        if (readonly_ || req.nr_segments == 0 || req.nr_segments > kBlkifMaxSegmentsPerRequest) return;
        for (unsigned i = 0; i < req.nr_segments; ++i) {
          const BlkifRequestSegment s = req.seg[i];
          if (s.first_sect > s.last_sect || s.last_sect >= kBlkifSectorsPerPage) return;
          count += s.last_sect - s.first_sect + 1u;
        }
        first = req.sector_number;
        break;
      }
      case kBlkifOpIndirect: {
        const auto ind = blkif_view<BlkifRequestIndirect>(req);
        if (readonly_ || ind.indirect_op != kBlkifOpWrite || ind.nr_segments == 0 ||
            ind.nr_segments > cfg_.max_indirect_segments) {
          return;
        }
        first = ind.sector_number;
        count = std::uint64_t{ind.nr_segments} * kBlkifSectorsPerPage;
        break;
      }
      case kBlkifOpDiscard: {
        const auto d = blkif_view<BlkifRequestDiscard>(req);
        if (readonly_ || !cfg_.discard || (d.flag & kBlkifDiscardSecure) != 0) return;
        first = d.sector_number;
        count = d.nr_sectors;
        break;
      }
      default:
        return;
    }
    if (first >= kDiskSectors) return;
    const std::uint64_t end = first + std::min(count, kDiskSectors - first);
    for (std::uint64_t s = first; s < end; ++s) touched_[s] = 1;
  }

  // Puts one request at prod_ (not yet published).
  void produce_one(unsigned& indirect_next) {
    const BlkifRequest req = make_request(indirect_next);
    record(prod_) = predict(req, prod_);
    std::memcpy(slot(prod_), &req, sizeof req);
    if (mode_ == Mode::racing) mark_written(req);  // the poll modes scan the slots instead
    ++prod_;
    ++stats_.requests;
  }

  // RING_PUSH_REQUESTS_AND_CHECK_NOTIFY, done by hand.
  void publish() {
    const RingIdx old = published_;
    published_ = prod_;
    req_prod().store(prod_, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const RingIdx event = req_event().load(std::memory_order_acquire);
    if (static_cast<RingIdx>(prod_ - event) < static_cast<RingIdx>(prod_ - old)) guest_->kick();
  }

  // ---- responses ----

  void check_response(RingIdx idx, const BlkifResponse& rsp) {
    EXPECT_TRUE(rsp.status == kBlkifRspOkay || rsp.status == kBlkifRspError || rsp.status == kBlkifRspEopnotsupp)
        << "response " << idx << " status " << rsp.status;
    if (rsp.status == kBlkifRspOkay) ++stats_.okay;
    if (rsp.status == kBlkifRspError) ++stats_.error;
    if (rsp.status == kBlkifRspEopnotsupp) ++stats_.unsupported;
    if (exposed_) return;
    const Record& rec = record(idx);
    if (!rec.live || rec.idx != idx || !rec.trusted) return;
    ++stats_.matched;
    EXPECT_EQ(rsp.id, rec.id) << "response " << idx << " answers another request than " << describe(rec.req);
    EXPECT_EQ(rsp.operation, rec.op) << "request " << describe(rec.req);
    switch (rec.expect) {
      case Expect::okay:
        ++stats_.predicted_ok;
        EXPECT_EQ(rsp.status, kBlkifRspOkay) << "a well-formed request through valid grants: " << describe(rec.req);
        break;
      case Expect::error:
        EXPECT_EQ(rsp.status, kBlkifRspError) << "a malformed request: " << describe(rec.req);
        break;
      case Expect::unsupported:
        EXPECT_EQ(rsp.status, kBlkifRspEopnotsupp) << "an operation not offered: " << describe(rec.req);
        break;
      case Expect::okay_or_unsupported:
        EXPECT_NE(rsp.status, kBlkifRspError) << "a discard inside the disk: " << describe(rec.req);
        break;
      case Expect::any:
        break;
    }
  }

  // The queue's answers after a pass (poll modes): rsp_prod_pvt is exactly what it took minus
  // what it holds, and a pass that did not disable the queue published all of it.
  void consume_polled() {
    const RingIdx produced = rsp_pvt();
    if (produced != last_produced_) rsp_prod_scribbled_ = false;  // republished since
    last_produced_ = produced;
    if (!exposed_ && !rsp_prod_scribbled_) {
      EXPECT_EQ(rsp_prod().load(std::memory_order_acquire), produced) << "rsp_prod not published";
    }
    EXPECT_LE(static_cast<RingIdx>(produced - rsp_cons_), size_);
    for (RingIdx i = rsp_cons_; i != produced; ++i) {
      BlkifResponse rsp;
      std::memcpy(&rsp, slot(i), sizeof rsp);
      check_response(i, rsp);
    }
    rsp_cons_ = produced;
  }

  // Responses published by a queue that runs on its own thread.
  void consume_published() {
    const RingIdx p = rsp_prod().load(std::memory_order_acquire);
    if (static_cast<RingIdx>(p - rsp_cons_) > static_cast<RingIdx>(prod_ - rsp_cons_)) {
      ADD_FAILURE() << "rsp_prod " << p << " answers requests never pushed (pushed up to " << prod_ << ")";
      return;
    }
    for (RingIdx i = rsp_cons_; i != p; ++i) {
      BlkifResponse rsp;
      std::memcpy(&rsp, slot(i), sizeof rsp);
      check_response(i, rsp);
    }
    rsp_cons_ = p;
  }

  // ---- hostile acts between passes ----

  void downgrade(GrantRef g) {
    for (Record& rec : records_) {
      if (!rec.live || rec.expect != Expect::okay) continue;
      if (std::find(rec.grefs.begin(), rec.grefs.end(), g) != rec.grefs.end()) rec.expect = Expect::any;
    }
  }

  bool flippable(GrantRef g) const {
    switch (gstate_[g]) {
      case Grant::rw:
      case Grant::ro:
      case Grant::stranger:
      case Grant::revoked:
      case Grant::dirty: return true;
      case Grant::indirect: return mode_ != Mode::protocol;
      case Grant::ring: return exposed_;
      default: return false;
    }
  }

  std::uint32_t flip_target() {
    switch (pick(0, 5)) {
      case 3:
        if (mode_ != Mode::protocol) return static_cast<std::uint32_t>(kIndirectGfn + pick(0, kIndirectPages - 1));
        break;
      case 4:
        if (exposed_) return static_cast<std::uint32_t>(kRingGfn + pick(0, pages_ - 1));
        break;
      case 5: {
        const std::uint32_t bad[] = {static_cast<std::uint32_t>(kGuestPages + pick(0, 16)), UINT32_MAX, u32() | 0x10000u};
        return bad[pick(0, 2)];
      }
      default: break;
    }
    return static_cast<std::uint32_t>(kDataGfn + pick(0, kDataPages - 1));
  }

  // Rewrites entry g as the guest may: keeps the bits the mapper owns (a raw_write does not).
  void flip(GrantRef g) {
    auto header = guest_->header(g);
    std::uint32_t cur = header.load(std::memory_order_acquire);
    std::uint16_t flags = header_flags(cur);
    gnttab::DomId domid = header_domid(cur);
    switch (pick(0, 4)) {
      case 0: {
        const gnttab::DomId ids[] = {kStranger, 0, static_cast<gnttab::DomId>(u32())};
        domid = ids[pick(0, 2)];
        break;
      }
      case 1: flags ^= gtf::readonly; break;
      case 2: {
        const std::uint16_t types[] = {gtf::invalid, gtf::accept_transfer, gtf::transitive, gtf::permit_access};
        flags = static_cast<std::uint16_t>((flags & ~gtf::type_mask) | types[pick(0, 3)]);
        if (chance(20)) flags |= gtf::sub_page;
        break;
      }
      case 3: guest_->frame(g).store(flip_target(), std::memory_order_relaxed); break;
      default:  // made valid again (for us, read-write)
        flags = gtf::permit_access;
        domid = 0;
        break;
    }
    const auto keep = static_cast<std::uint16_t>(header_flags(cur) & kMapperBits);
    const auto mine = static_cast<std::uint16_t>((flags & ~kMapperBits) | keep);
    header.store(gnttab::header_word(mine, domid), std::memory_order_release);  // one thread here
    gstate_[g] = Grant::dirty;
    ++stats_.flips;
    downgrade(g);
  }

  // Any 32 bits over a header word, the mapper's bits included (then invariant 5 skips it).
  void raw_write(GrantRef g) {
    const std::uint32_t w = u32();
    if ((header_flags(w) & kMapperBits) != 0) tainted_[g] = 1;
    guest_->header(g).store(w, std::memory_order_release);
    gstate_[g] = Grant::dirty;
    downgrade(g);
  }

  // end_access as a guest does it: refused exactly while the backend holds the grant.
  void revoke_one() {
    auto g = probe([&](GrantRef r) { return gstate_[r] == Grant::rw || gstate_[r] == Grant::ro; });
    if (!g) return;
    const gnttab::PinCounts pins = mapper_->pins(*g);
    const bool held = pins.readers + pins.writers != 0;
    auto r = guest_->table().end_access(*g);
    EXPECT_EQ(r.has_value(), !held) << "end_access of grant " << *g << " with " << pins.readers << " read and "
                                    << pins.writers << " write pins";
    if (r) {
      gstate_[*g] = Grant::revoked;
      downgrade(*g);
    }
  }

  void scribble_pages() {
    for (std::uint64_t k = pick(1, 4); k > 0; --k) {
      const std::uint64_t gfn = (mode_ != Mode::protocol && chance(25)) ? kIndirectGfn + pick(0, kIndirectPages - 1)
                                                                        : kDataGfn + pick(0, kDataPages - 1);
      auto page = guest_->page(gfn);
      const std::uint64_t off = pick(0, kPageSize - 1);
      const std::uint64_t len = chance(80) ? pick(1, std::min<std::uint64_t>(64, kPageSize - off)) : kPageSize - off;
      for (std::uint64_t i = 0; i < len; ++i) page[off + i] = byte();
    }
  }

  void scribble_ring() {
    const std::size_t used = kHeaderBytes + std::size_t{size_} * kSlotBytes;
    // req_prod (bytes 0..3) only where the index may break.
    const std::size_t lowest = breaks_index_ ? 0 : sizeof(RingIdx);
    const std::size_t off = chance(30) ? pick(lowest, kHeaderBytes - 1) : pick(lowest, used - 1);
    const std::size_t len = std::min<std::size_t>(pick(1, 48), used - off);
    for (std::size_t i = 0; i < len; ++i) ring_span_[off + i] = byte();
    const std::size_t rsp_prod_off = offsetof(SharedRingHeader, rsp_prod);
    if (off < rsp_prod_off + sizeof(RingIdx) && off + len > rsp_prod_off) rsp_prod_scribbled_ = true;
    // Requests not taken yet whose slot was hit are no longer what the fuzzer recorded.
    for (RingIdx i = seen_; i != prod_; ++i) {
      const std::size_t s = slot_offset(i);
      if (off < s + kSlotBytes && off + len > s) record(i).trusted = false;
    }
  }

  void corrupt_req_prod() {
    const RingIdx rsp_pvt = this->rsp_pvt();
    RingIdx v;
    switch (breaks_index_ ? pick(0, 4) : 3) {
      case 0: v = rsp_pvt + size_ + 1 + static_cast<RingIdx>(pick(0, 1000)); break;  // far ahead
      case 1: v = seen_ - 1 - static_cast<RingIdx>(pick(0, size_)); break;          // behind
      case 2: v = u32(); break;
      case 3: v = seen_ + static_cast<RingIdx>(pick(0, size_ - (seen_ - rsp_pvt))); break;  // ahead, in range
      default: v = prod_ + 1; break;
    }
    req_prod().store(v, std::memory_order_release);
  }

  void hostile_acts() {
    if (chance(30)) {
      for (std::uint64_t k = pick(1, 4); k > 0; --k) {
        if (auto g = probe([&](GrantRef r) { return flippable(r); })) flip(*g);
      }
    }
    if (chance(15)) revoke_one();
    if (chance(30)) scribble_pages();
    if (mode_ != Mode::chaos) return;
    if (chance(10)) corrupt_req_prod();
    if (chance(20)) scribble_ring();
    if (chance(10)) {
      if (auto g = probe([&](GrantRef r) { return flippable(r) || gstate_[r] == Grant::none; })) raw_write(*g);
    }
  }

  // ---- driving the queue (protocol, chaos) ----

  // The queue's rsp_prod_pvt: what it took minus what it has not answered.
  RingIdx rsp_pvt() const { return cons_ - queue_->unanswered(); }

  // Whether the queue must refuse producer index v (RING_REQUEST_PROD_OVERFLOW, or backwards).
  bool index_is_bad(RingIdx v) const {
    const RingIdx rsp_pvt = this->rsp_pvt();
    const RingIdx in_flight = v - rsp_pvt;
    return in_flight > size_ || in_flight < static_cast<RingIdx>(seen_ - rsp_pvt);
  }

  void check_size() const {
    struct stat st {};
    ASSERT_EQ(::stat(path_.c_str(), &st), 0);
    EXPECT_EQ(static_cast<std::uint64_t>(st.st_size), kDiskBytes) << "the image changed size";
  }

  // One pass: what the slots hold could be taken as a request now, so every write they describe
  // counts as touched; then the pass, the disable rule, and the answers.
  void poll_and_check() {
    for (RingIdx i = 0; i < size_; ++i) {
      BlkifRequest req;
      std::memcpy(&req, slot(i), sizeof req);
      mark_written(req);
    }
    const RingIdx v = req_prod().load(std::memory_order_acquire);
    const bool bad = index_is_bad(v);
    const bool alive = queue_->poll_once();
    EXPECT_EQ(alive, !queue_->disabled());
    check_size();
    if (!exposed_) {
      EXPECT_EQ(queue_->disabled(), bad) << "req_prod " << v << " after " << seen_ << ", " << queue_->unanswered()
                                         << " unanswered, ring of " << size_;
    }
    if (queue_->disabled()) return;
    if (mode_ == Mode::protocol) {
      EXPECT_EQ(v, prod_);
    }
    prod_ = v;  // a valid index the guest scribbled counts as pushed
    seen_ = cons_ = v;
    consume_polled();
  }

  void pause_for_io() const {
    if (queue_->in_flight() > 0) std::this_thread::sleep_for(50us);
  }

  void run_polled() {
    const std::uint64_t steps = pick(12, 36);
    for (std::uint64_t step = 0; step < steps && !failed(); ++step) {
      // Room for the whole batch first (answers to wait for, bounded), so that the requests a
      // seed makes do not depend on how fast the disk was.
      const std::uint64_t batch = pick(0, 8);
      for (int i = 0; i < 20000 && size_ - (prod_ - rsp_cons_) < batch && !failed(); ++i) {
        pause_for_io();
        poll_and_check();
        if (queue_->disabled()) break;
      }
      if (queue_->disabled()) {
        check_disabled_is_silent();
        return;
      }
      ASSERT_GE(size_ - (prod_ - rsp_cons_), batch) << "the queue does not answer";
      unsigned indirect_next = 0;
      for (std::uint64_t n = batch; n > 0; --n) produce_one(indirect_next);
      req_prod().store(prod_, std::memory_order_release);
      hostile_acts();
      poll_and_check();
      if (!queue_->disabled() && chance(30)) {
        pause_for_io();
        poll_and_check();
      }
      if (!queue_->disabled() && mode_ == Mode::protocol && chance(6)) {
        restart();
        // restart() stops at a failure with the old queue gone and no new one (it checks for any
        // failure of the test so far): this crashed instead of failing when a check earlier in the
        // step had failed.
        if (failed() || !queue_) return;
      }
      if (queue_->disabled()) {
        check_disabled_is_silent();
        return;
      }
    }
    if (failed()) return;
    // Everything taken must be answered (bounded: 20000 passes, 1 s of them waiting for I/O).
    bool quiet = false;
    for (int i = 0; i < 20000 && !quiet && !failed(); ++i) {
      poll_and_check();
      if (queue_->disabled()) {
        check_disabled_is_silent();
        return;
      }
      quiet = queue_->in_flight() == 0 && queue_->unanswered() == 0 &&
              req_prod().load(std::memory_order_acquire) == seen_;
      if (!quiet) pause_for_io();
    }
    if (failed()) return;
    ASSERT_TRUE(quiet) << "the queue left " << queue_->unanswered() << " requests unanswered, " << queue_->in_flight()
                       << " in flight";
    EXPECT_EQ(rsp_cons_, seen_);
    // The guest puts its ring back in order (it may have scribbled rsp_prod itself).
    if (rsp_prod().load(std::memory_order_acquire) != seen_) {
      EXPECT_TRUE(exposed_ || rsp_prod_scribbled_) << "rsp_prod " << rsp_prod().load() << ", answered " << seen_;
      rsp_prod().store(seen_, std::memory_order_release);
    }
    prod_ = published_ = rsp_cons_ = seen_;
    round_trips();
  }

  // The backend dies (kill -9: its queue dropped with requests taken and unanswered; the
  // destructor waits for the kernel and lets go of their grants) and a new one attaches at the
  // shared rsp_prod, as a restarted xpv-blkback does. It must redo exactly the unanswered
  // requests, in order, with the same answers; with a shadow file also when the dead one had
  // already written a response into the first of them without publishing it (torn).
  void restart() {
    const RingIdx produced = rsp_pvt();
    const RingIdx redo = seen_ - produced;
    queue_.reset();
    EXPECT_EQ(mapper_->mapped(), pages_) << "the dead queue's grants are still mapped";
    if (failed()) return;
    if (shadow_) {
      if (redo > 0 && chance(50)) {  // torn: the answer written, rsp_prod not published
        BlkifResponse torn{};
        torn.id = record(produced).id;
        torn.operation = record(produced).op;
        std::memcpy(slot(produced), &torn, sizeof torn);
      }
      shadow_.reset();
      shadow_ = std::make_unique<ShadowRing>(ShadowRing::open(shadow_path_, size_));
      EXPECT_TRUE(shadow_->reused());
    }
    queue_ = make_queue();
    ASSERT_TRUE(queue_);
    ++stats_.restarts;
    cons_ = produced;  // the new queue takes [rsp_prod, req_prod) again
    // Grants may have changed since the dead queue took them, and descriptor pages been reused.
    for (RingIdx i = produced; i != seen_; ++i) {
      Record& rec = record(i);
      if (rec.live && rec.idx == i) {
        const bool trusted = rec.trusted;
        rec = predict(rec.req, i, /*descriptors_known=*/false);
        rec.trusted = trusted;
      }
    }
    poll_and_check();
    if (shadow_ && !failed() && !queue_->disabled()) {
      EXPECT_EQ(queue_->counters().redone_from_shadow.load(), redo) << "requests redone from the shadow file";
    }
  }

  // Invariant 1: a disabled queue answers nothing more, notifies nothing, takes and submits
  // nothing — also when the guest goes on pushing well-formed writes.
  void check_disabled_is_silent() {
    ++stats_.disabled;
    for (int i = 0; i < 20000 && queue_->in_flight() > 0; ++i) {
      EXPECT_FALSE(queue_->poll_once());
      pause_for_io();
    }
    ASSERT_EQ(queue_->in_flight(), 0u) << "I/O admitted before the disable never completed";
    (void)guest_->notifications();
    const RingIdx rsp = rsp_prod().load(std::memory_order_acquire);
    const QueueCounters& c = queue_->counters();
    const std::uint64_t before[] = {c.requests.load(), c.reads.load(), c.writes.load(), c.flushes.load(),
                                    c.discards.load(), c.batches.load(), c.notifications.load()};
    const std::vector<std::uint8_t> file = read_file();
    RingIdx v = req_prod().load(std::memory_order_acquire);
    for (int k = 0; k < 8; ++k) {
      BlkifRequest w{};
      w.operation = kBlkifOpWrite;
      w.id = rng_();
      w.nr_segments = 1;
      auto g = probe([&](GrantRef r) { return gstate_[r] == Grant::rw || gstate_[r] == Grant::ro; });
      if (!g) break;
      for (auto& b : guest_->page(gfn_[*g])) b = byte();
      w.seg[0] = {*g, 0, 7, {0, 0}};
      w.sector_number = sector_that_fits(8);
      std::memcpy(slot(v), &w, sizeof w);
      req_prod().store(++v, std::memory_order_release);
      guest_->kick();
      EXPECT_FALSE(queue_->poll_once());
    }
    EXPECT_EQ(rsp_prod().load(std::memory_order_acquire), rsp) << "a disabled queue answered";
    EXPECT_EQ(guest_->notifications(), 0u) << "a disabled queue notified";
    const std::uint64_t after[] = {c.requests.load(), c.reads.load(), c.writes.load(), c.flushes.load(),
                                   c.discards.load(), c.batches.load(), c.notifications.load()};
    EXPECT_TRUE(std::equal(std::begin(before), std::end(before), std::begin(after))) << "a disabled queue took requests";
    EXPECT_EQ(queue_->in_flight(), 0u);
    EXPECT_TRUE(read_file() == file) << "a disabled queue wrote to the disk";
  }

  // ---- racing ----

  // The second vCPU: rewrites the hostile grants' entries and frames and scribbles data and
  // descriptor pages while the queue serves, until the guest is done (`count` times at most).
  static void scribble_loop(const Guest& guest, std::uint64_t seed, const std::vector<GrantRef>& hostile,
                            std::vector<std::uint8_t>& tainted, const std::atomic<bool>& stop, int count,
                            std::uint64_t& done) {
    std::mt19937_64 rng(seed);
    auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
    const auto table = guest.vcpu2_page(0);
    for (int i = 0; i < count && !stop.load(std::memory_order_relaxed); ++i) {
      const GrantRef g = hostile[pick(0, hostile.size() - 1)];
      auto header = Guest::header(table, g);
      switch (pick(0, 5)) {
        case 0:
        case 1: {  // flags / domid, keeping the mapper's bits (compare-and-swap: it races the mapper)
          std::uint32_t cur = header.load(std::memory_order_acquire);
          for (int t = 0; t < 4; ++t) {
            std::uint16_t flags = header_flags(cur);
            gnttab::DomId domid = header_domid(cur);
            switch (pick(0, 3)) {
              case 0: domid = domid == 0 ? kStranger : 0; break;
              case 1: flags ^= gtf::readonly; break;
              case 2: flags = static_cast<std::uint16_t>((flags & ~gtf::type_mask) | pick(0, 3)); break;
              default: flags = gtf::permit_access; domid = 0; break;
            }
            const auto keep = static_cast<std::uint16_t>(header_flags(cur) & kMapperBits);
            const auto mine = static_cast<std::uint16_t>((flags & ~kMapperBits) | keep);
            if (header.compare_exchange_strong(cur, gnttab::header_word(mine, domid))) break;
          }
          break;
        }
        case 2: {
          const std::uint32_t targets[] = {static_cast<std::uint32_t>(kDataGfn + pick(0, kDataPages - 1)),
                                            static_cast<std::uint32_t>(kIndirectGfn + pick(0, kIndirectPages - 1)),
                                            static_cast<std::uint32_t>(kGuestPages + pick(0, 8)), UINT32_MAX};
          Guest::frame(table, g).store(targets[pick(0, 3)], std::memory_order_relaxed);
          break;
        }
        case 3: {
          const auto w = static_cast<std::uint32_t>(rng());
          if ((header_flags(w) & kMapperBits) != 0) tainted[g] = 1;
          header.store(w, std::memory_order_release);
          break;
        }
        default: {
          const std::uint64_t gfn = pick(0, 3) == 0 ? kIndirectGfn + pick(0, kIndirectPages - 1)
                                                    : kDataGfn + pick(0, kDataPages - 1);
          auto page = guest.vcpu2_page(gfn);
          const std::uint64_t off = pick(0, kPageSize - 8) & ~std::uint64_t{7};
          const std::uint64_t v = rng();
          std::memcpy(page.data() + off, &v, sizeof v);
          break;
        }
      }
      ++done;
      if (i % 8 == 0) std::this_thread::yield();
    }
  }

  // Waits (bounded) until every pushed request is answered, checking each answer.
  bool wait_answered(std::chrono::steady_clock::time_point deadline) {
    while (rsp_cons_ != prod_ && !failed()) {
      consume_published();
      if (rsp_cons_ == prod_) break;
      if (!await_responses(deadline)) {
        ADD_FAILURE() << "the queue stopped answering: " << static_cast<RingIdx>(prod_ - rsp_cons_)
                      << " requests outstanding, disabled " << queue_->disabled();
        return false;
      }
    }
    return !failed();
  }

  // Until rsp_prod moves past rsp_cons_ (false at the deadline). Half of the racing iterations
  // the guest polls the ring; the other half it sleeps as a frontend does
  // (RING_FINAL_CHECK_FOR_RESPONSES, then the event channel), so that a notification the queue
  // owes and does not send shows as answers that came without one.
  bool await_responses(std::chrono::steady_clock::time_point deadline) {
    while (true) {
      if (rsp_prod().load(std::memory_order_acquire) != rsp_cons_) return true;
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline) return false;
      if (!sleeps_on_events_) {
        std::this_thread::sleep_for(20us);
        continue;
      }
      rsp_event().store(rsp_cons_ + 1, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (rsp_prod().load(std::memory_order_acquire) != rsp_cons_) return true;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
      if (guest_->wait_notification(static_cast<int>(left)) == 0) {
        // The whole bound without a notification: the answers must not be there either.
        EXPECT_EQ(rsp_prod().load(std::memory_order_acquire), rsp_cons_)
            << "responses were published, the frontend had asked to be notified, and was not";
        return false;
      }
    }
  }

  void run_racing() {
    // Half of the data grants are the second vCPU's to rewrite; the rest stay exactly as granted.
    std::vector<GrantRef> hostile;
    for (GrantRef g = 0; g < kTableRefs; ++g) {
      if (gfn_[g] >= kDataGfn && gfn_[g] < kDataGfn + kDataPages && gstate_[g] != Grant::none && chance(50)) {
        hostile.push_back(g);
        gstate_[g] = Grant::dirty;
      }
    }
    ASSERT_FALSE(hostile.empty());
    sleeps_on_events_ = chance(50);
    const bool break_index = chance(25);
    std::atomic<bool> stop{false}, returned{false};
    std::thread queue_thread([this, &returned] {
      queue_->run();
      returned.store(true, std::memory_order_release);
    });
    std::uint64_t vcpu2_writes = 0;
    std::thread vcpu2(scribble_loop, std::cref(*guest_), rng_(), std::cref(hostile), std::ref(tainted_), std::cref(stop),
                      1000000, std::ref(vcpu2_writes));
    // Liveness bounds, not timings: generous enough for ASan on a loaded 2-core machine.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    const std::uint64_t total = pick(80, 200);
    std::uint64_t pushed = 0;
    while (pushed < total && !failed()) {
      consume_published();
      const RingIdx free = size_ - (prod_ - rsp_cons_);
      if (free == 0) {
        if (!await_responses(deadline)) {
          ADD_FAILURE() << "the queue stopped answering (ring full), disabled " << queue_->disabled();
          break;
        }
        continue;
      }
      unsigned indirect_next = 0;
      for (std::uint64_t n = std::min<std::uint64_t>({pick(1, 4), free, total - pushed}); n > 0; --n, ++pushed) {
        produce_one(indirect_next);
      }
      publish();
    }
    if (!failed()) wait_answered(deadline);
    stop.store(true, std::memory_order_relaxed);
    vcpu2.join();
    stats_.vcpu2_writes += vcpu2_writes;
    if (!failed()) round_trips();
    if (!failed() && break_index) {
      // A producer index far ahead: the running queue must disable itself, leave run() on its
      // own, and answer and notify nothing more.
      (void)guest_->notifications();
      const RingIdx answered = rsp_prod().load(std::memory_order_acquire);
      req_prod().store(prod_ + size_ + 1 + static_cast<RingIdx>(pick(0, 1000)), std::memory_order_release);
      guest_->kick();
      const auto bound = std::chrono::steady_clock::now() + 30s;
      while (!returned.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < bound) {
        std::this_thread::sleep_for(50us);
      }
      EXPECT_TRUE(returned.load()) << "run() did not return after the queue was disabled";
      EXPECT_TRUE(queue_->disabled());
      EXPECT_EQ(rsp_prod().load(std::memory_order_acquire), answered);
      EXPECT_EQ(guest_->notifications(), 0u) << "a disabled queue notified";
      ++stats_.disabled;
    }
    queue_->stop();
    queue_thread.join();
    EXPECT_EQ(queue_->disabled(), break_index && !failed())
        << "nothing else the guest did (grants, pages) is a ring violation";
    EXPECT_EQ(queue_->in_flight(), 0u);
  }

  // ---- invariant 2: a well-formed write and read still round-trip ----

  // Pushes one request and returns its answer (the queue polled here, or its thread kicked).
  std::optional<BlkifResponse> exchange(const BlkifRequest& req) {
    std::memcpy(slot(prod_), &req, sizeof req);
    ++prod_;
    if (mode_ == Mode::racing) {
      publish();
      if (!await_responses(std::chrono::steady_clock::now() + 30s)) {
        ADD_FAILURE() << "no answer to a well-formed request";
        return std::nullopt;
      }
    } else {
      req_prod().store(prod_, std::memory_order_release);
      published_ = prod_;
      for (int i = 0; i < 20000 && rsp_prod().load(std::memory_order_acquire) != prod_; ++i) {
        if (!queue_->poll_once()) {
          ADD_FAILURE() << "a well-formed request disabled the queue";
          return std::nullopt;
        }
        pause_for_io();
      }
      seen_ = cons_ = prod_;
      if (rsp_prod().load(std::memory_order_acquire) != prod_) {
        ADD_FAILURE() << "no answer to a well-formed request";
        return std::nullopt;
      }
    }
    BlkifResponse rsp;
    std::memcpy(&rsp, slot(prod_ - 1), sizeof rsp);
    rsp_cons_ = prod_;
    EXPECT_EQ(rsp.id, req.id) << "the answer is not to this request";
    return rsp;
  }

  // One write (direct, then indirect if offered) of random data and a read of the same sectors
  // into other pages, through fresh grants; a read-only disk refuses the write and reads the
  // pattern. The round-tripped sectors become exactly known again for the image check.
  void round_trips() {
    round_trip(/*indirect=*/false);
    if (!failed() && cfg_.max_indirect_segments > 0) round_trip(/*indirect=*/true);
    if (!failed()) ++stats_.round_trips;
  }

  void round_trip(bool indirect) {
    const unsigned n = indirect ? static_cast<unsigned>(pick(1, std::min(cfg_.max_indirect_segments, kCheckPages)))
                                : static_cast<unsigned>(pick(1, kBlkifMaxSegmentsPerRequest));
    std::vector<BlkifRequestSegment> wsegs(n), rsegs(n);
    std::vector<GrantRef> fresh;
    std::uint64_t sectors = 0;
    for (unsigned i = 0; i < n; ++i) {
      const auto first = static_cast<std::uint8_t>(indirect ? pick(0, 7) : 0);
      const auto last = static_cast<std::uint8_t>(indirect ? pick(first, 7) : 7);
      for (auto& b : guest_->page(kCheckGfn + i)) b = byte();
      std::memset(guest_->page(kCheckGfn + kCheckPages + i).data(), 0, kPageSize);
      wsegs[i] = {grant(kCheckGfn + i, true, Grant::check), first, last, {0, 0}};
      rsegs[i] = {grant(kCheckGfn + kCheckPages + i, false, Grant::check), first, last, {0, 0}};
      fresh.push_back(wsegs[i].gref);
      fresh.push_back(rsegs[i].gref);
      sectors += last - first + 1u;
    }
    const std::uint64_t sector = pick(0, kDiskSectors - sectors);
    auto make = [&](std::uint8_t op, const std::vector<BlkifRequestSegment>& segs) {
      if (!indirect) {
        BlkifRequest r{};
        r.operation = op;
        r.id = rng_();
        r.nr_segments = static_cast<std::uint8_t>(n);
        r.sector_number = sector;
        std::copy(segs.begin(), segs.end(), r.seg);
        return r;
      }
      BlkifRequestIndirect ind{};
      ind.operation = kBlkifOpIndirect;
      ind.indirect_op = op;
      ind.id = rng_();
      ind.nr_segments = static_cast<std::uint16_t>(n);
      ind.sector_number = sector;
      std::memcpy(guest_->page(kIndirectGfn).data(), segs.data(), n * sizeof(BlkifRequestSegment));
      ind.indirect_grefs[0] = grant(kIndirectGfn, true, Grant::check);
      fresh.push_back(ind.indirect_grefs[0]);
      return blkif_pack(ind);
    };
    // What was written: the data pages' sectors, in segment order.
    std::vector<std::uint8_t> data;
    for (unsigned i = 0; i < n; ++i) {
      const auto page = guest_->page(kCheckGfn + i);
      data.insert(data.end(), page.begin() + wsegs[i].first_sect * kBlkifSectorSize,
                  page.begin() + (wsegs[i].last_sect + 1u) * kBlkifSectorSize);
    }
    const char* what = indirect ? "indirect " : "";
    auto w = exchange(make(kBlkifOpWrite, wsegs));
    if (!w) return;
    EXPECT_EQ(w->operation, kBlkifOpWrite);
    EXPECT_EQ(w->status, readonly_ ? kBlkifRspError : kBlkifRspOkay) << what << "write of " << sectors << " sectors at "
                                                                      << sector;
    auto r = exchange(make(kBlkifOpRead, rsegs));
    if (!r) return;
    EXPECT_EQ(r->operation, kBlkifOpRead);
    EXPECT_EQ(r->status, kBlkifRspOkay) << what << "read of " << sectors << " sectors at " << sector;
    const std::size_t at = sector * kBlkifSectorSize;
    if (!readonly_) {
      std::copy(data.begin(), data.end(), image_.begin() + static_cast<std::ptrdiff_t>(at));
      std::fill(touched_.begin() + static_cast<std::ptrdiff_t>(sector),
                touched_.begin() + static_cast<std::ptrdiff_t>(sector + sectors), 0);
    }
    std::size_t off = 0;
    for (unsigned i = 0; i < n; ++i) {
      const auto page = guest_->page(kCheckGfn + kCheckPages + i);
      const std::size_t len = (rsegs[i].last_sect - rsegs[i].first_sect + 1u) * kBlkifSectorSize;
      EXPECT_EQ(std::memcmp(page.data() + rsegs[i].first_sect * kBlkifSectorSize, image_.data() + at + off, len), 0)
          << what << "read-back of segment " << i << " differs from what the disk must hold";
      off += len;
    }
    // Nothing is held any more: the guest can take every grant back.
    for (GrantRef g : fresh) {
      EXPECT_TRUE(guest_->table().end_access(g).has_value()) << "grant " << g << " still mapped after its answer";
      gstate_[g] = Grant::none;
    }
  }

  // ---- invariants 3, 4 and 5 ----

  std::vector<std::uint8_t> read_file() const {
    std::vector<std::uint8_t> out(kDiskBytes + 1);
    UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    const ssize_t n = ::pread(fd.get(), out.data(), out.size(), 0);
    out.resize(n < 0 ? 0 : static_cast<std::size_t>(n));
    return out;
  }

  void finish() {
    const std::vector<std::uint8_t> file = read_file();
    EXPECT_EQ(file.size(), kDiskBytes) << "the image changed size";
    if (file.size() == kDiskBytes && (readonly_ || !exposed_)) {
      for (std::uint64_t s = 0; s < kDiskSectors; ++s) {
        if (!readonly_ && touched_[s] != 0) continue;
        const std::size_t at = s * kBlkifSectorSize;
        if (std::memcmp(file.data() + at, image_.data() + at, kBlkifSectorSize) != 0) {
          ADD_FAILURE() << "sector " << s << " changed, though "
                        << (readonly_ ? "the disk is read-only" : "no write or discard could reach it");
          break;
        }
      }
    }
    // Invariant 5: the queue gone, only the ring is mapped; the mapper gone, nothing is.
    queue_.reset();
    EXPECT_EQ(mapper_->mapped(), pages_) << "grants still mapped after the queue is gone";
    auto is_ring = [&](GrantRef g) { return std::find(ring_refs_.begin(), ring_refs_.end(), g) != ring_refs_.end(); };
    for (GrantRef g = 0; g < kTableRefs; ++g) {
      if (is_ring(g)) continue;
      const gnttab::PinCounts pins = mapper_->pins(g);
      EXPECT_EQ(pins.readers + pins.writers, 0u) << "grant " << g << " still pinned";
    }
    auto check_flags = [&](bool ring) {
      for (GrantRef g = 0; g < kTableRefs; ++g) {
        if (is_ring(g) != ring || tainted_[g] != 0) continue;
        const std::uint16_t flags = header_flags(guest_->header(g).load(std::memory_order_acquire));
        EXPECT_EQ(flags & kMapperBits, 0) << "grant " << g << " left marked mapped (flags " << flags << ")";
      }
    };
    check_flags(false);
    mapper_.reset();
    check_flags(true);
  }

  const Mode mode_;
  const bool readonly_;
  const std::uint64_t seed_;
  std::mt19937_64 rng_;
  const test::TempDir& dir_;
  Stats& stats_;

  unsigned order_ = 0, pages_ = 1;
  RingIdx size_ = 32;
  QueueConfig cfg_;
  bool exposed_ = false;  // reads may land in the ring pages: the model checks are off
  bool breaks_index_ = false;
  bool sleeps_on_events_ = false;  // racing: the guest waits for notifications, not polling
  bool direct_ = true;
  std::string path_;
  std::vector<std::uint8_t> image_;    // what every sector not in touched_ must hold
  std::vector<std::uint8_t> touched_;  // per sector: a write or discard could have reached it
  std::uint64_t window_ = 0, window_len_ = 0;

  std::unique_ptr<Guest> guest_;
  std::unique_ptr<Disk> disk_;
  std::unique_ptr<gnttab::GrantMapper> mapper_;
  std::unique_ptr<ShadowRing> shadow_;  // before queue_: the queue uses it until it is gone
  std::string shadow_path_;
  std::uint8_t* backend_ring_ = nullptr;  // the ring as the backend maps it
  std::unique_ptr<BlkifQueue> queue_;
  std::span<std::uint8_t> ring_span_;
  std::vector<GrantRef> ring_refs_, indirect_refs_;
  std::vector<Grant> gstate_;
  std::vector<std::uint64_t> gfn_;
  std::vector<std::uint8_t> tainted_;  // entries the guest itself wrote GTF_reading/writing into

  RingIdx start_ = 0;
  RingIdx seen_ = 0;       // the last producer index the queue validated
  RingIdx cons_ = 0;       // its req_cons: seen_ after any pass, rsp_prod right after a restart
  RingIdx prod_ = 0;       // the guest's producer index
  RingIdx published_ = 0;  // what the guest last published by push (event-index check)
  RingIdx rsp_cons_ = 0;
  RingIdx last_produced_ = 0;
  bool rsp_prod_scribbled_ = false;
  std::vector<Record> records_;
};

// ---- the tests -------------------------------------------------------------------------------

class BlkbackQueueFuzz : public ::testing::Test {
 protected:
  // Every bad request is logged (rate-limited per queue); thousands of queues would flood.
  static void SetUpTestSuite() { spdlog::set_level(spdlog::level::critical); }
  static void TearDownTestSuite() { spdlog::set_level(spdlog::level::info); }

  // Runs the default number of seeds (or XPV_FUZZ_ITERATIONS, or the one XPV_FUZZ_SEED); `mode`
  // and `readonly` may depend on the seed, so that the seed alone replays an iteration.
  template <class Choose>
  Stats run_seeds(const char* test, std::uint64_t salt, std::uint64_t default_iterations, Choose choose) {
    const std::uint64_t only = xpv::test::env_number("XPV_FUZZ_SEED", 0);
    const std::uint64_t n = only != 0 ? 1 : xpv::test::env_number("XPV_FUZZ_ITERATIONS", default_iterations);
    Stats stats;
    for (std::uint64_t i = 0; i < n && !HasFailure(); ++i) {
      const std::uint64_t seed = only != 0 ? only : splitmix(salt + i);
      const auto [mode, readonly] = choose(seed);
      SCOPED_TRACE("iteration " + std::to_string(i) + ": " + to_string(mode) + (readonly ? ", read-only disk" : "") +
                   "; replay: XPV_FUZZ_SEED=" + std::to_string(seed) + " --gtest_filter=BlkbackQueueFuzz." + test);
      Fuzzer(mode, readonly, seed, dir_, stats).run();
    }
    std::printf("[ stats    ] %llu iterations, %llu requests: %llu okay, %llu error, %llu unsupported; %llu matched to "
                "their request (%llu had to succeed); %llu grant flips, %llu racing writes; %llu queues disabled; %llu restarts; %llu round trips\n",
                static_cast<unsigned long long>(stats.iterations), static_cast<unsigned long long>(stats.requests),
                static_cast<unsigned long long>(stats.okay), static_cast<unsigned long long>(stats.error),
                static_cast<unsigned long long>(stats.unsupported), static_cast<unsigned long long>(stats.matched),
                static_cast<unsigned long long>(stats.predicted_ok), static_cast<unsigned long long>(stats.flips),
                static_cast<unsigned long long>(stats.vcpu2_writes),
                static_cast<unsigned long long>(stats.disabled), static_cast<unsigned long long>(stats.restarts),
                static_cast<unsigned long long>(stats.round_trips));
    full_run_ = n >= default_iterations;
    return stats;
  }

  test::TempDir dir_;
  bool full_run_ = false;  // the coverage checks below hold for the default seeds, not for any one
};

struct Choice {
  Mode mode;
  bool readonly;
};

TEST_F(BlkbackQueueFuzz, Protocol) {
  const Stats s = run_seeds("Protocol", 0x6b1b0001, 80, [](std::uint64_t) { return Choice{Mode::protocol, false}; });
  if (!full_run_ || HasFailure()) return;
  EXPECT_GT(s.predicted_ok, 0u);
  EXPECT_GT(s.error, 0u);
  EXPECT_GT(s.unsupported, 0u);
  EXPECT_EQ(s.disabled, 0u);
  EXPECT_GT(s.restarts, 0u);
  EXPECT_EQ(s.round_trips, s.iterations);
}

TEST_F(BlkbackQueueFuzz, Chaos) {
  const Stats s = run_seeds("Chaos", 0x6b1b0002, 80, [](std::uint64_t) { return Choice{Mode::chaos, false}; });
  if (!full_run_ || HasFailure()) return;
  EXPECT_GT(s.disabled, 0u) << "no producer index the queue had to refuse";
  EXPECT_GT(s.round_trips, 0u) << "no queue survived to be checked";
}

TEST_F(BlkbackQueueFuzz, ReadOnlyDisk) {
  const Stats s = run_seeds("ReadOnlyDisk", 0x6b1b0003, 40, [](std::uint64_t seed) {
    return Choice{seed % 2 == 0 ? Mode::protocol : Mode::chaos, true};
  });
  if (!full_run_ || HasFailure()) return;
  EXPECT_GT(s.round_trips, 0u);
}

TEST_F(BlkbackQueueFuzz, Racing) {
  const Stats s = run_seeds("Racing", 0x6b1b0004, 40, [](std::uint64_t seed) {
    return Choice{Mode::racing, seed % 4 == 0};
  });
  if (!full_run_ || HasFailure()) return;
  EXPECT_EQ(s.round_trips, s.iterations);
  EXPECT_GT(s.predicted_ok, 0u);
}

}  // namespace
}  // namespace xpv::blkback
