#!/usr/bin/env bash
# Builds the static (musl) release binary of headroom-agent, checks that it is static
# and for the right machine, and prints its size. The Dockerfile runs this same
# script, so CI proves what the image build needs.
#
#   scripts/static-build.sh                 # -> target/x86_64-unknown-linux-musl/release/headroom-agent
#   scripts/static-build.sh --arch arm64    # -> target/aarch64-unknown-linux-musl/release/headroom-agent
#   scripts/static-build.sh --out DIR/FILE  # also copy the binary there
#
# Installs what it needs when missing (idempotent): the rustup target and a C
# compiler for it (ring compiles C and assembly): Debian musl-tools for amd64,
# Debian's aarch64 cross toolchain (gcc-aarch64-linux-gnu) for arm64, which also
# links (Rust's musl targets bring their own libc and start files, so the glibc
# cross gcc is only the driver of the link).
set -euo pipefail

arch=amd64
max_bytes=$((25 * 1024 * 1024))
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=

while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a path}; shift 2 ;;
    --arch) arch=${2:?--arch needs amd64 or arm64}; shift 2 ;;
    *) echo "usage: $0 [--arch amd64|arm64] [--out PATH]" >&2; exit 2 ;;
  esac
done
case $arch in
  amd64|x86_64) target=x86_64-unknown-linux-musl machine='x86-64' ;;
  arm64|aarch64) target=aarch64-unknown-linux-musl machine='ARM aarch64' ;;
  *) echo "static-build: unknown --arch $arch (amd64 or arm64)" >&2; exit 2 ;;
esac

log() { printf 'static-build: %s\n' "$*" >&2; }

# shellcheck source=lib/packages.sh
. "$repo/scripts/lib/packages.sh"

if ! rustup target list --installed | grep -qx "$target"; then
  log "adding rustup target $target"
  rustup target add "$target"
fi
if [ "$target" = x86_64-unknown-linux-musl ]; then
  if ! command -v musl-gcc >/dev/null; then
    log "installing musl-tools"
    apt_install musl-tools
  fi
  export CC_x86_64_unknown_linux_musl=musl-gcc
else
  # The compiler and the target's C headers (ring includes <stdint.h>, <string.h>),
  # which Debian packages apart (libc6-dev-arm64-cross is only recommended).
  if ! command -v aarch64-linux-gnu-gcc >/dev/null || [ ! -f /usr/aarch64-linux-gnu/include/stdint.h ]; then
    log "installing gcc-aarch64-linux-gnu"
    apt_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross
  fi
  export CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
fi
for tool in file readelf; do
  command -v "$tool" >/dev/null || { log "missing $tool (file, binutils)"; exit 1; }
done

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
desc=$(file -b "$bin")
log "$desc"
case $desc in
  *"$machine"*) ;;
  *) log "FAIL: $bin is not a $machine executable"; exit 1 ;;
esac

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
