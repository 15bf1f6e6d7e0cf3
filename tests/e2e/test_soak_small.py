"""A small soak in CI: the same driver and judge as ``scripts/soak``, scaled down.

Concurrent Runs of every soak Workflow, attached clients, graceful and SIGKILL restarts at
seeded moments; the verdict comes from the journals, the Workflows' own counters and the
host process. The full soak (200 Runs, 20 clients, 10 + 3 cycles) is ``scripts/soak``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.soak_main import Config, rejudge, run_soak

pytestmark = pytest.mark.e2e


def test_a_small_soak_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    # A 3 s load window still holds the three restart cycles (they land in its first 80 %,
    # half a second apart at least); the window is time spent, not what is checked.
    cfg = Config(runs=16, clients=4, workers=3, graceful=2, kills=1, window=3.0, settle=30.0,
                 deadline=50.0, seed=3, max_goal=6, keep=True)
    summary = run_soak(cfg, workdir=tmp_path)
    assert summary["violations"] == [], summary
    assert summary["cycles"] == {"graceful": 2, "kill": 1}
    runs = summary["runs"]
    assert runs["created"] >= cfg.runs and runs["completed"] > 0
    assert runs["completed"] + runs["interrupted"] == runs["created"]
    assert set(runs["byWorkflow"]) == {"soak-ticker", "soak-review", "soak-agent", "soak-ask"}
    assert summary["effects"]["done"] > 0 and summary["interactions"]["agentTasks"] > 0
    assert summary["subscribe"]["events"] > 0
    assert summary["host"]["listen"] == ["127.0.0.1"]

    # The judge is not a rubber stamp: an effect counted twice is a violation.
    root = Path(summary["project"])
    counters = root / "counters.log"
    effect = next(line for line in counters.read_text().splitlines() if " effect " in line)
    with counters.open("a") as fh:
        fh.write(effect + "\n")
    assert any("ran 2 times" in v for v in rejudge(root))
