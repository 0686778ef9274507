#!/usr/bin/env bash
# Builds the static (musl) release binary of headroom-agent, checks that it is static
# and prints its size. The Dockerfile runs this same script, so CI proves what the
# image build needs.
#
#   scripts/static-build.sh                 # -> target/x86_64-unknown-linux-musl/release/headroom-agent
#   scripts/static-build.sh --out DIR/FILE  # also copy the binary there
#
# Installs what it needs when missing (idempotent): the rustup target and a musl C
# compiler (Debian musl-tools; ring compiles C and assembly for the target).
set -euo pipefail

target=x86_64-unknown-linux-musl
max_bytes=$((25 * 1024 * 1024))
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=

while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a path}; shift 2 ;;
    *) echo "usage: $0 [--out PATH]" >&2; exit 2 ;;
  esac
done

log() { printf 'static-build: %s\n' "$*" >&2; }

# shellcheck source=lib/packages.sh
. "$repo/scripts/lib/packages.sh"

if ! rustup target list --installed | grep -qx "$target"; then
  log "adding rustup target $target"
  rustup target add "$target"
fi
if ! command -v musl-gcc >/dev/null; then
  log "installing musl-tools"
  apt_install musl-tools
fi
for tool in file readelf; do
  command -v "$tool" >/dev/null || { log "missing $tool (file, binutils)"; exit 1; }
done

export CC_x86_64_unknown_linux_musl=musl-gcc
start=$(date +%s)
cargo build --manifest-path "$repo/Cargo.toml" --locked --release \
  --target "$target" -p headroom-agent --bin headroom-agent
bin=${CARGO_TARGET_DIR:-$repo/target}/$target/release/headroom-agent
log "built in $(( $(date +%s) - start ))s: $bin"

# Static: no program interpreter (PT_INTERP) and no dynamic libraries needed.
if readelf -lW "$bin" | grep -q 'INTERP'; then
  log "FAIL: $bin has a program interpreter (dynamic executable)"; exit 1
fi
if readelf -dW "$bin" 2>/dev/null | grep -q 'NEEDED'; then
  log "FAIL: $bin needs shared libraries"; readelf -dW "$bin" | grep NEEDED >&2; exit 1
fi
log "$(file -b "$bin")"

size=$(stat -c %s "$bin")
log "size: $size bytes ($(( size / 1024 )) KiB)"
if [ "$size" -gt "$max_bytes" ]; then
  log "FAIL: larger than 25 MiB"; exit 1
fi

if [ -n "$out" ]; then
  mkdir -p "$(dirname "$out")"
  cp "$bin" "$out"
  log "copied to $out"
fi
