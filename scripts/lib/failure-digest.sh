#!/usr/bin/env bash
# Prints, from a test run's log, each panic's location and the first lines of
# its message, short enough to sit at the very end of the output.
#
#   scripts/lib/failure-digest.sh LOG [LINES]
#
# Why: a real-node test prints hundreds of MEASURE/RAWPSI lines and its panic
# message carries the agent's log, so in a failed run the message sits in the
# middle of the output; whoever reads only a run's head and tail (a CI page)
# then sees which tests failed but not why. LINES (default 6) message lines
# per panic, each cut at 240 characters.
set -euo pipefail
log=${1:?usage: failure-digest.sh LOG [LINES]}
lines=${2:-6}
[ -f "$log" ] || exit 0
awk -v max="$lines" '
  /^thread .* panicked at / { n = 0; print "--- " substr($0, 1, 240); taking = 1; next }
  taking && (/^stack backtrace:/ || /^note: / || n >= max) { taking = 0 }
  taking { n++; print "    " substr($0, 1, 240) }
' "$log"
