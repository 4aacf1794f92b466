# Sourced by the testbed's measurement scripts (exits-per-ping.sh, cpu-under-load.sh): the guest
# both VMMs boot there, so that every script boots the same one.

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
