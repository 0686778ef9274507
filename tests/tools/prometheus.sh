#!/usr/bin/env bash
# Installs Prometheus and promtool (Debian's `prometheus` package) for the alert
# rule tests (promtool check/test rules) and the dashboard query test, which
# start their own prometheus on loopback with a temporary config and data dir.
# A no-op when both are installed.
#
# The package's own service is kept from starting (policy-rc.d answers 101 for
# the duration of the install): nothing here uses it, and it would scrape and
# store for nothing.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
log() { printf 'prometheus: %s\n' "$*" >&2; }
# shellcheck source=../../scripts/lib/packages.sh
. "$repo/scripts/lib/packages.sh"

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  log "installed ($(prometheus --version 2>&1 | head -n1))"; exit 0
fi
policy=/usr/sbin/policy-rc.d
made_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# Written by tests/tools/prometheus.sh during its install.\nexit 101\n' \
    | as_root tee "$policy" >/dev/null
  as_root chmod 0755 "$policy"
  made_policy=1
fi
start=$(date +%s)
log "installing Debian's prometheus"
rc=0
apt_install prometheus || rc=$?
[ -z "$made_policy" ] || as_root rm -f "$policy"
[ "$rc" -eq 0 ] || { log "apt install failed ($rc)"; exit "$rc"; }
log "installed in $(( $(date +%s) - start ))s ($(prometheus --version 2>&1 | head -n1))"
