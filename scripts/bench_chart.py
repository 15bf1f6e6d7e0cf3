"""``python -m scripts.bench_chart RESULTS.json OUT.png``: the chart of docs/performance.md.

Left: µs per durable Step for intloom, its peers and the disk's floor (log scale). Right:
every figure against its target, as "how far from the target" (1 = exactly on it; left of
the line meets it). Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# (figure, label filled in from the figure's own sizes, how to read its distance to the
# target: measured/target or target/measured)
TARGETS: list[tuple[str, str, str]] = [
    ("steps", "µs/Step vs floor (≤ 1.5×)", "ratio/1.5"),
    ("peers", "faster peer ÷ intloom (≥ 5×)", "5/ratio"),
    ("concurrency", "{runs} Runs vs 1, Steps/s (≥ 8×)", "8/ratio"),
    ("restart", "start: {records:,} vs {baseline_records:,} records (≤ 1.5×)", "ratio/1.5"),
    ("restore", "start: {runs:,} vs 0 Runs (≤ 2×)", "ratio/2"),
    ("cli", "runs --json vs import typer (≤ 1.3×)", "ratio/1.3"),
    ("memory", "RSS: {runs:,} Runs vs idle (≤ 2×)", "ratio/2"),
    ("events", "event p99 in ms (≤ 10)", "p99/10"),
]
STEP_ROWS = [
    ("raw_fdatasync", "raw write+fdatasync (floor)", "#999999"),
    ("intloom_async", "intloom, async Step", "#1f6feb"),
    ("intloom_sync", "intloom, sync Step", "#6ea8fe"),
    ("langgraph_loop", "LangGraph, 1 node looped", "#d9822b"),
    ("langgraph_chain", "LangGraph, chain of nodes", "#f0b67f"),
    ("dbos_sqlite", "DBOS, SQLite system DB", "#c23b22"),
]


def distance(fig: dict[str, Any], how: str) -> float | None:
    if "ratio" not in fig and "p99_ms" not in fig:
        return None
    if how == "p99/10":
        return float(fig["p99_ms"]) / 10.0
    top, bottom = how.split("/")
    if top == "ratio":
        return float(fig["ratio"]) / float(bottom)
    return float(top) / float(fig["ratio"]) if fig["ratio"] else None


MET, NOT_MET = "#2da44e", "#cf222e"


def _kinds(key: str, fig: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label suffix, the part judged) for each kind of Step a figure measured (async, sync),
    or the figure itself when it has no kinds: each kind has a verdict of its own."""
    if key == "peers":
        return [(f", {kind} Steps", {"ratio": fig[f"ratio_{kind}"],
                                     "verdict": fig.get(f"verdict_{kind}", "")})
                for kind in ("async", "sync") if f"ratio_{kind}" in fig] or [("", fig)]
    kinds = fig.get("kinds") or {}
    return [(f", {kind} Steps", part) for kind, part in kinds.items()] or [("", fig)]


def target_bars(figures: dict[str, Any]) -> list[tuple[str, float, str, str]]:
    """(label, distance to the target, verdict, colour) of each figure measured, one per
    kind of Step where it measured several: the figure's headline alone showed one kind,
    and a kind that missed its target went unseen behind one that met it.

    The colour is the verdict, never its distance: a distance is computed from the figure
    as rounded for the report, while the verdict is taken before rounding.
    """
    bars = []
    for key, label, how in TARGETS:
        # A figure that failed has no measurements (nor the sizes its label names).
        if key not in figures or figures[key].get("verdict") == "error":
            continue
        name, _, target = label.format_map(figures[key]).rpartition(" (")
        for suffix, part in _kinds(key, figures[key]):
            if (d := distance(part, how)) is not None:
                said = str(part.get("verdict", ""))
                bars.append((f"{name}{suffix} ({target}", d, said,
                             MET if said == "met" else NOT_MET))
    return bars


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    report = json.loads(Path(sys.argv[1]).read_text())
    figures = report["figures"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.6),
                                      gridspec_kw={"width_ratios": [1, 1.15]})
    peers = figures.get("peers", {}).get("variants", {})
    rows = [(label, peers[key]["us_per_step"], color) for key, label, color in STEP_ROWS
            if key in peers]
    if rows:
        labels, values, colors = zip(*rows, strict=True)
        bars = left.barh(labels, values, color=colors)
        left.set_xscale("log")
        left.invert_yaxis()
        left.set_xlabel("µs per durable Step (median; log scale; lower is better)")
        left.set_title(f"One Run, {figures['peers']['steps']} trivial Steps, same disk")
        for bar, value in zip(bars, values, strict=True):
            left.text(value * 1.05, bar.get_y() + bar.get_height() / 2, f"{value:,.0f}",
                      va="center", fontsize=9)
        left.set_xlim(min(values) / 2, max(values) * 3)
        left.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
        left.xaxis.set_minor_formatter(NullFormatter())
    else:
        left.text(0.5, 0.5, "peers not measured in this run", ha="center", va="center")
        left.set_axis_off()
    targets = target_bars(figures)
    names = [t[0] for t in targets]
    dist = [t[1] for t in targets]
    notes = [t[2] for t in targets]
    bars = right.barh(names, dist, color=[t[3] for t in targets])
    right.axvline(1.0, color="black", linewidth=1)
    right.invert_yaxis()
    right.set_xlabel("distance to target (≤ 1 meets it)")
    right.set_title("Each figure against its target, this run")
    for bar, value, verdict in zip(bars, dist, notes, strict=True):
        right.text(value + 0.02, bar.get_y() + bar.get_height() / 2, f"{value:.2f} ({verdict})",
                   va="center", fontsize=9)
    right.set_xlim(0, max([*dist, 1.0]) * 1.35)
    disk = " ".join(str(report["machine"].get("filesystem", "")).split()[:2])
    load = report["machine"].get("load_average", ["?"])[0]
    fig.suptitle(f"intloom performance — {report['when']}, {report['machine'].get('cpus')} "
                 f"CPUs, {disk}, load average {load} after the run", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
