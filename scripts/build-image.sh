#!/usr/bin/env bash
# Builds the agent's container image without Docker: the image the Dockerfile's
# final stage describes (FROM scratch, the static binary at /headroom-agent,
# USER 65532:65532, EXPOSE 9464/tcp, ENTRYPOINT ["/headroom-agent"], CMD ["run"],
# the LABELs), assembled with umoci and exported with skopeo as a Docker archive —
# the format `ctr images import` and `kind load image-archive` read.
# tests/tests/image.rs checks the result against the Dockerfile, so the two
# cannot drift: change one, change the other.
#
#   scripts/build-image.sh                  # -> $HEADROOM_CACHE_DIR/images/headroom-agent.tar
#   scripts/build-image.sh --out FILE [--tag headroom-agent:0.1.0] [--binary PATH]
#
# The binary defaults to scripts/static-build.sh's (built when missing or stale).
# Installs umoci and skopeo (Debian) when missing.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${HEADROOM_CACHE_DIR:-$repo/.cache}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n1)
tag=headroom-agent:$version
out=$cache/images/headroom-agent.tar
binary=

while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a path}; shift 2 ;;
    --tag) tag=${2:?--tag needs name:tag}; shift 2 ;;
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    *) echo "usage: $0 [--out FILE] [--tag NAME:TAG] [--binary PATH]" >&2; exit 2 ;;
  esac
done

log() { printf 'build-image: %s\n' "$*" >&2; }
# shellcheck source=lib/packages.sh
. "$repo/scripts/lib/packages.sh"

need=()
command -v umoci >/dev/null || need+=(umoci)
command -v skopeo >/dev/null || need+=(skopeo)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  apt_install "${need[@]}"
fi

if [ -z "$binary" ]; then
  bash "$repo/scripts/static-build.sh" >/dev/null
  binary=${CARGO_TARGET_DIR:-$repo/target}/x86_64-unknown-linux-musl/release/headroom-agent
fi
[ -x "$binary" ] || { log "no binary at $binary"; exit 1; }

# Same image for the same inputs: skip when binary, tag and this script are unchanged.
key=$(cat "$binary" "${BASH_SOURCE[0]}" <(echo "$tag") | sha256sum | cut -c1-16)
if [ -f "$out" ] && [ "$(cat "$out.key" 2>/dev/null)" = "$key" ]; then
  log "cached: $out ($tag)"; exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
oci=$work/oci
ref=${tag##*:}
umoci init --layout "$oci"
umoci new --image "$oci:$ref"
# One layer: the binary, owned by root, mode 0755 (Dockerfile: COPY, no --chown).
# unpack + repack, not `umoci insert`: 0.4.7's insert writes a layer without
# the tar padding and end blocks.
umoci unpack --image "$oci:$ref" "$work/bundle" >/dev/null
install -m 0755 -o 0 -g 0 "$binary" "$work/bundle/rootfs/headroom-agent"
umoci repack --image "$oci:$ref" --history.created_by "COPY /out/headroom-agent /headroom-agent" \
  "$work/bundle"
umoci config --image "$oci:$ref" \
  --config.user 65532:65532 \
  --config.exposedports 9464/tcp \
  --config.entrypoint /headroom-agent \
  --config.cmd run \
  --config.label org.opencontainers.image.title=headroom-agent \
  --config.label org.opencontainers.image.description="Headroom: node-level CPU limit right-sizer for Kubernetes" \
  --config.label org.opencontainers.image.version="$version" \
  --config.label org.opencontainers.image.licenses=Apache-2.0 \
  --os linux --architecture amd64
umoci gc --layout "$oci"

mkdir -p "$(dirname "$out")"
rm -f "$out.tmp"
skopeo copy --quiet "oci:$oci:$ref" "docker-archive:$out.tmp:$tag"
mv "$out.tmp" "$out"
echo "$key" > "$out.key"
log "built $out ($tag, $(du -h "$out" | cut -f1))"
