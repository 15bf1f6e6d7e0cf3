"""Workflow code that cancels the task running its Run, against the real Runtime and Store.

The host cancels a Run's task only once it has let go of the Run (a cancel, a lost
checkpoint) or to cut its stop, so a cancel asked for otherwise is user code's: the Run
fails, saying so. These cover what a first fix missed: a crew's thread going on to the next
sync Step of a Run that had failed, and a second cancel leaving the failure unshown."""

from __future__ import annotations

import asyncio
import collections
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

import intloom
from intloom.authoring.loader import LoadedWorkflow
from intloom.executor.runtime import Runtime
from intloom.store import Store

pytestmark = pytest.mark.timeout(60)


class Count(msgspec.Struct):
    n: int = 0


def _loaded(wf: intloom.Workflow) -> dict[str, LoadedWorkflow]:
    wf.validate()
    return {wf.name: LoadedWorkflow(wf, "test", f"{wf.name}-identity", wf.schemas())}


async def _runtime(tmp_path: Path, wf: intloom.Workflow) -> tuple[Runtime, Store]:
    store = Store.open(tmp_path / f"runtime-{uuid.uuid4().hex}", instance_id=str(uuid.uuid4()),
                       package_version="test")
    rt = Runtime(_loaded(wf), store, package_version=intloom.__version__)
    rt.restore([])
    return rt, store


async def _ten_runs(tmp_path: Path, wf: intloom.Workflow, pause: float = 0.0,
                    kept: dict[str, Runtime] | None = None) -> list[Any]:
    """Ten Runs of ``wf``, one after another, each to its stable view; ``pause`` after each
    (a crew's late Step, if any, runs meanwhile)."""
    rt, store = await _runtime(tmp_path, wf)
    if kept is not None:
        kept["rt"] = rt
    try:
        ended = []
        for _ in range(10):
            view = await rt.create_run(wf.name, "x")
            ended.append(await asyncio.wait_for(rt.wait_stable(view.run_id), 20))
            await asyncio.sleep(pause)
        return ended
    finally:
        await store.close()


def _all_failed(ended: list[Any]) -> None:
    assert {(v.status, v.last_error.code if v.last_error else None) for v in ended} == {
        ("failed", "STEP_EXECUTION_FAILED")}, ended


def test_no_sync_step_runs_after_its_run_failed_for_a_cancel(tmp_path: Path) -> None:
    runtime: dict[str, Runtime] = {}
    seen: collections.Counter[str] = collections.Counter()
    wf = intloom.Workflow("crewed", version="1")
    stage = wf.stage("s", state=Count)

    @stage.step("arm", routes={"go": "tick"})
    async def arm(ctx: intloom.StepContext[Count]) -> str:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_later(0.02, task.cancel)  # a stray watchdog
        return "go"

    @stage.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
    def tick(ctx: intloom.StepContext[Count]) -> str:
        seen[runtime["rt"].runs[ctx.run_id].state.phase] += 1  # what the Run was, as it ran
        ctx.state = Count(n=ctx.state.n + 1)
        return "done" if ctx.state.n >= 1_000_000 else "again"

    _all_failed(asyncio.run(_ten_runs(tmp_path, wf, pause=0.05, kept=runtime)))
    assert seen["terminal"] == 0, dict(seen)  # no Step ran on a Run that had ended
    assert seen["executing"] > 0, dict(seen)


def test_a_cancel_repeated_until_the_task_ends_still_shows_the_failure(tmp_path: Path) -> None:
    wf = intloom.Workflow("repeated", version="1")
    stage = wf.stage("s")

    @stage.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: intloom.StepContext[None]) -> str:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()

        def again() -> None:  # a watchdog that cancels until the task is done
            task.cancel()
            if not task.done():
                loop.call_soon(again)

        loop.call_soon(again)
        await asyncio.sleep(10)
        return "ok"

    _all_failed(asyncio.run(_ten_runs(tmp_path, wf)))
