# Sourced by the testbed's measurement scripts (exits-per-ping.sh, cpu-under-load.sh): the guest
# each VMM boots there, so that every script compares the same two.

# xpv_guest NAME IMAGE_DIR DISK CMDLINE: a fresh copy of the image's root disk at DISK and the xl
# config of xpv's guest on stdout — 512 MiB, 2 vCPUs, callback upcalls, root /dev/xvda on DISK,
# one vif 10.0.0.2/24 (the host's end 10.0.0.1). CMDLINE's XVDA stands for the root device.
xpv_guest() {
  cp --sparse=always "$2/root.ext4" "$3"
  cat <<CFG
name = "$1"
type = "hvm"
memory = 512
vcpus = 2
upcall = "callback"
kernel = "$2/vmlinuz"
ramdisk = "$2/initrd.cpio"
extra = "$(echo "$4" | sed 's/XVDA/\/dev\/xvda/')"
disk = [ 'vdev=xvda, target=$3' ]
vif = [ 'mac=00:16:3e:00:00:01, ip=10.0.0.2/24' ]
CFG
}

# qemu_guest NAME IMAGE_DIR DISK CMDLINE CONSOLE_LOG: QEMU 7.2's guest of the same image, started
# in the background (at most 400 s): a fresh copy of the root disk at DISK as virtio-blk, virtio-net
# with vhost on the TAP xpvtap0 (the caller makes it), its vCPU threads named (debug-threads).
# XPV_QEMU_TIMEOUT (seconds, default 400) bounds it.
qemu_guest() {
  cp --sparse=always "$2/root.ext4" "$3"
  timeout "${XPV_QEMU_TIMEOUT:-400}" qemu-system-x86_64 -enable-kvm -cpu host -m 512 -smp 2 -nodefaults -display none \
    -monitor none -name "$1,debug-threads=on" -serial "file:$5" \
    -kernel "$2/vmlinuz" -initrd "$2/initrd.cpio" -append "console=ttyS0 $(echo "$4" | sed 's/XVDA/\/dev\/vda/')" \
    -drive "file=$3,if=virtio,format=raw,cache=writeback" \
    -netdev tap,id=n0,ifname=xpvtap0,script=no,downscript=no,vhost=on -device virtio-net-pci,netdev=n0 -no-reboot &
}

# check_inputs ME IMAGE_DIR OUT_DIR ORDER LETTERS: what every measurement script checks first —
# the image's three files, a writable OUT_DIR, ORDER a sequence of at most 8 of LETTERS (e.g.
# xqy), and XPV_B when ORDER has a y. Exits 2 with one line naming what is wrong.
check_inputs() {
  for f in vmlinuz initrd.cpio root.ext4; do
    [ -f "$2/$f" ] || { echo "$1: $2/$f is missing (\`xpv image build\` makes the image)"; exit 2; }
  done
  [ -d "$3" ] && [ -w "$3" ] || { echo "$1: $3 is not a writable directory"; exit 2; }
  case "$4" in ''|*[!$5]*) echo "$1: ORDER '$4' is not a sequence of the letters $5"; exit 2 ;; esac
  [ ${#4} -le 8 ] || { echo "$1: ORDER '$4' has more than 8 boots"; exit 2; }
  case "$4" in *y*) [ -x "${XPV_B:-}" ] || { echo "$1: ORDER has y: set XPV_B to the second build's xpv"; exit 2; } ;; esac
}

# second_build_boot N: the caller's boot_x N y under XPV_B's own daemons (XPV's stopped for it),
# then XPV's daemons again (exit 1 if they do not start). Returns 1 when XPV_B's `up` failed
# (its log: $OUT/up-yN.log), without booting.
second_build_boot() {
  $XPV down --force > /dev/null 2>&1
  sb_rc=0
  if $XPV_B up > "$OUT/up-y$1.log" 2>&1; then
    sb_xpv=$XPV; XPV=$XPV_B; boot_x "$1" y; XPV=$sb_xpv
  else
    sb_rc=1
  fi
  $XPV_B down --force > /dev/null 2>&1
  $XPV up > "$OUT/up.log" 2>&1 || { echo "xpv up failed: $OUT/up.log"; exit 1; }
  return $sb_rc
}
