#!/usr/bin/env bash
# Headroom's end-to-end scenarios against an EXISTING cluster with at least two
# worker nodes and the agent's image already on every node. Installs with
# `kubectl apply -k deploy/`, runs the scenarios, rolls the DaemonSet to a second
# tag and back, uninstalls with `kubectl delete -k deploy/`. Prints PASS/FAIL per
# scenario; exits 1 if any failed. Used by tests/kind/run.sh (kind, Docker) and
# by the real-node tier (tests/tests/real_node.rs: QEMU VMs with a real kubelet).
#
# Environment:
#   KUBECONFIG                 the cluster (kubectl must be on PATH)
#   HEADROOM_NODE_SH           a command run as `$HEADROOM_NODE_SH NODE 'shell line'`
#                              that runs the line as root on that node
#                              (kind: docker exec; the VMs: ssh)
#   HEADROOM_WORKERS           two node names (default: the first two nodes without
#                              the control-plane role)
#   HEADROOM_PAUSE_IMAGE       an idle container image on every node (registry.k8s.io/pause:3.10)
#   HEADROOM_BUSYBOX_IMAGE     a busybox image on every node (busybox:1.37)
#   HEADROOM_IMAGE             the agent image deploy/ names (headroom-agent:0.1.0)
#   HEADROOM_IMAGE_ID          when set, the agent pods must run exactly this image ID
#   HEADROOM_IMAGE_NEXT        a second tag of the agent image on every node (the
#                              upgrade scenario); required
#   HEADROOM_SCENARIO_TIMEOUT  seconds for each wait (300)
#   HEADROOM_PROMETHEUS_CRDS   a directory of prometheus-operator CRD manifests: when
#                              set, they are applied after the scenarios, then
#                              `kubectl apply -k deploy/monitoring` on top of deploy/
#                              (must not restart the agents), and the uninstall is
#                              `kubectl delete -k deploy/monitoring`; the CRDs are
#                              removed at the end
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
: "${KUBECONFIG:?KUBECONFIG must name the cluster}"
: "${HEADROOM_NODE_SH:?HEADROOM_NODE_SH must run a shell line on a node}"
: "${HEADROOM_IMAGE_NEXT:?HEADROOM_IMAGE_NEXT must name a second tag of the agent image}"
pause_image=${HEADROOM_PAUSE_IMAGE:-registry.k8s.io/pause:3.10}
busybox_image=${HEADROOM_BUSYBOX_IMAGE:-busybox:1.37}
image=${HEADROOM_IMAGE:-headroom-agent:0.1.0}
timeout=${HEADROOM_SCENARIO_TIMEOUT:-300}
ns=headroom-demo
sys=headroom-system
overlay=$repo/deploy
where=deploy
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

log() { printf '== %s\n' "$*"; }
passed=0
result() { # name, status (0 = pass)
  if [ "$2" -eq 0 ]; then echo "PASS: $1 [+${SECONDS}s]"; passed=$((passed + 1)); else echo "FAIL: $1 [+${SECONDS}s]"; failed=1; fi
}
node_sh() { "$HEADROOM_NODE_SH" "$1" "$2"; }
# Polls "$@" every 3 s until it succeeds, at most $timeout seconds.
wait_for() {
  local deadline=$(( $(date +%s) + timeout ))
  until "$@"; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 3
  done
}
# CPU quantity -> millicores ("1" -> 1000, "1500m" -> 1500).
millis() { case $1 in *m) echo "${1%m}" ;; '') echo 0 ;; *) echo $(( $1 * 1000 )) ;; esac; }
limit_m() { millis "$(kubectl -n "$ns" get pod "$1" -o jsonpath='{.spec.containers[0].resources.limits.cpu}')"; }
generation() { kubectl -n "$ns" get pod "$1" -o jsonpath='{.metadata.generation}'; }
agent_on() { kubectl -n "$sys" get pod -l app.kubernetes.io/name=headroom \
  --field-selector "spec.nodeName=$1,status.phase=Running" -o jsonpath='{.items[0].metadata.name}'; }
metrics_of() { kubectl --request-timeout=30s get --raw "/api/v1/namespaces/$sys/pods/$(agent_on "$1"):9464/proxy/metrics"; }
ds_ready() {
  local want ready updated
  want=$(kubectl -n "$sys" get ds headroom-agent -o jsonpath='{.status.desiredNumberScheduled}')
  ready=$(kubectl -n "$sys" get ds headroom-agent -o jsonpath='{.status.numberReady}')
  updated=$(kubectl -n "$sys" get ds headroom-agent -o jsonpath='{.status.updatedNumberScheduled}')
  [ -n "$want" ] && [ "$want" -gt 0 ] && [ "$ready" = "$want" ] && [ "$updated" = "$want" ]
}

app_pod() { # name, node: a managed Burstable pod, request 100m, limit 200m
  kubectl -n "$ns" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  nodeName: $2
  terminationGracePeriodSeconds: 0
  containers:
    - name: app
      image: $pause_image
      imagePullPolicy: IfNotPresent
      resources:
        requests: {cpu: 100m, memory: 32Mi}
        limits: {cpu: 200m, memory: 64Mi}
YAML
}
filler_pod() { # name, node: a BestEffort busy loop
  kubectl -n "$ns" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {role: filler}}
spec:
  nodeName: $2
  terminationGracePeriodSeconds: 0
  containers:
    - name: spin
      image: $busybox_image
      imagePullPolicy: IfNotPresent
      command: [sh, -c, 'while :; do :; done']
YAML
}

# ---- install
log "installing: kubectl apply -k $where/"
kubectl apply -k "$overlay"
wait_for ds_ready && s=0 || s=1
n=$(kubectl -n "$sys" get ds headroom-agent -o jsonpath='{.status.numberReady}/{.status.desiredNumberScheduled}')
result "kubectl apply -k $where/: DaemonSet Ready on every node ($n)" "$s"
if [ "$s" -ne 0 ]; then
  kubectl -n "$sys" get pods -o wide || true
  kubectl -n "$sys" describe pods | tail -n 60 || true
  kubectl get events -A --sort-by=.lastTimestamp | tail -n 30 || true
  exit 1
fi

if [ -n "${HEADROOM_WORKERS:-}" ]; then
  read -r w1 w2 <<<"$HEADROOM_WORKERS"
else
  mapfile -t workers < <(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' \
    -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
  w1=${workers[0]} w2=${workers[1]}
fi

# The running agents: the image asked for, and the security context enforced by
# the kernel (read from /proc of the agent process on the node).
if [ -n "${HEADROOM_IMAGE_ID:-}" ]; then
  ids=$(kubectl -n "$sys" get pods -l app.kubernetes.io/name=headroom \
    -o jsonpath='{range .items[*]}{.status.containerStatuses[0].imageID}{"\n"}{end}' | sed 's/.*@//' | sort -u)
  [ "$ids" = "$HEADROOM_IMAGE_ID" ] && s=0 || s=1
  result "agent pods run the image built here ($HEADROOM_IMAGE_ID; running: $(echo $ids))" "$s"
fi
for node in "$w1" "$w2"; do
  facts=$(node_sh "$node" 'for p in /proc/[0-9]*; do
      if [ "$(cat $p/comm 2>/dev/null)" = headroom-agent ]; then
        grep -E "^(Uid|Gid|CapEff|CapBnd|NoNewPrivs|Seccomp):" $p/status | tr -s "\t " " "
        awk "\$5 == \"/\" {print \"root-mount\", \$6}" $p/mountinfo
        awk "\$5 == \"/host/sys/fs/cgroup\" {print \"cgroup-mount\", \$6}" $p/mountinfo
        break
      fi
    done' 2>&1) || true
  ok=0
  for want in 'Uid: 65532 65532 65532 65532' 'Gid: 65532 65532 65532 65532' \
              'CapEff: 0000000000000000' 'NoNewPrivs: 1' 'Seccomp: 2'; do
    grep -qx "$want" <<<"$facts" || ok=1
  done
  grep -Eq '^root-mount ro(,|$)' <<<"$facts" || ok=1
  grep -Eq '^cgroup-mount ro(,|$)' <<<"$facts" || ok=1
  result "agent on $node: UID/GID 65532, no capabilities, no_new_privs, seccomp filter, read-only root and cgroup mount ($(echo $facts))" "$ok"
done

kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl label namespace "$ns" headroom.dev/managed=true --overwrite >/dev/null
app_pod app-1 "$w1"
app_pod app-2 "$w2"
kubectl -n "$ns" wait --for=condition=Ready pod/app-1 pod/app-2 --timeout="${timeout}s" >/dev/null

# 1. An idle node raises limits above the 200m the pods started with.
raised() { [ "$(limit_m app-1)" -gt 200 ] && [ "$(limit_m app-2)" -gt 200 ]; }
wait_for raised && s=0 || s=1
result "idle nodes raise limits (app-1 $(limit_m app-1)m, app-2 $(limit_m app-2)m)" "$s"

# 2. Metrics through the API server's pod proxy: the agent on each node
#    reports its pod managed and its node's capacity.
scraped() {
  local m; m=$(metrics_of "$1" 2>/dev/null) || return 1
  grep -q '^headroom_node_capacity_millicores ' <<<"$m" && grep -q '^headroom_pods{state="managed".*} [1-9]' <<<"$m"
}
for node in "$w1" "$w2"; do
  wait_for scraped "$node" && s=0 || s=1
  result "metrics of the agent on $node scraped through the API server's pod proxy" "$s"
done

# 3. Filling worker 1 lowers limits there and not on worker 2.
high1=$(limit_m app-1) high2=$(limit_m app-2)
cpus=$(node_sh "$w1" nproc)
for i in $(seq 1 "$cpus"); do filler_pod "fill-$i" "$w1"; done
lowered() { [ "$(limit_m app-1)" -lt "$high1" ]; }
wait_for lowered && [ "$(limit_m app-2)" -ge "$high2" ] && s=0 || s=1
result "filling $w1 ($cpus busy loops) lowers its limits (app-1 ${high1}m -> $(limit_m app-1)m), not $w2's (app-2 $(limit_m app-2)m)" "$s"

# 4. The agent pod deleted while a resize is under way: emptying the node makes
#    the agent raise app-1; its pod is deleted at once and the DaemonSet
#    recreates it; the new agent finishes the job (app-1 raised again, its
#    cgroup matches the spec: no drift).
low1=$(limit_m app-1) gen1=$(generation app-1)
kubectl -n "$ns" delete pod -l role=filler --grace-period=0 --force >/dev/null 2>&1 || true
old_agent=$(agent_on "$w1")
# The raise is patched (generation bumped): delete the agent before it verifies.
patched() { [ "$(generation app-1)" -gt "$gen1" ]; }
wait_for patched && s=0 || s=1
kubectl -n "$sys" delete pod "$old_agent" --wait=false >/dev/null
recreated() { local a; a=$(agent_on "$w1") && [ -n "$a" ] && [ "$a" != "$old_agent" ] \
  && [ "$(kubectl -n "$sys" get pod "$a" -o jsonpath='{.status.containerStatuses[0].ready}')" = true ]; }
wait_for recreated || s=1
new_agent=$(agent_on "$w1" || true)
settled() {
  local m; m=$(metrics_of "$w1") || return 1
  [ "$(limit_m app-1)" -gt "$low1" ] && grep -q '^headroom_pods{state="managed".*} [1-9]' <<<"$m" \
    && ! grep '^headroom_cgroup_drift{' <<<"$m" | grep 'pod="app-1"' | grep -q ' 1$'
}
wait_for settled || s=1
result "agent pod deleted mid-resize ($old_agent) is recreated by the DaemonSet ($new_agent) and app-1 settles raised (${low1}m -> $(limit_m app-1)m), no drift" "$s"

# 5. An out-of-band cpu.max write on the node: drift metric and CgroupDrift Event.
cid=$(kubectl -n "$ns" get pod app-2 -o jsonpath='{.status.containerStatuses[0].containerID}')
cid=${cid#*://}
cpu_max=$(node_sh "$w2" "find /sys/fs/cgroup -type d -name '*$cid*' | head -n1")/cpu.max
node_sh "$w2" "echo '12345 100000' > $cpu_max"
drifting() { metrics_of "$w2" | grep '^headroom_cgroup_drift{' | grep 'pod="app-2"' | grep -q ' 1$'; }
wait_for drifting && s=0 || s=1
result "hand-written cpu.max on $w2 ($cpu_max) fires headroom_cgroup_drift" "$s"
drift_event() { kubectl -n "$ns" get events --field-selector reason=CgroupDrift,involvedObject.name=app-2 \
  -o jsonpath='{.items[*].note}{.items[*].message}' | grep -q .; }
wait_for drift_event && s=0 || s=1
result "CgroupDrift Event on app-2: $(kubectl -n "$ns" get events --field-selector reason=CgroupDrift,involvedObject.name=app-2 \
  -o jsonpath='{.items[0].note}{.items[0].message}' | head -c 200)" "$s"

# 6. The admission policy denies a cross-node resize made with the token the
#    kubelet projected into the agent pod on worker 1 (read on the node).
agent1=$(agent_on "$w1")
uid1=$(kubectl -n "$sys" get pod "$agent1" -o jsonpath='{.metadata.uid}')
# The file behind the `token` symlink: the kubelet's volume directory is sticky
# and world-writable and the symlink belongs to the pod's user (65532), so with
# fs.protected_symlinks=1 (Debian's default) even root may not follow it.
token=$(node_sh "$w1" "cat /var/lib/kubelet/pods/$uid1/volumes/kubernetes.io~projected/*/..data/token") || { echo "FAIL: reading the projected token on $w1"; failed=1; token=; }
server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
ca_data=$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
if [ -n "$ca_data" ]; then
  base64 -d <<<"$ca_data" > "$work/ca.crt"
else # a kubeconfig that names a CA file instead
  cp "$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')" "$work/ca.crt"
fi
as_agent() { kubectl --kubeconfig=/dev/null --server="$server" \
  --certificate-authority="$work/ca.crt" --token="$token" "$@"; }
# The PATCH itself, as the agent sends it: `kubectl patch` would GET pods/resize
# first, which the agent's RBAC (patch only) rightly refuses.
resize_as_agent() { # pod, query; prints the HTTP status, the answer in $work/answer.json
  curl -sS -o "$work/answer.json" -w '%{http_code}' --cacert "$work/ca.crt" \
    -H "Authorization: Bearer $token" -H 'Content-Type: application/strategic-merge-patch+json' \
    -X PATCH --data "$patch" "$server/api/v1/namespaces/$ns/pods/$1/resize$2"
}
who=$(as_agent auth whoami -o jsonpath='{.status.userInfo.username} {.status.userInfo.extra.authentication\.kubernetes\.io/node-name}' 2>&1 || true)
patch='{"spec":{"containers":[{"name":"app","resources":{"limits":{"cpu":"300m"}}}]}}'
own=1; [ "$(resize_as_agent app-1 '?dryRun=All' || true)" = 200 ] && own=0
code=$(resize_as_agent app-2 '' || true)
out="HTTP $code: $(tr -d '\\\n' < "$work/answer.json" 2>/dev/null | sed 's/.*"message": *"//; s/", *"reason".*//')"
[ "$code" = 403 ] && grep -q 'may resize pods only on its own node' <<<"$out" && s=$own || s=1
[ "$own" -eq 0 ] && own_says=allowed || own_says=REFUSED
result "admission policy denies a cross-node resize with the kubelet-projected token ($who: own node $own_says, $w2: $(head -c 240 <<<"$out"))" "$s"

# 7. Upgrade: roll the DaemonSet to a second tag and back. Limits are kept and
#    the rollout sends no patch storm (patches = generation bumps of the apps).
g0=$(( $(generation app-1) + $(generation app-2) ))
l0="$(limit_m app-1) $(limit_m app-2)"
for img in "$HEADROOM_IMAGE_NEXT" "$image"; do
  kubectl -n "$sys" set image ds/headroom-agent "agent=$img" >/dev/null
  on_image() { ds_ready && [ "$(kubectl -n "$sys" get pods -l app.kubernetes.io/name=headroom \
    -o jsonpath='{range .items[*]}{.spec.containers[0].image}{"\n"}{end}' | sort -u)" = "$img" ]; }
  wait_for on_image && s=0 || s=1
  result "DaemonSet rolled to $img on every node" "$s"
done
sleep 15
g1=$(( $(generation app-1) + $(generation app-2) ))
l1="$(limit_m app-1) $(limit_m app-2)"
echo "MEASURE rollout: patches during two rollouts: $(( g1 - g0 )); limits before ($l0) after ($l1)"
[ $(( g1 - g0 )) -le 2 ] && [ "$l1" = "$l0" ] && s=0 || s=1
result "two rollouts: $(( g1 - g0 )) patches (at most 2), limits kept ($l0 -> $l1)" "$s"

# 8. deploy/monitoring on top: PodMonitor and alerts, the agents untouched.
if [ -n "${HEADROOM_PROMETHEUS_CRDS:-}" ]; then
  kubectl apply --server-side -f "$HEADROOM_PROMETHEUS_CRDS" >/dev/null
  kubectl wait --for=condition=Established --timeout="${timeout}s" \
    crd/podmonitors.monitoring.coreos.com crd/prometheusrules.monitoring.coreos.com >/dev/null
  pods0=$(kubectl -n "$sys" get pods -l app.kubernetes.io/name=headroom -o jsonpath='{.items[*].metadata.uid}')
  kubectl apply -k "$repo/deploy/monitoring" >/dev/null && s=0 || s=1
  overlay=$repo/deploy/monitoring where=deploy/monitoring
  kubectl -n "$sys" get podmonitor headroom-agent >/dev/null && \
    [ -n "$(kubectl -n "$sys" get prometheusrule -o name)" ] || s=1
  sleep 5
  [ "$(kubectl -n "$sys" get pods -l app.kubernetes.io/name=headroom -o jsonpath='{.items[*].metadata.uid}')" = "$pods0" ] || s=1
  result "kubectl apply -k deploy/monitoring (published prometheus-operator CRDs): PodMonitor and PrometheusRule created, agents not restarted" "$s"
fi

# 9. Uninstall: nothing of the install is left, and the pods keep their limits.
l0="$(limit_m app-1) $(limit_m app-2)"
kubectl delete -k "$overlay" --wait=true --timeout="${timeout}s" >/dev/null
kubectl kustomize "$overlay" > "$work/rendered.yaml"
gone() { [ -z "$(kubectl get -f "$work/rendered.yaml" --ignore-not-found -o name 2>/dev/null)" ]; }
wait_for gone && s=0 || s=1
result "kubectl delete -k $where/ leaves no object behind ($(kubectl get -f "$work/rendered.yaml" --ignore-not-found -o name 2>/dev/null | tr '\n' ' '))" "$s"
sleep 10
l1="$(limit_m app-1) $(limit_m app-2)"
[ "$l1" = "$l0" ] && s=0 || s=1
result "pods keep their limits after uninstall ($l0 -> $l1)" "$s"
kubectl delete namespace "$ns" --wait=false >/dev/null
[ -z "${HEADROOM_PROMETHEUS_CRDS:-}" ] || kubectl delete -f "$HEADROOM_PROMETHEUS_CRDS" --wait=false >/dev/null

[ "$failed" -eq 0 ] || { echo "some scenarios failed"; exit 1; }
echo "all $passed scenarios passed"
