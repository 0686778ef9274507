#!/usr/bin/env bash
# Builds the real VPA updater (k8s.io/autoscaler/vertical-pod-autoscaler,
# pkg/updater) from the Go module proxy and caches it with the VPA CRDs from
# the same module, for tests/tests/coexistence.rs. A no-op when both are there.
#
#   tests/vpa/build.sh                               # v1.8.1
#   HEADROOM_VPA_VERSION=v1.8.0 tests/vpa/build.sh   # another version (not pinned)
#
# Pin: the default version's module sum (go.sum's h1: hash of the module zip)
# is checked below, and the build uses the module's own go.mod and go.sum
# (-mod=readonly), so it builds exactly the dependency graph VPA released —
# what `go install k8s.io/autoscaler/vertical-pod-autoscaler/pkg/updater@v1.8.1`
# would build. v1.8.x: InPlaceOrRecreate is GA (no feature gate), InPlace is
# alpha behind --feature-gates=InPlace=true.
#
# Cache: $HEADROOM_CACHE_DIR (default: <repo>/.cache), layout
#   $HEADROOM_CACHE_DIR/bin/vpa-updater-v1.8.1
#   $HEADROOM_CACHE_DIR/crds/vpa-v1.8.1/vpa-v1-crd-gen.yaml
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${HEADROOM_CACHE_DIR:-$repo/.cache}
default_version=v1.8.1
default_sum='h1:Pe8bV1wozN4gOKO1rleiIY5alIyAXN+DnXDbXQcL4fI='
version=${HEADROOM_VPA_VERSION:-$default_version}
module=k8s.io/autoscaler/vertical-pod-autoscaler
out=$cache/bin/vpa-updater-$version
crds=$cache/crds/vpa-$version

export GOTOOLCHAIN=local CGO_ENABLED=0
log() { printf 'vpa: %s\n' "$*" >&2; }

if [ -x "$out" ] && [ -f "$crds/vpa-v1-crd-gen.yaml" ]; then
  log "updater $version: cached ($out)"
  exit 0
fi
mkdir -p "$cache/bin" "$cache/src"
start=$(date +%s)
json=$(cd "$cache/src" && go mod download -json "$module@$version")
dir=$(printf '%s\n' "$json" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
sum=$(printf '%s\n' "$json" | sed -n 's/.*"Sum": "\(.*\)",*/\1/p')
[ -d "$dir/pkg/updater" ] || { log "no pkg/updater in $module@$version"; exit 1; }
if [ "$version" = "$default_version" ]; then
  [ "$sum" = "$default_sum" ] || { log "$module@$version: sum $sum, pinned $default_sum"; exit 1; }
  log "updater $version: pinned ($sum)"
else
  log "updater $version: not pinned ($sum)"
fi

mkdir -p "$crds.tmp"
cp "$dir/deploy/vpa-v1-crd-gen.yaml" "$crds.tmp/"
rm -rf "$crds" && mv "$crds.tmp" "$crds"

if [ ! -x "$out" ]; then
  log "updater $version: building"
  # The module directory is read-only; outputs go to the build cache and $out.
  (cd "$dir" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" -o "$out.tmp" ./pkg/updater)
  mv "$out.tmp" "$out"
fi
log "updater $version: built in $(( $(date +%s) - start ))s ($(du -h "$out" | cut -f1)); CRDs in $crds"
