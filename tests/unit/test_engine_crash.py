"""Crash tests with a real SIGKILL: a child runs the `chain` Workflow on the real store and is
killed at every flush in turn; a second child restores and drives what it may. The restart
table must hold, and the counters kept outside the journal prove nothing ran twice."""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from intloom.authoring.loader import load_workflows
from intloom.project import ProjectPaths, load_config
from intloom.runtime.machine import restart_verdict
from intloom.store import read_runs
from tests.helpers import FIXTURES, REPO, counters


def child(root: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("INTLOOM_FAULT", None)
    if fault:
        env["INTLOOM_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "tests.crash_child", str(root), *args],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
    )


FULL_RUN = {
    "init:prepare", "step:fetch", "effect:download", "step:summarize", "effect:model-call",
    "step:approve", "step:post", "effect:post-message",
}


def _project(tmp_path: Path, n: int) -> Path:
    root = tmp_path / f"p{n}"
    shutil.copytree(FIXTURES / "projects" / "crash", root)
    return root


def test_uninterrupted_run_completes_once(tmp_path: Path) -> None:
    root = _project(tmp_path, 0)
    done = child(root, "run", "chain")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    (view,) = report["runs"].values()
    assert view["status"] == "completed"
    (counts,) = counters(root).values()
    assert set(counts) == FULL_RUN and set(counts.values()) == {1}


@dataclass
class _Attempt:
    """One crash point, as the child processes left it: the killed run, then (when it left
    one Run's readable journal) what was counted before the resume, and the resume."""

    root: Path
    first: subprocess.CompletedProcess[str]
    journals: list[Any] = field(default_factory=list)  # read before the resume
    before: collections.Counter[str] | None = None
    second: subprocess.CompletedProcess[str] | None = None


def _attempt(tmp_path: Path, mode: str, n: int) -> _Attempt:
    """Only the processes and the reads the checks need, in the order the checks want them;
    every assertion is the caller's."""
    root = _project(tmp_path, n)
    first = child(root, "run", "chain", fault=f"{mode}={n}")
    if first.returncode != -signal.SIGKILL:
        return _Attempt(root, first)
    journals = read_runs(ProjectPaths(root).runtime)
    if len(journals) != 1 or journals[0].status != "ok" or journals[0].state is None:
        return _Attempt(root, first, journals)
    before = counters(root)[journals[0].state.run_id].copy()
    return _Attempt(root, first, journals, before, child(root, "resume"))


# Crash points ahead of the one being checked: each is its own project and processes, so
# two run at once (two cores); the few past the last flush are wasted.
_AHEAD = 3


@pytest.mark.parametrize("mode", ["crash_after_sync", "crash_before_sync", "torn_write"])
def test_kill_at_every_flush(tmp_path: Path, mode: str) -> None:
    loaded = load_workflows(root := _project(tmp_path, 0), load_config(root))
    chain = loaded.workflows["chain"]
    rows: collections.Counter[str] = collections.Counter()
    in_flight = 0  # crash points whose journal ends with an effect started, not done
    n = 0
    with ThreadPoolExecutor(2) as pool:
        ahead: collections.deque[Future[_Attempt]] = collections.deque()
        try:
            while True:
                n += 1
                while len(ahead) < _AHEAD and n + len(ahead) <= 60:
                    ahead.append(pool.submit(_attempt, tmp_path, mode, n + len(ahead)))
                attempt = ahead.popleft().result()
                root, first = attempt.root, attempt.first
                if first.returncode == 0:
                    break  # the Run finished before flush n: every flush has been tried
                assert first.returncode == -signal.SIGKILL, first.stderr
                assert n < 60, "runaway: the Workflow should need far fewer flushes"
                journals = attempt.journals
                if not journals:
                    rows["never-created"] += 1
                    continue
                (journal,) = journals
                assert journal.status == "ok", journal.problem
                state = journal.state
                assert state is not None
                verdict = restart_verdict(
                    state, chain.has_recover(state.cursor.stage, state.cursor.step))
                rows[verdict.row] += 1
                before, second = attempt.before, attempt.second
                assert before is not None and second is not None
                assert second.returncode == 0, second.stderr
                report = json.loads(second.stdout.splitlines()[-1])
                after = counters(root)[state.run_id]
                # Nothing ran twice: not a completed Step, not a started effect.
                assert all(c == 1 for c in after.values()), (n, after)
                view = report["runs"].get(state.run_id)
                if verdict.row == "terminal":
                    assert view is None  # terminal Runs are never loaded
                    continue
                assert view is not None
                if verdict.row == "interrupted":
                    assert view["status"] == "failed"
                    assert view["lastError"]["code"] == "RUN_INTERRUPTED"
                    if state.effect_in_flight is not None:
                        in_flight += 1
                        assert state.effect_in_flight.name in view["lastError"]["message"]
                    assert after == before  # nothing was replayed
                else:
                    assert view["status"] == "completed", (n, verdict, view)
                    # A resumed Run did every Step exactly once across both processes.
                    assert set(after) - {"recover:approve"} == FULL_RUN, (n, after)
        finally:
            for pending in ahead:
                pending.cancel()
    assert n > 5
    # The sweep reached the rows this Workflow can reach.
    assert rows["resume"] and rows["interrupted"] and rows["restore_wait"], rows
    # effect_started is durable before the effect is called (DESIGN section 5): some crash
    # point must find an effect in flight, or the check that the message names it never ran.
    assert in_flight, f"no crash point left an effect in flight (rows {dict(rows)})"
    print(f"{mode}: {n - 1} crash points, rows {dict(rows)}")
