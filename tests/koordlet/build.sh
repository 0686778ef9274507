#!/usr/bin/env bash
# Builds Koordinator's koordlet (the node agent whose CPU Burst is the peer the
# benefit bench compares Headroom with, issue 48) from the Go module
# github.com/koordinator-sh/koordinator at a pinned version, through a wrapper
# module as tests/control-plane/build.sh builds Kubernetes, into the same cache.
# Also copies the CRDs and RBAC koordlet needs out of the module.
# A no-op when the binary is already there.
#
#   nice -n 19 tests/koordlet/build.sh           # v1.8.0
#   tests/koordlet/build.sh --pin                # re-resolve and rewrite the pin
#
# Pin: wrapper/go.mod and wrapper/go.sum are committed, so the default version
# builds exactly the module graph reviewed here (-mod=readonly). Another
# version (HEADROOM_KOORDLET_VERSION) is resolved afresh and says so. The
# module proxy here serves v1.6.0, v1.7.0 and v1.8.0 when asked for the exact
# version (it refuses the version list).
#
# koordinator's go.mod `replace`s ~52 modules (Kubernetes 1.35.2 libraries,
# grpc, prometheus, ...); a dependency's replace directives are not inherited,
# so the wrapper copies them from the go.mod the proxy serves.
#
# koordlet needs cgo and libpfm4 (pkg/koordlet/util/perf_group: #cgo LDFLAGS:
# -lpfm); Debian's libpfm4-dev is installed on first use. libpfm is linked
# statically (a -L directory holding only libpfm.a), so the binary needs only
# glibc and runs in the node VMs without libpfm4 installed there.
#
# Cache: $HEADROOM_CACHE_DIR (default: <repo>/.cache)
#   $HEADROOM_CACHE_DIR/bin/koordlet-v1.8.0
#   $HEADROOM_CACHE_DIR/crds/koordinator-v1.8.0/{slo.koordinator.sh_nodeslos,
#     slo.koordinator.sh_nodemetrics,topology.node.k8s.io_noderesourcetopologies}.yaml
#   $HEADROOM_CACHE_DIR/crds/koordinator-v1.8.0/rbac-koordlet.yaml
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${HEADROOM_CACHE_DIR:-$repo/.cache}
version=${HEADROOM_KOORDLET_VERSION:-v1.8.0}
mod=github.com/koordinator-sh/koordinator

pin=
[ "${1:-}" = --pin ] && pin=1

log() { printf 'koordlet: %s\n' "$*" >&2; }

out="$cache/bin/koordlet-$version"
crds="$cache/crds/koordinator-$version"
if [ -x "$out" ] && [ -f "$crds/rbac-koordlet.yaml" ] && [ -z "$pin" ]; then
  log "$version: cached ($out)"
  exit 0
fi

# shellcheck source=../../scripts/lib/packages.sh
. "$repo/scripts/lib/packages.sh"
pfm_a=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/libpfm.a
if [ ! -f /usr/include/perfmon/pfmlib.h ] || [ ! -f "$pfm_a" ]; then
  log "installing libpfm4-dev"
  apt_install libpfm4-dev gcc libc6-dev
fi

export GOTOOLCHAIN=local CGO_ENABLED=1
mkdir -p "$cache/bin" "$cache/src" "$cache/crds"
start=$(date +%s)

work="$cache/src/koordlet-$version"
rm -rf "$work" && mkdir -p "$work/pfm"
ln -s "$pfm_a" "$work/pfm/libpfm.a"
cp "$here/wrapper/tools.go" "$work/"

# The replace directives of koordinator's go.mod ($1), one `replace` line each.
replace_lines() {
  awk '
    /^replace[ \t]*\($/ { inblock = 1; next }
    inblock && /^\)/     { inblock = 0; next }
    inblock              { sub(/\/\/.*/, ""); if ($0 ~ /=>/) print "replace " $0; next }
    /^replace[ \t]/      { sub(/\/\/.*/, ""); print }
  ' "$1"
}

pinned_version() {
  awk -v m="$mod" '$1 == m {print $2} $1 == "require" && $2 == m {print $3}' "$here/wrapper/go.mod" 2>/dev/null | head -1
}

(
  cd "$work"
  if [ -z "$pin" ] && [ "$(pinned_version)" = "$version" ]; then
    cp "$here/wrapper/go.mod" "$here/wrapper/go.sum" .
    export GOFLAGS="-mod=readonly -buildvcs=false"
    log "$version: pinned ($here/wrapper/go.sum)"
  else
    export GOFLAGS="-mod=mod -buildvcs=false"
    gomod=$(go mod download -json "$mod@$version" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
    [ -f "$gomod" ] || { log "cannot fetch go.mod of $mod@$version"; exit 1; }
    go mod init headroom.test/koordlet >/dev/null 2>&1
    { echo; echo "require $mod $version"; replace_lines "$gomod"; } >> go.mod
    log "$version: resolving modules (not pinned; $(replace_lines "$gomod" | wc -l) replace directives copied)"
    go mod tidy >/dev/null
    if [ -n "$pin" ]; then
      cp go.mod go.sum "$here/wrapper/"
      log "$version: pinned into $here/wrapper"
    fi
  fi

  log "$version: building (cgo, libpfm static)"
  CGO_LDFLAGS="-L$work/pfm" go build -trimpath -o "$out.tmp" -ldflags "-s -w" "$mod/cmd/koordlet"

  # CRDs and RBAC koordlet needs, from the same module (config/crd/bases, config/rbac).
  dir=$(go mod download -json "$mod@$version" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
  mkdir -p "$crds.tmp"
  cp "$dir"/config/crd/bases/{slo.koordinator.sh_nodeslos,slo.koordinator.sh_nodemetrics,topology.node.k8s.io_noderesourcetopologies}.yaml "$crds.tmp/"
  cp "$dir/config/rbac/koordlet.yaml" "$crds.tmp/rbac-koordlet.yaml"
  chmod -R u+w "$crds.tmp"   # the module cache is read-only
  rm -rf "$crds" && mv "$crds.tmp" "$crds"
)
mv "$out.tmp" "$out"
log "$version: built in $(( $(date +%s) - start ))s ($(du -h "$out" | cut -f1), $out; CRDs and RBAC in $crds)"
