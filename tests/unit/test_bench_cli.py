"""``scripts/bench cli`` runs its commands in an order that changes every round: in a fixed
order ``intloom runs`` always ran first, after the previous round's ``python -c pass``."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from scripts import bench_cli
from scripts.bench_common import round_order


@pytest.mark.timeout(60)
def test_cli_runs_its_commands_in_a_different_order_each_round(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spawned: list[str] = []

    def spawn(cmd: Sequence[str], **_: Any) -> tuple[float, float, float]:
        # The harness's timer, recording what it was asked to time (the host is real).
        spawned.append("runs" if cmd[-2:] == ["runs", "--json"] else cmd[-1].split()[-1])
        return 0.01, 0.01, 1.0

    monkeypatch.setattr(bench_cli, "wait4_spawn", spawn)
    args = argparse.Namespace(repeats=6, runs=1, dir=str(tmp_path))
    out = bench_cli.bench_cli(args)
    timed = spawned[9:]  # after three warm-up rounds of three commands
    rounds = [timed[i:i + 3] for i in range(0, len(timed), 3)]
    assert Counter(r[0] for r in rounds) == {"runs": 2, "typer": 2, "pass": 2}
    # intloom runs before `import typer` in half of the rounds, after it in the other half.
    assert sum(r.index("runs") < r.index("typer") for r in rounds) == 3
    assert out["orders"] == rounds  # the JSON says in which order each round ran


@pytest.mark.parametrize("count", [2, 3, 4])
def test_round_order_puts_each_name_first_and_before_each_other_equally(count: int) -> None:
    names = [f"c{i}" for i in range(count)]
    rounds = [round_order(names, r) for r in range(2 * count)]
    assert all(sorted(r) == names for r in rounds)
    assert Counter(r[0] for r in rounds) == dict.fromkeys(names, 2)
    for a, b in combinations(names, 2):
        assert sum(r.index(a) < r.index(b) for r in rounds) == count
