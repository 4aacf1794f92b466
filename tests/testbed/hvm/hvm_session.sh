#!/bin/sh
# Runs inside `xpv testbed` (L1, real KVM). Usage: hvm_session.sh BIN_DIR IMAGE_DIR MODE...
# For each upcall MODE (vector, intx): an HVM guest of Debian's stock kernel with a PV
# root disk (xvda, a copy of the image's root.ext4) and a PV NIC, through the real daemons and
# toolstack; the guest's init runs its selftest, the host pings it, the guest powers off. Prints
# one section per mode between "XPV-TEST: begin MODE" and "XPV-TEST: end MODE" for the test.
#
# L2 guests in this testbed (nested SVM emulated by TCG) sometimes stop making progress at a random
# point of their boot — QEMU's own KVM guests too (measured: 1 hang in 6 QEMU boots of the same
# image) — and xpv's have also died with triple faults, which QEMU's have not shown: that may be
# xpv's own bug and is an open defect (tools/testbed/README.md, "Known issue"). A boot that stops
# before its selftest finished is tried again, at most XPV_HVM_ATTEMPTS times (default 3): each
# failed attempt is printed ("XPV-TEST: attempt MODE N failed" with its console tail and the VMM's
# stop message, triple-fault state included) and the section holds the last attempt. A boot that
# never succeeds fails the test.
B=$1
IMG=$2
shift 2
ATTEMPTS=${XPV_HVM_ATTEMPTS:-3}
W=/tmp/xpv-hvm-test
rm -rf $W
mkdir -p $W/run $W/log
export XPV_RUN_DIR=$W/run XPV_LOG_DIR=$W/log XENSTORED_PATH=$W/run/xenstored.sock XPV_NETNS_DIR=$W/netns
$B/xpv up >/dev/null || echo "XPV-TEST: up failed"

# boot MODE INDEX NAME: one attempt; prints its lines to $W/attempt.out.
boot() {
  M=$1; i=$2; N=$3
  # A module parameter on the kernel command line reaches the initramfs' insmod (as modprobe's
  # would): INTx guests get one netif queue, spelled with '-' as users often do.
  MODOPT=
  [ "$M" = intx ] && MODOPT=" xen-netfront.max_queues=1"
  cp --sparse=always $IMG/root.ext4 $W/$M.ext4
  cat > $W/$N.cfg <<CFG
name = "$N"
type = "hvm"
memory = 512
vcpus = 2
upcall = "$M"
kernel = "$IMG/vmlinuz"
ramdisk = "$IMG/initrd.cpio"
extra = "root=/dev/xvda panic=-1 xpv.run=selftest xpv.ip=10.0.$i.2/24 xpv.wait=20$MODOPT"
disk = [ 'vdev=xvda, target=$W/$M.ext4' ]
vif = [ 'mac=00:16:3e:00:00:0$i, ip=10.0.$i.2/24' ]
CFG
  {
    $B/xpv create $W/$N.cfg
    echo "XPV-TEST: create rc=$?"
    PINGED=no
    START=$(date +%s)
    LAST=$START
    SIZE=-1
    while [ $(( $(date +%s) - START )) -lt 240 ]; do  # bounded: 4 minutes per boot
      pgrep -f "xpv-vmm .*--name $N " >/dev/null || break
      NOW=$(date +%s)
      S=$(stat -c %s $W/log/console-$N.log 2>/dev/null || echo 0)
      if [ "$S" != "$SIZE" ]; then SIZE=$S; LAST=$NOW; fi
      if [ $(( NOW - LAST )) -ge 90 ]; then  # no console output for 90 s: the boot stalled
        echo "XPV-TEST: stalled: no console output for 90 s"
        break
      fi
      if [ $PINGED = no ] && grep -q "^XPV-WAIT" $W/log/console-$N.log 2>/dev/null; then
        ping -c 3 -W 2 10.0.$i.2 >/dev/null 2>&1 && PINGED=yes
        echo "XPV-TEST: ping $PINGED"
        # `xpv console` replays the console's backlog (stdin at EOF: it only shows output).
        timeout 5 $B/xpv console $N </dev/null 2>/dev/null | grep -c "^XPV-READY" | sed 's/^/XPV-TEST: console-attach /'
      fi
      sleep 1
    done
    echo "XPV-TEST: waited $(( $(date +%s) - START )) s"
    $B/xpv destroy $N >/dev/null
  } > $W/attempt.out 2>&1
}

i=0
for M in "$@"; do
  i=$((i + 1))
  a=0
  while :; do
    a=$((a + 1))
    N=g$M$a
    boot $M $i $N
    grep -q "^XPV-DONE" $W/log/console-$N.log 2>/dev/null && break
    [ $a -ge $ATTEMPTS ] && break
    echo "XPV-TEST: attempt $M $a failed"
    cat $W/attempt.out
    echo "XPV-TEST: console tail"
    tail -15 $W/log/console-$N.log
    echo "XPV-TEST: vmm tail"
    grep -v "hypercall vcpu" $W/log/xpv-vmm-$N.log | tail -5
    echo "XPV-TEST: attempt end"
  done
  echo "XPV-TEST: begin $M"
  echo "XPV-TEST: attempts $a"
  cat $W/attempt.out
  echo "XPV-TEST: console"
  cat $W/log/console-$N.log
  echo "XPV-TEST: vmm"
  grep -v "hypercall vcpu" $W/log/xpv-vmm-$N.log | tail -20
  echo "XPV-TEST: file $(debugfs -R 'cat /root/selftest.txt' $W/$M.ext4 2>/dev/null)"
  rm -f $W/$M.ext4
  echo "XPV-TEST: end $M"
done
$B/xpv down >/dev/null
rm -rf $W
