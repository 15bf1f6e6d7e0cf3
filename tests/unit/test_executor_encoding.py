"""Values the journal cannot encode (msgpack holds integers within 64 bits), over the real store:
an effect's result is kept as its repr; a client's value is refused and the Run loses nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import intloom
from intloom.authoring.loader import LoadedWorkflow
from intloom.errors import IntloomError
from intloom.executor.runtime import Runtime
from intloom.runtime.records import EffectDone
from intloom.store import Store, read_history, verify
from tests.unit.test_store_support import open_store

HUGE = 2**70


def _runtime(store: Store, wf: intloom.Workflow) -> Runtime:
    rt = Runtime({wf.name: LoadedWorkflow(wf, f"{wf.name}.py", f"id-{wf.name}", wf.schemas())},
                 store, package_version="0.1.0")
    rt.restore([])
    return rt


def _workflow() -> intloom.Workflow:
    wf = intloom.Workflow("huge", version="1")
    st = wf.stage("s")

    @st.step("effect", routes={"ok": "research"})
    async def effect(ctx: Any) -> str:
        assert await ctx.aeffect("big", lambda: HUGE) == HUGE  # the Step sees the real value
        return "ok"

    @st.agent_step("research", routes={"done": intloom.COMPLETE})
    def research(ctx: Any) -> Any:
        return {"task": ctx.intent}

    wf.validate()
    return wf


def test_unencodable_values_are_kept_as_repr_or_refused_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runtime"
    wf = _workflow()

    async def main() -> str:
        store = open_store(root)
        rt = _runtime(store, wf)
        view = await rt.wait_stable((await rt.create_run("huge", "find x")).run_id)
        call = view.pending_agent_call
        assert view.status == "waiting" and call is not None
        token, _ = await rt.claim_agent_call(view.run_id, call.id, "c1")
        with pytest.raises(IntloomError) as refused:
            await rt.complete_agent_call(view.run_id, call.id, token, "done", {"n": HUGE})
        assert refused.value.code == "INVALID_REQUEST"
        assert "output" in refused.value.message and "64 bits" in refused.value.message
        still = rt.get(view.run_id)
        assert still.status == "waiting" and still.pending_agent_call is not None
        done = await rt.complete_agent_call(view.run_id, call.id, token, "done", {"n": 1})
        assert done.status == "completed"
        await store.close()
        return view.run_id

    run_id = asyncio.run(asyncio.wait_for(main(), timeout=20))
    [journal] = [j for j in verify(root) if j.run_id == run_id]
    assert journal.status == "ok" and journal.state is not None
    assert journal.state.status == "completed" and journal.state.output == {"n": 1}
    results = [e.record.result for e in read_history(root, run_id)
               if isinstance(e.record, EffectDone)]
    assert results == [{"repr": str(HUGE)}]


def test_a_step_asking_with_a_value_the_journal_cannot_hold_fails_cleanly(tmp_path: Path) -> None:
    """The `waiting` record is refused before it changes the Run: the Run fails with the
    reason, and its journal reads back whole (no record the state counted but the log lacks)."""
    root = tmp_path / "runtime"
    wf = intloom.Workflow("ask", version="1")
    st = wf.stage("s")

    @st.step("ask", routes={"yes": intloom.COMPLETE, "no": intloom.COMPLETE})
    async def ask(ctx: Any) -> str:
        answer = await ctx.confirm({"n": HUGE})
        return "yes" if answer.confirmed else "no"

    wf.validate()

    async def main() -> str:
        store = open_store(root)
        rt = _runtime(store, wf)
        view = await rt.wait_stable((await rt.create_run("ask", "go")).run_id)
        assert view.status == "failed" and view.last_error is not None
        assert view.last_error.code == "RUN_STATE_INVALID"
        assert "Waiting record" in view.last_error.message
        await store.close()
        return view.run_id

    run_id = asyncio.run(asyncio.wait_for(main(), timeout=20))
    [journal] = [j for j in verify(root) if j.run_id == run_id]
    assert journal.status == "ok" and journal.state is not None
    assert journal.state.status == "failed" and journal.state.phase == "terminal"
