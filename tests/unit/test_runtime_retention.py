"""A long-lived host does not grow with every Run it ever ran: ended Runs past the cap are
dropped from memory (their journal keeps them for ``inspect``), unfinished ones never are.

Found by the soak (scripts/soak): about 10 KB of host memory per ended Run, for good.
"""

from __future__ import annotations

import asyncio

import pytest

import intloom
from intloom.authoring.loader import LoadedWorkflow
from intloom.errors import IntloomError
from intloom.executor.runtime import Runtime
from tests.unit.memjournal import MemoryJournal


def _workflows() -> dict[str, LoadedWorkflow]:
    quick = intloom.Workflow("quick", version="1")
    stage = quick.stage("s")

    @stage.step("go", routes={"done": intloom.COMPLETE})
    async def go(ctx: intloom.StepContext[None]) -> str:
        return "done"

    slow = intloom.Workflow("slow", version="1")
    waits = slow.stage("s")

    @waits.step("ask", routes={"yes": intloom.COMPLETE})
    async def ask(ctx: intloom.StepContext[None]) -> str:
        await ctx.confirm({})
        return "yes"

    out = {}
    for wf in (quick, slow):
        wf.validate()
        out[wf.name] = LoadedWorkflow(wf, "test.py", "id-" + wf.name, wf.schemas())
    return out


def test_ended_runs_past_the_cap_are_dropped_and_counted_unfinished_ones_kept() -> None:
    async def go() -> None:
        rt = Runtime(_workflows(), MemoryJournal(), package_version="0.1.0", max_finished=3)
        waiting = await rt.create_run("slow", "kept")
        ended = []
        for i in range(5):
            view = await rt.create_run("quick", f"run {i}")
            ended.append((await rt.wait_stable(view.run_id)).run_id)
        assert (await rt.wait_stable(waiting.run_id)).status == "waiting"
        listed = {v.run_id for v in rt.list()}
        assert listed == {waiting.run_id, *ended[-3:]}  # the three most recent ended ones
        with pytest.raises(IntloomError) as gone:
            rt.get(ended[0])
        assert gone.value.code == "NOT_FOUND" and "inspect" in gone.value.message
        assert rt.counts() == {"running": 0, "waiting": 1, "completed": 5, "failed": 0}
        await rt.suspend(grace=1.0)

    asyncio.run(asyncio.wait_for(go(), timeout=20))
