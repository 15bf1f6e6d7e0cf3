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
    cpu_model,
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
    cpu = cpu_model()
    known = cpu_references(out_dir / "performance.json")
    reference = _held_to(known, cpu)
    if reference is not None and not args.quick:
        slower = calibration_before / reference["ms"]
        if slower > SLOW_CPU and not args.slow_cpu_ok:
            raise SystemExit(_refused(calibration_before, reference, slower, out_dir, cpu))
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
    mine = _new_reference(reference, calibration_before, calibration_after, when)
    report: dict[str, Any] = {"machine": machine(args.dir), "load_before": load_before,
              "cpu_calibration_ms": [calibration_before, calibration_after],
              "cpu_reference": {**mine, "cpu": cpu},
              "cpu_references": {**known, cpu: mine},
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


def cpu_references(report: Path) -> dict[str, dict[str, Any]]:
    """The fastest CPU gauge (``cpu_calibration_ms``) on record in the report at ``report``
    and the ones it replaced, per CPU model: ``{model: {"ms", "when"}}``, empty without a
    readable report. A gauge read on one model says nothing of a slow spell on another. A
    record whose model is not known (a report from before models were kept apart, with no
    ``machine.cpu``) is under "": it holds any model to it, rather than none."""
    try:
        old = json.loads(report.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(old, dict):
        return {}
    out: dict[str, dict[str, Any]] = {}

    def keep(model: Any, ms: Any, when: Any) -> None:
        model = model if isinstance(model, str) else ""
        if _positive(ms) and (model not in out or ms < out[model]["ms"]):
            out[model] = {"ms": ms, "when": when if isinstance(when, str) else "?"}

    known = old.get("cpu_references")
    for model, ref in known.items() if isinstance(known, dict) else []:
        if isinstance(ref, dict):
            keep(model, ref.get("ms"), ref.get("when"))
    machine_info = old.get("machine")
    ran_on = machine_info.get("cpu") if isinstance(machine_info, dict) else None
    single = old.get("cpu_reference")  # before 2026-12-06 the only one, with no model
    if isinstance(single, dict):
        keep(single.get("cpu", ran_on), single.get("ms"), single.get("when"))
    gauges = old.get("cpu_calibration_ms")
    for value in gauges if isinstance(gauges, list) else []:  # a hand-edited one: no record
        keep(ran_on, value, old.get("when", "?"))
    return out


def _held_to(known: dict[str, dict[str, Any]], cpu: str) -> dict[str, Any] | None:
    """The faster of model ``cpu``'s record and the record of no known model."""
    found = [ref for ref in (known.get(cpu), known.get("")) if ref is not None]
    return min(found, key=lambda ref: ref["ms"]) if found else None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and value > 0


def _new_reference(reference: dict[str, Any] | None, before: float, after: float,
                   when: str) -> dict[str, Any]:
    fastest = min(before, after)
    if reference is not None and reference["ms"] <= fastest:
        return reference
    return {"ms": fastest, "when": when}


def _refused(now: float, reference: dict[str, Any], slower: float, out_dir: Path,
             cpu: str) -> str:
    return (
        f"scripts/bench all: this VM's CPU ({cpu or 'model unknown'}) is {slower:.1f}x "
        f"slower than the fastest run on record on it (cpu_calibration_ms {now:g} now, "
        f"{reference['ms']:g} on {reference['when']}), so nothing was run and "
        f"{out_dir / 'performance.md'} was "
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
