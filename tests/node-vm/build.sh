#!/usr/bin/env bash
# Everything the real-node tier needs, built once and cached:
#   - Debian packages on the host: QEMU 10+ (TCG; qemu_install), debootstrap, e2fsprogs, socat, ssh
#   - kubelet/kube-controller-manager/kube-scheduler (tests/control-plane/build.sh)
#   - the images pods run (pause, busybox), packed without Docker
#   - the VM images (build-rootfs.sh), one per Debian suite: bookworm (Linux
#     6.1, containerd 1.6) and trixie (Linux 6.12, containerd 1.7)
# The host-side share every node mounts read-only at /mnt/host:
#   $HEADROOM_CACHE_DIR/node-vm/share/{bin/kubelet,images/*.tar}
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${HEADROOM_CACHE_DIR:-$repo/.cache}
kver=${HEADROOM_APISERVER_VERSION:-v1.37.2}
log() { printf 'node-vm: %s\n' "$*" >&2; }

# shellcheck source=../../scripts/lib/packages.sh
. "$repo/scripts/lib/packages.sh"

need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v socat >/dev/null || need+=(socat)
command -v ssh >/dev/null || need+=(openssh-client)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  apt_install "${need[@]}"
fi
qemu_install

start=$(date +%s)
# debootstrap is network and disk, the Go build CPU: run them side by side
# (both suites at once; each keeps its own cached image).
suites=(bookworm trixie)
declare -A rootfs_log rootfs_pid
for s in "${suites[@]}"; do
  rootfs_log[$s]=$(mktemp)
  bash "$here/build-rootfs.sh" "$s" > "${rootfs_log[$s]}" 2>&1 &
  rootfs_pid[$s]=$!
done
bash "$repo/tests/control-plane/build.sh"

share=$cache/node-vm/share
mkdir -p "$share/bin" "$share/images"
ln -f "$cache/bin/kubelet-$kver" "$share/bin/kubelet"

# Images: pause (static C) and busybox-static from Debian (for workloads).
imgkey=$(cat "$here/images/"* | sha256sum | cut -c1-12)
if [ ! -f "$share/images/.key-$imgkey" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  gcc -static -Os -s -o "$tmp/pause" "$here/images/pause.c"
  (cd "$tmp" && apt-get download busybox-static >/dev/null 2>&1) \
    || (cd "$tmp" && as_root apt-get update -q >/dev/null && apt-get download busybox-static >/dev/null)
  dpkg-deb -x "$tmp"/busybox-static_*.deb "$tmp/bb"
  rm -f "$share/images/"*.tar "$share/images/".key-*
  python3 "$here/images/mkimage.py" --name headroom.local/pause:1 --out "$share/images/pause.tar" \
    --entrypoint '["/pause"]' --file "$tmp/pause:/pause:0755"
  python3 "$here/images/mkimage.py" --name headroom.local/busybox:1 --out "$share/images/busybox.tar" \
    --entrypoint '["/bin/sh"]' --file "$tmp/bb/bin/busybox:/bin/busybox:0755" \
    --link /bin/sh=busybox --link /bin/sleep=busybox --link /bin/cat=busybox
  touch "$share/images/.key-$imgkey"
fi

for s in "${suites[@]}"; do
  if ! wait "${rootfs_pid[$s]}"; then cat "${rootfs_log[$s]}" >&2; rm -f "${rootfs_log[$s]}"; exit 1; fi
  grep -v '^/' "${rootfs_log[$s]}" >&2 || true
  rm -f "${rootfs_log[$s]}"
done
log "ready in $(( $(date +%s) - start ))s (share $share)"
