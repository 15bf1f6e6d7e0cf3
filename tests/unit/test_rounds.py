"""Async Steps driven by the loop's rounds (executor.rounds), against the real Runtime and
Store: one callback advances every busy Run per flush, yet each Step's code runs as its own
task would run it -- that task current, that task's context, its cancellation thrown in
where the Step waits."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import types
from pathlib import Path
from typing import Any

import msgspec
import pytest

import intloom
from intloom.authoring.workflow import Stage
from intloom.executor.driver import RUN_TASK_PREFIX
from intloom.executor.runtime import Runtime
from tests.unit.test_user_cancel import _runtime

pytestmark = pytest.mark.timeout(60)

_SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("_SEEN", default="unset")


class Count(msgspec.Struct):
    n: int = 0


def _counting(stage: Stage[Count], name: str, upto: int) -> None:
    """A Step ``name`` of ``stage`` that routes to itself until the State counts ``upto``."""
    @stage.step(name, routes={"again": name, "done": intloom.COMPLETE})
    async def count(ctx: intloom.StepContext[Count]) -> str:
        ctx.state = Count(n=ctx.state.n + 1)
        return "done" if ctx.state.n >= upto else "again"


async def _run_all(rt: Runtime, name: str, runs: int) -> list[Any]:
    views = [await rt.create_run(name, "x") for _ in range(runs)]
    return list(await asyncio.wait_for(
        asyncio.gather(*(rt.wait_stable(v.run_id) for v in views)), 30))


def _ended(tmp_path: Path, wf: intloom.Workflow, runs: int) -> list[Any]:
    """``runs`` Runs of ``wf`` at once, each to its stable view, in a store of their own."""
    async def main() -> list[Any]:
        rt, store = await _runtime(tmp_path, wf)
        try:
            return await _run_all(rt, wf.name, runs)
        finally:
            await store.close()

    return asyncio.run(main())


def test_a_step_runs_in_its_runs_task_and_context_before_and_after_it_awaits(
        tmp_path: Path) -> None:
    """The task current in a Step is its Run's, and a context variable it sets is there
    after an await and in the Run's next Step, for every one of several Runs at once."""
    seen: list[tuple[str, str, str, str]] = []
    wf = intloom.Workflow("ctx", version="1")
    stage = wf.stage("s", state=Count)

    @stage.step("first", routes={"go": "second"})
    async def first(ctx: intloom.StepContext[Count]) -> str:
        task = asyncio.current_task()
        assert task is not None
        _SEEN.set(ctx.run_id)
        await asyncio.sleep(0.001)  # a real future: the Step waits outside a round
        after = asyncio.current_task()
        assert after is not None
        seen.append((ctx.run_id, task.get_name(), after.get_name(), _SEEN.get()))
        return "go"

    @stage.step("second", routes={"done": intloom.COMPLETE})
    async def second(ctx: intloom.StepContext[Count]) -> str:
        task = asyncio.current_task()
        assert task is not None
        seen.append((ctx.run_id, task.get_name(), task.get_name(), _SEEN.get()))
        return "done"

    ended = _ended(tmp_path, wf, 8)
    assert {v.status for v in ended} == {"completed"}, ended
    assert len(seen) == 16, seen
    for run_id, before, after, value in seen:
        assert before == after == f"{RUN_TASK_PREFIX}{run_id}", (run_id, before, after)
        assert value == run_id, (run_id, value)


def test_a_timeout_in_a_step_cancels_that_steps_await_only(tmp_path: Path) -> None:
    """``asyncio.timeout`` takes the current task: the Run's, whose await it cuts; the other
    Runs, driven in the same rounds, go on."""
    wf = intloom.Workflow("timed", version="1")
    stage = wf.stage("s", state=Count)

    @stage.step("wait", routes={"timed_out": "tick", "woke": intloom.COMPLETE})
    async def wait(ctx: intloom.StepContext[Count]) -> str:
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(30)
        except TimeoutError:
            return "timed_out"
        return "woke"

    _counting(stage, "tick", 20)
    ended = _ended(tmp_path, wf, 6)
    assert {v.status for v in ended} == {"completed"}, ended


def test_a_cancel_reaches_a_step_where_it_awaits(tmp_path: Path) -> None:
    """A Run cancelled while its Step awaits an event that never comes: the cancellation is
    raised at that await (its ``finally`` runs), and the other Runs complete."""
    cut: list[str] = []
    started: dict[str, asyncio.Event] = {}
    wf = intloom.Workflow("cut", version="1")
    stage = wf.stage("s", state=Count)

    @stage.step("a", routes={"never": intloom.COMPLETE, "ok": "b"})
    async def a(ctx: intloom.StepContext[Count]) -> str:
        if ctx.intent == "hang":
            started[ctx.run_id].set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cut.append(ctx.run_id)
                raise
            return "never"
        return "ok"

    _counting(stage, "b", 30)

    async def main() -> tuple[Any, list[Any]]:
        rt, store = await _runtime(tmp_path, wf)
        try:
            views = [await rt.create_run("cut", "x") for _ in range(4)]
            hung = await rt.create_run("cut", "hang")
            started[hung.run_id] = asyncio.Event()
            await asyncio.wait_for(started[hung.run_id].wait(), 10)
            await rt.cancel(hung.run_id)
            gone = await asyncio.wait_for(rt.wait_stable(hung.run_id), 10)
            others = [await asyncio.wait_for(rt.wait_stable(v.run_id), 30) for v in views]
            return gone, others
        finally:
            await store.close()

    gone, others = asyncio.run(main())
    assert gone.status == "failed" and gone.last_error is not None, gone
    assert gone.last_error.code == "RUN_STOPPED", gone
    assert cut == [gone.run_id], cut
    assert {v.status for v in others} == {"completed"}, others


def test_a_step_that_yields_to_the_loop_again_and_again_completes(tmp_path: Path) -> None:
    """``await asyncio.sleep(0)`` is a bare yield: a round takes it up again at the next."""
    wf = intloom.Workflow("yields", version="1")
    stage = wf.stage("s", state=Count)

    @stage.step("a", routes={"done": intloom.COMPLETE})
    async def a(ctx: intloom.StepContext[Count]) -> str:
        for _ in range(50):
            await asyncio.sleep(0)
        return "done"

    assert {v.status for v in _ended(tmp_path, wf, 5)} == {"completed"}


def test_busy_runs_take_a_step_each_per_round_without_their_tasks_waking(
        tmp_path: Path) -> None:
    """Eight Runs of 40 Steps each: their tasks (``_drive``) wake once or twice per Run, not
    once per Step (each task's wake-up through asyncio was ~10 % of a Step's instructions);
    one round per flush advances them all."""
    wf = intloom.Workflow("busy", version="1")
    stage = wf.stage("s", state=Count)

    _counting(stage, "tick", 40)
    calls: dict[str, int] = {"_drive": 0, "_round": 0, "count": 0}

    def profile(frame: Any, event: str, arg: Any) -> None:
        name = frame.f_code.co_name
        if event == "call" and name in calls:  # a coroutine's resumption is a call too
            calls[name] += 1

    async def main() -> list[Any]:
        rt, store = await _runtime(tmp_path, wf)
        try:
            views = [await rt.create_run("busy", "x") for _ in range(8)]
            sys.setprofile(profile)
            try:
                return list(await asyncio.wait_for(
                    asyncio.gather(*(rt.wait_stable(v.run_id) for v in views)), 30))
            finally:
                sys.setprofile(None)
        finally:
            await store.close()

    ended = asyncio.run(main())
    assert {v.status for v in ended} == {"completed"}, ended
    # Most Steps ran while it watched (the first ones may have run as the Runs were made).
    assert calls["count"] >= 8 * 30, calls
    # Before: one _drive resumption per Run per Step (~300).
    assert calls["_drive"] <= 8 * 3, calls
    assert 30 <= calls["_round"] <= calls["count"] // 2, calls


@types.coroutine
def _bad_yield() -> Any:
    yield 5  # neither a future nor a bare yield: what a task refuses


def test_a_step_that_yields_what_a_task_refuses_fails_as_its_task_would_fail_it(
        tmp_path: Path) -> None:
    """A yield the rounds do not serve goes back to the Run's task, which throws in what
    it throws for it (RuntimeError: bad yield): the Step fails, naming it, and the Runs
    beside it complete."""
    wf = intloom.Workflow("bad", version="1")
    stage = wf.stage("s", state=Count)

    @stage.step("a", routes={"ok": "b"})
    async def a(ctx: intloom.StepContext[Count]) -> str:
        if ctx.intent == "bad":
            await _bad_yield()
        return "ok"

    _counting(stage, "b", 10)

    async def main() -> tuple[Any, list[Any]]:
        rt, store = await _runtime(tmp_path, wf)
        try:
            views = [await rt.create_run("bad", "x") for _ in range(3)]
            bad = await rt.create_run("bad", "bad")
            failed = await asyncio.wait_for(rt.wait_stable(bad.run_id), 10)
            others = [await asyncio.wait_for(rt.wait_stable(v.run_id), 30) for v in views]
            return failed, others
        finally:
            await store.close()

    failed, others = asyncio.run(main())
    assert failed.status == "failed" and failed.last_error is not None, failed
    assert failed.last_error.code == "STEP_EXECUTION_FAILED", failed
    assert "bad yield" in failed.last_error.message, failed.last_error.message
    assert {v.status for v in others} == {"completed"}, others
