"""Every ``scripts/bench`` sub-command runs end to end on a tiny size and prints one figure.

No timing is asserted: on a tiny size and a shared machine the numbers mean nothing. What is
checked is that each figure runs against real hosts and files, prints exactly one JSON object
on stdout with its baseline and verdict, and that the report renders from those objects. The
peers (DBOS, LangGraph) need their own virtual environment from the package index, so here
the peer figures run only their intloom and floor sides.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from scripts.bench_common import tagged
from tests.helpers import REPO, eventually, pid_alive, processes_with

TINY: dict[str, list[str]] = {
    "steps": ["--steps", "40", "--repeats", "2", "--warmup", "5"],
    "concurrency": ["--runs", "4", "--steps", "10", "--solo-steps", "40", "--repeats", "1"],
    "peers": ["--steps", "20", "--repeats", "1",
              "--only", "raw_fdatasync,intloom_async,intloom_sync"],
    "restart": ["--records", "300", "--baseline-records", "30", "--repeats", "1"],
    "restore": ["--runs", "5", "--repeats", "1"],
    "cli": ["--repeats", "1", "--runs", "1"],
    "memory": ["--runs", "5"],
    "events": ["--runs", "3", "--followers", "1", "--seconds", "0.3"],
    "crash": ["--only", "intloom"],
}


# Set, with a value of its own, in the environment of each figure's process, which every
# process it starts inherits: a figure killed at its timeout left its hosts running.
RUN_ENV = "INTLOOM_BENCH_SMOKE_RUN"


def _figure(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``scripts/bench ARGV``; whatever it started and left is killed after, however it
    ended (a figure killed at its timeout left its hosts running)."""
    tag = uuid.uuid4().hex
    try:
        return subprocess.run([sys.executable, "-m", "scripts.benchmarks", *argv],
                              cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, RUN_ENV: tag})
    finally:
        left = tagged(tag, RUN_ENV)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in left:
            eventually(partial(_gone, pid), what=f"process {pid} to end")


def _gone(pid: int) -> bool:
    return not pid_alive(pid)


def _bench(figure: str, tmp: Path) -> dict[str, Any]:
    proc = _figure([figure, *TINY[figure], "--dir", str(tmp)], timeout=50)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stdout  # one JSON object, progress goes to stderr
    result: dict[str, Any] = json.loads(lines[0])
    return result


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    # Under pytest-xdist this module fixture ran in every worker that drew one of the tests
    # here: every figure twice over, side by side, on 2 CPUs (figures then hit their 50 s).
    # The first worker runs them and leaves the results in the session's directory; another
    # waits for that (a lock) and reads them.
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base
    done = shared / "bench-smoke-results.json"
    fd = os.open(shared / "bench-smoke.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if done.exists():
            got: dict[str, dict[str, Any]] = json.loads(done.read_text())
            return got
        got = _every_figure(tmp_path_factory)
        done.write_text(json.dumps(got))
        return got
    finally:
        os.close(fd)


def _every_figure(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    # The figures share nothing (each its own --dir, hosts and ports) and mostly wait on
    # fdatasync and subprocesses: run side by side, they take far less than one by one.
    dirs = {figure: tmp_path_factory.mktemp(figure) for figure in TINY}
    with ThreadPoolExecutor(len(TINY)) as pool:
        asked = {figure: pool.submit(_bench, figure, dirs[figure]) for figure in TINY}
        return {figure: done.result() for figure, done in asked.items()}


@pytest.mark.parametrize("figure", [f for f in TINY if f not in ("crash", "peers")])
def test_each_figure_prints_its_ratio_against_a_baseline(
    results: dict[str, dict[str, Any]], figure: str
) -> None:
    result = results[figure]
    assert result["figure"] == figure
    assert result["verdict"] in ("met", "not met")
    if figure == "events":
        assert result["events"] > 0 and result["p99_ms"] >= result["p50_ms"] > 0
    else:
        assert result["ratio"] > 0


def test_step_figures_report_both_sides(results: dict[str, dict[str, Any]]) -> None:
    for kind in ("async", "sync"):
        step = results["steps"]["kinds"][kind]
        assert step["us_per_step"] > 0 and step["floor_us_per_step"] > 0
        assert step["flushes_per_step"] >= 1  # one fdatasync per Step at least, never fewer
    peers = results["peers"]["variants"]
    assert set(peers) == {"raw_fdatasync", "intloom_async", "intloom_sync"}
    assert "faster_peer" not in results["peers"]  # no peer was run, so no ratio is claimed


def test_concurrency_reports_runs_started_together_and_staggered(
    results: dict[str, dict[str, Any]]
) -> None:
    for kind in ("async", "sync"):
        k = results["concurrency"]["kinds"][kind]
        assert k["steps_per_s"] > 0 and k["staggered"]["steps_per_s"] > 0
        assert k["staggered"]["ratio"] > 0
        assert k["steps_per_flush"] > 1  # 4 Runs share flushes: group commit groups


def test_restart_figures_restore_what_they_built(results: dict[str, dict[str, Any]]) -> None:
    assert results["restart"]["records"] > results["restart"]["baseline_records"] > 0
    assert results["restore"]["restored_waiting"] == 5
    assert results["restore"]["restored"] == [
        {"status_waiting": 5, "listed": 5, "listed_waiting": 5}]  # checked at the start timed
    assert results["restore"]["incomplete"] == []


def test_crash_figure_shows_the_in_flight_effect_ran_once(
    results: dict[str, dict[str, Any]]
) -> None:
    ours = results["crash"]["frameworks"]["intloom"]
    assert ours["in_flight_step_ran"] == 1
    assert ours["status_after_recovery"] == "failed/RUN_INTERRUPTED"
    assert ours["lines_after_second_restart"] == ours["lines_after_first_recovery"]
    assert results["crash"]["verdict"] == "met"


def test_report_renders_from_the_figures(results: dict[str, dict[str, Any]]) -> None:
    from scripts.bench_common import machine
    from scripts.bench_markdown import render

    report = {"machine": machine(), "total_seconds": 1.0, "when": "now", "quick": True,
              "figures": results}
    text = render(report, None)
    assert text.startswith("# Performance")
    assert "| µs per durable Step, 1 Run (async Step) |" in text
    assert "The same kill under intloom, DBOS and LangGraph" in text


@pytest.mark.timeout(120)
def test_a_figure_killed_before_it_ends_leaves_no_host(tmp_path: Path) -> None:
    """A figure killed at the smoke test's timeout left its hosts running. Here one is
    killed (SIGKILL, as the timeout does) while its host serves."""
    argv = ["events", "--runs", "1", "--followers", "1", "--seconds", "300",
            "--dir", str(tmp_path)]
    ended: list[subprocess.CompletedProcess[str]] = []
    runner = threading.Thread(target=lambda: ended.append(_figure(argv, timeout=100)))
    runner.start()
    hosts: list[int] = []
    try:
        hosts = eventually(lambda: processes_with(b"intloom.host", bytes(tmp_path)),
                           timeout=60, what="the figure's host")
        [figure] = processes_with(b"scripts.benchmarks", b"--seconds\0" + b"300", bytes(tmp_path))
        os.kill(figure, signal.SIGKILL)
        runner.join(60)
        assert ended[0].returncode == -signal.SIGKILL
        assert [pid for pid in hosts if pid_alive(pid)] == []
    finally:
        for pid in hosts:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        runner.join(60)
