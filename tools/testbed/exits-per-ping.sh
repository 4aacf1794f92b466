#!/bin/sh
# What one ping round trip costs in KVM exits, xpv's Xen HVM guest next to QEMU's virtio guest:
# run INSIDE `xpv testbed` (L1, where KVM runs guests), e.g.
#   img=$(build/bin/xpv image build | head -1); out=$(mktemp -d /tmp/xpv-exits.XXXXXX)
#   build/bin/xpv testbed --timeout 600 --share "$out" -- sh tools/testbed/exits-per-ping.sh "$img" "$out"
# For each VMM: boot the image's guest (xpv: callback upcalls, xen-netfront; QEMU 7.2: virtio-net
# with vhost), and once it listens, record L1's kvm tracepoints (kvm_exit, kvm_pio, kvm_msr) for
# 3 s with nothing on the link and for 300 pings 10 ms apart, then count exits by reason, ports
# and MSRs per window ($OUT/exits-summary.txt). Counting, not timing: the round trips ping prints
# are in the summary too, but in the testbed one run says little about them (tools/README.md).
# Everything it makes lives in L1 (its /tmp, a TAP, two VMs) and goes with L1.
set -u
me=exits-per-ping.sh
[ $# -eq 2 ] || { echo "usage: $me IMAGE_DIR OUT_DIR (inside xpv testbed; see the header)"; exit 2; }
IMG=$1 OUT=$2
XPV=${XPV:-$(dirname "$0")/../../build/bin/xpv}
for f in vmlinuz initrd.cpio root.ext4; do
  [ -f "$IMG/$f" ] || { echo "$me: $IMG/$f is missing (\`xpv image build\` makes the image)"; exit 2; }
done
[ -d "$OUT" ] && [ -w "$OUT" ] || { echo "$me: $OUT is not a writable directory"; exit 2; }
[ -x "$XPV" ] || { echo "$me: no xpv at $XPV (build first, or set XPV)"; exit 2; }
[ -e /dev/kvm ] || { echo "$me: no /dev/kvm: run it inside xpv testbed"; exit 2; }
W=/tmp/xpv-exits; mkdir -p $W/run $W/log
export XPV_RUN_DIR=$W/run XPV_LOG_DIR=$W/log XENSTORED_PATH=$W/run/xenstored.sock XPV_NETNS_DIR=$W/netns
. "$(dirname "$0")/guests.sh"
T=/sys/kernel/tracing
mountpoint -q $T || mount -t tracefs none $T || { echo "no tracefs in L1"; exit 1; }
ARGS="root=XVDA panic=-1 xpv.run=iperf3 xpv.clients=1 xpv.wait=200 xpv.ip=10.0.0.2/24"
waitfor() { # file marker: bounded at 300 s
  i=0; while [ $i -lt 300 ]; do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 1; i=$((i+1)); done
  echo "no '$2' in $1 within 300 s"; return 1
}
trace() { # name command
  echo 0 > $T/tracing_on; echo > $T/trace; echo 8192 > $T/buffer_size_kb
  for e in kvm_exit kvm_pio kvm_msr; do echo 1 > $T/events/kvm/$e/enable; done
  echo 1 > $T/tracing_on; sh -c "$2"; echo 0 > $T/tracing_on
  cat $T/trace > $OUT/trace-$1.txt; echo > $T/trace
}
measure() { # x|q
  trace $1-idle "sleep 3"
  trace $1-ping "ping -n -q -c 300 -i 0.01 10.0.0.2 > $OUT/ping-$1.txt 2>&1"
  iperf3 -c 10.0.0.2 -t 1 > $OUT/iperf-$1.txt 2>&1  # the guest's workload: it then powers off
}
summary() { # name
  f=$OUT/trace-$1.txt
  echo "== $1: $(grep -c 'kvm_exit:' $f) exits"
  grep -o 'kvm_exit: vcpu [0-9]* reason [A-Za-z_0-9]*' $f | awk '{print $5}' | sort | uniq -c | sort -rn
  grep -o 'kvm_pio: pio_[a-z]* at 0x[0-9a-f]*' $f | sed 's/kvm_pio: /  port /' | sort | uniq -c | sort -rn
  grep -o 'kvm_msr: msr_[a-z]* [0-9a-f]*' $f | sed 's/kvm_msr: /  msr /' | sort | uniq -c | sort -rn
}
rc=0
if $XPV up > $OUT/up.log 2>&1; then
  xpv_guest exits $IMG $W/x.ext4 "$ARGS" > $W/x.cfg
  $XPV create $W/x.cfg > $OUT/create.log 2>&1
  if waitfor $W/log/console-exits.log XPV-IPERF3-LISTENING; then measure x; else rc=1; fi
  waitfor $W/log/console-exits.log "XPV-DONE\|XPV-FATAL"
  $XPV destroy exits > /dev/null 2>&1
  cp -r $W/log $OUT/xpv-log
  $XPV down --force > /dev/null 2>&1
else
  echo "xpv up failed: $OUT/up.log"; rc=1
fi
ip tuntap add dev xpvtap0 mode tap && ip addr add 10.0.0.1/24 dev xpvtap0 && ip link set xpvtap0 up
qemu_guest exits $IMG $W/q.ext4 "$ARGS" $OUT/console-qemu.log
qemu=$!
if waitfor $OUT/console-qemu.log XPV-IPERF3-LISTENING; then measure q; else rc=1; fi
waitfor $OUT/console-qemu.log "XPV-DONE\|XPV-FATAL"
sleep 3; kill $qemu 2>/dev/null; wait
ip link del xpvtap0
for n in x-idle x-ping q-idle q-ping; do [ -f $OUT/trace-$n.txt ] && summary $n; done > $OUT/exits-summary.txt
grep -H rtt $OUT/ping-*.txt >> $OUT/exits-summary.txt
cat $OUT/exits-summary.txt
exit $rc
