// `xpv bench hvm` — a stock Linux HVM guest with Xen PV drivers under xpv, next to the same guest
// under QEMU 7.2 + KVM with virtio, in `xpv testbed` sessions (both VMMs run on L1's genuine KVM,
// so only the ratios mean something: ENVIRONMENT.md). Two parts, net (the iperf3 boots) and disk
// (the bonnie++ boots), each with both VMMs back to back in ONE L1 session; a part a lost L1 took
// is measured again in the next session (hvm_parts.h, outer()).
//
//   host: xpv image build (cached) ── XPV_BENCH_IMAGE ──► xpv testbed --share S -- xpv bench hvm
//   L1 (XPV_TESTBED set, this same file's inner()), for each part in XPV_BENCH_PARTS, xpv's boot
//   then QEMU's:
//     xpv:  xpv up (xenstored, blkback, netback; run dir in L1's tmpfs /tmp, logs in the share, so
//           that they outlive an L1 that dies), then one of the two boots of
//           `type = "hvm"`, 512 MiB, 2 vCPUs, upcall "callback" (XPV_BENCH_HVM_UPCALL), root.ext4 (a fresh copy
//           in L1's tmpfs) as xvda
//           through xpv-blkback, one vif 10.0.0.2/24 through xpv-netback (host side 10.0.0.1):
//             net:  xpv.run=iperf3 xpv.clients=9 xpv.pairs=3 (3 rounds of host->guest then
//                     guest->host: kSingleRounds, then 3 rounds of --bidir and 3 of two
//                     processes at once: kBothWaysRounds)
//             disk: xpv.run=bonnie xpv.bonnie_direct=1 xpv.size=512 xpv.bonnie_chunk=65536
//                     (bonnie++ -f -D -s 512:65536: O_DIRECT bulk phases in 64 KiB chunks, no
//                     per-char phases)
//     QEMU: qemu-system-x86_64 -enable-kvm -cpu host -m 512 -smp 2, same vmlinuz + initrd.cpio, a
//           fresh copy of root.ext4 as virtio-blk (cache=writeback: the copy lives on tmpfs, which
//           has no O_DIRECT; xpv-blkback falls back to buffered I/O there too), virtio-net on a
//           TAP xpvtap0 10.0.0.1/24 with vhost=on when /dev/vhost-net exists; the same boot.
//   Each boot's console log is followed by L1 (host clock: L1's steady_clock, never the guest's);
//   the markers are frontends/guest-image/README.md's.
//
// Metrics (xpv / QEMU):
//   iperf3 host->guest, guest->host (-R)   Gbit/s received, iperf3 -t 10 (its default) from L1 to 10.0.0.2
//                                          (the median of 3 runs each way, in turn)
//   iperf3 bidir total                     Gbit/s, both directions of --bidir summed
//   iperf3 bidir min/max                   the smaller direction over the larger (1 = fair)
//                                          (both-ways rows: the median of 3 rounds; the notes
//                                          list every round)
//   iperf3 2-process bidir total, min/max  the same with two iperf3 clients at once (host->guest to
//                                          5201, guest->host -R to 5202), each against its own guest
//                                          server process (xpv.pairs=1): iperf3 3.12's --bidir runs
//                                          both streams in one thread that sends up to 10 blocks per
//                                          block it reads, so its split is partly iperf3's own
//   ping rtt idle                          ms, mean round trip of 50 pings 50 ms apart from L1 before
//                                          the first iperf3 run (lower is better)
//   ping rtt 10 ms apart                   ms, the same with 300 pings 10 ms apart right after
//                                          (against the above: the cost of waking sleeping threads)
//   ping rtt under host->guest / guest->host load
//                                          ms, pings 100 ms apart during the single-stream runs: the
//                                          queueing behind a bulk transfer (lower is better)
//   bonnie++ run (host clock)              s between XPV-PHASE bonnie-1 begin/end as L1 sees them
//                                          on the console: THE disk metric (lower is better)
//   bonnie++ block write/read/rewrite      KiB/s from bonnie++'s CSV (the guest's clock; +++++
//                                          = too fast for bonnie++ to time → no figure); O_DIRECT
//                                          in the guest (-D), so the disk path, not the page cache
// Duration (measured, session 15): ~7 min for the testbed session with the 64 MiB file; the
// 512 MiB one adds about a minute (a 256 MiB run: 25 s of bonnie++ on the xpv side).
// --quick: iperf3 -t 2 and xpv.size=256. A step that fails gets one more, fresh boot (guarded());
// one that fails twice leaves its metrics without a figure (NaN → null in the JSON) and says why
// in `note`; nothing is ever invented.
// The console logs, daemon logs and QEMU's output are copied back: next to --json as
// FILE-logs/ (or kept in the share, whose path is printed, when anything failed).
#include <signal.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <stop_token>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "bench/bench.h"
#include "bench/hvm_output.h"
#include "bench/hvm_parts.h"
#include "bench/hvm_watch.h"

namespace fs = std::filesystem;

namespace {

using xpv::bench::Clock;
using xpv::bench::Result;
using xpv::bench::hvm::Part;

constexpr const char* kGuestIp = "10.0.0.2";
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string q(const std::string& s) { return "'" + s + "'"; }

// Inside L1 the run's progress is watched (hvm_watch.h; inner() owns it and its thread): what
// follows tells it what the main thread does. Null on the host side.
// Atomic: the watchdog thread says things too (say()).
std::atomic<xpv::bench::hvm::ProgressWatch*> g_watch{nullptr};

void watch_step(const std::string& what) {
  if (auto* w = g_watch.load()) w->step(what, Clock::now());
}
void watch_progress() {
  if (auto* w = g_watch.load()) w->progress(Clock::now());
}

// `cmd` under timeout(1): SIGTERM after `seconds`, SIGKILL 10 s later.
std::string bounded(int seconds, const std::string& cmd) {
  return "timeout -k 10 " + std::to_string(seconds) + " " + cmd;
}
// The longest a command of bounded(seconds, ...) runs.
int bound_of(int seconds) { return seconds + 10; }
// Its exit status when timeout(1) ended it (SIGTERM: 124; SIGKILL after the grace: 137).
bool timed_out(int rc) { return rc == 124 || rc == 137; }

// A command the main thread waits for, marked as such with the longest its own timeouts let it
// run (bound_s; 0 for a quick command without one).
class InChild {
 public:
  InChild(const std::string& cmd, int bound_s) {
    if (auto* w = g_watch.load()) {
      w->child_begin(cmd.size() > 120 ? cmd.substr(0, 117) + "..." : cmd, bound_s, Clock::now());
    }
  }
  ~InChild() {
    if (auto* w = g_watch.load()) w->child_end(Clock::now());
  }
  InChild(const InChild&) = delete;
  InChild& operator=(const InChild&) = delete;
};

int shell(const std::string& cmd, int bound_s = 0) {
  const InChild child(cmd, bound_s);
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

xpv::bench::Captured captured(const std::string& cmd, int bound_s = 0) {
  const InChild child(cmd, bound_s);
  return xpv::bench::shell_capture(cmd);
}

std::string capture(const std::string& cmd, int bound_s = 0) { return captured(cmd, bound_s).out; }

std::mutex g_say_mu;  // the watchdog thread says things too

void say_locked(const std::string& s) {
  std::cout << "xpv bench hvm: " << s << std::endl;
  if (auto* w = g_watch.load()) w->said(Clock::now());
}

void say(const std::string& s) {
  const std::lock_guard lock(g_say_mu);
  say_locked(s);
}

// The watchdog of the run inside L1 (hvm_watch.h): every 5 s it asks the watch; a heartbeat is
// said, a stuck main thread ends the process with exit 125, which the host side (outer()) takes
// for a lost L1 and answers with a new session. What it cannot end — an L1 that stops running
// processes, a process that cannot exit — falls silent and meets `xpv testbed --quiet-limit`.
class Watchdog {
 public:
  Watchdog() : watch_({}, Clock::now()), thread_([this](const std::stop_token& st) { run(st); }) { g_watch = &watch_; }
  ~Watchdog() { g_watch = nullptr; }  // then thread_ stops and joins, before watch_ goes
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void run(const std::stop_token& st) {
    using Kind = xpv::bench::hvm::ProgressWatch::Verdict::Kind;
    for (;;) {
      for (int i = 0; i < 50; ++i) {
        if (st.stop_requested()) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      const auto v = watch_.check(Clock::now());
      if (v.kind == Kind::heartbeat) {
        // Skipped while the main thread is saying something: that is output too, and if its
        // write is what blocks, waiting here would keep this thread from the stuck check.
        const std::unique_lock lock(g_say_mu, std::try_to_lock);
        if (lock.owns_lock()) say_locked(v.text);
      } else if (v.kind == Kind::stuck) {
        // Straight to the file descriptor, not through say()'s lock or stdout's, which the stuck
        // main thread may hold, and only if it takes the line within a second: the exit must
        // not wait for an output that has stopped (--quiet-limit then ends L1).
        const std::string line =
            "xpv bench hvm: " + v.text + "; giving up this L1 session (exit 125: the host side starts another)\n";
        pollfd out{STDOUT_FILENO, POLLOUT, 0};
        if (::poll(&out, 1, 1000) == 1 && (out.revents & POLLOUT) != 0) (void)!::write(STDOUT_FILENO, line.data(), line.size());
        std::_Exit(125);
      }
    }
  }

  xpv::bench::hvm::ProgressWatch watch_;
  std::jthread thread_;
};

// A step that failed: its message goes into the notes of the metrics it would have measured.
// The parsers of hvm_output.h throw the same type.
using Failure = xpv::bench::hvm::HvmOutputError;
using xpv::bench::hvm::last_lines;

// A guest's console log, read as it grows. Markers are consumed in order (`cursor_`): each
// await() searches after the previous match (a marker may be printed on ttyS0 and hvc0 both).
class Console {
 public:
  explicit Console(fs::path path) : path_(std::move(path)) {
    std::error_code ec;
    const auto size = fs::file_size(path_, ec);
    start_ = ec ? 0 : size;  // a log appended across boots: only what this boot writes
  }
  ~Console() {
    if (fd_ >= 0) ::close(fd_);
  }
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;
  // Opened once (the VM creates the file after this object exists), then read from where the
  // last read ended: the log is on the 9p share, and every open is more requests to L1's 9p
  // transport, where the session-35 stall most likely sat (hvm_watch.h).
  void poll() {
    if (fd_ < 0) fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::pread(fd_, buf, sizeof buf, static_cast<off_t>(start_ + text_.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {  // opened again at the next poll, as the file was before
        ::close(fd_);
        fd_ = -1;
      }
      if (n <= 0) return;
      text_.append(buf, static_cast<std::size_t>(n));
    }
  }
  const std::string& text() const { return text_; }

  // Waits for `marker` (bounded by timeout_s on the host clock); returns when it was seen.
  // Throws Failure on timeout, an XPV-FATAL line, or a VM that is gone (`alive` false).
  Clock::time_point await(const std::string& marker, double timeout_s, const std::function<bool()>& alive) {
    const auto t0 = Clock::now();
    watch_step("waiting for '" + marker + "' on " + path_.filename().string());
    for (;;) {
      watch_progress();
      poll();
      const auto pos = text_.find(marker, cursor_);
      if (pos != std::string::npos) {
        cursor_ = pos + marker.size();
        return Clock::now();
      }
      const auto fatal = text_.find("XPV-FATAL");
      if (fatal != std::string::npos) {
        throw Failure("the guest failed: " + last_lines(text_.substr(fatal, text_.find('\n', fatal) - fatal), 1));
      }
      if (!alive()) {
        poll();
        if (text_.find(marker, cursor_) != std::string::npos) continue;
        throw Failure("the VM exited before '" + marker + "' (console: " + last_lines(text_, 3) + ")");
      }
      if (xpv::bench::seconds_since(t0) > timeout_s) {
        throw Failure("no '" + marker + "' on the console within " + std::to_string(static_cast<int>(timeout_s)) +
                      " s (console: " + last_lines(text_, 3) + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  fs::path path_;
  int fd_ = -1;
  std::uintmax_t start_ = 0;
  std::string text_;
  std::size_t cursor_ = 0;
};

// One VM under test: xpv (through the toolstack) or QEMU (a child of this process).
class Vm {
 public:
  virtual ~Vm() = default;
  virtual bool alive() = 0;
  // Ends the VM (after its poweroff, or to give up on it); idempotent.
  virtual void stop() = 0;
  Console& console() { return *console_; }

 protected:
  std::unique_ptr<Console> console_;
};

bool pid_alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!std::getline(stat, s)) return false;
  const auto rp = s.rfind(')');
  return rp != std::string::npos && rp + 2 < s.size() && s[rp + 2] != 'Z';
}

// Paths of the inner run inside L1.
struct Inner {
  fs::path work;    // L1 tmpfs scratch
  fs::path image;   // vmlinuz, initrd.cpio, root.ext4 (never booted: copied per boot)
  fs::path logs;    // copied back to the host (in the share)
  std::string xpv;  // this binary
  int iperf_s = 5;
  int bonnie_mib = 512;
};

fs::path fresh_disk(const Inner& in, const std::string& name) {
  const fs::path disk = in.work / (name + ".ext4");
  if (shell("cp --sparse=always " + q((in.image / "root.ext4").string()) + " " + q(disk.string())) != 0) {
    throw Failure("cannot copy root.ext4 into " + in.work.string() + " (L1 tmpfs full?)");
  }
  return disk;
}

// The upcall mode of xpv's guest: XPV_BENCH_HVM_UPCALL (vector | callback | intx; it reaches L1
// like every XPV_* variable), "callback" by default (see XpvVm).
std::string bench_upcall() {
  const char* v = std::getenv("XPV_BENCH_HVM_UPCALL");
  if (v == nullptr || *v == '\0') return "callback";
  const std::string u = v;
  if (u != "vector" && u != "callback" && u != "intx") {
    throw std::runtime_error("XPV_BENCH_HVM_UPCALL='" + u + "': must be vector, callback or intx");
  }
  return u;
}

// XPV_BENCH_HVM_APPEND: more kernel parameters for both guests (e.g. xen_netfront.max_queues=1
// for an experiment; a parameter one kernel side does not know is ignored by it).
std::string bench_append() {
  const char* v = std::getenv("XPV_BENCH_HVM_APPEND");
  if (v == nullptr || *v == '\0') return {};
  const std::string a = v;
  if (a.find_first_of("\"'\\\n") != std::string::npos) {
    throw std::runtime_error("XPV_BENCH_HVM_APPEND='" + a + "': quotes, backslashes and newlines are not allowed");
  }
  return " " + a;
}

// The most a toolstack command (xpv up, create, destroy, down) may take inside L1.
constexpr int kToolstackTimeout = 180;

class XpvVm : public Vm {
 public:
  XpvVm(const Inner& in, const std::string& name, const std::string& extra) : in_(in), name_(name) {
    disk_ = fresh_disk(in, name);
    const fs::path cfg = in.work / (name + ".cfg");
    // Callback-vector upcalls by default, what Linux uses on Xen: PV spinlocks and IPIs, and NIC
    // queue interrupts the guest can spread over its vCPUs (INTx keeps every event on vCPU 0;
    // its guest's transmit starved under iperf3 --bidir: min/max 0.11 against callback's 0.46 on
    // 2026-12-01). Vector mode has taken L1's kernel down in the testbed (tools/testbed/README.md).
    std::ofstream(cfg) << "name = \"" << name << "\"\ntype = \"hvm\"\nmemory = 512\nvcpus = 2\nupcall = \"" << bench_upcall()
                       << "\"\n"
                       << "kernel = \"" << (in.image / "vmlinuz").string() << "\"\n"
                       << "ramdisk = \"" << (in.image / "initrd.cpio").string() << "\"\n"
                       << "extra = \"root=/dev/xvda panic=-1 xpv.ip=" << kGuestIp << "/24 " << extra << bench_append() << "\"\n"
                       << "disk = [ 'vdev=xvda, target=" << disk_.string() << "' ]\n"
                       << "vif = [ 'mac=00:16:3e:00:00:01, ip=" << kGuestIp << "/24' ]\n";
    console_ = std::make_unique<Console>(fs::path(std::getenv("XPV_LOG_DIR")) / ("console-" + name + ".log"));
    // Bounded, as every step inside L1 is: an L1 whose processes hang must not hold the session
    // until its 1800 s timeout (session 34 lost 15 minutes to a boot that was never given up).
    const auto created =
        captured(bounded(kToolstackTimeout, q(in.xpv) + " create " + q(cfg.string())) + " 2>&1", bound_of(kToolstackTimeout));
    const std::string& out = created.out;
    std::ofstream(in.logs / ("create-" + name + ".log")) << out;
    const auto p = out.find(", pid ");
    if (p != std::string::npos) pid_ = static_cast<pid_t>(std::atol(out.c_str() + p + 6));
    if (pid_ <= 0) {
      stop();  // whatever the toolstack left of it
      throw Failure(timed_out(created.rc) ? "xpv create did not finish in " + std::to_string(kToolstackTimeout) + " s"
                                          : "xpv create failed: " + last_lines(out, 2));
    }
  }
  ~XpvVm() override { stop(); }
  bool alive() override { return pid_alive(pid_); }
  void stop() override {
    if (stopped_) return;
    stopped_ = true;
    // After its workload the guest powers off and xpv-vmm exits by itself, printing its exit and
    // hypercall counters (--stats) into its log: a bounded grace for that, as for QEMU below.
    // Then (or for a guest given up on) the toolstack ends the VMM and removes the devices.
    for (int i = 0; i < 100 && alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // Said before the toolstack runs, so that the console shows where a session that stops
    // answering got to.
    if (alive()) {
      // A guest still running 10 s after it was to stop: given up on (a workload that stopped
      // making progress) or, rarely, slow to power off after its workload (20 s lost then).
      // Before it goes, its kernel writes its blocked tasks and their stacks to the console
      // (SysRq w through control/sysrq: only xenbus is needed), so the kept console says what it
      // waited for; the teardown lines of the backends then say how it left their rings.
      say(name_ + ": still running after 10 s; asking it for its blocked tasks (sysrq w), then destroying it");
      shell(bounded(30, q(in_.xpv) + " sysrq " + q(name_) + " w") + " >> " + q((in_.logs / "toolstack.log").string()) + " 2>&1",
            bound_of(30));
      for (int i = 0; i < 200 && alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const int rc = shell(bounded(kToolstackTimeout, q(in_.xpv) + " destroy " + q(name_)) + " >> " +
                             q((in_.logs / "toolstack.log").string()) + " 2>&1",
                         bound_of(kToolstackTimeout));
    if (timed_out(rc)) {
      say(name_ + ": xpv destroy did not finish in " + std::to_string(kToolstackTimeout) + " s; left as it is");
    }
    std::error_code ec;
    fs::remove(disk_, ec);
  }

 private:
  const Inner& in_;
  std::string name_;
  fs::path disk_;
  pid_t pid_ = -1;
  bool stopped_ = false;
};

class QemuVm : public Vm {
 public:
  QemuVm(const Inner& in, const std::string& name, const std::string& extra, bool vhost) : in_(in) {
    disk_ = fresh_disk(in, name);
    const fs::path log = in.logs / ("console-qemu-" + name + ".log");
    console_ = std::make_unique<Console>(log);
    const std::vector<std::string> argv{
        "qemu-system-x86_64", "-enable-kvm", "-cpu", "host", "-m", "512", "-smp", "2", "-nodefaults",
        "-display", "none", "-monitor", "none", "-no-reboot", "-serial", "file:" + log.string(),
        "-kernel", (in.image / "vmlinuz").string(), "-initrd", (in.image / "initrd.cpio").string(),
        "-append", "console=ttyS0 root=/dev/vda panic=-1 xpv.ip=" + std::string(kGuestIp) + "/24 " + extra + bench_append(),
        "-drive", "file=" + disk_.string() + ",if=virtio,format=raw,cache=writeback",
        "-netdev", std::string("tap,id=n0,ifname=xpvtap0,script=no,downscript=no,vhost=") + (vhost ? "on" : "off"),
        "-device", "virtio-net-pci,netdev=n0"};
    const std::string out = (in.logs / ("qemu-" + name + ".log")).string();
    // Everything the child needs is made before the fork: this process has a second thread (the
    // watchdog), so the child may only make async-signal-safe calls.
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw Failure("fork failed");
    if (pid_ == 0) {
      const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        if (fd > 2) ::close(fd);
      }
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
  }
  ~QemuVm() override { stop(); }
  bool alive() override {
    if (reaped_) return false;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) reaped_ = true;
    return !reaped_;
  }
  void stop() override {
    if (!reaped_) {
      // After the guest's poweroff QEMU exits by itself: a bounded grace, then SIGKILL.
      for (int i = 0; i < 100 && alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!reaped_ && pid_ > 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        reaped_ = true;
      }
    }
    std::error_code ec;
    fs::remove(disk_, ec);
  }

 private:
  const Inner& in_;
  fs::path disk_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// ---- workloads --------------------------------------------------------------------------------

struct NetFigures {
  std::optional<double> up, down, bidir_total, bidir_fairness;
  std::optional<double> pair_total, pair_fairness;  // two iperf3 processes, one per direction
  std::string up_rounds, down_rounds;               // each single-stream round's Gbit/s
  std::string bidir_rounds, pair_rounds;            // each round's "host->guest+guest->host" Gbit/s
  // Round trips from L1 to the guest (ping), with the link idle and during the single-stream runs;
  // a ping that failed leaves its figure empty and says why in ping_error (the iperf3 figures stand).
  std::optional<xpv::bench::hvm::Ping> rtt_idle, rtt_close, rtt_up, rtt_down;
  std::string ping_error;
  std::string error;
  std::string retried;  // why a first attempt failed, when the figures come from a second
};

struct DiskFigures {
  std::optional<double> wall_s, block_write, block_read, rewrite;
  std::string error;
  std::string csv_note;  // fields bonnie++ could not time
  std::string retried;
};

// Both-ways tests (--bidir, and two processes at once) run this many times in the iperf3 boot; their
// figures are the median round's (hvm_output.h, summarize_rounds).
constexpr int kBothWaysRounds = 3;
// The single-stream runs too, host->guest and guest->host in turn (summarize_one_way): until
// session 50 each was one 10 s run, and the same code's guest->host ratio read 0.59 and 1.09.
constexpr int kSingleRounds = 3;

constexpr double kReadyTimeout = 300;  // boot to the workload's first marker (nested KVM under TCG)

using xpv::bench::hvm::Iperf;
using xpv::bench::hvm::parse_iperf;

int iperf_timeout(int seconds) { return seconds + 40; }
std::string iperf_cmd(int seconds, const std::string& mode) {
  return bounded(iperf_timeout(seconds), "iperf3 -J -c " + std::string(kGuestIp) + " -t " + std::to_string(seconds) + " " + mode);
}

// iperf3's own output (its JSON: every interval of both ends) goes with the logs, so that a
// figure can be read again later — one step that collapses (a direction at a few Mbit/s) shows
// when and how there.
void keep(const fs::path& file, const std::string& text) { std::ofstream(file) << text; }

// iperf3 from L1 to the guest's server; Gbit/s as received. Its JSON is kept as `keep_as`.
Iperf iperf(int seconds, const std::string& mode, const fs::path& keep_as) {
  const std::string out = capture(iperf_cmd(seconds, mode) + " 2>&1", bound_of(iperf_timeout(seconds)));
  keep(keep_as, out);
  return parse_iperf(out, mode);
}

std::string slurp_and_remove(const fs::path& f) {
  std::ifstream in(f);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::error_code ec;
  fs::remove(f, ec);
  return s;
}

// ping from L1 to the guest: `count` echo requests `interval` s apart, each waited for at most 2 s.
int ping_timeout(int count) { return count + 30; }
std::string ping_cmd(int count, const char* interval) {
  return bounded(ping_timeout(count), "ping -n -q -c " + std::to_string(count) + " -i " + interval + " -W 2 " + kGuestIp);
}

// Round trips on a quiet link: `count` pings `interval` s apart (50 × 50 ms: every thread on the
// way has gone to sleep between two; 300 × 10 ms: fewer have).
xpv::bench::hvm::Ping ping_quiet(int count, const char* interval) {
  return xpv::bench::hvm::parse_ping(capture(ping_cmd(count, interval) + " 2>&1", bound_of(ping_timeout(count))));
}

// A single-stream iperf3 run with pings 100 ms apart from its second 1 to half a second before its
// end (the latency a flow sees while a bulk transfer fills the path: queues in the TAP, the
// backend and the guest's rings). The iperf3 figure is returned; the ping's is put in `rtt`, or
// its failure in `ping_error` (the iperf3 figure stands either way).
Iperf iperf_with_ping(int seconds, const std::string& mode, const fs::path& dir, const fs::path& keep_as,
                      std::optional<xpv::bench::hvm::Ping>& rtt, std::string& ping_error) {
  const fs::path pf = dir / "ping-under-load.txt";
  const int count = std::max(3, (seconds - 1) * 10 - 5);
  const std::string out =
      capture("(sleep 1; " + ping_cmd(count, "0.1") + " > " + q(pf.string()) + " 2>&1) & " + iperf_cmd(seconds, mode) + " 2>&1; wait",
              std::max(1 + bound_of(ping_timeout(count)), bound_of(iperf_timeout(seconds))));
  const std::string pings = slurp_and_remove(pf);
  keep(keep_as, out);
  try {
    rtt = xpv::bench::hvm::parse_ping(pings);
  } catch (const Failure& e) {
    ping_error += std::string(ping_error.empty() ? "" : "; ") + "under iperf3 " + (mode.empty() ? "host->guest" : mode) +
                  ": " + e.what();
  }
  return parse_iperf(out, mode);
}

// Two iperf3 clients at once, two processes: host->guest to port 5201 and guest->host (-R) to
// 5202 (the guest's xpv.pairs servers). fwd = host->guest, rev = guest->host.
Iperf iperf_pair(int seconds, const fs::path& dir, const fs::path& keep_prefix) {
  const fs::path a = dir / "iperf-pair-up.json", b = dir / "iperf-pair-down.json";
  (void)capture(iperf_cmd(seconds, "-p 5201") + " > " + q(a.string()) + " 2>&1 & " + iperf_cmd(seconds, "-p 5202 -R") +
                    " > " + q(b.string()) + " 2>&1 & wait",
                bound_of(iperf_timeout(seconds)));
  const std::string up = slurp_and_remove(a), down = slurp_and_remove(b);
  keep(keep_prefix.string() + "-up.json", up);
  keep(keep_prefix.string() + "-down.json", down);
  Iperf r;
  r.fwd = parse_iperf(up, "-p 5201 (pair)").fwd;
  r.rev = parse_iperf(down, "-p 5202 -R (pair)").fwd;
  return r;
}

NetFigures run_iperf(Vm& vm, const Inner& in, const std::string& who) {
  NetFigures f;
  const fs::path kept = in.logs / (who + "-iperf3");  // + "-up-1.json" etc.: the last boot's
  try {
    auto& c = vm.console();
    const auto alive = [&] { return vm.alive(); };
    const auto t0 = Clock::now();
    c.await("XPV-IPERF3-LISTENING 5201 client=1", kReadyTimeout, alive);
    say(who + ": iperf3 server listening " + std::to_string(xpv::bench::seconds_since(t0)) + " s after start");
    try {
      f.rtt_idle = ping_quiet(50, "0.05");
    } catch (const Failure& e) {
      f.ping_error = std::string("idle: ") + e.what();
    }
    try {
      f.rtt_close = ping_quiet(300, "0.01");
    } catch (const Failure& e) {
      f.ping_error += std::string(f.ping_error.empty() ? "" : "; ") + "10 ms apart: " + e.what();
    }
    // host->guest and guest->host take turns, so that a slow spell of L1 lands on both.
    std::vector<double> ups, downs;
    std::vector<xpv::bench::hvm::Ping> pings_up, pings_down;
    for (int k = 1; k <= kSingleRounds; ++k) {
      const std::string n = std::to_string(k);
      if (k > 1) c.await("XPV-IPERF3-LISTENING 5201 client=" + std::to_string(2 * k - 1), 60, alive);
      std::optional<xpv::bench::hvm::Ping> rtt;
      ups.push_back(iperf_with_ping(in.iperf_s, "", in.work, kept.string() + "-up-" + n + ".json", rtt, f.ping_error).fwd);
      if (rtt) pings_up.push_back(*rtt);
      c.await("XPV-IPERF3-LISTENING 5201 client=" + std::to_string(2 * k), 60, alive);
      rtt.reset();
      downs.push_back(
          iperf_with_ping(in.iperf_s, "-R", in.work, kept.string() + "-down-" + n + ".json", rtt, f.ping_error).fwd);
      if (rtt) pings_down.push_back(*rtt);
    }
    const auto up = xpv::bench::hvm::summarize_one_way(ups), down = xpv::bench::hvm::summarize_one_way(downs);
    f.up = up.median;
    f.up_rounds = up.rounds;
    f.down = down.median;
    f.down_rounds = down.rounds;
    if (!pings_up.empty()) f.rtt_up = xpv::bench::hvm::merge_pings(pings_up);
    if (!pings_down.empty()) f.rtt_down = xpv::bench::hvm::merge_pings(pings_down);
    std::vector<Iperf> bidir, pair;
    for (int k = 1; k <= kBothWaysRounds; ++k) {
      c.await("XPV-IPERF3-LISTENING 5201 client=" + std::to_string(2 * kSingleRounds + k), 60, alive);
      bidir.push_back(iperf(in.iperf_s, "--bidir", kept.string() + "-bidir-" + std::to_string(k) + ".json"));
    }
    const auto b = xpv::bench::hvm::summarize_rounds(bidir);
    f.bidir_total = b.total;
    f.bidir_fairness = b.fairness;
    f.bidir_rounds = b.rounds;
    for (int k = 1; k <= kBothWaysRounds; ++k) {
      c.await("XPV-IPERF3-LISTENING 5201+5202 pair=" + std::to_string(k), 60, alive);
      pair.push_back(iperf_pair(in.iperf_s, in.work, kept.string() + "-pair-" + std::to_string(k)));
    }
    const auto p = xpv::bench::hvm::summarize_rounds(pair);
    f.pair_total = p.total;
    f.pair_fairness = p.fairness;
    f.pair_rounds = p.rounds;
    c.await("XPV-DONE iperf3 rc=0", 60, alive);
    say(who + ": iperf3 done: host->guest " + f.up_rounds + ", guest->host " + f.down_rounds + " Gbit/s, bidir " +
        b.rounds + ", two processes " + p.rounds);
  } catch (const Failure& e) {
    f.error = e.what();
    say(who + ": iperf3 FAILED: " + f.error);
  }
  vm.stop();
  return f;
}

DiskFigures run_bonnie(Vm& vm, const std::string& who) {
  DiskFigures f;
  try {
    auto& c = vm.console();
    const auto alive = [&] { return vm.alive(); };
    const auto t_begin = c.await("XPV-PHASE bonnie-1 begin", kReadyTimeout, alive);
    const auto t_end = c.await("XPV-PHASE bonnie-1 end", 600, alive);
    f.wall_s = std::chrono::duration<double>(t_end - t_begin).count();
    say(who + ": bonnie++ ran " + std::to_string(*f.wall_s) + " s (host clock)");
    c.await("XPV-BONNIE-END", 60, alive);
    const std::string& t = c.text();
    const auto b = t.find("XPV-BONNIE-BEGIN");
    const auto e = t.find("XPV-BONNIE-END", b);
    const std::vector<std::string> fields = xpv::bench::hvm::bonnie_csv_fields(t.substr(b, e - b));
    if (fields.empty()) throw Failure("no bonnie++ CSV line between XPV-BONNIE-BEGIN and XPV-BONNIE-END");
    // bonnie++ 1.98 CSV: [11] block output K/s, [13] rewrite K/s, [17] block input K/s.
    f.block_write = xpv::bench::hvm::bonnie_field(fields, 11, "block write", f.csv_note);
    f.rewrite = xpv::bench::hvm::bonnie_field(fields, 13, "rewrite", f.csv_note);
    f.block_read = xpv::bench::hvm::bonnie_field(fields, 17, "block read", f.csv_note);
    c.await("XPV-DONE bonnie rc=0", 60, alive);
  } catch (const Failure& e) {
    f.error = e.what();
    say(who + ": bonnie++ FAILED: " + f.error);
  }
  vm.stop();
  return f;
}

// L1's counters of pages it moved or reclaimed behind its guests' backs (/proc/vmstat): THP
// collapses (khugepaged), compaction and migration, reclaim. Every boot says how many it saw
// (guarded()), so boots that die in the testbed (tools/testbed/README.md, "Known issue") can be
// set against what L1's memory management did meanwhile. Empty where /proc/vmstat is unreadable.
std::vector<std::pair<std::string, long long>> l1_page_moves() {
  static const char* const kKeys[] = {"pgmigrate_success", "pgmigrate_fail",      "thp_fault_alloc",
                                      "thp_collapse_alloc", "thp_split_page",     "compact_stall",
                                      "compact_daemon_wake", "compact_migrate_scanned", "pgsteal_kswapd",
                                      "pgsteal_direct"};
  std::vector<std::pair<std::string, long long>> out;
  std::ifstream in("/proc/vmstat");
  std::string key;
  long long v = 0;
  while (in >> key >> v) {
    if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return key == k; }) != std::end(kKeys)) {
      out.emplace_back(key, v);
    }
  }
  return out;
}

// "name=delta ..." for the counters that moved between two l1_page_moves(), "none" if none did,
// "unknown" if /proc/vmstat could not be read.
std::string page_moves_between(const std::vector<std::pair<std::string, long long>>& before,
                               const std::vector<std::pair<std::string, long long>>& after) {
  if (before.empty() || after.empty()) return "unknown (no /proc/vmstat)";
  std::string s;
  for (const auto& [k, v] : after) {
    auto b = std::find_if(before.begin(), before.end(), [&](const auto& e) { return e.first == k; });
    const long long d = v - (b == before.end() ? 0 : b->second);
    if (d != 0) s += (s.empty() ? "" : " ") + k + "=" + std::to_string(d);
  }
  return s.empty() ? "none" : s;
}

// One boot and its workload; a failed one (an exception, or figures carrying an error) gets a
// second, fresh boot: L2 guests in the testbed sometimes stall (QEMU's too) or die (xpv's; see
// tools/testbed/README.md, "Known issue"). f(attempt) must name its VM after the attempt so a
// retry never reads the first boot's console log. Both failures are said; figures from a second
// attempt carry the first's reason.
template <class F>
auto guarded(const std::string& who, F&& f) -> decltype(f(1)) {
  std::string first;
  for (int attempt = 1;; ++attempt) {
    decltype(f(1)) r;
    const auto moves = l1_page_moves();
    try {
      r = f(attempt);
    } catch (const std::exception& e) {
      r = decltype(f(1)){};
      r.error = e.what();
    }
    say(who + " boot " + std::to_string(attempt) + (r.error.empty() ? " ran" : " failed") +
        "; L1's page moves meanwhile: " + page_moves_between(moves, l1_page_moves()));
    if (r.error.empty() || attempt == 2) {
      r.retried = first;
      return r;
    }
    say(who + " FAILED (attempt 1 of 2, booting again): " + r.error);
    first = r.error;
  }
}

// "hvm-iperf", then "hvm-iperf-2" for a second attempt.
std::string attempt_name(const std::string& base, int attempt) {
  return attempt == 1 ? base : base + "-" + std::to_string(attempt);
}

// ---- the two sides ----------------------------------------------------------------------------

struct Side {
  NetFigures net;
  DiskFigures disk;
  std::string setup;  // e.g. "vhost=on"
};

// The bonnie boot's workload: O_DIRECT bulk phases (-D), so the disk path answers block write,
// rewrite and block read rather than the guest's page cache (512 MiB of RAM); -f as well (the
// per-char phases write through stdio, which O_DIRECT refuses). 64 KiB chunks and 512 MiB: with
// bonnie++'s 8 KiB chunks O_DIRECT writes crawl (2 MB/s in the testbed), and a 64 or 256 MiB
// file is read in under the half second bonnie++ can time (+++++; 256 MiB: 0.8 s, too close).
std::string bonnie_cmdline(const Inner& in) {
  return "xpv.run=bonnie xpv.bonnie_direct=1 xpv.bonnie_chunk=65536 xpv.size=" + std::to_string(in.bonnie_mib);
}

// The iperf3 boot's workload: kSingleRounds rounds of host->guest then guest->host, then
// kBothWaysRounds rounds of --bidir (one client each) and as many pairs of servers; the guest gives
// up after xpv.wait s.
std::string iperf_cmdline(const Inner& in) {
  const int clients = 2 * kSingleRounds + kBothWaysRounds;
  return "xpv.run=iperf3 xpv.clients=" + std::to_string(clients) + " xpv.pairs=" + std::to_string(kBothWaysRounds) +
         " xpv.wait=" + std::to_string((clients + kBothWaysRounds) * (in.iperf_s + 30));
}

// One part's boot under xpv: the daemons come up for it and go down after it, so that QEMU's boots
// of the same part find L1 as xpv's found it (and 10.0.0.1 free for QEMU's TAP).
Side measure_xpv(const Inner& in, Part part) {
  Side s;
  // The daemons' and guests' logs are written straight into the share (the host's file system,
  // over 9p), not into L1's tmpfs and copied at the end: an L1 that resets or panics takes its
  // tmpfs with it, and a guest's console up to its last line is what says what happened.
  const fs::path run = in.work / "xpv-run", log = in.logs / "xpv";
  fs::create_directories(run);
  fs::create_directories(log);
  setenv("XPV_RUN_DIR", run.c_str(), 1);
  setenv("XPV_LOG_DIR", log.c_str(), 1);
  setenv("XENSTORED_PATH", (run / "xenstored.sock").c_str(), 1);
  setenv("XPV_NETNS_DIR", (in.work / "xpv-netns").c_str(), 1);
  const std::string tslog = q((in.logs / "toolstack.log").string());
  if (shell(bounded(kToolstackTimeout, q(in.xpv) + " up") + " >> " + tslog + " 2>&1", bound_of(kToolstackTimeout)) != 0) {
    s.net.error = s.disk.error = "xpv up failed or did not finish in " + std::to_string(kToolstackTimeout) + " s (see toolstack.log)";
  } else if (part == Part::net) {
    s.net = guarded("xpv", [&](int attempt) {
      XpvVm vm(in, attempt_name("hvm-iperf", attempt), iperf_cmdline(in));
      return run_iperf(vm, in, "xpv");
    });
  } else {
    s.disk = guarded("xpv", [&](int attempt) {
      XpvVm vm(in, attempt_name("hvm-bonnie", attempt), bonnie_cmdline(in));
      return run_bonnie(vm, "xpv");
    });
  }
  (void)shell(bounded(kToolstackTimeout, q(in.xpv) + " down --force") + " >> " + tslog + " 2>&1", bound_of(kToolstackTimeout));
  return s;
}

Side measure_qemu(const Inner& in, Part part) {
  Side s;
  const bool vhost = fs::exists("/dev/vhost-net");
  s.setup = vhost ? "vhost=on" : "vhost=off (no /dev/vhost-net in L1)";
  (void)shell("ip link del xpvtap0 >/dev/null 2>&1");
  if (shell("ip tuntap add dev xpvtap0 mode tap && ip addr add 10.0.0.1/24 dev xpvtap0 && ip link set xpvtap0 up") !=
      0) {
    s.net.error = s.disk.error = "cannot create the TAP xpvtap0 10.0.0.1/24 in L1";
    return s;
  }
  if (part == Part::net) {
    s.net = guarded("qemu", [&](int attempt) {
      QemuVm vm(in, attempt_name("iperf", attempt), iperf_cmdline(in), vhost);
      return run_iperf(vm, in, "qemu");
    });
  } else {
    s.disk = guarded("qemu", [&](int attempt) {
      QemuVm vm(in, attempt_name("bonnie", attempt), bonnie_cmdline(in), vhost);
      return run_bonnie(vm, "qemu");
    });
  }
  (void)shell("ip link del xpvtap0 >/dev/null 2>&1");
  return s;
}

std::string fmt_ms(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", ms);
  return b;
}

// One metric from both sides: a missing figure is NaN (xpv) or no reference, and the note says why.
Result metric(const std::string& name, const std::string& unit, std::optional<double> x, std::optional<double> r,
              const std::string& x_err, const std::string& r_err, const std::string& what, bool lower = false) {
  Result res;
  res.metric = name;
  res.unit = unit;
  res.xpv = x ? *x : kNaN;
  res.reference = r;
  res.lower_is_better = lower;
  res.note = what;
  if (!x) res.note += "; xpv: " + (x_err.empty() ? std::string("no figure") : x_err);
  if (!r) res.note += "; QEMU: " + (r_err.empty() ? std::string("no figure") : r_err);
  return res;
}

// What a figure from a second boot says about the first.
std::string retried(const char* side, const std::string& why) {
  return why.empty() ? std::string() : std::string("; ") + side + ": from a second boot (the first: " + why + ")";
}

// The net part's rows (hvm_parts.h part_metrics(Part::net)) from both sides' iperf3 boots.
std::vector<Result> net_rows(const Inner& in, const Side& x, const Side& r) {
  const std::string net = "one testbed session (nested KVM under TCG: only the ratio means something); iperf3 -t " +
                          std::to_string(in.iperf_s) + " from L1 to the guest's server " + kGuestIp +
                          "; xpv: HVM guest (" + bench_upcall() + " upcalls), xen-netfront ↔ xpv-netback vif (a netif queue per vCPU "
                          "up to L1's CPU count, as Linux netback offers); QEMU 7.2 -enable-kvm: virtio-net on a TAP "
                          "(one queue pair, QEMU's default), " + r.setup + "; 512 MiB, 2 vCPUs, same kernel and initrd" +
                          retried("xpv", x.net.retried) + retried("QEMU", r.net.retried);
  std::vector<Result> out;
  // Every run of a median figure, each side's, so that the median can be read against its spread.
  const auto each = [&](const std::string& what, std::string NetFigures::*which) {
    std::string s = what;
    for (const auto& [side, n] : {std::pair<const char*, const NetFigures*>{"xpv", &x.net}, {"QEMU", &r.net}}) {
      if (!(n->*which).empty()) s += std::string("; ") + side + ": " + n->*which;
    }
    return s;
  };
  const std::string single_runs = "; the median of " + std::to_string(kSingleRounds) +
                                  " runs in one boot (host->guest and guest->host in turn), each run's Gbit/s";
  const auto single = [&](std::string NetFigures::*which) { return each(single_runs, which); };
  const std::string both_runs = "; the median of " + std::to_string(kBothWaysRounds) +
                                " rounds in one boot, each round host->guest+guest->host Gbit/s";
  const auto rounds = [&](std::string NetFigures::*which) { return each(both_runs, which); };
  out.push_back(metric("iperf3 host->guest", "Gbit/s", x.net.up, r.net.up, x.net.error, r.net.error,
                       net + single(&NetFigures::up_rounds)));
  out.push_back(metric("iperf3 guest->host", "Gbit/s", x.net.down, r.net.down, x.net.error, r.net.error,
                       net + single(&NetFigures::down_rounds)));
  out.push_back(metric("iperf3 bidir total", "Gbit/s", x.net.bidir_total, r.net.bidir_total, x.net.error,
                       r.net.error, net + "; both directions of --bidir summed" + rounds(&NetFigures::bidir_rounds)));
  out.push_back(metric("iperf3 bidir min/max", "ratio", x.net.bidir_fairness, r.net.bidir_fairness, x.net.error,
                       r.net.error, net + "; the smaller direction of --bidir over the larger (1 = fair)" +
                                        rounds(&NetFigures::bidir_rounds)));
  out.push_back(metric("iperf3 2-process bidir total", "Gbit/s", x.net.pair_total, r.net.pair_total, x.net.error,
                       r.net.error, net + "; two iperf3 clients at once (host->guest, guest->host -R), each against its own "
                       "guest server process, summed" + rounds(&NetFigures::pair_rounds)));
  out.push_back(metric("iperf3 2-process bidir min/max", "ratio", x.net.pair_fairness, r.net.pair_fairness, x.net.error,
                       r.net.error, net + "; the smaller of the two processes' directions over the larger (1 = fair): "
                       "both directions at once without iperf3 3.12's one-thread --bidir loop, which sends up to "
                       "10 blocks (multisend) for each block it reads" + rounds(&NetFigures::pair_rounds)));
  const auto rtt = [](const std::optional<xpv::bench::hvm::Ping>& p) -> std::optional<double> {
    if (p) return p->avg_ms;
    return std::nullopt;
  };
  const auto rtt_err = [](const NetFigures& n) { return n.error.empty() ? n.ping_error : n.error; };
  const auto lost = [&](const std::string& what, std::optional<xpv::bench::hvm::Ping> NetFigures::*which) {
    std::string s;
    for (const auto& [side, n] : {std::pair<const char*, const NetFigures*>{"xpv", &x.net}, {"QEMU", &r.net}}) {
      if (const auto& p = n->*which) {
        s += std::string("; ") + side + ": " + std::to_string(p->received) + " of " + std::to_string(p->sent) +
             " answered, min " + fmt_ms(p->min_ms) + " max " + fmt_ms(p->max_ms) + " ms";
        // A run with no answer at all is not in those counts (a row with a figure says so here,
        // one without says it as its error).
        if (!n->ping_error.empty()) s += std::string(" (") + side + "'s ping runs that gave nothing: " + n->ping_error + ")";
      }
    }
    return what + s;
  };
  const std::string ping_common = "ping from L1 to the guest " + std::string(kGuestIp) + ", the mean round trip of the "
                                  "echo requests answered; xpv: " + bench_upcall() + " upcalls, xen-netfront ↔ "
                                  "xpv-netback; QEMU: virtio-net, " + r.setup;
  out.push_back(metric("ping rtt idle", "ms", rtt(x.net.rtt_idle), rtt(r.net.rtt_idle), rtt_err(x.net),
                       rtt_err(r.net), lost("50 echo requests 50 ms apart, nothing else on the link; " + ping_common,
                                            &NetFigures::rtt_idle),
                       true));
  out.push_back(metric("ping rtt 10 ms apart", "ms", rtt(x.net.rtt_close), rtt(r.net.rtt_close), rtt_err(x.net),
                       rtt_err(r.net),
                       lost("300 echo requests 10 ms apart right after the idle ones, nothing else on the link "
                            "(against 'ping rtt idle': what waking the threads on the way from sleep costs); " +
                                ping_common,
                            &NetFigures::rtt_close),
                       true));
  out.push_back(metric("ping rtt under host->guest load", "ms", rtt(x.net.rtt_up), rtt(r.net.rtt_up),
                       rtt_err(x.net), rtt_err(r.net),
                       lost("echo requests 100 ms apart during the iperf3 host->guest runs (from each one's second 1), all runs' "
                            "answers averaged: "
                            "the queueing a flow meets behind a bulk transfer; " + ping_common,
                            &NetFigures::rtt_up),
                       true));
  out.push_back(metric("ping rtt under guest->host load", "ms", rtt(x.net.rtt_down), rtt(r.net.rtt_down),
                       rtt_err(x.net), rtt_err(r.net),
                       lost("echo requests 100 ms apart during the iperf3 guest->host (-R) runs (from each one's second 1), "
                            "all runs' answers averaged; " +
                                ping_common,
                            &NetFigures::rtt_down),
                       true));
  return out;
}

// The disk part's rows (part_metrics(Part::disk)) from both sides' bonnie++ boots.
std::vector<Result> disk_rows(const Inner& in, const Side& x, const Side& r) {
  const std::string disk_common = "bonnie++ -f -D -s " + std::to_string(in.bonnie_mib) + " MiB:64 KiB chunks -r " +
                                  std::to_string(in.bonnie_mib / 2) + " on the root fs, guest RAM 512 MiB: O_DIRECT "
                                  "block write, rewrite and block read (the disk answers them, not the guest's page "
                                  "cache), no per-char phases; xpv: xen-blkfront ↔ xpv-blkback, QEMU: virtio-blk "
                                  "cache=writeback; both disks are copies of root.ext4 on L1's tmpfs" +
                                  retried("xpv", x.disk.retried) + retried("QEMU", r.disk.retried);
  std::vector<Result> out;
  out.push_back(metric("bonnie++ run (host clock)", "s", x.disk.wall_s, r.disk.wall_s, x.disk.error, r.disk.error,
                       "THE disk metric: L1's steady clock between the console markers XPV-PHASE bonnie-1 "
                       "begin/end (every bonnie++ phase, seeks included); " + disk_common,
                       true));
  const auto csv_err = [](const DiskFigures& d) { return d.error.empty() ? d.csv_note : d.error; };
  const std::string csv = "from bonnie++'s CSV, timed by the guest's clock (the host-clock metric is "
                          "'bonnie++ run'); " + disk_common;
  out.push_back(metric("bonnie++ block write", "KiB/s", x.disk.block_write, r.disk.block_write, csv_err(x.disk),
                       csv_err(r.disk), csv));
  out.push_back(metric("bonnie++ block read", "KiB/s", x.disk.block_read, r.disk.block_read, csv_err(x.disk),
                       csv_err(r.disk), csv));
  out.push_back(metric("bonnie++ rewrite", "KiB/s", x.disk.rewrite, r.disk.rewrite, csv_err(x.disk), csv_err(r.disk),
                       csv));
  return out;
}

std::vector<Result> inner(const xpv::bench::Options& opts) {
  (void)bench_upcall();  // a bad value fails here, before any boot
  (void)bench_append();
  // The parts to measure (hvm_parts.h; the host side names those still missing) and this L1
  // session's number, for the part files: a bad value fails here, before anything is made.
  const char* parts_env = std::getenv("XPV_BENCH_PARTS");
  std::vector<Part> parts;
  try {
    parts = xpv::bench::hvm::parse_parts(parts_env != nullptr ? parts_env : "net,disk");
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("XPV_BENCH_PARTS='") + (parts_env != nullptr ? parts_env : "") + "': " + e.what());
  }
  const char* session_env = std::getenv("XPV_BENCH_SESSION");
  int session = 1;
  if (session_env != nullptr && *session_env != '\0') {
    const std::string_view v(session_env);
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), session);
    if (ec != std::errc() || end != v.data() + v.size() || session < 1) {
      throw std::runtime_error("XPV_BENCH_SESSION='" + std::string(v) + "': not a session number (1, 2, ...)");
    }
  }

  const char* image = std::getenv("XPV_BENCH_IMAGE");
  if (image == nullptr) throw std::runtime_error("XPV_BENCH_IMAGE (the `xpv image build` directory) is not set");
  Inner in;
  in.image = image;
  for (const char* f : {"vmlinuz", "initrd.cpio", "root.ext4"}) {
    if (!fs::exists(in.image / f)) throw std::runtime_error(in.image.string() + "/" + f + " is missing");
  }
  in.work = fs::path("/tmp") / ("xpv-bench-hvm-" + std::to_string(::getpid()));
  fs::create_directories(in.work);
  const char* share = std::getenv("XPV_BENCH_SHARE");
  in.logs = share != nullptr ? fs::path(share) / "logs" : in.work / "logs";
  fs::create_directories(in.logs);
  in.xpv = fs::read_symlink("/proc/self/exe").string();
  // iperf3's own default duration, what its users run. 5 s until session 17: both guests ramp up
  // over the first seconds in the testbed, so a 5 s figure was mostly the ramp (backends/README.md,
  // "L1's CPU per bit").
  in.iperf_s = std::max(2, static_cast<int>(std::lround(10 * opts.scale)));
  in.bonnie_mib = std::max(128, static_cast<int>(std::lround(512 * opts.scale)));

  const Watchdog watchdog;
  const auto t0 = Clock::now();
  std::vector<Result> out;
  for (const Part part : parts) {
    const std::string name = xpv::bench::hvm::part_name(part);
    const Side x = measure_xpv(in, part);
    say("xpv's " + name + " boot done after " + std::to_string(xpv::bench::seconds_since(t0)) + " s");
    const Side r = measure_qemu(in, part);
    say("QEMU's " + name + " boot done after " + std::to_string(xpv::bench::seconds_since(t0)) + " s");
    auto rows = part == Part::net ? net_rows(in, x, r) : disk_rows(in, x, r);
    xpv::bench::hvm::check_rows(part, rows);
    // The part's rows go to the share at once, so that an L1 lost in a later part does not take
    // them: written under a temporary name and renamed (a half-written file is never read).
    if (share != nullptr) {
      const fs::path dir = fs::path(share) / "parts";
      fs::create_directories(dir);
      const std::string file_name = xpv::bench::hvm::part_file(part, session);
      const fs::path file = dir / file_name;
      const fs::path tmp = dir / ("." + file_name + ".tmp");
      if (!xpv::bench::write_json(tmp.string(), "hvm", rows)) {
        throw std::runtime_error("cannot write the " + name + " part's figures to " + tmp.string());
      }
      fs::rename(tmp, file);
    }
    out.insert(out.end(), rows.begin(), rows.end());
  }
  std::error_code ec;
  fs::remove_all(in.work, ec);
  return out;
}

// ---- the host side ----------------------------------------------------------------------------

std::vector<Result> outer(const xpv::bench::Options& opts) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  // The image: `xpv image build` (a cache hit after the first time). Its root.ext4 is only ever
  // copied (inside L1), never booted.
  (void)bench_upcall();  // a bad value fails here, before the testbed starts
  (void)bench_append();
  say("building the guest image (xpv image build)");
  const std::string image_line = capture(q(self) + " image build");
  std::string image = image_line.substr(0, image_line.find('\n'));
  if (image.empty() || !fs::exists(fs::path(image) / "root.ext4")) {
    throw std::runtime_error("xpv image build failed (run it alone to see why; scripts/setup installs what it needs)");
  }
  char tmpl[] = "/tmp/xpv-bench-hvm.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  const fs::path share = tmpl;
  setenv("XPV_BENCH_IMAGE", image.c_str(), 1);
  setenv("XPV_BENCH_SHARE", share.c_str(), 1);
  const fs::path json = share / "inner.json";
  // The bench measures in parts (hvm_parts.h): net (xpv's iperf3 boot, then QEMU's) and disk (the
  // two bonnie++ boots), each part with both VMMs in one testbed session, so that every ratio
  // compares runs on the same L1. L1 itself is sometimes lost — it resets or stalls
  // (tools/testbed/README.md), exit 125 or 124 — and takes with it the part it was in; a part
  // whose boots failed twice lacks figures. Then another session measures the parts still wanted,
  // each earlier session's logs kept as session-N: at most kSessions sessions, none started after
  // kRetryWindow. Of a part's runs the one with the fewest missing figures is reported. A session
  // that stalls ends by its watchdog's exit 125 or by --quiet-limit (exit 124), at the latest by
  // its 1800 s timeout.
  constexpr int kSessions = 3;
  constexpr double kRetryWindow = 2700;
  const auto t_all = Clock::now();
  namespace hvm = xpv::bench::hvm;
  const std::vector<Part> all = {Part::net, Part::disk};
  std::vector<std::vector<hvm::PartRun>> runs(all.size());
  int rc = 0, session = 0;
  std::vector<std::string> history;  // what each session did, for the notes
  for (;;) {
    ++session;
    std::vector<Part> wanted;
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (hvm::part_wanted(runs[i])) wanted.push_back(all[i]);
    }
    const std::string parts = hvm::join_parts(wanted);
    setenv("XPV_BENCH_PARTS", parts.c_str(), 1);
    setenv("XPV_BENCH_SESSION", std::to_string(session).c_str(), 1);
    say("image " + image + "; starting testbed session " + std::to_string(session) + " for the parts " + parts +
        " (L1 boots, then 2 guest boots per part: 5-10 minutes a part)");
    const auto t0 = Clock::now();
    // --quiet-limit: the run inside says something at least once a minute while it moves (its
    // watchdog's heartbeat); five silent minutes mean an L1 that stopped running it.
    std::error_code gone;
    fs::remove(json, gone);
    rc = shell(q(self) + " testbed --timeout 1800 --quiet-limit 300 --share " + q(share.string()) + " -- " + q(self) +
               " bench hvm --json " + q(json.string()) + (opts.scale < 1 ? " --quick" : ""));
    say("testbed session " + std::to_string(session) + ": " +
        std::to_string(static_cast<int>(xpv::bench::seconds_since(t0))) + " s, exit " + std::to_string(rc));
    // What this session measured: its part files (written as each part ended).
    std::string got;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const fs::path f = share / "parts" / hvm::part_file(all[i], session);
      if (!fs::exists(f)) continue;
      try {
        hvm::PartRun run{session, xpv::bench::read_json(f.string())};
        hvm::check_rows(all[i], run.rows);
        const int missing = hvm::missing_figures(run.rows);
        got += (got.empty() ? "" : ", ") + std::string(hvm::part_name(all[i])) +
               (missing == 0 ? "" : " (" + std::to_string(missing) + " figures missing)");
        runs[i].push_back(std::move(run));
      } catch (const std::exception& e) {
        say("testbed session " + std::to_string(session) + ": its " + hvm::part_name(all[i]) +
            " part is not used: " + e.what());
        got += (got.empty() ? "" : ", ") + std::string(hvm::part_name(all[i])) + " (its file refused: " + e.what() + ")";
      }
    }
    const bool l1_lost = rc == 124 || rc == 125;
    history.push_back("session " + std::to_string(session) + " measured " + (got.empty() ? "nothing" : got) +
                      (rc == 0 ? "" : rc == 124 ? " (exit 124: timeout, silence or L1 lockup)"
                                    : rc == 125 ? " (exit 125: L1 lost or its run stalled)"
                                                : " (exit " + std::to_string(rc) + ")"));
    // Another session for a part still wanted, after a session that ended normally or lost its
    // L1; the run's own errors (any other exit) end the bench.
    if (!hvm::another_session(runs, rc, session, xpv::bench::seconds_since(t_all), kSessions, kRetryWindow)) break;
    std::error_code ec;
    fs::rename(share / "logs", share / ("session-" + std::to_string(session)), ec);
    say("testbed session " + std::to_string(session) + " measured " + (got.empty() ? "nothing" : got) +
        (l1_lost ? "; L1 was lost or its run stalled (exit " + std::to_string(rc) + ")" : "") +
        ": another session for what is still wanted");
  }

  std::vector<Result> out;
  bool complete = true;
  std::string sessions_note;
  for (const auto& h : history) sessions_note += (sessions_note.empty() ? "" : "; ") + h;
  bool any = false;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const hvm::PartRun* best = hvm::best_run(runs[i]);
    if (best == nullptr) {
      complete = false;
      for (Result r : hvm::part_metrics(all[i])) {
        r.note = std::string("no figure: no testbed session finished the ") + hvm::part_name(all[i]) + " part [" +
                 sessions_note + "]";
        out.push_back(std::move(r));
      }
      continue;
    }
    any = true;
    complete = complete && hvm::missing_figures(best->rows) == 0;
    for (Result r : best->rows) {
      if (session > 1) r.note += " [testbed session " + std::to_string(best->session) + "; " + sessions_note + "]";
      out.push_back(std::move(r));
    }
  }
  // The logs come back next to the JSON (an earlier session's in it as session-N/).
  fs::path logs = share / "logs";
  if (!opts.json_path.empty() && fs::exists(logs)) {
    const fs::path p(opts.json_path);
    const fs::path dest = p.parent_path() / (p.stem().string() + "-logs");
    std::error_code ec;
    fs::remove_all(dest, ec);
    fs::copy(logs, dest, fs::copy_options::recursive, ec);
    for (int n = 1; !ec && n < session; ++n) {
      const fs::path l = share / ("session-" + std::to_string(n));
      if (fs::exists(l)) fs::copy(l, dest / l.filename(), fs::copy_options::recursive, ec);
    }
    // Every part's runs, the ones not reported too.
    if (!ec && fs::exists(share / "parts")) fs::copy(share / "parts", dest / "parts", fs::copy_options::recursive, ec);
    if (!ec) logs = dest;
  }
  if (!any) {
    throw std::runtime_error("the hvm bench inside the testbed measured no part (" + sessions_note +
                             "); logs kept in " + share.string());
  }
  // The share goes once its logs are copied out next to the JSON (else it is where the logs are,
  // and it is named below).
  if (logs != share / "logs") {
    std::error_code ec;
    fs::remove_all(share, ec);
  }
  if (!complete) say("some figures are missing (see each note); logs in " + logs.string());
  say("logs: " + logs.string());
  return out;
}

std::vector<Result> run_hvm(const xpv::bench::Options& opts) {
  return std::getenv("XPV_TESTBED") != nullptr ? inner(opts) : outer(opts);
}

}  // namespace

XPV_BENCH_SUITE("hvm",
                "HVM guest (Debian kernel, Xen PV drivers) under xpv vs QEMU+KVM virtio: iperf3 and bonnie++, "
                "both VMMs in one testbed session per part",
                run_hvm);
