#!/usr/bin/env bash
# Builds helm (helm.sh/helm/v3, pinned in go.mod/go.sum beside this script) from
# the Go module proxy into the cache directory, for the chart tests
# (tests/tests/helm.rs: lint, template, apply the rendered chart). A no-op when
# the binary is there.
#
#   tests/tools/helm/build.sh     # -> $HEADROOM_CACHE_DIR/bin/helm-v3.22.0
#
# go.sum is committed, so every dependency is the one reviewed here; the build
# runs in a copy of this module (the Go toolchain writes nothing into the repo).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
cache=${HEADROOM_CACHE_DIR:-$repo/.cache}
version=$(awk '$1 == "require" && $2 == "helm.sh/helm/v3" {print $3}' "$here/go.mod")
out=$cache/bin/helm-$version

log() { printf 'helm: %s\n' "$*" >&2; }
[ -n "$version" ] || { log "no helm.sh/helm/v3 require line in $here/go.mod"; exit 1; }
if [ -x "$out" ]; then log "$version: cached ($out)"; exit 0; fi

# helm's Makefile stamps the Kubernetes version its client libraries speak (the
# default of `helm template`'s .Capabilities.KubeVersion and of the lint's
# deprecation check); without it helm assumes v1.20.
client_go=$(awk '$1 == "k8s.io/client-go" {print $2}' "$here/go.mod")
k8s_minor=${client_go#v0.}; k8s_minor=${k8s_minor%%.*}
[ -n "$k8s_minor" ] || { log "no k8s.io/client-go in $here/go.mod"; exit 1; }

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
work="$cache/src/helm-$version"
rm -rf "$work" && mkdir -p "$work" "$cache/bin"
cp "$here/go.mod" "$here/go.sum" "$here/tools.go" "$work/"
start=$(date +%s)
(
  cd "$work"
  log "$version: building"
  go build -trimpath -o "$out.tmp" \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version \
      -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor \
      -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor" \
    helm.sh/helm/v3/cmd/helm
)
mv "$out.tmp" "$out"
log "$version: built in $(( $(date +%s) - start ))s ($(du -h "$out" | cut -f1))"
