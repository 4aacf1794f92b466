#!/bin/sh
# A hunt for block I/O stalls: bonnie++ again and again in xpv's Xen HVM guest (and, for the same
# count of runs, in QEMU's virtio guest), and when a guest stops making progress, what each side
# was waiting for. Run INSIDE `xpv testbed` (L1, where KVM runs guests), e.g.
#   img=$(build/bin/xpv image build | head -1); out=$(mktemp -d /tmp/xpv-soak.XXXXXX)
#   build/bin/xpv testbed --timeout 1800 --quiet-limit 400 --share "$out" -- sh tools/testbed/disk-soak.sh "$img" "$out" xx
# ORDER (default xq) is the sequence of guest boots: x = xpv (callback upcalls, xen-blkfront,
# xpv-blkback), q = QEMU 7.2 (virtio-blk, cache=writeback), y = xpv from a second build
# (XPV_B=/path/to/other/bin/xpv, its own daemons, started for that boot).
# Each boot runs bonnie++ XPV_SOAK_REPEAT times (default 4; xpv.repeat) on XPV_SOAK_MIB (default
# 512; xpv.size) of its root file system, as `xpv bench hvm` does once. A boot has stalled when
# no new XPV-PHASE line came for XPV_SOAK_STALL seconds (default 300; one run takes about 50 s in
# the testbed). Then, for an xpv guest, while it is still stalled:
#   - `xpv top` once (the blkback queue's request and byte counters: is anything moving?);
#   - `xpv sysrq NAME w`: the guest's kernel writes its blocked tasks and their stacks to the
#     console (xen's control/sysrq: it needs only xenbus, which a block stall leaves working);
#     20 s for that to arrive;
#   - `xpv destroy`: blkback's teardown line says how the guest left each ring ("ring left: A
#     published and not taken, B taken and not answered, C answered since the frontend last armed
#     its event": backends/README.md "A stalled guest").
# $OUT/soak.txt: one line per run (seconds on L1's clock) and per boot how it ended; $OUT/stall-*
# what was gathered at a stall; $OUT/stamps-* each phase line with L1's time of its arrival;
# $OUT/xpv-log/ the daemons', VMMs' and consoles' logs (copied every minute: an L1 lost
# mid-boot leaves what it had).
# Everything it makes lives in L1 (its /tmp, a TAP, the VMs) and goes with L1.
set -u
me=disk-soak.sh
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: $me IMAGE_DIR OUT_DIR [ORDER of x|q|y] (inside xpv testbed; see the header)"; exit 2; }
IMG=$1 OUT=$2 ORDER=${3:-xq}
XPV=${XPV:-$(dirname "$0")/../../build/bin/xpv}
. "$(dirname "$0")/guests.sh"
check_inputs $me "$IMG" "$OUT" "$ORDER" xqy
REPEAT=${XPV_SOAK_REPEAT:-4} MIB=${XPV_SOAK_MIB:-512} STALL=${XPV_SOAK_STALL:-300}
for v in "REPEAT $REPEAT" "MIB $MIB" "STALL $STALL"; do
  case "${v#* }" in ''|*[!0-9]*|0) echo "$me: XPV_SOAK_${v% *} '${v#* }' is not a positive whole number"; exit 2 ;; esac
done
[ "$REPEAT" -le 20 ] || { echo "$me: XPV_SOAK_REPEAT $REPEAT: at most 20"; exit 2; }
[ -x "$XPV" ] || { echo "$me: no xpv at $XPV (build first, or set XPV)"; exit 2; }
[ -e /dev/kvm ] || { echo "$me: no /dev/kvm: run it inside xpv testbed"; exit 2; }
W=/tmp/xpv-soak; mkdir -p $W/run $W/log
export XPV_RUN_DIR=$W/run XPV_LOG_DIR=$W/log XENSTORED_PATH=$W/run/xenstored.sock XPV_NETNS_DIR=$W/netns
ARGS="root=XVDA panic=-1 xpv.run=bonnie xpv.repeat=$REPEAT xpv.size=$MIB xpv.ip=10.0.0.2/24"
say() { echo "$*"; echo "$*" >> $OUT/soak.txt; }

# watch NAME CONSOLE ALIVE: follows the guest's XPV-PHASE lines until XPV-DONE, XPV-FATAL, the
# guest's end (ALIVE, a test, fails) or a stall; returns 0 when done, 1 when it ended otherwise,
# 2 when stalled (the guest still running). Bounded: REPEAT runs of at most STALL s each, + 600 s.
watch() {
  last=0 t=0 seen=0 limit=$((REPEAT * STALL * 2 + 600))
  while [ $t -lt $limit ]; do
    grep -q "XPV-DONE\|XPV-FATAL" "$2" 2>/dev/null && return 0
    if ! eval "$3"; then sleep 2; grep -q "XPV-DONE" "$2" 2>/dev/null && return 0; return 1; fi
    n=$(grep -c "^XPV-PHASE" "$2" 2>/dev/null); n=${n:-0}
    if [ "$n" -ne "$seen" ]; then seen=$n last=$t; fi
    # before the first phase the guest boots (at most STALL s too)
    [ $((t - last)) -ge "$STALL" ] && return 2
    sleep 5; t=$((t + 5))
    if [ $((t % 60)) -eq 0 ]; then
      echo "$1: ${t} s, $n phase lines"  # alive, for --quiet-limit
      mkdir -p "$OUT/xpv-log" && cp $W/log/* "$OUT/xpv-log/" 2>/dev/null  # kept if L1 is lost mid-boot
    fi
  done
  return 2
}
# stamp_pass CONSOLE NAME: the console's complete phase lines not stamped yet, each with L1's
# time now (the guest's clock is not trusted; one pass a second: 1 s resolution)
stamp_pass() {
  f="$OUT/stamps-$2"
  lines=$(grep -E "^XPV-PHASE bonnie-[0-9]+ (begin|end)" "$1" 2>/dev/null | tr -d "\r")
  have=$(wc -l < "$f"); n=$(printf '%s\n' "$lines" | grep -c .)
  [ "$n" -gt "$have" ] && printf '%s\n' "$lines" | sed -n "$((have + 1)),${n}p" | sed "s/^/$(date +%s) /" >> "$f"
  return 0
}
# stamp CONSOLE NAME &: a pass a second (bounded), until killed
stamp() {
  : > "$OUT/stamps-$2"
  i=0; while [ $i -lt 20000 ]; do stamp_pass "$1" "$2"; sleep 1; i=$((i + 1)); done
}
# stamps_done CONSOLE NAME PID: the stamper stopped, a last pass, each finished run's seconds
stamps_done() {
  kill "$3" 2>/dev/null; wait "$3" 2>/dev/null
  stamp_pass "$1" "$2"
  awk -v name="$2" '$3 ~ /^bonnie-/ && $4 == "begin" { b[$3] = $1 }
    $3 ~ /^bonnie-/ && $4 == "end" && ($3 in b) { printf "%s: %s %d s\n", name, $3, $1 - b[$3]; delete b[$3] }' \
    "$OUT/stamps-$2" >> "$OUT/soak.txt"
}
stalled_xpv() { # NAME: what the xpv side and the guest say while it is stalled
  s=$OUT/stall-$1; mkdir -p $s
  say "$1: STALLED (no XPV-PHASE line for $STALL s); gathering $s"
  timeout 30 $XPV top -b -i 2 -d 5 > $s/top.txt 2>&1
  timeout 30 $XPV sysrq $1 w > $s/sysrq.txt 2>&1 || say "$1: xpv sysrq failed: $(tail -n 1 $s/sysrq.txt)"
  sleep 20
  cp $W/log/console-$1.log $s/ 2>/dev/null
  ps -eLo pid,tid,stat,wchan:24,pcpu,comm > $s/threads.txt 2>&1
}
boot_x() { # n [letter]
  name=soak$1; l=${2:-x}
  xpv_guest $name $IMG $W/x.ext4 "$ARGS" > $W/x.cfg
  rm -f $W/log/console-$name.log $W/log/xpv-vmm-$name.log
  $XPV create $W/x.cfg > $OUT/create-$l$1.log 2>&1 || { say "$l$1: xpv create failed: $(tail -n 1 $OUT/create-$l$1.log)"; return; }
  stamp $W/log/console-$name.log $l$1 & sp=$!
  watch $l$1 $W/log/console-$name.log "! grep -q 'guest stopped' $W/log/xpv-vmm-$name.log 2>/dev/null"; r=$?
  case $r in
    0) say "$l$1: done" ;;
    1) say "$l$1: ended without XPV-DONE: $(grep -h -o 'guest stopped: [^(]*' $W/log/xpv-vmm-$name.log | head -n 1)" ;;
    2) stalled_xpv $name; mv $OUT/stall-$name $OUT/stall-$l$1 2>/dev/null ;;
  esac
  stamps_done $W/log/console-$name.log $l$1 $sp
  timeout 180 $XPV destroy $name > /dev/null 2>&1
  sleep 2  # blkback's teardown line
  [ $r -eq 2 ] && grep -h "ring left" $W/log/xpv-blkback*.log 2>/dev/null | tail -n 4 > $OUT/stall-$l$1/ring-left.txt
  mkdir -p $OUT/xpv-log && cp $W/log/* $OUT/xpv-log/ 2>/dev/null  # kept if L1 dies later
}
boot_y() { # n: the same guest under the second build's xpv and daemons
  second_build_boot $1 || say "y$1: xpv up (XPV_B) failed: $OUT/up-y$1.log"
}
boot_q() { # n: bounded as a watch is (guests.sh's default, 400 s, is for one short workload)
  XPV_QEMU_TIMEOUT=$((REPEAT * STALL * 2 + 700)) qemu_guest soak$1 $IMG $W/q.ext4 "$ARGS" $OUT/console-qemu$1.log
  qemu=$!
  stamp $OUT/console-qemu$1.log q$1 & sp=$!
  watch q$1 $OUT/console-qemu$1.log "kill -0 $qemu 2>/dev/null"; r=$?
  case $r in
    0) say "q$1: done" ;;
    1) say "q$1: ended without XPV-DONE (QEMU exited)" ;;
    2) say "q$1: STALLED (no XPV-PHASE line for $STALL s)" ;;
  esac
  stamps_done $OUT/console-qemu$1.log q$1 $sp
  kill $qemu 2>/dev/null; wait $qemu 2>/dev/null
}

$XPV up > $OUT/up.log 2>&1 || { echo "xpv up failed: $OUT/up.log"; exit 1; }
say "order $ORDER, bonnie++ ${REPEAT} runs of $MIB MiB per boot, stall after $STALL s without a phase line"
i=0; rest=$ORDER
while [ -n "$rest" ]; do
  c=${rest%"${rest#?}"}; rest=${rest#?}; i=$((i + 1))
  echo "boot $i: $c"
  boot_$c $i
done
$XPV down --force > /dev/null 2>&1
cat $OUT/soak.txt
