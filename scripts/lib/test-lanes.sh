#!/usr/bin/env bash
# Tier 1 in lanes: builds every test binary of the workspace once, then runs
# them HEADROOM_TEST_LANES (default 2) at a time, slowest first, each from its
# package's directory as `cargo test` would; then the doc tests.
#
# Why not `cargo test`: it holds the build directory's lock while its test
# binaries run, so a second `cargo test` waits for the first; and it runs the
# binaries one after another, while most of tier 1's time is spent waiting on
# the control plane, the simulated kubelet and the agents' ticks (about a
# quarter of cold CI's CPU sat idle). Each binary's output is printed whole
# when it ends, so lanes never interleave. The first failing binary stops the
# queue: no new binary starts, the running ones end (each test binary kills
# what it started), the script fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
lanes=${HEADROOM_TEST_LANES:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The slowest binaries (cold CI, in seconds: coexistence 77, agent_soak 72,
# agent_reconcile 52, agent_faults 47, demo 46, ...) start first so no lane
# is left with a long one at the end; the rest follow in cargo's order.
slow='coexistence agent_soak agent_reconcile agent_faults demo agent_verify agent_declared sim_kubelet harness dashboard'

cargo test --workspace --locked --no-run --message-format=json-render-diagnostics >"$work/build.json"
# One "manifest-dir<TAB>executable" line per test binary (profile.test), from
# cargo's compiler-artifact messages.
grep '"reason":"compiler-artifact"' "$work/build.json" |
  grep -E '"profile":\{[^}]*"test":true' |
  sed -nE 's/.*"manifest_path":"([^"]*)\/Cargo.toml".*"executable":"([^"]*)".*/\1\t\2/p' >"$work/all"
[ -s "$work/all" ] || { echo "test-lanes: cargo built no test binary" >&2; exit 1; }
for s in $slow; do echo "/deps/${s}-"; done >"$work/slow-pat"
{
  for s in $slow; do grep -E "/deps/${s}-[0-9a-f]+$" "$work/all" || true; done
  grep -v -F -f "$work/slow-pat" "$work/all" || true
} >"$work/queue"

run_one() {
  local dir=${1%%$'\t'*} exe=${1#*$'\t'}
  # After a failure the rest of the queue drains without running.
  if compgen -G "$WORK/failed.*" >/dev/null; then return 0; fi
  local log
  log="$WORK/$(basename "$exe").log"
  local start=$SECONDS rc=0
  (cd "$dir" && CARGO_MANIFEST_DIR=$dir "$exe") >"$log" 2>&1 || rc=$?
  {
    echo "     Running ${exe#"$PWD"/} (lane, $((SECONDS - start)) s)"
    cat "$log"
  } | flock "$WORK/out.lock" cat
  if [ "$rc" != 0 ]; then
    echo "test binary failed (exit $rc): $exe" >"$WORK/failed.$(basename "$exe")"
    return 1
  fi
}
export -f run_one
export WORK=$work

echo "== tier 1: $(wc -l <"$work/queue") test binaries, $lanes at a time"
rc=0
tr '\n' '\0' <"$work/queue" | xargs -0 -P "$lanes" -n 1 bash -c 'run_one "$1"' _ || rc=$?
if [ "$rc" != 0 ] || compgen -G "$work/failed.*" >/dev/null; then
  cat "$work"/failed.* >&2 2>/dev/null || true
  for f in "$work"/failed.*; do
    [ -e "$f" ] || continue
    echo "== why ${f##*/failed.} failed" >&2
    bash scripts/lib/failure-digest.sh "$work/${f##*/failed.}.log" 8 >&2
  done
  echo "tier 1 failed (xargs exit $rc)" >&2
  exit 1
fi
cargo test --workspace --locked --doc
