#!/usr/bin/env bash
# Builds a real-node VM image: a Debian root filesystem of one suite
# (`build-rootfs.sh [bookworm|trixie]`, default bookworm)
# (debootstrap from the mirror this machine's apt sources name) with systemd,
# containerd, runc, the CNI plugins and the Debian kernel, packed as an ext4
# disk image, plus the kernel and initrd to boot it with.
#
# Everything node-specific (kubelet config, cgroup driver, certificates) comes
# at boot from a 9p share the test harness writes (tests/src/node_vm/), so one
# image serves every node.
#
# Two cached steps, so that editing a unit file does not redo debootstrap:
#   $HEADROOM_CACHE_DIR/node-vm/base-<suite+packages key>/rootfs     (debootstrap)
#   $HEADROOM_CACHE_DIR/node-vm/image-<suite>-<key>/{disk.img,vmlinuz,initrd.img,id_ed25519}
# where <key> hashes this script and rootfs/. node-vm/current-<suite> names
# the image (node-vm/current too, for bookworm). Each suite keeps its own
# newest image: building one suite never deletes the other's.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${HEADROOM_CACHE_DIR:-$repo/.cache}
suite=${1:-bookworm}
case "$suite" in bookworm|trixie) ;; *) echo "unknown suite $suite" >&2; exit 2 ;; esac
log() { printf 'node-vm image (%s): %s\n' "$suite" "$*" >&2; }

packages=systemd,systemd-sysv,dbus,udev,kmod,containerd,runc,containernetworking-plugins
packages+=,iproute2,iptables,busybox-static,ca-certificates,linux-image-amd64
packages+=,initramfs-tools,openssh-server,procps,conntrack,ethtool,socat

# shellcheck source=../../scripts/lib/packages.sh
. "$repo/scripts/lib/packages.sh"
mirror=$(apt_mirror)

mkdir -p "$cache/node-vm"
key=$(cat "$0" $(find "$here/rootfs" -type f | sort) | sha256sum | cut -c1-12)
out=$cache/node-vm/image-$suite-$key
name_current() {
  echo "$out" > "$cache/node-vm/current-$suite"
  if [ "$suite" = bookworm ]; then echo "$out" > "$cache/node-vm/current"; fi
}
if [ -f "$out/disk.img" ] && [ -f "$out/vmlinuz" ] && [ -f "$out/initrd.img" ]; then
  name_current
  log "cached ($out)"; echo "$out"; exit 0
fi
start=$(date +%s)

basekey=$(echo "$suite $packages" | sha256sum | cut -c1-12)
base=$cache/node-vm/base-$basekey
if [ ! -f "$base/.done" ]; then
  rm -rf "$base" && mkdir -p "$base"
  log "debootstrap $suite from $mirror"
  debootstrap --variant=minbase --include="$packages" "$suite" "$base/rootfs" "$mirror" \
    > "$base/debootstrap.log" 2>&1 || { tail -n 30 "$base/debootstrap.log" >&2; exit 1; }
  touch "$base/.done"
  log "debootstrap done in $(( $(date +%s) - start ))s"
fi

# debootstrap can leave the chroot's /proc mounted (seen on a fresh CI host):
# copying it would copy the host's /proc (tens of GB) into the image.
unmount_under() {
  findmnt -rn -o TARGET | awk -v p="$1/" 'index($0, p) == 1' | sort -r \
    | while read -r m; do umount -l "$m" 2>/dev/null || true; done
}
unmount_under "$base/rootfs"

work=$cache/node-vm/work-$suite-$key
rm -rf "$work" && mkdir -p "$work"
root=$work/rootfs
cp -ax "$base/rootfs" "$root"

# Files of the image (units, networkd, fstab, sysctl, boot-time setup).
cp -a "$here/rootfs/." "$root/"
find "$root/mnt" -name .keep -delete
chmod 0755 "$root/usr/local/sbin/"*

# Root logs in over ssh with a key made for this image only.
ssh-keygen -q -t ed25519 -N '' -C headroom-node-vm -f "$work/id_ed25519"
install -d -m 0700 "$root/root/.ssh"
install -m 0600 "$work/id_ed25519.pub" "$root/root/.ssh/authorized_keys"

echo 'nameserver 10.0.2.3' > "$root/etc/resolv.conf"
: > "$root/etc/machine-id"   # systemd makes one per boot (the disk is a snapshot)
# Units enabled the way `systemctl enable` would; timers and services a
# throwaway node never needs are masked to shorten the emulated boot.
wants=$root/etc/systemd/system/multi-user.target.wants
mkdir -p "$wants"
ln -sf /lib/systemd/system/systemd-networkd.service "$wants/"
for u in headroom-node headroom-images kubelet; do
  ln -sf "/etc/systemd/system/$u.service" "$wants/"
done
mkdir -p "$root/etc/systemd/system/sysinit.target.wants"
ln -sf /etc/systemd/system/headroom-cfs-bandwidth-key.service \
  "$root/etc/systemd/system/sysinit.target.wants/"
for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
         fstrim.timer systemd-networkd-wait-online.service getty@tty1.service \
         systemd-timesyncd.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$u"
done

kernel=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -n1)
initrd=$(ls "$root"/boot/initrd.img-* | sort -V | tail -n1)
cp "$kernel" "$work/vmlinuz"
cp "$initrd" "$work/initrd.img"
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*

log "disk image"
mkfs.ext4 -q -F -L headroom-node -d "$root" "$work/disk.img" 4G
rm -rf "$root"
rm -rf "$out" && mv "$work" "$out"
name_current
# Older images of this suite (other keys) are dead weight; so are images of
# the layout before suites (image-<key>, 12 hex digits). Other suites stay.
find "$cache/node-vm" -maxdepth 1 -regextype posix-extended \( -name "image-$suite-*" -o -regex '.*/image-[0-9a-f]{12}' \) \
  ! -name "image-$suite-$key" -exec rm -rf {} +
log "built in $(( $(date +%s) - start ))s: $out"
echo "$out"
