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

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$cache/bin" "$cache/src"

log() { printf 'control-plane: %s\n' "$*" >&2; }

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

build_apiserver() {
  local kver=$1 out="$cache/bin/kube-apiserver-$1"
  if [ -x "$out" ]; then log "kube-apiserver $kver: cached ($out)"; return; fi
  local work="$cache/src/kube-apiserver-$kver"
  rm -rf "$work" && mkdir -p "$work"
  cp "$here/kube-apiserver/main.go" "$work/"
  (
    cd "$work"
    # Fetch the module's go.mod from a throwaway module so `go mod download`
    # has a context.
    go mod init headroom.test/kube-apiserver >/dev/null 2>&1
    { echo; echo "require k8s.io/kubernetes $kver"; replace_lines "$kver"; } >> go.mod
    log "kube-apiserver $kver: resolving modules"
    go mod tidy >/dev/null
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
  for c in "${cmds[@]}"; do [ -x "$cache/bin/$c-$kver" ] || missing+=("$c"); done
  if [ ${#missing[@]} -eq 0 ]; then log "kubelet, controller-manager, scheduler, kubectl $kver: cached"; return; fi
  local work="$cache/src/kube-node-$kver"
  rm -rf "$work" && mkdir -p "$work"
  (
    cd "$work"
    go mod init headroom.test/kube-node >/dev/null 2>&1
    { echo; echo "require k8s.io/kubernetes $kver"; replace_lines "$kver"; } >> go.mod
    # Keeps the commands' modules in go.mod through `go mod tidy`; never compiled.
    { echo '//go:build tools'; echo; echo 'package tools'; echo; echo 'import ('
      for c in "${missing[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
      echo ')'; } > tools.go
    log "${missing[*]} $kver: resolving modules"
    go mod tidy >/dev/null
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

build_etcd() {
  local ever=$1 out="$cache/bin/etcd-$1"
  if [ -x "$out" ]; then log "etcd $ever: cached ($out)"; return; fi
  local work="$cache/src/etcd-$ever"
  rm -rf "$work" && mkdir -p "$work"
  cp "$here/etcd/main.go" "$work/"
  (
    cd "$work"
    go mod init headroom.test/etcd >/dev/null 2>&1
    printf '\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ever" >> go.mod
    log "etcd $ever: resolving modules"
    go mod tidy >/dev/null
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
for v in $extra; do build_apiserver "$v"; done
[ -n "${HEADROOM_SKIP_NODE_BINARIES:-}" ] || build_node_components "$apiserver_version"
[ -n "${HEADROOM_SKIP_NODE_BINARIES:-}" ] || fetch_prometheus_crds "${HEADROOM_PROMETHEUS_OPERATOR_VERSION:-v0.94.0}"
log "done in $(( $(date +%s) - start ))s; binaries in $cache/bin"
