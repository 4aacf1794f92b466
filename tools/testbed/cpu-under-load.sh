#!/bin/sh
# Where L1's CPU goes per bit moved, xpv's Xen HVM guest next to QEMU's virtio guest: run INSIDE
# `xpv testbed` (L1, where KVM runs guests), e.g.
#   img=$(build/bin/xpv image build | head -1); out=$(mktemp -d /tmp/xpv-load.XXXXXX)
#   build/bin/xpv testbed --timeout 1200 --share "$out" -- sh tools/testbed/cpu-under-load.sh "$img" "$out" xqxq
# ORDER (default xqxq) is the sequence of guest boots, x = xpv (callback upcalls, xen-netfront,
# xpv-netback), q = QEMU 7.2 (virtio-net with vhost): alternating shows whether the order of the
# runs in one L1 matters. y = xpv from a second build, XPV_B=/path/to/other/bin/xpv (its own
# daemons, started for that boot): an A/B of two xpv builds in one L1, e.g. ORDER xyxy.
# z = the xpv guest with XPV_Z_APPEND added to its kernel command line (e.g.
# XPV_Z_APPEND=xen_netfront.max_queues=1): an A/B of a guest setting, ORDER xzxz.
# n = the xpv guest with xpv-netback's data-plane threads (vif*) reniced to XPV_N_NICE (default
# -5) once the guest listens, and v = the QEMU guest with its vhost threads reniced the same way:
# what the backend's share of L1's CPU does, ORDER xnqv.
# XPV_LOAD_INTERVAL=0.1 makes iperf3 report every 0.1 s (default 1).
# In each boot, iperf3 from L1 to the guest for 20 s host->guest, then 20 s guest->host (-R);
# XPV_LOAD_WINDOWS picks the windows and their order from h2g, g2h, bidir (one client with
# --bidir: iperf3 3.12's one-thread loop at both ends) and pair (two clients at once, two guest
# server processes; always last), default "h2g g2h pair";
# 3 s into each run and 5 s after that, every L1 thread's CPU time (utime + stime from /proc,
# clock ticks) and /proc/stat's totals are read — counting, no tracing or sampling, so the runs
# are not slowed (reading them takes L1 a second or two itself: the window,
# measured in L1's ticks, is longer than 5 s and still ends well inside the run).
# $OUT/cpu-summary.txt: per window iperf3's rate received and the ticks of the guest (guest mode,
# /proc/stat), the vCPU threads (guest mode included), the backend thread(s) (xpv-netback,
# vhost-N), the VMM's other threads, iperf3 and all of L1 but idle, and L1's CPU seconds per
# gigabit; under each window the run's rate per second, the sender's retransmits, the drops of
# L1's end of the link and the guest's TCP loss and eth0 drop counters over that run. In the
# testbed one run says little about rates (tools/README.md); the CPU per bit of one window
# against the next is what this is for.
# Everything it makes lives in L1 (its /tmp, a TAP, the VMs) and goes with L1.
set -u
me=cpu-under-load.sh
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: $me IMAGE_DIR OUT_DIR [ORDER of x|q] (inside xpv testbed; see the header)"; exit 2; }
IMG=$1 OUT=$2 ORDER=${3:-xqxq}
XPV=${XPV:-$(dirname "$0")/../../build/bin/xpv}
. "$(dirname "$0")/guests.sh"
check_inputs $me "$IMG" "$OUT" "$ORDER" xqyznv
NICE=${XPV_N_NICE:--5}
case "$NICE" in ''|-|*[!0-9-]*|?*-*) echo "$me: XPV_N_NICE '$NICE' is not a nice value"; exit 2 ;; esac
RENICE=  # the comm pattern of the backend threads to renice to $NICE in this boot (n, v)
renice_backend() { # the backend threads whose comm matches $RENICE, reniced to $NICE
  [ -n "$RENICE" ] || return 0
  for t in /proc/[0-9]*/task/[0-9]*; do
    read -r c 2>/dev/null < $t/comm || continue
    case $c in
      $RENICE) if e=$(renice "$NICE" -p ${t##*/} 2>&1); then echo "reniced $c (${t##*/}) to $NICE"
               else echo "renicing $c (${t##*/}) to $NICE failed: $e"; fi >> $OUT/renice.txt ;;
    esac
  done
}
case "$ORDER" in *z*) [ -n "${XPV_Z_APPEND:-}" ] || { echo "$me: ORDER has z: set XPV_Z_APPEND to the kernel parameters z adds"; exit 2; } ;; esac
INTERVAL=${XPV_LOAD_INTERVAL:-1}  # iperf3's report interval (s): 0.1 shows a stall inside a second
case "$INTERVAL" in ''|*[!0-9.]*|*.*.*) echo "$me: XPV_LOAD_INTERVAL '$INTERVAL' is not a number of seconds"; exit 2 ;; esac
[ -x "$XPV" ] || { echo "$me: no xpv at $XPV (build first, or set XPV)"; exit 2; }
[ -e /dev/kvm ] || { echo "$me: no /dev/kvm: run it inside xpv testbed"; exit 2; }
W=/tmp/xpv-load; mkdir -p $W/run $W/log
export XPV_RUN_DIR=$W/run XPV_LOG_DIR=$W/log XENSTORED_PATH=$W/run/xenstored.sock XPV_NETNS_DIR=$W/netns
WINDOWS=${XPV_LOAD_WINDOWS:-h2g g2h pair}
CLIENTS=1 PAIRS=0  # one client per h2g/g2h/bidir window and a last 1 s one; a pair window: pairs=1
for w in $WINDOWS; do
  case $w in
    h2g|g2h|bidir) [ $PAIRS -eq 0 ] || { echo "$me: XPV_LOAD_WINDOWS: pair must come last"; exit 2; }
                   CLIENTS=$((CLIENTS + 1)) ;;
    pair) [ $PAIRS -eq 0 ] || { echo "$me: XPV_LOAD_WINDOWS: pair twice"; exit 2; }; PAIRS=1 ;;
    *) echo "$me: XPV_LOAD_WINDOWS: '$w' is none of h2g g2h bidir pair"; exit 2 ;;
  esac
done
ARGS="root=XVDA panic=-1 xpv.run=iperf3 xpv.clients=$CLIENTS xpv.pairs=$PAIRS xpv.wait=250 xpv.ip=10.0.0.2/24 xpv.eoi_trace=1 xpv.tcp_detail=1"
waitfor() { # file marker: bounded at 200 s (a line a minute while it waits: see window); ends
  # early once the guest is gone (STOPPED, a test set per boot: its VMM said it stopped)
  i=0; while [ $i -lt 200 ]; do
    grep -q "$2" "$1" 2>/dev/null && return 0
    if [ -n "${STOPPED:-}" ] && eval "$STOPPED" 2>/dev/null; then
      grep -q "$2" "$1" 2>/dev/null && return 0  # it came just before the guest stopped
      echo "the guest stopped: no '$2' in $1"; return 1
    fi
    sleep 1; i=$((i+1))
    [ $((i % 60)) -ne 0 ] || echo "waiting for '$2' in $1 ($i s)"
  done
  echo "no '$2' in $1 within 200 s"; return 1
}
snap() { # every L1 thread as "tid comm ticks runs wait" (comm's blanks as _; runs: the times it
  # was put on a CPU, schedstat's third field; wait: the ns it spent runnable on a run queue
  # without a CPU, schedstat's second), then /proc/stat's cpu and ctxt lines
  for t in /proc/[0-9]*/task/[0-9]*; do
    read -r st < $t/stat && read -r ss < $t/schedstat && echo "$st
S $ss"
  done 2>/dev/null | awk '$1 == "S" { print tid, c, ticks, $4, $3; next }
    { s = $0; sub(/^[^(]*\(/, "", s); c = s; sub(/\).*/, "", c); gsub(/ /, "_", c)
      sub(/^.*\) /, "", s); split(s, f, " "); tid = $1; ticks = f[12] + f[13] }'
  grep -E '^(cpu|ctxt) ' /proc/stat
}
window() { # name iperf3-args [second-args]: 20 s of iperf3 (with second-args, a second client at
  # the same time, its JSON in iperf-NAME-r.json); threads read 3 s into it and 5 s later
  echo "$1: window"  # progress on stdout, so that xpv testbed's --quiet-limit sees the run alive
  cat /proc/net/dev > $OUT/dev0-$1.txt
  timeout 60 iperf3 -J -i $INTERVAL -c 10.0.0.2 -t 20 $2 > $OUT/iperf-$1.json 2>&1 & p=$!
  p2=; if [ $# -ge 3 ]; then timeout 60 iperf3 -J -i $INTERVAL -c 10.0.0.2 -t 20 $3 > $OUT/iperf-$1-r.json 2>&1 & p2=$!; fi
  sleep 3; snap > $OUT/snap0-$1.txt; sleep 5; snap > $OUT/snap1-$1.txt; wait $p $p2
  cat /proc/net/dev > $OUT/dev1-$1.txt
  sleep 2  # the guest starts its next `iperf3 -s -1`
}
measure() { # name console: the guest listens; the windows, the last client it waits for, the pair
  for w in $WINDOWS; do
    case $w in
      h2g) window $1-h2g "" ;;
      g2h) window $1-g2h -R ;;
      bidir) window $1-bidir --bidir ;;
      pair) timeout 60 iperf3 -c 10.0.0.2 -t 1 > /dev/null 2>&1
            # both directions at once: host->guest to 5201, guest->host to 5202, two guest processes
            waitfor $2 "XPV-IPERF3-LISTENING 5201+5202 pair=1" && window $1-pair "-p 5201" "-p 5202 -R" ;;
    esac
  done
  [ $PAIRS -eq 1 ] || timeout 60 iperf3 -c 10.0.0.2 -t 1 > /dev/null 2>&1
}
boot_end() { # name console how: one line in boots.txt — did the guest get to XPV-DONE, and if not,
  # what its VMM says became of it (a guest that died mid-run and one that hung look alike on the
  # console: both just stop)
  if grep -q XPV-DONE "$2" 2>/dev/null; then echo "$1: done"; else echo "$1: not done; $3"; fi >> $OUT/boots.txt
  tail -n 1 $OUT/boots.txt
}
boot_x() { # n [name letter, default x]
  xpv_guest load$1 $IMG $W/x.ext4 "$ARGS" > $W/x.cfg
  rm -f $W/log/console-load$1.log $W/log/xpv-vmm-load$1.log  # a rerun in this L1 starts clean
  $XPV create $W/x.cfg > $OUT/create-$1.log 2>&1
  STOPPED="grep -q 'guest stopped' $W/log/xpv-vmm-load$1.log"
  if waitfor $W/log/console-load$1.log XPV-IPERF3-LISTENING; then renice_backend; measure ${2:-x}$1 $W/log/console-load$1.log; else rc=1; fi
  waitfor $W/log/console-load$1.log "XPV-DONE\|XPV-FATAL"
  how=$(grep -h -o 'guest stopped: [^(]*' $W/log/xpv-vmm-load$1.log 2>/dev/null | head -n 1)
  boot_end ${2:-x}$1 $W/log/console-load$1.log "xpv-vmm: ${how:-the guest still ran}"
  STOPPED=
  $XPV destroy load$1 > /dev/null 2>&1
  mkdir -p $OUT/xpv-log && cp $W/log/* $OUT/xpv-log/ 2>/dev/null  # kept if L1 dies later
}
boot_y() { # n: the same guest under the second build's xpv and daemons
  second_build_boot $1 || { echo "xpv up (XPV_B) failed: $OUT/up-y$1.log"; rc=1; }
}
boot_z() { # n: the same xpv guest with XPV_Z_APPEND added to its kernel command line
  za=$ARGS; ARGS="$ARGS $XPV_Z_APPEND"; boot_x $1 z; ARGS=$za
}
boot_n() { # n: the xpv guest, xpv-netback's data-plane threads reniced
  RENICE='vif*'; boot_x $1 n; RENICE=
}
boot_v() { # n: the QEMU guest, its vhost threads reniced
  RENICE='vhost-*'; boot_q $1 v; RENICE=
}
boot_q() { # n [name letter, default q]
  ip tuntap add dev xpvtap0 mode tap && ip addr add 10.0.0.1/24 dev xpvtap0 && ip link set xpvtap0 up
  qemu_guest load$1 $IMG $W/q.ext4 "$ARGS" $OUT/console-qemu$1.log
  qemu=$!
  STOPPED="! kill -0 $qemu"  # -no-reboot: QEMU exits when its guest resets itself
  if waitfor $OUT/console-qemu$1.log XPV-IPERF3-LISTENING; then renice_backend; measure ${2:-q}$1 $OUT/console-qemu$1.log; else rc=1; fi
  waitfor $OUT/console-qemu$1.log "XPV-DONE\|XPV-FATAL"
  STOPPED=
  sleep 3
  if kill -0 $qemu 2>/dev/null; then how="QEMU: the guest still ran"
  else how="QEMU had exited (with -no-reboot: the guest reset itself, a triple fault or a reboot)"; fi
  boot_end ${2:-q}$1 $OUT/console-qemu$1.log "$how"
  kill $qemu 2>/dev/null; wait $qemu
  ip link del xpvtap0
}
summary() { # name
  rate_of() { grep -m1 -A8 '"sum_received"' "$1" 2>/dev/null | awk -F: '/bits_per_second/ { printf "%.0f", $2 / 1e6 }'; }
  rate=$(rate_of $OUT/iperf-$1.json); both=${rate:-0}
  if [ -f $OUT/iperf-$1-r.json ]; then  # a pair window: host->guest + guest->host
    rate2=$(rate_of $OUT/iperf-$1-r.json); both=$(( ${rate:-0} + ${rate2:-0} )); rate="${rate:-0}+${rate2:-0}"
  fi
  case $1 in *-bidir)  # --bidir: host->guest (sum_received) + guest->host (its _bidir_reverse)
    rate2=$(grep -m1 -A8 '"sum_received_bidir_reverse"' $OUT/iperf-$1.json 2>/dev/null | awk -F: '/bits_per_second/ { printf "%.0f", $2 / 1e6 }')
    both=$(( ${rate:-0} + ${rate2:-0} )); rate="${rate:-0}+${rate2:-0}" ;;
  esac
  awk -v name=$1 -v rate="${rate:-0}" -v both=$both -v ncpu=$(nproc) '
    FNR == 1 { file++ }
    /^cpu / { for (i = 2; i <= NF; i++) st[file, i] = $i; next }
    /^ctxt / { ctxt[file] = $2; next }
    { if (file == 1) { t0[$1] = $3; r0[$1] = $4; w0[$1] = $5 } else { comm[$1] = $2; t1[$1] = $3; r1[$1] = $4; w1[$1] = $5 } }
    END {
      tot = 0; for (i = 2; i <= 11; i++) tot += st[2, i] - st[1, i]
      idle = (st[2, 5] - st[1, 5]) + (st[2, 6] - st[1, 6]); guest = st[2, 10] - st[1, 10]
      for (t in t1) {
        d = t1[t] - (t in t0 ? t0[t] : 0); c = comm[t]; r = r1[t] - (t in r0 ? r0[t] : 0)
        w = (w1[t] - (t in w0 ? w0[t] : 0)) / 1e6
        if (c ~ /^vcpu[0-9]/ || c ~ /^CPU_[0-9]+\/KVM/) { vcpu += d; rv += r; if (d > 0) { pv = pv " " d; wv = wv " " int(w) } }
        else if (c == "xpv-netback" || c ~ /^vif[0-9]+\.[0-9]+-q[0-9]/ || c ~ /^vhost-/) { be += d; rb += r; if (d > 0) { pb = pb " " d; wb = wb " " int(w) } }
        else if (c ~ /^xpv-vmm/ || c ~ /^qemu/ || c ~ /^xen-/ || c ~ /^worker/ || c ~ /^call_rcu/) vmm += d
        else if (c == "iperf3") ip += d
      }
      # tot / ncpu is the window in ticks (reading every thread takes L1 a few seconds too);
      # CPU seconds per gigabit: busy ticks over the bits received in that time at iperf3s rate
      busy = tot - idle; secs = tot / ncpu / 100
      printf "%-7s %5s Mbit/s | guest %4d vcpu %4d backend %4d vmm-other %4d iperf3 %4d | L1 busy %4d of %4d ticks (%.1f s), %.2f CPU s per Gbit\n",
        name, rate, guest, vcpu, be, vmm, ip, busy, tot, secs, (both > 0 ? (busy / 100) / (both / 1000 * secs) : 0)
      # How often each was put on a CPU (a switch to another process costs L1 its TLB under TCG),
      # and each vCPU and backend thread ticks (a direction held back by one busy thread shows)
      printf "        runs per s: vcpu %d backend %d | L1 context switches per s %d | ticks per thread: vcpu%s backend%s\n",
        rv / secs, rb / secs, (ctxt[2] - ctxt[1]) / secs, pv, pb
      # How long each of them was runnable but waited for one of L1s CPUs (schedstat): a thread
      # that waits holds up whatever it serves, however few ticks it needs
      printf "        ms waiting for a CPU per thread (window %.1f s): vcpu%s backend%s\n", secs, wv, wb
    }' $OUT/snap0-$1.txt $OUT/snap1-$1.txt
  # Where a window stalled: iperf3's rate per second, the sender's retransmits, the drops of L1's
  # end of the link (xpv's vif, QEMU's xpvtap0) over the run, and the guest's own counters
  # (XPV-NET-COUNTERS lines: the run's client against the line before it).
  per_s() { awk '/^\t"end":/ { exit } /"sum":/ { s = 1 }
                s && /bits_per_second/ { v = $0; sub(/.*:[ \t]*/, "", v); sub(/,.*/, "", v); printf "%.0f ", v / 1e6; s = 0 }' "$1" 2>/dev/null; }
  rates=$(per_s $OUT/iperf-$1.json)
  case $1 in *-bidir) rates="${rates% }] + guest->host [$(awk '/^\t"end":/ { exit } /"sum_bidir_reverse":/ { s = 1 }
      s && /bits_per_second/ { v = $0; sub(/.*:[ \t]*/, "", v); sub(/,.*/, "", v); printf "%.0f ", v / 1e6; s = 0 }' $OUT/iperf-$1.json 2>/dev/null)" ;;
  esac
  [ -f $OUT/iperf-$1-r.json ] && rates="${rates% }] + guest->host [$(per_s $OUT/iperf-$1-r.json)"
  retr=$(awk '/"sum_sent"/ { s = 1 } s && /"retransmits"/ { gsub(/[^0-9]/, "", $0); print; exit }' $OUT/iperf-$1.json 2>/dev/null)
  drops=$(awk -F'[: ]+' 'FNR == 1 { file++ } $2 ~ /^(vif|xpvtap)/ { rx[file] = $6; tx[file] = $14 }
                         END { printf "rx %d tx %d", rx[2] - rx[1], tx[2] - tx[1] }' $OUT/dev0-$1.txt $OUT/dev1-$1.txt 2>/dev/null)
  vm=${1%%-*}; boot=${vm#?}
  case $vm in [qv]*) con=$OUT/console-qemu$boot.log ;; *) con=$OUT/xpv-log/console-load$boot.log ;; esac
  client=pairs=1; i=0  # the guest's client number of this window
  for w in $WINDOWS; do i=$((i + 1)); case $1 in *-$w) [ $w = pair ] || client=client=$i ;; esac; done
  guest=$(marker_delta XPV-NET-COUNTERS "$client" "$con")
  eoi=$(marker_delta XPV-EOI "$client" "$con")
  printf "        per %s s [%s] Mbit/s | sender retransmits %s | L1 link drops %s | guest %s\n" "$INTERVAL" "${rates% }" "${retr:-?}" "${drops:-?}" "${guest% }"
  [ -n "$eoi" ] && printf "        guest event-channel EOIs (spurious: the handler found nothing; delayed: put off) %s\n" "${eoi% }"
  # The guest's sending TCP each second (XPV-TCP: cwnd, smoothed RTT, retransmits as its iperf3
  # server sampled them), for the windows where the guest sent.
  case $1 in
    *-g2h|*-bidir) tcp=$(grep -a "XPV-TCP $client " "$con" | tail -n 1 | sed "s/.*XPV-TCP $client //; s/\r//") ;;
    *-pair) tcp=$(grep -a "XPV-TCP pair=1 port=5202 " "$con" | tail -n 1 | sed 's/.*port=5202 //; s/\r//') ;;
    *) tcp= ;;
  esac
  [ -n "$tcp" ] && printf "        guest sender per s: %s\n" "$tcp"
  return 0
}
# marker_delta MARKER CLIENT CONSOLE: the NAME=VALUE fields of the guest's MARKER line for CLIENT
# against the same marker's line before it, as NAME+DIFF.
marker_delta() {
  awk -v mk="$1" -v c="$2" '$0 ~ mk { gsub(/\r/, ""); m = 1; while (m < NF && $m != mk) m++
            if ($m != mk) next
            if ($(m + 1) == c) { for (i = m + 2; i <= NF; i++) { split($i, kv, "="); printf "%s+%d ", kv[1], kv[2] - last[kv[1]] }; exit }
            for (i = m + 2; i <= NF; i++) { split($i, kv, "="); last[kv[1]] = kv[2] } }' "$3" 2>/dev/null
}
rc=0
$XPV up > $OUT/up.log 2>&1 || { echo "xpv up failed: $OUT/up.log"; exit 1; }
n=0
for v in $(echo "$ORDER" | sed 's/./& /g'); do
  n=$((n + 1)); boot_$v $n
done
mkdir -p $OUT/xpv-log && cp $W/log/* $OUT/xpv-log/
$XPV down --force > /dev/null 2>&1
n=0
for v in $(echo "$ORDER" | sed 's/./& /g'); do
  n=$((n + 1))
  for d in $WINDOWS; do [ -f $OUT/snap1-$v$n-$d.txt ] && summary $v$n-$d; done
done > $OUT/cpu-summary.txt
cat $OUT/boots.txt >> $OUT/cpu-summary.txt 2>/dev/null
cat $OUT/cpu-summary.txt
exit $rc
