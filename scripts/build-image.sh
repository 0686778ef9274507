#!/usr/bin/env bash
# Builds the agent's container image without Docker, for linux/amd64 and
# linux/arm64: per architecture, the image the Dockerfile's final stage describes
# (FROM scratch, the static binary at /headroom-agent, USER 65532:65532,
# EXPOSE 9464/tcp, ENTRYPOINT ["/headroom-agent"], CMD ["run"], the LABELs),
# assembled with umoci; then one OCI image index over the two, checked and
# exported with skopeo. Outputs:
#
#   $HEADROOM_CACHE_DIR/images/headroom-agent-oci/   OCI layout; tags <version> (the
#                                                    index), <version>-amd64, <version>-arm64
#   <the --oci DIR's parent>/headroom-agent.oci.tar  the index and both images (oci-archive),
#                                                    e.g. `skopeo copy --all oci-archive:FILE docker://REGISTRY/headroom-agent:<version>`
#   $HEADROOM_CACHE_DIR/images/headroom-agent.tar    linux/amd64 as a Docker archive (what
#                                                    `ctr images import` and `kind load image-archive` read)
#
# tests/tests/image.rs checks both images against the Dockerfile, so the two
# cannot drift: change one, change the other.
#
#   scripts/build-image.sh [--out FILE] [--oci DIR] [--tag headroom-agent:0.1.0]
#                          [--binary PATH] [--arm64-binary PATH]
#
# The binaries default to scripts/static-build.sh's (built when missing or stale).
# Installs umoci and skopeo (Debian) when missing.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${HEADROOM_CACHE_DIR:-$repo/.cache}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n1)
tag=headroom-agent:$version
out=$cache/images/headroom-agent.tar
oci_out=$cache/images/headroom-agent-oci
binary=
arm64_binary=

while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a path}; shift 2 ;;
    --oci) oci_out=${2:?--oci needs a directory}; shift 2 ;;
    --tag) tag=${2:?--tag needs name:tag}; shift 2 ;;
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --arm64-binary) arm64_binary=${2:?--arm64-binary needs a path}; shift 2 ;;
    *) echo "usage: $0 [--out FILE] [--oci DIR] [--tag NAME:TAG] [--binary PATH] [--arm64-binary PATH]" >&2; exit 2 ;;
  esac
done

log() { printf 'build-image: %s\n' "$*" >&2; }
# shellcheck source=lib/packages.sh
. "$repo/scripts/lib/packages.sh"

need=()
command -v umoci >/dev/null || need+=(umoci)
command -v skopeo >/dev/null || need+=(skopeo)
command -v jq >/dev/null || need+=(jq)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  apt_install "${need[@]}"
fi

target_dir=${CARGO_TARGET_DIR:-$repo/target}
if [ -z "$binary" ]; then
  bash "$repo/scripts/static-build.sh" >/dev/null
  binary=$target_dir/x86_64-unknown-linux-musl/release/headroom-agent
fi
if [ -z "$arm64_binary" ]; then
  bash "$repo/scripts/static-build.sh" --arch arm64 >/dev/null
  arm64_binary=$target_dir/aarch64-unknown-linux-musl/release/headroom-agent
fi
for b in "$binary" "$arm64_binary"; do [ -x "$b" ] || { log "no binary at $b"; exit 1; }; done

# Same images for the same inputs: skip when binaries, tag and this script are unchanged.
key=$(cat "$binary" "$arm64_binary" "${BASH_SOURCE[0]}" <(echo "$tag") | sha256sum | cut -c1-16)
oci_archive=$(dirname "$oci_out")/headroom-agent.oci.tar
if [ -f "$out" ] && [ -f "$oci_archive" ] && [ -f "$oci_out/index.json" ] \
  && [ "$(cat "$out.key" 2>/dev/null)" = "$key" ] && [ "$(cat "$oci_out.key" 2>/dev/null)" = "$key" ]; then
  log "cached: $oci_out, $oci_archive, $out ($tag)"; exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
oci=$work/oci
ref=${tag##*:}
umoci init --layout "$oci"

# image ARCH BINARY: one single-layer image tagged <ref>-ARCH in the layout.
image() {
  local arch=$1 bin=$2 img="$oci:$ref-$1"
  umoci new --image "$img"
  # One layer: the binary, owned by root, mode 0755 (Dockerfile: COPY, no --chown).
  # unpack + repack, not `umoci insert`: 0.4.7's insert writes a layer without
  # the tar padding and end blocks.
  umoci unpack --image "$img" "$work/bundle-$arch" >/dev/null
  install -m 0755 -o 0 -g 0 "$bin" "$work/bundle-$arch/rootfs/headroom-agent"
  umoci repack --image "$img" --history.created_by "COPY /out/headroom-agent /headroom-agent" \
    "$work/bundle-$arch"
  umoci config --image "$img" \
    --config.user 65532:65532 \
    --config.exposedports 9464/tcp \
    --config.entrypoint /headroom-agent \
    --config.cmd run \
    --config.label org.opencontainers.image.title=headroom-agent \
    --config.label org.opencontainers.image.description="Headroom: node-level CPU limit right-sizer for Kubernetes" \
    --config.label org.opencontainers.image.version="$version" \
    --config.label org.opencontainers.image.licenses=Apache-2.0 \
    --os linux --architecture "$arch"
}
image amd64 "$binary"
image arm64 "$arm64_binary"
umoci gc --layout "$oci"

# The image index: the two manifests with their platforms, as a blob, tagged
# <ref> in the layout's index.json (umoci has no command for a multi-platform
# index; skopeo below reads it back, so a malformed one fails the build).
descriptor() {
  jq -c --arg ref "$ref-$1" --arg arch "$1" \
    '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $ref)
     | {mediaType, digest, size, platform: {architecture: $arch, os: "linux"}}' "$oci/index.json"
}
jq -cn --argjson a "$(descriptor amd64)" --argjson b "$(descriptor arm64)" \
  '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests: [$a, $b]}' \
  > "$work/image-index.json"
digest=$(sha256sum "$work/image-index.json" | cut -d' ' -f1)
size=$(stat -c %s "$work/image-index.json")
cp "$work/image-index.json" "$oci/blobs/sha256/$digest"
jq --arg d "sha256:$digest" --argjson s "$size" --arg ref "$ref" \
  '.manifests += [{mediaType: "application/vnd.oci.image.index.v1+json", digest: $d, size: $s,
                   annotations: {"org.opencontainers.image.ref.name": $ref}}]' \
  "$oci/index.json" > "$work/index.json"
mv "$work/index.json" "$oci/index.json"

mkdir -p "$(dirname "$out")" "$(dirname "$oci_out")"
rm -f "$out.tmp" "$oci_archive.tmp"
# --all: the index and every image it lists (a failed read of the index fails here).
skopeo copy --quiet --all "oci:$oci:$ref" "oci-archive:$oci_archive.tmp:$ref"
skopeo copy --quiet "oci:$oci:$ref-amd64" "docker-archive:$out.tmp:$tag"
rm -rf "$oci_out.tmp" && cp -r "$oci" "$oci_out.tmp"
rm -rf "$oci_out" && mv "$oci_out.tmp" "$oci_out"
mv "$oci_archive.tmp" "$oci_archive"
mv "$out.tmp" "$out"
echo "$key" > "$out.key"
echo "$key" > "$oci_out.key"

# Compressed size per architecture: config + manifest + the gzip layer, as a
# registry stores and a node pulls them.
for arch in amd64 arm64; do
  m=$(jq -r --arg ref "$ref-$arch" \
    '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $ref) | .digest' \
    "$oci_out/index.json")
  bytes=$(jq -r '[.config.size, (.layers[].size)] | add' "$oci_out/blobs/sha256/${m#sha256:}")
  bytes=$(( bytes + $(stat -c %s "$oci_out/blobs/sha256/${m#sha256:}") ))
  log "linux/$arch: $bytes bytes compressed ($(( bytes / 1024 )) KiB)"
done
log "built $oci_out (index $ref), $oci_archive, $out ($tag, linux/amd64)"
