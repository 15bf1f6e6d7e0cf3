"""A stop's suspension passes over every loaded Run: with tens of thousands of them it must
yield to the event loop as it goes, or the host's bound on it (a timeout) cannot fire and
nothing else (a Status request) is served meanwhile. 95,000 Runs took 14 s in one go."""

from __future__ import annotations

import asyncio

import pytest

import intloom
from intloom.authoring.loader import LoadedWorkflow
from intloom.executor import runtime as runtime_module
from intloom.executor.runtime import Runtime
from tests.unit.memjournal import MemoryJournal


def _asks() -> dict[str, LoadedWorkflow]:
    wf = intloom.Workflow("asks", version="1")
    stage = wf.stage("s")

    @stage.step("ask", routes={"yes": intloom.COMPLETE})
    async def ask(ctx: intloom.StepContext[None]) -> str:
        await ctx.confirm({})
        return "yes"

    wf.validate()
    return {wf.name: LoadedWorkflow(wf, "test.py", "id-" + wf.name, wf.schemas())}


def test_a_stop_yields_to_the_event_loop_between_batches_of_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime_module, "_SUSPEND_BATCH", 10)

    async def go() -> None:
        rt = Runtime(_asks(), MemoryJournal(), package_version="0.1.0")
        views = [await rt.create_run("asks", f"run {n}") for n in range(35)]
        for view in views:
            assert (await rt.wait_stable(view.run_id)).status == "waiting"
        seen: list[int] = []

        async def look() -> None:  # what another request would find, at the first yield
            seen.append(sum(1 for slot in rt.runs.values() if slot.suspended))

        looked = asyncio.ensure_future(look())
        cut = await rt.suspend(grace=1.0)
        await looked
        assert seen == [10], seen  # 10 Runs suspended, then the loop served the others
        assert cut == []
        assert all(slot.suspended for slot in rt.runs.values())
        outlook, others = await rt.outlook()
        assert [run_id for run_id, _ in outlook] == [v.run_id for v in views]
        assert {v.row for _, v in outlook} == {"interrupted"} and others == 0  # no recover

    asyncio.run(asyncio.wait_for(go(), timeout=20))
