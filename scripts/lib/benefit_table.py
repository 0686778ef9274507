#!/usr/bin/env python3
"""The README "Does it help?" table and goal lines from a benefit run.

Reads DIR/runs.csv and DIR/summary.json (tests/benches/benefit.rs) and writes
DIR/table.md: one row a configuration, each cell the range over the
repetitions, then the goals read from the medians against (a). Standard
library only, so it runs before (and without) the plotting environment.

    python3 scripts/lib/benefit_table.py docs/benefit
"""

import csv
import json
import statistics
import sys
from pathlib import Path

# Short labels (the charts' too); the table adds LONG where it has room.
LABELS = {
    "a-static": "(a) static 300m",
    "b-nolimit": "(b) no limit",
    "c-headroom": "(c) Headroom",
    "d-burst": "(d) cpu.max.burst",
    "e-dryrun": "(e) Headroom --dry-run",
    "f-declared": "(f) Headroom --floor declared",
}
LONG = {"c-headroom": ", default (`floor = request`)"}

# Configurations in which the agent runs (tuning candidates too).
AGENT = {"c-headroom", "e-dryrun", "f-declared"}


def tuned(meta):
    """name -> flags of the tuning candidates (BENEFIT_TUNED) of a run."""
    return meta.get("tuned", {}) if meta else {}


def label(c, meta=None, long=False):
    # A label the run's meta.json gives (e.g. added when a default changed
    # after the run, so "default" would no longer be true) wins.
    given = (meta or {}).get("labels", {}).get(c)
    if given:
        return given
    if c in LABELS:
        return LABELS[c] + (LONG.get(c, "") if long else "")
    flags = tuned(meta).get(c)
    return f"{c}: `{flags}`" if long and flags else c


def load_meta(d):
    p = Path(d) / "meta.json"
    return json.load(open(p)) if p.exists() else {}

# (header, runs.csv column, formatter)
COLUMNS = [
    ("p50 ms", "svc_p50_ms", "ms"),
    ("p99 ms", "svc_p99_ms", "ms"),
    ("p99.9 ms", "svc_p999_ms", "ms"),
    ("throttled", "throttled_ratio", "pct1"),
    ("Guaranteed p99 ms", "guaranteed_contended_p99_ms", "ms"),
    ("unmanaged p99 ms", "batch_demand_p99_ms", "ms"),
    ("node CPU", "node_util", "pct0"),
    ("limit changes", "limit_changes", "int"),
    ("burst → raise s", "raise1_s", "s"),
    ("demand → lowering s", "lower_s", "s"),
]


def number(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if x == x else None  # NaN is no value


def fmt(x, kind):
    if kind == "ms":
        return f"{x:,.0f}"
    if kind == "pct1":
        return f"{x * 100:.1f} %"
    if kind == "pct0":
        return f"{x * 100:.0f} %"
    if kind == "int":
        return f"{x:.0f}"
    return f"{x:.1f}"


def cell(values, kind):
    xs = sorted(x for x in values if x is not None)
    if not xs:
        return "–"
    lo, hi = fmt(xs[0], kind), fmt(xs[-1], kind)
    if lo == hi:
        return lo
    if kind.startswith("pct"):
        return f"{lo[:-2]}–{hi}"
    return f"{lo}–{hi}"


def signed(x):
    return "n/a" if x is None else f"{x:+.0f} %"


def main(d):
    rows = list(csv.DictReader(open(d / "runs.csv")))
    summary = json.load(open(d / "summary.json"))
    meta = load_meta(d)
    agent = AGENT | set(tuned(meta))
    configs = [c for c in LABELS if any(r["config"] == c for r in rows)]
    configs += sorted({r["config"] for r in rows} - set(configs))
    out = ["| config | " + " | ".join(h for h, _, _ in COLUMNS) + " |"]
    out.append("|---" * (len(COLUMNS) + 1) + "|")
    for c in configs:
        runs = [r for r in rows if r["config"] == c]
        cells = [
            cell([number(r[col]) for r in runs], kind)
            # Reaction times are the agent's: without one, a limit above 300m
            # (b) is the setup's, not a raise.
            if c in agent or col not in ("raise1_s", "lower_s")
            else "–"
            for _, col, kind in COLUMNS
        ]
        out.append(f"| {label(c, meta, long=True)} | " + " | ".join(cells) + " |")
    reps = max(int(r["rep"]) for r in rows) + 1
    out.append("")
    out.append(f"Each cell: the range over {reps} repetition(s). Against (a), medians:")
    out.append("")
    for c in configs:
        if c == "a-static":
            continue
        # The changes against (a) as the bench computed them (summary.json).
        s = summary[c]
        p99 = number(s.get("svc_p99_ms"))
        out.append(
            f"- {label(c, meta, long=True)}: throttled ratio {signed(s.get('throttled_ratio_vs_static_pct'))}, "
            f"p99 {signed(s.get('svc_p99_vs_static_pct'))} "
            f"({'n/a' if p99 is None else f'{p99:,.0f} ms'}), "
            f"Guaranteed p99 {signed(s.get('guaranteed_vs_baseline_pct'))}, "
            f"unmanaged p99 {signed(s.get('batch_vs_baseline_pct'))}"
        )
    (d / "table.md").write_text("\n".join(out) + "\n")
    print(f"table in {d / 'table.md'}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: benefit_table.py DIR")
    main(Path(sys.argv[1]))
