"""What a flush made durable reaches a followed Run's followers as soon as the flush ends,
not at the Run's turn after it. The Runs one flush wakes resume one after another, each
running its next Step before the next Run resumes: a follower of the last of 64 busy Runs
waited for 63 other Steps after every flush (the events benchmark's p50 was a whole round,
~5-6 ms on a 2-vCPU VM). The real Store and Runtime, in one process; the disk's fdatasync
is a no-op so that every flush is written by the loop itself, the path a fast disk takes."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import msgspec
import pytest

import intloom
from intloom.authoring.loader import LoadedWorkflow
from intloom.executor.runtime import Runtime
from intloom.executor.updates import RunUpdate
from intloom.store import Store

pytestmark = pytest.mark.timeout(60)

STEPS = 30


class Count(msgspec.Struct):
    n: int = 0


def _ticks(order: list[tuple[str, str, int]], store: list[Store], name: str,
           steps: int) -> LoadedWorkflow:
    wf = intloom.Workflow(name, version="1")
    stage = wf.stage("spin", state=Count)

    @stage.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
    async def tick(ctx: intloom.StepContext[Count]) -> str:
        order.append(("step", ctx.run_id, store[0].flushes))
        ctx.state = Count(n=ctx.state.n + 1)
        return "done" if ctx.state.n >= steps else "again"

    wf.validate()
    return LoadedWorkflow(wf, f"{name}.py", f"id-{name}", wf.schemas())


def test_a_followed_run_is_shown_before_the_runs_woken_with_it_run_their_next_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)
    order: list[tuple[str, str, int]] = []  # ("step" | "shown", Run, flushes so far)

    async def main() -> list[str]:
        store = Store.open(tmp_path / "runtime", instance_id=str(uuid.uuid4()),
                           package_version="test")
        try:
            flows = [_ticks(order, [store], "ticks", STEPS),
                     _ticks(order, [store], "short", STEPS // 2)]
            rt = Runtime({lw.name: lw for lw in flows}, store,
                         package_version=intloom.__version__)
            rt.restore([])
            # The followed Run is created last: each flush wakes it after the other two.
            # It ends halfway through theirs: its end (Runtime.sync) is shown early too.
            others = [await rt.create_run("ticks", "go") for _ in range(2)]
            watched = await rt.create_run("short", "go")

            def sink(updates: list[RunUpdate]) -> None:
                order.append(("shown", ",".join(u.event for u in updates), store.flushes))

            slot, _history = await rt.attach(watched.run_id, sink)
            finals = [await rt.wait_stable(v.run_id) for v in (*others, watched)]
            slot.detach(sink)
            return [f.status for f in finals]
        finally:
            await store.close()

    statuses = asyncio.run(main())
    assert statuses == ["completed"] * 3
    shown = [i for i, entry in enumerate(order) if entry[0] == "shown"]
    assert len(shown) >= STEPS // 2 - 2, order  # (the first may come before the follower did)
    assert order[shown[-1]][1].endswith("terminal"), order[shown[-1]]
    # No Step, of any Run, ran between a flush's end and the showing of what it made
    # durable of the followed Run: every Step after it counts the same flushes.
    late = [(order[j], order[i]) for i in shown for j in range(i)
            if order[j][0] == "step" and order[j][2] == order[i][2]]
    assert not late, late[:5]
    # And the three Runs shared their flushes (group commit), the case this is about: alone,
    # each would need one per Step.
    steps = [entry for entry in order if entry[0] == "step"]
    assert len(steps) == 2 * STEPS + STEPS // 2 and steps[-1][2] < 2 * STEPS, steps[-1]
    # The followed Run's end came while the others still ran Steps.
    assert any(entry[0] == "step" for entry in order[shown[-1]:])
