#!/usr/bin/env bash
# The two Debian trixie root filesystems the local kind run needs, each by
# debootstrap from the mirror this machine's apt sources name (no image
# registry), each cached under its own key:
#
#   build-rootfs.sh vm     the Docker VM: systemd, docker.io (dockerd, its
#                          containerd and runc), the Debian kernel, sshd; packed
#                          as an ext4 disk image with its kernel and initrd:
#                          $HEADROOM_CACHE_DIR/kind/vm-<key>/{disk.img,vmlinuz,initrd.img,id_ed25519}
#   build-rootfs.sh node   the kind node's base (what kind's images/base
#                          Dockerfile installs, from Debian: systemd, containerd,
#                          runc, the CNI plugins, iptables, nftables ...), kind's
#                          own images/base/files from the kind module
#                          ($KIND_MODULE_DIR) on top, as a tarball for `docker import`:
#                          $HEADROOM_CACHE_DIR/kind/node-base-<key>/rootfs.tar, and
#                          slim.tar (the same Debian less init, containerd and docs:
#                          the layer under the kube-proxy and CNI images)
#
# Prints the output directory. The node-vm images (tests/node-vm/build-rootfs.sh)
# are separate and untouched: their keys are CI's cache keys.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${HEADROOM_CACHE_DIR:-$repo/.cache}
what=${1:?usage: build-rootfs.sh vm|node}
suite=trixie
log() { printf 'kind rootfs (%s): %s\n' "$what" "$*" >&2; }

case "$what" in
  vm)
    packages=systemd,systemd-sysv,dbus,udev,kmod,docker.io,containerd,runc,tini
    packages+=,iproute2,iptables,ca-certificates,linux-image-amd64,initramfs-tools
    packages+=,openssh-server,procps,e2fsprogs
    overlay=$here/vm-rootfs
    ;;
  node)
    # kind v0.33.0 images/base/Dockerfile's clean-install list, less
    # fuse-overlayfs (rootless), nfs-common and open-iscsi (storage drivers),
    # plus what its multi-stage build compiles, here from Debian:
    # containerd, runc, the CNI plugins.
    packages=systemd,systemd-sysv,dbus,conntrack,iptables,nftables,iproute2,ethtool
    packages+=,util-linux,mount,kmod,libseccomp2,pigz,e2fsprogs,bash,ca-certificates
    packages+=,curl,jq,procps,containerd,runc,containernetworking-plugins,socat
    : "${KIND_MODULE_DIR:?KIND_MODULE_DIR must be the sigs.k8s.io/kind module directory}"
    overlay=$here/node-rootfs
    ;;
  *) echo "usage: build-rootfs.sh vm|node" >&2; exit 2 ;;
esac

# shellcheck source=../../scripts/lib/packages.sh
. "$repo/scripts/lib/packages.sh"
mirror=$(apt_mirror)

mkdir -p "$cache/kind"
keyfiles=("$0")
while IFS= read -r f; do keyfiles+=("$f"); done < <(find "$overlay" -type f | sort)
if [ "$what" = node ]; then
  while IFS= read -r f; do keyfiles+=("$f"); done < <(find "$KIND_MODULE_DIR/images/base/files" -type f | sort)
fi
key=$(cat "${keyfiles[@]}" | sha256sum | cut -c1-12)
out=$cache/kind/$what-$key
[ "$what" = node ] && out=$cache/kind/node-base-$key
if [ -f "$out/.done" ]; then log "cached ($out)"; echo "$out"; exit 0; fi
start=$(date +%s)

basekey=$(echo "$suite $packages" | sha256sum | cut -c1-12)
base=$cache/kind/debootstrap-$basekey
if [ ! -f "$base/.done" ]; then
  rm -rf "$base" && mkdir -p "$base"
  log "debootstrap $suite from $mirror"
  nice debootstrap --variant=minbase --include="$packages" "$suite" "$base/rootfs" "$mirror" \
    > "$base/debootstrap.log" 2>&1 || { tail -n 30 "$base/debootstrap.log" >&2; exit 1; }
  touch "$base/.done"
  log "debootstrap done in $(( $(date +%s) - start ))s"
fi
# debootstrap can leave the chroot's /proc mounted.
findmnt -rn -o TARGET | awk -v p="$base/rootfs/" 'index($0, p) == 1' | sort -r \
  | while read -r m; do umount -l "$m" 2>/dev/null || true; done

work=$cache/kind/work-$what-$key
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
cp -ax "$base/rootfs" "$root"
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
: > "$root/etc/machine-id"

if [ "$what" = vm ]; then
  cp -a "$overlay/." "$root/"
  ssh-keygen -q -t ed25519 -N '' -C headroom-kind-vm -f "$work/id_ed25519"
  install -d -m 0700 "$root/root/.ssh"
  install -m 0600 "$work/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
  echo 'nameserver 10.0.2.3' > "$root/etc/resolv.conf"
  echo headroom-kind-vm > "$root/etc/hostname"
  wants=$root/etc/systemd/system/multi-user.target.wants
  mkdir -p "$wants"
  ln -sf /lib/systemd/system/systemd-networkd.service "$wants/"
  ln -sf /etc/systemd/system/headroom-loopback-forward.service "$wants/"
  for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
           fstrim.timer systemd-networkd-wait-online.service getty@tty1.service \
           systemd-timesyncd.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$u"
  done
  cp "$(ls "$root"/boot/vmlinuz-* | sort -V | tail -n1)" "$work/vmlinuz"
  cp "$(ls "$root"/boot/initrd.img-* | sort -V | tail -n1)" "$work/initrd.img"
  log "disk image"
  # Sparse: the node image, three nodes' containers and their images fit in 24G.
  mkfs.ext4 -q -F -L headroom-kind -d "$root" "$work/disk.img" 24G
else
  files=$KIND_MODULE_DIR/images/base/files
  # What kind's images/base Dockerfile COPYs and RUNs, step for step.
  install -d -m 0755 "$root/kind" "$root/kind/bin" "$root/LICENSES" "$root/etc/kubernetes/manifests"
  install -m 0755 "$files"/usr/local/bin/* "$root/usr/local/bin/"
  cp -r "$files/kind/." "$root/kind/"; chmod -R a+rX,go-w "$root/kind"; chmod 0755 "$root"/kind/bin/*
  install -m 0644 "$files"/LICENSES/* "$root/LICENSES/"
  install -m 0644 "$files"/etc/crictl.yaml "$root/etc/"
  install -d "$root/etc/containerd" "$root/etc/default" "$root/etc/sysctl.d" "$root/etc/systemd/system/kubelet.service.d"
  install -m 0644 "$files"/etc/containerd/* "$root/etc/containerd/"
  install -m 0644 "$files"/etc/default/* "$root/etc/default/"
  install -m 0644 "$files"/etc/sysctl.d/* "$root/etc/sysctl.d/"
  find "$files/etc/systemd/system" -maxdepth 1 -type f -exec install -m 0644 {} "$root/etc/systemd/system/" \;
  install -m 0644 "$files"/etc/systemd/system/kubelet.service.d/* "$root/etc/systemd/system/kubelet.service.d/"
  find "$root/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
  rm -f "$root"/lib/systemd/system/multi-user.target.wants/* "$root"/etc/systemd/system/*.wants/* \
    "$root"/lib/systemd/system/local-fs.target.wants/* "$root"/lib/systemd/system/sockets.target.wants/*udev* \
    "$root"/lib/systemd/system/sockets.target.wants/*initctl* "$root"/lib/systemd/system/basic.target.wants/*
  echo "ReadKMsg=no" >> "$root/etc/systemd/journald.conf"
  ln -sf /usr/lib/systemd/systemd "$root/sbin/init"
  # `systemctl enable kubelet containerd undo-mount-hacks`, `systemctl mask systemd-binfmt`.
  mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
  for u in kubelet containerd undo-mount-hacks; do
    ln -sf "/etc/systemd/system/$u.service" "$root/etc/systemd/system/multi-user.target.wants/"
  done
  ln -sf /dev/null "$root/etc/systemd/system/systemd-binfmt.service"
  # Where kind's build puts what it compiles, Debian's binaries.
  cp -a "$overlay/." "$root/"
  for b in containerd ctr containerd-shim-runc-v2; do ln -sf "/usr/bin/$b" "$root/usr/local/bin/$b"; done
  ln -sf /usr/sbin/runc "$root/usr/local/sbin/runc"
  install -d "$root/opt/cni"
  ln -sfn /usr/lib/cni "$root/opt/cni/bin"
  rm -f "$root/etc/resolv.conf" "$root/etc/hostname"
  log "tarballs"
  tar -C "$root" --numeric-owner --xattrs -cf "$work/rootfs.tar" .
  # The same Debian, less init, containerd and documentation: the one layer
  # under the kube-proxy and CNI images (iptables, nft, conntrack, ip, bash).
  tar -C "$root" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
    --exclude=./usr/share/doc --exclude=./usr/share/man --exclude=./usr/share/locale \
    --exclude=./usr/share/info --exclude=./usr/lib/systemd --exclude=./lib/systemd \
    --exclude='./usr/bin/containerd*' --exclude=./usr/bin/ctr --exclude=./usr/sbin/runc \
    --exclude=./usr/lib/cni --exclude=./var/cache --exclude=./var/log --exclude=./kind \
    -cf "$work/slim.tar" .
fi
rm -rf "$root"
touch "$work/.done"
trap - EXIT
rm -rf "$out" && mv "$work" "$out"
find "$cache/kind" -maxdepth 1 -name "$(basename "${out%-*}")-*" ! -name "$(basename "$out")" -exec rm -rf {} +
log "built in $(( $(date +%s) - start ))s: $out"
echo "$out"
