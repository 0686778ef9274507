"""Chart of scripts/demo's series: each pod's usage and CPU limit, and the
node's real slack, over time.  python demo-chart.py demo.csv demo.png"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    pods, slack = {}, {}
    with open(src) as f:
        for r in csv.DictReader(f):
            t = float(r["t_s"])
            p = pods.setdefault(r["pod"], {"t": [], "usage": [], "limit": []})
            p["t"].append(t)
            p["usage"].append(float(r["usage_m"]) if r["usage_m"] else None)
            p["limit"].append(float(r["limit_m"]) if r["limit_m"] else None)
            if r["real_slack_m"]:
                slack[t] = float(r["real_slack_m"])
    if not pods:
        sys.exit(f"{src}: no rows")
    fig, ax = plt.subplots(figsize=(8, 4), dpi=80)
    colours = ["tab:blue", "tab:orange", "tab:green"]
    for (name, p), c in zip(sorted(pods.items()), colours):
        ax.step(p["t"], p["limit"], where="post", color=c, label=f"{name} CPU limit")
        ax.plot(p["t"], p["usage"], color=c, linestyle=":", label=f"{name} usage")
    # scripts/demo's middle third: the neighbour (not opted in) is busy.
    end = max(max(p["t"]) for p in pods.values())
    ax.axvspan(end / 3, 2 * end / 3, color="grey", alpha=0.12, label="neighbour busy")
    ts = sorted(slack)
    ax.plot(ts, [slack[t] for t in ts], color="grey", linewidth=1, label="node real slack")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("millicores")
    ax.set_title("Headroom on a simulated 4-CPU node: a neighbour's load comes and goes")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
