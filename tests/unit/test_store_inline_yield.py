"""A lone busy Run whose flushes the loop writes itself (the disk being fast) still lets the
loop's other tasks run: a client's hello, a stop, a timer. Before, ``Store.sync`` suspended
nowhere on that path, and such a Run held the host's loop for as long as the disk stayed fast
(a hello went unanswered for 5-14 s in a host)."""

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
from intloom.store import Store

pytestmark = pytest.mark.timeout(60)

STEPS = 3000


class Count(msgspec.Struct):
    n: int = 0


def _busy() -> LoadedWorkflow:
    wf = intloom.Workflow("busy", version="1")
    stage = wf.stage("spin", state=Count)

    @stage.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
    async def tick(ctx: intloom.StepContext[Count]) -> str:
        await ctx.aeffect("note", str, key=str(ctx.state.n))
        ctx.state = Count(n=ctx.state.n + 1)
        return "done" if ctx.state.n >= STEPS else "again"

    wf.validate()
    return LoadedWorkflow(wf, "busy.py", "id-busy", wf.schemas())


def test_a_lone_busy_run_flushing_inline_lets_the_loop_run_its_other_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A disk that never makes the loop hand flushes to the store's thread: every flush of
    # the lone Run is written by the loop itself, which is the path under test.
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)

    async def main() -> tuple[int, str, int, int]:
        store = Store.open(tmp_path / "runtime", instance_id=str(uuid.uuid4()),
                           package_version="test")
        try:
            lw = _busy()
            rt = Runtime({lw.name: lw}, store, package_version=intloom.__version__)
            rt.restore([])
            ticks = 0
            widest = 0  # the most flushes the Run wrote between two turns of the ticker
            ended = asyncio.Event()

            async def ticker() -> None:  # what a client's hello or a timer needs: a turn
                nonlocal ticks, widest
                last = store.inline_flushes
                while not ended.is_set():
                    await asyncio.sleep(0)
                    ticks += 1
                    widest = max(widest, store.inline_flushes - last)
                    last = store.inline_flushes

            view = await rt.create_run("busy", "go")
            ticking = asyncio.ensure_future(ticker())
            final = await rt.wait_stable(view.run_id)
            ended.set()
            await ticking
            return ticks, final.status, store.inline_flushes, widest
        finally:
            await store.close()

    ticks, status, inline, widest = asyncio.run(main())
    assert status == "completed"
    assert inline > STEPS, inline  # the loop wrote the Run's flushes itself
    # Before, the ticker had its turns only before the Run got going and after it ended: the
    # Run wrote all its ~9,000 flushes between two of them. A turn at least every 2 ms leaves
    # ~150 between two here (a few hundred on a machine many times faster).
    assert ticks > 1 and widest < inline // 4, (ticks, widest, inline)
