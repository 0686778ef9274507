#!/usr/bin/env bash
# Headroom on a real multi-node cluster (kind: 1 control plane + 2 workers).
# Creates the cluster, builds and loads the image, applies deploy/, runs the
# scenarios, prints PASS/FAIL per scenario and deletes the cluster on exit.
# Skips (exit 0) where Docker is not available. Needs kind, kubectl, docker.
#
#   tests/kind/run.sh            # HEADROOM_KIND_KEEP=1 keeps the cluster
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cluster=${HEADROOM_KIND_CLUSTER:-headroom}
image=headroom-agent:0.1.0
ns=headroom-demo
work=$(mktemp -d)
failed=0

if ! docker info >/dev/null 2>&1; then
  echo "SKIP: docker is not available here (docker info failed); kind scenarios not run"
  exit 0
fi
for tool in kind kubectl; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool not installed"; exit 1; }
done

cleanup() {
  if [ -z "${HEADROOM_KIND_KEEP:-}" ]; then kind delete cluster --name "$cluster" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

log() { printf '== %s\n' "$*"; }
result() { # name, status (0 = pass)
  if [ "$2" -eq 0 ]; then echo "PASS: $1"; else echo "FAIL: $1"; failed=1; fi
}
# Polls "$@" every 3 s until it succeeds, at most $1 seconds.
wait_for() {
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@"; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 3
  done
}
# CPU quantity -> millicores ("1" -> 1000, "1500m" -> 1500).
millis() { case $1 in *m) echo "${1%m}" ;; *) echo $(( $1 * 1000 )) ;; esac; }
limit_m() { millis "$(kubectl -n "$ns" get pod "$1" -o jsonpath='{.spec.containers[0].resources.limits.cpu}')"; }
agent_on() { kubectl -n headroom-system get pod -l app.kubernetes.io/name=headroom \
  --field-selector "spec.nodeName=$1" -o jsonpath='{.items[0].metadata.name}'; }
metrics_of() { kubectl get --raw "/api/v1/namespaces/headroom-system/pods/$(agent_on "$1"):9464/proxy/metrics"; }

app_pod() { # name, node: a managed Burstable pod, request 100m, limit 200m
  kubectl -n "$ns" apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  nodeName: $2
  containers:
    - name: app
      image: registry.k8s.io/pause:3.10
      resources:
        requests: {cpu: 100m, memory: 32Mi}
        limits: {cpu: 200m, memory: 64Mi}
YAML
}
filler_pod() { # name, node: a BestEffort busy loop
  kubectl -n "$ns" apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {role: filler}}
spec:
  nodeName: $2
  containers:
    - name: spin
      image: busybox:1.37
      command: [sh, -c, 'while :; do :; done']
YAML
}

log "creating cluster $cluster"
kind create cluster --name "$cluster" --config "$here/kind-config.yaml" --wait 180s
log "building $image"
docker build -t "$image" "$repo"
kind load docker-image "$image" --name "$cluster"
kubectl apply -k "$repo/deploy"
kubectl -n headroom-system rollout status ds/headroom-agent --timeout=180s

mapfile -t workers < <(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' \
  -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
w1=${workers[0]} w2=${workers[1]}
kubectl create namespace "$ns"
kubectl label namespace "$ns" headroom.dev/managed=true
app_pod app-1 "$w1"
app_pod app-2 "$w2"
kubectl -n "$ns" wait --for=condition=Ready pod/app-1 pod/app-2 --timeout=120s

# 1. An idle node raises limits above the 200m the pods started with.
raised() { [ "$(limit_m app-1)" -gt 200 ] && [ "$(limit_m app-2)" -gt 200 ]; }
wait_for 180 raised && s=0 || s=1
result "idle nodes raise limits (app-1 $(limit_m app-1)m, app-2 $(limit_m app-2)m)" "$s"

# 2. Filling worker 1 lowers limits there and not on worker 2.
high1=$(limit_m app-1) high2=$(limit_m app-2)
for i in $(seq 1 "$(docker exec "$w1" nproc)"); do filler_pod "fill-$i" "$w1"; done
lowered() { [ "$(limit_m app-1)" -lt "$high1" ]; }
wait_for 180 lowered && [ "$(limit_m app-2)" -ge "$high2" ] && s=0 || s=1
result "filling $w1 lowers its limits (app-1 ${high1}m -> $(limit_m app-1)m), not $w2's (app-2 $(limit_m app-2)m)" "$s"
kubectl -n "$ns" delete pod -l role=filler --wait=false

# 3. Writing cpu.max by hand on the node fires the drift metric.
uid=$(kubectl -n "$ns" get pod app-2 -o jsonpath='{.metadata.uid}')
cid=$(kubectl -n "$ns" get pod app-2 -o jsonpath='{.status.containerStatuses[0].containerID}')
# kind: systemd driver, containerd (docs/kubelet-behaviour.md §1).
scope=$(docker exec "$w2" find /sys/fs/cgroup -maxdepth 6 -type d \
  -path "*pod${uid//-/_}.slice/cri-containerd-${cid#*://}.scope" | head -n1)
cpu_max=$scope/cpu.max
docker exec "$w2" sh -c "echo '12345 100000' > $cpu_max"
drifting() { metrics_of "$w2" | grep '^headroom_cgroup_drift{' | grep 'pod="app-2"' | grep -q ' 1$'; }
wait_for 180 drifting && s=0 || s=1
result "hand-written cpu.max on $w2 fires headroom_cgroup_drift" "$s"

# 4. The admission policy denies a cross-node resize by the agent's identity.
agent1=$(agent_on "$w1")
token=$(kubectl -n headroom-system create token headroom-agent --duration=10m \
  --bound-object-kind=Pod --bound-object-name="$agent1" \
  --bound-object-uid="$(kubectl -n headroom-system get pod "$agent1" -o jsonpath='{.metadata.uid}')")
server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' \
  | base64 -d > "$work/ca.crt"
as_agent() { kubectl --kubeconfig=/dev/null --server="$server" \
  --certificate-authority="$work/ca.crt" --token="$token" "$@"; }
patch='{"spec":{"containers":[{"name":"app","resources":{"limits":{"cpu":"300m"}}}]}}'
own=0; as_agent -n "$ns" patch pod app-1 --subresource=resize --type=strategic -p "$patch" \
  --dry-run=server >/dev/null || own=1
if out=$(as_agent -n "$ns" patch pod app-2 --subresource=resize --type=strategic -p "$patch" 2>&1); then
  s=1
else
  grep -q 'may resize pods only on its own node' <<<"$out" && s=$own || s=1
fi
result "admission policy denies a cross-node resize ($w1 agent -> pod on $w2)" "$s"

[ "$failed" -eq 0 ] || { echo "some scenarios failed"; exit 1; }
echo "all scenarios passed"
