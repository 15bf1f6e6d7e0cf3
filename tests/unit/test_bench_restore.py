"""``scripts/bench restore`` is "met" only for starts that restored every Run, waiting, as the
started host itself answers: a host that restored fewer Runs starts faster, and its ratio
would flatter it. Real hosts through the real CLI, at a tiny size."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from scripts import bench_host
from scripts.bench_common import Host


@pytest.mark.timeout(60)
def test_restore_is_not_met_when_a_start_restored_fewer_runs_than_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hold = bench_host._hold_runs

    def one_short(host: Host, runs: int) -> None:  # the harness's set-up, not intloom
        hold(host, runs - 1)

    monkeypatch.setattr(bench_host, "_hold_runs", one_short)
    args = argparse.Namespace(runs=3, repeats=2, dir=str(tmp_path))
    out = bench_host.bench_restore(args)
    assert out["verdict"] == "not met", out
    assert out["restored"] == [{"status_waiting": 2, "listed": 2, "listed_waiting": 2}] * 2
    assert out["restored_waiting"] == 2
    assert out["incomplete"] == [
        f"start {i} of 2: the host had 2 Runs, 2 of them waiting (status: 2 waiting), "
        "not 3 waiting" for i in (1, 2)]


def test_restore_counts_a_start_as_complete_only_with_every_run_waiting() -> None:
    whole = {"status_waiting": 4, "listed": 4, "listed_waiting": 4}
    assert bench_host.restore_incomplete(4, [whole, whole]) == []
    ended = {"status_waiting": 3, "listed": 4, "listed_waiting": 3}
    assert bench_host.restore_incomplete(4, [whole, ended]) == [
        "start 2 of 2: the host had 4 Runs, 3 of them waiting (status: 3 waiting), "
        "not 4 waiting"]
    assert bench_host.restore_incomplete(4, []) == ["no start was checked"]
