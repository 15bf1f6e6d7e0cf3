"""Runs' sync Steps are driven by crews on worker threads, Step after Step (against the real
store): the same records in the same order as on the loop, followers still see every Step,
a cancel still wins, and a Step that blocks holds up no other Run of its crew."""

from __future__ import annotations

import asyncio
import gc
import inspect
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec
import pytest

import intloom
from intloom.authoring.loader import LoadedWorkflow
from intloom.errors import IntloomError
from intloom.executor.runtime import Runtime
from intloom.runtime.records import Executing, Record, StepReady, StepResult, Terminal
from intloom.store import Store, read_history
from tests.unit.test_store_support import open_store


class Tick(msgspec.Struct):
    n: int = 0


class Probe:
    """What the Steps saw: the thread each ran on; ``hold_at`` parks that Step until set."""

    def __init__(self, hold_at: int | None = None) -> None:
        self.threads: list[int] = []
        self.hold_at = hold_at
        self.held = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()


def ticks(name: str, steps: int, probe: Probe) -> LoadedWorkflow:
    wf = intloom.Workflow(name, version="1")
    stage = wf.stage("loop", state=Tick)

    @stage.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
    def tick(ctx: intloom.StepContext[Tick]) -> str:
        n = ctx.state.n + 1
        probe.threads.append(threading.get_ident())
        if n == probe.hold_at:
            probe.held.set()
            assert probe.release.wait(20), "the test never released the held Step"
            probe.returned.set()
        ctx.state = Tick(n=n)
        return "done" if n >= steps else "again"

    wf.validate()
    return LoadedWorkflow(wf, "test.py", f"id-{name}", wf.schemas())


async def _until(predicate: Any, what: str, limit_s: float = 20.0) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def _records(root: Path, run_id: str) -> list[Record]:
    """The Run's journal as read back from disk (before the store closes and compacts)."""
    entries = read_history(root, run_id)
    assert entries and all(e.verdict == "ok" for e in entries), [e.verdict for e in entries]
    return [e.record for e in entries if e.record is not None]


@pytest.mark.timeout(60)
def test_a_lone_runs_sync_steps_run_on_one_thread_with_every_boundary(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    steps = 60
    probe = Probe()
    lw = ticks("solo", steps, probe)
    seen: list[tuple[str, str]] = []

    async def main() -> list[Record]:
        store = open_store(root)
        rt = Runtime({lw.name: lw}, store, package_version="0.1.0")
        rt.restore([])
        view = await rt.create_run(lw.name, "test")

        async def follow() -> None:
            async for batch in rt.subscribe(view.run_id):
                seen.extend((u.event, u.run.status) for u in batch)

        follower = asyncio.ensure_future(follow())
        final = await asyncio.wait_for(rt.wait_stable(view.run_id), 30)
        await asyncio.wait_for(follower, 10)
        assert final.status == "completed"
        # Every Step was driven on a thread (a crew of one), none from the loop.
        assert rt.runs[view.run_id].steps_on_thread == steps
        records = _records(root, view.run_id)
        await store.close()
        return records

    records = asyncio.run(main())
    loop_thread = threading.get_ident()  # asyncio.run ran its loop on this thread
    assert len(probe.threads) == steps
    assert loop_thread not in probe.threads
    # One worker drives Step after Step.
    assert len(set(probe.threads)) == 1, f"the Steps ran on {len(set(probe.threads))} threads"
    # Exactly the boundaries the loop writes: executing, step_result, step_ready per Step.
    kinds = [type(r).__name__ for r in records]
    body = kinds[kinds.index("Executing"):]
    assert body == ["Executing", "StepResult", "StepReady"] * (steps - 1) + [
        "Executing", "StepResult", "Terminal"]
    # The follower saw every Step, in order, though no publish woke the loop per Step.
    events = [event for event, _ in seen]
    assert events.count("executing") == steps and events.count("step_result") == steps
    assert seen[-1][1] == "completed"


@pytest.mark.timeout(60)
def test_a_cancel_wins_over_a_step_running_on_a_thread(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    probe = Probe(hold_at=30)
    lw = ticks("held", 100, probe)

    async def main() -> list[Record]:
        store = open_store(root)
        rt = Runtime({lw.name: lw}, store, package_version="0.1.0")
        rt.restore([])
        view = await rt.create_run(lw.name, "test")
        await asyncio.to_thread(probe.held.wait, 20)
        slot = rt.runs[view.run_id]
        assert slot.on_thread, "the held Step runs on a thread driving the Run"
        cancelled, ended = await rt.cancel(view.run_id)
        assert not ended and cancelled.status == "failed"
        assert cancelled.last_error is not None
        assert cancelled.last_error.code == "RUN_STOPPED"
        probe.release.set()
        # The Step returns into a Run that is no longer its own: the thread gives it up.
        await _until(lambda: not slot.on_thread and store._shared == 0,
                     "the thread to give the Run and the store up")
        error = slot.view().last_error
        assert error is not None and error.code == "RUN_STOPPED"
        records = _records(root, view.run_id)
        await store.close()
        return records

    records = asyncio.run(main())
    assert probe.returned.is_set()
    assert isinstance(records[-1], Terminal) and records[-1].error is not None
    assert records[-1].error.code == "RUN_STOPPED"
    # Nothing the held Step produced was recorded after the cancel.
    assert isinstance(records[-2], Executing)
    assert sum(isinstance(r, StepResult) for r in records) == 29
    assert len(probe.threads) == 30


@pytest.mark.timeout(60)
def test_a_step_that_blocks_holds_up_no_other_run_and_its_run_rejoins_the_crew(
        tmp_path: Path) -> None:
    """Two Runs' sync Steps are driven by one crew (one thread, one flush per round). The
    first Run's 30th Step blocks: the second Run's Steps must go on meanwhile (the loop's
    look moves it to a crew of its own), and once the blocked Step returns and the first
    Run's Steps are cheap again, the first Run goes back to the second's crew."""
    root = tmp_path / "runtime"
    first, second = Probe(hold_at=30), Probe()
    long_lw, other_lw = ticks("long", 200, first), ticks("other", 600, second)

    async def main() -> tuple[dict[str, list[Record]], int]:
        store = open_store(root)
        rt = Runtime({long_lw.name: long_lw, other_lw.name: other_lw}, store,
                     package_version="0.1.0")
        rt.restore([])
        a = await rt.create_run(long_lw.name, "test")
        await asyncio.to_thread(first.held.wait, 20)
        slot = rt.runs[a.run_id]
        assert slot.on_thread
        crews = rt.driver._crews
        assert crews is not None
        # A split-off crew rejoins after a round under the budget. At 1 ms, a machine busy
        # with other processes stretched the rounds past it and the Run never rejoined
        # (seen at load 9); the held Step is far longer than either budget.
        crews._budget_s = 0.05
        b = await rt.create_run(other_lw.name, "test")
        # The first Run's Step is still held: only a crew of its own lets these run.
        await _until(lambda: len(second.threads) >= 100, "the second Run's Steps")
        assert not first.returned.is_set()
        first.release.set()
        finals = await asyncio.wait_for(
            asyncio.gather(rt.wait_stable(a.run_id), rt.wait_stable(b.run_id)), 30)
        assert [f.status for f in finals] == ["completed", "completed"]
        journals = {run_id: _records(root, run_id) for run_id in (a.run_id, b.run_id)}
        assert crews.splits >= 1
        await store.close()
        return journals, slot.steps_on_thread

    journals, on_thread = asyncio.run(main())
    for history, steps in zip(journals.values(), (200, 600), strict=True):
        assert sum(isinstance(r, StepResult) for r in history) == steps
        assert sum(isinstance(r, StepReady) for r in history) == steps
    assert on_thread == 200
    # The held Step's thread drove the first Run on its own for a round or two; its later
    # Steps ran on the thread driving the second Run.
    held_on = first.threads[29]
    assert first.threads[-1] != held_on
    assert first.threads[-1] in set(second.threads)


@pytest.mark.timeout(60)
def test_a_cancel_during_the_threads_flush_keeps_the_step_from_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the loop, a cancel that lands while a Step's executing is being written ends the
    task in its await: the Step is never called. A worker driving the Run must agree."""
    root = tmp_path / "runtime"
    probe = Probe()
    lw = ticks("flushing", 100, probe)
    writing, release = threading.Event(), threading.Event()

    async def main() -> tuple[int, int, list[Record]]:
        store = open_store(root)
        real_write = Store._write_guarded
        seen = 0

        def held_write(self: Store, batch: Any) -> str | None:
            nonlocal seen
            if threading.current_thread().name == "intloom-step":
                seen += 1
                if seen == 5:  # an executing, written by the thread driving the Run
                    writing.set()
                    assert release.wait(20)
            return real_write(self, batch)

        # On the class: a Store has slots, no instance dict to shadow a method in.
        monkeypatch.setattr(Store, "_write_guarded", held_write)
        rt = Runtime({lw.name: lw}, store, package_version="0.1.0")
        rt.restore([])
        view = await rt.create_run(lw.name, "test")
        await asyncio.to_thread(writing.wait, 20)
        slot = rt.runs[view.run_id]
        calls = len(probe.threads)
        cancel = asyncio.ensure_future(rt.cancel(view.run_id))
        await _until(lambda: not slot.owned, "the cancel to take the Run")
        release.set()
        cancelled, ended = await asyncio.wait_for(cancel, 20)
        assert not ended and cancelled.last_error is not None
        assert cancelled.last_error.code == "RUN_STOPPED"
        await _until(lambda: not slot.on_thread and store._shared == 0,
                     "the thread to give the Run up")
        records = _records(root, view.run_id)
        await store.close()
        return calls, len(probe.threads), records

    before, after, records = asyncio.run(main())
    assert after == before, "the Step whose executing was being written ran after the cancel"
    assert isinstance(records[-1], Terminal) and records[-1].error is not None
    assert records[-1].error.code == "RUN_STOPPED"
    assert isinstance(records[-2], Executing)


@pytest.mark.timeout(60)
def test_a_cancel_racing_the_threads_last_route_reports_the_end_it_lost_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker appends the Run's end while cancel decides: cancel either takes the Run
    first or sees it ended -- never a second terminal record (IllegalTransition)."""
    root = tmp_path / "runtime"
    probe = Probe()
    lw = ticks("racing", 30, probe)
    inside = threading.Event()

    async def main() -> tuple[bool, str]:
        store = open_store(root)
        real_append = Store.append

        def slow_end(self: Store, run_id: str, record: Any, state: Any = None) -> None:
            if isinstance(record, Terminal) and threading.current_thread().name == "intloom-step":
                inside.set()
                # Holds the Run's lock a while (a GIL switch at the worst moment): the
                # cancel below arrives inside this window. The outcome is checked either way.
                threading.Event().wait(0.3)
            real_append(self, run_id, record, state)

        # On the class: a Store has slots, no instance dict to shadow a method in.
        monkeypatch.setattr(Store, "append", slow_end)
        rt = Runtime({lw.name: lw}, store, package_version="0.1.0")
        rt.restore([])
        view = await rt.create_run(lw.name, "test")
        await asyncio.to_thread(inside.wait, 20)
        _view, ended = await asyncio.wait_for(rt.cancel(view.run_id), 20)
        final = await asyncio.wait_for(rt.wait_stable(view.run_id), 20)
        await store.close()
        return ended, final.status

    ended, status = asyncio.run(main())
    assert ended, "the Run had ended: cancel reports it, and changes nothing"
    assert status == "completed"
    assert len(probe.threads) == 30


@pytest.mark.timeout(60)
def test_a_cancel_in_the_hand_off_of_a_sync_steps_awaitable_closes_it_and_ends_its_ctx(
        tmp_path: Path) -> None:
    """A sync Step that returns an awaitable hands it (and its ctx) to the loop, which awaits
    it. A cancel landing in that hand-off -- after the thread handed it back, before the
    loop awaited it -- dropped it: never closed (a "never awaited" warning nobody sees) and
    its ctx never finished, so a helper keeping that ctx could still act through it. The
    Step asks for the cancel itself just before it returns, so it lands in the hand-off:
    either before the thread's result reaches the loop or just after, before the loop
    resumes."""
    root = tmp_path / "runtime"
    held: dict[str, Any] = {}

    async def later() -> str:
        return "done"

    wf = intloom.Workflow("handoff", version="1")
    stage = wf.stage("loop", state=Tick)

    @stage.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
    def tick(ctx: intloom.StepContext[Tick]) -> Any:
        rt: Runtime = held["rt"]
        on_thread = rt.runs[ctx.run_id].on_thread
        held["on_thread"], held["ctx"] = on_thread, ctx
        coro = held["coro"] = later()
        asyncio.run_coroutine_threadsafe(rt.cancel(ctx.run_id), held["loop"])
        return coro

    wf.validate()
    lw = LoadedWorkflow(wf, "test.py", "id-handoff", wf.schemas())

    async def main() -> None:
        store = open_store(root)
        rt = held["rt"] = Runtime({lw.name: lw}, store, package_version="0.1.0")
        held["loop"] = asyncio.get_running_loop()
        rt.restore([])
        view = await rt.create_run(lw.name, "test")
        final = await asyncio.wait_for(rt.wait_stable(view.run_id), 30)
        assert final.last_error is not None and final.last_error.code == "RUN_STOPPED", final
        await _until(lambda: "coro" in held
                     and inspect.getcoroutinestate(held["coro"]) == inspect.CORO_CLOSED,
                     "the Step's awaitable to be closed", 10)
        await store.close()

    asyncio.run(main())
    assert held["on_thread"] is True
    with pytest.raises(IntloomError) as refused:
        held["ctx"].state = Tick(n=99)
    assert refused.value.code == "STEP_INTERACTION_INVALID"


def _alternating(calls: list[tuple[str, str]]) -> LoadedWorkflow:
    """Six Steps, sync and async in turn: a Run's async Steps flush on the loop (``sync``)
    while other Runs' sync Steps flush on their crew's thread (``sync_threadsafe``)."""
    wf = intloom.Workflow("mixed", version="1")
    stage = wf.stage("s")
    names = ["a", "b", "c", "d", "e", "f"]
    for i, name in enumerate(names):
        target = names[i + 1] if i + 1 < len(names) else intloom.COMPLETE

        def note(ctx: Any, name: str = name) -> str:
            calls.append((ctx.run_id, name))
            return "ok"

        async def note_async(ctx: Any, name: str = name) -> str:
            calls.append((ctx.run_id, name))
            return "ok"

        stage.step(name, routes={"ok": target})(note if i % 2 == 0 else note_async)
    wf.validate()
    return LoadedWorkflow(wf, "test.py", "id-mixed", wf.schemas())


@pytest.mark.timeout(120)
def test_no_step_starts_whose_executing_a_failed_write_held(tmp_path: Path) -> None:
    """Each flush in turn fails (real store, five Runs, sync Steps in a crew and async ones
    on the loop): no Step may be called whose ``executing`` record is not in the log. A
    failed write can be the loop's flush, settled before the crew's own flush returns
    (``Runtime.sync_crew`` asks ``failure`` per Run, as ``sync(run_id)`` does)."""
    from intloom.store import FaultPlan

    violations: list[str] = []
    for k in range(2, 40):
        root = tmp_path / f"runtime-{k}"
        calls: list[tuple[str, str]] = []
        lw = _alternating(calls)

        async def main(root: Path = root, lw: LoadedWorkflow = lw, k: int = k) -> list[str]:
            store = open_store(root, faults=FaultPlan(fail_sync=frozenset({k})))
            rt = Runtime({lw.name: lw}, store, package_version="0.1.0")
            rt.restore([])
            views = await asyncio.gather(*(rt.create_run(lw.name, "go") for _ in range(5)),
                                         return_exceptions=True)
            ids = [v.run_id for v in views if not isinstance(v, BaseException)]
            for run_id in ids:
                await asyncio.wait_for(rt.wait_stable(run_id), 20)
            await rt.suspend(grace=5)
            return ids

        for run_id in asyncio.run(main()):
            durable = {e.record.step for e in read_history(root, run_id)
                       if e.verdict == "ok" and type(e.record) is Executing}
            called = {step for rid, step in calls if rid == run_id}
            if called - durable:
                violations.append(f"flush {k} failed: {run_id} ran {sorted(called - durable)} "
                                  "with no durable executing")
    assert violations == []


class _Held:
    """A local of the Step that raised: alive as long as its frame is."""


def _without_the_cyclic_collector(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``asyncio.run(main())`` with the cyclic collector off: only reference counts free
    what the test watches, as between an idle host's rare full collections."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        asyncio.run(main())
    finally:
        if collecting:
            gc.enable()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_step_that_raised_leaves_nothing_of_its_frame_once_its_run_failed(
        tmp_path: Path, kind: str) -> None:
    # A sync Step's exception went through the crew's thread and a future whose frames
    # held each other in cycles: its frames (locals: a State of megabytes) stayed until a
    # full collection, which an idle host may not run for hours (~49 MB per failed Run).
    # With the cyclic collector off, only reference counts can free them.
    held: list[Any] = []
    wf = intloom.Workflow("boom", version="1")
    stage = wf.stage("s", state=Tick)

    def body() -> str:
        local = _Held()
        held.append(weakref.ref(local))
        raise RuntimeError("boom")

    if kind == "sync":
        @stage.step("go", routes={"ok": intloom.COMPLETE})
        def go(ctx: intloom.StepContext[Tick]) -> str:
            return body()
    else:
        @stage.step("go", routes={"ok": intloom.COMPLETE})
        async def go(ctx: intloom.StepContext[Tick]) -> str:
            return body()

    wf.validate()
    lw = LoadedWorkflow(wf, "test.py", "id-boom", wf.schemas())

    async def main() -> None:
        store = open_store(tmp_path / "runtime")
        try:
            rt = Runtime({lw.name: lw}, store, package_version="0.1.0")
            rt.restore([])
            for _ in range(3):
                view = await rt.create_run(lw.name, "test")
                final = await asyncio.wait_for(rt.wait_stable(view.run_id), 20)
                assert final.status == "failed" and final.last_error is not None
                assert final.last_error.code == "STEP_EXECUTION_FAILED"
            await _until(lambda: all(ref() is None for ref in held),
                         "the failed Steps' frames to be freed", 5.0)
            assert len(held) == 3
        finally:
            await store.close()

    _without_the_cyclic_collector(main)


class _Weak(msgspec.Struct, weakref=True):
    n: int = 0


@pytest.mark.timeout(30)
def test_a_run_a_failed_checkpoint_ended_on_a_thread_leaves_nothing_of_its_steps(
        tmp_path: Path) -> None:
    # The failed flush was thrown into the Run's Step loop, which raised it again: its
    # traceback held the crew's frame, whose locals still held that exception, and so the
    # Step loop's frame and the State it had set, until a full collection.
    from intloom.store import FaultPlan

    held: list[Any] = []
    wf = intloom.Workflow("fails", version="1")
    stage = wf.stage("s", state=_Weak)

    @stage.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
    def tick(ctx: intloom.StepContext[_Weak]) -> str:
        ctx.state = _Weak(n=ctx.state.n + 1)
        held.append(weakref.ref(ctx.state))
        return "again" if ctx.state.n < 50 else "done"

    wf.validate()
    lw = LoadedWorkflow(wf, "test.py", "id-fails", wf.schemas())

    async def main() -> None:
        store = open_store(tmp_path / "runtime", faults=FaultPlan(fail_sync=frozenset({4})))
        try:
            rt = Runtime({lw.name: lw}, store, package_version="0.1.0")
            rt.restore([])
            view = await rt.create_run(lw.name, "test")
            final = await asyncio.wait_for(rt.wait_stable(view.run_id), 20)
            assert final.last_error is not None, final
            assert final.last_error.code == "RUN_CHECKPOINT_FAILED", final
            assert rt.runs[view.run_id].steps_on_thread > 0
            await _until(lambda: all(ref() is None for ref in held),
                         "the failed Run's States to be freed", 5.0)
            assert held
        finally:
            await store.close()

    _without_the_cyclic_collector(main)
