"""The pure machine: transitions the table forbids are refused; any prefix replays the same."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intloom.errors import ErrorView
from intloom.runtime.machine import (
    ALLOWED,
    IllegalTransition,
    RunState,
    apply,
    fold,
    fold_routed,
    interrupted_message,
    restart_verdict,
)
from intloom.runtime.model import Cursor, EffectRef, PendingAgentCall, WaitingAction
from intloom.runtime.records import (
    Answered,
    EffectDone,
    EffectStarted,
    Executing,
    Header,
    Record,
    StagePending,
    StepReady,
    StepResult,
    Terminal,
    Waiting,
)

STAGES = ["a", "b"]
STEPS = ["s1", "s2"]


def header(run_id: str = "RUN-1") -> Header:
    return Header(
        at="t0", run_id=run_id, workflow="wf", workflow_version="1", identity="i",
        schemas={"a": "x"}, intent="go",
    )


def _action(stage: str, step: str | None, n: int) -> WaitingAction:
    return WaitingAction(
        id=f"ASK-{n}", kind="confirmation", request={"context": n},
        cursor=Cursor(stage, step), created_at="t",
    )


def _agent(n: int, phase: str = "available") -> PendingAgentCall:
    return PendingAgentCall(
        id=f"CALL-{n}", agent_id="default", phase=phase,  # type: ignore[arg-type]
        request=None, tools=[], created_at="t",
    )


@st.composite
def any_record(draw: st.DrawFn) -> Record:
    """Any record at all, with fields drawn from a small alphabet (mostly nonsense order)."""
    stage = draw(st.sampled_from(STAGES))
    step = draw(st.sampled_from([*STEPS, None]))
    n = draw(st.integers(0, 2))
    kind = draw(st.sampled_from(["init", "step", "recover", "agent"]))
    choice = draw(st.integers(0, 9))
    records: list[Record] = [
        header(),
        StagePending(at="t", stage=stage),
        StepReady(at="t", stage=stage, step=step or "s1", state=b"{}"),
        Executing(at="t", stage=stage, step=step, kind=kind),  # type: ignore[arg-type]
        EffectStarted(at="t", name=f"e{n}", key=f"k{n}"),
        EffectDone(at="t", name=f"e{n}", key=f"k{n}"),
        StepResult(at="t", stage=stage, step=step or "s1", outcome="ok"),
        Waiting(at="t", action=_action(stage, step, n))
        if n
        else Waiting(at="t", agent_call=_agent(n)),
        Answered(at="t", action_id=f"ASK-{n}", answer={"isConfirmed": True}),
        Terminal(at="t", status="completed") if n else Terminal(
            at="t", status="failed", error=None
        ),
    ]
    return records[choice]


def _phase(record: Record) -> str:
    return type(record).__struct_config__.tag  # type: ignore[return-value]


@settings(max_examples=400, deadline=None)
@given(st.lists(any_record(), min_size=1, max_size=25))
def test_no_sequence_reaches_a_forbidden_transition(records: list[Record]) -> None:
    state: RunState | None = None
    for record in records:
        before = state.phase if state else None
        try:
            state = apply(state, record)
        except IllegalTransition as exc:
            assert exc.got == _phase(record)
            continue
        assert _phase(record) in ALLOWED[before], (before, _phase(record))
        assert state.phase == _phase(record)
        # Invariants of the Run model.
        if state.status == "waiting":
            assert (state.pending_action is None) != (state.pending_agent_call is None)
        if state.status == "failed":
            assert state.last_error is not None
        if state.status in ("running", "completed"):
            assert state.pending_action is None or state.phase == "answered"


@st.composite
def legal_journal(draw: st.DrawFn) -> list[Record]:
    """A legal journal from a random walk over a two-Stage Workflow, cut at a random point."""
    out: list[Record] = [header(), StagePending(at="t", stage="a")]
    stage = "a"
    asks = 0
    for _ in range(draw(st.integers(0, 12))):
        step = draw(st.sampled_from(STEPS))
        out.append(StepReady(at="t", stage=stage, step=step, state=b'{"n":1}'))
        out.append(Executing(at="t", stage=stage, step=step))
        for i in range(draw(st.integers(0, 2))):
            out.append(EffectStarted(at="t", name="e", key=f"e#{i}"))
            out.append(EffectDone(at="t", name="e", key=f"e#{i}", result=i))
        if draw(st.booleans()):
            asks += 1
            out.append(Waiting(at="t", action=_action(stage, step, asks), state=b'{"n":2}'))
            out.append(Answered(at="t", action_id=f"ASK-{asks}", answer={"isConfirmed": True}))
            out.append(Executing(at="t", stage=stage, step=step))
        out.append(StepResult(at="t", stage=stage, step=step, outcome="ok", state=b'{"n":3}'))
        if draw(st.booleans()):
            stage = "b" if stage == "a" else "a"
            out.append(StagePending(at="t", stage=stage))
    if draw(st.booleans()):
        out.append(Terminal(at="t", status="completed"))
    return out


@settings(max_examples=200, deadline=None)
@given(legal_journal(), st.data())
def test_replaying_any_prefix_rebuilds_the_same_state(records: list[Record], data: Any) -> None:
    incremental: list[RunState | None] = [None]
    state: RunState | None = None
    for record in records:
        state = apply(state, record)
        incremental.append(state)
    cut = data.draw(st.integers(0, len(records)))
    assert fold(records[:cut]) == incremental[cut]
    # Folding from a snapshot taken anywhere equals folding from the start.
    mid = data.draw(st.integers(0, cut))
    assert fold(records[mid:cut], incremental[mid]) == incremental[cut]
    # Every prefix has exactly one restart verdict, consistent with where it ends.
    final = incremental[cut]
    if final is not None:
        for has_recover in (False, True):
            verdict = restart_verdict(final, has_recover)
            expected = {
                "header": {"resume"}, "stage_pending": {"resume"}, "step_ready": {"resume"},
                "step_result": {"route"},
                "executing": {"interrupted", "recover"} if has_recover else {"interrupted"},
                "effect_started": {"interrupted"}, "effect_done": {"interrupted"},
                "terminal": {"terminal"},
                "waiting": {"restore_wait"} if has_recover else {"interrupted"},
                "answered": {"recover"} if has_recover else {"interrupted"},
            }[final.phase]
            assert verdict.row in expected
            if final.phase == "effect_started":
                assert verdict.effect is not None and verdict.effect.name in verdict.reason


def test_interrupted_effect_is_named() -> None:
    state = fold([
        header(), StagePending(at="t", stage="a"), StepReady(at="t", stage="a", step="s1"),
        Executing(at="t", stage="a", step="s1"),
        EffectStarted(at="t1", name="charge-card", key="order-7"),
    ])
    assert state is not None
    verdict = restart_verdict(state, has_recover=True)
    assert verdict.row == "interrupted"
    assert "charge-card" in verdict.reason and "order-7" in verdict.reason


def test_what_was_running_without_an_effect_is_named_once() -> None:
    """The reason reads "Step a/s1 was running", not "the Step of Step a/s1 was running"."""
    step = fold([
        header(), StagePending(at="t", stage="a"), StepReady(at="t", stage="a", step="s1"),
        Executing(at="t", stage="a", step="s1"),
    ])
    init = fold([header(), StagePending(at="t", stage="a"),
                 Executing(at="t", stage="a", step=None, kind="init")])
    assert step is not None and init is not None
    assert restart_verdict(step, has_recover=True).reason == (
        "Step a/s1 was running; no effect was in flight")
    assert restart_verdict(init, has_recover=True).reason == (
        "the initialiser of Stage 'a' was running; no effect was in flight")


def test_an_agents_completion_cut_between_its_two_records_is_named_as_such() -> None:
    """A journal ending at ``executing kind=agent`` (the first of a completion's two records,
    cut by a torn batch) said "Step a/s1 was running; no effect was in flight": the Step's
    code was not running, the Agent's completion was being recorded."""
    state = fold([header(), StagePending(at="t", stage="a"),
                  StepReady(at="t", stage="a", step="s1"),
                  Executing(at="t", stage="a", step="s1"),
                  Waiting(at="t", agent_call=_agent(1)),
                  Executing(at="t", stage="a", step="s1", kind="agent")])
    assert state is not None
    verdict = restart_verdict(state, has_recover=True)
    assert verdict.row == "interrupted"
    assert verdict.reason == (
        "the completion of the client Agent task of Step a/s1 was being recorded when the "
        "host went, and was not: the Agent's work is lost (its Tools ran, once each)")
    assert "no effect was in flight" not in interrupted_message(state)


def test_an_effect_cancelled_before_it_returned_is_not_called_over() -> None:
    """An async Step timed out its effect (``asyncio.wait_for`` around ``ctx.aeffect(...,
    asyncio.to_thread, call)``): its effect_done says "its outcome is unknown", the thread's
    call still running. Killed then, the Run was told "no effect was in flight", which the
    journal does not prove. An effect that ended (well or not) is still said to be over."""
    from intloom.runtime.records import OUTCOME_UNKNOWN, EffectDone

    started: list[Record] = [
        header(), StagePending(at="t", stage="a"), StepReady(at="t", stage="a", step="s1"),
        Executing(at="t", stage="a", step="s1"),
        EffectStarted(at="t1", name="slow", key="slow#1"),
    ]
    cancelled = fold([*started, EffectDone(
        at="t2", name="slow", key="slow#1", ok=False,
        error=f"CancelledError: cancelled before it returned (a timeout in the Step); "
              f"{OUTCOME_UNKNOWN}")])
    assert cancelled is not None and cancelled.last_effect_unknown
    verdict = restart_verdict(cancelled, has_recover=True)
    assert verdict.row == "interrupted" and verdict.effect is not None
    assert verdict.reason == (
        "Step a/s1 was running after its effect 'slow' (key 'slow#1') was cancelled before it "
        "returned, so its outcome is unknown: what it had set going (a call handed to a "
        "thread, say) may have run on (intloom inspect shows its record)")
    assert "no effect was in flight" not in interrupted_message(cancelled)
    for ended in (EffectDone(at="t2", name="slow", key="slow#1", result=1),
                  EffectDone(at="t2", name="slow", key="slow#1", ok=False,
                             error="ValueError: no")):
        state = fold([*started, ended])
        assert state is not None and not state.last_effect_unknown
        assert restart_verdict(state, has_recover=True).reason.endswith(
            "no effect was in flight")
    # Left out of the state's encoding when False: a snapshot is written as before.
    assert b"last_effect_unknown" not in msgspec.json.encode(fold(
        [*started, EffectDone(at="t2", name="slow", key="slow#1", result=1)]))


def test_an_effect_in_flight_names_the_initialiser_or_recover_that_ran_it() -> None:
    """An effect in flight in a Stage's initialiser or a Step's recover was said to be run by
    "Step a/s1" (or "Stage 'a'"): its reader looked for it in the Step's code."""
    recover = fold([
        header(), StagePending(at="t", stage="a"), StepReady(at="t", stage="a", step="s1"),
        Executing(at="t", stage="a", step="s1"), Waiting(at="t", action=_action("a", "s1", 1)),
        Answered(at="t", action_id="ASK-1", answer={"isConfirmed": True}),
        Executing(at="t", stage="a", step="s1", kind="recover"),
        EffectStarted(at="t1", name="refund", key="order-7"),
    ])
    init = fold([header(), StagePending(at="t", stage="a"),
                 Executing(at="t", stage="a", step=None, kind="init"),
                 EffectStarted(at="t1", name="fetch", key="fetch#1")])
    assert recover is not None and init is not None
    assert restart_verdict(recover, has_recover=True).reason == (
        "the recover entry of Step a/s1 was running effect 'refund' (key 'order-7', started "
        "t1) and its outcome is unknown")
    assert restart_verdict(init, has_recover=True).reason == (
        "the initialiser of Stage 'a' was running effect 'fetch' (key 'fetch#1', started t1) "
        "and its outcome is unknown")


def test_a_recover_that_waited_and_goes_on_after_its_answer_is_still_recover() -> None:
    """The ``executing`` written with the answer to recover's own wait was folded as the
    Step's: its effect in flight, and its mistakes, were named as the Step's body's. The
    restart rows stay: untouched, recover is called with that answer; once it is running
    after a restart's answer, it is not run again."""
    asked_again: list[Record] = [
        header(), StagePending(at="t", stage="a"), StepReady(at="t", stage="a", step="s1"),
        Executing(at="t", stage="a", step="s1"), Waiting(at="t", action=_action("a", "s1", 1)),
        Answered(at="t", action_id="ASK-1", answer={"isConfirmed": True}),
        Executing(at="t", stage="a", step="s1", kind="recover"),
        Waiting(at="t", action=_action("a", "s1", 2)),
        Answered(at="t", action_id="ASK-2", answer={"isConfirmed": False}),
    ]
    resumed = fold([*asked_again, Executing(at="t", stage="a", step="s1")])
    assert resumed is not None and resumed.executing_kind == "recover"
    verdict = restart_verdict(resumed, has_recover=True)
    assert (verdict.row, verdict.reason) == (
        "recover", "the answer to ASK-2 was accepted; any code the recover entry that asked it "
        "ran after it recorded no effect and is not run again; Step a/s1 continues in recover")
    stepped = fold([*asked_again[:6], Executing(at="t", stage="a", step="s1")])
    assert stepped is not None
    assert restart_verdict(stepped, has_recover=True).reason == (
        "the answer to ASK-1 was accepted; any code the Step ran after it recorded no effect "
        "and is not run again; Step a/s1 continues in recover")
    answered = fold(asked_again[:6])
    assert answered is not None
    assert restart_verdict(answered, has_recover=True).reason == (
        "the answer to ASK-1 was accepted; Step a/s1 continues in recover")
    again = apply(resumed, Executing(at="t", stage="a", step="s1", kind="recover"))
    assert restart_verdict(again, has_recover=True).row == "interrupted"
    in_flight = apply(resumed, EffectStarted(at="t1", name="refund", key="order-7"))
    assert restart_verdict(in_flight, has_recover=True).reason == (
        "the recover entry of Step a/s1 was running effect 'refund' (key 'order-7', started "
        "t1) and its outcome is unknown")
    routed = apply(resumed, StepResult(at="t", stage="a", step="s1", outcome="ok"))
    assert not routed.recover_resumed


def test_a_wait_recover_makes_after_an_effect_is_not_continued_by_running_it_again() -> None:
    """Only recover run again from its start can continue a wait recover made (its coroutine
    is gone): one that had recorded an effect before asking would call it again. The Step's
    own effects before its wait are not recover's to repeat, nor are a recover's without
    an effect; and the answer's reset of ``last_effect`` does not forget recover's."""
    def asks(*, recover_charges: bool, step_charges: bool = False) -> list[Record]:
        charge: list[Record] = [EffectStarted(at="t1", name="charge", key="charge#1"),
                  EffectDone(at="t2", name="charge", key="charge#1", ok=True)]
        none: list[Record] = []
        return [
            header(), StagePending(at="t", stage="a"), StepReady(at="t", stage="a", step="s1"),
            Executing(at="t", stage="a", step="s1"), *(charge if step_charges else none),
            Waiting(at="t", action=_action("a", "s1", 1)),
            Answered(at="t", action_id="ASK-1", answer={"isConfirmed": True}),
            Executing(at="t", stage="a", step="s1", kind="recover"),
            *(charge if recover_charges else none),
            Waiting(at="t", action=_action("a", "s1", 2)),
        ]

    def verdict(records: list[Record]) -> tuple[str, str]:
        state = fold(records)
        assert state is not None
        found = restart_verdict(state, has_recover=True)
        return found.row, found.reason

    repeat = ("effect 'charge' (key 'charge#1', started t1): recover would run again from "
              "its start and call it again")
    answered = Answered(at="t", action_id="ASK-2", answer={"isConfirmed": True})
    resumed = Executing(at="t", stage="a", step="s1")
    assert verdict(asks(recover_charges=True)) == (
        "interrupted", f"the recover entry of Step a/s1 waits on confirmation ASK-2 after it "
        f"ran {repeat}")
    for tail in ([answered], [answered, resumed]):
        assert verdict([*asks(recover_charges=True), *tail]) == (
            "interrupted", "the answer to ASK-2 was accepted, but the recover entry of Step "
            f"a/s1 had asked it after it ran {repeat}")
    assert verdict(asks(recover_charges=False, step_charges=True))[0] == "restore_wait"
    assert verdict([*asks(recover_charges=False), answered, resumed])[0] == "recover"
    state = fold(asks(recover_charges=True))
    assert state is not None
    assert interrupted_message(state).endswith(f"after it ran {repeat}.")


def test_effect_done_must_close_the_started_effect() -> None:
    start = fold([
        header(), StagePending(at="t", stage="a"), StepReady(at="t", stage="a", step="s1"),
        Executing(at="t", stage="a", step="s1"), EffectStarted(at="t", name="a", key="1"),
    ])
    with pytest.raises(IllegalTransition, match="does not close"):
        apply(start, EffectDone(at="t", name="b", key="1"))


def test_answer_must_match_the_pending_action() -> None:
    start = fold([
        header(), StagePending(at="t", stage="a"), StepReady(at="t", stage="a", step="s1"),
        Executing(at="t", stage="a", step="s1"), Waiting(at="t", action=_action("a", "s1", 1)),
    ])
    with pytest.raises(IllegalTransition):
        apply(start, Answered(at="t", action_id="ASK-9"))


def test_terminal_is_final() -> None:
    done = fold([header(), StagePending(at="t", stage="a"), Terminal(at="t", status="completed")])
    for record in (StagePending(at="t", stage="a"), Terminal(at="t", status="completed")):
        with pytest.raises(IllegalTransition):
            apply(done, record)



def test_routing_to_the_next_step_is_its_own_step_ready() -> None:
    """DESIGN section 5: routing that chose the next Step of the Stage is a boundary of its
    own (step_ready); a journal that skips it is refused, not guessed at."""
    done = fold([
        header(), StagePending(at="t", stage="a"), StepReady(at="t", stage="a", step="s1"),
        Executing(at="t", stage="a", step="s1"),
        StepResult(at="t", stage="a", step="s1", outcome="next", state=b'{"n":1}'),
    ])
    assert done is not None and restart_verdict(done, False).row == "route"
    with pytest.raises(IllegalTransition):
        apply(done, Executing(at="t", stage="a", step="s2"))
    ready = apply(done, StepReady(at="t", stage="a", step="s2", state=done.stage_state))
    assert (ready.phase, ready.cursor.step, ready.outcome) == ("step_ready", "s2", None)
    assert restart_verdict(ready, False).row == "resume"


def _every_field_set(phase: str, executing_kind: str | None) -> RunState:
    """A state whose every field holds a value of its own (none at its default), so that a
    fold that put one field's value in another's place cannot go unseen."""
    ref = msgspec.structs.replace
    return RunState(
        run_id="RUN-1", workflow="wf", workflow_version="1", identity="i", schemas={"a": "x"},
        intent="go", format=7, package_version="p", protocol="q", created_at="c",
        updated_at="u", phase=phase, seq=9, cursor=Cursor("a", "s1"), status="waiting",
        executing_kind=executing_kind, stage_state=b'{"n":1}', outcome="o", output={"out": 1},
        pending_action=_action("a", "s1", 1), pending_agent_call=_agent(2),
        answered_action=ref(_action("a", "s1", 3), kind="question"), answer={"ans": 1},
        effect_in_flight=EffectRef(name="e1", key="k1", started_at="t1"),
        last_effect=EffectRef(name="e2", key="k2", started_at="t2"), last_effect_unknown=True,
        last_error=ErrorView(code="X", message="m"), dismissed=True, recover_resumed=True,
        recover_effect=EffectRef(name="e3", key="k3", started_at="t3"),
    )


@pytest.mark.parametrize(("phase", "kind", "record", "changed"), [
    ("executing", "step", StepResult(at="t", stage="a", step="s2", outcome="ok",
                                     state=b'{"n":2}', output=[1]),
     dict(phase="step_result", cursor=Cursor("a", "s2"), status="running",
          executing_kind=None, recover_resumed=False, recover_effect=None,
          stage_state=b'{"n":2}', outcome="ok", output=[1], pending_action=None,
          pending_agent_call=None, answered_action=None, answer=None, effect_in_flight=None)),
    ("step_result", None, StepReady(at="t", stage="a", step="s2", state=b'{"n":3}'),
     dict(phase="step_ready", cursor=Cursor("a", "s2"), status="running",
          executing_kind=None, recover_resumed=False, recover_effect=None,
          stage_state=b'{"n":3}', outcome=None, output=None, answered_action=None,
          answer=None)),
    ("step_ready", None, Executing(at="t", stage="a", step="s1"),
     dict(phase="executing", status="running", executing_kind="step", recover_resumed=False,
          recover_effect=None)),
    ("answered", "recover", Executing(at="t", stage="a", step="s1"),
     dict(phase="executing", status="running", executing_kind="recover",
          recover_resumed=True)),
    ("waiting", None, Executing(at="t", stage="a", step="s1", kind="agent"),
     dict(phase="executing", status="running", executing_kind="agent",
          recover_resumed=False, recover_effect=None, pending_agent_call=None)),
])
def test_a_steps_folds_change_exactly_their_fields(
        phase: str, kind: str | None, record: Record, changed: dict[str, Any]) -> None:
    """The folds of a Step's records build the next state field by field, positionally (a
    replace cost ~2.2k instructions more per record): each must change what the table
    says and keep every other field where it was."""
    before = _every_field_set(phase, kind)
    if phase == "step_result":  # a step_ready follows only a result (or an initialiser)
        before = msgspec.structs.replace(before, effect_in_flight=None)
        changed["effect_in_flight"] = None
    after = apply(before, record)
    expected = msgspec.structs.replace(before, seq=before.seq + 1, updated_at="t", **changed)
    assert after == expected


def _folded_each(state: RunState, result: StepResult, ready: StepReady,
                 executing: Executing | None) -> RunState | str:
    """The three records folded one at a time, or the refusal's message."""
    try:
        state = apply(apply(state, result), ready)
        return state if executing is None else apply(state, executing)
    except IllegalTransition as exc:
        return str(exc)


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(["executing", "effect_done", "effect_started", "waiting", "answered",
                        "step_result", "step_ready", "stage_pending", "terminal"]),
       st.sampled_from(["init", "step", "recover", "agent", None]), st.booleans(),
       st.sampled_from(STAGES), st.sampled_from(STAGES), st.sampled_from(STEPS),
       st.sampled_from(STEPS), st.none() | st.tuples(
           st.sampled_from(STAGES), st.sampled_from(STEPS),
           st.sampled_from(["init", "step", "recover", "agent"])))
def test_a_routed_steps_records_fold_as_one_as_they_fold_one_by_one(
        phase: str, kind: str | None, in_flight: bool, result_stage: str, ready_stage: str,
        result_step: str, ready_step: str, executing: tuple[str, str, str] | None) -> None:
    """``fold_routed`` (step_result, step_ready, then maybe executing, in one fold) gives the
    state, or the refusal, that folding them one by one gives, from any phase."""
    before = _every_field_set(phase, kind)
    if not in_flight:
        before = msgspec.structs.replace(before, effect_in_flight=None)
    result = StepResult(at="t1", stage=result_stage, step=result_step, outcome="ok",
                        state=b'{"n":2}', output=[1])
    ready = StepReady(at="t2", stage=ready_stage, step=ready_step, state=b'{"n":2}')
    started = None if executing is None else Executing(
        at="t3", stage=executing[0], step=executing[1], kind=executing[2])  # type: ignore[arg-type]
    expected = _folded_each(before, result, ready, started)
    try:
        got: RunState | str = fold_routed(before, result, ready, started)
    except IllegalTransition as exc:
        got = str(exc)
    assert got == expected
