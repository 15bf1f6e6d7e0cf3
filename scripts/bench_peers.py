"""µs per durable Step: intloom next to DBOS and LangGraph, with the disk's floor beside them.

The peers live in their own virtual environment, ``.bench-venv/``, created here from the
package index on first use (never in the project's ``.venv``). Each variant runs in a fresh
child process with a fresh database (``bench_peer_child.py``); repetitions are interleaved
(variant A, B, C, ... then again), and each figure is the median.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from scripts.bench_common import (
    REPO,
    VENV_PY,
    bench_env,
    judged,
    median,
    note,
    rnd,
    scratch,
    shown,
    worst,
)

BENCH_VENV: Final = REPO / ".bench-venv"
PEER_PY: Final = BENCH_VENV / "bin" / "python"
# What the comparison installs, unpinned: the figures record the versions they measured.
PEER_PACKAGES: Final = ("dbos", "langgraph", "langgraph-checkpoint-sqlite", "py-spy")
CHILD: Final = Path(__file__).resolve().parent / "bench_peer_child.py"

# variant -> which interpreter runs it
VARIANTS: Final = {
    "raw_fdatasync": "project",
    "intloom_async": "project",
    "intloom_sync": "project",
    "dbos_sqlite": "peers",
    "langgraph_loop": "peers",
    "langgraph_chain": "peers",
}
PEERS: Final = ("dbos_sqlite", "langgraph_loop", "langgraph_chain")

# SQLite's PRAGMA synchronous: 2 (FULL) and 3 (EXTRA) sync at every commit; 1 (NORMAL) does
# not in WAL mode, so a commit can be lost to a power cut, and 0 (OFF) leaves it to the OS.
DURABLE_SYNCHRONOUS: Final = (2, 3)
# Journal modes under which a commit is not durable (or not even atomic) after a crash.
UNSAFE_JOURNAL_MODES: Final = ("off", "memory")
# What each peer's child reads back and how many records one run of STEPS Steps must leave:
# DBOS one row per Step in operation_outputs; LangGraph a checkpoint per super-step (and
# the input's), with durability "sync" (written before the next Step, not in the background).
RECORDS: Final = {"dbos_sqlite": "recorded_steps", "langgraph_loop": "checkpoints",
                  "langgraph_chain": "checkpoints"}


def not_durable(variant: str, steps: int, extra: dict[str, Any]) -> list[str]:
    """Why a peer's child, by the settings it read back (its ``extra``), did not measure the
    durable setting the comparison is about (empty: it did). A peer measured with commits
    left to the OS would look faster than one that waits for the disk, as intloom does."""
    if variant not in RECORDS:
        return []
    why = []
    synchronous = extra.get("synchronous")
    if synchronous not in DURABLE_SYNCHRONOUS:
        why.append(f"{variant}: SQLite synchronous={synchronous!r}, not FULL (2) or EXTRA (3): "
                   "a commit is not synced to the disk before the next Step")
    journal = extra.get("journal_mode")
    if not isinstance(journal, str) or journal.lower() in UNSAFE_JOURNAL_MODES:
        why.append(f"{variant}: SQLite journal_mode={journal!r}: a commit does not survive "
                   "a crash")
    key = RECORDS[variant]
    records = extra.get(key)
    if not isinstance(records, int) or records < steps:
        why.append(f"{variant}: {key}={records!r} for {steps} Steps: not every Step was "
                   "recorded")
    if variant.startswith("langgraph") and extra.get("durability") != "sync":
        why.append(f"{variant}: durability={extra.get('durability')!r}, not \"sync\": "
                   "checkpoints are written in the background")
    return why


# The interpreters found to import the peers in this process: the probe imports DBOS and
# LangGraph (~1.5 s on a 2-vCPU VM), and every peer child used to run it again (15 times
# in a default ``peers`` figure, ~20 s of its time).
_PROBED: set[Path] = set()


def ensure_peer_venv() -> Path:
    """``.bench-venv`` with the peers installed; created with pip on first use. Checked
    once per process."""
    if PEER_PY in _PROBED:
        return PEER_PY
    probe = [str(PEER_PY), "-c", "import dbos, langgraph.graph, langgraph.checkpoint.sqlite"]
    if PEER_PY.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        _PROBED.add(PEER_PY)
        return PEER_PY
    note(f"creating {BENCH_VENV} with {', '.join(PEER_PACKAGES)} from the package index")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(BENCH_VENV)], check=True)
    subprocess.run([str(PEER_PY), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
                   check=True)
    subprocess.run([str(PEER_PY), "-m", "pip", "install", "--quiet", *PEER_PACKAGES], check=True)
    subprocess.run(probe, check=True)
    _PROBED.add(PEER_PY)
    return PEER_PY


def run_child(variant: str, steps: int, directory: Path) -> dict[str, Any]:
    python = VENV_PY if VARIANTS[variant] == "project" else ensure_peer_venv()
    proc = subprocess.run([str(python), str(CHILD), variant, str(steps), str(directory)],
                          capture_output=True, text=True, timeout=900, env=bench_env(),
                          cwd=directory)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{variant} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[0][len("RESULT "):])
    return result


def ceiling_ratio(peer_us: float, floor_us: float) -> float:
    """The most a store that makes each Step durable with one append+fdatasync could show
    against ``peer_us`` at no CPU of its own: the peer ratio's ceiling in this run. Rounded
    down, as the ratios are (bench_common.shown): to the nearest, 4.995 read "5x"."""
    return shown(peer_us / floor_us, 2, at_most=False)


def bench_peers(args: Any) -> dict[str, Any]:
    """µs per Step of each variant; intloom's ratio against the faster peer (target >= 5)."""
    chosen = args.only.split(",") if args.only else list(VARIANTS)
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {sorted(VARIANTS)}")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in chosen}
    with scratch(args.dir, "bench-peers-") as base:
        for rep in range(args.repeats):
            # Each repetition starts one variant later: in a fixed order intloom_sync always
            # ran right after intloom_async, so whatever one left behind (page cache, the
            # disk's writeback, CPU frequency) fell on the same neighbour every time.
            turn = rep % len(chosen)
            for variant in chosen[turn:] + chosen[:turn]:
                where = base / f"{variant}-{rep}"
                where.mkdir()
                result = run_child(variant, args.steps, where)
                runs[variant].append(result)
                note(f"peers rep {rep} {variant}: "
                     f"{result['elapsed_s'] / args.steps * 1e6:.0f} µs/Step")
    rows: dict[str, Any] = {}
    # Every repetition's child is checked: one run with another setting is one sample off.
    unsafe = list(dict.fromkeys(reason for variant, results in runs.items() for r in results
                                for reason in not_durable(variant, args.steps, r["extra"])))
    for variant, results in runs.items():
        us = median([r["elapsed_s"] for r in results]) / args.steps * 1e6
        rows[variant] = {
            "us_per_step": rnd(us),
            "cpu_us_per_step": rnd(median([r["cpu_s"] for r in results]) / args.steps * 1e6),
            "runs_us_per_step": [rnd(r["elapsed_s"] / args.steps * 1e6) for r in results],
            "peak_rss_mib": rnd(median([r["peak_rss_mib"] for r in results])),
            "extra": results[-1]["extra"],
        }
    out: dict[str, Any] = {"figure": "peers", "steps": args.steps, "repeats": args.repeats,
                           "target": "faster peer / intloom >= 5", "variants": rows}
    peers = [v for v in PEERS if v in rows]
    if peers and "raw_fdatasync" in rows:
        for v in rows:
            rows[v]["x_floor"] = rnd(rows[v]["us_per_step"] / rows["raw_fdatasync"]["us_per_step"],
                                     2)
    if peers:
        fastest = min(peers, key=lambda v: rows[v]["us_per_step"])
        out["faster_peer"] = fastest
        out["faster_peer_us_per_step"] = rows[fastest]["us_per_step"]
        if "raw_fdatasync" in rows:
            out["ceiling_ratio"] = ceiling_ratio(rows[fastest]["us_per_step"],
                                                 rows["raw_fdatasync"]["us_per_step"])
        for ours in ("intloom_async", "intloom_sync"):
            if ours in rows:
                kind = ours.split("_")[1]
                out[f"ratio_{kind}"], out[f"verdict_{kind}"] = judged(
                    rows[fastest]["us_per_step"] / rows[ours]["us_per_step"], 5,
                    at_most=False, digits=2)
                if unsafe:  # against a peer that did not wait for the disk, no ratio counts
                    out[f"verdict_{kind}"] = "not met"
        out["not_durable"] = unsafe
        # The headline is the kind that fares worst (bench_common.worst), not async's.
        kinds = {kind: {"ratio": out[f"ratio_{kind}"], "verdict": out[f"verdict_{kind}"]}
                 for kind in ("async", "sync") if f"ratio_{kind}" in out}
        if kinds:
            headline = worst(kinds, at_most=False)
            out.update(ratio=kinds[headline]["ratio"], verdict=kinds[headline]["verdict"],
                       headline_kind=headline)
    return out
