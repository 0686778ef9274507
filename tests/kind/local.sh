#!/usr/bin/env bash
# tests/kind/run.sh, run for real on a machine without a Docker engine and
# without an image registry: builds (or takes from the cache) everything in
# tests/kind/build.sh, boots the Docker VM (QEMU TCG, restricted user-mode
# networking) over the disk that already holds the locally built kind node
# image, points the host's Docker CLI, kind and kubectl at it, and runs
# tests/kind/run.sh unchanged but for its local knobs:
#   HEADROOM_KIND_CONFIG    the kind config: tests/kind/kind-config.yaml's three
#                           nodes on the local node image, the API server port
#                           the VM forwards, kubeadm's etcd tag (v3.6.16), no
#                           CoreDNS (not built), longer kubeadm timeouts (emulated)
#   HEADROOM_AGENT_ARCHIVE  the agent image from scripts/build-image.sh, `docker
#                           load`ed instead of `docker build` (the Dockerfile's
#                           rust:1.95-bookworm stage needs a registry)
#   HEADROOM_BUSYBOX_IMAGE  Debian's busybox-static, preloaded in the node image
# Kind runs on the host, against the VM's dockerd (its TCP socket forwarded to
# the host's loopback); kubectl and the scenario runner run on the host at
# native speed, and only dockerd and the cluster pay for emulation.
#
# Then checks the kind node's cgroup layout that docs/kubelet-behaviour.md
# states (cgroup v2, systemd driver, kubepods under /kubelet.slice, PSI files),
# deletes the cluster and checks that no container is left. The VM is killed
# on every exit (and dies with this shell: PDEATHSIG); every step is bounded.
#
#   tests/kind/local.sh       # HEADROOM_KIND_TIMEOUT (s, default 3600) bounds run.sh
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
export HEADROOM_CACHE_DIR=${HEADROOM_CACHE_DIR:-$repo/.cache}
cache=$HEADROOM_CACHE_DIR
log() { printf '== kind (local): %s\n' "$*"; }
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start ))s"; }

bash "$here/build.sh"
agent_archive=$cache/images/headroom-agent.tar
[ -f "$agent_archive" ] || bash "$repo/scripts/build-image.sh"
# shellcheck disable=SC1091
. "$cache/kind/current"   # vm= baked= images= node_image= kind=
log "built or cached after $(elapsed)"

# shellcheck source=vm.sh
. "$here/vm.sh"
VM_KEY=$vm/id_ed25519
work=$(mktemp -d)
cluster=headroom
cleanup() {
  local s=$?
  if [ $s -ne 0 ] && [ -n "${VM_DIR:-}" ]; then
    echo "== kind (local): failed (exit $s) after $(elapsed); VM console tail:" >&2
    tail -n 20 "$VM_DIR/console.log" >&2 || true
  fi
  # A throwaway snapshot: nothing to save, so no graceful shutdown.
  vm_stop 0
  rm -rf "$work"
  exit $s
}
trap cleanup EXIT
trap 'exit 130' INT TERM

VM_API_PORT=$(vm_free_port)
vm_start "file=$baked/disk.qcow2,if=virtio,format=qcow2,snapshot=on" "$vm/vmlinuz" "$vm/initrd.img"
vm_wait_docker 600
log "VM up after $(elapsed): Docker $(docker version -f '{{.Server.Version}}'), $(vm_ssh 'uname -r')"
docker image inspect "$node_image" >/dev/null

# kind, kubectl v1.37.2 (the project's) and docker first on PATH.
mkdir -p "$work/bin"
ln -s "$kind" "$work/bin/kind"
ln -s "$cache/bin/kubectl-v1.37.2" "$work/bin/kubectl"
export PATH=$work/bin:$PATH

etcd_tag=$(cat "$images/etcd-tag.txt")
sed "s|image: kindest/node:.*|image: $node_image|" "$here/kind-config.yaml" > "$work/kind-config.yaml"
cat >> "$work/kind-config.yaml" <<YAML
# Local (tests/kind/local.sh): the VM forwards this port from the host.
networking:
  apiServerPort: $VM_API_PORT
kubeadmConfigPatches:
  - |
    kind: ClusterConfiguration
    etcd:
      local:
        imageTag: "$etcd_tag"
    dns:
      disabled: true
  - |
    kind: InitConfiguration
    timeouts:
      controlPlaneComponentHealthCheck: 15m0s
      kubeletHealthCheck: 10m0s
      kubernetesAPICall: 10m0s
      etcdAPICall: 10m0s
  - |
    kind: JoinConfiguration
    timeouts:
      controlPlaneComponentHealthCheck: 15m0s
      kubeletHealthCheck: 10m0s
      tlsBootstrap: 15m0s
      discovery: 15m0s
      kubernetesAPICall: 10m0s
      etcdAPICall: 10m0s
YAML

rc=0
HEADROOM_KIND_CLUSTER=$cluster HEADROOM_KIND_KEEP=1 HEADROOM_KIND_CONFIG=$work/kind-config.yaml \
  HEADROOM_AGENT_ARCHIVE=$agent_archive HEADROOM_BUSYBOX_IMAGE=headroom.local/busybox:1 \
  HEADROOM_KIND_WAIT=${HEADROOM_KIND_WAIT:-900s} HEADROOM_SCENARIO_TIMEOUT=${HEADROOM_SCENARIO_TIMEOUT:-300} \
  timeout --kill-after=30 "${HEADROOM_KIND_TIMEOUT:-3600}" bash "$here/run.sh" || rc=$?
log "run.sh exited $rc after $(elapsed)"

# The kind node's cgroup layout, as docs/kubelet-behaviour.md states it.
if docker inspect "$cluster-worker" >/dev/null 2>&1; then
  layout=$(timeout 120 docker exec "$cluster-worker" sh -c '
    echo "fs=$(stat -fc %T /sys/fs/cgroup)"
    echo "driver=$(sed -n "s/^cgroupDriver: *//p" /var/lib/kubelet/config.yaml)"
    echo "root=$(sed -n "s/^cgroupRoot: *//p" /var/lib/kubelet/config.yaml)"
    echo "kubepods=$(cd /sys/fs/cgroup && ls -d kubelet.slice/kubelet-kubepods.slice 2>/dev/null)"
    echo "burstable=$(cd /sys/fs/cgroup && ls -d kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice 2>/dev/null)"
    echo "pressure=$(test -r /sys/fs/cgroup/kubelet.slice/kubelet-kubepods.slice/cpu.pressure && head -n1 /sys/fs/cgroup/kubelet.slice/kubelet-kubepods.slice/cpu.pressure)"
    echo "cgroupns=$(readlink /proc/1/ns/cgroup) init_cgroup=$(cat /proc/1/cgroup)"') || rc=1
  echo "$layout" | sed 's/^/   layout: /'
  want() { grep -qE "^$1" <<< "$layout" || { echo "FAIL: kind node cgroup layout: expected $1"; rc=1; }; }
  want 'fs=cgroup2fs$'
  want 'driver=systemd$'
  want 'root=/kubelet$'
  want 'kubepods=kubelet.slice/kubelet-kubepods.slice$'
  want 'burstable=kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice$'
  want 'pressure=some avg10='
  [ $rc -ne 0 ] || echo "PASS: kind node cgroup layout (cgroup v2, systemd driver, kubepods under /kubelet.slice, cpu.pressure)"
else
  echo "FAIL: no kind node to read the cgroup layout from"; rc=1
fi

timeout 300 kind delete cluster --name "$cluster" || rc=1
left=$(timeout 60 docker ps -aq)
if [ -n "$left" ]; then echo "FAIL: containers left after kind delete: $left"; rc=1; else echo "PASS: kind delete cluster left no container"; fi
log "done in $(elapsed), exit $rc"
exit $rc
