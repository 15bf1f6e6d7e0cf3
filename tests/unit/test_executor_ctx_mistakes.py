"""Mistakes with ``ctx`` that used to pass without a word, over the real executor and store:
a confirm/ask/aeffect call never awaited (the question never asked, the effect never run, the
Run completed anyway), and a Stage initialiser's value in a Stage without State."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import intloom
from intloom.authoring.context import StepContext
from intloom.authoring.loader import LoadedWorkflow
from intloom.errors import IntloomError
from intloom.executor.runtime import RestoredRun, Runtime
from intloom.runtime.model import RunView
from intloom.runtime.records import EffectDone
from intloom.store import Store, read_history
from tests.unit.test_store_support import open_store

pytestmark = pytest.mark.timeout(60)


def _runtime(store: Store, wf: intloom.Workflow, restored: list[RestoredRun] | None = None
             ) -> Runtime:
    wf.validate()
    rt = Runtime({wf.name: LoadedWorkflow(wf, f"{wf.name}.py", f"id-{wf.name}", wf.schemas())},
                 store, package_version="0.1.0")
    rt.restore(restored or [])
    return rt


def _phases(root: Path, run_id: str) -> list[str]:
    return [type(entry.record).__name__ for entry in read_history(root, run_id)]


@pytest.fixture
def no_unawaited_warning() -> Iterator[None]:
    """Python's "coroutine ... was never awaited" goes to the host's stderr, which is
    /dev/null: the call must be closed by intloom, leaving no warning (and no coroutine)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
        gc.collect()
    assert [str(w.message) for w in seen if "never awaited" in str(w.message)] == []


def _settle(root: Path, wf: intloom.Workflow) -> RunView:
    async def main() -> RunView:
        store = open_store(root)
        rt = _runtime(store, wf)
        view = await rt.wait_stable((await rt.create_run(wf.name, "go")).run_id)
        await store.close()
        return view

    view: RunView = asyncio.run(asyncio.wait_for(main(), timeout=20))
    return view


# call -> (what the user code forgets to await, the facts its error names)
CALLS: dict[str, tuple[Callable[[Any, list[str]], Any], list[str]]] = {
    "confirm": (lambda ctx, ran: ctx.confirm({"a": 1}),
                ["called ctx.confirm({'a': 1}) without awaiting it",
                 "nobody was asked to confirm", "`answer = await ctx.confirm(...)`"]),
    "ask": (lambda ctx, ran: ctx.ask([intloom.Question(id="topic", question="Topic?")]),
            ["called ctx.ask([...]) (questions ['topic']) without awaiting it",
             "its questions were never asked", "`answers = await ctx.ask([...])`"]),
    "aeffect": (lambda ctx, ran: ctx.aeffect("charge", ran.append, "charged"),
                ["called ctx.aeffect('charge', ...) (key 'charge#1') without awaiting it",
                 "the effect never ran", "`result = await ctx.aeffect('charge', ...)`"]),
}
# where the call is made -> how that user code is named
WHERE = {
    "step": "Stage 's', Step 'a' ",
    "init": "Stage 's' initialiser ",
    "agent": "Stage 's', Step 'a' ",
}


def _forgetting(where: str, forget: Callable[[Any, list[str]], Any], ran: list[str]
                ) -> intloom.Workflow:
    wf = intloom.Workflow("forgets", version="1")
    st = wf.stage("s")
    if where == "init":
        @st.init
        async def init(ctx: Any) -> None:
            forget(ctx, ran)

    if where == "agent":
        @st.agent_step("a", routes={"ok": intloom.COMPLETE})
        async def agent(ctx: Any) -> Any:
            forget(ctx, ran)
            return {"task": 1}
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a(ctx: Any) -> str:
            if where == "step":
                forget(ctx, ran)
            return "ok"

    return wf


@pytest.mark.parametrize("where", sorted(WHERE))
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_call_never_awaited_fails_the_run_naming_the_call_and_the_fix(
        tmp_path: Path, no_unawaited_warning: None, call: str, where: str) -> None:
    forget, facts = CALLS[call]
    if where == "init" and call != "aeffect":
        # An initialiser cannot wait at all: the call is refused as it is made, awaited or not.
        kind = "confirmation" if call == "confirm" else "questions"
        facts = [f"cannot wait for a {kind} answer", "Ask in a Step of the Stage"]
    ran: list[str] = []
    root = tmp_path / "runtime"
    view = _settle(root, _forgetting(where, forget, ran))
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    message = view.last_error.message
    assert message.startswith(WHERE[where]), message
    for fact in facts:
        assert fact in message, (fact, message)
    assert ran == []  # the effect never ran
    phases = _phases(root, view.run_id)
    # Nothing of the call is journaled, and the user code's result is not either.
    for never in ("EffectStarted", "Waiting", "StepResult"):
        assert never not in phases, phases
    assert phases[-2:] == ["Executing", "Terminal"], phases


def test_each_call_left_is_named_and_what_the_step_raised_after_is_kept(
        tmp_path: Path, no_unawaited_warning: None) -> None:
    wf = intloom.Workflow("forgets", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        await ctx.aeffect("first", lambda: 1)  # awaited: not named
        ctx.confirm({"amount": 10})
        ctx.aeffect("refund", lambda: 2)
        raise ValueError("gave up")

    view = _settle(tmp_path / "runtime", wf)
    assert view.last_error is not None
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    message = view.last_error.message
    assert "'first'" not in message, message
    for fact in ("called ctx.confirm({'amount': 10}) without awaiting it",
                 "it called ctx.aeffect('refund', ...) (key 'refund#1') without awaiting it",
                 "Write `answer = await ctx.confirm(...)`. Write `result = await "
                 "ctx.aeffect('refund', ...)`.",
                 "It then raised ValueError: gave up."):
        assert fact in message, (fact, message)


@pytest.mark.parametrize("begun", [True, False])
def test_a_task_holding_a_call_left_running_past_its_step_is_cancelled_and_named(
        tmp_path: Path, no_unawaited_warning: None, begun: bool) -> None:
    """An effect in a task the Step never awaited would be journaled after the Step's
    result, as the next Step's: the Step fails instead and the task is cancelled, whether
    it had begun or not."""
    wf = intloom.Workflow("forgets", version="1")
    st = wf.stage("s")
    ran: list[str] = []

    @st.step("a", routes={"ok": "b"})
    async def a(ctx: Any) -> str:
        running = asyncio.Event()

        async def slow() -> None:
            ran.append("slow")
            running.set()
            await asyncio.Event().wait()  # never set: it ends only by cancellation

        task = asyncio.create_task(ctx.aeffect("slow", slow))
        if begun:
            await running.wait()
        assert not task.done()
        return "ok"

    @st.step("b", routes={"ok": intloom.COMPLETE})
    def b(ctx: Any) -> str:
        return "ok"

    root = tmp_path / "runtime"
    view = _settle(root, wf)
    assert view.last_error is not None
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    message = view.last_error.message
    fact = ("returned while the task it handed ctx.aeffect('slow', ...) (key 'slow#1') to "
            "was still running" if begun else
            "returned before the task it handed ctx.aeffect('slow', ...) (key 'slow#1') to "
            "had begun")
    assert fact in message, message
    assert "so that task was cancelled" in message, message
    assert "Await each task you start (asyncio.create_task, asyncio.gather)" in message
    assert ran == (["slow"] if begun else [])
    history = [entry.record for entry in read_history(root, view.run_id)]
    phases = [type(record).__name__ for record in history]
    # A begun effect is journaled over (cancelled) before the Run ends, not left in flight.
    assert phases[-3:] == (["EffectStarted", "EffectDone", "Terminal"] if begun else
                           ["StepReady", "Executing", "Terminal"]), phases
    if begun:
        assert isinstance(history[-2], EffectDone) and not history[-2].ok
        assert ("CancelledError: cancelled because its Step returned without awaiting the "
                "task that ran it") in (history[-2].error or ""), history[-2].error


def test_a_call_awaited_in_a_coroutine_of_the_steps_own_task_is_cancelled_too(
        tmp_path: Path, no_unawaited_warning: None) -> None:
    """The task runs a helper coroutine that awaits the call: the task's coroutine is the
    helper, not the call. That task was not found: the Step's error said it was cancelled,
    the effect ran on after the Run's end, and its effect_done could not be written."""
    wf = intloom.Workflow("helps", version="1")
    st = wf.stage("s")
    ran: list[str] = []

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        running = asyncio.Event()

        async def slow() -> str:
            running.set()
            await asyncio.sleep(30)  # ends only by cancellation, well within the timeout
            ran.append("charged")
            return "txn"

        async def helper() -> str:
            return str(await ctx.aeffect("charge", slow))

        task = asyncio.create_task(helper())
        await running.wait()
        assert not task.done()
        return "ok"

    root = tmp_path / "runtime"
    view = _settle(root, wf)
    assert view.last_error is not None
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    assert ("returned while the task it handed ctx.aeffect('charge', ...) (key 'charge#1') "
            "to was still running, so that task was cancelled") in view.last_error.message
    assert ran == []
    history = [entry.record for entry in read_history(root, view.run_id)]
    assert [type(r).__name__ for r in history][-3:] == ["EffectStarted", "EffectDone",
                                                         "Terminal"]
    done = history[-2]
    assert isinstance(done, EffectDone) and not done.ok
    assert "cancelled because its Step returned" in (done.error or ""), done.error


def test_a_raising_steps_sibling_effect_is_cancelled_and_journaled_before_the_end(
        tmp_path: Path, no_unawaited_warning: None) -> None:
    """asyncio.gather: one coroutine fails, the Step raises, the sibling effect still runs. It
    was left to end on its own, after the Run's terminal record, so its effect_done could
    not be written (an orphan IllegalTransition) and inspect showed it in flight. It is now
    cancelled and journaled before the end; the Step's own error is the one reported."""
    wf = intloom.Workflow("siblings", version="1")
    st = wf.stage("s")
    ran: list[str] = []

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        began = asyncio.Event()

        async def slow() -> str:
            began.set()  # its effect_started is durable: the effect itself runs now
            await asyncio.sleep(30)  # ends only by cancellation
            ran.append("slow")
            return "late"

        async def fails() -> str:
            await began.wait()
            raise ValueError("the lookup failed")

        await asyncio.gather(ctx.aeffect("slow", slow), fails())
        return "ok"

    root = tmp_path / "runtime"
    view = _settle(root, wf)
    assert view.last_error is not None
    assert view.last_error.code == "STEP_EXECUTION_FAILED", view.last_error
    assert "the lookup failed" in view.last_error.message
    assert ran == []
    history = [entry.record for entry in read_history(root, view.run_id)]
    assert type(history[-1]).__name__ == "Terminal"
    done = {r.name: r for r in history if isinstance(r, EffectDone)}
    assert set(done) == {"slow"}, history
    assert not done["slow"].ok and "cancelled because its Step raised" in (
        done["slow"].error or ""), done["slow"].error


def test_a_recover_leaving_a_call_unawaited_fails_the_run(
        tmp_path: Path, no_unawaited_warning: None) -> None:
    root = tmp_path / "runtime"
    ran: list[str] = []

    def workflow() -> intloom.Workflow:
        wf = intloom.Workflow("recovers", version="1")
        st = wf.stage("s")

        @st.step("ask", routes={"yes": intloom.COMPLETE})
        async def ask(ctx: Any) -> str:
            await ctx.confirm({"a": 1})
            return "yes"

        @ask.recover
        async def recover(ctx: Any, saved: intloom.Recovery) -> str:
            ctx.aeffect("notify", ran.append, "notified")
            return "yes"

        return wf

    async def first() -> RunView:
        store = open_store(root)
        rt = _runtime(store, workflow())
        view = await rt.wait_stable((await rt.create_run("recovers", "go")).run_id)
        await rt.suspend(1)
        await store.close()
        return view

    waiting = asyncio.run(asyncio.wait_for(first(), timeout=20))
    assert waiting.status == "waiting" and waiting.pending_action is not None
    action_id = waiting.pending_action.id

    async def second() -> RunView:
        store = open_store(root)
        restored = [RestoredRun(run_id=j.run_id, state=j.state, problem=j.problem,
                                status=j.status) for j in store.restored.runs]
        rt = _runtime(store, workflow(), restored)
        rt.start_restored()
        view = await rt.answer(waiting.run_id, action_id, {"isConfirmed": True})
        await store.close()
        return view

    view = asyncio.run(asyncio.wait_for(second(), timeout=20))
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    message = view.last_error.message
    assert message.startswith("Stage 's', Step 'ask' recover called ctx.aeffect('notify', "), \
        message
    assert "the effect never ran" in message and ran == []


def test_on_complete_leaving_an_effect_unawaited_is_refused_and_the_task_stays_claimed(
        tmp_path: Path, no_unawaited_warning: None) -> None:
    wf = intloom.Workflow("agent", version="1")
    st = wf.stage("s")
    ran: list[str] = []
    misbehave = [True]

    @st.agent_step("research", routes={"done": intloom.COMPLETE})
    def research(ctx: Any) -> Any:
        return {}

    @research.on_complete
    async def absorb(ctx: Any, result: intloom.AgentResult) -> None:
        if misbehave:
            ctx.aeffect("charge", ran.append, "charged")

    async def main() -> None:
        store = open_store(tmp_path / "runtime")
        rt = _runtime(store, wf)
        view = await rt.wait_stable((await rt.create_run("agent", "x")).run_id)
        assert view.pending_agent_call is not None
        call_id = view.pending_agent_call.id
        token, _ = await rt.claim_agent_call(view.run_id, call_id, "c1")
        with pytest.raises(IntloomError) as refused:
            await rt.complete_agent_call(view.run_id, call_id, token, "done", None)
        assert refused.value.code == "STEP_INTERACTION_INVALID"
        message = refused.value.message
        for fact in ("Stage 's', Step 'research' on_complete called ctx.aeffect('charge', "
                     "...) (key 'charge#1') without awaiting it",
                     "on_complete cannot run effects at all",
                     "the task stays claimed"):
            assert fact in message, (fact, message)
        now = rt.get(view.run_id)
        assert now.pending_agent_call is not None and now.pending_agent_call.phase == "claimed"
        misbehave.clear()
        done = await rt.complete_agent_call(view.run_id, call_id, token, "done", None)
        assert done.status == "completed"
        await store.close()

    asyncio.run(asyncio.wait_for(main(), timeout=20))
    assert ran == []


class Draft(msgspec.Struct):
    text: str = ""


@pytest.mark.parametrize("declared", [False, True])
def test_an_initialiser_value_the_stage_cannot_keep_fails_naming_the_stage_and_the_fix(
        tmp_path: Path, declared: bool) -> None:
    """In a Stage without State the value would be dropped and the Steps would see None (as
    ``ctx.state = ...`` there is refused); in one with State it must be that State."""
    wf = intloom.Workflow("inits", version="1")
    st: intloom.Stage[Any] = (wf.stage("draft", state=Draft) if declared
                              else wf.stage("draft"))
    seen: list[Any] = []

    @st.init
    def init(ctx: Any) -> Any:
        return {"text": "hello"}

    @st.step("write", routes={"ok": intloom.COMPLETE})
    def write(ctx: Any) -> str:
        seen.append(ctx.state)
        return "ok"

    root = tmp_path / "runtime"
    view = _settle(root, wf)
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STAGE_STATE_INVALID", view.last_error
    message = view.last_error.message
    facts = (["Stage 'draft' initialiser returned dict, not Draft",
              "`return Draft(...)`"] if declared else
             ["Stage 'draft' initialiser returned dict {'text': 'hello'}",
              "Stage 'draft' has no State",
              "`wf.stage('draft', state=YourStruct)`", "or return None"])
    for fact in facts:
        assert fact in message, (fact, message)
    assert seen == []
    assert _phases(root, view.run_id)[-2:] == ["Executing", "Terminal"]


def test_an_initialiser_returning_none_in_a_stage_without_state_is_fine(
        tmp_path: Path) -> None:
    wf = intloom.Workflow("inits", version="1")
    st = wf.stage("draft")

    @st.init
    def init(ctx: Any) -> None:
        return None

    @st.step("write", routes={"ok": intloom.COMPLETE})
    def write(ctx: Any) -> str:
        assert ctx.state is None
        return "ok"

    assert _settle(tmp_path / "runtime", wf).status == "completed"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_initialiser_that_assigns_ctx_state_and_returns_none_gives_that_state(
        tmp_path: Path, kind: str) -> None:
    """docs/authoring.md: the Stage has State once the initialiser "returns (or assigns)"
    it. One that assigned ctx.state, as a Step does, and returned None failed the Run with
    "Stage 'draft' initialiser returned NoneType, not Draft", the State it made dropped."""
    wf = intloom.Workflow("inits", version="1")
    st = wf.stage("draft", state=Draft)
    seen: list[Any] = []

    if kind == "async":
        async def init(ctx: Any) -> None:
            ctx.state = Draft(text="hello")
    else:
        def init(ctx: Any) -> None:  # type: ignore[misc]
            ctx.state = Draft(text="hello")
    st.init(init)

    @st.step("write", routes={"ok": intloom.COMPLETE})
    def write(ctx: Any) -> str:
        seen.append(ctx.state)
        return "ok"

    view = _settle(tmp_path / "runtime", wf)
    assert view.status == "completed", view
    assert seen == [Draft(text="hello")]


class Count(msgspec.Struct):
    n: int = 0


def test_an_initialiser_reading_ctx_state_is_told_it_has_none_yet(tmp_path: Path) -> None:
    """ctx.state in an initialiser was None under the Stage's State type: mypy passed
    ``ctx.state.n + 1`` and the Run failed with "'NoneType' object has no attribute 'n'".
    It is told what an initialiser has, and where the value can come from. A Stage without
    State still reads None there."""
    wf = intloom.Workflow("inits", version="1")
    first = wf.stage("first", state=Count)
    second = wf.stage("second", state=Count)

    @first.step("go", routes={"ok": intloom.ToStage("second")})
    def go(ctx: StepContext[Count]) -> str:
        ctx.state = Count(n=5)
        return "ok"

    @second.init
    def init(ctx: StepContext[Count]) -> Count:
        return Count(n=ctx.state.n + 1)

    @second.step("end", routes={"ok": intloom.COMPLETE})
    def end(ctx: StepContext[Count]) -> str:
        return "ok"

    view = _settle(tmp_path / "runtime", wf)
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    assert ("Stage 'second' initialiser read ctx.state before assigning it: an initialiser "
            "starts with no State, and returns the Stage's first (`return Count(...)`); an "
            "earlier Stage's State is released when the Run leaves that Stage. Build it from "
            "ctx.intent, or from what earlier Steps stored outside their State (a file, a "
            "database).") in view.last_error.message, view.last_error.message

    # Assigned by the initialiser, it reads as in a Step (the review: this was refused).
    assigned = intloom.Workflow("assigned", version="1")
    counted = assigned.stage("counted", state=Count)

    @counted.init
    def assign(ctx: StepContext[Count]) -> Count:
        ctx.state = Count(n=1)
        ctx.state.n += 1
        return ctx.state

    @counted.step("check", routes={"ok": intloom.COMPLETE})
    def check(ctx: StepContext[Count]) -> str:
        assert ctx.state.n == 2, ctx.state
        return "ok"

    assert _settle(tmp_path / "runtime3", assigned).status == "completed"

    seen: list[object] = []
    bare = intloom.Workflow("bare", version="1")
    only = bare.stage("only")

    @only.init
    def bare_init(ctx: StepContext[None]) -> None:
        seen.append(ctx.state)

    @only.step("x", routes={"ok": intloom.COMPLETE})
    def x(ctx: StepContext[None]) -> str:
        return "ok"

    assert _settle(tmp_path / "runtime2", bare).status == "completed"
    assert seen == [None]


def test_ctx_effect_refuses_an_async_function_before_anything_is_recorded(
    tmp_path: Path, no_unawaited_warning: None,
) -> None:
    """A sync Step's ctx.effect calls fn and keeps what it returns: an async fn returned a
    coroutine that never ran, and the journal said the effect was done."""
    ran: list[str] = []

    async def charge() -> str:
        ran.append("charged")
        return "paid"

    wf = intloom.Workflow("eff", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        ctx.effect("charge", charge)
        return "ok"

    root = tmp_path / "runtime"
    run_id, message = _refused_interaction(root, wf)
    assert "passed 'charge', an async function, to ctx.effect" in message, message
    assert "`await ctx.aeffect(...)`" in message
    assert ran == []
    assert "EffectStarted" not in _phases(root, run_id)


def _refused_interaction(root: Path, wf: intloom.Workflow) -> tuple[str, str]:
    """The id of ``wf``'s Run and the message of the STEP_INTERACTION_INVALID it failed."""
    view = _settle(root, wf)
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    return view.run_id, view.last_error.message


@pytest.mark.parametrize("call", ["effect", "aeffect"])
@pytest.mark.parametrize("kind", ["a generator", "an async generator"])
def test_an_effect_refuses_a_generator_function_before_anything_is_recorded(
    tmp_path: Path, call: str, kind: str,
) -> None:
    """An effect's function that yields was called, and the effect journaled done with
    "<generator object ...>" before its body ever ran (and it never ran after)."""
    ran: list[str] = []

    def charges() -> Any:
        ran.append("charged")
        yield "paid"

    async def acharges() -> Any:
        ran.append("charged")
        yield "paid"

    fn = charges if kind == "a generator" else acharges
    wf = intloom.Workflow("eff", version="1")
    st = wf.stage("s")

    if call == "effect":
        @st.step("a", routes={"ok": intloom.COMPLETE})
        def a(ctx: Any) -> str:
            ctx.effect("charge", fn)
            return "ok"
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a(ctx: Any) -> str:
            await ctx.aeffect("charge", fn)
            return "ok"

    root = tmp_path / "runtime"
    run_id, message = _refused_interaction(root, wf)
    assert (f"Stage 's', Step 'a' passed {fn.__name__!r}, {kind} function (it has `yield`), "
            f"to ctx.{call}, which calls it and records what it returns: {kind} object, whose "
            "body would never run. The effect was not called and nothing was recorded. Return "
            "a list instead of yielding, or consume the generator inside ") in message, message
    assert ran == []
    assert "EffectStarted" not in _phases(root, run_id)


def test_ctx_effect_records_an_awaitable_result_as_never_run(
    tmp_path: Path, no_unawaited_warning: None,
) -> None:
    """A sync callable that returns a coroutine (an async function behind a lambda) cannot
    be told apart before the call: its effect_done says it failed, never that it was done."""
    ran: list[str] = []

    async def charge(amount: int) -> str:
        ran.append(f"charged {amount}")
        return "paid"

    wf = intloom.Workflow("eff", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        ctx.effect("charge", lambda: charge(5))
        return "ok"

    root = tmp_path / "runtime"
    view = _settle(root, wf)
    assert view.status == "failed" and view.last_error is not None
    assert view.last_error.code == "STEP_INTERACTION_INVALID"
    assert "returned coroutine, an awaitable that a sync Step cannot await" in (
        view.last_error.message), view.last_error.message
    assert ran == []
    [done] = [e.record for e in read_history(root, view.run_id)
              if isinstance(e.record, EffectDone)]
    # Not "it never ran": the function was called (a sync one that acted, then returned a
    # future, did act), and the journal proves only that its awaitable was not awaited.
    assert not done.ok and done.error is not None, done
    assert "never ran" not in done.error and "its function was called" in done.error, done


def test_a_blocking_call_handed_to_a_thread_through_aeffect_is_journaled(
    tmp_path: Path,
) -> None:
    """What docs/authoring.md says to do with a blocking call in an async Step."""
    import threading

    where: list[str] = []

    def post(url: str) -> str:
        where.append(threading.current_thread().name)
        return f"posted {url}"

    wf = intloom.Workflow("eff", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        assert await ctx.aeffect("post", asyncio.to_thread, post, "u") == "posted u"
        return "ok"

    root = tmp_path / "runtime"
    view = _settle(root, wf)
    assert view.status == "completed", view.last_error
    assert where and where[0] != threading.main_thread().name
    [done] = [e.record for e in read_history(root, view.run_id)
              if isinstance(e.record, EffectDone)]
    assert done.ok and done.result == "posted u"


def test_an_effects_function_gets_its_own_name_and_fn_keyword_arguments(
    tmp_path: Path,
) -> None:
    """``ctx.effect("create", create_user, name="bob")`` failed with "got multiple values
    for argument 'name'": the effect's own name and fn took every ``name=`` and ``fn=``."""
    made: list[tuple[str, str]] = []

    def create_user(name: str, fn: str) -> str:
        made.append((name, fn))
        return f"made {name}"

    wf = intloom.Workflow("eff", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": "b"})
    def a(ctx: Any) -> str:
        assert ctx.effect("create", create_user, name="bob", fn="admin") == "made bob"
        return "ok"

    @st.step("b", routes={"ok": intloom.COMPLETE})
    async def b(ctx: Any) -> str:
        assert await ctx.aeffect("create", create_user, name="al", fn="x") == "made al"
        return "ok"

    root = tmp_path / "runtime"
    view = _settle(root, wf)
    assert view.status == "completed", view.last_error
    assert made == [("bob", "admin"), ("al", "x")]
    assert [(e.record.name, e.record.result) for e in read_history(root, view.run_id)
            if isinstance(e.record, EffectDone)] == [("create", "made bob"),
                                                     ("create", "made al")]


def test_a_restored_runs_history_is_read_on_the_hosts_own_threads(tmp_path: Path) -> None:
    """The earlier host's history was read with asyncio.to_thread, on the loop's default
    executor: Steps that fill it (asyncio.to_thread of their own) made a follower of a
    restored Run wait for them (attach then gave up and showed no history at all)."""
    import concurrent.futures
    import threading

    from intloom.executor.runtime import RestoredRun

    wf = intloom.Workflow("conf", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        await ctx.confirm({"ok": "?"})
        return "ok"

    @a.recover
    def a_recover(ctx: Any, saved: Any) -> str:
        return "ok"

    root = tmp_path / "runtime"

    async def first() -> str:
        store = open_store(root)
        rt = _runtime(store, wf)
        view = await rt.wait_stable((await rt.create_run("conf", "go")).run_id)
        assert view.status == "waiting"
        await store.close()
        return view.run_id

    run_id = asyncio.run(asyncio.wait_for(first(), timeout=20))
    release = threading.Event()

    async def second() -> list[str]:
        store = open_store(root, instance_id="INST-2")
        restored = [RestoredRun(run_id=j.run_id, state=j.state, problem=j.problem,
                                status=j.status) for j in store.restored.runs]
        rt = _runtime(store, wf, restored)
        loop = asyncio.get_running_loop()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        loop.set_default_executor(pool)
        busy = [asyncio.ensure_future(asyncio.to_thread(release.wait, 30)) for _ in range(4)]
        try:
            stream = rt.subscribe(run_id)
            batch = await asyncio.wait_for(stream.__anext__(), timeout=10)
            await stream.aclose()  # type: ignore[attr-defined]
        finally:
            release.set()
            await asyncio.gather(*busy)
            await store.close()
        return [u.event for u in batch]

    events = asyncio.run(asyncio.wait_for(second(), timeout=30))
    assert events[-2:] == ["waiting", "restored"], events


# call -> (the call made through a ctx kept from an earlier Step, what its error says was
# skipped); sync Steps have only ctx.effect, the others are awaited in an async Step.
STALE: dict[str, tuple[Callable[[Any, list[str]], Any], str]] = {
    "effect": (lambda ctx, ran: ctx.effect("charge", ran.append, "x"),
               "ctx.effect('charge', ...) was called"),
    "aeffect": (lambda ctx, ran: ctx.aeffect("charge", ran.append, "x"),
                "ctx.aeffect('charge', ...) was called"),
    "confirm": (lambda ctx, ran: ctx.confirm({"amount": 10}), "ctx.confirm(...) was called"),
    "ask": (lambda ctx, ran: ctx.ask([intloom.Question(id="topic", question="Topic?")]),
            "ctx.ask([...]) was called"),
}


def _a_keeps_b_uses(st: intloom.Stage[Any], use: Callable[[Any], Any],
                    awaited: bool = False) -> None:
    """Step a keeps its ctx (in a list, as a global would); Step b calls ``use`` with it,
    awaiting what it returns when ``awaited`` (both Steps are async then)."""
    kept: list[Any] = []
    if awaited:
        @st.step("a", routes={"ok": "b"})
        async def a_async(ctx: Any) -> str:
            kept.append(ctx)
            return "ok"

        @st.step("b", routes={"ok": intloom.COMPLETE})
        async def b_async(ctx: Any) -> str:
            await use(kept[0])
            return "ok"
    else:
        @st.step("a", routes={"ok": "b"})
        def a(ctx: Any) -> str:
            kept.append(ctx)
            return "ok"

        @st.step("b", routes={"ok": intloom.COMPLETE})
        def b(ctx: Any) -> str:
            use(kept[0])
            return "ok"


@pytest.mark.parametrize("call", sorted(STALE))
def test_a_ctx_kept_from_an_earlier_step_is_refused_and_nothing_is_journaled(
        tmp_path: Path, no_unawaited_warning: None, call: str) -> None:
    """Step a keeps its ctx; Step b acts through it. The effect (or wait) was journaled after
    b's ``executing``, as b's: the journal said b ran an effect it never called, and the
    restart table reasoned from that (a wait even saved a's State as b's)."""
    make, named = STALE[call]
    wf = intloom.Workflow("keeps", version="1")
    ran: list[str] = []
    _a_keeps_b_uses(wf.stage("s"), lambda kept: make(kept, ran), awaited=call != "effect")

    root = tmp_path / "runtime"
    view = _settle(root, wf)
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    message = view.last_error.message
    for fact in (f"{named} through the ctx given to Stage 's', Step 'a', which was over",
                 "while Stage 's', Step 'b' was running",
                 "Nothing was recorded",
                 "Use the ctx the running Step was given"):
        assert fact in message, (fact, message)
    assert ran == []
    phases = _phases(root, view.run_id)
    for never in ("EffectStarted", "Waiting"):
        assert never not in phases, phases
    assert phases[-3:] == ["StepReady", "Executing", "Terminal"], phases


def test_a_ctx_used_after_its_run_ended_is_refused_naming_no_running_step(
        tmp_path: Path) -> None:
    wf = intloom.Workflow("keeps", version="1")
    st = wf.stage("s")
    kept: list[Any] = []
    ran: list[str] = []

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        kept.append(ctx)
        return "ok"

    root = tmp_path / "runtime"
    view = _settle(root, wf)
    assert view.status == "completed", view
    with pytest.raises(IntloomError) as raised:
        kept[0].effect("late", ran.append, "x")
    assert raised.value.code == "STEP_INTERACTION_INVALID"
    assert ("ctx.effect('late', ...) was called through the ctx given to Stage 's', Step "
            "'a', which was over (it had returned or raised, or the Run had stopped waiting "
            "for it: a cancel, or a stop's grace that ran out), while no code of the Run was "
            "running") in raised.value.message, raised.value.message
    assert ran == []
    assert _phases(root, view.run_id)[-1] == "Terminal"


class _Count(msgspec.Struct):
    n: int = 0


@pytest.mark.parametrize("stateful", [True, False], ids=["with State", "without State"])
def test_ctx_state_assigned_through_a_ctx_kept_from_an_earlier_step_is_refused(
        tmp_path: Path, stateful: bool) -> None:
    """Step a keeps its ctx; Step b assigns ``state`` through it. The value went into a's
    context, whose State had been saved already: lost without a word, while b saved its own.
    In a Stage without State, None (what its running Steps may assign) still passes; a value
    is refused saying the Stage has no State, not that a State was saved."""
    wf = intloom.Workflow("keeps", version="1")
    st: intloom.Stage[Any] = wf.stage("s", state=_Count) if stateful else wf.stage("s")

    def assign(kept: Any) -> None:
        if stateful:
            kept.state = _Count(n=2)
        else:
            kept.state = None
            kept.state = {"n": 2}

    _a_keeps_b_uses(st, assign)

    view = _settle(tmp_path / "runtime", wf)
    assert view.status == "failed" and view.last_error is not None, view
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    message = view.last_error.message
    said = (["while Stage 's', Step 'b' was running", "Nothing was changed",
             "Assign the running Step's own ctx.state"] if stateful else
            ["Stage 's' has no State, so nothing keeps a value assigned to ctx.state",
             "Declare a State (`wf.stage('s', state=YourStruct)`)"])
    for fact in ["ctx.state was assigned through the ctx given to Stage 's', Step 'a', "
                 "which was over", *said]:
        assert fact in message, (fact, message)
    assert ("its State was saved" in message) is stateful, message


def test_an_effect_started_from_another_thread_as_the_first_one_starts_finds_its_keys() -> None:
    """A Step's context makes its effect-key dicts at its first effect. An effect started
    from another of the Step's threads at that moment (alongside: refused by the journal,
    with a message) read the counts just made and not the keys yet: AttributeError instead.
    That other thread is stood in for by an effect started as the counts are set."""
    others: list[Any] = []

    class Hooks:
        loop_thread = threading.Thread()  # never the thread the Step runs on

        def effect_sync(self, name: str, key: str, call: Callable[[], Any]) -> Any:
            return call()

        def running(self) -> str | None:
            return None

    class Racing(intloom.StepContext[None]):
        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value)
            if name == "_effect_counts" and not others:
                others.append(self.effect("other", lambda: "other ran"))

    ctx = Racing(run_id="r", intent="go", stage="s", step="a", state=None, state_type=None,
                 hooks=Hooks())  # type: ignore[arg-type]
    assert ctx.effect("first", lambda: "first ran") == "first ran"
    assert others == ["other ran"]
    with pytest.raises(IntloomError) as refused:  # the other effect's key was kept
        ctx.effect("again", lambda: None, key="other#1")
    assert refused.value.code == "STEP_INTERACTION_INVALID"


@pytest.mark.parametrize("where", ["init", "step"])
def test_ctx_effect_in_async_code_names_that_code_and_says_the_effect_did_not_run(
    tmp_path: Path, where: str,
) -> None:
    """ctx.effect in an async initialiser was refused as made in "Step s/None", and in any
    async code without saying that the effect had not run and nothing was recorded."""
    ran: list[str] = []
    wf = intloom.Workflow("w", version="1")
    st = wf.stage("s")
    if where == "init":
        @st.init
        async def init(ctx: Any) -> None:
            ctx.effect("charge", ran.append, "charged")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        ctx.effect("charge", ran.append, "charged")
        return "ok"

    view = _settle(tmp_path / "runtime", wf)
    assert ran == [] and view.last_error is not None
    assert view.last_error.code == "STEP_INTERACTION_INVALID"
    named = "Stage 's' initialiser" if where == "init" else "Stage 's', Step 'a'"
    message = view.last_error.message
    for fact in (f"{named} is async and called ctx.effect('charge', ...)",
                 "The effect was not called and nothing was recorded",
                 "`result = await ctx.aeffect(...)`"):
        assert fact in message, message
    assert "EffectStarted" not in _phases(tmp_path / "runtime", view.run_id)


@pytest.mark.parametrize("step_kind", ["sync", "async"])
def test_an_effect_raising_a_base_exception_is_journaled_done_and_may_be_retried(
    tmp_path: Path, step_kind: str,
) -> None:
    """An effect whose function raised SystemExit or KeyboardInterrupt (not an Exception) got
    no effect_done: the journal held it in flight, and its retry under its key -- which the
    docs allow a call that raised -- was refused as started "while effect 'charge' (key
    'charge#1') was still running"."""
    calls: list[int] = []

    def charge() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise SystemExit(3) if step_kind == "sync" else KeyboardInterrupt
        return "paid"

    wf = intloom.Workflow("w", version="1")
    st = wf.stage("s")
    if step_kind == "sync":
        @st.step("a", routes={"ok": intloom.COMPLETE})
        def a(ctx: Any) -> str:
            try:
                ctx.effect("charge", charge, key="order-1")
            except (SystemExit, KeyboardInterrupt):
                assert ctx.effect("charge", charge, key="order-1") == "paid"
            return "ok"
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def b(ctx: Any) -> str:
            try:
                await ctx.aeffect("charge", charge, key="order-1")
            except (SystemExit, KeyboardInterrupt):
                assert await ctx.aeffect("charge", charge, key="order-1") == "paid"
            return "ok"

    root = tmp_path / "runtime"
    view = _settle(root, wf)
    assert view.status == "completed", view.last_error
    done = [e.record for e in read_history(root, view.run_id) if type(e.record) is EffectDone]
    expected = "SystemExit: 3" if step_kind == "sync" else "KeyboardInterrupt"
    assert [(d.key, d.ok, d.error) for d in done] == [
        ("order-1", False, expected), ("order-1", True, None)], done


@pytest.mark.parametrize(("field", "what"), [
    ("step", "the Step running"), ("stage", "the Stage running"),
    ("run_id", "the Run"), ("intent", "the Run's intent"),
])
def test_a_step_assigning_its_contexts_names_is_refused_and_its_errors_still_name_it(
        tmp_path: Path, field: str, what: str) -> None:
    """ctx.step = "other" was taken: the Step's later errors named Step 'other'."""
    refused: list[IntloomError] = []
    wf = intloom.Workflow("fixed", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: intloom.StepContext[None]) -> str:
        try:
            setattr(ctx, field, "other")
        except IntloomError as exc:
            refused.append(exc)
        assert getattr(ctx, field) != "other"
        ctx.state = 5  # type: ignore[assignment]  # an error that names the Step
        return "ok"

    view = _settle(tmp_path, wf)
    assert len(refused) == 1 and refused[0].code == "STEP_INTERACTION_INVALID"
    assert refused[0].message.startswith(
        f"Stage 's', Step 'a' assigned ctx.{field}, which is read-only: it is {what}"), \
        refused[0].message
    assert view.status == "failed" and view.last_error is not None
    assert view.last_error.code == "STAGE_STATE_INVALID"
    assert view.last_error.message.startswith("Stage 's', Step 'a' assigned ctx.state an int, "
                                              "but Stage 's' has no State"), \
        view.last_error.message


def test_a_wait_the_step_cancels_while_it_is_being_saved_names_the_wait_and_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``asyncio.wait_for(ctx.confirm(...), t)`` whose ``t`` ran out while the host was still
    making the confirmation's waiting record durable (a slow disk) failed the Run with
    CLI_INTERNAL_ERROR "The host failed while driving the Run (IllegalTransition)": the Step
    went on to an outcome after a wait the journal holds open. It is named as when the
    timeout comes after the wait was shown."""
    from intloom.runtime.records import Waiting

    wf = intloom.Workflow("timed", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"done": intloom.COMPLETE})
    async def a(ctx: intloom.StepContext[None]) -> str:
        with contextlib.suppress(TimeoutError):  # "nobody answered in time"
            await asyncio.wait_for(ctx.confirm({"n": 1}), 0.05)
        return "done"

    root = tmp_path / "runtime"

    async def main() -> RunView:
        store = open_store(root)
        real_append, real_sync = Store.append, Store.sync
        waits: list[str] = []

        def append(self: Store, run_id: str, record: Any, state: Any = None) -> None:
            if isinstance(record, Waiting):
                waits.append(run_id)
            real_append(self, run_id, record, state)

        async def sync(self: Store, run_id: str | None = None) -> None:
            if waits:
                waits.clear()
                # The flush of the waiting record outlasts the Step's patience: only the
                # Step's own timeout ends this wait (a later flush makes the record durable).
                await asyncio.Event().wait()
            await real_sync(self, run_id)

        # On the class: a Store has slots, no instance dict to shadow a method in.
        monkeypatch.setattr(Store, "append", append)
        monkeypatch.setattr(Store, "sync", sync)
        rt = _runtime(store, wf)
        view = await rt.wait_stable((await rt.create_run(wf.name, "go")).run_id)
        await store.close()
        return view

    view = asyncio.run(asyncio.wait_for(main(), 20))
    assert view.status == "failed", view
    assert view.last_error is not None
    assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
    message = view.last_error.message
    assert message.startswith(
        "Stage 's', Step 'a' stopped waiting for its confirmation ASK-"), message
    assert "Await ctx.confirm(...) until it is answered" in message, message
    assert _phases(root, view.run_id)[-2:] == ["Waiting", "Terminal"]


def _looping(calls: int, forget_at: int | None, sizes: list[int]) -> intloom.Workflow:
    wf = intloom.Workflow("loops", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        for n in range(calls):
            if n == forget_at:
                ctx.aeffect("forgotten", str, n)
            await ctx.aeffect("each", str, n, key=f"k{n}")
            sizes.append(len(ctx._calls))
        return "ok"

    return wf


def test_a_step_awaiting_effects_in_a_long_loop_keeps_only_the_unfinished_calls(
        tmp_path: Path) -> None:
    """Every ctx.aeffect call was kept until the Step ended (to name one never awaited), so a
    Step looping over a million effects held a million of them. Only unfinished calls stay."""
    sizes: list[int] = []
    view = _settle(tmp_path, _looping(1000, None, sizes))
    assert view.status == "completed", view
    assert len(sizes) == 1000
    assert max(sizes) <= StepContext._prune_at, max(sizes)


@pytest.mark.parametrize("forget_at", [0, 700])
def test_a_call_never_awaited_among_many_awaited_ones_is_still_named(
        tmp_path: Path, no_unawaited_warning: None, forget_at: int) -> None:
    """Dropping finished calls keeps the one never awaited, before or after a drop."""
    view = _settle(tmp_path, _looping(800, forget_at, []))
    assert view.status == "failed", view
    assert view.last_error is not None
    assert "ctx.aeffect('forgotten', ...)" in view.last_error.message, view.last_error


def test_none_assigned_to_a_state_is_said_as_none(tmp_path: Path) -> None:
    """``ctx.state = None`` in a Stage with State said "assigned ctx.state a NoneType"."""
    wf = intloom.Workflow("nothing", version="1")
    st = wf.stage("draft", state=Draft)

    @st.step("write", routes={"ok": intloom.COMPLETE})
    def write(ctx: intloom.StepContext[Draft]) -> str:
        ctx.state = None  # type: ignore[assignment]
        return "ok"

    view = _settle(tmp_path / "runtime", wf)
    assert view.last_error is not None and view.last_error.code == "STAGE_STATE_INVALID"
    assert view.last_error.message.startswith(
        "Stage 'draft', Step 'write' assigned ctx.state None; Stage 'draft' State is a "
        "Draft."), view.last_error.message


def test_an_effects_callable_is_not_shown_unless_refused(tmp_path: Path) -> None:
    """The generator check named every effect's function before judging it: a callable
    object without a name was shown by its repr, user code that may be slow (a partial
    holding megabytes) or raise, and one whose __repr__ raised failed the effect."""

    class Charge:
        def __call__(self) -> str:
            return "paid"

        def __repr__(self) -> str:
            raise RuntimeError("repr is not for this object")

    wf = intloom.Workflow("eff", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        assert ctx.effect("charge", Charge()) == "paid"
        return "ok"

    assert _settle(tmp_path / "runtime", wf).status == "completed"
