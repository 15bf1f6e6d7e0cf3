"""What scripts/bench reports says no more than it measured: a ratio as shown never lands on
the other side of its target from its verdict, an incomplete sample is not "met", and the
report names the states and sizes of the run. The figures' own computations run on made-up
measurements here: what is checked is arithmetic and wording, so no disk, host or peer is
needed (test_bench_smoke runs every figure for real)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from scripts import bench_peers, bench_steps
from scripts.bench_markdown import _summary


def durable(variant: str, steps: int) -> dict[str, Any]:
    """What a peer's child reads back when measured as it should be (DBOS and LangGraph
    with their SQLite defaults, LangGraph with durability "sync"): see
    /work/shared/reference/anchors.md and bench_peer_child.py."""
    if variant == "dbos_sqlite":
        return {"dbos": "3.4.0", "journal_mode": "delete", "synchronous": 2,
                "recorded_steps": steps}
    if variant.startswith("langgraph"):
        return {"langgraph": "1.2.24", "durability": "sync", "journal_mode": "wal",
                "synchronous": 2, "checkpoints": steps + 2}
    return {}


def _consistent(ratio: float, target: float, said: str, *, at_most: bool) -> bool:
    meets = ratio <= target if at_most else ratio >= target
    return meets == (said == "met")


@pytest.mark.parametrize("intloom_s", [1.0008, 0.9992])  # 4.996 and 5.004 times fewer µs
def test_peer_ratio_is_shown_on_the_side_of_its_verdict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, intloom_s: float
) -> None:
    elapsed = {"intloom_async": intloom_s, "intloom_sync": intloom_s, "langgraph_loop": 5.0}

    def child(variant: str, steps: int, directory: Path) -> dict[str, Any]:
        return {"elapsed_s": elapsed[variant], "cpu_s": 0.1, "peak_rss_mib": 1.0,
                "extra": durable(variant, steps)}

    monkeypatch.setattr(bench_peers, "run_child", child)
    args = argparse.Namespace(only=",".join(elapsed), steps=1000, repeats=1, dir=str(tmp_path))
    out = bench_peers.bench_peers(args)
    for kind in ("async", "sync"):
        assert _consistent(out[f"ratio_{kind}"], 5, out[f"verdict_{kind}"], at_most=False), out


def test_step_ratio_and_its_pairs_are_shown_on_the_side_of_the_verdict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def session(base: Path, kind: str, sizes: Any, order: list[str],
                      warmup: int) -> list[tuple[str, dict[str, Any]]]:
        run = {"us_per_step": 150.04, "cpu_us_per_step": 50.0, "flushes": 100, "steps": 100,
               "bytes": 59_200, "compaction_wait_s": 0.0}
        return [(n, run if n == "main" else {"us_per_step": 100.0, "cpu_us_per_step": 9.0,
                                             "compaction_wait_s": 0.0})
                for n in order]

    monkeypatch.setattr(bench_steps, "_session", session)
    args = argparse.Namespace(kind="async", steps=100, repeats=2, warmup=1, dir=str(tmp_path))
    k = bench_steps.bench_steps(args)["kinds"]["async"]
    assert _consistent(k["ratio"], 1.5, k["verdict"], at_most=True), k
    assert all(r > 1.5 for r in k["pair_ratios"]), k  # each pair missed: none hides on 1.5


def test_chart_and_summary_say_not_met_for_a_figure_rounded_onto_its_target() -> None:
    from scripts.bench_chart import MET, target_bars

    events = {"runs": 64, "p99_ms": 10.01, "p50_ms": 2.0, "max_ms": 40.0, "events": 10,
              "ratio": 1.001, "verdict": "not met"}
    peers = {"ratio": 5.0, "verdict": "not met"}  # as written before the rounding was fixed
    bars = target_bars({"events": events, "peers": peers})
    assert [colour == MET for _, _, _, colour in bars] == [False, False]
    (row,) = _summary({"events": events})
    assert row[1] == "10.01 ms" and row[-1] == "not met"


def test_crash_summary_shows_the_state_the_run_was_found_in() -> None:
    crash = {"times_in_flight_effect_ran": {"intloom": 1, "dbos": 2}, "verdict": "not met",
             "frameworks": {"intloom": {"status_after_recovery": "completed/-"}}}
    (row,) = _summary({"crash": crash})
    assert row[1] == "intloom 1 (completed/-)" and row[-1] == "not met"


def test_a_recovery_time_says_which_steps_it_ran_again() -> None:
    from scripts.bench_markdown import _crash

    def framework(by_process: dict[str, list[int]], **extra: Any) -> dict[str, Any]:
        return {"executions": {str(k): 1 for k in range(1, 11)}, "in_flight_step_ran": 1,
                "by_process": by_process, "status_after_recovery": "-",
                "second_restart": "-", "recovery_s": 4.68, "recovery_is": "-", **extra}

    fw = {"intloom": framework({"process 1": [1, 2, 3, 4, 5, 6]}),
          "dbos": framework({"process 1": [1, 2, 3, 4, 5, 6], "process 2": [6, 7, 8, 9, 10]},
                            step_sleep_s=2.0)}
    row = next(ln for ln in _crash({"crash": {"frameworks": fw}}, {}).splitlines()
               if ln.startswith("| recovery wall time"))
    assert row == ("| recovery wall time | 4.68 s | 4.68 s, which ran Steps [6, 7, 8, 9, 10] "
                   "(Step 6 sleeps 2 s) |")


def test_an_event_sample_missing_a_follower_or_a_run_is_not_met() -> None:
    from scripts.bench_events import incomplete
    from scripts.bench_markdown import _unmet

    assert incomplete([], 64, 64) == []
    why = incomplete(["IntloomError: The host already serves 2 connections."], 63, 64)
    assert len(why) == 2 and "63 of the 64 Runs" in why[1]
    events = {"p99_ms": 3.41, "p50_ms": 1.3, "p90_ms": 2.0, "verdict": "not met",
              "incomplete": why}
    (line,) = _unmet({"events": events})
    assert "a follower failed: IntloomError" in line


def test_a_step_figure_not_met_is_said_from_its_pairs_not_its_medians() -> None:
    """The ratio is the median of the Run/floor pairs' ratios; the report subtracted the
    medians instead, and said "-36.8 µs per Step over the 1.5x line" of a 1.52x figure
    (2026-12-03's run: 609 µs against a floor of 430.5 µs is 1.41x)."""
    from scripts.bench_markdown import _unmet

    kind = {"verdict": "not met", "ratio": 1.53, "us_per_step": 609.0,
            "floor_us_per_step": 430.5, "cpu_us_per_step": 292.9,
            "floor_cpu_us_per_step": 149.0,
            "pair_ratios": [1.45, 1.67, 1.56, 1.49, 1.49, 1.33, 1.57, 1.56]}
    (line,) = _unmet({"steps": {"kinds": {"sync": kind}}})
    assert "-" not in line[2:], line  # no negative excess after the bullet
    assert "median of 8 neighbouring pairs' ratios (4 of them above 1.5×)" in line, line
    assert "609 µs against 430.5 µs" in line, line


def test_the_report_names_the_sizes_the_run_measured() -> None:
    from scripts.bench_chart import target_bars
    from scripts.bench_markdown import render

    kind = {"steps_per_s": 900, "solo_steps_per_s": 300, "ratio": 3.0, "verdict": "not met",
            "pair_ratios": [3.0], "cpu_us_per_step": 40.0, "steps_per_flush": 7.9}
    side = {"start_s": 0.3, "host_restore_ms": 9.0, "host_ready_ms": 10.0}
    figures = {"concurrency": {"runs": 8, "steps_per_run": 20, "solo_steps": 100,
                               "kinds": {"async": kind}, "ratio": 3.0, "verdict": "not met"},
               "restore": {"runs": 20, "start_s": 0.3, "baseline_start_s": 0.3, "ratio": 1.0,
                           "verdict": "met", "many": side, "none": side}}
    report = {"machine": {}, "total_seconds": 1.0, "when": "now", "quick": True,
              "figures": figures}
    text = render(report, None)
    assert "- **8 Runs (async)**: 3× one Run" in text
    assert "1 Run of 100 Steps and 8 concurrent Runs of 20 Steps each" in text
    assert "with 20 waiting Runs" in text
    assert [b[0] for b in target_bars(figures)] == ["8 Runs vs 1, Steps/s, async Steps (≥ 8×)",
                                                    "start: 20 vs 0 Runs (≤ 2×)"]


def _step_session(ratios: dict[str, float]) -> Any:
    """A stand-in for bench_steps._session whose Runs take ``ratios[kind]`` times the floor."""
    async def session(base: Path, kind: str, sizes: Any, order: list[str],
                      warmup: int) -> list[tuple[str, dict[str, Any]]]:
        run = {"us_per_step": 100.0 * ratios[kind], "cpu_us_per_step": 50.0, "flushes": 100,
               "steps": 100, "bytes": 59_200, "compaction_wait_s": 0.0}
        floor = {"us_per_step": 100.0, "cpu_us_per_step": 9.0, "compaction_wait_s": 0.0}
        return [(n, run if n == "main" else floor) for n in order]
    return session


def test_a_figure_is_met_only_when_every_kind_of_step_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The headline (top-level ratio and verdict, and the chart) is the kind that fared
    worst: it was async's, so a sync kind that missed left the figure "met"."""
    from scripts.bench_chart import MET, NOT_MET, target_bars

    monkeypatch.setattr(bench_steps, "_session", _step_session({"async": 1.2, "sync": 1.6}))
    args = argparse.Namespace(kind="both", steps=100, repeats=2, warmup=1, dir=str(tmp_path))
    steps = bench_steps.bench_steps(args)
    assert [steps["kinds"][k]["verdict"] for k in ("async", "sync")] == ["met", "not met"]
    assert (steps["verdict"], steps["headline_kind"], steps["ratio"]) == ("not met", "sync", 1.6)

    elapsed = {"intloom_async": 0.5, "intloom_sync": 2.0, "langgraph_loop": 5.0}

    def child(variant: str, steps: int, directory: Path) -> dict[str, Any]:
        return {"elapsed_s": elapsed[variant], "cpu_s": 0.1, "peak_rss_mib": 1.0,
                "extra": durable(variant, steps)}

    monkeypatch.setattr(bench_peers, "run_child", child)
    args = argparse.Namespace(only=",".join(elapsed), steps=1000, repeats=1, dir=str(tmp_path))
    peers = bench_peers.bench_peers(args)
    assert (peers["verdict_async"], peers["verdict_sync"]) == ("met", "not met")
    assert (peers["verdict"], peers["headline_kind"], peers["ratio"]) == ("not met", "sync", 2.5)

    # The chart draws each kind against the target, in the colour of its own verdict.
    bars = target_bars({"steps": steps, "peers": peers})
    assert [(label, colour) for label, _, _, colour in bars] == [
        ("µs/Step vs floor, async Steps (≤ 1.5×)", MET),
        ("µs/Step vs floor, sync Steps (≤ 1.5×)", NOT_MET),
        ("faster peer ÷ intloom, async Steps (≥ 5×)", MET),
        ("faster peer ÷ intloom, sync Steps (≥ 5×)", NOT_MET),
    ]


def test_the_concurrency_headline_is_the_kind_further_below_its_target(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    per_s = {"async": 9_000.0, "sync": 7_000.0}  # against 1,000/s for one Run

    async def session(base: Path, kind: str, sizes: Any, order: list[str],
                      warmup: int) -> list[tuple[str, dict[str, Any]]]:
        def run(name: str) -> dict[str, Any]:
            rate = 1_000.0 if name == "one" else per_s[kind]
            return {"steps_per_s": rate, "cpu_us_per_step": 20.0, "steps": 600,
                    "flushes": 10, "crew_splits": 0, "compaction_wait_s": 0.0}
        return [(n, run(n)) for n in order]

    monkeypatch.setattr(bench_steps, "_session", session)
    args = argparse.Namespace(kind="both", runs=64, steps=300, solo_steps=3000, repeats=2,
                              dir=str(tmp_path))
    out = bench_steps.bench_concurrency(args)
    assert [out["kinds"][k]["verdict"] for k in ("async", "sync")] == ["met", "not met"]
    assert (out["verdict"], out["headline_kind"], out["ratio"]) == ("not met", "sync", 7.0)

    from scripts.bench_common import worst

    kinds = {"async": {"ratio": 8.4, "verdict": "met"}, "sync": {"ratio": 9.2, "verdict": "met"}}
    assert worst(kinds, at_most=False) == "async"
    kinds["sync"] = {"ratio": 7.9, "verdict": "not met"}
    assert worst(kinds, at_most=False) == "sync"
    assert worst({"async": {"ratio": 1.1, "verdict": "met"},
                  "sync": {"ratio": 1.3, "verdict": "met"}}, at_most=True) == "sync"


@pytest.mark.parametrize(("variant", "change", "reason"), [
    ("dbos_sqlite", {"synchronous": 1},
     "dbos_sqlite: SQLite synchronous=1, not FULL (2) or EXTRA (3): a commit is not synced "
     "to the disk before the next Step"),
    ("langgraph_loop", {"synchronous": 0},
     "langgraph_loop: SQLite synchronous=0, not FULL (2) or EXTRA (3): a commit is not "
     "synced to the disk before the next Step"),
    ("langgraph_chain", {"journal_mode": "memory"},
     "langgraph_chain: SQLite journal_mode='memory': a commit does not survive a crash"),
    ("langgraph_loop", {"durability": "async"},
     "langgraph_loop: durability='async', not \"sync\": checkpoints are written in the "
     "background"),
    ("dbos_sqlite", {"recorded_steps": 999},
     "dbos_sqlite: recorded_steps=999 for 1000 Steps: not every Step was recorded"),
    ("langgraph_loop", {"checkpoints": None},
     "langgraph_loop: checkpoints=None for 1000 Steps: not every Step was recorded"),
])
def test_a_peer_measured_with_a_setting_that_is_not_durable_makes_the_figure_not_met(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variant: str, change: dict[str, Any],
    reason: str,
) -> None:
    """The peers' read-back settings were reported and never checked: a peer run with
    commits left to the OS would have been faster, and intloom's ratio against it "met"."""
    from scripts.bench_markdown import _unmet

    # intloom 10x faster than every peer: met on the ratio alone.
    elapsed = {"intloom_async": 0.1, "intloom_sync": 0.1, "dbos_sqlite": 1.0,
               "langgraph_loop": 1.0, "langgraph_chain": 1.0}

    def child(name: str, steps: int, directory: Path) -> dict[str, Any]:
        extra = durable(name, steps)
        if name == variant and directory.name.endswith("-1"):  # one repetition of two
            extra = {k: v for k, v in {**extra, **change}.items() if v is not None}
        return {"elapsed_s": elapsed[name], "cpu_s": 0.1, "peak_rss_mib": 1.0, "extra": extra}

    monkeypatch.setattr(bench_peers, "run_child", child)
    args = argparse.Namespace(only=",".join(elapsed), steps=1000, repeats=2, dir=str(tmp_path))
    out = bench_peers.bench_peers(args)
    assert out["not_durable"] == [reason]
    assert (out["verdict_async"], out["verdict_sync"], out["verdict"]) == ("not met",) * 3
    assert out["ratio"] == 10.0  # the ratio is still shown as measured
    assert _unmet({"peers": out}) == [
        "- **vs peers**: not met whatever the ratio: a peer was measured with a setting that "
        f"is not durable: {reason}."]


def test_peers_measured_durably_are_met_on_their_ratio(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    elapsed = {"intloom_async": 0.1, "intloom_sync": 0.1, "dbos_sqlite": 1.0,
               "langgraph_loop": 1.0, "langgraph_chain": 1.0}

    def child(name: str, steps: int, directory: Path) -> dict[str, Any]:
        return {"elapsed_s": elapsed[name], "cpu_s": 0.1, "peak_rss_mib": 1.0,
                "extra": durable(name, steps)}

    monkeypatch.setattr(bench_peers, "run_child", child)
    args = argparse.Namespace(only=",".join(elapsed), steps=1000, repeats=2, dir=str(tmp_path))
    out = bench_peers.bench_peers(args)
    assert out["not_durable"] == []
    assert (out["verdict_async"], out["verdict_sync"]) == ("met", "met")
    extra = durable("dbos_sqlite", 1000)
    assert bench_peers.not_durable("dbos_sqlite", 1000, {**extra, "synchronous": 3}) == []
    assert bench_peers.not_durable("intloom_async", 1000, {}) == []  # not a peer


def test_an_unmet_peer_ratio_says_its_ceiling_once() -> None:
    """The peer ratio is wall time against a Step that waits for one fdatasync: the faster
    peer over the raw floor bounds it whatever intloom's CPU (2026-12-04: 5.1x, where
    intloom was 42 µs above the floor and 4.25x the peer)."""
    from scripts.bench_markdown import _unmet

    variants = {"raw_fdatasync": {"us_per_step": 211.6},
                "intloom_async": {"us_per_step": 253.8},
                "intloom_sync": {"us_per_step": 262.2}}
    peers = {"faster_peer": "langgraph_loop", "faster_peer_us_per_step": 1078.7,
             "ceiling_ratio": 5.1, "variants": variants,
             "ratio_async": 4.25, "verdict_async": "not met",
             "ratio_sync": 4.11, "verdict_sync": "not met"}
    lines = _unmet({"peers": peers})
    assert len(lines) == 3, lines
    ceiling = [ln for ln in lines if "/ that floor" in ln]
    assert len(ceiling) == 1, lines
    assert "took 211.6 µs per Step" in ceiling[0] and "= 5.1×" in ceiling[0], ceiling[0]


def test_a_ceiling_just_under_five_is_not_shown_as_five() -> None:
    """Rounded to the nearest, 1079.0 / 216.0 = 4.995 read "= 5x": reachable, it was not."""
    from scripts.bench_markdown import _unmet
    from scripts.bench_peers import ceiling_ratio

    ceiling = ceiling_ratio(1079.0, 216.0)
    assert ceiling == 4.99
    variants = {"raw_fdatasync": {"us_per_step": 216.0},
                "intloom_async": {"us_per_step": 260.0}}
    peers = {"faster_peer": "langgraph_loop", "faster_peer_us_per_step": 1079.0,
             "ceiling_ratio": ceiling, "variants": variants,
             "ratio_async": 4.15, "verdict_async": "not met"}
    (_, line) = _unmet({"peers": peers})
    assert "= 4.99×" in line, line
