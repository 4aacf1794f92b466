#!/bin/sh
# Runs inside `xpv testbed` (L1, real KVM). Usage: hvm_session.sh BIN_DIR IMAGE_DIR MODE...
# For each upcall MODE (vector, intx): an HVM guest of Debian's stock kernel with a PV
# root disk (xvda, a copy of the image's root.ext4) and a PV NIC, through the real daemons and
# toolstack; the guest's init runs its selftest, the host pings it, the guest powers off. Prints
# one section per mode between "XPV-TEST: begin MODE" and "XPV-TEST: end MODE" for the test.
B=$1
IMG=$2
shift 2
W=/tmp/xpv-hvm-test
rm -rf $W
mkdir -p $W/run $W/log
export XPV_RUN_DIR=$W/run XPV_LOG_DIR=$W/log XENSTORED_PATH=$W/run/xenstored.sock XPV_NETNS_DIR=$W/netns
$B/xpv up >/dev/null || echo "XPV-TEST: up failed"
i=0
for M in "$@"; do
  i=$((i + 1))
  N=g$M
  cp --sparse=always $IMG/root.ext4 $W/$M.ext4
  cat > $W/$M.cfg <<CFG
name = "$N"
type = "hvm"
memory = 512
vcpus = 2
upcall = "$M"
kernel = "$IMG/vmlinuz"
ramdisk = "$IMG/initrd.cpio"
extra = "root=/dev/xvda panic=-1 xpv.run=selftest xpv.ip=10.0.$i.2/24 xpv.wait=20"
disk = [ 'vdev=xvda, target=$W/$M.ext4' ]
vif = [ 'mac=00:16:3e:00:00:0$i, ip=10.0.$i.2/24' ]
CFG
  echo "XPV-TEST: begin $M"
  $B/xpv create $W/$M.cfg
  echo "XPV-TEST: create rc=$?"
  PINGED=no
  START=$(date +%s)
  while [ $(( $(date +%s) - START )) -lt 240 ]; do  # bounded: 4 minutes per boot
    pgrep -f "xpv-vmm .*--name $N " >/dev/null || break
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
