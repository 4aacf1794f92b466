// The L1 /init script: PID 1 of the testbed VM, a busybox shell script. It is written into the
// cached L1 initramfs (its hash is part of the cache name, so editing it rebuilds the initramfs).
//
// Contract with the host (testbed.cpp), over the 9p share "xpvctl" mounted at /ctl:
//   in:  /ctl/env     shell assignments: XPV_SHARE (path of the writable share)
//        /ctl/cmd.sh  the command, run with /bin/sh inside the chroot of the host's root
//   out: /ctl/ready   created once KVM is up and the chroot is ready (L1 ready time)
//        /ctl/error   one line when the testbed failed inside L1
//        /ctl/rc      the command's exit status
// ttyS0 carries the kernel console and these log lines; ttyS1 carries only the command's output.
#include "testbed/testbed.h"

namespace xpv::testbed {

const char* const kL1Init = R"XPVINIT(#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /ctl /host /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

log() { echo "xpv-testbed(L1): $*" > /dev/ttyS0; }
die() {
  log "$*"
  if [ -d /ctl/. ] && mountpoint -q /ctl; then
    echo "$*" > /ctl/error
    echo 125 > /ctl/rc
    sync
    umount /ctl
  fi
  poweroff -f
}

for m in $(cat /modules.order); do
  # A module's parameters from L1's kernel command line (name.param=value, as modprobe takes
  # them; XPV_TESTBED_APPEND adds them): insmod reads none itself.
  name=$(echo "${m%%.ko*}" | tr - _)
  args=$(tr ' ' '\n' < /proc/cmdline | sed -n "s/^$name\.//p")
  insmod "/modules/$m" $args 2>/dev/ttyS0 || log "insmod $m $args failed"
done

mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 xpvctl /ctl || die "cannot mount the control share"
[ -c /dev/kvm ] || die "KVM did not come up in L1: no /dev/kvm after loading kvm and kvm-amd ($(dmesg | grep -i -e kvm -e svm | tail -n 2 | tr '\n' ' '))"
. /ctl/env

mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /host || die "cannot mount the host root over 9p"
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
# The unified cgroup hierarchy where Debian 12's systemd mounts it (`xpv sched-credit`'s cgroups).
mount -t cgroup2 cgroup2 /host/sys/fs/cgroup || log "cannot mount cgroup2 at /sys/fs/cgroup"
mount -t devtmpfs devtmpfs /host/dev || die "cannot mount /dev in the chroot"
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts devpts /host/dev/pts
mount -t tmpfs tmpfs /host/dev/shm
# A writable /tmp for the command, with the host's /tmp still visible (read-only) underneath:
# every top-level directory of the host's /tmp is bound back into it, so a checkout, a build or
# an input that lives in /tmp (CI clones may) is found at its usual path.
mkdir -p /hosttmp
mount -o bind /host/tmp /hosttmp || die "cannot keep the host's /tmp visible"
mount -t tmpfs tmpfs /host/tmp || die "cannot mount /tmp in the chroot"
for d in /hosttmp/* /hosttmp/.[!.]*; do
  [ -d "$d" ] || continue
  b="${d#/hosttmp/}"
  mkdir -p "/host/tmp/$b" && mount -o bind "$d" "/host/tmp/$b" || log "cannot show /tmp/$b in L1"
done
mount -t tmpfs tmpfs /host/run
if [ -n "$XPV_SHARE" ]; then
  mkdir -p "/host$XPV_SHARE" 2>/dev/null
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share "/host$XPV_SHARE" || die "cannot mount the share at $XPV_SHARE"
fi
cp /ctl/cmd.sh /host/tmp/.xpv-testbed-cmd.sh || die "cannot copy the command into the chroot"
stty -F /dev/ttyS1 raw -echo 2>/dev/null

touch /ctl/ready
chroot /host /bin/sh /tmp/.xpv-testbed-cmd.sh </dev/null >/dev/ttyS1 2>&1
rc=$?
echo "$rc" > /ctl/rc
sync
[ -n "$XPV_SHARE" ] && umount "/host$XPV_SHARE"
umount /ctl
poweroff -f
)XPVINIT";

}  // namespace xpv::testbed
