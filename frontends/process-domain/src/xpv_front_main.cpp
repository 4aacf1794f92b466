// xpv-front — a process domain (DESIGN.md §1, PROCESS-DOMAINS.md "Domain lifecycle").
//
//   xpv-front --domid N --name NAME --memory MiB [--run-dir D] [--foreground] [--log-level L]
//             [--xenstore-timeout S] [--max-indirect-segments K] [--max-ring-page-order O]
//             [--netns PATH] [--net-queues N] [--blk-queues N] [--shutdown-file F]
//
// Creates domain N (memfd memory, grant table, event channels, control socket <run-dir>/dom<N>.sock),
// prints `ready` on stdout once the socket listens, then waits (bounded by --xenstore-timeout)
// until xpv-xenstored serves its xenstore ring — the toolstack introduces the domain after
// `ready` — and runs the blkfront xenbus driver (VbdDriver) over it: every vbd under
// /local/domain/N/device/vbd becomes <run-dir>/dom<N>/vbd/<devid>/disk — and the netfront xenbus
// driver (VifDriver): every vif under /local/domain/N/device/vif becomes the TAP eth<devid> in
// the domain's network namespace (--netns, default /run/netns/xpv-dom<N>, made by the toolstack).
// SIGTERM/SIGINT, or `poweroff` (or `halt`) in its xenstore control/shutdown (the PV control
// protocol: it advertises control/feature-poweroff = 1 and clears control/shutdown to acknowledge,
// as Linux's xen manage code does): every device is closed with the backend (bounded),
// unmounted, exit 0. `reboot` there does the same and exits 2: a process domain has no kernel to
// restart, so its toolstack does it (on_reboot). --shutdown-file records why it stopped:
// poweroff (a signal or a poweroff/halt request), reboot, or crash (an error).
// control/sysrq is answered (cleared) and logged: there is no kernel to act on the key.
// Without --foreground it logs to syslog and lets go of stdout after `ready`; it never forks
// (its pid is the domain's, for the toolstack).
//
// Threads: main (signals, start-up, shutdown), the domain's control thread (Asio io_context:
// control socket, dom0 kicks), the guest event dispatcher (GuestEvents::run), the xenstore ring
// client's io and watch threads (the driver runs on the latter), FUSE loops per disk.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/syslog_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <future>
#include <optional>
#include <thread>

#include "xpv/xenbus/daemon/process.h"
#include "xpv/domain/domain.h"
#include "xpv/frontends/guest_events.h"
#include "xpv/frontends/vbd_driver.h"
#include "xpv/frontends/vif_driver.h"
#include "xpv/xenbus/client/ring_client.h"
#include "xpv/thread_name.h"

namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

// The domain's upcalls go to GuestEvents, which needs the domain's shared_info page: created
// after the Domain, so the sink forwards.
struct ForwardingSink : xpv::domain::UpcallSink {
  void upcall(unsigned v) noexcept override {
    if (auto* t = target.load(std::memory_order_acquire)) t->upcall(v);
  }
  std::atomic<xpv::frontends::GuestEvents*> target{nullptr};
};

int error(const std::string& msg) {
  std::fprintf(stderr, "xpv-front: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"xpv-front — a process domain: xpv's own PV frontends in a host process"};
  int domid = 0;
  std::string name;
  std::uint64_t memory_mib = 0;
  std::string run_dir = "/run/xpv";
  if (const char* e = std::getenv("XPV_RUN_DIR"); e && *e) run_dir = e;
  bool foreground = false;
  std::string log_level = "info";
  unsigned xs_timeout_s = 30;
  std::uint32_t max_indirect = 256;
  std::uint32_t max_order = 0;
  std::string netns;
  unsigned net_queues = 1;
  unsigned blk_queues = 1;
  std::string shutdown_file;
  app.add_option("--domid", domid, "domain id (1..32751)")->required();
  app.add_option("--name", name, "domain name")->required();
  app.add_option("--memory", memory_mib, "memory in MiB (1..65536)")->required();
  app.add_option("--run-dir", run_dir, "where dom<N>.sock and dom<N>/ live")->capture_default_str();
  app.add_flag("--foreground", foreground, "log to stderr and keep stdout (default: syslog)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  app.add_option("--xenstore-timeout", xs_timeout_s,
                 "seconds to wait for xpv-xenstored to serve the ring (1..3600)")
      ->capture_default_str();
  app.add_option("--max-indirect-segments", max_indirect,
                 "indirect segments per request asked for (0..4096)")
      ->capture_default_str();
  app.add_option("--max-ring-page-order", max_order, "largest ring page order used (0..4)")
      ->capture_default_str();
  app.add_option("--netns", netns, "the domain's network namespace file (default /run/netns/xpv-dom<N>)");
  app.add_option("--net-queues", net_queues, "netif queues asked for per vif (1..16)")->capture_default_str();
  app.add_option("--blk-queues", blk_queues, "blkif queues (rings) asked for per vbd (1..16)")->capture_default_str();
  app.add_option("--shutdown-file", shutdown_file,
                 "when it stops, write why into this file: poweroff, reboot or crash (for the toolstack's "
                 "on_poweroff / on_reboot / on_crash)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "xpv-front: %s\n", e.what());
    return 2;
  }
  auto bad = [](const std::string& m) {
    std::fprintf(stderr, "xpv-front: %s\n", m.c_str());
    return 2;
  };
  if (domid < 1 || domid > 32751) return bad("--domid " + std::to_string(domid) + ": expected 1..32751");
  if (name.empty()) return bad("--name: must not be empty");
  if (memory_mib < 1 || memory_mib > 65536) return bad("--memory " + std::to_string(memory_mib) + ": expected 1..65536 MiB");
  if (xs_timeout_s < 1 || xs_timeout_s > 3600) return bad("--xenstore-timeout: expected 1..3600 seconds");
  if (max_indirect > 4096) return bad("--max-indirect-segments: expected 0..4096");
  if (max_order > 4) return bad("--max-ring-page-order: expected 0..4");
  if (net_queues < 1 || net_queues > 16) return bad("--net-queues: expected 1..16");
  if (blk_queues < 1 || blk_queues > xpv::frontends::kBlkfrontMaxQueues) return bad("--blk-queues: expected 1..16");
  if (netns.empty()) netns = "/run/netns/xpv-dom" + std::to_string(domid);
  auto level = xpv::daemon::parse_log_level(log_level);
  if (!level) return bad("--log-level '" + log_level + "': expected trace, debug, info, warn, error or off");
  if (!foreground) {
    auto sink = std::make_shared<spdlog::sinks::syslog_sink_mt>("xpv-front", LOG_PID, LOG_DAEMON, false);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("xpv-front", sink));
  } else {
    spdlog::set_default_logger(spdlog::stderr_color_mt("xpv-front"));
  }
  spdlog::set_level(*level);

  // Signals are taken by the main thread only (sigtimedwait); block them before any thread.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  // Why it stopped, written on the way out whichever way that is (declared first: written last).
  struct ShutdownRecord {
    const std::string& file;
    std::string word = "crash";
    ~ShutdownRecord() {
      if (file.empty()) return;
      FILE* f = std::fopen(file.c_str(), "we");
      bool ok = f != nullptr && std::fprintf(f, "%s\n", word.c_str()) >= 0;
      if (f != nullptr && std::fclose(f) != 0) ok = false;
      if (!ok) {
        std::fprintf(stderr, "xpv-front: cannot write the shutdown reason to %s\n", file.c_str());
      }
    }
  } shutdown_record{shutdown_file};

  asio::io_context io(1);
  auto work = asio::make_work_guard(io);
  ForwardingSink upcalls;
  std::unique_ptr<xpv::domain::Domain> domain;
  std::unique_ptr<xpv::frontends::GuestEvents> events;
  std::thread io_thread, events_thread;
  // Tear-down in reverse order, also on an error path.
  struct Stop {
    std::function<void()> fn;
    ~Stop() { fn(); }
  };
  std::unique_ptr<xpv::xenbus::client::RingClient> xs;
  std::unique_ptr<xpv::frontends::VbdDriver> driver;
  std::unique_ptr<xpv::frontends::VifDriver> vifs;
  // What control/shutdown asked for (watch thread): none yet, poweroff (or halt), reboot.
  enum class Request { none, poweroff, reboot };
  std::atomic<Request> shutdown_requested{Request::none};
  Stop stop{[&] {
    vifs.reset();
    driver.reset();
    if (events) events->stop();
    if (events_thread.joinable()) events_thread.join();
    xs.reset();
    if (domain && io_thread.joinable()) {
      std::promise<void> gone;
      asio::post(io, [&] {
        domain.reset();
        gone.set_value();
      });
      gone.get_future().wait();
    }
    domain.reset();
    work.reset();
    io.stop();
    if (io_thread.joinable()) io_thread.join();
  }};

  xpv::domain::DomainConfig cfg;
  cfg.domid = static_cast<std::uint16_t>(domid);
  cfg.name = name;
  cfg.memory_bytes = memory_mib << 20;
  cfg.run_dir = run_dir;
  try {
    domain = std::make_unique<xpv::domain::Domain>(io, cfg, upcalls);
    events = std::make_unique<xpv::frontends::GuestEvents>(
        domain->pages(xpv::domain::Domain::kSharedInfoGfn, 1));
    // Backends raise the upcall themselves: one thread woken per notification, not two.
    events->enable_direct_upcalls(*domain);
  } catch (const std::exception& e) {
    return error("dom" + std::to_string(domid) + ": " + e.what());
  }
  upcalls.target.store(events.get(), std::memory_order_release);
  io_thread = std::thread([&] {
    xpv::set_thread_name("dom-control");
    try {
      io.run();
    } catch (const std::exception& e) {
      spdlog::critical("dom{}: control thread stopped: {}", domid, e.what());
    }
  });
  events_thread = std::thread([&] {
    xpv::set_thread_name("evt-dispatch");
    events->run();
  });

  std::printf("ready\n");
  std::fflush(stdout);
  if (!foreground) {
    int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::close(null);
    }
  }
  spdlog::info("dom{} ({}): {} MiB, control socket {}", domid, name, memory_mib, domain->socket_path());

  const auto port = domain->xenstore_port();
  xs = std::make_unique<xpv::xenbus::client::RingClient>(
      domain->xenstore_page(), [d = domain.get(), port] { (void)d->evtchn().send(port); });
  events->set_handler(port, [c = xs.get()] { c->on_event(); });

  xpv::frontends::VbdDriverConfig dcfg;
  dcfg.domid = cfg.domid;
  dcfg.run_dir = run_dir;
  dcfg.max_indirect_segments = max_indirect;
  dcfg.max_ring_page_order = max_order;
  dcfg.max_queues = blk_queues;
  driver = std::make_unique<xpv::frontends::VbdDriver>(*domain, *events, *xs, dcfg);
  xpv::frontends::VifDriverConfig vcfg;
  vcfg.domid = cfg.domid;
  vcfg.netns = netns;
  vcfg.max_queues = net_queues;
  vifs = std::make_unique<xpv::frontends::VifDriver>(*domain, *events, *xs, vcfg);

  (void)xs->wait_connected(0ms);  // the probe waits on the ring until xenstored serves it
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(xs_timeout_s);
  bool started = false;
  int sig = 0;
  for (;;) {
    timespec ts{0, 100'000'000};
    siginfo_t si;
    int s = ::sigtimedwait(&sigs, &si, &ts);
    if (s > 0) {
      sig = s;
      break;
    }
    if (!started && xs->connected()) {
      auto r = driver->start();
      if (!r) {
        return error("dom" + std::to_string(domid) + ": cannot watch its device/vbd: " +
                     std::string(xpv::xenbus::wire::error_name(r.error())));
      }
      auto v = vifs->start();
      if (!v) {
        return error("dom" + std::to_string(domid) + ": cannot watch its device/vif: " +
                     std::string(xpv::xenbus::wire::error_name(v.error())));
      }
      started = true;
      spdlog::info("dom{}: xenstore connected; watching device/vbd and device/vif (netns {})", domid, netns);
      // The PV control protocol (`xpv shutdown`, as Linux's xen manage code answers `xl
      // shutdown` / `xpv reboot`): advertise poweroff and reboot, watch control/shutdown,
      // acknowledge a request by clearing it, then close the devices as for SIGTERM; and
      // control/sysrq, cleared and logged. Not fatal if refused.
      const std::string control = "/local/domain/" + std::to_string(domid) + "/control";
      auto f = xs->write(control + "/feature-poweroff", "1");
      if (f) f = xs->write(control + "/feature-reboot", "1");
      auto w = f ? xs->watch(control + "/shutdown", "control",
                             [&, control](const std::string&, const std::string&) {
                               auto req = xs->read(control + "/shutdown");
                               if (!req || req->empty()) return;
                               (void)xs->write(control + "/shutdown", "");
                               if (*req == "poweroff" || *req == "halt") {
                                 spdlog::info("dom{}: control/shutdown: {}", domid, *req);
                                 shutdown_requested.store(Request::poweroff);
                               } else if (*req == "reboot") {
                                 spdlog::info("dom{}: control/shutdown: reboot", domid);
                                 shutdown_requested.store(Request::reboot);
                               } else {
                                 spdlog::warn("dom{}: control/shutdown '{}' ignored (a process domain can "
                                              "power off or reboot)", domid, *req);
                               }
                             })
                   : f;
      if (w) {
        w = xs->watch(control + "/sysrq", "sysrq", [&, control](const std::string&, const std::string&) {
          auto key = xs->read(control + "/sysrq");
          if (!key || key->empty()) return;
          (void)xs->write(control + "/sysrq", "");
          spdlog::info("dom{}: control/sysrq '{}' (a process domain has no kernel to act on it)", domid, *key);
        });
      }
      if (!w) {
        spdlog::warn("dom{}: no PV control (control/shutdown): {}; `xpv shutdown` will use SIGTERM", domid,
                     xpv::xenbus::wire::error_name(w.error()));
      }
    }
    if (shutdown_requested.load() != Request::none) break;
    if (!started && std::chrono::steady_clock::now() >= deadline) {
      return error("dom" + std::to_string(domid) + ": xenstored did not serve the xenstore ring within " +
                   std::to_string(xs_timeout_s) + " s (was the domain introduced?)");
    }
    if (xs->broken()) return error("dom" + std::to_string(domid) + ": the xenstore ring broke");
  }
  if (sig) {
    spdlog::info("dom{}: signal {}: closing devices", domid, sig);
  } else {
    spdlog::info("dom{}: asked to {}: closing devices", domid,
                 shutdown_requested.load() == Request::reboot ? "reboot" : "power off");
  }
  xs->set_timeout(2s);
  if (started) {
    // Both drivers close their devices at once (each bounded).
    auto nets = std::async(std::launch::async, [&] { return vifs->shutdown(30s); });
    if (!driver->shutdown(30s)) spdlog::warn("dom{}: vbd shutdown did not finish in time", domid);
    if (!nets.get()) spdlog::warn("dom{}: vif shutdown did not finish in time", domid);
  }
  if (shutdown_requested.load() == Request::reboot) {
    shutdown_record.word = "reboot";
    return 2;
  }
  shutdown_record.word = "poweroff";
  return 0;
}
