"""A long-lived host does not grow with every Run it ever ran: ended Runs past the cap are
dropped from memory (their journal keeps them for ``inspect``), unfinished ones never are.

Found by the soak (scripts/soak): about 10 KB of host memory per ended Run, for good.
"""

from __future__ import annotations

import asyncio

import msgspec
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


def test_a_list_page_resumes_after_its_last_run_whatever_was_dropped_meanwhile() -> None:
    """``runs`` is read in pages (ListRuns.after): Runs dropped past the cap between two pages
    neither shift the next page nor repeat a Run, and a Run created meanwhile comes last."""
    async def go() -> None:
        rt = Runtime(_workflows(), MemoryJournal(), package_version="0.1.0", max_finished=2)
        waiting = [await rt.create_run("slow", f"w{i}") for i in range(3)]
        quick = await rt.create_run("quick", "q0")
        await rt.wait_stable(quick.run_id)
        order = [w.run_id for w in waiting] + [quick.run_id]
        assert [v.run_id for v in rt.list()] == order
        one = len(msgspec.msgpack.encode(rt.get(order[0])))
        page, after = rt.list_page(None, 0, one + 1)  # room for one view only
        assert [v.run_id for v in page] == order[:1] and after > 0
        page, after = rt.list_page(None, after, one * 2 + 1)
        assert [v.run_id for v in page] == order[1:3]
        # Meanwhile two more Runs end: the cap (2) drops the first quick one.
        for i in (1, 2):
            view = await rt.create_run("quick", f"q{i}")
            order.append((await rt.wait_stable(view.run_id)).run_id)
        page, last = rt.list_page(None, after, 1 << 20)
        assert [v.run_id for v in page] == order[4:] and last == 0
        page, last = rt.list_page("slow", 0, 1 << 20)  # a filter pages the same way
        assert [v.run_id for v in page] == order[:3] and last == 0
        await rt.suspend(grace=1.0)

    asyncio.run(asyncio.wait_for(go(), timeout=20))
