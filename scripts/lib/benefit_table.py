#!/usr/bin/env python3
"""The benefit run's tables (docs/benefit.md and the README's headline).

Reads DIR/runs.csv, DIR/summary.json and DIR/meta.json
(tests/benches/benefit.rs) and writes two files:

- DIR/table.md, the full table docs/benefit.md holds verbatim: a warning
  line first when meta.json flags the run (its static baseline lies outside
  [0.5x, 2x] of the committed one's), one row a configuration, each cell the
  range over the repetitions, the medians against (a) with their 95 %
  bootstrap intervals (computed by the bench, benefit::stats), then each goal
  stated met or not met;
- DIR/headline.md, the README's headline, from summary.json alone: the main
  configurations' medians and their change against (a).

A matrix run (summary.json `"format": 2`: scenarios x configurations, issue
38) gets, per scenario, its table and its goals per party, each met or not
with its median and 95 % bootstrap interval as the bench judged them
(benefit::summary::goals); its headline says per scenario how many goals
are met of how many. A run before the matrix (one scenario) keeps its
layout. A run meta.json marks `failed` (it measured nothing) gets no table:
the script exits with the reason.

agent/tests/readme_benefit.rs checks both are where they belong. Standard
library only, so it runs before (and without) the plotting environment.

    python3 scripts/lib/benefit_table.py docs/benefit
"""

import csv
import json
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
    "k-koordlet": "(k) koordlet CPU Burst auto",
    "x-coexist": "(x) Headroom beside koordlet",
}
LONG = {"c-headroom": ", default (`floor = request`)"}

# Configurations in which the agent runs (tuning candidates too).
AGENT = {"c-headroom", "e-dryrun", "f-declared"}

# The README headline's configurations, in this order (those in the run).
HEADLINE = ["a-static", "b-nolimit", "c-headroom", "f-declared"]

# The goals' thresholds (docs/benefit.md).
SVC_P99_VS_NOLIMIT_MAX = 2.0  # service p99 at most 2x (b)'s
THROTTLED_VS_STATIC_MAX = 0.05  # throttled ratio -95 % against (a)
WITHIN_P99_VS_STATIC_MAX = 1.10  # within-request neighbour's p99 at most +10 %
WITHIN_FULL_PP_MAX = 0.0  # its cpu.pressure full no higher than under (a)
BATCH_P99_VS_NOLIMIT_MAX = 1.0  # batch neighbour's p99 no worse than under (b)
DRYRUN_P99_TOLERANCE = 0.10  # (e) p99 within +-10 % of (a)


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


# (header, runs.csv column, formatter); AGENT_ONLY columns read "–" for
# configurations without the agent.
COLUMNS = [
    ("p50 ms", "svc_p50_ms", "ms"),
    ("p99 ms", "svc_p99_ms", "ms"),
    ("p99.9 ms", "svc_p999_ms", "ms"),
    ("throttled", "throttled_ratio", "pct1"),
    ("within p99 ms", "within_p99_ms", "ms"),
    ("within full", "within_full_pct", "pp"),
    ("unmanaged p99 ms", "batch_demand_p99_ms", "ms"),
    ("node CPU", "node_util", "pct0"),
    ("limit changes", "limit_changes", "int"),
    ("lowerings", "svc_lowerings", "int"),
    ("false lowerings", "false_lowerings", "int"),
    ("burst → raise s", "raise1_s", "s"),
    ("demand → lowering s", "lower_s", "s"),
]
# Reaction times and lowerings are the agent's: without one, a limit above
# 300m (b) is the setup's, not a raise.
AGENT_ONLY = {"raise1_s", "lower_s", "svc_lowerings", "false_lowerings"}


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
    if kind == "pp":
        return f"{x:.1f} %"
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
    if lo.endswith(" %"):
        return f"{lo[:-2]}–{hi}"
    return f"{lo}–{hi}"


def interval(s, *path):
    """The {point, lo, hi} at summary[c][path...], or None."""
    for k in path:
        s = s.get(k) if isinstance(s, dict) else None
    if not isinstance(s, dict) or number(s.get("point")) is None:
        return None
    return {k: number(s.get(k)) for k in ("point", "lo", "hi")}


def unsigned_zero(x, places):
    """x, with a value that rounds to zero as +0 (no "-0")."""
    return 0.0 if round(x, places) == 0 else x


def change(i):
    """A ratio as a change: -53 % [-60, -45 %]."""
    if i is None:
        return "n/a"
    p, lo, hi = (unsigned_zero((x - 1) * 100, 0) for x in (i["point"], i["lo"], i["hi"]))
    return f"{p:+.0f} % [{lo:+.0f}, {hi:+.0f} %]"


def times(i):
    """A ratio as a factor: 1.6× [1.2–2.3×]."""
    if i is None:
        return "n/a"
    return f"{i['point']:.2f}× [{i['lo']:.2f}–{i['hi']:.2f}×]"


def points(i):
    """A difference in percentage points: +0.3 pp [-0.1, +0.8]."""
    if i is None:
        return "n/a"
    p, lo, hi = (unsigned_zero(i[k], 1) for k in ("point", "lo", "hi"))
    return f"{p:+.1f} pp [{lo:+.1f}, {hi:+.1f}]"


def at_most(i, limit):
    """(met, the interval crosses the limit) of 'point <= limit'; None
    without a figure."""
    if i is None:
        return None
    return i["point"] <= limit, i["lo"] <= limit <= i["hi"] and i["lo"] < i["hi"]


def verdict(v):
    if v is None:
        return "**not assessed** (no figure)"
    met, crosses = v
    word = "**met**" if met else "**not met**"
    return word + (" (its interval crosses the goal)" if crosses else "")


def warning(meta):
    """The flagged run's warning line, or None."""
    if not meta.get("flagged"):
        return None
    b = meta.get("baseline") or {}
    new, old = number(b.get("svc_p99_ms")), number(b.get("committed_svc_p99_ms"))
    lo, hi = b.get("range", [0.5, 2.0])
    figures = (
        f"{new:,.0f} ms against the committed {old:,.0f} ms ({b.get('from', '?')})"
        if new is not None and old is not None
        else "(figures in meta.json)"
    )
    return (
        f"**Warning: flagged run.** Its static (a) service p99 median, {figures}, lies outside "
        f"[{lo:g}×, {hi:g}×] of the committed run's: the host was busier or quieter; its figures "
        "are not comparable with that run's."
    )


def short(c):
    """(c) for c-headroom; a tuning candidate's name."""
    return LABELS[c].split(" ")[0] if c in LABELS else c


def goals(summary, configs, agent):
    """The goal lines, each configuration's figure, interval and verdict."""
    patching = [c for c in configs if c in agent and c != "e-dryrun"]
    out = []

    def per_config(goal, part):
        parts = []
        for c in patching:
            parts.append(f"{short(c)} {part(summary.get(c, {}))}")
        if not parts:
            parts.append("not assessed (no Headroom configuration in this run)")
        out.append(f"- {goal}: " + "; ".join(parts) + ".")

    def svc_vs_b(s):
        i = interval(s, "vs_nolimit", "svc_p99")
        return f"{times(i)}: {verdict(at_most(i, SVC_P99_VS_NOLIMIT_MAX))}"

    def throttled(s):
        i = interval(s, "vs_static", "throttled_ratio")
        return f"{change(i)}: {verdict(at_most(i, THROTTLED_VS_STATIC_MAX))}"

    def within(s):
        p99 = interval(s, "vs_static", "within_p99")
        full = interval(s, "vs_static", "within_full_pp")
        a, b = at_most(p99, WITHIN_P99_VS_STATIC_MAX), at_most(full, WITHIN_FULL_PP_MAX)
        both = None if a is None or b is None else (a[0] and b[0], a[1] or b[1])
        return f"p99 {change(p99)}, full {points(full)}: {verdict(both)}"

    def batch(s):
        i = interval(s, "vs_nolimit", "batch_demand_p99")
        return f"{change(i)} against (b): {verdict(at_most(i, BATCH_P99_VS_NOLIMIT_MAX))}"

    def false_lowerings(s):
        f, n = number(s.get("false_lowerings")), number(s.get("svc_lowerings"))
        u, runs = number(s.get("unjudged_lowerings")) or 0, s.get("runs", "?")
        if f is None or n is None:
            return verdict(None)
        extra = f", {u:.0f} unjudged" if u else ""
        word = "**met**" if f == 0 else "**not met**"
        return f"{f:.0f} false of {n:.0f} lowerings in {runs} runs{extra}: {word}"

    per_config("**Service p99 within 2× of (b) no limit** (median ratio to (b))", svc_vs_b)
    per_config("**Throttled ratio −95 % against (a)**", throttled)
    per_config(
        "**Within-request neighbour's p99 at most +10 % against (a), its cpu.pressure "
        "`full` no higher** (over the run)",
        within,
    )
    per_config("**Unmanaged batch neighbour's p99 no worse than under (b)** (while it needs CPU)", batch)
    per_config("**0 false lowerings**", false_lowerings)
    e, a = summary.get("e-dryrun"), summary.get("a-static")
    if e is None or a is None:
        out.append("- **`--dry-run` (e) indistinguishable from (a)**: not assessed (not in this run).")
    else:
        ci = interval(e, "svc_p99_interval")
        ratio = interval(e, "vs_static", "svc_p99")
        base = number(a.get("svc_p99_ms"))
        inside = ci is not None and base is not None and ci["lo"] <= base <= ci["hi"]
        close = ratio is not None and abs(ratio["point"] - 1) <= DRYRUN_P99_TOLERANCE
        ci_text = "n/a" if ci is None else f"{ci['point']:,.0f} ms [{ci['lo']:,.0f}–{ci['hi']:,.0f}]"
        base_text = "n/a" if base is None else f"{base:,.0f} ms"
        word = "**met**" if inside or close else "**not met**"
        out.append(
            f"- **`--dry-run` (e) indistinguishable from (a)** (its p99 interval holds (a)'s "
            f"median, or within ±10 %): (e) p99 {ci_text} against (a) {base_text}, "
            f"{change(ratio)}: {word}."
        )
    return out


def ratio_of_medians(s, base, key):
    """s[key] / base[key] as a point-only interval, or None."""
    x, b = number(s.get(key)), number(base.get(key))
    if x is None or b is None or b <= 0:
        return None
    return {"point": x / b, "lo": None, "hi": None}


def headline_change(s, base, path, key):
    """The change against (a): the bench's interval where summary.json has
    one (vs_static), else the ratio of the medians it records."""
    i = interval(s, "vs_static", path)
    if i is not None and i["lo"] is not None and i["hi"] is not None:
        return change(i)
    i = ratio_of_medians(s, base, key)
    if i is None:
        return "n/a"
    return f"{unsigned_zero((i['point'] - 1) * 100, 0):+.0f} %"


def headline(summary, meta):
    """The README's headline: one row per main configuration, medians and
    their change against (a). No links: the README links around it."""
    configs = [c for c in HEADLINE if c in summary]
    base = summary.get("a-static", {})
    # (header, summary.json key, vs_static key, formatter)
    cols = [
        ("service p99", "svc_p99_ms", "svc_p99", "ms"),
        ("throttled", "throttled_ratio", "throttled_ratio", "pct1"),
        ("within-request neighbour p99", "within_p99_ms", "within_p99", "ms"),
        ("unmanaged neighbour p99", "batch_demand_p99_ms", "batch_demand_p99", "ms"),
    ]
    # A column only where the run has its figure (older runs lack one).
    cols = [c for c in cols if any(number(summary[k].get(c[1])) is not None for k in configs)]
    out = []
    warn = warning(meta)
    if warn:
        out += [warn, ""]
    out.append("| config | " + " | ".join(h for h, _, _, _ in cols) + " |")
    out.append("|---" * (len(cols) + 1) + "|")
    for c in configs:
        s = summary[c]
        cells = []
        for _, key, path, kind in cols:
            x = number(s.get(key))
            text = "–" if x is None else fmt(x, kind) + (" ms" if kind == "ms" else "")
            if c != "a-static" and x is not None:
                text += f" ({headline_change(s, base, path, key)})"
            cells.append(text)
        out.append(f"| {label(c, meta, long=True)} | " + " | ".join(cells) + " |")
    runs = sorted({int(summary[c].get("runs", 0)) for c in configs})
    reps = "–".join(str(r) for r in (runs[:1] + runs[-1:] if len(runs) > 1 else runs))
    out.append("")
    out.append(
        f"Medians over {reps} repetition(s) of each; in parentheses the change against (a)"
        + (
            " [95 % bootstrap interval]."
            if any(interval(summary[c], "vs_static", "svc_p99") for c in configs)
            else "."
        )
    )
    return out


# --- The matrix (summary.json format 2) ---------------------------------

# (header, runs.csv column, formatter, shown when): None always, a party
# name when the scenario has it (meta.json's parties; `episodes`: the
# within-request neighbour's need comes and goes), "agent" for
# configurations with the agent only, "PARTY+agent" for both.
MATRIX_COLUMNS = [
    ("p50 ms", "svc_p50_ms", "ms", None),
    ("p99 ms", "svc_p99_ms", "ms", None),
    ("p99.9 ms", "svc_p999_ms", "ms", None),
    ("second service p99 ms", "svc2_p99_ms", "ms", "svc2"),
    ("throttled", "throttled_ratio", "pct1", None),
    ("within p99 ms", "within_p99_ms", "ms", "within"),
    ("within CPU m (contended)", "within_contended_usage_m", "int", "within"),
    ("within full", "within_full_pct", "pp", "within"),
    ("unmanaged p99 ms", "batch_demand_p99_ms", "ms", "batch"),
    ("node CPU", "node_util", "pct0", None),
    ("limit changes", "limit_changes", "int", None),
    ("patches per burst (max)", "max_patches_per_burst", "int", "agent"),
    ("patches per episode (max)", "max_patches_per_episode", "int", "episodes+agent"),
    ("lowerings", "svc_lowerings", "int", "agent"),
    ("false lowerings", "false_lowerings", "int", "agent"),
    ("lowerings that helped", "lowerings_helped", "int", "agent"),
    ("lowerings that bought nothing", "lowerings_no_effect", "int", "agent"),
    ("burst → raise s", "raise1_s", "s", "agent"),
    ("demand → lowering s", "lower_s", "s", "batch+agent"),
]

# Short names of the goals (party, id), for the headline.
GOAL_SHORT = {
    ("svc", "p99_vs_static"): "service p99 ≤ (a)",
    ("svc", "p99_vs_nolimit"): "service p99 ≤ 2× (b)",
    ("svc2", "p99_vs_static"): "second service p99 ≤ (a)",
    ("svc2", "p99_vs_nolimit"): "second service p99 ≤ 2× (b)",
    ("within", "p99_vs_static"): "within-request p99 ≤ +10 %",
    ("within", "usage_vs_static"): "within-request CPU ≥ (a)",
    ("batch", "p99_vs_nolimit"): "unmanaged p99 ≤ (b)",
    ("agent", "no_effect_lowerings"): "0 lowerings that bought nothing",
    ("agent", "patches_per_burst"): "≤ 3 patches per burst",
    ("agent", "patches_per_episode"): "≤ 2 patches per episode",
    ("agent", "false_lowerings"): "0 false lowerings",
    ("svc", "dry_run_like_static"): "--dry-run like (a)",
}
# Against the peers a user would run instead (issue 48): (k) koordlet, (d)
# cpu.max.burst; the same goals, each against its peer.
for _peer, _tag in (("koordlet", "(k)"), ("burst", "(d)")):
    GOAL_SHORT.update({
        ("svc", f"p99_vs_{_peer}"): f"service p99 ≤ {_tag}",
        ("svc2", f"p99_vs_{_peer}"): f"second service p99 ≤ {_tag}",
        ("within", f"p99_vs_{_peer}"): f"within-request p99 ≤ +10 % of {_tag}",
        ("within", f"usage_vs_{_peer}"): f"within-request CPU ≥ {_tag}",
        ("batch", f"p99_vs_{_peer}"): f"unmanaged p99 ≤ +10 % of {_tag}",
    })

RULE_TEXT = (
    "A goal on a ratio is **met** when the median of the repetitions (the ratio of the "
    "medians) is on the goal's side of its threshold; its 95 % bootstrap interval is "
    "shown, with a note where it crosses the threshold. A goal on a count (lowerings "
    "that bought nothing, patches per burst, false lowerings) is met when no run "
    "exceeds it; in `flicker`, where the within-request neighbour's need comes and goes, "
    "patches are counted per episode of that need (a need and the pause after it), at "
    "most 2, instead of per burst. Managed services: p99 at most (a)'s and, except in "
    "`short` and `flicker`, at most 2× (b)'s; the within-request neighbour: p99 at most 1.1× (a)'s, and the CPU it got "
    "in its contended phase(s) at least 0.97× (a)'s (3 % for sampling noise); the "
    "unmanaged batch neighbour: p99 while it needs CPU at most (b)'s. Against a peer in the "
    "run, (k) koordlet or (d) `cpu.max.burst`, nobody worse off: each service's p99 at most "
    "the peer's, each neighbour's p99 at most 1.1× the peer's and the within-request "
    "neighbour's CPU at least 0.97× the peer's."
)


def failed(meta):
    """Why the bench stopped without a result, or None."""
    return meta.get("failed") or None


def is_matrix(summary):
    return isinstance(summary, dict) and summary.get("format") == 2


def scenario_order(summary, meta):
    names = [n for n in meta.get("scenario_names", []) if n in summary["scenarios"]]
    return names + sorted(set(summary["scenarios"]) - set(names))


def agent_configs(rows, meta):
    """Configurations whose runs had the agent (runs.csv's agent column;
    the built-in and tuned names for older rows)."""
    out = {r["config"] for r in rows if r.get("agent") not in (None, "", "none")}
    return out or (AGENT | set(tuned(meta)))


def shown(when, parties, is_agent):
    if when is None:
        return True
    if when == "agent":
        return is_agent
    if when.endswith("+agent"):
        return is_agent and parties.get(when[: -len("+agent")], False)
    return parties.get(when, False)


def goal_rule(g):
    t = g.get("threshold")
    rule = g.get("rule")
    if rule == "median_at_most":
        return f"median at most {t:g}×"
    if rule == "median_at_least":
        return f"median at least {t:g}×"
    if rule == "every_run_at_most":
        return f"no run above {t:g}"
    if rule == "like_static":
        return f"within ±{t * 100:g} % of (a), or its p99 interval holds (a)'s median"
    return rule or "?"


def goal_value(g):
    v = g.get("value")
    if not isinstance(v, dict) or number(v.get("point")) is None:
        return "n/a"
    p, lo, hi = (number(v.get(k)) for k in ("point", "lo", "hi"))
    if g.get("rule") == "every_run_at_most":
        worst = number(g.get("worst"))
        return f"median {p:g} [{lo:g}–{hi:g}], worst run {worst:g}"
    return f"{p:.2f}× [{lo:.2f}–{hi:.2f}×]"


def goal_verdict(g):
    met = g.get("met")
    if met is None:
        return "**not assessed** (no figure)"
    word = "**met**" if met else "**not met**"
    if g.get("crosses") and g.get("rule") != "every_run_at_most":
        word += " (its interval crosses the goal)"
    return word


def goal_lines(goals):
    """One line per goal (party, id), each configuration's figure and verdict."""
    order, by = [], {}
    for g in goals:
        k = (g.get("party"), g.get("id"))
        if k not in by:
            order.append(k)
            by[k] = []
        by[k].append(g)
    out = []
    for k in order:
        gs = by[k]
        parts = [f"{short(g['config'])} {goal_value(g)}: {goal_verdict(g)}" for g in gs]
        out.append(f"- **{gs[0].get('text', k[1])}** ({goal_rule(gs[0])}): " + "; ".join(parts) + ".")
    return out


def met_counts(summary, name):
    m = summary.get("goals_met", {}).get(name, {})
    return int(m.get("met", 0)), int(m.get("of", 0)), int(m.get("not_assessed", 0))


def matrix_table(rows, summary, meta):
    agent = agent_configs(rows, meta)
    out = []
    warn = warning(meta)
    if warn:
        out += [warn, ""]
    out.append(RULE_TEXT)
    for name in scenario_order(summary, meta):
        sc_meta = meta.get("scenarios", {}).get(name, {})
        parties = summary.get("parties", {}).get(name) or sc_meta.get("parties", {})
        runs = [r for r in rows if r.get("scenario") == name]
        configs = [c for c in LABELS if any(r["config"] == c for r in runs)]
        configs += sorted({r["config"] for r in runs} - set(configs))
        cols = [c for c in MATRIX_COLUMNS if any(shown(c[3], parties, k in agent) for k in configs)]
        about = sc_meta.get("about")
        out.append("")
        out.append(f"**Scenario `{name}`**" + (f": {about}." if about else "."))
        out.append("")
        out.append("| config | " + " | ".join(h for h, _, _, _ in cols) + " |")
        out.append("|---" * (len(cols) + 1) + "|")
        for c in configs:
            rs = [r for r in runs if r["config"] == c]
            cells = [
                cell([number(r.get(col)) for r in rs], kind) if shown(when, parties, c in agent) else "–"
                for _, col, kind, when in cols
            ]
            out.append(f"| {label(c, meta, long=True)} | " + " | ".join(cells) + " |")
        reps = max((int(r["rep"]) for r in runs), default=0) + 1
        met, of, na = met_counts(summary, name)
        out.append("")
        out.append(
            f"Each cell: the range over {reps} repetition(s). Goals: {met} of {of} met"
            + (f", {na} not assessed" if na else "")
            + ":"
        )
        out.append("")
        out += goal_lines(summary.get("goals", {}).get(name, [])) or ["- no goal (no Headroom configuration in this scenario)."]
    return out


def matrix_headline(summary, meta):
    """The README's headline of a matrix run: per scenario, goals met of
    how many, and which are not."""
    out = []
    warn = warning(meta)
    if warn:
        out += [warn, ""]
    out.append("| scenario | goals met | not met |")
    out.append("|---|---|---|")
    total_met = total_of = 0
    for name in scenario_order(summary, meta):
        met, of, na = met_counts(summary, name)
        total_met, total_of = total_met + met, total_of + of
        missed = [
            f"{short(g['config'])} {GOAL_SHORT.get((g.get('party'), g.get('id')), g.get('text', '?'))}"
            for g in summary.get("goals", {}).get(name, [])
            if g.get("met") is False
        ]
        counted = f"{met} of {of}" + (f" ({na} not assessed)" if na else "")
        out.append(f"| `{name}` | {counted} | {'; '.join(missed) or '–'} |")
    runs = sorted(
        {int(s.get("runs", 0)) for sc in summary["scenarios"].values() for s in sc.values()}
    )
    reps = "–".join(str(r) for r in (runs[:1] + runs[-1:] if len(runs) > 1 else runs))
    out.append("")
    out.append(
        f"{total_met} of {total_of} goals met over {len(summary['scenarios'])} scenario(s), "
        f"{reps} repetition(s) of each configuration; a goal on a ratio by its median, "
        "a count by its worst run."
    )
    return out


def main(d):
    meta = load_meta(d)
    why = failed(meta)
    if why:
        sys.exit(f"benefit_table: the run failed, no table: {why}")
    rows = list(csv.DictReader(open(d / "runs.csv")))
    summary = json.load(open(d / "summary.json"))
    if is_matrix(summary):
        (d / "table.md").write_text("\n".join(matrix_table(rows, summary, meta)) + "\n")
        print(f"table in {d / 'table.md'}")
        (d / "headline.md").write_text("\n".join(matrix_headline(summary, meta)) + "\n")
        print(f"headline in {d / 'headline.md'}")
        return
    agent = AGENT | set(tuned(meta))
    configs = [c for c in LABELS if any(r["config"] == c for r in rows)]
    configs += sorted({r["config"] for r in rows} - set(configs))
    out = []
    warn = warning(meta)
    if warn:
        out += [warn, ""]
    out.append("| config | " + " | ".join(h for h, _, _ in COLUMNS) + " |")
    out.append("|---" * (len(COLUMNS) + 1) + "|")
    for c in configs:
        runs = [r for r in rows if r["config"] == c]
        cells = [
            cell([number(r.get(col)) for r in runs], kind)
            if c in agent or col not in AGENT_ONLY
            else "–"
            for _, col, kind in COLUMNS
        ]
        out.append(f"| {label(c, meta, long=True)} | " + " | ".join(cells) + " |")
    reps = max(int(r["rep"]) for r in rows) + 1
    out.append("")
    out.append(
        f"Each cell: the range over {reps} repetition(s). Against (a), the median's change "
        "[95 % bootstrap interval]:"
    )
    out.append("")
    for c in configs:
        if c == "a-static":
            continue
        s = summary.get(c, {})
        p99 = number(s.get("svc_p99_ms"))
        out.append(
            f"- {label(c, meta, long=True)}: throttled ratio {change(interval(s, 'vs_static', 'throttled_ratio'))}, "
            f"p99 {change(interval(s, 'vs_static', 'svc_p99'))} "
            f"({'n/a' if p99 is None else f'{p99:,.0f} ms'}), "
            f"within-request neighbour p99 {change(interval(s, 'vs_static', 'within_p99'))}, "
            f"full {points(interval(s, 'vs_static', 'within_full_pp'))}, "
            f"unmanaged p99 {change(interval(s, 'vs_static', 'batch_demand_p99'))}"
        )
    out.append("")
    out.append("Goals (medians over the repetitions, [95 % bootstrap interval]):")
    out.append("")
    out += goals(summary, configs, agent)
    (d / "table.md").write_text("\n".join(out) + "\n")
    print(f"table in {d / 'table.md'}")
    (d / "headline.md").write_text("\n".join(headline(summary, meta)) + "\n")
    print(f"headline in {d / 'headline.md'}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: benefit_table.py DIR")
    main(Path(sys.argv[1]))
