#!/usr/bin/env python3
"""Charts of the benefit benchmark (docs/benefit.md) from the data
tests/benches/benefit.rs wrote:

  benefit_charts.py DIR      # DIR/runs.csv, DIR/meta.json, DIR/raw/*-timeline.csv

writes DIR/latency.png (service p50/p99/p99.9 per configuration, median of
the repetitions, bars from min to max), DIR/timeline.png (demand, limit,
usage, throttling, the neighbours' usage and the within-request neighbour's
cpu.pressure full through one run of the static, Headroom, cpu.max.burst
and --floor declared configurations) and DIR/throttling.png (throttled
ratio, the neighbours' p99 and the within-request neighbour's full stall per
configuration).

A matrix run (runs.csv has a scenario column) gets the three charts per
scenario: `mixed`'s keep the names above (docs/benefit.md shows them), the
others' are prefixed with the scenario, e.g. DIR/short-latency.png; the
`pair` timeline shows the second service's limit and usage too.
"""
import csv
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benefit_table import LABELS, label, load_meta  # noqa: E402

CONFIGS = list(LABELS)


def configs_of(rs):
    """The built-in configurations in their order, then tuning candidates."""
    seen = {r["config"].strip('"') for r in rs}
    return [c for c in CONFIGS if c in seen] + sorted(seen - set(CONFIGS))


def rows(d):
    with open(os.path.join(d, "runs.csv")) as f:
        return list(csv.DictReader(f))


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def by_config(rs, key):
    out = {}
    for r in rs:
        v = num(r[key])
        if v == v:
            out.setdefault(r["config"].strip('"'), []).append(v)
    return out


def spread(vals):
    m = statistics.median(vals)
    return m, m - min(vals), max(vals) - m


def latency_chart(d, rs, prefix="", title=""):
    keys = [("svc_p50_ms", "p50"), ("svc_p99_ms", "p99"), ("svc_p999_ms", "p99.9")]
    cfgs = configs_of(rs)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    w = 0.26
    for i, (k, name) in enumerate(keys):
        vals = by_config(rs, k)
        med, lo, hi = zip(*[spread(vals.get(c, [float("nan")])) for c in cfgs])
        xs = [j + (i - 1) * w for j in range(len(cfgs))]
        bars = ax.bar(xs, med, w, yerr=[lo, hi], capsize=3, label=name)
        for x, m in zip(xs, med):
            ax.annotate(f"{m:.0f}", (x, m), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(cfgs)), [label(c) for c in cfgs], rotation=20, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("service latency, ms (log)")
    ax.set_title("Service latency under the bursty schedule (median of runs; bars: min–max)" + title)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(d, prefix + "latency.png"), dpi=110)


def throttling_chart(d, rs, prefix="", title=""):
    cfgs = configs_of(rs)
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 4))
    thr = by_config(rs, "throttled_ratio")
    med = [100 * statistics.median(thr.get(c, [float("nan")])) for c in cfgs]
    a1.bar(range(len(cfgs)), med, color="tab:red")
    for x, m in enumerate(med):
        a1.annotate(f"{m:.1f} %", (x, m), ha="center", va="bottom", fontsize=8)
    a1.set_xticks(range(len(cfgs)), [label(c) for c in cfgs], rotation=20, ha="right", fontsize=8)
    a1.set_ylabel("throttled periods, % (container cpu.stat)")
    a1.set_title("Service throttled ratio" + title)
    w = 0.38
    for i, (k, name) in enumerate([("within_p99_ms", "within-request neighbour (run)"),
                                   ("batch_demand_p99_ms", "unmanaged neighbour (its demand)")]):
        vals = by_config(rs, k)
        m = [statistics.median(vals.get(c, [float("nan")])) for c in cfgs]
        a2.bar([j + (i - 0.5) * w for j in range(len(cfgs))], m, w, label=name)
    a2.set_xticks(range(len(cfgs)), [label(c) for c in cfgs], rotation=20, ha="right", fontsize=8)
    a2.set_ylabel("p99, ms")
    a2.set_title("Neighbours' p99 (baseline: (a))")
    a2.legend(fontsize=8)
    for i, (k, name) in enumerate([("within_full_pct", "whole run"),
                                   ("within_contended_full_pct", "contended phase")]):
        vals = by_config(rs, k)
        m = [statistics.median(vals.get(c, [float("nan")])) for c in cfgs]
        a3.bar([j + (i - 0.5) * w for j in range(len(cfgs))], m, w, label=name)
    a3.set_xticks(range(len(cfgs)), [label(c) for c in cfgs], rotation=20, ha="right", fontsize=8)
    a3.set_ylabel("cpu.pressure full, % of wall")
    a3.set_title("Within-request neighbour's full stall")
    a3.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(d, prefix + "throttling.png"), dpi=110)


def timeline(d, run_id):
    path = os.path.join(d, "raw", f"{run_id}-timeline.csv")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return list(csv.DictReader(f))


def timeline_chart(d, meta, prefix="", run_prefix="", title=""):
    burn_ms = meta.get("burn_us", 10000) / 1000.0
    cpus = meta.get("node", {}).get("cpus", 2)
    shown = [c for c in ["a-static", "c-headroom", "d-burst", "f-declared"]
             if timeline(d, f"{run_prefix}{c}-r0")]
    if not shown:
        return
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 3.2 * len(shown)), sharex=True)
    if len(shown) == 1:
        axes = [axes]
    for ax, c in zip(axes, shown):
        t = timeline(d, f"{run_prefix}{c}-r0")
        x = [num(r["t_s"]) for r in t]
        demand = [num(r["svc_rate"]) * burn_ms for r in t]
        limit = [num(r["limit_m"]) if r["limit_m"] != "max" else cpus * 1000 for r in t]
        ax.fill_between(x, demand, step="pre", alpha=0.2, color="tab:blue",
                        label="service demand (rate × CPU/request)")
        ax.step(x, limit, where="pre", color="black", lw=1.5, label="service limit (cpu.max)")
        ax.plot(x, [num(r["usage_m"]) for r in t], color="tab:blue", lw=1, label="service usage")
        ax.plot(x, [num(r["batch_m"]) for r in t], color="tab:green", lw=1,
                label="unmanaged neighbour usage")
        ax.plot(x, [num(r["within_m"]) for r in t], color="tab:purple", lw=1,
                label="within-request neighbour usage")
        if any(r.get("svc2_limit_m") for r in t):
            ax.step(x, [num(r["svc2_limit_m"]) if r["svc2_limit_m"] != "max" else cpus * 1000
                        for r in t], where="pre", color="grey", lw=1.2, ls="--",
                    label="second service limit")
            ax.plot(x, [num(r.get("svc2_usage_m")) for r in t], color="tab:cyan", lw=1,
                    label="second service usage")
        ax.set_ylabel("millicores")
        ax.set_ylim(0, cpus * 1000 * 1.05)
        ax.set_title(label(c) + " (repetition 1)" + title, fontsize=9)
        ax2 = ax.twinx()
        ax2.plot(x, [num(r["throttled_pct"]) for r in t], color="tab:red", lw=0.8, alpha=0.8,
                 label="throttled periods %")
        ax2.plot(x, [num(r["within_full_pct"]) for r in t], color="tab:orange", lw=0.8,
                 ls="--", label="within-request neighbour cpu.pressure full %")
        ax2.set_ylim(0, 105)
        ax2.set_ylabel("throttled / full %", color="tab:red")
        if ax is axes[0]:
            h1, l1 = ax.get_legend_handles_labels()
            h2, l2 = ax2.get_legend_handles_labels()
            ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left", ncol=2)
    axes[-1].set_xlabel("seconds from the schedule's start")
    fig.tight_layout()
    fig.savefig(os.path.join(d, prefix + "timeline.png"), dpi=110)


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "docs/benefit"
    rs = rows(d)
    if not rs:
        sys.exit(f"{d}/runs.csv has no runs")
    meta = load_meta(d)
    scenarios = sorted({r.get("scenario", "").strip('"') for r in rs} - {""})
    if not scenarios:
        latency_chart(d, rs)
        throttling_chart(d, rs)
        timeline_chart(d, meta)
        print(f"charts in {d}: latency.png throttling.png timeline.png")
        return
    for sc in scenarios:
        sub = [r for r in rs if r.get("scenario", "").strip('"') == sc]
        prefix = "" if sc == "mixed" else f"{sc}-"
        title = f" — scenario {sc}"
        latency_chart(d, sub, prefix, title)
        throttling_chart(d, sub, prefix, title)
        timeline_chart(d, meta, prefix, f"{sc}-", title)
        print(f"charts of {sc} in {d}: {prefix}latency.png {prefix}throttling.png {prefix}timeline.png")


if __name__ == "__main__":
    main()
