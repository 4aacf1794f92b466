#!/bin/busybox sh
# xpv guest image — the initramfs /init (frontends/guest-image/initrd-init.sh; README.md there
# documents the cmdline protocol and the markers). PID 1 until switch_root.
#
#   mount proc/sys/devtmpfs → insmod /etc/xpv/modules (dependency order; NAME.PARAM=VALUE on the
#   kernel command line passed to module NAME, as modprobe does) → wait for root= (bounded)
#   → mount it ext4 rw at /newroot → move /dev /proc /sys → switch_root to its /sbin/init.
# Any failure: one "XPV-FATAL initrd: ..." line on every console, then poweroff -f.
/bin/busybox mkdir -p /proc /sys /dev /newroot /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

# Consoles: ttyS0 and hvc0, each if it exists and opens (an absent UART fails to open).
CONS=
for c in /dev/ttyS0 /dev/hvc0; do
  [ -c "$c" ] && (: > "$c") 2>/dev/null && CONS="$CONS $c"
done
[ -n "$CONS" ] || CONS=/dev/console
say() { for c in $CONS; do echo "$*" > "$c" 2>/dev/null; done; }
halt_now() {
  sync
  poweroff -f
  echo o > /proc/sysrq-trigger 2>/dev/null
  sleep 10
  exit 1  # PID 1 exiting panics the kernel: never a silent hang with panic=-1 on the cmdline
}
fatal() { say "XPV-FATAL initrd: $*"; halt_now; }

ROOT=
ROOTWAIT=30
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    root=*) ROOT="${arg#root=}" ;;
    xpv.rootwait=*) ROOTWAIT="${arg#xpv.rootwait=}" ;;
  esac
done
case "$ROOTWAIT" in ''|*[!0-9]*) fatal "xpv.rootwait=$ROOTWAIT is not a number of seconds" ;; esac
case "$ROOT" in
  /dev/*) ;;
  '') fatal "no root= on the kernel command line (e.g. root=/dev/xvda or root=/dev/vda)" ;;
  *) fatal "root=$ROOT: only /dev/NAME is supported" ;;
esac

# Module parameters on the kernel command line ("xen_netfront.max_queues=1"): insmod, unlike
# modprobe, does not look there, so they are collected here as "module param=value" lines, the
# module's name with '-' read as '_' (the kernel's own spelling).
MODPARAMS=$(tr ' ' '\n' < /proc/cmdline | awk -F. 'NF > 1 && $1 ~ /^[A-Za-z0-9_-]+$/ && index($0, "=") > length($1) + 2 {
  m = $1; gsub("-", "_", m); print m, substr($0, length($1) + 2) }')
modparams() {
  [ -n "$MODPARAMS" ] || return 0
  echo "$MODPARAMS" | awk -v m="$1" 'BEGIN { gsub("-", "_", m) } $1 == m { printf "%s%s", sep, $2; sep = " " }'
}

KVER=$(cat /etc/xpv/kernel-version)
[ "$KVER" = "$(uname -r)" ] || say "xpv-initrd: warning: modules are for $KVER, the kernel is $(uname -r)"
while read -r name rel; do
  [ -n "$name" ] || continue
  grep -q "^$name " /proc/modules && continue
  params=$(modparams "$name")
  # shellcheck disable=SC2086  # one word per parameter
  if err=$(insmod "/lib/modules/$KVER/$rel" $params 2>&1); then
    say "xpv-initrd: loaded $name${params:+ ($params)}"
  else
    say "xpv-initrd: not loaded: $name (${err##*: })"
  fi
done < /etc/xpv/modules
say "XPV-INITRD-MODULES $(cut -d' ' -f1 /proc/modules | tr '\n' ' ')"

i=0
while [ ! -b "$ROOT" ]; do
  if [ "$i" -ge $((ROOTWAIT * 10)) ]; then
    fatal "root device $ROOT did not appear within $ROOTWAIT s (block devices: $(ls /sys/class/block 2>/dev/null | tr '\n' ' '))"
  fi
  [ $((i % 50)) -eq 0 ] && say "xpv-initrd: waiting for root device $ROOT (up to $ROOTWAIT s)"
  usleep 100000
  i=$((i + 1))
done

mount -t ext4 -o rw "$ROOT" /newroot ||
  fatal "cannot mount $ROOT as ext4 ($(dmesg | grep -i -e ext4 -e crc32c | tail -n 1))"
[ -x /newroot/sbin/init ] || fatal "$ROOT has no executable /sbin/init"
for d in dev proc sys; do
  [ -d "/newroot/$d" ] || fatal "$ROOT has no /$d directory"
done
mount --move /dev /newroot/dev || fatal "cannot move /dev to the root file system"
mount --move /proc /newroot/proc || fatal "cannot move /proc to the root file system"
mount --move /sys /newroot/sys || fatal "cannot move /sys to the root file system"
say "XPV-INITRD-ROOT $ROOT"
exec switch_root /newroot /sbin/init
