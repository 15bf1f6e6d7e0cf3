"""The executor against an in-memory journal: routing, waits, answers, cancel, agents, failures."""

from __future__ import annotations

import asyncio
import decimal
import enum
import gc
import threading
import time
import warnings
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, NamedTuple, TypedDict

import msgspec
import pytest

import intloom
from intloom.authoring.interaction import validate_answer
from intloom.authoring.loader import LoadedWorkflow
from intloom.errors import IntloomError
from intloom.executor.driver import Driver, RunSlot
from intloom.executor.runtime import RestoredRun, Runtime
from intloom.executor.updates import RunUpdate
from intloom.runtime.machine import fold
from intloom.runtime.model import RunView
from intloom.runtime.ports import CheckpointFailed
from intloom.runtime.records import (
    EffectDone,
    EffectStarted,
    Executing,
    StepReady,
    StepResult,
    Terminal,
    Waiting,
)
from tests.helpers import eventually
from tests.unit.memjournal import MemoryJournal


class Big(msgspec.Struct):
    data: str = ""


class Count(msgspec.Struct):
    n: int = 0


class SyncPath:
    """How many times a crew took a Run (``Driver._steps_here``)."""

    def __init__(self) -> None:
        self.handed = 0

    def check(self) -> None:
        """For a test whose Run reaches a sync Step: a crew drove it."""
        assert self.handed > 0, "no Run was driven by a crew"


@pytest.fixture(autouse=True)
def sync_path(monkeypatch: pytest.MonkeyPatch) -> SyncPath:
    """Counts the Runs handed to crews, for tests to check that their sync Steps were."""
    path = SyncPath()
    real = Driver._steps_here

    def counted(self: Driver, slot: Any) -> Any:
        path.handed += 1
        return real(self, slot)

    monkeypatch.setattr(Driver, "_steps_here", counted)
    return path


def loaded(wf: intloom.Workflow) -> dict[str, LoadedWorkflow]:
    wf.validate()
    return {wf.name: LoadedWorkflow(wf, "test.py", "id-" + wf.name, wf.schemas())}


def run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(), timeout=20))


def settled(wf: intloom.Workflow, journal: MemoryJournal, intent: str = "go") -> RunView:
    """One Run of ``wf`` on a fresh Runtime over ``journal``, once it waits or has ended."""

    async def main() -> RunView:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        return await rt.wait_stable((await rt.create_run(wf.name, intent)).run_id)

    view: RunView = run(main)
    return view


def make_confirm_wf(calls: list[str]) -> intloom.Workflow:
    wf = intloom.Workflow("confirm", version="1")
    st = wf.stage("main", state=Count)

    @st.step("prep", routes={"ok": "ask"})
    def prep(ctx: intloom.StepContext[Count]) -> str:
        calls.append("prep")
        ctx.effect("charge", lambda: calls.append("charge-effect"))
        ctx.state = Count(n=ctx.state.n + 1)
        return "ok"

    @st.step("ask", routes={"yes": intloom.COMPLETE, "no": "prep"})
    async def ask(ctx: intloom.StepContext[Count]) -> str:
        calls.append("ask")
        answer = await ctx.confirm({"n": ctx.state.n})
        return "yes" if answer.confirmed else "no"

    @ask.recover
    def ask_recover(ctx: intloom.StepContext[Count], saved: intloom.Recovery) -> str:
        calls.append("recover")
        return "yes" if saved.answer.confirmed else "no"

    return wf


def test_definition_mistakes_name_workflow_stage_step_and_fix() -> None:
    wf = intloom.Workflow("bad", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": "missing"})
    def a(ctx: Any) -> str:
        return "ok"

    with pytest.raises(IntloomError) as info:
        wf.validate()
    assert info.value.code == "WORKFLOW_DEFINITION_INVALID"
    assert "'bad'" in info.value.message and "'s'" in info.value.message
    assert "'a'" in info.value.message and "missing" in info.value.message

    with pytest.raises(IntloomError, match="defined twice"):
        st.step("a", routes={"ok": intloom.COMPLETE})(a)
    with pytest.raises(IntloomError, match=r"not a msgspec\.Struct"):
        wf.stage("t", state=dict)  # type: ignore[type-var]  # mypy refuses it too
    with pytest.raises(IntloomError, match="non-empty mapping"):
        st.step("b", routes={})


async def _confirm_run(calls: list[str], journal: MemoryJournal) -> tuple[Runtime, RunView]:
    """A Runtime over ``journal`` with the confirm Workflow, and its first Run once stable."""
    rt = Runtime(loaded(make_confirm_wf(calls)), journal, package_version="0.1.0")
    rt.restore([])
    return rt, await rt.wait_stable((await rt.create_run("confirm", "go")).run_id)


def test_confirm_then_reject_then_approve_completes() -> None:
    calls: list[str] = []
    journal = MemoryJournal()

    async def main() -> None:
        rt, view = await _confirm_run(calls, journal)
        assert view.status == "waiting" and view.pending_action is not None
        first = view.pending_action
        # An invalid answer leaves the wait untouched.
        with pytest.raises(IntloomError) as bad:
            await rt.answer(view.run_id, first.id, {"isConfirmed": "maybe"})
        assert bad.value.code == "INVALID_REQUEST"
        assert rt.get(view.run_id) == view
        # A wrong action id is CONFLICT.
        with pytest.raises(IntloomError) as wrong:
            await rt.answer(view.run_id, "ASK-nope", {"isConfirmed": True})
        assert wrong.value.code == "CONFLICT"
        again = await rt.answer(view.run_id, first.id, {"isConfirmed": False})
        assert again.pending_action is not None and again.pending_action.id != first.id
        # The stale action id is now a CONFLICT naming how it was answered, and what is next.
        with pytest.raises(IntloomError, match=r"already answered by an earlier request "
                           rf"\(declined\); it waits on {again.pending_action.id}"):
            await rt.answer(view.run_id, first.id, {"isConfirmed": True})
        done = await rt.answer(view.run_id, again.pending_action.id, {"isConfirmed": True})
        assert done.status == "completed"

    run(main)
    assert calls == ["prep", "charge-effect", "ask", "prep", "charge-effect", "ask"]


def test_an_action_of_another_run_is_refused_naming_the_run_that_asks_it() -> None:
    """An answer sent with another waiting Run's action id was told to answer this Run's
    action instead: the answer, written for the other Run, would then be taken here for
    good. So are ids given the wrong way round (ACTION as RUN)."""
    journal = MemoryJournal()

    async def main() -> None:
        rt = Runtime(loaded(make_confirm_wf([])), journal, package_version="0.1.0")
        rt.restore([])
        one = await rt.wait_stable((await rt.create_run("confirm", "one")).run_id)
        two = await rt.wait_stable((await rt.create_run("confirm", "two")).run_id)
        assert one.pending_action is not None and two.pending_action is not None
        asks = two.pending_action.id
        with pytest.raises(IntloomError) as crossed:
            await rt.answer(one.run_id, asks, {"isConfirmed": True})
        assert crossed.value.code == "CONFLICT"
        assert (f"is Run {two.run_id}'s pending confirmation action, not Run {one.run_id}'s; "
                "nothing was recorded") in crossed.value.message
        assert f"intloom answer {two.run_id} {asks} ANSWER" in crossed.value.message
        assert one.pending_action.id not in crossed.value.message
        with pytest.raises(IntloomError) as swapped:
            await rt.answer(asks, one.run_id, {"isConfirmed": True})
        assert swapped.value.code == "NOT_FOUND"
        assert f"is the id of Run {two.run_id}'s pending action, not of a Run: give " \
               f"{two.run_id} as the Run" in swapped.value.message
        with pytest.raises(IntloomError, match=r"CALL-x is an action's or an Agent task's id, "
                           r"not a Run's \(a Run's id begins RUN-"):
            rt.get("CALL-x")
        assert rt.get(one.run_id) == one and rt.get(two.run_id) == two

    run(main)


def test_first_valid_answer_wins() -> None:
    journal = MemoryJournal()

    async def main() -> None:
        rt = Runtime(loaded(make_confirm_wf([])), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("confirm", "go")).run_id)
        assert view.pending_action is not None
        results = await asyncio.gather(
            *(rt.answer(view.run_id, view.pending_action.id, {"isConfirmed": True})
              for _ in range(5)),
            return_exceptions=True,
        )
        ok = [r for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, IntloomError)]
        assert len(ok) == 1 and len(errors) == 4
        assert {e.code for e in errors} == {"CONFLICT"}
        # Each loser is told what won, not that the Run is "waiting with no question
        # pending" (its view, until the winner's answer is durable).
        for error in errors:
            assert "already answered by an earlier request (confirmed)" in error.message, error
            assert "nothing was recorded" in error.message and "pending" not in error.message
            # The same answer as the winner's: a retry after a lost reply learns it landed.
            assert error.message.endswith(
                " The recorded answer is the same as this one: if you sent it before and its "
                "reply was lost, yours was recorded, and there is nothing more to do."), error

    run(main)


def test_an_answer_after_the_run_went_on_from_another_answer_is_told_that_answer() -> None:
    # It arrived once the winner's Step had returned: it was told only that the Run "has
    # completed" (or "is running with no question pending"), not that it was answered.
    async def main() -> None:
        rt = Runtime(loaded(make_confirm_wf([])), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("confirm", "go")).run_id)
        assert view.pending_action is not None
        action = view.pending_action.id
        done = await rt.answer(view.run_id, action, {"isConfirmed": True})
        assert done.status == "completed"
        with pytest.raises(IntloomError) as late:
            await rt.answer(view.run_id, action, {"isConfirmed": False})
        assert late.value.code == "CONFLICT"
        message = late.value.message
        assert f"Action {action} of Run {view.run_id} was already answered by an earlier " \
               "request (confirmed)" in message, message
        assert "it has completed and takes no answer; nothing was recorded" in message
        assert message.endswith(" The recorded answer is not this one."), message
        # Sent again as it was recorded ("feedback" absent either way): the same.
        with pytest.raises(IntloomError) as retried:
            await rt.answer(view.run_id, action, {"isConfirmed": True})
        assert "The recorded answer is the same as this one" in retried.value.message
        # No answer of that kind: nothing claimed either way.
        with pytest.raises(IntloomError) as odd:
            await rt.answer(view.run_id, action, ["not", "a", "confirmation"])
        assert "The recorded answer" not in odd.value.message, odd.value.message

    run(main)


def test_restored_wait_and_recover_after_restart() -> None:
    calls: list[str] = []
    journal = MemoryJournal()

    async def first() -> tuple[str, Any]:
        rt, view = await _confirm_run(calls, journal)
        await rt.suspend(1)
        return view.run_id, view

    run_id, before = run(first)

    async def second() -> None:
        rt = Runtime(loaded(make_confirm_wf(calls)), journal, package_version="0.1.0")
        summary = rt.restore([RestoredRun(run_id, fold(journal.of(run_id)))])
        assert summary.waiting == [run_id]
        rt.start_restored()
        assert rt.get(run_id) == before
        assert before.pending_action is not None
        done = await rt.answer(run_id, before.pending_action.id, {"isConfirmed": True})
        assert done.status == "completed"

    run(second)
    # The original Step was not called again: recover continued it.
    assert calls == ["prep", "charge-effect", "ask", "recover"]


def test_outcome_without_route_fails_the_run() -> None:
    wf = intloom.Workflow("noroute", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        return "surprise"

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("noroute", "go")).run_id)
        assert view.status == "failed" and view.last_error is not None
        assert view.last_error.code == "STEP_OUTCOME_NOT_HANDLED"
        assert view.last_error.message == (
            "Stage 's', Step 'a' returned outcome 'surprise', which the Step's routes do not "
            "handle (['ok']). Add a route for it.")

    run(main)


@pytest.mark.parametrize("returned", ["b", "other"])
def test_an_outcome_that_names_where_a_route_leads_is_told_the_outcome_to_return(
        returned: str) -> None:
    """A Step with routes={"written": "b"} that returned "b", where its outcome leads, was
    told to "add a route for it": a second route where the first was right."""
    wf = intloom.Workflow("leads", version="1")
    st = wf.stage("s")
    wf.stage("other")

    @st.step("a", routes={"written": "b", "away": intloom.ToStage("other"),
                          "done": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        return returned

    @st.step("b", routes={"ok": intloom.COMPLETE})
    def b(ctx: Any) -> str:
        return "ok"

    @wf.stages["other"].step("c", routes={"ok": intloom.COMPLETE})
    def c(ctx: Any) -> str:
        return "ok"

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("leads", "go")).run_id)
        assert view.last_error is not None and view.status == "failed", view
        outcome = "written" if returned == "b" else "away"
        assert view.last_error.message == (
            f"Stage 's', Step 'a' returned outcome {returned!r}, which the Step's routes do "
            "not handle (['away', 'done', 'written']). "
            f"{returned!r} is where outcome {outcome!r} leads: return {outcome!r}.")

    run(main)


def test_an_async_step_returning_an_unawaited_coroutine_is_told_to_await_it() -> None:
    """``return helper(ctx)`` in an ``async def`` Step failed STEP_RESULT_INVALID "returned
    <coroutine object helper at 0x...>; return a non-empty outcome string", which did not say
    the call was never awaited (nor ran), and Python's "never awaited" warning went nowhere."""
    wf = intloom.Workflow("unawaited", version="1")
    st = wf.stage("s")

    async def helper(ctx: Any) -> str:
        return "ok"

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> Any:
        return helper(ctx)

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("unawaited", "go")).run_id)
        assert view.status == "failed" and view.last_error is not None
        assert view.last_error.code == "STEP_RESULT_INVALID"
        message = view.last_error.message
        assert message.startswith("Stage 's', Step 'a' returned <coroutine object "), message
        assert "without awaiting it, so it never ran. Await it and return its outcome " \
            "(`return await ...`), a non-empty outcome string, one of ['ok']." in message

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        run(main)
        gc.collect()  # a coroutine left unawaited warns once it is collected
    assert not [w for w in said if "never awaited" in str(w.message)], said


# StopIteration: a future refuses to carry one; carried raw, it broke the hand-back of every
# other sync Step's result in the same batch, and its own Run never ended.
@pytest.mark.parametrize(("raised", "shown"), [
    (ValueError("bad input"), "ValueError: bad input"),
    (StopIteration("early"), "raised StopIteration: early"),
    (StopIteration(), "raised StopIteration"),  # no dangling ": "
    (ValueError(), "raised ValueError"),
])
def test_step_exception_fails_with_its_type_but_no_traceback(
        sync_path: SyncPath, raised: BaseException, shown: str) -> None:
    wf = intloom.Workflow("boom", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        raise raised

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("boom", "go")).run_id)
        assert view.status == "failed" and view.last_error is not None
        assert view.last_error.code == "STEP_EXECUTION_FAILED"
        assert view.last_error.message.endswith(shown), view.last_error.message
        assert "Traceback" not in view.last_error.message

    run(main)
    sync_path.check()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_step_failed_by_its_effects_exception_names_the_effect(kind: str) -> None:
    """The Step's error named only the Step: which effect raised, and that it ran and is
    journaled done with that error, was in inspect alone (an exception the Step raises
    itself names none: test_step_exception_fails_with_its_type_but_no_traceback)."""
    wf = intloom.Workflow("boom", version="1")
    st = wf.stage("s")

    def charge() -> None:
        raise ValueError("card declined")

    if kind == "sync":
        @st.step("a", routes={"ok": intloom.COMPLETE})
        def a(ctx: Any) -> str:
            ctx.effect("charge", charge, key="order-7")
            return "ok"
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a_async(ctx: Any) -> str:
            await ctx.aeffect("charge", charge, key="order-7")
            return "ok"

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("boom", "go")).run_id)
        assert view.last_error is not None and view.last_error.code == "STEP_EXECUTION_FAILED"
        assert view.last_error.message.endswith(
            "raised ValueError: card declined, from effect 'charge' (key 'order-7'), "
            "journaled done with that error"), view.last_error.message

    run(main)


def test_cancel_is_terminal_and_idempotent() -> None:
    journal = MemoryJournal()

    async def main() -> None:
        rt = Runtime(loaded(make_confirm_wf([])), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("confirm", "go")).run_id)
        first, ended = await rt.cancel(view.run_id)
        assert not ended
        assert first.status == "failed" and first.last_error is not None
        assert first.last_error.code == "RUN_STOPPED" and first.pending_action is None
        second, ended = await rt.cancel(view.run_id)
        assert ended and second == first
        with pytest.raises(IntloomError) as missing:
            await rt.cancel("RUN-missing")
        assert missing.value.code == "NOT_FOUND"

    run(main)
    assert fold([r for _, r in journal.records]) is not None


def test_cancels_at_once_both_return_the_stopped_run_not_the_wait_before_it() -> None:
    # The second cancel finds the terminal record appended but not yet durable: it returned
    # the Run's view from before it ("waiting"), saying the Run "has ended".
    journal = MemoryJournal()

    async def main() -> None:
        rt = Runtime(loaded(make_confirm_wf([])), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("confirm", "go")).run_id)
        (first, ended1), (second, ended2) = await asyncio.gather(
            rt.cancel(view.run_id), rt.cancel(view.run_id))
        assert (ended1, ended2) == (False, True)
        assert first.status == "failed" and first.last_error is not None
        assert first.last_error.code == "RUN_STOPPED"
        assert second == first

    run(main)
    assert sum(isinstance(r, Terminal) for _, r in journal.records) == 1


def test_an_answer_or_claim_after_a_cancel_not_yet_durable_is_told_the_run_was_stopped(
) -> None:
    # The cancel has appended its terminal record and waits for the flush: the Run's view
    # still shows the wait, and the refusal was built from it ("it is waiting with no
    # question pending"; "the Run now waits on Agent task CALL-x (claimed); use that one").
    journal = MemoryJournal()

    async def main() -> None:
        rt = Runtime({**loaded(make_confirm_wf([])), **loaded(_agent_wf(lambda arg: arg))},
                     journal, package_version="0.1.0")
        rt.restore([])
        asked = await rt.wait_stable((await rt.create_run("confirm", "go")).run_id)
        tasked = await rt.wait_stable((await rt.create_run("agent", "go")).run_id)
        assert asked.pending_action is not None and tasked.pending_agent_call is not None
        call = tasked.pending_agent_call.id
        await rt.claim_agent_call(tasked.run_id, call, "c1")
        results = await asyncio.gather(
            rt.cancel(asked.run_id),
            rt.answer(asked.run_id, asked.pending_action.id, {"isConfirmed": True}),
            rt.cancel(tasked.run_id),
            rt.claim_agent_call(tasked.run_id, call, "c1"),
            return_exceptions=True)
        answer, claim = results[1], results[3]
        assert isinstance(answer, IntloomError) and answer.code == "CONFLICT", answer
        assert "was stopped (RUN_STOPPED" in answer.message, answer.message
        assert isinstance(claim, IntloomError) and claim.code == "CONFLICT", claim
        assert "ended failed (RUN_STOPPED)" in claim.message, claim.message

    run(main)


def test_checkpoint_failure_stops_the_run_but_keeps_the_effect() -> None:
    calls: list[str] = []
    journal = MemoryJournal()
    # flush 1: create; 2: executing prep; 3: effect_started; 4: executing ask -> fail it.
    journal.fail_at = {4}

    async def main() -> None:
        _, view = await _confirm_run(calls, journal)
        assert view.status == "failed" and view.last_error is not None
        assert view.last_error.code == "RUN_CHECKPOINT_FAILED"
        assert view.pending_action is None

    run(main)
    assert calls == ["prep", "charge-effect"]  # the effect ran once and is not undone


def test_an_answer_whose_checkpoint_fails_says_so_naming_the_run_action_and_fix() -> None:
    # The reply is the only place that can say the answer itself was lost: it must name the
    # Run, the action, where the cause is and what to do, not only the catalogue sentence.
    calls: list[str] = []
    journal = MemoryJournal()

    async def main() -> None:
        rt, view = await _confirm_run(calls, journal)
        assert view.pending_action is not None
        journal.fail_at = {journal.flushes + 1}  # the flush that holds the answer
        with pytest.raises(IntloomError) as failed:
            await rt.answer(view.run_id, view.pending_action.id, {"isConfirmed": True})
        assert failed.value.code == "RUN_CHECKPOINT_FAILED"
        message = failed.value.message
        for fact in (view.run_id, view.pending_action.id, "not delivered",
                     f"intloom logs {view.run_id}", "free space", "intloom start"):
            assert fact in message, (fact, message)
        after = rt.get(view.run_id)
        assert after.status == "failed" and after.last_error is not None
        assert after.last_error.code == "RUN_CHECKPOINT_FAILED"

    run(main)
    assert calls == ["prep", "charge-effect", "ask"]  # the Step never saw the answer


def test_a_cancel_whose_checkpoint_fails_says_the_run_comes_back_and_what_to_do() -> None:
    calls: list[str] = []
    journal = MemoryJournal()

    async def main() -> None:
        rt, view = await _confirm_run(calls, journal)
        journal.fail_at = {journal.flushes + 1}  # the flush that holds the cancel
        with pytest.raises(IntloomError) as failed:
            await rt.cancel(view.run_id)
        assert failed.value.code == "RUN_CHECKPOINT_FAILED"
        message = failed.value.message
        for fact in (view.run_id, "cancel is not on disk", "next start brings the Run back",
                     f"intloom logs {view.run_id}", "free space",
                     f"intloom cancel {view.run_id}"):
            assert fact in message, (fact, message)
        # Again: the cancel is still not on disk. The repeat said "The Run has ended; no stop
        # is needed" (exit 0), and the next start brought the Run back all the same.
        with pytest.raises(IntloomError) as again:
            await rt.cancel(view.run_id)
        assert again.value.code == "RUN_CHECKPOINT_FAILED", again.value
        assert "cancel is not on disk" in again.value.message, again.value.message
        assert f"intloom cancel {view.run_id}" in again.value.message

    run(main)


def test_a_step_refused_for_want_of_a_thread_never_runs_once_a_worker_frees_up(
        sync_path: SyncPath, monkeypatch: pytest.MonkeyPatch) -> None:
    # Under a process or thread limit (ulimit -u, a cgroup's pids.max) no new worker can be
    # started: the Run fails (docs/format.md). Its Step must then never run -- not later,
    # on a worker that was busy when it was refused (a Step, or a Tool, run for a call its
    # caller was told had failed).
    calls: list[str] = []
    wf = intloom.Workflow("limited", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        calls.append("a")
        return "ok"

    journal = MemoryJournal()
    shared = [0]
    monkeypatch.setattr(MemoryJournal, "share", lambda self: shared.__setitem__(0, shared[0] + 1))
    monkeypatch.setattr(MemoryJournal, "unshare",
                        lambda self: shared.__setitem__(0, shared[0] - 1))
    busy, release = threading.Event(), threading.Event()
    real_start = threading.Thread.start

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    async def main() -> None:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])

        def occupy() -> None:
            busy.set()
            release.wait(10)

        rt.driver.workers.submit(occupy)  # the one worker there is, busy
        assert await asyncio.to_thread(busy.wait, 10)
        monkeypatch.setattr(threading.Thread, "start", no_thread)
        try:
            view = await rt.wait_stable((await rt.create_run("limited", "go")).run_id)
        finally:
            monkeypatch.setattr(threading.Thread, "start", real_start)
        assert view.status == "failed" and view.last_error is not None, view
        # Not "the host failed" (a bug to report): what ran out, and what to do.
        for fact in ("could not start a thread", "Step 'a'", "ulimit -u", "did not run",
                     "Raise the limit"):
            assert fact in view.last_error.message, (fact, view.last_error.message)
        release.set()
        # The freed worker takes what was queued, in order, before this.
        after = threading.Event()
        rt.driver.workers.submit(after.set)
        assert await asyncio.to_thread(after.wait, 10)

    run(main)
    assert calls == []
    # Nor does its hand-over end twice: a second unshare() leaves the store one share short,
    # and the next Run driven on a thread would append with the loop no longer locking.
    assert shared == [0], shared


def test_a_sync_step_whose_executing_record_fails_to_flush_never_runs(
        sync_path: SyncPath) -> None:
    # A crew makes its round's records durable for all its Runs at once (Runtime.sync_crew)
    # and must raise the failure in this Run rather than start its Step.
    calls: list[str] = []
    wf = intloom.Workflow("refused", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": "b"})
    def a(ctx: Any) -> str:
        calls.append("a")
        return "ok"

    @st.step("b", routes={"ok": intloom.COMPLETE})
    def b(ctx: Any) -> str:
        calls.append("b")
        return "ok"

    journal = MemoryJournal()
    # flush 1: create; 2: executing a; 3: a's result and executing b -> fail it.
    journal.fail_at = {3}
    view = settled(wf, journal)
    assert view.status == "failed" and view.last_error is not None
    assert view.last_error.code == "RUN_CHECKPOINT_FAILED"
    assert calls == ["a"]
    sync_path.check()


def test_a_sync_step_that_waits_for_another_runs_step_in_its_crew_is_not_stuck(
        sync_path: SyncPath) -> None:
    # Two Runs in step join one crew in one loop iteration: one thread advances both. The
    # first waits for the second; run in turn on that thread, they would wait for ever: the
    # loop's look must move the second to a crew of its own.
    other_ran = threading.Event()
    wf = intloom.Workflow("pair", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        if ctx.intent == "wait":
            return "ok" if other_ran.wait(10) else "timed out"
        other_ran.set()
        return "ok"

    async def main() -> tuple[list[RunView], int]:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        # Created together (one flush), so they reach Step a together; "wait" first: it
        # is the first its crew advances.
        runs = await asyncio.gather(*(rt.create_run("pair", i) for i in ("wait", "set")))
        views = [await rt.wait_stable(view.run_id) for view in runs]
        crews = rt.driver._crews
        assert crews is not None
        return views, crews.splits

    views, splits = run(main)
    assert splits >= 1, "the two Runs were never in one crew"
    assert [v.status for v in views] == ["completed", "completed"], views
    sync_path.check()


def test_sync_steps_do_not_block_the_loop(sync_path: SyncPath) -> None:
    gate = threading.Event()
    wf = intloom.Workflow("slow", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        gate.wait(10)
        return "ok"

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.create_run("slow", "go")
        started = time.monotonic()
        for _ in range(10):
            await asyncio.sleep(0)  # the loop keeps turning while the Step blocks its thread
        assert time.monotonic() - started < 1
        assert rt.get(view.run_id).status == "running"
        gate.set()
        assert (await rt.wait_stable(view.run_id)).status == "completed"

    run(main)
    sync_path.check()


@pytest.mark.parametrize("how", ["cancel", "stop"])
def test_a_cancel_or_a_stops_cut_ends_a_running_sync_steps_ctx_at_once_on_either_path(
        sync_path: SyncPath, how: str) -> None:
    """Driven on a worker thread, a sync Step cancelled (or cut by a stop past its grace)
    kept a live ctx until it returned: a State assigned through it was taken without a
    word, an effect refused with another code than on the loop path. Now it refuses from
    that moment on, alike on both paths; nothing follows the Run's last record."""
    parked, release, tried = threading.Event(), threading.Event(), threading.Event()
    seen: list[tuple[str, str] | None] = []
    wf = intloom.Workflow("parked", version="1")
    st = wf.stage("s", state=Count)

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        parked.set()
        assert release.wait(10)
        for late in (lambda: ctx.effect("late", lambda: None),
                     lambda: setattr(ctx, "state", Count(n=1))):
            try:
                late()
                seen.append(None)
            except IntloomError as exc:
                seen.append((exc.code, exc.message.split(", while ")[0]))
        tried.set()
        return "ok"

    journal = MemoryJournal()

    async def main() -> str:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        run_id = (await rt.create_run("parked", "go")).run_id
        await asyncio.to_thread(parked.wait, 10)
        task = rt.runs[run_id].task
        assert task is not None
        if how == "cancel":
            assert (await rt.cancel(run_id))[0].status == "failed"
        else:
            await rt.suspend(grace=0.05)
        await asyncio.wait_for(asyncio.shield(task), 10)  # the driver is done with the Run
        release.set()
        assert await asyncio.to_thread(tried.wait, 10), "the Step never tried its ctx"
        return run_id

    run_id = run(main)
    sync_path.check()
    over = ("the ctx given to Stage 's', Step 'a', which was over (it had returned or raised, "
            "or the Run had stopped waiting for it: a cancel, or a stop's grace that ran out)")
    assert seen == [("STEP_INTERACTION_INVALID", f"ctx.effect('late', ...) was called through "
                     f"{over}"),
                    ("STEP_INTERACTION_INVALID", f"ctx.state was assigned through {over}")], seen
    last = Terminal if how == "cancel" else Executing
    assert type(journal.of(run_id)[-1]) is last


class _HeldAtB(MemoryJournal):
    """Holds the flush of Step b's ``executing`` (the crew's or the loop's) until let go."""

    def __init__(self) -> None:
        super().__init__()
        self.holding, self.let_go = threading.Event(), threading.Event()

    def _at_b(self) -> bool:
        return any(type(r) is Executing and r.step == "b" for _, r in self.pending)

    def sync_threadsafe(self, run_id: str | None) -> None:
        if self._at_b():
            self.holding.set()
            assert self.let_go.wait(10)
        super().sync_threadsafe(run_id)

    async def sync(self, run_id: str | None = None) -> None:
        if self._at_b():
            self.holding.set()
            assert await asyncio.to_thread(self.let_go.wait, 10)
        await super().sync(run_id)


def test_a_sync_step_whose_executing_is_still_being_written_when_a_stop_cuts_is_never_called(
        sync_path: SyncPath, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next Step's ``executing`` still being made durable when a stop's grace ran out:
    on the loop, the cut ends that await and the Step is never called. Its Run's thread
    went on to call it -- its ctx live, the cut having found none to finish -- if its flush
    came back before the stop took the Run (slot.suspend): here, held until just then."""
    called: list[str] = []
    wf = intloom.Workflow("cut", version="1")
    st = wf.stage("s", state=Count)

    @st.step("a", routes={"ok": "b"})
    def a(ctx: Any) -> str:
        return "ok"

    @st.step("b", routes={"ok": intloom.COMPLETE})
    def b(ctx: Any) -> str:
        called.append("b")
        return "ok"

    journal = _HeldAtB()

    async def main() -> str:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        run_id = (await rt.create_run("cut", "go")).run_id
        assert await asyncio.to_thread(journal.holding.wait, 10)
        slot = rt.runs[run_id]
        suspend = RunSlot.suspend

        def late(self: RunSlot, reason: str | None = None) -> None:
            # The grace is over (``cutting``), the Run not yet taken nor its task cancelled
            # (the stop takes the Run first): the flush comes back now, and the stop takes
            # the Run only once the thread (if any) has let it go.
            if self is slot:
                assert rt.driver.cutting and slot.task is not None and not slot.task.done()
                journal.let_go.set()
                # Polled on the loop, held on purpose: nothing of the loop's may run meanwhile.
                eventually(lambda: not slot.on_thread, what="the thread to let the Run go")
            suspend(self, reason)

        # On the class: a RunSlot has slots, no instance dict to shadow a method in.
        monkeypatch.setattr(RunSlot, "suspend", late)
        await rt.suspend(grace=0.05)
        return run_id

    run_id = run(main)
    sync_path.check()
    assert called == [], "Step b was called after the stop's cut"
    # Nothing follows b's executing, flushed or not (the loop's flush was cancelled).
    last = [r for rid, r in [*journal.records, *journal.pending] if rid == run_id][-1]
    assert type(last) is Executing and last.step == "b", last


def _agent_wf(lookup: Callable[[Any], Any]) -> intloom.Workflow:
    """An Agent Step with one Tool, ``lookup``; its task's request is the Run's intent."""
    wf = intloom.Workflow("agent", version="1")
    st = wf.stage("s")

    @st.agent_step("research", routes={"done": intloom.COMPLETE},
                   tools=[intloom.Tool("lookup", lookup)])
    def research(ctx: Any) -> Any:
        return {"task": ctx.intent}

    return wf


def test_agent_step_claim_tools_and_complete() -> None:
    tool_calls: list[Any] = []

    def lookup(arg: Any) -> Any:
        tool_calls.append(arg)
        return {"found": arg}

    wf = _agent_wf(lookup)

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("agent", "find x")).run_id)
        call = view.pending_agent_call
        assert view.status == "waiting" and call is not None and call.request == {"task": "find x"}
        token, claimed = await rt.claim_agent_call(view.run_id, call.id, "c1")
        assert claimed.phase == "claimed"
        assert (await rt.claim_agent_call(view.run_id, call.id, "c1"))[0] == token
        with pytest.raises(IntloomError, match="another claim") as taken:
            await rt.claim_agent_call(view.run_id, call.id, "c2")
        # The way out when the claiming Agent is gone (a claim never expires).
        assert f"intloom cancel {view.run_id} ends the task" in taken.value.message
        out, replayed = await rt.call_tool(view.run_id, call.id, token, "t1", "lookup", 1)
        assert out == {"found": 1} and not replayed
        out, replayed = await rt.call_tool(view.run_id, call.id, token, "t1", "lookup", 1)
        assert out == {"found": 1} and replayed
        with pytest.raises(IntloomError) as conflict:
            await rt.call_tool(view.run_id, call.id, token, "t1", "lookup", 2)
        assert conflict.value.code == "CONFLICT"
        with pytest.raises(IntloomError):
            await rt.call_tool(view.run_id, call.id, "wrong-token", "t2", "lookup", 1)
        with pytest.raises(IntloomError) as bad:
            await rt.complete_agent_call(view.run_id, call.id, token, "unrouted", None)
        assert bad.value.code == "INVALID_REQUEST"
        done = await rt.complete_agent_call(view.run_id, call.id, token, "done", {"x": 1})
        assert done.status == "completed"

    run(main)
    assert tool_calls == [1]


def test_a_cancelled_agent_task_leaves_no_tool_outputs_in_memory() -> None:
    """An ended Run is listed for a long while (up to 1,000 of them): a cancelled task's
    claim, with its Tool receipts (up to 256 outputs), goes when the Run ends."""
    wf = _agent_wf(lambda arg: {"big": "x" * 1000})

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("agent", "find x")).run_id)
        assert view.pending_agent_call is not None
        call = view.pending_agent_call.id
        token, _ = await rt.claim_agent_call(view.run_id, call, "c1")
        await rt.call_tool(view.run_id, call, token, "t1", "lookup", 1)
        assert rt.runs[view.run_id].agent.receipts
        await rt.cancel(view.run_id)
        slot = rt.runs[view.run_id]
        assert slot.agent.receipts == {} and slot.agent.owner_token is None

    run(main)


def test_recover_on_an_agent_step_is_a_definition_mistake() -> None:
    wf = intloom.Workflow("agent", version="1")
    st = wf.stage("s")

    @st.agent_step("research", routes={"done": intloom.COMPLETE})
    def research(ctx: Any) -> Any:
        return {}

    with pytest.raises(IntloomError) as info:
        research.recover(lambda ctx, saved: "done")
    assert info.value.code == "WORKFLOW_DEFINITION_INVALID"
    assert info.value.message.startswith(
        "Workflow 'agent', Stage 's', Step 'research': recover cannot be declared on an "
        "Agent Step: after a restart its task is always reported RUN_INTERRUPTED")


@pytest.mark.parametrize("handler", ["effect", "wait", "returns", "bad_state", "async"])
def test_on_complete_folds_the_result_into_the_state_and_refuses_anything_else(
        handler: str) -> None:
    wf = intloom.Workflow("agent", version="1")
    st = wf.stage("s", state=Count)
    seen: list[Any] = []
    misbehave = [True]

    @st.agent_step("research", routes={"done": "after"})
    def research(ctx: Any) -> Any:
        return {}

    if handler == "async":
        @research.on_complete
        async def absorb_async(ctx: Any, result: intloom.AgentResult) -> None:
            ctx.state = Count(n=result.output["n"])
    else:
        @research.on_complete
        def absorb(ctx: Any, result: intloom.AgentResult) -> Any:
            if not misbehave:
                return None
            if handler == "effect":
                ctx.effect("charge", lambda: seen.append("charged"))
            if handler == "wait":
                return asyncio.run(ctx.confirm({}))  # a sync handler cannot await anyway
            if handler == "bad_state":
                ctx.state = Count(n=str(result.output["n"]))  # type: ignore[arg-type]
                return None
            return "done"

    @st.step("after", routes={"ok": intloom.COMPLETE})
    def after(ctx: Any) -> str:
        seen.append(ctx.state.n)
        return "ok"

    async def main() -> None:
        journal = MemoryJournal()
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("agent", "x")).run_id)
        assert view.pending_agent_call is not None
        call_id = view.pending_agent_call.id
        token, _ = await rt.claim_agent_call(view.run_id, call_id, "c1")
        written = len(journal.records)
        if handler == "async":
            done = await rt.complete_agent_call(view.run_id, call_id, token, "done", {"n": 7})
            assert done.status == "completed" and seen == [7]
            return
        with pytest.raises(IntloomError) as info:
            await rt.complete_agent_call(view.run_id, call_id, token, "done", {"n": 7})
        expected = {
            "effect": ("STEP_INTERACTION_INVALID", "on_complete cannot run effect 'charge'"),
            "wait": ("STEP_INTERACTION_INVALID",
                     "on_complete cannot wait for a confirmation answer"),
            "returns": ("STEP_RESULT_INVALID", "on_complete returned 'done'; it must return None"),
            "bad_state": ("STAGE_STATE_INVALID", "on_complete: the Stage State it left is not a "
                          "valid Count: Expected `int`, got `str` - at `$.n`"),
        }[handler]
        assert (info.value.code, expected[1] in info.value.message) == (expected[0], True), \
            info.value.message
        assert seen == [] and len(journal.records) == written  # nothing ran, nothing recorded
        now = rt.get(view.run_id)
        assert now.status == "waiting" and now.pending_agent_call is not None
        assert now.pending_agent_call.phase == "claimed"  # still the Agent's to complete
        misbehave.clear()
        done = await rt.complete_agent_call(view.run_id, call_id, token, "done", {"n": 7})
        assert done.status == "completed" and seen == [0]  # the State as it was

    run(main)


class GatedJournal(MemoryJournal):
    """A journal whose flushes wait while ``gate`` is clear: a slow disk, on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.held = asyncio.Event()  # a flush is waiting at the gate

    async def sync(self, run_id: str | None = None) -> None:
        if not self.gate.is_set():
            self.held.set()
        await self.gate.wait()
        await super().sync(run_id)


def _one_agent_step() -> intloom.Workflow:
    """Workflow 'agent': one Agent Step, whose outcome "done" completes the Run."""
    wf = intloom.Workflow("agent", version="1")
    st = wf.stage("s")

    @st.agent_step("research", routes={"done": intloom.COMPLETE})
    def research(ctx: Any) -> Any:
        return {}

    return wf


def _on_complete_held(outcomes: tuple[str, ...]
                      ) -> tuple[intloom.Workflow, asyncio.Event, asyncio.Event]:
    """An Agent Step whose on_complete sets ``started``, then waits for ``release``: a
    completion held under way. Its outcomes each complete the Run."""
    started, release = asyncio.Event(), asyncio.Event()
    wf = intloom.Workflow("agent", version="1")
    st = wf.stage("s")

    @st.agent_step("research", routes=dict.fromkeys(outcomes, intloom.COMPLETE))
    def research(ctx: Any) -> Any:
        return {}

    @research.on_complete
    async def absorb(ctx: Any, result: intloom.AgentResult) -> None:
        started.set()
        await release.wait()

    return wf, started, release


async def _claimed(rt: Runtime, intent: str, claim_id: str) -> tuple[str, str, str]:
    """A new Run of 'agent', its task claimed: (run id, call id, owner token)."""
    view = await rt.wait_stable((await rt.create_run("agent", intent)).run_id)
    assert view.pending_agent_call is not None
    call_id = view.pending_agent_call.id
    token, _ = await rt.claim_agent_call(view.run_id, call_id, claim_id)
    return view.run_id, call_id, token


def test_completing_an_unclaimed_task_says_to_claim_it_first() -> None:
    async def main() -> None:
        rt = Runtime(loaded(_one_agent_step()), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("agent", "x")).run_id)
        assert view.pending_agent_call is not None
        call_id = view.pending_agent_call.id
        for attempt in (rt.complete_agent_call(view.run_id, call_id, "guess", "done", None),
                        rt.fail_agent_call(view.run_id, call_id, "guess", "no")):
            with pytest.raises(IntloomError) as info:
                await attempt
            assert info.value.code == "CONFLICT"
            assert "is not claimed: claim it first" in info.value.message
        assert rt.get(view.run_id) == view  # nothing was recorded

    run(main)


def test_a_completion_retried_while_the_first_is_flushed_gets_what_it_led_to() -> None:
    async def main() -> None:
        journal = GatedJournal()
        rt = Runtime(loaded(_one_agent_step()), journal, package_version="0.1.0",
                     max_finished=1)
        rt.restore([])
        run_id, call_id, token = await _claimed(rt, "x", "c1")
        journal.gate.clear()  # the completion's records are written, not yet durable
        first = asyncio.ensure_future(
            rt.complete_agent_call(run_id, call_id, token, "done", {"n": 1}))
        await journal.held.wait()
        retry = asyncio.ensure_future(
            rt.complete_agent_call(run_id, call_id, token, "done", {"n": 1}))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not retry.done(), "the retry answered before the completion was durable"
        journal.gate.set()
        done, again = await asyncio.gather(first, retry)
        assert done.status == "completed" and again == done
        # An ended Run's memory of its task goes when the Run itself is retired.
        other, other_call, other_token = await _claimed(rt, "y", "c2")
        await rt.complete_agent_call(other, other_call, other_token, "done", None)
        assert list(rt._agent_ended) == [other]

    run(main)


def test_a_failed_agent_task_retried_gets_the_same_view() -> None:
    async def main() -> None:
        rt = Runtime(loaded(_one_agent_step()), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        run_id, call_id, token = await _claimed(rt, "x", "c1")
        failed = await rt.fail_agent_call(run_id, call_id, token, "no sources")
        assert failed.status == "failed"
        assert await rt.fail_agent_call(run_id, call_id, token, "no sources") == failed
        with pytest.raises(IntloomError) as other:
            await rt.fail_agent_call(run_id, call_id, token, "something else")
        assert other.value.code == "CONFLICT"
        assert "was already failed: 'no sources'" in other.value.message
        with pytest.raises(IntloomError) as completed:
            await rt.complete_agent_call(run_id, call_id, token, "done", None)
        assert completed.value.code == "CONFLICT"

    run(main)


def test_every_request_that_would_change_a_run_during_a_stop_is_told_the_host_is_closing(
) -> None:
    """fail_agent_call during a stop got CONFLICT (the stop had suspended the task) where
    complete_agent_call got CLI_SERVICE_CLOSING; a cancel even ended a Run the stop was
    suspending. Each is refused alike, and nothing is recorded."""
    async def main() -> None:
        journal = MemoryJournal()
        rt = Runtime(loaded(_one_agent_step()), journal, package_version="0.1.0")
        rt.restore([])
        run_id, call_id, token = await _claimed(rt, "x", "c1")
        before = list(journal.records)
        await rt.suspend(grace=1)
        for attempt in (rt.complete_agent_call(run_id, call_id, token, "done", None),
                        rt.fail_agent_call(run_id, call_id, token, "no sources"),
                        rt.claim_agent_call(run_id, call_id, "c1"),
                        rt.cancel(run_id)):
            with pytest.raises(IntloomError) as info:
                await attempt
            assert (info.value.code, info.value.message) == (
                "CLI_SERVICE_CLOSING", "The host is stopping; no new work."), info.value
        assert journal.records == before

    run(main)


def test_questions_are_validated() -> None:
    wf = intloom.Workflow("q", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        answers = await ctx.ask([
            intloom.Question(id="name", question="Name?"),
            intloom.Question(id="note", question="Note?", skippable=True),
        ])
        assert answers[0].answer == "Ada" and answers[1].skipped
        return "ok"

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("q", "go")).run_id)
        assert view.pending_action is not None and view.pending_action.kind == "user_ask_questions"
        aid = view.pending_action.id
        # Each refusal names the Run, the action and the question, and says what to send.
        for bad, says in (
            ([{"questionId": "name", "isSkipped": True}, {"questionId": "note", "isSkipped": True}],
             "Question 'name' cannot be skipped; send its answer with \"isSkipped\": false."),
            ([{"questionId": "name", "isSkipped": False, "answer": " "}],
             "Question 'name' needs a non-blank \"answer\"."),
            ([{"questionId": "note", "isSkipped": False}],
             "Question 'note' needs a non-blank \"answer\", or skip it with \"isSkipped\": true."),
            ([{"questionId": "zzz", "isSkipped": True}],
             "Question id 'zzz' is not asked here; answer only 'name', 'note'."),
            ([{"questionId": "note", "isSkipped": True}],
             "Questions not answered: 'name'; send one entry for each of 'name', 'note'"),
            ([{"questionId": "note", "isSkipped": True, "answer": "x"}],
             "drop the answer, or send it with \"isSkipped\": false."),
            ({"isConfirmed": True}, "A questions answer is a list"),
            # The other kind's answer says so, and names the ids to answer.
            ({"isConfirmed": True}, "(Expected `array`, got `object`), one entry for each "
             "question asked here: 'name', 'note'. This action asks questions, not for a "
             "confirmation."),
        ):
            with pytest.raises(IntloomError) as info:
                await rt.answer(view.run_id, aid, bad)
            assert info.value.code == "INVALID_REQUEST"
            message = info.value.message
            assert message.startswith(f"The answer to {aid} of Run {view.run_id} was refused: ")
            assert says in message, message
            assert message.endswith(f"Nothing was recorded; the Run still waits on it (intloom "
                                    f"attach {view.run_id} shows it).")
        assert rt.get(view.run_id) == view
        # Sent in another order than asked: the Step still gets them in its own order.
        done = await rt.answer(view.run_id, aid, [
            {"questionId": "note", "isSkipped": True},
            {"questionId": "name", "isSkipped": False, "answer": "Ada"},
        ])
        assert done.status == "completed"

    run(main)


def test_a_questions_answer_to_a_confirmation_says_it_is_a_confirmation() -> None:
    """"Expected `object`, got `array`" alone did not say the action is of the other kind."""
    with pytest.raises(IntloomError) as info:
        validate_answer("confirmation", {"context": 1},
                        [{"questionId": "q", "isSkipped": False, "answer": "yes"}])
    assert info.value.message.endswith(
        "(Expected `object`, got `array`). This action is a confirmation, not questions."
    ), info.value.message
    with pytest.raises(IntloomError) as info:
        validate_answer("confirmation", {"context": 1}, {"isConfirmed": "yes"})
    assert "not questions" not in info.value.message


@pytest.mark.parametrize(("kind", "text"), [("confirmation", '{"isConfirmed": true}'),
                                            ("questions", '[{"questionId": "q"}]')])
def test_an_answer_given_as_json_text_says_to_pass_the_value(kind: str, text: str) -> None:
    """The CLI takes an answer as JSON text; the same text passed to Client.answer was
    refused "Expected `object`, got `str`", which did not say why."""
    with pytest.raises(IntloomError) as info:
        validate_answer(kind, [{"id": "q"}], text)
    assert info.value.message.endswith(
        "It was given as a string of JSON text: pass the value itself (json.loads of the "
        "text) to Client.answer."), info.value.message
    with pytest.raises(IntloomError) as plain:
        validate_answer(kind, [{"id": "q"}], "yes")
    assert "JSON text" not in plain.value.message


def test_changed_identity_or_schema_is_reported_and_not_loaded() -> None:
    journal = MemoryJournal()

    async def first() -> str:
        rt = Runtime(loaded(make_confirm_wf([])), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("confirm", "go")).run_id)
        await rt.suspend(1)
        return view.run_id

    run_id = run(first)
    state = fold(journal.of(run_id))
    assert state is not None

    changed = loaded(make_confirm_wf([]))
    lw = changed["confirm"]
    other_identity = {"confirm": LoadedWorkflow(lw.workflow, lw.source, "id-edited", lw.schemas)}
    rt = Runtime(other_identity, MemoryJournal(), package_version="0.1.0")
    summary = rt.restore([RestoredRun(run_id, state)])
    assert summary.needs_attention == [run_id] and run_id not in rt.runs
    assert "incompatible identity" in rt.attention[0][1]

    other_schema = {"confirm": LoadedWorkflow(lw.workflow, lw.source, lw.identity,
                                              {"main": "f" * 64})}
    rt = Runtime(other_schema, MemoryJournal(), package_version="0.1.0")
    assert rt.restore([RestoredRun(run_id, state)]).needs_attention == [run_id]
    assert "incompatible schema" in rt.attention[0][1]

    # The saved State no longer round-trips through today's State type.
    tampered = msgspec.structs.replace(state, stage_state=b'{"n":1,"extra":true}')
    rt = Runtime(changed, MemoryJournal(), package_version="0.1.0")
    assert rt.restore([RestoredRun(run_id, tampered)]).needs_attention == [run_id]
    assert ("the State saved in Stage 'main' ({\"n\":1,\"extra\":true}) decodes as Count to "
            "another value ({\"n\":1}): Count does not keep what was saved") in rt.attention[0][1]

    newer = msgspec.structs.replace(state, package_version="99.0.0")
    rt = Runtime(changed, MemoryJournal(), package_version="0.1.0")
    assert rt.restore([RestoredRun(run_id, newer)]).needs_attention == [run_id]
    assert "incompatible package" in rt.attention[0][1]

    with pytest.raises(IntloomError) as strict:
        Runtime(other_identity, MemoryJournal(), package_version="0.1.0").restore(
            [RestoredRun(run_id, state)], strict=True
        )
    assert strict.value.code == "JOURNAL_INCOMPATIBLE"


def test_held_runs_say_why_and_only_a_whole_journal_can_be_cancelled() -> None:
    """A Run the restore held is known: answering it says why it is held and what to do;
    cancel appends one terminal record when only the loaded Workflow is at fault (two
    cancels at once append one), and never writes to a damaged or newer journal."""
    journal = MemoryJournal()

    async def first() -> tuple[str, str]:
        rt = Runtime(loaded(make_confirm_wf([])), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("confirm", "go")).run_id)
        await rt.suspend(1)
        assert view.pending_action is not None
        return view.run_id, view.pending_action.id

    run_id, action_id = run(first)
    state = fold(journal.of(run_id))
    assert state is not None
    lw = loaded(make_confirm_wf([]))["confirm"]
    edited = {"confirm": LoadedWorkflow(lw.workflow, lw.source, "id-edited", lw.schemas)}

    async def changed() -> None:
        written = MemoryJournal()
        rt = Runtime(edited, written, package_version="0.1.0")
        rt.restore([RestoredRun(run_id, state)])
        with pytest.raises(IntloomError) as info:
            await rt.answer(run_id, action_id, {"isConfirmed": True})
        assert info.value.code == "JOURNAL_INCOMPATIBLE"
        assert f"Run {run_id} is held" in info.value.message
        assert "changed since the Run started" in info.value.message
        assert f"intloom cancel {run_id}" in info.value.message
        (one, first_ended), (two, _) = await asyncio.gather(rt.cancel(run_id), rt.cancel(run_id))
        assert one == two and one.status == "failed" and not first_ended
        assert one.last_error is not None and one.last_error.code == "RUN_STOPPED"
        assert [type(r).__name__ for r in written.of(run_id)] == ["Terminal"]
        assert rt.get(run_id) == one and await rt.cancel(run_id) == (one, True)
        with pytest.raises(IntloomError) as info:
            await rt.answer(run_id, action_id, {"isConfirmed": True})
        assert info.value.code == "CONFLICT"

    run(changed)

    newer = msgspec.structs.replace(state, package_version="99.0.0")
    # Each says what actually helps (no "intloom doctor says what to do": doctor sent the
    # user back to inspect, and round again).
    for item, code, fix in (
        (RestoredRun(run_id, state, problem="wal/1.seg offset 9: bad checksum",
                     status="corrupt"), "JOURNAL_CORRUPT",
         "if you have a copy of that file from before the damage (a backup), put it back"),
        (RestoredRun(run_id, newer), "JOURNAL_INCOMPATIBLE",
         "Run the intloom version that wrote it to continue or end it"),
    ):
        async def untouched(item: RestoredRun = item, code: str = code, fix: str = fix) -> None:
            written = MemoryJournal()
            rt = Runtime(loaded(make_confirm_wf([])), written, package_version="0.1.0")
            rt.restore([item])
            with pytest.raises(IntloomError) as info:
                await rt.cancel(run_id)
            assert info.value.code == code
            message = info.value.message
            assert "kept untouched" in message and "cannot be" in message
            assert fix in message and "doctor says" not in message, message
            assert written.records == [] and written.pending == []

        run(untouched)


async def _recorded(journal: MemoryJournal, run_id: str, kind: type) -> None:
    """Wait (polling, up to 5 s) until ``run_id`` has a ``kind`` record in ``journal``."""
    for _ in range(500):
        if any(type(r) is kind for r in journal.of(run_id)):
            return
        await asyncio.sleep(0.01)  # poll interval while the Run's Step gets going
    raise AssertionError(f"no {kind.__name__} record of {run_id} within 5 s")


@pytest.mark.parametrize("handling", ["wrap", "swallow", "swallow_idle"])
def test_an_async_step_that_handles_a_stops_cut_writes_nothing(handling: str) -> None:
    """A stop's grace ran out on an async Step in an effect; the cancellation it got was
    caught (wrapped in another error, or swallowed and the Step returned), and the host
    wrote that as the Run's end during the stop (STEP_EXECUTION_FAILED, or
    STEP_INTERACTION_INVALID blaming a thread), or the outcome of a Step it had cut: the
    stop named no Run cut, and the next start restored none RUN_INTERRUPTED. Its Run is
    taken from it before it is cancelled: nothing follows the Run's last record."""
    journal = MemoryJournal()
    wf = intloom.Workflow("cut", version="1")
    st = wf.stage("s")

    async def slow() -> None:
        await asyncio.sleep(30)

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        try:
            if handling == "swallow_idle":
                await asyncio.sleep(30)
            else:
                await ctx.aeffect("charge", slow)
        except asyncio.CancelledError as exc:
            if handling == "wrap":
                raise RuntimeError("charge aborted") from exc
        return "ok"

    async def main() -> tuple[str, list[tuple[str, str]]]:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        run_id = (await rt.create_run("cut", "go")).run_id
        await _recorded(journal, run_id,
                        EffectStarted if handling != "swallow_idle" else Executing)
        return run_id, await rt.suspend(grace=0.05)

    run_id, cut = run(main)
    last = journal.of(run_id)[-1]
    assert type(last) is (Executing if handling == "swallow_idle" else EffectStarted), last
    assert [r for r, _ in cut] == [run_id], cut  # the stop names it as cut
    state = fold(journal.of(run_id))
    assert state is not None and state.phase != "terminal"

    async def second() -> None:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        assert rt.restore([RestoredRun(run_id, state)]).interrupted == [run_id]
        error = rt.get(run_id).last_error
        assert error is not None and error.code == "RUN_INTERRUPTED"
        if handling != "swallow_idle":
            assert "charge" in error.message, error.message

    run(second)


@pytest.mark.parametrize("batch", [1, 2000])
def test_a_step_going_on_past_a_stops_grace_begins_no_effect(
        batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop took the Runs still running only as its loop reached them (it yields every
    few thousand Runs): meanwhile a Step past the grace began an effect, which ran, and its
    outcome and end were written during the stop, or its effect_started was, and the stop
    named an effect in flight that never ran. Every Run still running is taken the moment
    the grace ends."""
    import intloom.executor.runtime as runtime_module

    monkeypatch.setattr(runtime_module, "_SUSPEND_BATCH", batch)
    ran: list[str] = []
    journal = MemoryJournal()
    wf = intloom.Workflow("w", version="1")
    st = wf.stage("s")
    runtimes: list[Runtime] = []

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        if ctx.intent == "late":
            # Still working as the grace ends: a Step's own work, yielding as it goes, with
            # no event of the host's to wait on (the stop's is what this test is about).
            while not runtimes[0].driver.cutting:  # noqa: ASYNC110
                await asyncio.sleep(0)
            await ctx.aeffect("charge", lambda: ran.append("charged"))
            return "ok"
        await asyncio.sleep(30)
        return "ok"

    async def main() -> tuple[str, list[tuple[str, str]]]:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        runtimes.append(rt)
        rt.restore([])
        for _ in range(60):
            await rt.create_run("w", "idle")
        late = (await rt.create_run("w", "late")).run_id
        await _recorded(journal, late, Executing)
        return late, await rt.suspend(grace=0.05)

    late, cut = run(main)
    assert ran == []
    assert type(journal.of(late)[-1]) is Executing, journal.of(late)[-1]
    [said] = [what for run_id, what in cut if run_id == late]
    assert "charge" not in said, said


def test_interrupted_run_names_its_effect_and_cancel_dismisses_it() -> None:
    journal = MemoryJournal()
    gate = threading.Event()
    wf = intloom.Workflow("effect", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        ctx.effect("charge-card", gate.wait, 10, key="order-7")
        return "ok"

    async def first() -> str:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.create_run("effect", "go")
        for _ in range(200):
            if any(type(r).__name__ == "EffectStarted" for r in journal.of(view.run_id)):
                break
            await asyncio.sleep(0.01)  # poll interval while the effect blocks its thread
        await rt.suspend(0.05)  # the effect is still running: it is abandoned, not replayed
        return view.run_id

    run_id = run(first)
    gate.set()
    state = fold(journal.of(run_id))
    assert state is not None and state.effect_in_flight is not None

    async def second() -> None:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        assert rt.restore([RestoredRun(run_id, state)]).interrupted == [run_id]
        view = rt.get(run_id)
        assert view.status == "failed" and view.last_error is not None
        assert view.last_error.code == "RUN_INTERRUPTED"
        assert "charge-card" in view.last_error.message and "order-7" in view.last_error.message
        for then in (f"intloom cancel {run_id} dismisses it", "it has been dismissed"):
            with pytest.raises(IntloomError) as refused:  # an answer names the fact and the fix
                await rt.answer(run_id, "ASK-1", {"isConfirmed": True})
            assert refused.value.code == "CONFLICT"
            assert "interrupted (RUN_INTERRUPTED: " in refused.value.message
            assert f"Start a new Run for this work; {then}." in refused.value.message
            if not view.dismissed:
                view, ended = await rt.cancel(run_id)
                assert not ended and view.dismissed
        assert (await rt.cancel(run_id))[0] == view

    run(second)
    final = fold(journal.of(run_id))
    assert final is not None and final.phase == "terminal" and final.dismissed


@pytest.mark.parametrize("step_kind", ["sync", "async"])
@pytest.mark.parametrize(("exit_", "shown", "fact"), [
    (SystemExit(3), "raised SystemExit(3) (", "must not exit the process"),
    (KeyboardInterrupt(), "raised KeyboardInterrupt (", "must not interrupt the process"),
    # It read "must not raise GeneratorExit, which is the host of every Run".
    (GeneratorExit(), "raised GeneratorExit (",
     "must not raise GeneratorExit, a BaseException the host keeps for itself"),
])
def test_a_step_calling_sys_exit_fails_its_run_not_the_host(
        step_kind: str, exit_: BaseException, shown: str, fact: str) -> None:
    wf = intloom.Workflow("exit", version="1")
    st = wf.stage("s")
    if step_kind == "sync":
        @st.step("a", routes={"ok": intloom.COMPLETE})
        def a(ctx: Any) -> str:
            raise exit_
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a_async(ctx: Any) -> str:
            raise exit_

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("exit", "go")).run_id)
        assert view.status == "failed" and view.last_error is not None
        assert view.last_error.code == "STEP_EXECUTION_FAILED"
        message = view.last_error.message
        assert message.startswith(f"Stage 's', Step 'a' {shown}"), message
        assert fact in message and "raise an exception instead" in message, message
        assert "RuntimeError" not in message, message

    run(main)


def test_a_long_history_is_out_of_the_cyclic_collectors_way() -> None:
    """A busy Run's history holds ~1,000 entries. An entry and its events are never tracked
    by the cyclic collector, and the tuple of its events is untracked at the collector's
    first pass over it, so full collections do not walk them (they walked ~200k tuples with
    64 Runs while an event's detail was a dict), and no young collection is set off by
    them (entries were tuples, tracked until that pass: one every ~140 Steps)."""
    import gc

    wf = intloom.Workflow("loop", version="1")
    st = wf.stage("s", state=Count)

    @st.step("tick", routes={"again": "tick", "done": "hold"})
    async def tick(ctx: intloom.StepContext[Count]) -> str:
        ctx.state = Count(n=ctx.state.n + 1)
        await ctx.aeffect("note", lambda: ctx.state.n)
        return "again" if ctx.state.n < 50 else "done"

    @st.step("hold", routes={"done": intloom.COMPLETE})
    async def hold(ctx: intloom.StepContext[Count]) -> str:
        await ctx.confirm({"n": ctx.state.n})  # still busy: its history is kept as objects
        return "done"

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("loop", "go")).run_id)
        assert view.status == "waiting"
        history = rt.runs[view.run_id].history
        assert len(history) > 100
        made = [obj for entry in history for obj in (entry, *entry.events)]
        assert not any(gc.is_tracked(obj) for obj in made)  # not even before a collection
        gc.collect()  # the tuples of events: untracked at the first pass (their items are)
        tracked = [entry.events for entry in history if gc.is_tracked(entry.events)]
        assert tracked == []
        updates: list[RunUpdate] = []
        async for batch in rt.subscribe(view.run_id):
            updates = batch  # the history so far, in one batch
            break
        details = [u.detail for u in updates if u.event in ("step_result", "effect_done")]
        assert details[:2] == [{"name": "note", "key": "note#1"}, {"outcome": "again"}]

    run(main)


def test_a_sync_step_returning_an_awaitable_is_awaited_on_the_loop(sync_path: SyncPath) -> None:
    wf = intloom.Workflow("later", version="1")
    st = wf.stage("s", state=Count)

    async def decide(n: int) -> str:
        await asyncio.sleep(0)
        return "done" if n >= 3 else "again"

    @st.step("a", routes={"again": "a", "done": intloom.COMPLETE})
    def a(ctx: intloom.StepContext[Count]) -> Any:
        ctx.state = Count(n=ctx.state.n + 1)
        return decide(ctx.state.n)  # a coroutine: the loop awaits it for the outcome

    journal = MemoryJournal()
    view = settled(wf, journal)
    assert view.status == "completed", view.last_error
    run_id = view.run_id
    sync_path.check()
    final = fold(journal.of(run_id))
    assert final is not None and final.phase == "terminal"
    assert msgspec.json.decode(final.stage_state or b"{}", type=Count).n == 3


def test_a_cancel_while_a_failed_checkpoint_is_unsettled_does_not_hang_the_loop() -> None:
    """The Run's journal refuses appends (an earlier batch failed) and the loop has not yet
    heard it from the worker: cancel's own append meets that failure on the loop, while a
    worker drives the Run. Handling it must not re-take the Run's lock it still held."""
    gate, entered = threading.Event(), threading.Event()
    wf = intloom.Workflow("stuck", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        entered.set()
        assert gate.wait(20)
        return "ok"

    class Refusing(MemoryJournal):
        refuse = False

        def append(self, run_id: str, record: Any, state: object = None) -> None:
            if self.refuse:
                raise CheckpointFailed(frozenset({run_id}), "injected: an earlier batch failed")
            super().append(run_id, record, state)

    journal = Refusing()

    async def main() -> None:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.create_run("stuck", "go")
        slot = rt.runs[view.run_id]
        assert await asyncio.to_thread(entered.wait, 10)  # the Step runs (on its thread)
        journal.refuse = True
        try:
            with pytest.raises(IntloomError) as failed:
                await asyncio.wait_for(rt.cancel(view.run_id), 5)
            assert failed.value.code == "RUN_CHECKPOINT_FAILED"
            error = slot.view().last_error
            assert error is not None and error.code == "RUN_CHECKPOINT_FAILED"
        finally:
            gate.set()

    run(main)


def test_a_stop_during_the_hand_back_starts_no_new_step(sync_path: SyncPath) -> None:
    """A sync Step hands the Run back for an async one while the host begins to stop: the
    async Step must not start (as on the loop, where nothing lies between the stop check
    and the next executing)."""
    ran: list[str] = []
    returned, go = threading.Event(), threading.Event()
    wf = intloom.Workflow("handback", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": "b"})
    def a(ctx: Any) -> str:
        ran.append("a")
        return "ok"

    @st.step("b", routes={"ok": intloom.COMPLETE})
    async def b(ctx: Any) -> str:
        ran.append("b")
        return "ok"

    real = Driver._steps_here  # the fixture's counting wrapper

    def widened(self: Driver, slot: Any) -> Any:
        result = yield from real(self, slot)  # the crew advances it
        returned.set()
        assert go.wait(10)  # the hop back to the loop, held open until the stop began
        return result

    journal = MemoryJournal()

    async def main() -> str:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Driver, "_steps_here", widened)
            rt = Runtime(loaded(wf), journal, package_version="0.1.0")
            rt.restore([])
            view = await rt.create_run("handback", "go")
            assert await asyncio.to_thread(returned.wait, 10)
            stop = asyncio.ensure_future(rt.suspend(grace=5))
            await asyncio.sleep(0)  # suspend() has set the stopping flag
            go.set()
            await asyncio.wait_for(stop, 10)
            return view.run_id

    run_id = run(main)
    sync_path.check()
    assert ran == ["a"]
    last = journal.of(run_id)[-1]
    assert isinstance(last, StepReady) and last.step == "b"


@pytest.mark.parametrize("ending", ["completed", "failed"])
def test_a_live_follower_sees_every_event_the_history_keeps(
    sync_path: SyncPath, ending: str
) -> None:
    """The last flush of a Run holds its last ``step_result`` and its ``terminal``, and both
    carry the ended view: a follower must get the ``terminal`` too (it stopped at the first)."""
    wf = intloom.Workflow("short", version="1")
    st = wf.stage("s", state=Count)

    @st.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
    def tick(ctx: intloom.StepContext[Count]) -> str:
        ctx.state = Count(n=ctx.state.n + 1)
        if ctx.state.n < 3:
            return "again"
        return "done" if ending == "completed" else "unrouted"

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.create_run("short", "go")
        live: list[tuple[str, str]] = []

        async def follow() -> None:
            async for batch in rt.subscribe(view.run_id):
                live.extend((u.event, u.run.status) for u in batch if not u.history)

        follower = asyncio.ensure_future(follow())
        final = await rt.wait_stable(view.run_id)
        await asyncio.wait_for(follower, 10)
        assert final.status == ending
        replay = [(u.event, u.run.status)
                  for batch in [b async for b in rt.subscribe(view.run_id)] for u in batch]
        assert live[-2:] == [("step_result", ending), ("terminal", ending)]
        assert replay[-len(live):] == live  # the same events, in the same order

    run(main)
    sync_path.check()


def test_an_ended_run_keeps_the_end_of_its_history() -> None:
    """A host lists up to 1,000 ended Runs: each keeps its last ENDED_HISTORY entries, and a
    late follower gets exactly the end of what a live one saw, marked as such (``omitted``:
    it showed the later events as if they were the start)."""
    from intloom.executor.runtime import ENDED_HISTORY

    wf = intloom.Workflow("long", version="1")
    st = wf.stage("s", state=Count)

    @st.step("tick", routes={"again": "tick", "done": intloom.COMPLETE})
    async def tick(ctx: intloom.StepContext[Count]) -> str:
        ctx.state = Count(n=ctx.state.n + 1)  # one flush per Step: an entry each
        return "again" if ctx.state.n < ENDED_HISTORY + 50 else "done"

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.create_run("long", "go")
        live: list[tuple[str, str]] = []

        async def follow() -> None:
            async for batch in rt.subscribe(view.run_id):
                live.extend((u.event, u.run.status) for u in batch)

        follower = asyncio.ensure_future(follow())
        assert (await rt.wait_stable(view.run_id)).status == "completed"
        await asyncio.wait_for(follower, 10)
        assert rt.runs[view.run_id].history_size() == ENDED_HISTORY
        updates = [u for batch in [b async for b in rt.subscribe(view.run_id)] for u in batch]
        replay = [(u.event, u.run.status) for u in updates]
        assert len(live) > len(replay) > ENDED_HISTORY
        assert replay == live[-len(replay):]
        # The first entry says how much came before it: the history does not read as whole.
        assert [u.omitted for u in updates] == [len(live) - len(replay)] + [0] * (
            len(replay) - 1)

    run(main)


def test_an_ended_runs_history_is_packed_and_replays_as_it_was_seen() -> None:
    """An ended Run's history is packed (executor.history: a few KB instead of ~1 KB per
    entry as objects, for up to 1,000 listed Runs); a late follower gets what a live one saw,
    view for view and detail for detail: effects, answers, a cancel."""
    calls: list[str] = []
    wf = make_confirm_wf(calls)

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        for ending in ("answered", "cancelled"):
            view = await rt.create_run("confirm", "go")
            live: list[RunUpdate] = []

            async def follow(run_id: str = view.run_id, into: list[RunUpdate] = live) -> None:
                async for batch in rt.subscribe(run_id):
                    into.extend(batch)

            follower = asyncio.ensure_future(follow())
            waiting = await rt.wait_stable(view.run_id)
            assert waiting.pending_action is not None
            if ending == "answered":
                await rt.answer(view.run_id, waiting.pending_action.id, {"isConfirmed": False})
                again = await rt.wait_stable(view.run_id)
                assert again.pending_action is not None
                await rt.answer(view.run_id, again.pending_action.id, {"isConfirmed": True})
            else:
                await rt.cancel(view.run_id)
            assert (await rt.wait_stable(view.run_id)).status in ("completed", "failed")
            await asyncio.wait_for(follower, 10)
            slot = rt.runs[view.run_id]
            assert not slot.history and slot.history_size() > 5  # all of it packed
            replay = [u for batch in [b async for b in rt.subscribe(view.run_id)] for u in batch]
            assert all(u.history for u in replay)
            seen = [msgspec.structs.replace(u, history=True) for u in live]
            assert replay == seen and len(seen) > 10
            assert any(u.detail == {"name": "charge", "key": "charge#1"} for u in replay)

    run(main)


class Typed(msgspec.Struct):
    items: list[int] = []
    when: datetime | None = None
    n: int = 0


def _saved_states(records: list[Any]) -> list[bytes]:
    return [r.state for r in records if getattr(r, "state", None) is not None]


@pytest.mark.parametrize("mistake", ["append", "assign", "async", "wait", "init"])
def test_a_state_field_of_the_wrong_type_fails_the_step_that_left_it(
        sync_path: SyncPath, mistake: str) -> None:
    """Encoding checks no field type: such a State was saved, then failed the next Step as
    CLI_INTERNAL_ERROR (or, saved with a wait, held the Run after a restart)."""
    wf = intloom.Workflow("typed", version="1")
    st = wf.stage("s", state=Typed)
    ran: list[str] = []
    if mistake == "init":
        @st.init
        def init(ctx: Any) -> Typed:
            return Typed(n=1.5)  # type: ignore[arg-type]

    if mistake in ("async", "wait"):
        @st.step("a", routes={"ok": "w"})
        async def a_async(ctx: intloom.StepContext[Typed]) -> str:
            ctx.state = Typed(n=1.5)  # type: ignore[arg-type]
            if mistake == "wait":
                await ctx.confirm({"n": 1})
            return "ok"

        @a_async.recover
        def a_recover(ctx: Any, saved: intloom.Recovery) -> str:
            return "ok"
    else:
        @st.step("a", routes={"ok": "w"})
        def a(ctx: intloom.StepContext[Typed]) -> str:
            if mistake == "append":
                ctx.state.items.append("not-an-int")  # type: ignore[arg-type]
            elif mistake == "assign":
                ctx.state = Typed(n=1.5)  # type: ignore[arg-type]
            return "ok"

    @st.step("w", routes={"ok": intloom.COMPLETE})
    async def w(ctx: Any) -> str:
        ran.append("w")
        return "ok"

    journal = MemoryJournal()

    async def main() -> str:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("typed", "go")).run_id)
        assert view.status == "failed" and view.last_error is not None, view
        assert view.last_error.code == "STAGE_STATE_INVALID", view.last_error
        message = view.last_error.message
        where = "Stage 's' initialiser" if mistake == "init" else "Stage 's', Step 'a'"
        assert message.startswith(f"{where}: "), message
        path = "$.items[0]" if mistake == "append" else "$.n"
        for fact in ("not a valid Typed", path, "value of its declared type", "not saved"):
            assert fact in message, (fact, message)
        return view.run_id

    run_id = run(main)
    if mistake != "init" and mistake != "async" and mistake != "wait":
        sync_path.check()
    records = journal.of(run_id)
    assert ran == [] and not any(isinstance(r, Waiting) for r in records)
    assert [r.step for r in records if isinstance(r, Executing)] == (
        [None] if mistake == "init" else ["a"])  # nothing ran after the Step at fault
    for saved in _saved_states(records):  # nothing the journal holds fails to decode
        msgspec.json.decode(saved, type=Typed)


def test_a_state_left_by_recover_is_checked_and_names_recover() -> None:
    calls: list[str] = []
    journal = MemoryJournal()

    def recover(ctx: intloom.StepContext[Typed], restarted: bool) -> str:
        calls.append("recover")
        if restarted:
            ctx.state.items.append("x")  # type: ignore[arg-type]
        return "ok"

    done = _answered_after_a_restart(journal, recover)
    assert done.status == "failed" and done.last_error is not None
    assert done.last_error.code == "STAGE_STATE_INVALID"
    assert done.last_error.message.startswith("Stage 's', Step 'a' recover: "), done
    assert "$.items[0]" in done.last_error.message
    assert calls == ["recover"]
    for saved in _saved_states(journal.of(done.run_id)):
        msgspec.json.decode(saved, type=Typed)


def _answered_after_a_restart(
        journal: MemoryJournal,
        recover: Callable[[intloom.StepContext[Typed], bool], str]) -> RunView:
    """A Run whose Step asks for a confirmation waits when its host stops; a new host
    restores it and the confirmation is answered, so the Step's recover runs
    (``recover(ctx, restarted)``): the Run as the answer leaves it."""

    def workflow(restarted: bool) -> intloom.Workflow:
        wf = intloom.Workflow("typed", version="1")
        st = wf.stage("s", state=Typed)

        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a(ctx: Any) -> str:
            await ctx.confirm({})
            return "ok"

        @a.recover
        def a_recover(ctx: intloom.StepContext[Typed], saved: intloom.Recovery) -> str:
            return recover(ctx, restarted)

        return wf

    async def first() -> tuple[str, str]:
        rt = Runtime(loaded(workflow(False)), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("typed", "go")).run_id)
        await rt.suspend(1)
        assert view.pending_action is not None
        return view.run_id, view.pending_action.id

    run_id, action = run(first)

    async def second() -> RunView:
        rt = Runtime(loaded(workflow(True)), journal, package_version="0.1.0")
        assert rt.restore([RestoredRun(run_id, fold(journal.of(run_id)))]).waiting == [run_id]
        rt.start_restored()
        return await rt.answer(run_id, action, {"isConfirmed": True})

    done: RunView = run(second)
    return done


def test_an_unrouted_outcome_of_recover_names_recover() -> None:
    """recover returned an outcome no route handles: the message said the Step returned
    it, and the Step's own code could not have."""
    done = _answered_after_a_restart(MemoryJournal(), lambda _ctx, _restarted: "weird")
    assert done.last_error is not None
    assert done.last_error.code == "STEP_OUTCOME_NOT_HANDLED"
    assert done.last_error.message.startswith(
        "Stage 's', Step 'a' recover returned outcome 'weird'"), done.last_error


class Scored(msgspec.Struct, omit_defaults=True):
    score: float = 0
    rounds: int = 0
    when: datetime | None = None


class LabelledScored(Scored):
    """A subclass adding no field: saved as Scored, it loses nothing (one adding a field is
    refused, tests/e2e/test_state_subclass.py)."""

    def label(self) -> str:
        return f"{self.score}/{self.rounds}"


LEFT: dict[str, tuple[Scored, bytes]] = {
    "int_in_float": (Scored(score=1, rounds=2), b'{"score":1.0,"rounds":2}'),
    "subclass": (LabelledScored(score=1.5, rounds=2), b'{"score":1.5,"rounds":2}'),
    "datetime_text": (Scored(rounds=2, when="2026-01-02T03:04:05+00:00"),  # type: ignore[arg-type]
                      b'{"rounds":2,"when":"2026-01-02T03:04:05Z"}'),
}


@pytest.mark.parametrize("left", sorted(LEFT))
def test_a_state_that_decodes_differently_is_saved_as_it_decodes_and_restores(
        left: str) -> None:
    """A restart keeps a State that re-encodes to its saved bytes: an int in a float field
    (saved 1, decoded 1.0), a subclass (its methods dropped by the decode) or another
    spelling of a date held the Run as JOURNAL_INCOMPATIBLE though nothing had changed."""
    value, expected = LEFT[left]
    journal = MemoryJournal()

    def workflow() -> intloom.Workflow:
        wf = intloom.Workflow("scored", version="1")
        st = wf.stage("s", state=Scored)

        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a(ctx: intloom.StepContext[Scored]) -> str:
            ctx.state = value
            await ctx.confirm({})
            return "ok"

        @a.recover
        def a_recover(ctx: intloom.StepContext[Scored], saved: intloom.Recovery) -> str:
            assert type(ctx.state) is Scored and ctx.state.rounds == 2
            return "ok"

        return wf

    async def first() -> tuple[str, str]:
        rt = Runtime(loaded(workflow()), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("scored", "go")).run_id)
        assert view.status == "waiting" and view.pending_action is not None, view
        await rt.suspend(1)
        return view.run_id, view.pending_action.id

    run_id, action = run(first)
    saved = fold(journal.of(run_id))
    assert saved is not None
    assert saved.stage_state == expected

    async def second() -> None:
        rt = Runtime(loaded(workflow()), journal, package_version="0.1.0")
        summary = rt.restore([RestoredRun(run_id, saved)])
        assert summary.waiting == [run_id], (summary, rt.attention)
        rt.start_restored()
        done = await rt.answer(run_id, action, {"isConfirmed": True})
        assert done.status == "completed", done

    run(second)


@pytest.mark.parametrize(("stage_state", "value", "facts"), [
    (True, {"n": 1}, ["assigned ctx.state a dict", "Stage 's' State is a Count",
                      "`ctx.state = Count(...)`"]),
    (False, Count(n=1), ["assigned ctx.state a Count", "Stage 's' has no State",
                         "wf.stage('s', state=YourStruct)"]),
    # A Count of a second copy of its module (a package that imports itself by its own
    # name): "assigned ctx.state a Count; Stage 's' State is a Count" contradicted itself.
    (True, msgspec.defstruct("Count", [("n", int)], module="mypkg.models")(n=1),
     ["assigned ctx.state a Count of module mypkg.models, but Stage 's' State is the Count "
      f"of module {__name__}: two classes of one name",
      "import within the package relatively"]),
])
def test_assigning_ctx_state_another_type_names_the_step_and_the_fix(
        sync_path: SyncPath, stage_state: bool, value: Any, facts: list[str]) -> None:
    wf = intloom.Workflow("assign", version="1")
    st: intloom.Stage[Any] = wf.stage("s", state=Count) if stage_state else wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        ctx.state = value
        return "ok"

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("assign", "go")).run_id)
        assert view.status == "failed" and view.last_error is not None, view
        assert view.last_error.code == "STAGE_STATE_INVALID"
        message = view.last_error.message
        assert message.startswith("Stage 's', Step 'a' "), message
        for fact in facts:
            assert fact in message, (fact, message)

    run(main)
    sync_path.check()


def _gathered(ctx: Any) -> Any:
    async def slow() -> int:
        await asyncio.sleep(0)
        return 1

    return asyncio.gather(ctx.aeffect("x", slow), ctx.aeffect("y", slow))


def create_user(name: str) -> str:
    """An effect's function, as a call that left out the effect's name passes it."""
    return name


# mistake -> (the Step's body, sync?, facts of the message, the effects journaled as started)
EFFECT_MISTAKES: dict[str, tuple[Callable[[Any], Any], bool, list[str], list[tuple[str, str]]]] = {
    "nested_sync": (
        lambda ctx: ctx.effect("outer", lambda: ctx.effect("inner", lambda: 1)), True,
        ["effect 'inner' (key 'inner#1')", "effect 'outer' (key 'outer#1')",
         "cannot be nested", "one after another"],
        [("outer", "outer#1")]),
    "nested_async": (
        lambda ctx: ctx.aeffect("outer", lambda: ctx.aeffect("inner", lambda: 1)), False,
        ["effect 'inner' (key 'inner#1')", "effect 'outer' (key 'outer#1')",
         "cannot be nested", "one after another"],
        [("outer", "outer#1")]),
    "concurrent_async": (
        _gathered, False,
        ["effect 'y' (key 'y#1')", "effect 'x' (key 'x#1')", "at the same time"],
        [("x", "x#1")]),
    "same_key": (
        lambda ctx: [ctx.effect("one", lambda: 1, key="k"), ctx.effect("two", lambda: 2, key="k")],
        True,
        ["gave effect 'two' the key 'k', already the key of effect 'one'", "its own key"],
        [("one", "k")]),
    "same_key_again": (
        lambda ctx: [ctx.effect("one", lambda: 1, key="k"), ctx.effect("one", lambda: 1, key="k")],
        True,
        ["gave effect 'one' the key 'k', already the key of an earlier call of it that did "
         "not fail", "Only a call that raised may be retried"],
        [("one", "k")]),
    # The second call gave no key: it was said to have been given 'two#1'.
    "default_key_taken": (
        lambda ctx: [ctx.effect("one", lambda: 1, key="two#1"), ctx.effect("two", lambda: 2)],
        True,
        ["started effect 'two' without key=, so its key defaulted to 'two#1' (name#n: call "
         "1 of 'two' without key= in this Step), already the key= given to effect 'one' in "
         "this Step",
         "pass this call of 'two' a key= of its own, or give effect 'one' another key="],
        [("one", "two#1")]),
    "default_key_taken_by_own_name": (
        lambda ctx: [ctx.effect("two", lambda: 1, key="two#1"), ctx.effect("two", lambda: 2)],
        True,
        ["started effect 'two' without key=, so its key defaulted to 'two#1' (name#n: call "
         "1 of 'two' without key= in this Step), already the key= given to an earlier call "
         "of it that did not fail in this Step",
         "pass this call of 'two' a key= of its own, or give the earlier call another key="],
        [("two", "two#1")]),
    "key_taken_by_a_default": (
        lambda ctx: [ctx.effect("two", lambda: 2), ctx.effect("one", lambda: 1, key="two#1")],
        True,
        ["gave effect 'one' the key 'two#1', already the default key of effect 'two' in this "
         "Step"],
        [("two", "two#1")]),
    # Said: "passed a str, which cannot be called", with the function's repr as the name.
    "name_left_out": (
        lambda ctx: ctx.effect(create_user, "bob"), True,
        ["called ctx.effect with the function create_user as its first argument, which is "
         "the effect's name: what the journal and RUN_INTERRUPTED messages call it. The "
         "effect was not called and nothing was recorded. Pass the name first, then the "
         "function and its arguments: `ctx.effect(\"create_user\", create_user, 'bob')`."],
        []),
    "name_left_out_async": (
        lambda ctx: ctx.aeffect(create_user, "al", key="k"), False,
        ["called await ctx.aeffect with the function create_user as its first argument",
         "`await ctx.aeffect(\"create_user\", create_user, 'al', key='k')`"], []),
    "name_not_a_str": (
        lambda ctx: ctx.effect(3, create_user, "bob"), True,
        ["called ctx.effect with 3 (an int) as its first argument, which is the effect's "
         "name", '`ctx.effect("charge-card", charge, order)`'], []),
    "empty_name": (
        lambda ctx: ctx.effect("", lambda: 1), True,
        ["started an effect named ''", "non-empty name"], []),
    "empty_key": (
        lambda ctx: ctx.aeffect("x", lambda: 1, key=""), False,
        ["gave effect 'x' the key ''", "non-empty string key"], []),
}


@pytest.mark.parametrize("mistake", sorted(EFFECT_MISTAKES))
def test_an_effect_the_journal_could_not_tell_apart_is_refused_before_it_starts(
        sync_path: SyncPath, mistake: str) -> None:
    body, sync, facts, started = EFFECT_MISTAKES[mistake]
    called: list[str] = []
    wf = intloom.Workflow("effects", version="1")
    st = wf.stage("s")
    if sync:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        def a(ctx: Any) -> str:
            body(ctx)
            return "ok"
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a_async(ctx: Any) -> str:
            await body(ctx)
            return "ok"

    journal = MemoryJournal()

    async def main() -> str:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("effects", "go")).run_id)
        assert view.status == "failed" and view.last_error is not None, view
        assert view.last_error.code == "STEP_INTERACTION_INVALID", view.last_error
        message = view.last_error.message
        assert message.startswith("Stage 's', Step 'a' "), message
        for fact in facts:
            assert fact in message, (fact, message)
        return view.run_id

    run_id = run(main)
    assert called == []
    assert [(r.name, r.key) for r in journal.of(run_id) if isinstance(r, EffectStarted)] == started


class Scores(msgspec.Struct):
    scores: dict[str, int] = {}
    ratio: float = 0.0  # not saved as encoded: the State is saved as it decodes


class TaggedScores(Scores):
    tags: set[str] | None = None


@pytest.mark.parametrize("with_set", [False, True])
def test_the_next_step_gets_the_state_as_it_was_saved(with_set: bool) -> None:
    """Dict order is kept as the Step left it; only a State that may hold a set is saved
    sorted (sets, and with them dict keys), and then the next Step sees it sorted too, as
    it would after a restart."""
    seen: list[list[str]] = []
    wf = intloom.Workflow("order", version="1")
    state_type = TaggedScores if with_set else Scores
    st = wf.stage("s", state=state_type)

    @st.step("a", routes={"ok": "b"})
    def a(ctx: Any) -> str:
        ctx.state = state_type(scores={"zeta": 1, "alpha": 2, "mid": 3}, ratio=1)
        return "ok"

    @st.step("b", routes={"ok": intloom.COMPLETE})
    def b(ctx: Any) -> str:
        seen.append(list(ctx.state.scores))
        return "ok"

    journal = MemoryJournal()
    view = settled(wf, journal)
    assert view.status == "completed", view.last_error
    run_id = view.run_id
    [saved] = [r.state for r in journal.of(run_id) if isinstance(r, StepReady) and r.step == "b"]
    assert saved is not None
    order = ["alpha", "mid", "zeta"] if with_set else ["zeta", "alpha", "mid"]
    assert list(msgspec.json.decode(saved)["scores"]) == order
    assert seen == [order]


class _TagsById(msgspec.Struct):
    tags: set[str] = set()
    by_id: dict[int, str] = {}


def test_a_state_with_a_set_and_int_keys_is_saved_and_restored() -> None:
    """Saved sorted for its set, a State whose dict has int keys failed the Run
    CLI_INTERNAL_ERROR (msgspec sorts only str keys: TypeError); each type alone worked."""
    seen, ready, state, problem = _left_then_seen(
        "keyed", _TagsById(tags={"b", "a"}, by_id={10: "ten", 2: "two"}))
    assert seen == [_TagsById(tags={"a", "b"}, by_id={10: "ten", 2: "two"})]
    # What a restart checks the saved State by finds it as saved.
    assert state.stage_state == ready.state and problem is None


def _left_then_seen(name: str, left: Any) -> tuple[list[Any], StepReady, Any, str | None]:
    """A Workflow whose Step a leaves the State ``left`` and whose Step b sees it, run: what
    b saw, the StepReady of b (the State as saved), the Run folded up to it, and what a
    restart's check of that State says (None: restored)."""
    from intloom.authoring.compat import state_problem

    seen: list[Any] = []
    wf = intloom.Workflow(name, version="1")
    st = wf.stage("s", state=type(left))

    @st.step("a", routes={"ok": "b"})
    def a(ctx: Any) -> str:
        ctx.state = left
        return "ok"

    @st.step("b", routes={"ok": intloom.COMPLETE})
    def b(ctx: Any) -> str:
        seen.append(ctx.state)
        return "ok"

    journal = MemoryJournal()
    view = settled(wf, journal)
    assert view.status == "completed", view.last_error
    records = journal.of(view.run_id)
    [at] = [i for i, r in enumerate(records) if isinstance(r, StepReady) and r.step == "b"]
    ready = records[at]
    assert isinstance(ready, StepReady) and ready.state is not None
    state = fold(records[:at + 1])
    assert state is not None
    return seen, ready, state, state_problem(loaded(wf)[name], state)


class _Flag(enum.Enum):
    RED = "red"
    BLUE = "blue"


class _Pin(msgspec.Struct, frozen=True):
    x: int = 0
    tag: str = ""


class _Unordered(msgspec.Struct):
    flags: set[_Flag] = set()
    pins: frozenset[_Pin] = frozenset()
    maybe: set[int | None] = set()
    by_id: dict[int, str] = {}


def test_a_state_whose_sets_python_cannot_sort_is_saved_and_restored() -> None:
    """A set of Enums, of frozen Structs, or of ints and None is saved sorted like any set:
    Python cannot order such items ('<' not supported), and the Run failed
    CLI_INTERNAL_ERROR (TypeError) as it left the State."""
    left = _Unordered(flags={_Flag.RED, _Flag.BLUE}, pins=frozenset({_Pin(2, "b"), _Pin(1)}),
                      maybe={3, None, 1}, by_id={10: "ten", 2: "two"})
    seen, ready, _, problem = _left_then_seen("unordered", left)
    assert seen == [left] and problem is None
    from intloom.authoring.compat import deterministic_json
    # The same bytes whatever order the sets iterate in (a restart's hash seed).
    again = _Unordered(flags={_Flag.BLUE, _Flag.RED}, pins=frozenset({_Pin(1), _Pin(2, "b")}),
                       maybe={None, 1, 3}, by_id={10: "ten", 2: "two"})
    assert deterministic_json(again) == ready.state
    assert msgspec.json.decode(ready.state)["flags"] == ["blue", "red"]


class _Amounts(msgspec.Struct):
    amounts: set[decimal.Decimal] = set()


def test_a_set_of_decimals_with_nan_is_saved_in_a_fixed_order() -> None:
    """Sorting Decimal('NaN') raises InvalidOperation (not TypeError): CLI_INTERNAL_ERROR."""
    from intloom.authoring.compat import deterministic_json

    nan, one = decimal.Decimal("NaN"), decimal.Decimal("1")
    saved = deterministic_json(_Amounts(amounts={nan, one}))
    assert saved == deterministic_json(_Amounts(amounts={one, nan})) == (
        b'{"amounts":["1","NaN"]}')


def test_a_stop_after_an_answer_does_not_call_a_run_with_recover_interrupted() -> None:
    """The answered Step is cut at the stop, but its recover entry continues it at the next
    start: the stop neither lists it as cut nor tells its client RUN_INTERRUPTED replays."""
    gate = asyncio.Event()
    wf = intloom.Workflow("later", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        await ctx.confirm({})
        gate.set()
        await asyncio.sleep(30)
        return "ok"

    @a.recover
    def a_recover(ctx: Any, saved: intloom.Recovery) -> str:
        return "ok"

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("later", "go")).run_id)
        assert view.pending_action is not None
        answering = asyncio.ensure_future(
            rt.answer(view.run_id, view.pending_action.id, {"isConfirmed": True}))
        await gate.wait()
        assert await rt.suspend(grace=0.05) == []
        answering.cancel()
        shown = rt.get(view.run_id)
        assert shown.last_error is not None
        assert "continues from its last saved boundary" in shown.last_error.message

    run(main)


@pytest.mark.parametrize("where", ["sync_step", "async_step", "effect"])
def test_a_cancelled_error_user_code_raises_fails_its_run(where: str,
                                                         sync_path: SyncPath) -> None:
    """Nobody cancelled the Step: its Run fails naming CancelledError instead of staying
    "running" with nothing driving it."""
    wf = intloom.Workflow("raises", version="1")
    st = wf.stage("s")

    async def raising() -> None:
        raise asyncio.CancelledError()

    if where == "sync_step":
        @st.step("a", routes={"ok": intloom.COMPLETE})
        def a(ctx: Any) -> str:
            raise asyncio.CancelledError()
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a_async(ctx: Any) -> str:
            if where == "effect":
                await ctx.aeffect("x", raising)
            raise asyncio.CancelledError()

    journal = MemoryJournal()

    async def main() -> str:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        view = await asyncio.wait_for(
            rt.wait_stable((await rt.create_run("raises", "go")).run_id), 10)
        assert view.status == "failed" and view.last_error is not None, view
        assert view.last_error.code == "STEP_EXECUTION_FAILED"
        assert "Step 'a' raised CancelledError" in view.last_error.message
        return view.run_id

    run_id = run(main)
    done = [r for r in journal.of(run_id) if isinstance(r, EffectDone)]
    if where == "effect":
        assert [d.error for d in done] == ["CancelledError: raised by the effect; its outcome "
                                           "is unknown"]


async def _retry_slow(ctx: Any, patience: float) -> None:
    """Effect ``slow`` under key ``k`` in ``asyncio.wait_for``: the first call outlasts
    ``patience`` s (the Step cancels it), the retry returns at once."""
    for attempt in range(2):
        try:
            await asyncio.wait_for(
                ctx.aeffect("slow", asyncio.sleep, 5 if attempt == 0 else 0, key="k"), patience)
            return
        except TimeoutError:
            continue


def test_a_step_timing_out_its_effect_during_a_stops_grace_is_not_failed() -> None:
    """Inside the grace the Step's own timeout is the Step's: the effect is recorded done,
    the retry runs, and the Run is suspended, not failed."""
    wf = intloom.Workflow("graceful", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        await _retry_slow(ctx, patience=0.2)
        return "ok"

    journal = MemoryJournal()

    async def main() -> str:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.create_run("graceful", "go")
        deadline = asyncio.get_running_loop().time() + 5
        while not any(isinstance(r, EffectStarted) for r in journal.of(view.run_id)):
            assert asyncio.get_running_loop().time() < deadline, "the effect never started"
            await asyncio.sleep(0.005)  # a poll interval, not a wait for an event
        await rt.suspend(grace=3)
        return view.run_id

    run_id = run(main)
    records = journal.of(run_id)
    assert not any(isinstance(r, Terminal) and r.status == "failed" for r in records)
    assert [(type(r).__name__, getattr(r, "ok", None)) for r in records
            if isinstance(r, (EffectStarted, EffectDone))] == [
        ("EffectStarted", None), ("EffectDone", False), ("EffectStarted", None),
        ("EffectDone", True)]


class _TagsDict(TypedDict):
    names: set[str]


class _TagsTuple(NamedTuple):
    names: frozenset[str]


class _Inner(msgspec.Struct):
    names: set[str] = set()


class _Plain(msgspec.Struct):
    n: float = 0.0
    when: datetime | None = None
    scores: dict[str, list[int]] = {}


@pytest.mark.parametrize(("annotation", "holds"), [
    (set[str], True),
    (_TagsDict, True),
    (_TagsTuple, True),
    (Annotated[_Inner, msgspec.Meta(description="tags")], True),
    (dict[str, _Inner | None], True),
    (_Plain, False),
    (list[Annotated[int, msgspec.Meta(ge=0)]], False),
])
def test_a_state_that_may_hold_a_set_is_told_apart(annotation: Any, holds: bool) -> None:
    """Only such a State is saved with sorted sets (and dict keys): a set nested in a
    TypedDict, a NamedTuple or an Annotated type counts too."""
    from intloom.authoring.savecheck import has_set as _has_set

    assert _has_set(msgspec.inspect.type_info(annotation)) is holds


def test_an_effect_the_step_cancels_with_a_timeout_is_over_and_may_be_retried() -> None:
    """``asyncio.wait_for`` around an effect cancels it: the journal records it done (its
    outcome unknown), so the Step's next effect and a retry under the same key may start."""
    wf = intloom.Workflow("timeouts", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        await _retry_slow(ctx, patience=0.05)
        await ctx.aeffect("other", asyncio.sleep, 0)
        return "ok"

    journal = MemoryJournal()
    view = settled(wf, journal)
    assert view.status == "completed", view.last_error
    run_id = view.run_id
    effects = [(type(r).__name__, r.key, getattr(r, "ok", None)) for r in journal.of(run_id)
               if isinstance(r, (EffectStarted, EffectDone))]
    assert effects == [("EffectStarted", "k", None), ("EffectDone", "k", False),
                       ("EffectStarted", "k", None), ("EffectDone", "k", True),
                       ("EffectStarted", "other#1", None), ("EffectDone", "other#1", True)]
    [cancelled] = [r for r in journal.of(run_id) if isinstance(r, EffectDone) and not r.ok]
    assert cancelled.error is not None and cancelled.error.startswith("CancelledError")


def test_default_effect_keys_count_each_name_and_a_failed_call_may_be_retried_under_its_key(
        sync_path: SyncPath) -> None:
    attempts: list[int] = []

    def flaky() -> int:
        attempts.append(len(attempts))
        if len(attempts) < 3:
            raise TimeoutError("try again")
        return len(attempts)

    wf = intloom.Workflow("retry", version="1")
    st = wf.stage("s")

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        for i in range(3):
            ctx.effect("fetch", lambda i=i: i)
        for _ in range(3):
            try:
                ctx.effect("charge", flaky, key="order-7")
                break
            except TimeoutError:
                continue
        return "ok"

    journal = MemoryJournal()

    async def main() -> str:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("retry", "go")).run_id)
        assert view.status == "completed", view
        return view.run_id

    run_id = run(main)
    sync_path.check()
    assert [r.key for r in journal.of(run_id) if isinstance(r, EffectStarted)] == [
        "fetch#1", "fetch#2", "fetch#3", "order-7", "order-7", "order-7"]


def test_a_fault_of_the_host_while_driving_a_run_is_logged_with_where(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Run failed CLI_INTERNAL_ERROR "(TypeError) ... Inspect it with intloom inspect",
    and nothing anywhere said what failed: no log line had the exception, though the docs
    say error details go to the log (docs/lifecycle.md)."""
    from intloom.executor import driver

    def broken(*_args: Any, **_kw: Any) -> bytes:
        raise TypeError("a bug of ours")

    monkeypatch.setattr(driver, "_encode_state", broken)
    wf = intloom.Workflow("buggy", version="1")
    st = wf.stage("s", state=Count)

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        return "ok"

    logged: list[tuple[str, str, Any, str]] = []

    def log(*event: Any) -> bool:
        logged.append(event)
        return True

    async def main() -> RunView:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0", on_event=log)
        rt.restore([])
        return await rt.wait_stable((await rt.create_run("buggy", "go")).run_id)

    view: RunView = run(main)
    assert view.last_error is not None and view.last_error.code == "CLI_INTERNAL_ERROR"
    assert "a bug of ours" not in view.last_error.message  # never in an error view
    [(_, run_id, detail, _status)] = [e for e in logged if e[0] == "internal_error"]
    assert run_id == view.run_id
    assert detail["error"] == "TypeError" and detail["detail"] == "a bug of ours"
    assert detail["at"].startswith("test_executor.py:") and detail["at"].endswith(" in broken")


def test_a_completion_that_differs_from_one_under_way_is_told_so_not_busy() -> None:
    """A second completion (or a failure) sent while another completion's on_complete runs
    got BUSY, "retry it to get the Run's view": a retry that differed was then refused
    CONFLICT. It is refused CONFLICT at once, naming what is under way; the same completion
    sent again waits for the first and gets the Run's view it leads to (it was BUSY)."""
    wf, started, release = _on_complete_held(("done", "none"))

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        run_id, call_id, token = await _claimed(rt, "x", "c1")
        first = asyncio.ensure_future(
            rt.complete_agent_call(run_id, call_id, token, "done", {"n": 1}))
        await started.wait()

        async def refused(attempt: Any, code: str) -> str:
            with pytest.raises(IntloomError) as info:
                await attempt
            assert info.value.code == code, info.value.message
            return info.value.message

        same = asyncio.ensure_future(
            rt.complete_agent_call(run_id, call_id, token, "done", {"n": 1}))
        output = await refused(
            rt.complete_agent_call(run_id, call_id, token, "done", {"n": 2}), "CONFLICT")
        assert (f"Agent task {call_id} is being completed by another request, with outcome "
                "'done' and another output; this completion was not recorded") in output
        outcome = await refused(
            rt.complete_agent_call(run_id, call_id, token, "none", {"n": 1}), "CONFLICT")
        assert "by another request, with outcome 'done'; this completion" in outcome
        failure = await refused(rt.fail_agent_call(run_id, call_id, token, "gave up"),
                                "CONFLICT")
        assert (f"Agent task {call_id} is being completed by another request, with outcome "
                "'done'; this failure was not recorded") in failure
        assert "its on_complete refuses it" in failure
        assert not same.done(), "the same completion was answered before the first's"
        release.set()
        done = await first
        assert done.status == "completed" and await same == done
        # Once recorded, a different completion names what differs from the recorded one.
        later = await refused(
            rt.complete_agent_call(run_id, call_id, token, "done", {"n": 2}), "CONFLICT")
        assert (f"Agent task {call_id} was already completed with outcome 'done' and another "
                "output") in later

    run(main)


async def _cancelled_task_is_named(rt: Runtime, run_id: str, call_id: str,
                                   other: str) -> None:
    """Cancel ``run_id`` (waiting on Agent task ``call_id``), then claim that task with
    ``other``'s id: told whose task it is, not to "use" ``other``'s own task."""
    await rt.cancel(run_id)
    with pytest.raises(IntloomError) as mixed:
        await rt.claim_agent_call(other, call_id, "c9")
    assert mixed.value.message == (
        f"Agent task {call_id} is Run {run_id}'s task, not Run {other}'s; nothing was "
        f"done. Send the request with run id {run_id}."), mixed.value.message


def test_a_task_sent_with_another_runs_id_names_the_run_it_belongs_to() -> None:
    """An Agent that paired a task with the wrong Run id was told that Run "now waits on
    Agent task CALL-…; use that one": another Agent's task. It is told whose task it is."""
    async def main() -> None:
        rt = Runtime(loaded(_one_agent_step()), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        first, first_call, token = await _claimed(rt, "x", "c1")
        second, second_call, _ = await _claimed(rt, "y", "c2")
        with pytest.raises(IntloomError) as mixed:
            await rt.complete_agent_call(second, first_call, token, "done", None)
        assert mixed.value.code == "CONFLICT"
        assert mixed.value.message == (
            f"Agent task {first_call} is Run {first}'s task, not Run {second}'s; nothing was "
            f"done. Send the request with run id {first}.")
        await rt.complete_agent_call(first, first_call, token, "done", None)
        with pytest.raises(IntloomError) as ended:  # also once that task has ended
            await rt.claim_agent_call(second, first_call, "c1")
        assert f"is Run {first}'s task, not Run {second}'s" in ended.value.message
        with pytest.raises(IntloomError) as blank:
            await rt.claim_agent_call(second, "", "c2")
        assert blank.value.code == "INVALID_REQUEST"
        assert blank.value.message == (
            "call_id is empty; give the id of the Run's Agent task (pendingAgentCall.id).")
        still = rt.get(second).pending_agent_call
        assert still is not None and still.id == second_call  # nothing was recorded
        # A task that ended with its Run's cancel: told to "use" the other Run's task.
        third, third_call, _ = await _claimed(rt, "z", "c3")
        await _cancelled_task_is_named(rt, third, third_call, second)

    run(main)


def test_a_task_of_a_run_interrupted_while_it_waited_says_what_is_lost_once() -> None:
    """The refusal quoted the Run's RUN_INTERRUPTED evidence, which already says "claims,
    owner tokens and Tool receipts are not restored", then said it again."""
    journal = MemoryJournal()

    async def first() -> tuple[str, str, str]:
        rt = Runtime(loaded(_one_agent_step()), journal, package_version="0.1.0")
        rt.restore([])
        claimed = await _claimed(rt, "x", "c1")
        await rt.suspend(1)
        return claimed

    run_id, call_id, token = run(first)

    async def second() -> None:
        rt = Runtime(loaded(_one_agent_step()), journal, package_version="0.1.0")
        rt.restore([RestoredRun(run_id, fold(journal.of(run_id)))])
        rt.start_restored()
        with pytest.raises(IntloomError) as info:
            await rt.complete_agent_call(run_id, call_id, token, "done", None)
        message = info.value.message
        assert info.value.code == "CONFLICT" and "RUN_INTERRUPTED" in message, message
        assert message.count("claims, owner tokens and Tool receipts are not restored") == 1
        assert message.endswith("are not restored.). Start a new Run for this work; intloom "
                                f"cancel {run_id} dismisses it."), message
        # Dismissed, its task is still named as its own to an Agent that pairs it with
        # another Run's id (it was "use that one": the other Run's task).
        other, _other_call, _ = await _claimed(rt, "y", "c2")
        await _cancelled_task_is_named(rt, run_id, call_id, other)

    run(second)


def test_the_same_completion_waiting_on_one_a_stop_drops_is_told_what_the_first_is() -> None:
    """The same completion, waiting on the first one's on_complete when the host stops: the
    first is not recorded (nothing is written while the host stops), and the one waiting on
    it is told so in the same words, not that the host is stopping with "no new work"."""
    wf, started, release = _on_complete_held(("done",))

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        run_id, call_id, token = await _claimed(rt, "x", "c1")
        sent = [asyncio.ensure_future(
            rt.complete_agent_call(run_id, call_id, token, "done", {"n": 1})) for _ in "ab"]
        await started.wait()
        stopping = asyncio.ensure_future(rt.suspend(5))
        await asyncio.sleep(0)
        release.set()
        await stopping
        told = await asyncio.gather(*sent, return_exceptions=True)
        assert all(isinstance(exc, IntloomError) for exc in told), told
        first, second = (str(exc.message) for exc in told if isinstance(exc, IntloomError))
        assert first == second, (first, second)
        assert "the completion was not recorded" in second

    run(main)


# A BaseExceptionGroup (KeyboardInterrupt or SystemExit inside) is held back from the host as
# an exit; its error named the group's repr, not each thing it held, as an ExceptionGroup's does.
@pytest.mark.parametrize(("held", "named"), [
    (KeyboardInterrupt("ctrl-c"), "KeyboardInterrupt('ctrl-c') (Workflow code must not "
                                  "interrupt the process"),
    (SystemExit(3), "SystemExit(3) (Workflow code must not exit the process"),
])
@pytest.mark.parametrize("where", ["sync step", "async step", "async init"])
def test_a_base_exception_group_from_user_code_names_what_it_holds(
        sync_path: SyncPath, held: BaseException, named: str, where: str) -> None:
    """From an async Step, the group escaped the Step's exit handling and left its Run
    running for ever (``_run_step`` named exits, not a group holding one)."""
    wf = intloom.Workflow("boom", version="1")
    st = wf.stage("s")

    def raise_group() -> None:
        raise BaseExceptionGroup("two failed", [ValueError("bad input"), held])

    if where == "async step":
        @st.step("a", routes={"ok": intloom.COMPLETE})
        async def a_async(ctx: Any) -> str:
            raise_group()
            return "ok"
    else:
        @st.step("a", routes={"ok": intloom.COMPLETE})
        def a(ctx: Any) -> str:
            raise_group()
            return "ok"

    if where == "async init":
        @st.init
        async def init(ctx: Any) -> None:
            raise_group()

    async def main() -> None:
        rt = Runtime(loaded(wf), MemoryJournal(), package_version="0.1.0")
        rt.restore([])
        view = await rt.wait_stable((await rt.create_run("boom", "go")).run_id)
        assert view.status == "failed" and view.last_error is not None
        message = view.last_error.message
        assert view.last_error.code == "STEP_EXECUTION_FAILED"
        assert " raised BaseExceptionGroup" in message, message
        assert ": two failed (it holds an exit or an interrupt): ValueError: bad input; " \
            f"{named}" in message, message

    run(main)
    if where == "sync step":  # the async initialiser fails the Run before any sync Step
        sync_path.check()


def test_an_ended_run_keeps_no_stage_state_in_memory() -> None:
    """A host kept the last Stage State of every ended Run it still lists (up to 1,000): +46 MB
    of resident memory per Run for 45 MB States, held until 4,000 more Runs had ended. The
    journal holds it; the listed Run keeps its view."""
    journal = MemoryJournal()
    wf = intloom.Workflow("big", version="1")
    st = wf.stage("s", state=Big)

    @st.step("a", routes={"ok": intloom.COMPLETE})
    async def a(ctx: Any) -> str:
        ctx.state = Big(data="x" * 200_000)
        return "ok"

    async def main() -> None:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        view = await rt.create_run("big", "go")
        final = await rt.wait_stable(view.run_id)
        assert final.status == "completed"
        slot = rt.runs[view.run_id]
        assert slot.state.stage_state is None and slot.shown.stage_state is None
        assert slot.decoded is None
        assert rt.get(view.run_id) == final  # its view is unchanged
        # The journal has the State it ended with.
        results = [r for r in journal.of(view.run_id) if type(r) is StepResult]
        assert results and len(results[-1].state or b"") > 200_000

    run(main)


def test_a_sync_step_returning_after_its_run_was_cancelled_leaves_no_state_with_it(
        sync_path: SyncPath) -> None:
    """A Run cancelled while its sync Step ran on a worker thread: the Step's return was
    refused, but the State it left, decoded on the way (``slot.decoded``), stayed with the
    ended Run's slot, which a host lists for 1,000 Runs (5 MB here)."""
    entered, gate = threading.Event(), threading.Event()
    journal = MemoryJournal()
    wf = intloom.Workflow("w", version="1")
    st = wf.stage("s", state=Big)

    @st.step("a", routes={"ok": intloom.COMPLETE})
    def a(ctx: Any) -> str:
        ctx.state = Big(data="x" * 5_000_000)
        entered.set()
        assert gate.wait(10)
        return "ok"

    async def main() -> None:
        rt = Runtime(loaded(wf), journal, package_version="0.1.0")
        rt.restore([])
        run_id = (await rt.create_run("w", "go")).run_id
        assert await asyncio.to_thread(entered.wait, 10)
        slot = rt.runs[run_id]
        view, _ = await rt.cancel(run_id)
        assert view.status == "failed"
        gate.set()
        # Handed back once the thread is done with the Run (its refused outcome included).
        await asyncio.to_thread(eventually, lambda: slot.thread_ctx is None, timeout=10,
                                what="the worker to give the Run back")
        assert slot.decoded is None

    run(main)


def _effects_then_confirm(charged: list[str], key_in_recover: str | None) -> intloom.Workflow:
    """A Step that charges (key ``order-1``) and posts (default key), then waits; its
    recover charges under ``key_in_recover`` (or not at all) and posts again."""
    wf = intloom.Workflow("pay", version="1")
    st = wf.stage("main")

    @st.step("pay", routes={"ok": intloom.COMPLETE})
    async def pay(ctx: intloom.StepContext[None]) -> str:
        await ctx.aeffect("charge", lambda: charged.append("step"), key="order-1")
        await ctx.aeffect("post", lambda: charged.append("post-step"))
        await ctx.confirm({"ship": True})
        return "ok"

    @pay.recover
    def pay_recover(ctx: intloom.StepContext[None], saved: intloom.Recovery) -> str:
        if key_in_recover is not None:
            ctx.effect("charge", lambda: charged.append("recover"), key=key_in_recover)
        ctx.effect("post", lambda: charged.append("post-recover"))
        return "ok"

    return wf


def _confirmed_after_a_restart(journal: MemoryJournal,
                               workflow: Callable[[], intloom.Workflow],
                               answered_before: int = 0,
                               asked: list[Any] | None = None) -> RunView:
    """A Run of ``workflow()`` (one Stage, waiting on confirmations) confirmed
    ``answered_before`` times in its first host, suspended by a stop while it waits, restored
    waiting by a second host, and confirmed there (its Step's recover runs): its view then.
    ``asked``: filled with what each wait in the first host asked."""
    async def first() -> tuple[str, str]:
        rt = Runtime(loaded(workflow()), journal, package_version="0.1.0")
        rt.restore([])
        wf_name = next(iter(rt.workflows))
        view = await rt.wait_stable((await rt.create_run(wf_name, "x")).run_id)
        for _ in range(answered_before):
            assert view.pending_action is not None, view
            if asked is not None:
                asked.append(view.pending_action.request)
            view = await rt.answer(view.run_id, view.pending_action.id, {"isConfirmed": True})
        assert view.pending_action is not None, view
        if asked is not None:
            asked.append(view.pending_action.request)
        await rt.suspend(1)
        return view.run_id, view.pending_action.id

    run_id, action = run(first)

    async def second() -> RunView:
        rt = Runtime(loaded(workflow()), journal, package_version="0.1.0")
        assert rt.restore([RestoredRun(run_id, fold(journal.of(run_id)))]).waiting == [run_id]
        rt.start_restored()
        return await rt.answer(run_id, action, {"isConfirmed": True})

    done: RunView = run(second)
    return done


@pytest.mark.parametrize("key", ["order-1", "order-2", None])
def test_recover_continues_the_steps_effect_keys(key: str | None) -> None:
    """recover stands in for the Step's code after its wait, but started with no keys: one
    that charged under the Step's key (an order id) again ran the charge a second time,
    where the Step's own code is refused, and its default keys counted from 1 again
    (``post#1`` twice in the journal, ``post#2`` without the restart)."""
    charged: list[str] = []
    journal = MemoryJournal()
    done = _confirmed_after_a_restart(journal, lambda: _effects_then_confirm(charged, key))
    keys = [r.key for r in journal.of(done.run_id) if type(r) is EffectDone]
    if key == "order-1":
        assert done.status == "failed" and done.last_error is not None, done
        assert done.last_error.code == "STEP_INTERACTION_INVALID", done.last_error
        assert "Step 'pay' recover" in done.last_error.message
        assert "'order-1', already the key" in done.last_error.message, done.last_error
        assert charged == ["step", "post-step"], charged  # the charge ran once
        return
    assert done.status == "completed", done
    assert keys == ["order-1", "post#1", *([] if key is None else [key]), "post#2"], keys
    assert charged.count("step") == 1 and charged.count("post-recover") == 1


def test_recover_keeps_the_keys_from_before_an_earlier_answered_wait() -> None:
    """A Step that charged, waited, was answered in the same host (which journals its
    ``executing`` again), then waited again: a restart's recover must still find the charge's
    key taken, not only the keys after the last ``executing``."""
    charged: list[str] = []
    journal = MemoryJournal()

    def workflow() -> intloom.Workflow:
        wf = intloom.Workflow("twice", version="1")
        st = wf.stage("main")

        @st.step("pay", routes={"ok": intloom.COMPLETE})
        async def pay(ctx: intloom.StepContext[None]) -> str:
            await ctx.aeffect("charge", lambda: charged.append("step"), key="order-1")
            await ctx.confirm({"first": True})
            await ctx.confirm({"second": True})
            return "ok"

        @pay.recover
        def pay_recover(ctx: intloom.StepContext[None], saved: intloom.Recovery) -> str:
            ctx.effect("charge", lambda: charged.append("recover"), key="order-1")
            return "ok"

        return wf

    asked: list[Any] = []
    done = _confirmed_after_a_restart(journal, workflow, answered_before=1, asked=asked)
    # The first wait answered in the first host; the second is the one the restart found.
    assert asked == [{"context": {"first": True}}, {"context": {"second": True}}], asked
    assert done.status == "failed" and done.last_error is not None, done
    assert "'order-1', already the key" in done.last_error.message, done.last_error
    assert charged == ["step"], charged
