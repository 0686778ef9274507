#!/usr/bin/env bash
# Everything the local kind run (tests/kind/local.sh) needs, built here and
# cached, with no image registry:
#   - kind v0.33.0 from its Go module (pinned: kind-cli/go.{mod,sum}), with
#     one constant changed for emulation (build_kind says which and why)
#   - kubeadm and kube-proxy v1.37.2 from k8s.io/kubernetes (pinned:
#     kube-extra/go.{mod,sum}); kubelet, kubectl, kube-apiserver,
#     kube-controller-manager, kube-scheduler and etcd from
#     tests/control-plane/build.sh
#   - the Docker VM's disk and the kind node base (build-rootfs.sh vm|node)
#   - the images kubeadm asks for, under the names it asks for, packed as
#     Docker archives without Docker (mkimage-layers.py): kube-apiserver,
#     kube-controller-manager, kube-scheduler, kube-proxy, etcd (v3.6.16, under
#     its own tag: see below), pause (kind's sandbox image name); plus the CNI
#     (headroom-kind-cni, standing in for kindnetd) and busybox. CoreDNS is not
#     built (the local config disables kubeadm's DNS addon).
#   - the kind node image, assembled in the VM's Docker the way kind's
#     `build node-image` does (pkg/build/nodeimage/buildcontext.go: a container
#     of the base image, the binaries into /usr/bin, the images imported into its
#     containerd, `docker commit`), kept in a qcow2 overlay of the VM disk so
#     that a warm run boots with the node image already in /var/lib/docker.
#
#   tests/kind/build.sh            # prints nothing but logs; ends with the cache paths
#   tests/kind/build.sh --pin      # re-resolve and rewrite kind-cli/ and kube-extra/ pins
#
# Cache ($HEADROOM_CACHE_DIR/kind/): vm-<key>/, node-base-<key>/, images-<key>/,
# baked-<key>/disk.qcow2 (+ `current`, naming the baked disk and its VM).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${HEADROOM_CACHE_DIR:-$repo/.cache}
export HEADROOM_CACHE_DIR=$cache
kver=v1.37.2
kind_version=v0.33.0
pin=
[ "${1:-}" = --pin ] && pin=1
log() { printf 'kind build: %s\n' "$*" >&2; }
start=$(date +%s)

# shellcheck source=../../scripts/lib/packages.sh
. "$repo/scripts/lib/packages.sh"
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v ssh >/dev/null || need+=(openssh-client)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v setpriv >/dev/null || need+=(util-linux)
# The Docker CLI (Debian's docker.io; only its client is used here).
command -v docker >/dev/null || need+=(docker.io)
if [ ${#need[@]} -gt 0 ]; then log "installing ${need[*]}"; apt_install "${need[@]}"; fi
qemu_install

export GOTOOLCHAIN=local CGO_ENABLED=0
mkdir -p "$cache/bin" "$cache/src" "$cache/kind"

# ---- Go: kind, kubeadm, kube-proxy (and the control plane's binaries)
# Fills the current directory with wrapper module $1 (go.mod/go.sum pinned
# beside this script), or with --pin resolves it afresh from the commands in
# "${@:2}" and writes the pin back.
wrapper_module() {
  local dir=$1; shift
  cp "$here/$dir/tools.go" .
  if [ -z "$pin" ]; then
    cp "$here/$dir/go.mod" "$here/$dir/go.sum" .
    export GOFLAGS=-mod=readonly
    return
  fi
  export GOFLAGS=-mod=mod
  go mod init "headroom.test/$dir" >/dev/null 2>&1
  "$@"
  go mod tidy >/dev/null
  cp go.mod go.sum "$here/$dir/"
  log "$dir: pinned into $here/$dir"
}

# One change to kind, for emulation: kind waits 30 s (a constant) for a new
# node's systemd to log "Reached target Multi-User System"; a node container
# here takes about 60 s alone, more with three booting at once. The build
# copies the module (as go.sum verifies it), replaces that constant with
# $kind_node_wait (the sed must match exactly once) and builds the copy
# through a `replace`; nothing else differs.
kind_node_wait=600
build_kind() {
  local out=$cache/bin/kind-$kind_version-wait${kind_node_wait}s
  if [ -x "$out" ] && [ -z "$pin" ]; then log "kind $kind_version (node wait ${kind_node_wait}s): cached"; return; fi
  local work=$cache/src/kind-cli-$kind_version
  rm -rf "$work" && mkdir -p "$work"
  (
    cd "$work"
    wrapper_module kind-cli sh -c "printf '\nrequire sigs.k8s.io/kind $kind_version\n' >> go.mod"
    [ -z "$pin" ] || return 0
    go mod download sigs.k8s.io/kind   # verifies the module against go.sum
    cp -r "$(go list -m -f '{{.Dir}}' sigs.k8s.io/kind)" kind-src && chmod -R u+w kind-src
    local f=kind-src/pkg/cluster/internal/providers/docker/provision.go
    sed -i "s/logCtx, logCancel := context.WithTimeout(context.Background(), 30\*time.Second)/logCtx, logCancel := context.WithTimeout(context.Background(), ${kind_node_wait}*time.Second)/" "$f"
    [ "$(grep -c "${kind_node_wait}\*time.Second" "$f")" = 1 ] \
      || { log "kind $kind_version: the node wait to patch is not in $f"; exit 1; }
    go mod edit -replace sigs.k8s.io/kind=./kind-src
    log "kind $kind_version: building (node wait ${kind_node_wait}s)"
    nice go build -trimpath -o "$out.tmp" -ldflags "-s -w" sigs.k8s.io/kind
  )
  [ -n "$pin" ] || mv "$out.tmp" "$out"
}

# Staging modules replaced by their published v0.X.Y (as tests/control-plane/build.sh).
require_kubernetes() {
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$kver" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
  { echo; echo "require k8s.io/kubernetes $kver"
    grep -E '^\s*k8s\.io/[a-z0-9/-]+ => \./staging/' "$gomod" \
      | awk -v v="v0.${kver#v1.}" '{print "replace " $1 " => " $1 " " v}'; } >> go.mod
}

build_kube_extra() {
  local cmds=(kubeadm kube-proxy) missing=() c
  for c in "${cmds[@]}"; do [ -x "$cache/bin/$c-$kver" ] && [ -z "$pin" ] || missing+=("$c"); done
  if [ ${#missing[@]} -eq 0 ]; then log "kubeadm, kube-proxy $kver: cached"; return; fi
  local work=$cache/src/kube-extra-$kver
  rm -rf "$work" && mkdir -p "$work/out"
  (
    cd "$work"
    wrapper_module kube-extra require_kubernetes
    local major=${kver#v}; major=${major%%.*}
    local minor=${kver#v*.}; minor=${minor%%.*}
    local pkg=k8s.io/component-base/version pkgs=()
    for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
    log "${missing[*]} $kver: building"
    nice go build -trimpath -o out/ -ldflags "-s -w \
      -X $pkg.gitVersion=$kver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor \
      -X $pkg.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$kver" "${pkgs[@]}"
    for c in "${missing[@]}"; do mv "out/$c" "$cache/bin/$c-$kver"; done
  )
}

# (--pin leaves the control plane's pins to tests/control-plane/build.sh --pin.)
[ -n "$pin" ] || nice bash "$repo/tests/control-plane/build.sh"
build_kind
build_kube_extra
[ -z "$pin" ] || { log "pinned"; exit 0; }
kind_dir=$(cd "$cache/src/kind-cli-$kind_version" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/kind)

# ---- the VM disk and the node base (debootstrap: network and disk, side by side)
vm_log=$(mktemp); node_log=$(mktemp)
bash "$here/build-rootfs.sh" vm > "$vm_log.out" 2> "$vm_log" & vm_job=$!
KIND_MODULE_DIR=$kind_dir bash "$here/build-rootfs.sh" node > "$node_log.out" 2> "$node_log" & node_job=$!
wait "$vm_job" || { cat "$vm_log" >&2; exit 1; }
wait "$node_job" || { cat "$node_log" >&2; exit 1; }
cat "$vm_log" "$node_log" >&2
vm=$(cat "$vm_log.out"); node_base=$(cat "$node_log.out")
rm -f "$vm_log" "$vm_log.out" "$node_log" "$node_log.out"

# ---- the images kubeadm asks for
# Keys: each step's own section of this script and its inputs.
section() { sed -n "/^# ---- $1/,/^# ---- $2/p" "$0"; }
images_key=$( { section 'the images kubeadm' 'the node image'; cat "$here/mkimage-layers.py" "$repo/tests/node-vm/images/"* "$here/cni/"*
  sha256sum "$node_base/slim.tar" "$cache/bin/"{kube-apiserver,kube-controller-manager,kube-scheduler,kube-proxy,kubectl,kubeadm}-"$kver" \
    "$cache/bin/etcd-"*; } | sha256sum | cut -c1-12)
images=$cache/kind/images-$images_key
if [ ! -f "$images/.done" ]; then
  rm -rf "$images" && mkdir -p "$images"
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  mk() { python3 "$here/mkimage-layers.py" "$@" >&2; }
  path=PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin
  # The names kubeadm v1.37.2 asks for (`kubeadm config images list`).
  list=$("$cache/bin/kubeadm-$kver" config images list --kubernetes-version "$kver")
  echo "$list" > "$images/kubeadm-images.txt"
  name_of() { grep -E "/$1:" <<< "$list" | head -n1; }
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    mk --name "$(name_of "$c")" --out "$images/$c.tar" --env "$path" \
      --file "$cache/bin/$c-$kver:/usr/local/bin/$c:0755"
  done
  mk --name "$(name_of kube-proxy)" --out "$images/kube-proxy.tar" --env "$path" \
    --layer "$node_base/slim.tar" --file "$cache/bin/kube-proxy-$kver:/usr/local/bin/kube-proxy:0755"
  # etcd: the one tests/control-plane/build.sh builds (v3.6.16). kubeadm v1.37
  # asks for etcd 3.7.0-0; the local run's kind config sets kubeadm's
  # etcd.local.imageTag to this version instead (etcd-tag.txt), so no image
  # carries a version it is not.
  etcd_bin=$(ls "$cache/bin/etcd-"v* | sort -V | tail -n1)
  etcd_tag=${etcd_bin##*/etcd-v}
  echo "$etcd_tag" > "$images/etcd-tag.txt"
  mk --name "$(name_of etcd | sed 's/:.*//'):$etcd_tag" --out "$images/etcd.tar" --env "$path" \
    --file "$etcd_bin:/usr/local/bin/etcd:0755"
  # pause: the project's static pause (tests/node-vm/images/pause.c), under the
  # sandbox image name of kind's containerd config (kind drops kubeadm's pause
  # from its list for that one; it is also the scenarios' default pause image).
  gcc -static -Os -s -o "$tmp/pause" "$repo/tests/node-vm/images/pause.c"
  sandbox=$(sed -n 's/^ *sandbox_image = "\(.*\)"/\1/p' "$kind_dir/images/base/files/etc/containerd/config.toml")
  mk --name "$sandbox" --out "$images/pause.tar" --entrypoint '["/pause"]' \
    --file "$tmp/pause:/pause:0755"
  # busybox-static from Debian, as the node VMs' (workloads of the scenarios).
  (cd "$tmp" && apt-get download busybox-static >/dev/null 2>&1) \
    || (cd "$tmp" && as_root apt-get update -q >/dev/null && apt-get download busybox-static >/dev/null)
  dpkg-deb -x "$tmp"/busybox-static_*.deb "$tmp/bb"
  mk --name headroom.local/busybox:1 --out "$images/busybox.tar" --entrypoint '["/bin/sh"]' \
    --file "$tmp/bb/bin/busybox:/bin/busybox:0755" \
    --link /bin/sh=busybox --link /bin/sleep=busybox --link /bin/cat=busybox
  mk --name headroom.local/kind-cni:1 --out "$images/kind-cni.tar" --env "$path" \
    --layer "$node_base/slim.tar" --file "$cache/bin/kubectl-$kver:/usr/local/bin/kubectl:0755" \
    --file "$here/cni/headroom-kind-cni:/usr/local/bin/headroom-kind-cni:0755"
  rm -rf "$tmp"; trap - EXIT
  touch "$images/.done"
  find "$cache/kind" -maxdepth 1 -name 'images-*' ! -name "images-$images_key" -exec rm -rf {} +
  log "images: $images"
fi

# ---- the node image, in the VM's Docker, kept in a qcow2 overlay of its disk
node_image=headroom.local/kind-node:$kver
baked_key=$(echo "$vm $node_base $images_key $( { section 'the node image' 'end'; cat "$here/vm.sh"; } | sha256sum)" | sha256sum | cut -c1-12)
baked=$cache/kind/baked-$baked_key
if [ ! -f "$baked/.done" ]; then
  rm -rf "$baked" && mkdir -p "$baked"
  qemu-img create -q -f qcow2 -b "$vm/disk.img" -F raw "$baked/disk.qcow2"
  # shellcheck source=vm.sh
  . "$here/vm.sh"
  VM_KEY=$vm/id_ed25519
  cid=
  bake_cleanup() {
    local s=$?
    [ $s -eq 0 ] || tail -n 30 "$VM_DIR/console.log" >&2 || true
    vm_stop 30
    [ $s -eq 0 ] || rm -rf "$baked"
  }
  trap bake_cleanup EXIT
  trap 'exit 143' TERM INT   # so that a kill runs bake_cleanup too
  log "booting the VM to build $node_image (emulated: minutes)"
  vm_start "file=$baked/disk.qcow2,if=virtio,format=qcow2" "$vm/vmlinuz" "$vm/initrd.img"
  vm_wait_docker 600
  log "VM up after $(( $(date +%s) - start ))s: $(docker version -f '{{.Server.Version}}') $(vm_ssh 'uname -r')"
  base_image=headroom.local/kind-base:${node_base##*-}
  log "docker import $base_image"
  docker import --change 'ENV container=docker' --change 'STOPSIGNAL SIGRTMIN+3' \
    --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' \
    "$node_base/rootfs.tar" "$base_image" >/dev/null
  cid=$(docker run -d --entrypoint=sleep --security-opt seccomp=unconfined "$base_image" infinity)
  for b in kubeadm kubelet kubectl; do
    docker cp "$cache/bin/$b-$kver" "$cid:/usr/bin/$b"
    docker exec "$cid" chmod 0755 "/usr/bin/$b"
    docker exec "$cid" chown root:root "/usr/bin/$b"
  done
  # kind's images/base: `ctr oci spec`, the mount-product-files hook added, rlimits dropped.
  docker exec "$cid" bash -c "ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}' | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json"
  echo -n "$kver" | docker exec -i "$cid" cp /dev/stdin /kind/version
  docker exec "$cid" mkdir -p /kind/manifests
  docker cp "$here/cni/default-cni.yaml" "$cid:/kind/manifests/default-cni.yaml"
  docker exec "$cid" bash -c 'nohup containerd > /dev/null 2>&1 &'
  docker exec "$cid" bash -c 'for i in $(seq 1 60); do [ -S /run/containerd/containerd.sock ] && ctr info >/dev/null 2>&1 && exit 0; sleep 1; done; exit 1'
  for t in "$images"/*.tar; do
    log "ctr images import $(basename "$t")"
    docker exec -i "$cid" ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned \
      --all-platforms --no-unpack --digests - < "$t" >/dev/null
  done
  docker exec "$cid" ctr --namespace=k8s.io images list -q > "$baked/images.txt"
  docker exec "$cid" pkill containerd || true
  sleep 2
  docker commit --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' \
    --change 'ENV HTTP_PROXY="" HTTPS_PROXY="" NO_PROXY=""' "$cid" "$node_image" >/dev/null
  docker rm -f -v "$cid" >/dev/null
  docker image inspect -f '{{.Id}} {{.Size}}' "$node_image" > "$baked/node-image.txt"
  vm_ssh 'sync'
  trap - EXIT
  vm_stop 120
  touch "$baked/.done"
  find "$cache/kind" -maxdepth 1 -name 'baked-*' ! -name "baked-$baked_key" -exec rm -rf {} +
  log "node image $node_image baked into $baked ($(( $(date +%s) - start ))s)"
fi
# ---- end
printf 'vm=%s\nbaked=%s\nimages=%s\nnode_image=%s\nkind=%s\n' "$vm" "$baked" "$images" "$node_image" \
  "$cache/bin/kind-$kind_version-wait${kind_node_wait}s" > "$cache/kind/current"
log "ready in $(( $(date +%s) - start ))s ($cache/kind/current)"
