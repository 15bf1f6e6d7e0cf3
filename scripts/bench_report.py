"""``scripts/bench all``: every figure in one run, then docs/performance.md and its chart.

The report quotes each figure with the baseline measured in the same run and their ratio;
``docs/performance.json`` keeps the raw results. The chart needs matplotlib, which is in the
``bench`` extra (``pip install -e '.[bench]'``); ``all`` installs it into ``.venv`` when it is
missing (never into the runtime dependencies).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scripts.bench_common import (
    REPO,
    SLOW_CPU,
    VENV_PY,
    cpu_calibration_ms,
    load_average,
    machine,
    note,
)

Figure = Callable[[argparse.Namespace], dict[str, Any]]

# Small sizes for a smoke run (``--quick``): each figure still runs end to end.
QUICK: dict[str, dict[str, Any]] = {
    "steps": {"steps": 100, "repeats": 1, "warmup": 10},
    "concurrency": {"runs": 8, "steps": 20, "solo_steps": 100, "repeats": 1},
    "peers": {"steps": 30, "repeats": 1},
    "restart": {"records": 600, "baseline_records": 60, "repeats": 1},
    "restore": {"runs": 20, "repeats": 1},
    "cli": {"repeats": 2, "runs": 2},
    "memory": {"runs": 20},
    "events": {"runs": 4, "followers": 1, "seconds": 0.5},
    "crash": {},
}


def _ensure_matplotlib() -> bool:
    probe = [str(VENV_PY), "-c", "import matplotlib"]
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return True
    note("installing the bench extra (matplotlib) into .venv")
    done = subprocess.run([str(VENV_PY), "-m", "pip", "install", "--quiet", "-e", ".[bench]"],
                          cwd=REPO)
    return done.returncode == 0


def bench_all(args: argparse.Namespace, figures: dict[str, Figure],
              defaults: Callable[[str], argparse.Namespace]) -> dict[str, Any]:
    skip = {s for s in args.skip.split(",") if s}
    unknown = sorted(skip - set(figures))
    if unknown:  # a misspelt name would leave its figure in, to run for minutes
        raise SystemExit(f"scripts/bench all --skip: unknown figure(s) {', '.join(unknown)}; "
                         f"nothing was run. The figures are: {', '.join(figures)}.")
    # A smoke run's figures are not the report's: written to docs/ by default, a --quick
    # run replaced the measured docs/performance.md with its tiny sizes.
    out_dir = (Path(args.out) if args.out
               else Path(tempfile.mkdtemp(prefix="bench-quick-")) if args.quick
               else REPO / "docs")
    results: dict[str, Any] = {}
    load_before = load_average()
    calibration_before = cpu_calibration_ms()
    reference = cpu_reference(out_dir / "performance.json")
    if reference is not None and not args.quick:
        slower = calibration_before / reference["ms"]
        if slower > SLOW_CPU and not args.slow_cpu_ok:
            raise SystemExit(_refused(calibration_before, reference, slower, out_dir))
    started = time.perf_counter()
    for name, run in figures.items():
        if name in skip:
            continue
        options = defaults(name)
        # ``all --dir`` is every figure's ``--dir``: each figure's defaults name none, so
        # without this the figures measured the system temp dir's disk, not the one asked.
        options.dir = args.dir
        if args.quick:
            for key, value in QUICK[name].items():
                setattr(options, key, value)
        note(f"== {name}")
        began = time.perf_counter()
        try:
            results[name] = run(options)
        except Exception as exc:
            # One figure that raised used to end the whole run, its hours of other figures
            # unwritten; it is now reported as failed, with its error, and the rest run.
            results[name] = failed(name, exc)
            note(f"{name} failed: {results[name]['error']}")
        results[name]["seconds"] = round(time.perf_counter() - began, 1)
        results[name]["load_average"] = load_average()
        print(json.dumps(results[name]), flush=True)
    total = time.perf_counter() - started
    failures = [name for name, got in results.items() if got.get("verdict") == "error"]
    calibration_after = cpu_calibration_ms()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report: dict[str, Any] = {"machine": machine(args.dir), "load_before": load_before,
              "cpu_calibration_ms": [calibration_before, calibration_after],
              "cpu_reference": _new_reference(reference, calibration_before,
                                              calibration_after, when),
              "total_seconds": round(total, 1),
              "when": when,
              "quick": bool(args.quick), "figures": results,
              "failed": failures}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "performance.json").write_text(json.dumps(report, indent=1) + "\n")
    chart = None
    if not getattr(args, "no_chart", False) and _ensure_matplotlib():
        chart = out_dir / "performance.png"
        subprocess.run([str(VENV_PY), "-m", "scripts.bench_chart",
                        str(out_dir / "performance.json"), str(chart)], check=True, cwd=REPO)
    from scripts.bench_markdown import render

    (out_dir / "performance.md").write_text(render(report, chart.name if chart else None))
    note(f"all: {total:.0f} s; wrote {out_dir / 'performance.md'}"
         + (f" and {chart}" if chart else "")
         + (f"; FAILED: {', '.join(failures)}" if failures else ""))
    return report


def cpu_reference(report: Path) -> dict[str, Any] | None:
    """The fastest CPU gauge (``cpu_calibration_ms``) on record in the report at ``report``
    and the ones it replaced: ``{"ms", "when"}``, or None without a readable report."""
    try:
        old = json.loads(report.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(old, dict):
        return None
    known = old.get("cpu_reference")
    best = known if isinstance(known, dict) and _positive(known.get("ms")) else None
    gauges = old.get("cpu_calibration_ms")
    for value in gauges if isinstance(gauges, list) else []:  # a hand-edited one: no reference
        if _positive(value) and (best is None or value < best["ms"]):
            best = {"ms": value, "when": old.get("when", "?")}
    return best


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and value > 0


def _new_reference(reference: dict[str, Any] | None, before: float, after: float,
                   when: str) -> dict[str, Any]:
    fastest = min(before, after)
    if reference is not None and reference["ms"] <= fastest:
        return reference
    return {"ms": fastest, "when": when}


def _refused(now: float, reference: dict[str, Any], slower: float, out_dir: Path) -> str:
    return (
        f"scripts/bench all: this VM's CPU is {slower:.1f}x slower than the fastest run on "
        f"record (cpu_calibration_ms {now:g} now, {reference['ms']:g} on "
        f"{reference['when']}), so nothing was run and {out_dir / 'performance.md'} was "
        "left as it is. A slow spell of the VM slows the CPU-bound figures (64 Runs, the "
        "peers) far more than their fsync-bound baselines, so their ratios would be "
        "misstated, not measured. Run it again once the gauge is back (`.venv/bin/python -c "
        "'from scripts.bench_common import cpu_calibration_ms as c; print(c())'`), write "
        "the report elsewhere with --out DIR, or replace it anyway with --slow-cpu-ok (the "
        "report then says how much slower its CPU was)."
    )


def failed(name: str, exc: Exception) -> dict[str, Any]:
    """The result of a figure that raised: verdict "error", the error and where it was."""
    return {
        "figure": name, "verdict": "error",
        "error": f"{type(exc).__name__}: {exc}"[:2000],
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
    }
