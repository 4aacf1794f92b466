// Issue 7's acceptance test: Debian's stock kernel as a Xen HVM guest under xpv-vmm, one boot per
// upcall mode xpv offers (per-vCPU vector; Xen's global callback vector, delivered without EOI
// through KVM's SynIC auto-EOI, see hypervisor-core/kvm/README.md; platform-pci INTx), in one
// `xpv testbed` session per mode
// (hvm_session.sh runs there with the real xpv toolstack, xpv-xenstored, xpv-blkback and
// xpv-netback). For each mode, from the guest's own output and the disk afterwards:
//   - xen-platform-pci bound, grant table and xenbus up, blkfront and netfront attached;
//   - the root file system is /dev/xvda (the guest's /proc/mounts);
//   - a file written and synced in the guest is in the disk image afterwards;
//   - the host pinged the guest through its PV NIC;
//   - the guest's markers came through the Xen PV console (hvc0) too: its log, `xpv console -t pv`;
//   - both backends, killed (-9) and restarted while the guest waits, reattach to its rings: the
//     host pings it again and a file the guest writes and syncs afterwards is in the image;
//   - the guest's balloon starts at its target (memory/static-max), and in vector mode `xpv mem-set`
//     makes it give half its memory back: MemTotal falls by exactly that, xpv-vmm counts the pages;
//   - in callback mode the vif is bridged (`bridge=`, as Xen's vif-bridge): its host side is a port
//     of the session's bridge, also after the backends' restart, and the pings go through it;
//   - the guest powered off cleanly.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "xpv/test/testbed_session.h"

namespace fs = std::filesystem;

namespace {

using xpv::test::between;
using xpv::test::quote;
using xpv::test::section;
using xpv::test::shell;
using xpv::test::slurp;

constexpr const char* kModes[] = {"vector", "callback", "intx"};
constexpr int kSessionsPerMode = 5;


class TestbedHvm : public ::testing::Test {
 protected:
  static inline std::string output;                          // every session, for diagnostics
  static inline std::map<std::string, std::string> outputs;  // the last session of each mode
  static inline std::string setup_error;
  static inline int rc = -1;

  static void SetUpTestSuite() {
    const xpv::test::TempDir tmp("xpv-hvm-test");
    if (!tmp.ok()) {
      setup_error = "mkdtemp failed";
      return;
    }
    const fs::path& dir = tmp.path();
    // The guest image (kernel, initramfs with the PV drivers, ext4 root), cached by xpv.
    const fs::path img_out = dir / "image";
    if (shell(std::string(XPV_BIN) + " image build > " + quote(img_out.string()) + " 2> " +
              quote((dir / "image.err").string())) != 0) {
      setup_error = "xpv image build failed: " + slurp(dir / "image.err");
      return;
    }
    std::string image = slurp(img_out);
    while (!image.empty() && (image.back() == '\n' || image.back() == '\r')) image.pop_back();
    const std::string bin = fs::path(XPV_BIN).parent_path().string();
    // One L1 per mode, and a session the testbed itself lost (exit 124/125) runs again, 5 sessions
    // at most: L1's kernel has been seen to panic inside its KVM (in KVM_RUN, during a vector-mode
    // guest or when the next guest started after one; tools/testbed/README.md, known issue), and
    // on a bad evening L1 resets in most sessions (session 54's CI: 2, 1 and 3 of the modes' L1s
    // lost in a row; three modes give that three chances to end the test).
    rc = 0;
    for (const char* mode : kModes) {
      const auto r = xpv::test::run_sessions(mode, [&](int session) {
        const fs::path out = dir / (std::string("out-") + mode + "-" + std::to_string(session));
        // --quiet-limit: hvm_session.sh prints after each boot attempt, and a boot is bounded at
        // 420 s; an L1 that went silent for 600 s is lost (seen: 14 minutes silent after an
        // attempt's triple fault), and the session is run again without waiting out the 900.
        const int st = shell(std::string(XPV_BIN) + " testbed --timeout 900 --quiet-limit 600 -- sh " +
                             quote(XPV_HVM_SESSION) + " " +
                             quote(bin) + " " + quote(image) + " " + mode + " > " + quote(out.string()) + " 2>&1");
        std::string text = slurp(out);
        output += text;
        return xpv::test::SessionResult{st, std::move(text)};
      }, kSessionsPerMode);
      outputs[mode] = r.output;
      if (r.rc != 0) rc = r.rc;
    }
  }

  void SetUp() override {
    ASSERT_TRUE(setup_error.empty()) << setup_error;
    ASSERT_EQ(rc, 0) << "xpv testbed failed:\n" << output;
  }
};

// One TEST: ctest runs each discovered test in its own process, and each would boot L1 again.
TEST_F(TestbedHvm, StockKernelRunsItsPvDriversInEveryUpcallMode) {
  for (const char* mode : kModes) {
    SCOPED_TRACE(mode);
    const std::string& out = outputs[mode];
    const std::string s = section(out, mode);
    ASSERT_FALSE(s.empty()) << output;
    // Boots the testbed itself killed were retried (hvm_session.sh); say so in the log.
    const std::string marker = "XPV-TEST: attempts ";
    const std::string line = between(s, marker, "\n");
    ASSERT_FALSE(line.empty()) << s;
    const std::string attempts = line.substr(marker.size());
    RecordProperty(std::string("attempts_") + mode, attempts);
    if (attempts != "1") {
      std::cout << "[ INFO     ] " << mode << ": " << attempts << " boot attempts; the failed ones:\n";
      for (std::size_t at = out.find("XPV-TEST: attempt " + std::string(mode) + " ");
           at != std::string::npos; at = out.find("XPV-TEST: attempt " + std::string(mode) + " ", at + 1)) {
        std::cout << out.substr(at, out.find("XPV-TEST: attempt end", at) - at) << "\n";
      }
    }
    EXPECT_NE(s.find("XPV-TEST: create rc=0"), std::string::npos) << s;
    EXPECT_NE(s.find("Hypervisor detected: Xen HVM"), std::string::npos) << s;
    EXPECT_NE(s.find("xen:grant_table: Grant tables using version 1 layout"), std::string::npos) << s;
    // The device driver model: xen-platform-pci probed the 5853:0001 function.
    EXPECT_NE(s.find("xen-platform-pci 0000:00:03.0"), std::string::npos) << s;
    // What the guest chose, as the VMM saw it (hvm_session.sh prints the VMM's "event upcalls:" lines).
    const std::string m(mode);
    if (m == "vector" || m == "callback") {
      EXPECT_NE(s.find("Xen HVM callback vector for event delivery is enabled"), std::string::npos) << s;
      EXPECT_NE(s.find("xpv-initrd: loaded xen_netfront"), std::string::npos) << s;
      EXPECT_EQ(s.find("xpv-initrd: loaded xen_netfront ("), std::string::npos) << "no parameter was given\n" << s;
    }
    if (m == "vector") {
      // Linux 6.1 sets a per-vCPU vector on every CPU (vCPU 1 when it brings the AP up), and GSI 1
      // as CALLBACK_IRQ "to trick the toolstack".
      EXPECT_NE(s.find("XPV-TEST: upcalls per-vCPU vector 0xf3 on vCPU 0"), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-TEST: upcalls per-vCPU vector 0xf3 on vCPU 1"), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-TEST: upcalls GSI 1 "), std::string::npos) << s;
      EXPECT_EQ(s.find("(global: every vCPU, no EOI)"), std::string::npos) << s;
    } else if (m == "callback") {
      // Offered no per-vCPU vector, Linux takes the global one: one vector for every vCPU, no EOI.
      EXPECT_NE(s.find("XPV-TEST: upcalls callback vector 0xf3 (global: every vCPU, no EOI)"), std::string::npos) << s;
      EXPECT_EQ(s.find("XPV-TEST: upcalls per-vCPU vector"), std::string::npos) << s;
      EXPECT_EQ(s.find("XPV-TEST: upcalls GSI"), std::string::npos) << s;
      EXPECT_EQ(s.find("XPV-TEST: upcalls platform-pci INTx"), std::string::npos) << s;
    } else {
      EXPECT_NE(s.find("XPV-TEST: upcalls platform-pci INTx"), std::string::npos) << s;
      EXPECT_EQ(s.find("Xen HVM callback vector for event delivery is enabled"), std::string::npos) << s;
      // xen-netfront.max_queues=1 on its command line (hvm_session.sh) reached insmod.
      EXPECT_NE(s.find("xpv-initrd: loaded xen_netfront (max_queues=1)"), std::string::npos) << s;
    }
    // Direct upcalls (hypervisor-core/domain direct_upcall.h): where the guest took a vector, the
    // VMM routed each vCPU's upcall line and the backends raised interrupts through them; in INTx
    // mode nothing is routed and every notification goes through the domain's event loop.
    EXPECT_NE(s.find("XPV-TEST: direct-route-failures 0"), std::string::npos) << s;
    const std::string direct_marker = "XPV-TEST: direct-interrupts ";
    const std::string direct_line = between(s, direct_marker, "\n");
    ASSERT_GT(direct_line.size(), direct_marker.size()) << s;
    const std::string direct = direct_line.substr(direct_marker.size());
    ASSERT_EQ(direct.find_first_not_of("0123456789"), std::string::npos) << direct_line;
    RecordProperty(std::string("direct_interrupts_") + mode, direct);
    if (m == "intx") {
      EXPECT_EQ(direct, "0") << s;
    } else {
      EXPECT_NE(direct, "0") << "no interrupt raised by a backend itself\n" << s;
    }
    EXPECT_NE(s.find("blkfront: xvda:"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-NET eth0 10.0."), std::string::npos) << "netfront's eth0 is up\n" << s;
    EXPECT_NE(s.find("driver=vif"), std::string::npos) << "eth0 is xen-netfront's\n" << s;
    const std::string mounts = between(s, "XPV-MOUNTS-BEGIN", "XPV-MOUNTS-END");
    EXPECT_NE(mounts.find("\n/dev/xvda / ext4 rw"), std::string::npos) << mounts;
    EXPECT_NE(s.find("XPV-DONE selftest rc=0"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: ping yes"), std::string::npos) << s;
    // `xpv pause` / `xpv unpause`, as xl's: the vCPUs stopped (no answer to a ping, `xpv list`
    // says paused), then ran on without a reboot; a second unpause finds it running.
    const std::string label = "g" + std::string(mode);  // then the attempt's number, " (id N)"
    EXPECT_NE(s.find("XPV-TEST: pause rc=0 Paused " + label), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: list-state paused\n"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: ping-while-paused no"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: unpause rc=0 Unpaused " + label), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: unpause-again rc=1 xpv unpause: " + label), std::string::npos) << s;
    EXPECT_NE(s.find(") is running already\n"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: list-state-after running\n"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: ping-after-unpause yes"), std::string::npos) << s;
    if (m == "callback") {  // made with `xpv create -p`: listed paused until `xpv unpause` started it
      EXPECT_NE(s.find("XPV-TEST: list-state-created paused\n"), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-TEST: unpause-created rc=0 Unpaused " + label), std::string::npos) << s;
      // Its vif bridged: the host side a port of xpvbr2, before and after the backends' restart
      // (the pings asserted above and below went through the bridge).
      EXPECT_NE(s.find("XPV-TEST: bridge-ports 1\n"), std::string::npos) << s;
      // vcpu-pin before the guest ran: vCPU 1's thread, begun at the unpause, took CPU 0;
      // vCPU 0 was not placed (both of L1's CPUs).
      EXPECT_NE(s.find("XPV-TEST: vcpu-pin-paused rc=0 " + label), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-TEST: vcpu-threads-pinned-while-paused 0:0-1 1:0\n"), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-TEST: bridge-ports-after-restart 1\n"), std::string::npos) << s;
    }
    EXPECT_NE(s.find("XPV-TEST: console-attach 1"), std::string::npos) << "xpv console shows the guest\n" << s;
    // `xpv top --json` while the guest waited: its xpv-vmm's CPU time, its root disk's requests
    // (it booted from it and wrote a file) and its vif's packets (the pings and their answers),
    // as xpv-blkback and xpv-netback published them, and xpv-vmm's exit and hypercall counters.
    {
      const std::string top_marker = "XPV-TEST: top ", raw = between(s, top_marker, "\n");
      const std::string top_line = raw.size() > top_marker.size() ? raw.substr(top_marker.size()) : std::string();
      nlohmann::json top;
      try {
        top = nlohmann::json::parse(top_line);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "xpv top --json printed no JSON (" << e.what() << "): " << top_line;
      }
      const nlohmann::json* dom = nullptr;
      if (top.contains("domains")) {
        for (const auto& d : top.at("domains")) {
          if (d.value("name", "").starts_with("g" + std::string(mode))) dom = &d;  // g<mode><attempt>
        }
      }
      ASSERT_NE(dom, nullptr) << top_line;
      EXPECT_EQ(dom->value("type", ""), "hvm") << top_line;
      EXPECT_GT(dom->value("cpu_s", 0.0), 0.0) << top_line;
      ASSERT_EQ(dom->at("vbds").size(), 1u) << top_line;
      const auto& vbd = dom->at("vbds").at(0);
      EXPECT_TRUE(vbd.value("published", false)) << top_line;
      EXPECT_GT(vbd.at("counters").value("rd_req", 0ull), 0u) << top_line;
      EXPECT_GT(vbd.at("counters").value("wr_req", 0ull), 0u) << top_line;
      ASSERT_EQ(dom->at("vifs").size(), 1u) << top_line;
      const auto& vif = dom->at("vifs").at(0);
      EXPECT_TRUE(vif.value("published", false)) << top_line;
      EXPECT_GE(vif.at("counters").value("rx_packets", 0ull), 3u) << top_line;
      EXPECT_GE(vif.at("counters").value("tx_packets", 0ull), 3u) << top_line;
      // xpv-vmm's own counters (RUN/stats/vmm<N>): the hypercalls the guest made, each one a
      // port-I/O exit (the rewritten stubs trap there; xpv-vmm reads the hypercalls first, so the
      // exits it publishes with them include every one), its frontends' notifications to the
      // backends (EVTCHNOP_send) and the upcalls that brought it theirs.
      const auto& vmm = dom->at("vmm");
      EXPECT_TRUE(vmm.value("published", false)) << top_line;
      const auto& vc = vmm.at("counters");
      const auto hypercalls = vc.value("hypercalls", 0ull);
      EXPECT_GT(hypercalls, 0u) << top_line;
      EXPECT_GE(vc.value("exit_io", 0ull), hypercalls) << top_line;
      EXPECT_GT(vc.value("evtchn.send", 0ull), 0u) << top_line;
      EXPECT_GT(vc.value("upcalls", 0ull), 0u) << top_line;
    }
    // The Xen PV console (hvc0): the guest's init wrote its markers there too; its log and
    // `xpv console -t pv` show them.
    EXPECT_NE(s.find("XPV-TEST: pv-console-attach 1"), std::string::npos) << "xpv console -t pv shows hvc0\n" << s;
    // (intx: both boots' ends, before the reboot and before the poweroff)
    EXPECT_NE(s.find(std::string("XPV-TEST: pv-console-done ") + (std::string(mode) == "intx" ? "2" : "1")),
              std::string::npos)
        << "hvc0's log has the selftest's end\n" << s;
    EXPECT_NE(s.find("xpv-vmm: guest stopped: poweroff"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: file xpv-selftest-ok"), std::string::npos) << "the guest's fsync'd file\n" << s;
    // Backend restart without a guest reboot (hvm_session.sh's restart_backends): both daemons
    // killed with -9 while the guest waited, restarted by the supervisor, reattached to the rings
    // of the running guest; the host reached it again and the guest's later synced write landed.
    EXPECT_NE(s.find("XPV-TEST: backends restarted yes"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: ping-after-restart yes"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: file-after-restart xpv-after-wait-ok"), std::string::npos) << s;
    EXPECT_NE(s.find("queue(s) of a previous xpv-blkback; state left Connected"), std::string::npos) << s;
    EXPECT_NE(s.find("of a previous xpv-netback; state left Connected"), std::string::npos) << s;
    // xpv-xenstored's live update under the running guest (hvm_session.sh): the same process
    // serves the guest's ring again, and the shutdown below reached the guest through a watch it
    // had registered with the previous binary.
    EXPECT_NE(s.find("XPV-TEST: live-update rc=0 xpv-xenstored: live update done"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: xenstored dom"), std::string::npos) << s;
    // And its crash restart (SIGKILL) under the running guest: the supervisor started it again
    // from its journal, the guest's ring was attached again, the host reached the guest through
    // the restarted backends, and the balloon, the shutdown and the reboot below went through
    // the recovered daemon, over watches the guest had registered with the killed one.
    EXPECT_NE(s.find("XPV-TEST: xenstored crash-restart yes"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: xenstored recovered dom"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: ping-after-xenstored-crash yes"), std::string::npos) << s;
    // `xpv shutdown` as `xl shutdown`: the guest's kernel advertised control/feature-poweroff, the
    // toolstack wrote poweroff into control/shutdown, the kernel ran /sbin/poweroff (its init saw
    // the request) and the guest powered off by itself within the timeout.
    EXPECT_NE(s.find("XPV-TEST: shutdown rc=0 Shut down domain g" + std::string(mode)), std::string::npos) << s;
    EXPECT_NE(s.find("(the guest was asked through control/shutdown)"), std::string::npos) << s;
    EXPECT_EQ(s.find("did not shut down within"), std::string::npos) << s;
    EXPECT_NE(s.find("XPV-TEST: shutdown-requested 1"), std::string::npos) << s;
    // Ballooning: with memory/static-max written at creation the guest's balloon starts at its
    // target (intx: 512 MiB, nothing taken back); in vector mode `xpv mem-set 256` took 256 MiB of
    // its 512 back — the balloon reached its target, MemTotal fell by exactly that, xpv-vmm freed
    // every page (no "not freed") and `xpv list` shows 256 — and `xpv mem-set 512` gave it all
    // back; in callback mode the guest has memory = 384 of maxmem = 512 and gives the other
    // 128 MiB back by itself at boot.
    const std::string mem = between(s, "XPV-MEM ", "\n");
    ASSERT_FALSE(mem.empty()) << s;
    const auto field = [&](const std::string& key) -> long long {
      const std::string kv = between(mem, key + "=", " ");  // "key=value" (no key is the end of another)
      return kv.empty() ? -1 : std::atoll(kv.c_str() + key.size() + 1);
    };
    const std::string ready_line = between(s, "XPV-READY ", "\n");
    const std::string ready_kv = between(ready_line + "\n", "mem_kib=", "\n");
    const long long ready_kib = ready_kv.size() > 8 ? std::atoll(ready_kv.c_str() + 8) : -1;
    EXPECT_GT(ready_kib, m == "callback" ? 256 * 1024 : 400 * 1024) << ready_line;
    EXPECT_GT(field("balloon_target_kib"), 0) << mem;
    EXPECT_EQ(field("balloon_current_kib"), field("balloon_target_kib")) << mem;
    EXPECT_EQ(s.find("not freed on the host"), std::string::npos) << s;
    if (m == "vector") {
      // The domain is g<mode><attempt>: a boot tried again is gvector2, …
      EXPECT_NE(s.find("XPV-TEST: mem-set rc=0 Set gvector"), std::string::npos) << s;
      EXPECT_NE(s.find("memory target to 256 MiB of 512 (its balloon driver moves to it)"), std::string::npos) << s;
      EXPECT_EQ(field("mem_kib"), ready_kib - 256 * 1024) << mem << "\n" << ready_line;
      EXPECT_NE(s.find("XPV-TEST: list-mem 256\n"), std::string::npos) << "xpv list shows what it holds\n" << s;
      // Grown back: the balloon asked for every page again (XENMEM_populate_physmap), so xpv-vmm
      // holds none back when the guest ends.
      EXPECT_NE(s.find("XPV-TEST: mem-set-back rc=0 Set gvector"), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-TEST: list-mem-back 512 after "), std::string::npos) << s;
      EXPECT_NE(s.find(" ballooned_pages=0"), std::string::npos) << s;
      RecordProperty("ram_file_mib_before", between(s, "XPV-TEST: ram-file-mib before ", "\n"));
      RecordProperty("ram_file_mib_after", between(s, "XPV-TEST: ram-file-mib after ", "\n"));
    } else if (m == "callback") {
      // Ballooned down before or after its init said READY: at most what READY said, below 384.
      EXPECT_LE(field("mem_kib"), ready_kib) << mem << "\n" << ready_line;
      EXPECT_LT(field("mem_kib"), 384 * 1024) << mem;
      EXPECT_NE(s.find(" ballooned_pages=32768"), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-TEST: list-mem 384\n"), std::string::npos) << s;
    } else {
      EXPECT_EQ(field("mem_kib"), ready_kib) << mem << "\n" << ready_line;
      EXPECT_NE(s.find(" ballooned_pages=0"), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-TEST: list-mem 512\n"), std::string::npos) << s;
    }
    if (m == "intx") {
      // `xpv sysrq` (control/sysrq: the guest's kernel ran its SysRq handler, whose help went to
      // the console) and `xpv reboot` (control/shutdown = reboot: the kernel restarted, the VMM
      // stopped with "reboot", the monitor destroyed the domain and created it again; the second
      // boot ran its selftest on the same disk and is the one `xpv shutdown` ended).
      EXPECT_NE(s.find("XPV-TEST: sysrq rc=0 Sent sysrq 'h' to gintx"), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-TEST: sysrq-help 1"), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-TEST: reboot rc=0 Rebooted domain gintx"), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-SHUTDOWN-REQUESTED reboot"), std::string::npos) << s;
      EXPECT_NE(s.find(": reboot; on_reboot = restart"), std::string::npos) << s;
      EXPECT_NE(s.find("restarted from"), std::string::npos) << s;
      std::size_t ready = 0;
      for (auto at = s.find("\nXPV-READY"); at != std::string::npos; at = s.find("\nXPV-READY", at + 1)) ++ready;
      EXPECT_EQ(ready, 2u) << "two boots on the serial console\n" << s;
      // `xpv vcpu-pin all 0-1` on the running guest (both of L1's CPUs), then `xpv vcpu-list`
      // (each thread's affinity the kernel reports: every online CPU, "all" as xl shows it); a
      // vCPU the domain does not have is refused; the guest answers after.
      EXPECT_NE(s.find("XPV-TEST: vcpu-pin rc=0 gintx"), std::string::npos) << s;
      EXPECT_NE(s.find("): vCPU all on CPUs 0,1\n"), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-TEST: vcpu-threads-pinned 0:0-1 1:0-1\n"), std::string::npos) << s;
      const std::string l1 = between(s, "XPV-TEST: vcpu-list-pinned gintx", "\n");
      EXPECT_NE(l1.find(" all / all"), std::string::npos) << "every CPU of L1: all, as xl shows it\n" << l1;
      EXPECT_NE(s.find("XPV-TEST: vcpu-pin-bad rc=1 xpv vcpu-pin: gintx"), std::string::npos) << s;
      EXPECT_NE(s.find(") has 2 vCPU(s): there is no vCPU 2\n"), std::string::npos) << s;
      EXPECT_NE(s.find("XPV-TEST: ping-after-vcpu-pin yes"), std::string::npos) << s;
      // `xpv sched-credit -w 512 -c 150` on the running guest, on L1's cgroup v2: its xpv-vmm in
      // /xpv/<uuid> with every thread, cpu.weight 200 (512 × 100 / 256) and cpu.max 150 ms per
      // 100 ms; listed; `-c 0` lifts the cap.
      EXPECT_NE(s.find("XPV-TEST: sched-credit rc=0 gintx"), std::string::npos) << s;
      EXPECT_NE(s.find("): weight 512, cap 150 % of a CPU (/sys/fs/cgroup/xpv/"), std::string::npos) << s;
      const std::string cg_marker = "XPV-TEST: sched-cgroup ";
      const std::string cg_line = between(s, cg_marker, "\n");
      ASSERT_FALSE(cg_line.empty()) << s;
      const std::string cg = cg_line.substr(cg_marker.size());  // between() keeps the marker
      EXPECT_TRUE(cg.starts_with("/xpv/")) << cg;
      EXPECT_NE(cg.find(" weight=200 max=150000 100000 threads "), std::string::npos) << cg;
      const auto threads = cg.substr(cg.find(" threads ") + 9);
      const auto of = threads.find(" of ");
      ASSERT_NE(of, std::string::npos) << cg;
      EXPECT_EQ(threads.substr(0, of), threads.substr(of + 4)) << "every thread of xpv-vmm in its cgroup: " << cg;
      const std::string row = between(s, "XPV-TEST: sched-credit-list gintx", "\n");
      EXPECT_NE(row.find(" 512   150  /sys/fs/cgroup/xpv/"), std::string::npos) << row;
      EXPECT_NE(s.find("XPV-TEST: sched-uncap rc=0 max=max 100000\n"), std::string::npos) << s;
    }
  }
}

}  // namespace
