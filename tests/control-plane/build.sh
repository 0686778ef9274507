#!/usr/bin/env bash
# Builds the real control plane used by the integration tests — etcd and
# kube-apiserver — from the Go module proxy into a cache directory, and the
# pieces of a full cluster the real-node tier runs (kube-controller-manager,
# kube-scheduler, the kubelet that runs inside the node VMs, and the kubectl
# that installs Headroom there with `kubectl apply -k deploy/`).
# A no-op for every binary that is already there.
#
#   tests/control-plane/build.sh            # everything, v1.37.2
#   HEADROOM_SKIP_NODE_BINARIES=1 tests/control-plane/build.sh   # etcd + apiserver only
#   HEADROOM_EXTRA_APISERVERS=v1.35.4 tests/control-plane/build.sh
#   tests/control-plane/build.sh --pin      # re-resolve and rewrite the pins
#
# Pins: each wrapper module's go.mod and go.sum are committed beside its source
# (etcd/, kube-apiserver/, kube-node/), so the default versions build exactly the
# module graph reviewed here (-mod=readonly: a missing or changed sum fails the
# build). A version without a pin (HEADROOM_EXTRA_APISERVERS, or a
# HEADROOM_*_VERSION other than the pinned one) is resolved afresh and says so.
# To update a pin: HEADROOM_APISERVER_VERSION=v1.37.3 HEADROOM_ETCD_VERSION=v3.6.17
# tests/control-plane/build.sh --pin, then change the version defaults (this
# file, tests/node-vm/build.sh, tests/src/control_plane.rs, tests/src/node_vm/install.rs).
#
# Cache: $HEADROOM_CACHE_DIR (default: <repo>/.cache), layout
#   $HEADROOM_CACHE_DIR/bin/etcd-v3.6.16
#   $HEADROOM_CACHE_DIR/bin/kube-apiserver-v1.37.2
#   $HEADROOM_CACHE_DIR/bin/{kubelet,kube-controller-manager,kube-scheduler,kubectl}-v1.37.2
#   $HEADROOM_CACHE_DIR/crds/prometheus-operator-v0.94.0/*.yaml (PodMonitor, PrometheusRule)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${HEADROOM_CACHE_DIR:-$repo/.cache}
etcd_version=${HEADROOM_ETCD_VERSION:-v3.6.16}
apiserver_version=${HEADROOM_APISERVER_VERSION:-v1.37.2}
extra=${HEADROOM_EXTRA_APISERVERS:-}

pin=
[ "${1:-}" = --pin ] && pin=1

export GOTOOLCHAIN=local CGO_ENABLED=0
mkdir -p "$cache/bin" "$cache/src"

log() { printf 'control-plane: %s\n' "$*" >&2; }

# The version of module $2 that the committed go.mod in $here/$1 requires.
pinned_version() {
  awk -v m="$2" '$1 == m {print $2} $1 == "require" && $2 == m {print $3}' "$here/$1/go.mod" 2>/dev/null | head -1
}

# Fills the current directory (a fresh work dir) with wrapper module $1 for
# module $2 at version $3: the committed pin when it is for that version (and
# not --pin), else a fresh resolution by the commands in "${@:4}" (which write
# go.mod), `go mod tidy`, and with --pin the result copied back as the pin.
module_for() {
  local dir=$1 mod=$2 ver=$3; shift 3
  if [ -z "$pin" ] && [ "$(pinned_version "$dir" "$mod")" = "$ver" ]; then
    cp "$here/$dir/go.mod" "$here/$dir/go.sum" .
    export GOFLAGS=-mod=readonly
    log "$dir $ver: pinned ($here/$dir/go.sum)"
    return
  fi
  export GOFLAGS=-mod=mod
  go mod init "headroom.test/$dir" >/dev/null 2>&1
  "$@"
  log "$dir $ver: resolving modules (not pinned)"
  go mod tidy >/dev/null
  if [ -n "$pin" ]; then
    cp go.mod go.sum "$here/$dir/"
    log "$dir $ver: pinned into $here/$dir"
  fi
}

# Staging modules (k8s.io/api, k8s.io/apiserver, ...) are `replace`d to
# ./staging/src/... in k8s.io/kubernetes' go.mod; a consumer must replace each
# one with its published v0.X.Y. Read the list from the go.mod the proxy serves.
replace_lines() {
  local kver=$1 gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$kver" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
  [ -f "$gomod" ] || { log "cannot fetch go.mod of k8s.io/kubernetes@$kver"; exit 1; }
  local staging="v0.${kver#v1.}"
  grep -E '^\s*k8s\.io/[a-z0-9/-]+ => \./staging/' "$gomod" \
    | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
}

# Adds k8s.io/kubernetes $1 and its staging replaces to ./go.mod.
require_kubernetes() {
  { echo; echo "require k8s.io/kubernetes $1"; replace_lines "$1"; } >> go.mod
}

build_apiserver() {
  local kver=$1 out="$cache/bin/kube-apiserver-$1"
  if [ -x "$out" ] && [ -z "$pin" ]; then log "kube-apiserver $kver: cached ($out)"; return; fi
  local work="$cache/src/kube-apiserver-$kver"
  rm -rf "$work" && mkdir -p "$work"
  cp "$here/kube-apiserver/main.go" "$work/"
  (
    cd "$work"
    module_for kube-apiserver k8s.io/kubernetes "$kver" require_kubernetes "$kver"
    local major=${kver#v}; major=${major%%.*}
    local minor=${kver#v*.}; minor=${minor%%.*}
    local pkg=k8s.io/component-base/version
    log "kube-apiserver $kver: building"
    go build -trimpath -o "$out.tmp" -ldflags "-s -w \
      -X $pkg.gitVersion=$kver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor \
      -X $pkg.gitTreeState=clean \
      -X k8s.io/client-go/pkg/version.gitVersion=$kver" .
  )
  mv "$out.tmp" "$out"
  log "kube-apiserver $kver: built ($(du -h "$out" | cut -f1))"
}

# kubelet, kube-controller-manager, kube-scheduler and kubectl: the upstream mains
# (k8s.io/kubernetes/cmd/...) built straight from the module, in one module so
# they share one resolution and the build cache the apiserver already filled.
build_node_components() {
  local kver=$1 cmds=(kubelet kube-controller-manager kube-scheduler kubectl) missing=()
  for c in "${cmds[@]}"; do [ -x "$cache/bin/$c-$kver" ] && [ -z "$pin" ] || missing+=("$c"); done
  if [ ${#missing[@]} -eq 0 ]; then log "kubelet, controller-manager, scheduler, kubectl $kver: cached"; return; fi
  local work="$cache/src/kube-node-$kver"
  rm -rf "$work" && mkdir -p "$work"
  (
    cd "$work"
    # tools.go keeps the commands' modules in go.mod through `go mod tidy`.
    cp "$here/kube-node/tools.go" .
    module_for kube-node k8s.io/kubernetes "$kver" require_kubernetes "$kver"
    local major=${kver#v}; major=${major%%.*}
    local minor=${kver#v*.}; minor=${minor%%.*}
    local pkg=k8s.io/component-base/version
    mkdir -p out
    log "${missing[*]} $kver: building"
    local pkgs=()
    for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
    go build -trimpath -o out/ -ldflags "-s -w \
      -X $pkg.gitVersion=$kver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor \
      -X $pkg.gitTreeState=clean \
      -X k8s.io/client-go/pkg/version.gitVersion=$kver" "${pkgs[@]}"
    for c in "${missing[@]}"; do mv "out/$c" "$cache/bin/$c-$kver"; done
  )
  log "${missing[*]} $kver: built"
}

require_etcd() { printf '\nrequire go.etcd.io/etcd/server/v3 %s\n' "$1" >> go.mod; }

build_etcd() {
  local ever=$1 out="$cache/bin/etcd-$1"
  if [ -x "$out" ] && [ -z "$pin" ]; then log "etcd $ever: cached ($out)"; return; fi
  local work="$cache/src/etcd-$ever"
  rm -rf "$work" && mkdir -p "$work"
  cp "$here/etcd/main.go" "$work/"
  (
    cd "$work"
    module_for etcd go.etcd.io/etcd/server/v3 "$ever" require_etcd "$ever"
    log "etcd $ever: building"
    go build -trimpath -o "$out.tmp" -ldflags "-s -w" .
  )
  mv "$out.tmp" "$out"
  log "etcd $ever: built ($(du -h "$out" | cut -f1))"
}

# The prometheus-operator CRDs deploy/monitoring needs (PodMonitor,
# PrometheusRule), as the project publishes them: the YAML in its Go module
# (example/prometheus-operator-crd), served by the Go module proxy.
fetch_prometheus_crds() {
  local ver=$1 out="$cache/crds/prometheus-operator-$1"
  if [ -f "$out/monitoring.coreos.com_podmonitors.yaml" ]; then log "prometheus-operator CRDs $ver: cached"; return; fi
  local dir
  dir=$(cd "$cache/src" && go mod download -json "github.com/prometheus-operator/prometheus-operator@$ver" \
    | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
  [ -d "$dir/example/prometheus-operator-crd" ] || { log "no CRDs in prometheus-operator $ver"; exit 1; }
  mkdir -p "$out.tmp"
  cp "$dir"/example/prometheus-operator-crd/monitoring.coreos.com_{podmonitors,prometheusrules}.yaml "$out.tmp/"
  rm -rf "$out" && mv "$out.tmp" "$out"
  log "prometheus-operator CRDs $ver: $out"
}

start=$(date +%s)
build_etcd "$etcd_version"
build_apiserver "$apiserver_version"
# Extra versions are never pinned (the pin is the default version's).
for v in $extra; do (pin=; build_apiserver "$v"); done
[ -n "${HEADROOM_SKIP_NODE_BINARIES:-}" ] || build_node_components "$apiserver_version"
[ -n "${HEADROOM_SKIP_NODE_BINARIES:-}" ] || fetch_prometheus_crds "${HEADROOM_PROMETHEUS_OPERATOR_VERSION:-v0.94.0}"
log "done in $(( $(date +%s) - start ))s; binaries in $cache/bin"
