// `xpv bench exits` — the cost of one exit, in the spirit of kvm-unit-tests' vmexit.c: a tiny
// 32-bit guest (protected mode, paging off) runs N CPUID (handled inside KVM), N `in` from an
// ACPI PM-timer port (handled in this process: the `inl_pmtimer` case) and N loads from an
// unbacked guest-physical address (an MMIO exit to this process), writing a marker to port 0xf0
// between phases. The host's
// steady_clock stamps each marker (guest clocks are not trusted); ns per exit = phase time / N,
// loop instructions included.
//
// Where it runs matters: natively here, CPL-0 guest code is emulated (~1 µs per instruction,
// ENVIRONMENT.md), so figures are dominated by that; inside `xpv testbed` they are a real KVM's
// (nested). The fourth phase is N Xen hypercall round trips (xen_version XENVER_version) through
// xpv's hypercall path: `out %al,$0xe8` (what xpv-vmm rewrites Linux's vmcall/vmmcall stubs to),
// the port-I/O trap reading the vCPU's registers, the Xen dispatcher, the result written back to
// rax (hypervisor-core/kvm/vmm/xen_domain.cpp).
//
// Reference: QEMU 7.2 `-enable-kvm` on the same /dev/kvm runs the same loop bytes (a multiboot
// image; QEMU's PM-timer port and its unassigned MMIO are handled in QEMU's userspace too), with
// a byte to its debug console (-debugcon stdio) between phases, stamped as it arrives on the pipe.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <vector>

#include "bench/bench.h"
#include "xpv/kvm/linux_boot.h"
#include "xpv/kvm/pc_devices.h"
#include "xpv/kvm/pci_host.h"
#include "xpv/kvm/vm.h"
#include "xpv/vmm/xen_domain.h"

namespace {

using xpv::bench::Clock;

constexpr std::uint16_t kMarkerPort = 0xf0;
constexpr std::uint16_t kPmTimerPort = 0x608;
constexpr std::uint32_t kMmioAddr = 0xd000'0000;  // in the PCI hole: no memory slot
constexpr std::uint8_t kDebugconPort = 0xe9;         // QEMU's isa-debugcon (-debugcon stdio)
constexpr std::uint8_t kDebugconMark = 0x01;         // a byte no QEMU message contains
constexpr std::uint32_t kMultibootLoad = 0x100000;

// Stamps each write with the host clock.
class Marker final : public xpv::kvm::BusDevice {
 public:
  void read(std::uint64_t, std::uint64_t, std::span<std::uint8_t> d) noexcept override { std::memset(d.data(), 0, d.size()); }
  void write(std::uint64_t, std::uint64_t, std::span<const std::uint8_t>) noexcept override {
    std::lock_guard lk(mu_);
    if (stamps_.size() < 16) stamps_.push_back(Clock::now());
  }
  std::vector<Clock::time_point> stamps() {
    std::lock_guard lk(mu_);
    return stamps_;
  }

 private:
  std::mutex mu_;
  std::vector<Clock::time_point> stamps_;
};

// Reads of the MMIO window: counted by the bus, answer 0.
class Sink final : public xpv::kvm::BusDevice {
 public:
  void read(std::uint64_t, std::uint64_t, std::span<std::uint8_t> d) noexcept override { std::memset(d.data(), 0, d.size()); }
  void write(std::uint64_t, std::uint64_t, std::span<const std::uint8_t>) noexcept override {}
};

// The same bytes for both VMMs, run in 32-bit protected mode with paging off (QEMU's multiboot
// entry; Vm::boot_cpu_protected_mode for xpv).
enum class Flavour { xpv, qemu };

std::vector<std::uint8_t> guest_code(std::uint32_t n, Flavour f) {
  std::vector<std::uint8_t> c;
  auto imm32 = [&](std::uint32_t v) {
    for (int i = 0; i < 4; ++i) c.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  };
  auto marker = [&] {
    if (f == Flavour::xpv) {
      c.insert(c.end(), {0xe6, kMarkerPort});  // out 0xf0, al: stamped by the Marker device
    } else {
      c.insert(c.end(), {0xb0, kDebugconMark, 0xe6, kDebugconPort});  // mov al, 1; out 0xe9, al
    }
  };
  auto loop_tail = [&](std::size_t top) {                          // dec esi; jnz top
    c.insert(c.end(), {0xff, 0xce, 0x75});
    c.push_back(static_cast<std::uint8_t>(static_cast<int>(top) - static_cast<int>(c.size() + 1)));
  };
  marker();
  c.push_back(0xbe), imm32(n);  // mov esi, n
  std::size_t top = c.size();
  c.insert(c.end(), {0x31, 0xc0, 0x0f, 0xa2});  // xor eax,eax; cpuid
  loop_tail(top);
  marker();
  c.push_back(0xbe), imm32(n);
  c.insert(c.end(), {0x66, 0xba, 0x08, 0x06});  // mov dx, 0x608
  top = c.size();
  c.push_back(0xed);  // in eax, dx
  loop_tail(top);
  marker();
  c.push_back(0xbe), imm32(n);
  c.push_back(0xbf), imm32(kMmioAddr);  // mov edi, kMmioAddr
  top = c.size();
  c.insert(c.end(), {0x8b, 0x07});  // mov eax, [rdi]
  loop_tail(top);
  marker();
  if (f == Flavour::xpv) {  // QEMU 7.2 has no Xen emulation: no hypercall phase there
    c.push_back(0xbe), imm32(n);
    top = c.size();
    c.push_back(0xb8), imm32(17);          // mov eax, 17 (__HYPERVISOR_xen_version)
    c.insert(c.end(), {0x31, 0xff});       // xor edi, edi (XENVER_version)
    c.insert(c.end(), {0xe6, xpv::xen::kHypercallPort});  // out al, 0xe8: the hypercall trap
    loop_tail(top);
    marker();
  }
  c.insert(c.end(), {0xb0, 0xfe, 0xe6, 0x64, 0xf4});  // mov al,0xfe; out 0x64,al (reset: stop); hlt
  return c;
}

// A multiboot (v1) image of the same loops for QEMU's -kernel: the 32-byte header with the
// a.out-kludge addresses (flag 16) so QEMU loads the flat file at 1 MiB and enters its code in
// 32-bit protected mode, paging off.
std::vector<std::uint8_t> multiboot_image(const std::vector<std::uint8_t>& code) {
  constexpr std::uint32_t kMagic = 0x1bad'b002, kFlags = 1u << 16, kHeaderSize = 32;
  const std::uint32_t fields[8] = {kMagic, kFlags, static_cast<std::uint32_t>(-(kMagic + kFlags)),
                                   kMultibootLoad,  // header_addr: the header is the file's start
                                   kMultibootLoad,  // load_addr
                                   0,               // load_end_addr: the whole file
                                   0,               // bss_end_addr: none
                                   kMultibootLoad + kHeaderSize};  // entry_addr
  std::vector<std::uint8_t> img;
  img.reserve(kHeaderSize + code.size());
  for (const std::uint32_t v : fields) {
    for (int i = 0; i < 4; ++i) img.push_back(static_cast<std::uint8_t>(v >> (8 * i)));  // little endian
  }
  for (const std::uint8_t b : code) img.push_back(b);
  return img;
}

// QEMU 7.2 -enable-kvm running the same three loops; each kDebugconMark byte QEMU writes to its
// stdout is stamped with the host clock as it is read. Returns ns per exit for the three phases,
// or why not.
struct QemuRef {
  std::optional<double> per[3];
  std::string why_not;
};

QemuRef qemu_reference(std::uint32_t n) {
  QemuRef out;
  std::string dir = (std::filesystem::temp_directory_path() / "xpv-bench-exits-qemu.XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    out.why_not = "mkdtemp failed";
    return out;
  }
  struct RemoveDir {
    std::string d;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } remove_dir{dir};
  const std::string image = dir + "/exits.mb";
  {
    const auto img = multiboot_image(guest_code(n, Flavour::qemu));
    std::ofstream f(image, std::ios::binary);
    f.write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
    if (!f) {
      out.why_not = "cannot write " + image;
      return out;
    }
  }
  std::vector<Clock::time_point> stamps;
  std::string text;  // what QEMU said besides the marks, for the error message
  const int st = xpv::bench::run_streaming(
      {"qemu-system-x86_64", "-enable-kvm", "-cpu", "host", "-m", "64", "-smp", "1", "-nodefaults", "-display",
       "none", "-monitor", "none", "-serial", "none", "-no-reboot", "-debugcon", "stdio", "-kernel", image},
      300, [&](std::string_view chunk, Clock::time_point at) {
        for (const char ch : chunk) {
          if (ch == static_cast<char>(kDebugconMark)) {
            stamps.push_back(at);
          } else if (text.size() < 2000) {
            text.push_back(ch);
          }
        }
      });
  if (stamps.size() != 4) {
    out.why_not = "QEMU reference failed (" + std::to_string(stamps.size()) + " of 4 marks, wait status " +
                  std::to_string(st) + "): " + text.substr(0, 300);
    return out;
  }
  for (int i = 0; i < 3; ++i) {
    out.per[i] = std::chrono::duration<double, std::nano>(stamps[static_cast<std::size_t>(i + 1)] -
                                                          stamps[static_cast<std::size_t>(i)])
                     .count() /
                 n;
  }
  return out;
}

std::vector<xpv::bench::Result> run_exits(const xpv::bench::Options& opts) {
  const auto n = static_cast<std::uint32_t>(std::max(100.0, 20000 * opts.scale));
  xpv::kvm::VmConfig cfg;
  cfg.vcpus = 1;
  cfg.memory_bytes = 64ull << 20;
  // The Xen platform (hypercall trap, dispatcher) needs a run directory for its control socket.
  std::string run_dir = (std::filesystem::temp_directory_path() / "xpv-bench-exits.XXXXXX").string();
  if (::mkdtemp(run_dir.data()) == nullptr) throw std::runtime_error("mkdtemp " + run_dir + ": " + std::strerror(errno));
  struct RemoveDir {
    std::string d;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } remove_dir{run_dir};
  xpv::vmm::XenDomainConfig xcfg;
  xcfg.domid = 1;
  xcfg.name = "bench-exits";
  xcfg.run_dir = run_dir;
  xcfg.max_grant_frames = 1;
  xpv::vmm::add_xen_device_memory(cfg, xcfg);
  xpv::kvm::Vm vm(cfg);
  xpv::kvm::PciHost pci;
  xpv::vmm::XenDomain xen(vm, pci, xcfg);
  Marker marker;
  xpv::kvm::PmTimer pm;
  Sink sink;
  xpv::kvm::ResetPorts reset([&] { vm.request_stop(xpv::kvm::StopReason::reboot, "bench done"); });
  auto check = [](auto r) { if (!r) throw std::runtime_error(r.error().message); };
  check(vm.pio().add(kMarkerPort, 1, &marker, "marker"));
  check(vm.pio().add(kPmTimerPort, 4, &pm, "pm timer"));
  check(vm.pio().add(0x64, 1, &reset, "i8042"));
  check(vm.mmio().add(kMmioAddr, 0x1000, &sink, "mmio sink"));
  const auto code = guest_code(n, Flavour::xpv);
  auto m = vm.memory().translate(0x100000, code.size());
  if (!m) throw std::runtime_error("bench guest does not fit");
  std::memcpy(m->data(), code.data(), code.size());
  vm.boot_cpu_protected_mode(0x100000);  // as QEMU's multiboot entry: the same mode for both
  const auto reason = vm.run();
  const auto st = marker.stamps();
  if (reason != xpv::kvm::StopReason::reboot || st.size() != 5) {
    throw std::runtime_error("exit bench guest stopped early: " + std::string(xpv::kvm::to_string(reason)) + " " +
                             vm.stop_message());
  }
  auto per = [&](int i) {
    return std::chrono::duration<double, std::nano>(st[static_cast<std::size_t>(i + 1)] - st[static_cast<std::size_t>(i)]).count() / n;
  };
  const std::string where = std::getenv("XPV_TESTBED") != nullptr ? "inside the testbed (nested KVM)" : "on this host's KVM";
  if (xen.platform().calls(17) != n) {
    throw std::runtime_error("exit bench: " + std::to_string(xen.platform().calls(17)) + " of " + std::to_string(n) +
                             " hypercalls reached the dispatcher");
  }
  const QemuRef ref = qemu_reference(n);
  const std::string common = "measured " + where + ", " + std::to_string(n) + " iterations incl. loop instructions";
  const std::string with_ref = ref.why_not.empty()
                                   ? common + "; reference: QEMU 7.2 -enable-kvm, the same code as a multiboot image "
                                              "(both in 32-bit protected mode)"
                                   : common + "; " + ref.why_not;
  return {
      {"cpuid", "ns/exit", per(0), ref.per[0], with_ref, true},
      {"inl_pmtimer (userspace PIO)", "ns/exit", per(1), ref.per[1], with_ref, true},
      {"mmio read (userspace)", "ns/exit", per(2), ref.per[2], with_ref, true},
      {"hypercall round trip (xen_version via the port-I/O trap)", "ns/call", per(3), std::nullopt,
       common + "; no reference: QEMU 7.2 has no Xen emulation (its Xen-on-KVM arrived in 8.0)", true},
  };
}

}  // namespace

XPV_BENCH_SUITE("exits", "ns per exit: CPUID, PM-timer port read, MMIO read, Xen hypercall (tiny guest, host clock)",
                run_exits);
