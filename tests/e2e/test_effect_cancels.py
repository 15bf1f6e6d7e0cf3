"""An async Step's own cancel of its effect (``asyncio.wait_for``, a task it cancels) while
the effect's ``effect_started`` is still being made durable: the effect's function is never
called, and the journal must say so rather than hold it in flight. Real host, real CLI
subprocesses; every host is reaped."""

from __future__ import annotations

import base64
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Project, ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SOURCE = textwrap.dedent('''
    from __future__ import annotations

    import asyncio

    import msgspec

    import intloom


    class Calls(msgspec.Struct):
        charged: int = 0


    wf = intloom.Workflow("cancels", version="1")
    main = wf.stage("main", state=Calls)


    @main.step("pick", routes={"go": "go", "gather": "gather", "together": "together"})
    def pick(ctx: intloom.StepContext[Calls]) -> str:
        return ctx.intent


    @main.step("go", routes={"done": intloom.COMPLETE})
    async def go(ctx: intloom.StepContext[Calls]) -> str:
        calls = []

        async def charge() -> str:
            calls.append(1)
            return "ch_1"

        # The task starts the effect (effect_started appended, its flush awaited), and the
        # Step cancels it there, before the function is called: a timeout would, too.
        task = asyncio.ensure_future(ctx.aeffect("charge", charge, key="k"))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctx.aeffect("charge", charge, key="k")  # the retry under its key
        await ctx.aeffect("after", asyncio.sleep, 0)
        ctx.state = Calls(charged=len(calls))
        return "done"


    @main.step("gather", routes={"done": intloom.COMPLETE})
    async def gather(ctx: intloom.StepContext[Calls]) -> str:
        called = asyncio.Event()

        async def charge() -> None:
            called.set()
            await asyncio.sleep(30)

        async def declined() -> None:
            await asyncio.wait_for(called.wait(), 30)  # the effect beside it was called
            raise ValueError("card declined")

        await asyncio.gather(ctx.aeffect("charge", charge, key="k"), declined())
        return "done"


    @main.step("together", routes={"done": intloom.COMPLETE})
    async def together(ctx: intloom.StepContext[Calls]) -> str:
        for _ in range(20):  # an idle host's flushes go inline after a few
            await ctx.aeffect("warm", lambda: None)
        await asyncio.gather(ctx.aeffect("a", lambda: 1), ctx.aeffect("b", lambda: 2))
        return "done"

''')


@pytest.fixture
def cancels(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(one_source_project(tmp_path, "cancels", SOURCE))


def _effects(project: Project, run_id: str) -> list[tuple[str, Any, Any, Any]]:
    records = ok(project.cli("inspect", run_id, "--json"))["records"]
    return [(r["phase"], r["record"]["key"],
             r["record"].get("ok", True) if r["phase"] == "effect_done" else None,
             r["record"].get("error")) for r in records if r["phase"].startswith("effect")]


def _state(project: Project, run_id: str) -> Any:
    records = ok(project.cli("inspect", run_id, "--json"))["records"]
    result = [r for r in records if r["phase"] == "step_result"][-1]
    return json.loads(base64.b64decode(result["record"]["state"]))


def test_an_effect_cancelled_before_its_call_is_journaled_done_and_the_step_goes_on(
        cancels: Project) -> None:
    """It was left started with no end: the Step's retry under its key, and every later
    effect, was refused "while effect 'charge' (key 'k') was still running", failing the
    Run, and inspect showed in flight an effect that never ran."""
    ok(cancels.cli("start", "--json"))
    run = ok(cancels.cli("flow", "cancels", "--intent", "go", "--json"))["run"]
    assert run["status"] == "completed", run.get("lastError")
    effects = _effects(cancels, run["runId"])
    assert effects[0] == ("effect_started", "k", None, None), effects
    phase, key, done, error = effects[1]
    assert (phase, key, done) == ("effect_done", "k", False), effects
    assert error == ("CancelledError: cancelled before its function was called (a timeout "
                     "or a cancel in the Step); it did not run"), error
    assert [e[:3] for e in effects[2:]] == [
        ("effect_started", "k", None), ("effect_done", "k", True),
        ("effect_started", "after#1", None), ("effect_done", "after#1", True)], effects
    assert _state(cancels, run["runId"]) == {"charged": 1}  # the retry's call, only
    assert "In flight" not in cancels.cli("inspect", run["runId"]).stdout
    ok(cancels.cli("stop", "--json"))


def test_an_effect_cancelled_because_its_step_raised_says_the_step_raised(
        cancels: Project) -> None:
    """A gather's effect, cancelled when the coroutine beside it failed the Step, was
    journaled "cancelled because its Step returned without awaiting the task that ran it":
    the Step had raised, and its error is the Run's."""
    ok(cancels.cli("start", "--json"))
    run = cancels.cli("flow", "cancels", "--intent", "gather", "--json").json["run"]
    assert run["lastError"]["code"] == "STEP_EXECUTION_FAILED", run
    assert "card declined" in run["lastError"]["message"], run
    effects = _effects(cancels, run["runId"])
    assert effects == [
        ("effect_started", "k", None, None),
        ("effect_done", "k", False, "CancelledError: cancelled because its Step raised "
                                    "before the task that ran it had ended; its outcome is "
                                    "unknown")], effects
    ok(cancels.cli("stop", "--json"))


def test_effects_started_together_are_refused_on_an_idle_host_too(cancels: Project) -> None:
    """Two ctx.aeffect in one asyncio.gather were refused only when a flush handed off to the
    store (a busy host): on an idle host, whose flushes go inline, both ran one after the
    other and the Step passed, so the same code failed only under load."""
    ok(cancels.cli("start", "--json"))
    run = cancels.cli("flow", "cancels", "--intent", "together", "--json").json["run"]
    error = run.get("lastError")
    assert error is not None and error["code"] == "STEP_INTERACTION_INVALID", run
    assert error["message"] == (
        "Stage 'main', Step 'together' started effect 'b' (key 'b#1') while effect 'a' (key "
        "'a#1') was still running: effects cannot be nested or run at the same time, each is "
        "journaled on its own. Call them one after another in the Step, not from inside "
        "another effect's function."), error
    assert [e[:2] for e in _effects(cancels, run["runId"])][-3:] == [
        ("effect_done", "warm#20"), ("effect_started", "a#1"), ("effect_done", "a#1")]
    ok(cancels.cli("stop", "--json"))
