#!/usr/bin/env bash
# Headroom on a real multi-node cluster (kind: 1 control plane + 2 workers).
# Creates the cluster, builds the image with Docker (the Dockerfile) and loads
# it, then runs the shared scenario runner tests/scenarios/run.sh — the same
# one the real-node tier runs on QEMU VMs here — which installs with
# `kubectl apply -k deploy/`, prints PASS/FAIL per scenario, rolls and
# uninstalls. Deletes the cluster on exit. Skips (exit 0) where Docker is not
# available. Needs kind, kubectl, docker.
#
#   tests/kind/run.sh            # HEADROOM_KIND_KEEP=1 keeps the cluster
#
# Where no registry is reachable (tests/kind/local.sh sets these):
#   HEADROOM_KIND_CONFIG    a kind config instead of kind-config.yaml (e.g. the
#                           same nodes on a locally built node image)
#   HEADROOM_AGENT_ARCHIVE  a Docker archive of $image (scripts/build-image.sh),
#                           `docker load`ed instead of `docker build`
#   HEADROOM_KIND_WAIT      kind's --wait (180s)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cluster=${HEADROOM_KIND_CLUSTER:-headroom}
image=headroom-agent:0.1.0
next=headroom-agent:0.1.0-next
work=$(mktemp -d)

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

log "creating cluster $cluster"
kind create cluster --name "$cluster" --config "${HEADROOM_KIND_CONFIG:-$here/kind-config.yaml}" \
  --wait "${HEADROOM_KIND_WAIT:-180s}" \
  --kubeconfig "$work/kubeconfig"
if [ -n "${HEADROOM_AGENT_ARCHIVE:-}" ]; then
  log "loading $image from $HEADROOM_AGENT_ARCHIVE"
  docker load -i "$HEADROOM_AGENT_ARCHIVE"
else
  log "building $image"
  docker build -t "$image" "$repo"
fi
docker tag "$image" "$next"
kind load docker-image "$image" "$next" --name "$cluster"

# `node-sh NODE 'shell line'`: kind nodes are containers.
cat > "$work/node-sh" <<'SH'
#!/bin/sh
exec docker exec "$1" sh -c "$2"
SH
chmod +x "$work/node-sh"

KUBECONFIG=$work/kubeconfig HEADROOM_NODE_SH=$work/node-sh HEADROOM_IMAGE=$image \
  HEADROOM_IMAGE_NEXT=$next HEADROOM_IMAGE_ID="$(docker image inspect -f '{{.Id}}' "$image")" \
  HEADROOM_SCENARIO_TIMEOUT=${HEADROOM_SCENARIO_TIMEOUT:-180} \
  bash "$repo/tests/scenarios/run.sh"
