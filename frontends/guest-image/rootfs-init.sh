#!/bin/sh
# xpv guest image — /sbin/init on the root disk (frontends/guest-image/rootfs-init.sh). Started
# by the initramfs with switch_root. README.md in this folder documents the cmdline protocol
# (xpv.run, xpv.ip, xpv.wait, xpv.size, ...) and every marker line; the host parses them.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
export HOME=/root
grep -q '^proc /proc ' /proc/mounts 2>/dev/null || mount -t proc proc /proc
grep -q '^sysfs /sys ' /proc/mounts || mount -t sysfs sysfs /sys
grep -q ' /dev devtmpfs ' /proc/mounts || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts 2>/dev/null
mount -t tmpfs tmpfs /dev/shm 2>/dev/null
mount -t tmpfs tmpfs /run 2>/dev/null

CONS=
for c in /dev/ttyS0 /dev/hvc0; do
  [ -c "$c" ] && (: > "$c") 2>/dev/null && CONS="$CONS $c"
done
[ -n "$CONS" ] || CONS=/dev/console
say() { for c in $CONS; do echo "$*" > "$c" 2>/dev/null; done; }
# Copies stdin to every console, line by line.
say_lines() { while IFS= read -r l; do say "$l"; done; }

RUN=selftest
IP=
WAIT=20
SIZE=256
REPEAT=1
CLIENTS=0
PAIRS=0
FIO=randread-4k
SHUTDOWN_WAIT=0
BONNIE_DIRECT=0
BONNIE_CHUNK=0
EOI_TRACE=0
TCP_DETAIL=0
MEM_TARGET_MIB=
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    xpv.run=*) RUN="${arg#xpv.run=}" ;;
    xpv.ip=*) IP="${arg#xpv.ip=}" ;;
    xpv.wait=*) WAIT="${arg#xpv.wait=}" ;;
    xpv.size=*) SIZE="${arg#xpv.size=}" ;;
    xpv.repeat=*) REPEAT="${arg#xpv.repeat=}" ;;
    xpv.clients=*) CLIENTS="${arg#xpv.clients=}" ;;
    xpv.pairs=*) PAIRS="${arg#xpv.pairs=}" ;;
    xpv.fio=*) FIO="${arg#xpv.fio=}" ;;
    xpv.shutdown_wait=*) SHUTDOWN_WAIT="${arg#xpv.shutdown_wait=}" ;;
    xpv.bonnie_direct=*) BONNIE_DIRECT="${arg#xpv.bonnie_direct=}" ;;
    xpv.bonnie_chunk=*) BONNIE_CHUNK="${arg#xpv.bonnie_chunk=}" ;;
    xpv.eoi_trace=*) EOI_TRACE="${arg#xpv.eoi_trace=}" ;;
    xpv.tcp_detail=*) TCP_DETAIL="${arg#xpv.tcp_detail=}" ;;
    xpv.mem_target_mib=*) MEM_TARGET_MIB="${arg#xpv.mem_target_mib=}" ;;
  esac
done

END=poweroff  # what finish does: poweroff, or what the host asked for through the kernel (reboot, halt)
finish() {
  say "XPV-DONE $RUN rc=$1"
  sync
  mount -o remount,ro / 2>/dev/null
  sync
  $END -f
  echo o > /proc/sysrq-trigger 2>/dev/null
  sleep 10
  exit "$1"
}
fatal() { say "XPV-FATAL $*"; finish 1; }

for v in WAIT SIZE REPEAT CLIENTS PAIRS SHUTDOWN_WAIT BONNIE_DIRECT BONNIE_CHUNK EOI_TRACE TCP_DETAIL; do
  eval "val=\$$v"
  case "$val" in ''|*[!0-9]*) fatal "xpv.$(echo "$v" | tr 'A-Z' 'a-z')=$val is not a number" ;; esac
done
JSON=; [ "$TCP_DETAIL" -ne 0 ] && JSON=--json  # the iperf3 servers' output, for tcp_detail
case "$FIO" in ''|*[!A-Za-z0-9_-]*) fatal "xpv.fio=$FIO: not a job name" ;; esac

hostname xpv-guest
ip link set lo up 2>/dev/null
if [ -n "$IP" ]; then
  # netfront and virtio-net probe asynchronously: wait (bounded, 10 s) for eth0.
  i=0
  while [ ! -e /sys/class/net/eth0 ] && [ "$i" -lt 100 ]; do usleep 100000; i=$((i + 1)); done
  if [ ! -e /sys/class/net/eth0 ]; then
    say "XPV-NET-FAIL eth0: no such interface after 10 s (interfaces: $(ls /sys/class/net | tr '\n' ' '))"
  elif err=$(ip addr add "$IP" dev eth0 2>&1 && ip link set eth0 up 2>&1); then
    say "XPV-NET eth0 $IP mac=$(cat /sys/class/net/eth0/address) driver=$(basename "$(readlink /sys/class/net/eth0/device/driver)")"
  else
    say "XPV-NET-FAIL eth0: $err"
  fi
else
  say "XPV-NET none"
fi

# Spreads the NIC's queue interrupts over the vCPUs — queue i to vCPU i mod n — as irqbalance does
# on a full system and as virtio-net's own affinity already is; xen-netfront leaves every queue
# on vCPU 0, where one vCPU then carries both directions of a --bidir run. One marker line:
#   XPV-IRQS spread <irq>:<cpu> ...   (kept: <irq> where the kernel refused, e.g. INTx upcalls,
#                                      whose events Linux cannot move off vCPU 0)
# Arguments (for tests/integration/image): the interrupts file, the irq directory, the vCPU count.
spread_nic_irqs() {
  irqs=${1:-/proc/interrupts} irqdir=${2:-/proc/irq} n=${3:-$(grep -c '^processor' /proc/cpuinfo)}
  lines=$(grep -E 'vif[0-9]+-q[0-9]+|virtio[0-9]+-(input|output)\.[0-9]+' "$irqs")
  [ -n "$lines" ] || { say "XPV-IRQS none (no NIC queue interrupts in $irqs)"; return 0; }
  moved= kept=
  # The list is in a variable, not a pipe: the loop must run in this shell.
  while read -r irq rest; do
    irq=${irq%:}
    q=$(echo "$rest" | sed -n -e 's/.*vif[0-9]*-q\([0-9][0-9]*\).*/\1/p' -e 's/.*virtio[0-9]*-[a-z]*\.\([0-9][0-9]*\).*/\1/p' | head -n 1)
    [ -n "$q" ] || continue
    cpu=$((q % n))
    if { echo "$cpu" > "$irqdir/$irq/smp_affinity_list"; } 2>/dev/null; then moved="$moved $irq:$cpu"; else kept="$kept $irq"; fi
  done <<EOT
$lines
EOT
  say "XPV-IRQS spread${moved:- none}${kept:+ (kept:$kept)}"
}

ROOTDEV=$(awk '$2 == "/" { print $1 }' /proc/mounts | tail -n 1)
say "XPV-READY run=$RUN kernel=$(uname -r) root=$ROOTDEV cpus=$(nproc) mem_kib=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)"

# Waits until something listens on TCP port $1 (bounded: 10 s). Returns 1 if nothing did.
wait_listen() {
  i=0
  while [ "$i" -lt 100 ]; do
    netstat -ltn 2>/dev/null | grep -q ":$1 " && return 0
    usleep 100000
    i=$((i + 1))
  done
  return 1
}

# Waits for pid $1 until the epoch second $2; kills it then. Returns the pid's exit status
# (or 124 if it was killed).
wait_until() {
  while kill -0 "$1" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$2" ]; then
      kill "$1" 2>/dev/null
      wait "$1" 2>/dev/null
      return 124
    fi
    usleep 200000
  done
  wait "$1"
}

# net_counters [DIR]: the guest's TCP loss counters (cumulative since boot: snmp's RetransSegs,
# netstat's TCPTimeouts, TCPLossProbes, TCPSpuriousRTOs) and eth0's drop counters (dev) from
# DIR (default /proc/net) on one line, so that a host can tell a stalled sender that lost
# packets from one that was held back.
net_counters() {
  awk '$1 == "Tcp:" || $1 == "TcpExt:" {
         if (!(($1) in hdr)) { hdr[$1] = 1; for (i = 2; i <= NF; i++) name[$1, i] = $i; next }
         for (i = 2; i <= NF; i++) {
           n = name[$1, i]
           if (n == "RetransSegs" || n == "TCPTimeouts" || n == "TCPLossProbes" || n == "TCPSpuriousRTOs")
             printf "%s=%s ", n, $i
         }
       }' "${1:-/proc/net}/snmp" "${1:-/proc/net}/netstat"
  awk -F'[: ]+' '$2 == "eth0" { printf "eth0_rx_drop=%s eth0_tx_drop=%s", $6, $14 }' "${1:-/proc/net}/dev"
}

# eoi_trace_start [TRACEFS]: count the kernel's late EOIs of its event channels with kprobes and
# hist triggers: each xen_irq_lateeoi call by irq and flags (1: the handler found no work, a
# spurious event) and each run of xen_irq_lateeoi_worker (an EOI the kernel put off). After
# consecutive spurious events the stock kernel leaves the channel masked for up to a second
# (events_base.c), so a backend's spurious notifications can stall a queue. Prints on or off(why).
eoi_trace_start() {
  t=${1:-/sys/kernel/tracing}
  [ -e "$t/kprobe_events" ] || mount -t tracefs tracefs "$t" 2>/dev/null
  [ -e "$t/kprobe_events" ] || { echo "off (no tracefs at $t)"; return 0; }
  if ! { echo 'p:xpv/eoi xen_irq_lateeoi irq=%di:u32 flags=%si:u32' >> "$t/kprobe_events" &&
         echo 'hist:keys=irq,flags' > "$t/events/xpv/eoi/trigger"; } 2>/dev/null; then
    echo "off (no kprobe on xen_irq_lateeoi)"
    return 0
  fi
  { echo 'p:xpv/eoiw xen_irq_lateeoi_worker' >> "$t/kprobe_events" &&
    echo 'hist:keys=common_cpu' > "$t/events/xpv/eoiw/trigger"; } 2>/dev/null
  echo on
}

# eoi_counts [TRACEFS] [INTERRUPTS]: what eoi_trace_start has counted since (cumulative), on one
# line: NAME/IRQ_eoi=N NAME/IRQ_spurious=M per irq (NAME: its action in INTERRUPTS, default
# /proc/interrupts; two queues of one device share a name), then delayed=K (runs of the put-off
# EOI worker). Nothing if not tracing.
eoi_counts() {
  t=${1:-/sys/kernel/tracing}
  [ -r "$t/events/xpv/eoi/hist" ] || return 0
  w=/dev/null
  [ -r "$t/events/xpv/eoiw/hist" ] && w="$t/events/xpv/eoiw/hist"
  awk 'FNR == 1 { file++ }
       file == 1 { n = $1; sub(/:$/, "", n); if (n ~ /^[0-9]+$/) name[n] = $NF; next }
       file == 3 { if ($1 == "Hits:") delayed = $2; next }
       $1 == "{" && $2 == "irq:" && $4 == "flags:" {
         q = $3; sub(/,$/, "", q)
         if (!(q in eoi)) order[++k] = q
         eoi[q] += $NF; if ($5 == 1) spur[q] += $NF
       }
       END {
         for (i = 1; i <= k; i++) { q = order[i]; nm = ((q in name) ? name[q] : "irq") "/" q; printf "%s_eoi=%d %s_spurious=%d ", nm, eoi[q], nm, spur[q] }
         printf "delayed=%d", delayed
       }' "${2:-/proc/interrupts}" "$t/events/xpv/eoi/hist" "$w"
}

# mem_state [XEN_MEMORY_DIR] [MEMINFO] [WAIT_S] [TARGET_KIB]: the guest's memory as its Xen balloon
# driver (drivers/xen/xen-balloon.c's sysfs) and the kernel see it, one line: "mem_kib=<MemTotal>
# balloon_current_kib=<...> balloon_target_kib=<...>", or "mem_kib=<...> balloon=none" without a
# balloon (virtio guests). Waits (bounded: WAIT_S, default 150 s) while the balloon is still
# moving to its target: the host's `xpv mem-set` only sets the target, and the balloon zeroes each
# page it gives back (in the nested testbed, first touches of 256 MiB took from 4 to over 30 s).
# With TARGET_KIB (xpv.mem_target_mib, from a host that announced its `xpv mem-set`), it also waits,
# within the same bound, for the target to fall to at most that (the driver takes off what it
# found missing below memory/static-max at its first look), as the host's steps before its
# `xpv mem-set` may outlast xpv.wait.
mem_state() {
  b=${1:-/sys/devices/system/xen_memory/xen_memory0} mi=${2:-/proc/meminfo} n=${3:-150} want=${4:-}
  total() { awk '/^MemTotal:/ { print $2 }' "$mi"; }
  if [ ! -r "$b/info/current_kb" ] || [ ! -r "$b/target_kb" ]; then
    echo "mem_kib=$(total) balloon=none"
    return 0
  fi
  i=0
  while { [ "$(cat "$b/info/current_kb")" != "$(cat "$b/target_kb")" ] ||
          { [ -n "$want" ] && [ "$(cat "$b/target_kb")" -gt "$want" ]; }; } && [ "$i" -lt "$n" ]; do
    sleep 1
    i=$((i + 1))
  done
  echo "mem_kib=$(total) balloon_current_kib=$(cat "$b/info/current_kb") balloon_target_kib=$(cat "$b/target_kb")"
}

# tcp_detail FILE: what the sending end of an iperf3 --json log saw each second (iperf3 samples
# TCP_INFO at every interval): congestion window in KiB, smoothed RTT and its variation in µs,
# retransmits — one line, "cwnd_kib=a,b,... rtt_us=... rttvar_us=... retr=...", or "receiver"
# when this end only received. With xpv.tcp_detail=1 the guest's iperf3 servers write --json and
# the guest prints this after each client (XPV-TCP), so a host can tell a sender held back by its
# window (slow start left early, a loss) from one held back below it.
tcp_detail() {
  awk '/^[ \t]*"end":[ \t]*\{/ { exit }
       /"retransmits":/ { r = $0; gsub(/[^0-9]/, "", r) }
       /"snd_cwnd":/ { v = $0; gsub(/[^0-9]/, "", v); c = c sep int(v / 1024); rt = rt sep r; sep = ","; n++ }
       /"rtt":/ { v = $0; gsub(/[^0-9]/, "", v); t = t sep2 v; sep2 = "," }
       /"rttvar":/ { v = $0; gsub(/[^0-9]/, "", v); tv = tv sep3 v; sep3 = "," }
       END { if (n == 0) { printf "receiver"; exit }
             printf "cwnd_kib=%s rtt_us=%s rttvar_us=%s retr=%s", c, t, tv, rt }' "$1" 2>/dev/null
}

# load_delta STAT0 INTR0 STAT1 INTR1: where the guest's CPU time and its NIC queue interrupts went
# between two copies of /proc/stat and /proc/interrupts (0 before, 1 after), on one line: each
# vCPU's share of its time in percent, "cpuN=usr:U,sys:S,irq:I,si:SI,idle:ID,steal:ST" (usr with
# nice, idle with iowait, si = softirq: the receive path's NAPI and TSQ's tasklet), then each NIC
# queue interrupt's count per vCPU, "NAME=C0/C1/..." (netfront's vifD-qN-tx / -rx — split event
# channels, which xpv-netback always offers —, virtio-net's virtioM-input.N / -output.N). So a
# host can tell a starved sender whose vCPU was busy (and with what) from one whose vCPU waited,
# and which vCPU carried which queue.
load_delta() {
  awk 'FNR == 1 { f++
         if (f == 2 || f == 4) { n = 0; for (i = 1; i <= NF; i++) if ($i ~ /^CPU[0-9]+$/) n++; ncol[f] = n; next } }
       (f == 1 || f == 3) && $1 ~ /^cpu[0-9]+$/ {
         if (f == 3) cpu[++k] = $1
         u[f, $1] = $2 + $3; sy[f, $1] = $4; id[f, $1] = $5 + $6; ir[f, $1] = $7; si[f, $1] = $8; st[f, $1] = $9
       }
       (f == 2 || f == 4) && $NF ~ /^(vif[0-9]+-q[0-9]+-(tx|rx)|virtio[0-9]+-(input|output)\.[0-9]+)$/ {
         if (f == 4) q[++m] = $NF
         for (i = 1; i <= ncol[f]; i++) cnt[f, $NF, i] = $(i + 1)
       }
       function pct(v, t) { return int(100 * v / t + 0.5) }
       END {
         sep = ""
         for (j = 1; j <= k; j++) {
           c = cpu[j]
           du = u[3, c] - u[1, c]; ds = sy[3, c] - sy[1, c]; di = id[3, c] - id[1, c]
           dr = ir[3, c] - ir[1, c]; dq = si[3, c] - si[1, c]; dt = st[3, c] - st[1, c]
           t = du + ds + di + dr + dq + dt; if (t <= 0) t = 1
           printf "%s%s=usr:%d,sys:%d,irq:%d,si:%d,idle:%d,steal:%d", sep, c, pct(du, t), pct(ds, t), pct(dr, t), pct(dq, t), pct(di, t), pct(dt, t)
           sep = " "
         }
         for (j = 1; j <= m; j++) {
           v = ""
           for (i = 1; i <= ncol[4]; i++) v = (i > 1 ? v "/" : "") (cnt[4, q[j], i] - cnt[2, q[j], i])
           printf "%s%s=%s", sep, q[j], v
           sep = " "
         }
       }' "$1" "$2" "$3" "$4"
}

# load_mark: copies /proc/stat and /proc/interrupts (into LOGDIR, default /tmp) for load_since.
load_mark() {
  cat /proc/stat > "${LOGDIR:-/tmp}/load-stat"
  cat /proc/interrupts > "${LOGDIR:-/tmp}/load-intr"
}
# load_since: load_delta from load_mark's copies to now.
load_since() {
  load_delta "${LOGDIR:-/tmp}/load-stat" "${LOGDIR:-/tmp}/load-intr" /proc/stat /proc/interrupts
}

# serve_pairs N DEADLINE: N times, two iperf3 servers at once (ports 5201 and 5202), each its own
# process (and thread), so that two clients can drive both directions at the same time without
# iperf3 --bidir's one loop; both are served before the next pair. Past DEADLINE (date +%s):
# finish 124.
serve_pairs() {
  n=1
  while [ "$n" -le "$1" ]; do
    load_mark
    iperf3 -s -1 -p 5201 $JSON > "${LOGDIR:-/tmp}/iperf3.log" 2>&1 &
    pid=$!
    iperf3 -s -1 -p 5202 $JSON > "${LOGDIR:-/tmp}/iperf3b.log" 2>&1 &
    pid2=$!
    wait_listen 5201 || fatal "iperf3 -s is not listening on port 5201 after 10 s: $(tail -n 1 "${LOGDIR:-/tmp}/iperf3.log")"
    wait_listen 5202 || fatal "iperf3 -s is not listening on port 5202 after 10 s: $(tail -n 1 "${LOGDIR:-/tmp}/iperf3b.log")"
    say "XPV-IPERF3-LISTENING 5201+5202 pair=$n"
    wait_until "$pid" "$2"
    rc=$?
    wait_until "$pid2" "$2"
    rc2=$?
    if [ "$rc" -eq 124 ] || [ "$rc2" -eq 124 ]; then
      kill "$pid" "$pid2" 2>/dev/null
      say "XPV-IPERF3-TIMEOUT after $((n - 1)) pairs"
      finish 124
    fi
    say "XPV-IPERF3-SERVED pair $n rc=$rc,$rc2"
    say "XPV-LOAD pair=$n $(load_since)"
    if [ "$TCP_DETAIL" -ne 0 ]; then
      say "XPV-TCP pair=$n port=5201 $(tcp_detail "${LOGDIR:-/tmp}/iperf3.log")"
      say "XPV-TCP pair=$n port=5202 $(tcp_detail "${LOGDIR:-/tmp}/iperf3b.log")"
    fi
    n=$((n + 1))
  done
}

case "$RUN" in
  selftest)
    say "XPV-MOUNTS-BEGIN"
    say_lines < /proc/mounts
    say "XPV-MOUNTS-END"
    say "XPV-DMESG-BEGIN"
    dmesg | grep -i -E 'xen|blkfront|netfront|virtio' | say_lines
    say "XPV-DMESG-END"
    mkdir -p /root
    echo "xpv-selftest-ok" | dd of=/root/selftest.txt conv=fsync 2>/dev/null ||
      fatal "cannot write /root/selftest.txt"
    sync
    say "XPV-SELFTEST-FILE /root/selftest.txt $(wc -c < /root/selftest.txt)"
    say "XPV-WAIT $WAIT"
    sleep "$WAIT"
    # Written after the wait: the host may have restarted the backends meanwhile, and the disk
    # must still take (synced) writes without a reboot.
    echo "xpv-after-wait-ok" | dd of=/root/after-wait.txt conv=fsync 2>/dev/null ||
      fatal "cannot write /root/after-wait.txt after the wait"
    sync
    say "XPV-AFTER-WAIT-FILE /root/after-wait.txt $(wc -c < /root/after-wait.txt)"
    # The host may have set a new memory target during the wait (`xpv mem-set`).
    say "XPV-MEM $(mem_state "" "" "" ${MEM_TARGET_MIB:+$((MEM_TARGET_MIB * 1024))})"
    if [ "$SHUTDOWN_WAIT" -gt 0 ]; then
      # Room for the host's `xpv shutdown`: the kernel's xen manage code sees poweroff in
      # control/shutdown and runs /sbin/poweroff (busybox), which signals init — this script:
      # USR2 poweroff, USR1 halt, TERM reboot. `wait` returns early on a trapped signal.
      REQ=
      trap 'REQ=poweroff' USR2
      trap 'REQ=halt' USR1
      trap 'REQ=reboot' TERM
      say "XPV-SHUTDOWN-WAIT $SHUTDOWN_WAIT"
      sleep "$SHUTDOWN_WAIT" &
      wait $!
      kill $! 2>/dev/null
      [ -n "$REQ" ] && say "XPV-SHUTDOWN-REQUESTED $REQ" && END=$REQ
    fi
    finish 0
    ;;
  iperf3)
    deadline=$(( $(date +%s) + WAIT ))
    spread_nic_irqs
    say "XPV-NET-COUNTERS start $(net_counters)"
    if [ "$EOI_TRACE" -ne 0 ]; then
      say "XPV-EOI-TRACE $(eoi_trace_start)"
      say "XPV-EOI start $(eoi_counts)"
    fi
    if [ "$CLIENTS" -eq 0 ]; then
      iperf3 -s > /tmp/iperf3.log 2>&1 &
      pid=$!
      wait_listen 5201 || fatal "iperf3 -s is not listening on port 5201 after 10 s: $(tail -n 1 "${LOGDIR:-/tmp}/iperf3.log")"
      say "XPV-IPERF3-LISTENING 5201"
      wait_until "$pid" "$deadline"
      say "XPV-IPERF3-STOPPED"
      finish 0
    fi
    n=1
    while [ "$n" -le "$CLIENTS" ]; do
      load_mark
      iperf3 -s -1 $JSON > /tmp/iperf3.log 2>&1 &
      pid=$!
      wait_listen 5201 || fatal "iperf3 -s is not listening on port 5201 after 10 s: $(tail -n 1 "${LOGDIR:-/tmp}/iperf3.log")"
      say "XPV-IPERF3-LISTENING 5201 client=$n"
      wait_until "$pid" "$deadline"
      rc=$?
      [ "$rc" -eq 124 ] && { say "XPV-IPERF3-TIMEOUT after $((n - 1)) clients"; finish 124; }
      say "XPV-IPERF3-SERVED $n rc=$rc"
      say "XPV-LOAD client=$n $(load_since)"
      [ "$TCP_DETAIL" -ne 0 ] && say "XPV-TCP client=$n $(tcp_detail /tmp/iperf3.log)"
      say "XPV-NET-COUNTERS client=$n $(net_counters)"
      [ "$EOI_TRACE" -ne 0 ] && say "XPV-EOI client=$n $(eoi_counts)"
      n=$((n + 1))
    done
    serve_pairs "$PAIRS" "$deadline"
    if [ "$PAIRS" -gt 0 ]; then
      say "XPV-NET-COUNTERS pairs=$PAIRS $(net_counters)"
      [ "$EOI_TRACE" -ne 0 ] && say "XPV-EOI pairs=$PAIRS $(eoi_counts)"
    fi
    finish 0
    ;;
  bonnie)
    ram=$((SIZE / 2))
    # -f -D: no per-character phases (stdio cannot write O_DIRECT), and the bulk phases (block
    # write, rewrite, block read) use O_DIRECT: the disk answers them, not the guest's page cache.
    direct=
    [ "$BONNIE_DIRECT" -ne 0 ] && direct="-f -D"
    # xpv.bonnie_chunk=BYTES: bonnie++'s chunk size (its -s SIZE:CHUNK; default 8192).
    size="$SIZE"
    [ "$BONNIE_CHUNK" -ne 0 ] && size="$SIZE:$BONNIE_CHUNK"
    mkdir -p /tmp/b
    n=1
    while [ "$n" -le "$REPEAT" ]; do
      say "XPV-PHASE bonnie-$n begin"
      bonnie++ -u root -d /tmp/b -s "$size" -r "$ram" -n 0 -q $direct > /tmp/bonnie.csv 2> /tmp/bonnie.err
      rc=$?
      say "XPV-PHASE bonnie-$n end"
      [ "$rc" -eq 0 ] || fatal "bonnie++ failed (exit $rc): $(tail -n 1 /tmp/bonnie.err)"
      say "XPV-BONNIE-BEGIN"
      say_lines < /tmp/bonnie.csv
      say "XPV-BONNIE-END"
      n=$((n + 1))
    done
    rm -rf /tmp/b
    finish 0
    ;;
  fio)
    job="/etc/xpv/fio/$FIO.fio"
    [ -f "$job" ] || fatal "no fio job $FIO (have: $(ls /etc/xpv/fio | sed 's/\.fio$//' | tr '\n' ' '))"
    n=1
    while [ "$n" -le "$REPEAT" ]; do
      say "XPV-PHASE fio-$FIO-$n begin"
      SIZE="$SIZE" fio --eta=never --output-format=json --output=/tmp/fio.json "$job" 2> /tmp/fio.err
      rc=$?
      say "XPV-PHASE fio-$FIO-$n end"
      [ "$rc" -eq 0 ] || fatal "fio failed (exit $rc): $(tail -n 1 /tmp/fio.err)"
      say "XPV-FIO-BEGIN"
      say_lines < /tmp/fio.json
      say "XPV-FIO-END"
      n=$((n + 1))
    done
    rm -f /tmp/fio.dat
    finish 0
    ;;
  shell)
    say "XPV-SHELL (exit the shell to power off)"
    setsid cttyhack sh
    finish 0
    ;;
  *)
    fatal "unknown xpv.run=$RUN (selftest, iperf3, bonnie, fio, shell)"
    ;;
esac
